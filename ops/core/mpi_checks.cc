// The checks of mpi_checks.h: the MPI thread level and the launcher's world size vs MPI's.
#include "mpi_checks.h"

#include <cstdlib>

namespace mlsl {

const char* ThreadLevelName(ThreadLevel level) {
  switch (level) {
    case ThreadLevel::kSingle: return "MPI_THREAD_SINGLE";
    case ThreadLevel::kFunneled: return "MPI_THREAD_FUNNELED";
    case ThreadLevel::kSerialized: return "MPI_THREAD_SERIALIZED";
    case ThreadLevel::kMultiple: return "MPI_THREAD_MULTIPLE";
  }
  return "an unknown MPI thread level";
}

Status CheckThreadLevel(ThreadLevel provided, bool initialised_by_us) {
  if (provided >= ThreadLevel::kSerialized) return Status::Ok();
  std::string m = std::string("MPI provides only ") + ThreadLevelName(provided) +
                  "; mlsl_tf's background thread calls MPI, which needs at least MPI_THREAD_SERIALIZED";
  if (initialised_by_us) {
    m += " (mlsl_tf asked for MPI_THREAD_MULTIPLE): use an MPI built with thread support";
  } else {
    m += ": MPI was initialised before mlsl_tf.init(); initialise it with MPI_THREAD_MULTIPLE "
         "(mpi4py's default; check mpi4py.rc.thread_level before `from mpi4py import MPI`)";
  }
  return Status::FailedPrecondition(m);
}

Status CheckLauncherWorld(int world_size, const std::function<const char*(const char*)>& getenv,
                          const std::string& library) {
  struct Launcher { const char* var; const char* name; };
  for (const Launcher& l : {Launcher{"OMPI_COMM_WORLD_SIZE", "Open MPI's mpirun"},
                            Launcher{"PMI_SIZE", "an MPICH-style launcher (hydra mpiexec, srun --mpi=pmi2)"}}) {
    const char* text = getenv(l.var);
    if (text == nullptr || *text == '\0') continue;
    char* end = nullptr;
    long expected = std::strtol(text, &end, 10);
    if (*end != '\0' || expected < 1 || expected == world_size) continue;
    return Status::FailedPrecondition(
        std::string("this process was started by ") + l.name + " for " + std::to_string(expected) +
        " ranks (" + l.var + "=" + text + ") but MPI_COMM_WORLD has " + std::to_string(world_size) +
        ": mlsl_tf's library is built against another MPI (" + library +
        "); launch with that MPI's mpiexec, or load a build for this launcher (MLSL_TF_LIBRARY, "
        "e.g. build/openmpi/_mlsl_tf.so from `make openmpi-lib`)");
  }
  return Status::Ok();
}

// Not cross_size == 1: with 8 ranks on one machine and 2 on another, local ranks 2..7 have no
// peer elsewhere. Every rank of the communicator shares this rank's machine, or none does.
bool OnOneMachine(const Topology& topo, int size) { return topo.local_size == size; }

}  // namespace mlsl
