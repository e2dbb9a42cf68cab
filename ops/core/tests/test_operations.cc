// The operation tables (operations.h): every row is reachable and wins where its test first
// holds; and on each transport the core can run over here -- the fake one (one host) and the
// simulator (one host, and one rank per host) -- what actually ran (Stats' ways) is what the
// tables choose from that transport's topology. The MPI transport's side is
// tests/mpi/test_ring.py (the same counts through mlsl_tf.stats()).
#include <cmath>
#include <limits>

#include "../mpi_checks.h"
#include "../operations.h"
#include "../sim/background_thread.h"
#include "harness.h"

using namespace mlsl;

namespace {

OperationFacts Facts(OpType op, int64_t bytes) {
  OperationFacts f;
  f.op = op;
  f.bytes = bytes;
  f.eager_bytes = 8192;
  f.ring_bytes = 262144;
  return f;
}

// The number after "\"way\": " in a Stats JSON, 0 when absent.
int64_t Ran(const std::string& json, const std::string& way) {
  const std::string key = "\"" + way + "\": ";
  const size_t at = json.find(key, json.find("\"ways\""));
  return at == std::string::npos ? 0 : std::stoll(json.substr(at + key.size()));
}

Request Allreduce(const std::string& name, std::vector<float>* data, int wire = -1) {
  Request r;
  r.name = name;
  r.op = OpType::kAllreduce;
  r.dtype = DataType::kFloat32;
  r.wire = wire;
  r.inputs = {TensorInput{data->data(), {int64_t(data->size())}}};
  return r;
}

}  // namespace

TEST(operations_every_row_is_reachable_and_the_first_that_holds_wins) {
  std::map<Way, int> seen;
  auto request = [&](OperationFacts f, Way want) {
    CHECK(ChooseRequest(f) == want);
    ++seen[want];
  };
  OperationFacts adasum = Facts(OpType::kAllreduce, 64);
  adasum.reduce_op = ReduceOp::kAdasum;
  request(adasum, Way::kAdasum);  // small, of the world: still never eager
  request(Facts(OpType::kAllreduce, 8192), Way::kEager);
  OperationFacts grouped = Facts(OpType::kAllreduce, 64);
  grouped.group = 1;
  request(grouped, Way::kChunks);
  OperationFacts compressed = Facts(OpType::kAllreduce, 64);
  compressed.compressed = true;
  request(compressed, Way::kChunks);
  request(Facts(OpType::kAllreduce, 8193), Way::kChunks);
  request(Facts(OpType::kBroadcast, 64), Way::kBroadcast);
  request(Facts(OpType::kAllgather, 64), Way::kAllgather);
  request(Facts(OpType::kAlltoall, 64), Way::kAlltoall);
  OperationFacts wire_rs = Facts(OpType::kReducescatter, 64);
  wire_rs.compressed = true;
  request(wire_rs, Way::kWireReducescatter);
  request(Facts(OpType::kReducescatter, 64), Way::kReducescatter);
  request(Facts(OpType::kBarrier, 0), Way::kBarrier);
  request(Facts(OpType::kJoin, 0), Way::kNotACollective);
  request(Facts(OpType::kAddGroup, 0), Way::kNotACollective);

  auto chunk = [&](OperationFacts f, Way want) {
    CHECK(ChooseChunk(f) == want);
    ++seen[want];
  };
  OperationFacts one_host = Facts(OpType::kAllreduce, 262144);
  one_host.one_host = true;
  chunk(one_host, Way::kRingAllreduce);
  OperationFacts wire = one_host;
  wire.compressed = true;
  chunk(wire, Way::kWireAllreduce);  // before the ring
  OperationFacts small = one_host;
  small.bytes = 262143;
  chunk(small, Way::kKernelAllreduce);
  OperationFacts no_ring = one_host;
  no_ring.ring_bytes = 0;
  chunk(no_ring, Way::kKernelAllreduce);
  chunk(Facts(OpType::kAllreduce, 262144), Way::kNativeAllreduce);  // several hosts: never the ring
  for (const auto* table : {&RequestOperations(), &ChunkOperations()}) {
    for (const Operation& o : *table) {
      CHECK(seen[o.way] > 0);
      CHECK(std::string(o.when).size() > 5);
    }
  }
}

TEST(operations_the_fake_transport_runs_what_the_tables_choose) {
  const int n = 3;
  auto world = std::make_shared<FakeWorld>(n);
  const bool one_host = OnOneMachine(FakeCommunicator(world, 0).topology(), n);
  RuntimeOptions options;
  auto chunk_way = [&](int64_t bytes, bool compressed) {
    OperationFacts f = Facts(OpType::kAllreduce, bytes);
    f.compressed = compressed;
    f.one_host = one_host;
    f.ring_bytes = options.engine.scheduler.ring_bytes;
    return std::string(WayName(ChooseChunk(f)));
  };
  std::vector<std::string> stats(n);
  mlsl_test::RunRanksOn(options, world, [&](int rank, Runtime& rt) {
    std::vector<float> big(262144, 1.0f), mid(16384, 2.0f), wired(16384, 3.0f);
    auto run = [&rt](Request r) {
      auto f = mlsl_test::Submit(rt, std::move(r));
      CHECK(mlsl_test::Get(f).status.ok());
    };
    run(Allreduce("big", &big));
    run(Allreduce("mid", &mid));
    run(Allreduce("wired", &wired, int(DataType::kBfloat16)));
    Request b = Allreduce("root", &mid);
    b.op = OpType::kBroadcast;
    b.root = 1;
    run(std::move(b));
    stats[rank] = rt.StatsJson();
  });
  CHECK(one_host);
  for (int r = 0; r < n; ++r) {
    std::map<std::string, int64_t> want;
    ++want[chunk_way(1 << 20, false)];
    ++want[chunk_way(65536, false)];
    ++want[chunk_way(65536, true)];
    want["chunks"] = 3;
    want["broadcast"] = 1;
    CHECK_EQ(want.count("ring_allreduce"), size_t(1));
    for (const auto& [way, count] : want) CHECK_EQ(Ran(stats[r], way), count);
    CHECK_EQ(Ran(stats[r], "native_allreduce"), 0);
  }
}

TEST(operations_the_simulator_runs_what_the_tables_choose_on_one_host_and_on_several) {
  for (int per_host : {4, 1}) {
    SimFabric fabric;
    fabric.ranks = 4;
    fabric.ranks_per_host = per_host;
    SimNetwork net(fabric);
    Timeline timeline("", 0);
    Stats stats;
    RuntimeOptions options;
    SimBackgroundThread thread(&net, options, 0, &timeline, &stats);
    std::vector<float> big(262144, 1.0f), mid(16384, 1.0f);
    int left = 2;
    for (auto* data : {&big, &mid}) {
      auto r = std::make_unique<Request>(Allreduce(data == &big ? "big" : "mid", data));
      float* buf = data->data();
      r->allocate_output = [buf](int, const Shape&, void** p) {
        *p = buf;
        return Status::Ok();
      };
      r->done = [&left](const Status& s) {
        CHECK(s.ok());
        --left;
      };
      thread.Submit(std::move(r));
    }
    while (left > 0 && thread.error().empty()) {
      if (thread.NextAction() <= net.now()) {
        thread.Act();
        continue;
      }
      const double next = std::min(net.NextEvent(), thread.NextAction());
      CHECK(next < std::numeric_limits<double>::infinity());
      if (!(next < std::numeric_limits<double>::infinity())) break;
      net.AdvanceTo(next);
    }
    CHECK_EQ(left, 0);
    SimCommunicator probe(&net);
    OperationFacts f = Facts(OpType::kAllreduce, 1 << 20);
    f.one_host = OnOneMachine(probe.topology(), fabric.ranks);
    f.ring_bytes = options.engine.scheduler.ring_bytes;
    CHECK(f.one_host == (per_host == 4));
    const std::string big_way = WayName(ChooseChunk(f));
    f.bytes = 65536;
    const std::string mid_way = WayName(ChooseChunk(f));
    CHECK_EQ(big_way, std::string(per_host == 4 ? "ring_allreduce" : "native_allreduce"));
    CHECK_EQ(stats.ran(big_way), big_way == mid_way ? 2 : 1);
    CHECK_EQ(stats.ran(mid_way), big_way == mid_way ? 2 : 1);
    CHECK_EQ(stats.ran("chunks"), 2);
  }
}
