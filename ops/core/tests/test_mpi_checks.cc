// mpi_checks.h: the thread level mlsl_tf needs and a launcher whose world MPI does not see.
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "../mpi_checks.h"
#include "check.h"

using namespace mlsl;

namespace {

std::function<const char*(const char*)> Env(std::map<std::string, std::string> vars) {
  auto held = std::make_shared<std::map<std::string, std::string>>(std::move(vars));
  return [held](const char* name) -> const char* {
    auto it = held->find(name);
    return it == held->end() ? nullptr : it->second.c_str();
  };
}

}  // namespace

TEST(thread_level_serialized_or_more_is_enough) {
  CHECK(CheckThreadLevel(ThreadLevel::kMultiple, true).ok());
  CHECK(CheckThreadLevel(ThreadLevel::kSerialized, false).ok());
}

TEST(thread_level_below_serialized_is_an_error_naming_it) {
  Status ours = CheckThreadLevel(ThreadLevel::kFunneled, true);
  CHECK(!ours.ok());
  CHECK(ours.code() == StatusCode::kFailedPrecondition);
  CHECK_CONTAINS(ours.message(), "MPI provides only MPI_THREAD_FUNNELED");
  CHECK_CONTAINS(ours.message(), "at least MPI_THREAD_SERIALIZED");
  CHECK_CONTAINS(ours.message(), "thread support");
  Status theirs = CheckThreadLevel(ThreadLevel::kSingle, false);
  CHECK(!theirs.ok());
  CHECK_CONTAINS(theirs.message(), "MPI_THREAD_SINGLE");
  CHECK_CONTAINS(theirs.message(), "mpi4py.rc.thread_level");
}

TEST(launcher_world_agreeing_or_absent_is_fine) {
  CHECK(CheckLauncherWorld(1, Env({}), "lib").ok());
  CHECK(CheckLauncherWorld(2, Env({{"OMPI_COMM_WORLD_SIZE", "2"}}), "lib").ok());
  CHECK(CheckLauncherWorld(3, Env({{"PMI_SIZE", "3"}}), "lib").ok());
  CHECK(CheckLauncherWorld(2, Env({{"PMI_SIZE", ""}, {"OMPI_COMM_WORLD_SIZE", "junk"}}), "lib").ok());
}

TEST(launcher_world_larger_than_mpis_is_an_error_naming_both) {
  Status s = CheckLauncherWorld(1, Env({{"OMPI_COMM_WORLD_SIZE", "2"}}), "MPICH Version: 5.0.2");
  CHECK(!s.ok());
  CHECK(s.code() == StatusCode::kFailedPrecondition);
  CHECK_CONTAINS(s.message(), "started by Open MPI's mpirun for 2 ranks (OMPI_COMM_WORLD_SIZE=2)");
  CHECK_CONTAINS(s.message(), "MPI_COMM_WORLD has 1");
  CHECK_CONTAINS(s.message(), "(MPICH Version: 5.0.2)");
  CHECK_CONTAINS(s.message(), "MLSL_TF_LIBRARY");
  Status hydra = CheckLauncherWorld(1, Env({{"PMI_SIZE", "4"}}), "Open MPI v4.1.4");
  CHECK(!hydra.ok());
  CHECK_CONTAINS(hydra.message(), "MPICH-style launcher");
  CHECK_CONTAINS(hydra.message(), "(PMI_SIZE=4)");
}

namespace {

// Each rank's Topology as MpiCommunicator computes it, for ranks laid out `per_host` to a
// machine in order (local rank = index on its machine; cross = the ranks of that local rank).
std::vector<Topology> Layout(const std::vector<int>& per_host) {
  std::vector<Topology> all;
  for (int n : per_host) {
    for (int local = 0; local < n; ++local) {
      Topology t;
      t.local_rank = local;
      t.local_size = n;
      t.cross_size = 0;
      for (int m : per_host) t.cross_size += m > local ? 1 : 0;
      all.push_back(t);
    }
  }
  return all;
}

}  // namespace

TEST(on_one_machine_is_the_same_answer_on_every_rank) {
  // mpiexec -n 10 -ppn 8: local ranks 2..7 have no peer on the second machine (cross size 1);
  // choosing the ring by that, they posted point-to-point messages while ranks 0, 1, 8, 9 sat
  // in MPI_Iallreduce: every allreduce of at least MLSL_TF_RING_BYTES hung.
  for (const std::vector<int>& per_host : {std::vector<int>{8, 2}, {2, 8}, {3, 1, 3}, {4, 4}, {5}, {1}}) {
    std::vector<Topology> topo = Layout(per_host);
    const int size = int(topo.size());
    const bool expected = per_host.size() == 1;
    for (int r = 0; r < size; ++r) CHECK(OnOneMachine(topo[r], size) == expected);
  }
}
