// A transfer that fails on ONE rank (an injected receive failure in the fake transport, whose
// collectives run as point-to-point ring / all-to-all here) fails that collective on every rank
// -- the failing rank's peers would otherwise wait for its messages forever -- names the
// collective, the rank and the reason, closes every engine (later submissions fail at once) and
// keeps the buffers a still-posted receive may write into alive. So does an output that one
// rank cannot allocate (a failed allocate_output, or std::bad_alloc), whichever collective,
// fused or eager: no rank returns success for a collective that failed on another.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "../engine.h"
#include "../fake_communicator.h"
#include "check.h"
#include "harness.h"

using namespace mlsl;

namespace {

struct Outcome {
  bool done = false;
  Status status;
  std::vector<std::vector<char>> out;
};

// A world whose rank `rank` fails its `nth` receive; dropped receives stay posted, as
// MPI_Request_free leaves them. Its all-to-alls are point-to-point rounds, and the engines run
// every allreduce chunk as the ring (ring_bytes 1): the receives can fail.
std::shared_ptr<FakeWorld> FaultyWorld(int n, int rank, int nth) {
  auto world = std::make_shared<FakeWorld>(n);
  world->faults = std::make_shared<FakeWorld::Faults>();
  world->faults->rank = rank;
  world->faults->nth_recv = nth;
  world->faults->keep_dropped = true;
  return world;
}

// N engines over `world` (control messages on a world of their own), stepped from this thread.
struct Engines {
  std::vector<Timeline> timelines;
  std::vector<Stats> stats;
  std::vector<std::unique_ptr<Engine>> engines;
  std::chrono::steady_clock::time_point now{};
  Engines(const std::shared_ptr<FakeWorld>& world, const EngineOptions& options)
      : timelines(world->size()), stats(world->size()) {
    auto control = std::make_shared<FakeWorld>(world->size());
    for (int r = 0; r < world->size(); ++r) {
      engines.push_back(std::make_unique<Engine>(std::make_unique<FakeCommunicator>(world, r),
                                                 std::make_unique<FakeCommunicator>(control, r), &timelines[r],
                                                 &stats[r], options));
    }
  }
  // fail: "" allocates every output; "status" fails this request's first allocation with a
  // Status, "throw" throws std::bad_alloc from it.
  void Submit(int rank, Request req, Outcome* o, const std::string& fail = "") {
    auto r = std::make_unique<Request>(std::move(req));
    const size_t esize = DataTypeSize(r->dtype);
    r->allocate_output = [o, esize, fail](int i, const Shape& s, void** data) {
      if (fail == "throw") throw std::bad_alloc();
      if (fail == "status") return Status::Internal("no memory for " + std::to_string(NumElements(s)) + " elements");
      if (int(o->out.size()) <= i) o->out.resize(i + 1);
      o->out[i].assign(size_t(NumElements(s)) * std::max<size_t>(esize, 4), 0);
      *data = o->out[i].data();
      return Status::Ok();
    };
    r->done = [o](const Status& s) {
      o->done = true;
      o->status = s;
    };
    engines[rank]->Submit(std::move(r));
  }
  template <typename F> bool StepUntil(F until, int rounds = 20000) {
    for (int i = 0; i < rounds; ++i) {
      if (until()) return true;
      now += std::chrono::microseconds(1);
      for (auto& e : engines) e->Step(now);
    }
    return until();
  }
};

Request FloatAllreduce(const std::string& name, const std::vector<float>& in) {
  Request r;
  r.name = name;
  r.op = OpType::kAllreduce;
  r.dtype = DataType::kFloat32;
  r.inputs = {TensorInput{in.data(), {int64_t(in.size())}}};
  return r;
}

bool AllDone(const std::vector<Outcome>& v) {
  return std::all_of(v.begin(), v.end(), [](const Outcome& o) { return o.done; });
}

EngineOptions Options() {
  EngineOptions options;
  options.eager_bytes = 0;  // every allreduce goes through the scheduler's transfers
  options.scheduler.fusion_threshold = 0;
  options.scheduler.ring_bytes = 1;  // the fake world is one host: every chunk runs as the ring
  return options;
}

}  // namespace

TEST(piece_failure_a_failed_ring_receive_on_one_rank_fails_the_allreduce_on_every_rank) {
  const int n = 3;
  // Each chunk is one ring of 2 * (n - 1) receives; rank 1's third receive (in the second
  // chunk) fails while its peers' messages are still on their way.
  EngineOptions options = Options();
  options.scheduler.chunk_bytes = 4 * 1000;
  Engines e(FaultyWorld(n, 1, 6), options);
  std::vector<std::vector<float>> in(n, std::vector<float>(3000, 1.0f));
  std::vector<Outcome> first(n), later(n);
  for (int r = 0; r < n; ++r) e.Submit(r, FloatAllreduce("grads", in[r]), &first[r]);
  // Every rank's request finishes (none waits forever for the failed rank's messages) ...
  CHECK(e.StepUntil([&] { return AllDone(first); }));
  for (int r = 0; r < n; ++r) {
    CHECK(first[r].done && !first[r].status.ok());
    // ... naming the collective, the rank that failed and why.
    CHECK_CONTAINS(first[r].status.message(), "rank 1: allreduce 'grads' failed: injected failure of receive 6");
    CHECK(e.engines[r]->closed());
  }
  CHECK(first[1].status.code() == StatusCode::kAborted);      // its own failure
  CHECK(first[0].status.code() == StatusCode::kUnavailable);  // caused by another rank
  CHECK(first[2].status.code() == StatusCode::kUnavailable);
  // A later collective fails at once on every rank (the engines are closed), never hangs.
  for (int r = 0; r < n; ++r) e.Submit(r, FloatAllreduce("next", in[r]), &later[r]);
  for (int r = 0; r < n; ++r) {
    CHECK(later[r].done && !later[r].status.ok());
    CHECK_CONTAINS(later[r].status.message(), "allreduce 'grads' failed");
    CHECK_CONTAINS(later[r].status.message(), "'next' was not run");
  }
}

TEST(piece_failure_a_last_receive_that_fails_after_the_peers_finished_fails_every_rank) {
  // Rank 1's last receive fails once its message has arrived, when its peers have every message
  // they need and their part is complete. They still fail the collective: it finishes only once
  // every rank has completed it. (The fake world's allreduce and all-to-all are point to point.)
  const int n = 3;
  EngineOptions options = Options();
  options.scheduler.chunk_bytes = 1 << 20;  // one chunk, one piece of data
  std::vector<std::vector<float>> in(n, std::vector<float>(300, 2.0f));
  for (OpType op : {OpType::kAllreduce, OpType::kAlltoall}) {
    const std::string what = std::string(OpTypeName(op)) + " 'last'";
    auto make = [&](int r) {
      Request req = FloatAllreduce("last", in[r]);
      req.op = op;
      return req;
    };
    int last = 0;  // rank 1's receives in a run without failure
    {
      auto clean = FaultyWorld(n, 1, 0);
      Engines e(clean, options);
      std::vector<Outcome> out(n);
      for (int r = 0; r < n; ++r) e.Submit(r, make(r), &out[r]);
      CHECK(e.StepUntil([&] { return AllDone(out); }));
      for (int r = 0; r < n; ++r) CHECK(out[r].status.ok());
      last = clean->faults->recvs;
    }
    CHECK(last > 0);
    auto world = FaultyWorld(n, 1, last);
    world->faults->on_arrival = true;
    Engines e(world, options);
    std::vector<Outcome> out(n);
    for (int r = 0; r < n; ++r) e.Submit(r, make(r), &out[r]);
    CHECK(e.StepUntil([&] { return AllDone(out); }));
    for (int r = 0; r < n; ++r) {
      CHECK(!out[r].status.ok());
      CHECK_CONTAINS(out[r].status.message(), "rank 1: " + what + " failed: injected failure of receive " +
                                                  std::to_string(last));
    }
  }
}

TEST(piece_failure_a_failed_alltoall_receive_fails_every_rank_and_the_collectives_beside_it) {
  const int n = 3;
  EngineOptions options = Options();
  options.scheduler.chunk_bytes = 64;  // several chunks and pieces
  // Rank 2's receives: 12 of the allreduce's three rings (it goes first while the all-to-all's
  // first piece waits to be complete everywhere), then the all-to-all's: the 16th is one of those.
  Engines e(FaultyWorld(n, 2, 16), options);
  std::vector<std::vector<float>> x(n), y(n);
  std::vector<Outcome> a2a(n), other(n);
  for (int r = 0; r < n; ++r) {
    x[r].assign(3 * 40, float(r));
    y[r].assign(48, 1.0f);
    Request req;
    req.name = "exchange";
    req.op = OpType::kAlltoall;
    req.dtype = DataType::kFloat32;
    req.inputs = {TensorInput{x[r].data(), {int64_t(x[r].size())}}};
    e.Submit(r, std::move(req), &a2a[r]);
    Request beside = FloatAllreduce("beside", y[r]);
    beside.priority = 5;
    e.Submit(r, std::move(beside), &other[r]);
  }
  CHECK(e.StepUntil([&] { return AllDone(a2a) && AllDone(other); }));
  for (int r = 0; r < n; ++r) {
    CHECK(a2a[r].done && !a2a[r].status.ok());
    CHECK_CONTAINS(a2a[r].status.message(), "rank 2: alltoall 'exchange' failed: injected failure of receive 16");
    CHECK(e.engines[r]->closed());
  }
  CHECK(a2a[2].status.code() == StatusCode::kAborted);
  CHECK(a2a[0].status.code() == StatusCode::kUnavailable);
  // Whatever shares the broken communicator ends on every rank too: succeeded everywhere
  // before the failure was known, or failed everywhere -- never left waiting.
  for (int r = 0; r < n; ++r) CHECK(other[r].done && other[r].status.ok() == other[0].status.ok());
}

// Runtimes whose allreduce chunks all run as the ring (see FaultyWorld).
RuntimeOptions RingOptions() {
  RuntimeOptions options;
  options.engine.scheduler.ring_bytes = 1;
  return options;
}

TEST(piece_failure_runtimes_fail_every_rank_within_the_deadline) {
  // The same through the Runtime's thread: Get aborts the test binary on a hang.
  mlsl_test::RunRanksOn(RingOptions(), FaultyWorld(3, 0, 2), [](int rank, Runtime& rt) {
    std::vector<float> x(3000, float(rank));
    mlsl::Request r = FloatAllreduce("weights", x);
    auto f = mlsl_test::Submit(rt, std::move(r));
    mlsl_test::Result res = mlsl_test::Get(f);
    CHECK(!res.status.ok());
    CHECK_CONTAINS(res.status.message(), "rank 0: allreduce 'weights' failed: injected failure of receive 2");
    CHECK(res.status.code() == (rank == 0 ? StatusCode::kAborted : StatusCode::kUnavailable));
    auto g = mlsl_test::Submit(rt, FloatAllreduce("after", x));
    mlsl_test::Result after = mlsl_test::Get(g);
    CHECK(!after.status.ok());
    CHECK_CONTAINS(after.status.message(), "allreduce 'weights' failed");
  });
}

TEST(piece_failure_in_a_group_closes_every_rank_the_non_member_too) {
  // Group {0, 1} of 3 ranks: its communicator is a world split off, where rank 0 is rank 0 too,
  // and rank 0's first receive is the first step of the group allreduce's ring (the control and
  // negotiation exchanges are collectives, not receives), so rank 1 waits for its second step.
  mlsl_test::RunRanksOn(RingOptions(), FaultyWorld(3, 0, 1), [](int rank, Runtime& rt) {
    auto add = mlsl_test::Submit(rt, rt.GroupChange(OpType::kAddGroup, {0, 1}));
    mlsl_test::Result added = mlsl_test::Get(add);
    CHECK(added.status.ok());
    const int group = added.As<int32_t>()[0];
    std::vector<float> x(3000, 1.0f);
    const std::string what = "rank 0 (group " + std::to_string(group) + "): allreduce 'pair (group " +
                             std::to_string(group) + ")' failed: injected failure of receive 1";
    if (rank < 2) {
      mlsl::Request r = FloatAllreduce("pair", x);
      r.group = group;
      auto f = mlsl_test::Submit(rt, std::move(r));
      mlsl_test::Result res = mlsl_test::Get(f);
      CHECK(!res.status.ok());
      CHECK_CONTAINS(res.status.message(), what);
    }
    // The world's next collective fails on every rank, rank 2 (not in the group) too.
    auto g = mlsl_test::Submit(rt, FloatAllreduce("world", x));
    mlsl_test::Result after = mlsl_test::Get(g);
    CHECK(!after.status.ok());
    CHECK_CONTAINS(after.status.message(), what);
    CHECK(after.status.code() == (rank == 0 ? StatusCode::kAborted : StatusCode::kUnavailable));
  });
}

namespace {

// Every rank's outcome of one collective whose output `rank` cannot allocate (fail: "status" or
// "throw"), over a world without transfer faults; `make(r, x)` builds rank r's request over x.
void CheckAllocationFailure(const std::string& label, int n, int failing, const std::string& fail,
                            const EngineOptions& options, const std::function<Request(int, std::vector<float>&)>& make,
                            const std::string& expect) {
  auto world = std::make_shared<FakeWorld>(n);
  Engines e(world, options);
  std::vector<std::vector<float>> in(n);
  std::vector<Outcome> first(n), later(n);
  for (int r = 0; r < n; ++r) in[r].assign(3000, float(r + 1));
  for (int r = 0; r < n; ++r) e.Submit(r, make(r, in[r]), &first[r], r == failing ? fail : "");
  // Every rank's request finishes, none with success ...
  CHECK(e.StepUntil([&] { return AllDone(first); }));
  for (int r = 0; r < n; ++r) {
    if (!first[r].done || first[r].status.ok() || first[r].status.message().find(expect) == std::string::npos) {
      std::fprintf(stderr, "%s: rank %d done=%d: %s\n", label.c_str(), r, int(first[r].done),
                   first[r].status.message().c_str());
    }
    CHECK(first[r].done && !first[r].status.ok());
    // ... naming the rank, the collective and why
    CHECK_CONTAINS(first[r].status.message(), expect);
    CHECK(first[r].status.code() == (r == failing ? StatusCode::kAborted : StatusCode::kUnavailable));
    CHECK(e.engines[r]->closed());
  }
  // The engines are closed: a later collective fails at once everywhere, never hangs.
  for (int r = 0; r < n; ++r) e.Submit(r, make(r, in[r]), &later[r]);
  for (int r = 0; r < n; ++r) CHECK(later[r].done && !later[r].status.ok());
}

}  // namespace

TEST(alloc_failure_of_a_chunked_allreduce_output_fails_it_on_every_rank) {
  EngineOptions options = Options();
  options.scheduler.chunk_bytes = 4 * 1000;
  for (const char* fail : {"status", "throw"}) {
    const std::string reason = std::string(fail) == "status" ? "could not allocate its output: no memory for 3000"
                                                             : "out of memory on this rank";
    CheckAllocationFailure(std::string("allreduce/") + fail, 3, 1, fail, options,
                           [](int, std::vector<float>& x) { return FloatAllreduce("grads", x); },
                           "rank 1: allreduce 'grads' failed: " + reason);
  }
}

TEST(alloc_failure_in_a_fused_allreduce_fails_every_part_on_every_rank) {
  // Two small allreduces fused into one buffer; rank 0 cannot allocate the second's output.
  EngineOptions options = Options();
  options.scheduler.fusion_threshold = 1 << 20;
  const int n = 2;
  auto world = std::make_shared<FakeWorld>(n);
  Engines e(world, options);
  std::vector<std::vector<float>> a(n, std::vector<float>(100, 1.0f)), b(n, std::vector<float>(200, 2.0f));
  std::vector<Outcome> oa(n), ob(n);
  for (int r = 0; r < n; ++r) {
    e.Submit(r, FloatAllreduce("a", a[r]), &oa[r]);
    e.Submit(r, FloatAllreduce("b", b[r]), &ob[r], r == 0 ? "status" : "");
  }
  CHECK(e.StepUntil([&] { return AllDone(oa) && AllDone(ob); }));
  for (int r = 0; r < n; ++r) {
    // Fused or not, each part ends the same on both ranks, and 'b' fails on both.
    CHECK(oa[r].status.ok() == oa[0].status.ok());
    CHECK(!ob[r].status.ok());
    CHECK_CONTAINS(ob[r].status.message(), "rank 0: allreduce '");
    CHECK_CONTAINS(ob[r].status.message(), "could not allocate its output: no memory for 200");
  }
}

TEST(alloc_failure_of_an_eager_allreduce_output_fails_it_on_every_rank) {
  // Small enough to ride in the control message: its output is allocated before the message goes out.
  EngineOptions options;
  options.eager_bytes = 1 << 16;
  options.scheduler.fusion_threshold = 0;
  for (const char* fail : {"status", "throw"}) {
    const std::string reason = std::string(fail) == "status" ? "could not allocate its output: no memory for 16"
                                                             : "out of memory on this rank";
    CheckAllocationFailure(std::string("eager/") + fail, 3, 2, fail, options,
                           [](int, std::vector<float>& x) {
                             Request r = FloatAllreduce("small", x);
                             r.inputs[0].shape = {16};
                             return r;
                           },
                           "rank 2: allreduce 'small' failed: " + reason);
  }
}

TEST(alloc_failure_of_each_piecewise_collective_fails_it_on_every_rank) {
  EngineOptions options = Options();
  options.scheduler.chunk_bytes = 1000;  // several pieces each
  struct Case {
    const char* op;
    std::function<Request(int, std::vector<float>&)> make;
  };
  auto base = [](const char* name, OpType op, std::vector<float>& x) {
    Request r;
    r.name = name;
    r.op = op;
    r.dtype = DataType::kFloat32;
    r.inputs = {TensorInput{x.data(), {int64_t(x.size())}}};
    return r;
  };
  std::vector<Case> cases = {
      {"broadcast", [&](int, std::vector<float>& x) { return base("w", OpType::kBroadcast, x); }},
      // allgather and alltoall allocate after their first piece exchanged the counts
      {"allgather", [&](int, std::vector<float>& x) { return base("w", OpType::kAllgather, x); }},
      {"alltoall", [&](int, std::vector<float>& x) { return base("w", OpType::kAlltoall, x); }},
      {"reducescatter", [&](int, std::vector<float>& x) { return base("w", OpType::kReducescatter, x); }},
      {"allreduce", [&](int, std::vector<float>& x) {  // Adasum: an algorithm in pieces too
         Request r = base("w", OpType::kAllreduce, x);
         r.reduce_op = ReduceOp::kAdasum;
         return r;
       }},
  };
  for (const Case& c : cases) {
    for (const char* fail : {"status", "throw"}) {
      const std::string reason = std::string(fail) == "status" ? "could not allocate its output: no memory for"
                                                               : "out of memory on this rank";
      const int n = std::string(c.op) == "allreduce" ? 4 : 3;  // Adasum: a power of two
      CheckAllocationFailure(std::string(c.op) + "/" + fail, n, n - 1, fail, options, c.make,
                             "rank " + std::to_string(n - 1) + ": " + c.op + " 'w' failed: " + reason);
    }
  }
}
