// The Engine without the Runtime's thread: N engines on the fake transport, stepped round-robin
// from this one thread. Any wait for a peer inside Step would deadlock here (the peer is only
// stepped after Step returns), so these tests also show that the engine never blocks.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "../engine.h"
#include "../fake_communicator.h"
#include "../settings.h"
#include "check.h"

using namespace mlsl;

namespace {

struct Outcome {
  bool done = false;
  Status status;
  std::vector<float> out;
};

// N engines over one fake world (and one for their control messages), each with its own
// timeline and counters, and the order in which each rank's requests finished.
struct Engines {
  std::vector<Timeline> timelines;
  std::vector<Stats> stats;
  std::vector<std::unique_ptr<Engine>> engines;
  std::vector<std::vector<std::string>> finished;
  std::chrono::steady_clock::time_point now{};
  Engines(int n, const EngineOptions& options) : timelines(n), stats(n), finished(n) {
    auto world = std::make_shared<FakeWorld>(n), control = std::make_shared<FakeWorld>(n);
    for (int r = 0; r < n; ++r) {
      engines.push_back(std::make_unique<Engine>(std::make_unique<FakeCommunicator>(world, r),
                                                 std::make_unique<FakeCommunicator>(control, r), &timelines[r],
                                                 &stats[r], options));
    }
  }
  // A float32 allreduce (sum) of `in` on `rank`, recorded in *o and in finished[rank].
  void Allreduce(int rank, const std::string& name, const std::vector<float>& in, Outcome* o, int priority = 0) {
    auto r = std::make_unique<Request>();
    r->name = name;
    r->op = OpType::kAllreduce;
    r->dtype = DataType::kFloat32;
    r->priority = priority;
    r->inputs = {TensorInput{in.data(), {int64_t(in.size())}}};
    r->allocate_output = [o](int, const Shape& s, void** data) {
      o->out.assign(size_t(NumElements(s)), 0.0f);
      *data = o->out.data();
      return Status::Ok();
    };
    r->done = [this, o, rank, name](const Status& s) {
      o->done = true;
      o->status = s;
      finished[rank].push_back(name);
    };
    engines[rank]->Submit(std::move(r));
  }
  // Steps every engine in turn (virtual time: 1 us a round) until `until` holds; false when it
  // never does within `rounds` rounds.
  template <typename F> bool StepUntil(F until, int rounds = 200000) {
    for (int i = 0; i < rounds; ++i) {
      if (until()) return true;
      now += std::chrono::microseconds(1);
      for (auto& e : engines) e->Step(now);
    }
    return until();
  }
};

}  // namespace

TEST(engines_stepped_round_robin_from_one_thread_agree_and_reduce) {
  const int n = 3;
  EngineOptions options;
  options.scheduler.chunk_bytes = 4096;  // the large one goes in chunks
  Engines e(n, options);
  std::vector<std::vector<float>> small(n), large(n);
  std::vector<Outcome> a(n), b(n), c(n);
  for (int r = 0; r < n; ++r) {
    small[r].assign(4, float(r + 1));
    large[r].assign(10000, float(10 * r));
    // different submission orders on different ranks
    if (r % 2) {
      e.Allreduce(r, "large", large[r], &a[r], 5);
      e.Allreduce(r, "small", small[r], &b[r], 0);
    } else {
      e.Allreduce(r, "small", small[r], &b[r], 0);
      e.Allreduce(r, "large", large[r], &a[r], 5);
    }
  }
  auto all_done = [&](std::vector<Outcome>& v) { return std::all_of(v.begin(), v.end(), [](auto& o) { return o.done; }); };
  CHECK(e.StepUntil([&] { return all_done(a) && all_done(b); }));
  for (int r = 0; r < n; ++r) {
    CHECK(a[r].status.ok() && b[r].status.ok());
    CHECK(b[r].out == std::vector<float>(4, 6.0f));
    CHECK(a[r].out == std::vector<float>(10000, 30.0f));
  }
  // again: the names are cached now, and the small one rides in the control message
  for (int r = 0; r < n; ++r) e.Allreduce(r, "small", small[r], &c[r]);
  CHECK(e.StepUntil([&] { return all_done(c); }));
  for (int r = 0; r < n; ++r) CHECK(c[r].out == std::vector<float>(4, 6.0f));
  CHECK_CONTAINS(e.stats[0].Json(), "\"eager\": 1");
  // every rank finished them in the same order
  for (int r = 1; r < n; ++r) CHECK(e.finished[r] == e.finished[0]);
  // stopping one rank closes every engine, the others with the peer's shutdown
  e.engines[1]->Stop();
  CHECK(e.StepUntil([&] {
    return std::all_of(e.engines.begin(), e.engines.end(), [](auto& en) { return en->closed(); });
  }));
  CHECK(e.engines[0]->closed_code() == StatusCode::kUnavailable);
  CHECK_CONTAINS(e.engines[0]->closed_reason(), "rank 1 shut down");
  CHECK(e.engines[1]->closed_code() == StatusCode::kAborted);
}

TEST(engine_step_reports_cycles_and_an_urgent_request_overtakes_between_chunks) {
  const int n = 2;
  EngineOptions options;
  options.scheduler.chunk_bytes = 1024;
  options.scheduler.inflight = 1;
  options.scheduler.fusion_threshold = 0;
  options.eager_bytes = 0;
  Engines e(n, options);
  std::vector<std::vector<float>> big(n, std::vector<float>(64 * 256, 1.0f)), urgent(n, std::vector<float>(4, 2.0f));
  std::vector<Outcome> a(n), b(n);
  for (int r = 0; r < n; ++r) e.Allreduce(r, "big", big[r], &a[r], 10);
  // a few rounds: the big one is agreed and its first chunks travel
  CHECK(e.StepUntil([&] { return e.engines[0]->cycles() >= 4; }));
  CHECK(!a[0].done);
  for (int r = 0; r < n; ++r) e.Allreduce(r, "urgent", urgent[r], &b[r], 0);
  CHECK(e.StepUntil([&] { return a[0].done && a[1].done && b[0].done && b[1].done; }));
  for (int r = 0; r < n; ++r) {
    CHECK(e.finished[r] == (std::vector<std::string>{"urgent", "big"}));
    CHECK(b[r].out == std::vector<float>(4, 4.0f));
    CHECK(a[r].out == std::vector<float>(64 * 256, 2.0f));
  }
  // an idle engine's step completes a whole (heartbeat) cycle and reports no progress
  for (int i = 0; i < 3; ++i) for (auto& en : e.engines) en->Step(e.now);
  StepResult r0 = e.engines[0]->Step(e.now), r1 = e.engines[1]->Step(e.now);
  CHECK(!r0.closed && !r1.closed);
  CHECK(r1.cycle_done && !r1.progress);
}

// RuntimeOptions() (what tests and the simulator start from) holds the settings table's defaults.
TEST(runtime_options_defaults_are_the_settings_tables) {
  auto number = [](const char* name) {
    for (const SettingInfo& s : AllSettings()) {
      if (std::string(s.name) != name) continue;
      int64_t n = -1;
      CHECK_EQ(CheckSetting(s, s.default_value, &n), std::string());
      return n;
    }
    CHECK(false);
    return int64_t(-1);
  };
  const RuntimeOptions o;
  CHECK_EQ(o.engine.scheduler.chunk_bytes, number("MLSL_TF_CHUNK_BYTES"));
  CHECK_EQ(int64_t(o.engine.scheduler.inflight), number("MLSL_TF_INFLIGHT"));
  CHECK_EQ(o.engine.scheduler.fusion_threshold, number("MLSL_TF_FUSION_THRESHOLD"));
  CHECK_EQ(o.engine.eager_bytes, number("MLSL_TF_EAGER_BYTES"));
  CHECK_EQ(int64_t(o.engine.cache_capacity), number("MLSL_TF_CACHE_CAPACITY"));
  CHECK_EQ(int64_t(o.engine.stall_warning.count()), number("MLSL_TF_STALL_WARNING_SECONDS"));
  CHECK_EQ(int64_t(o.engine.stall_shutdown.count()), number("MLSL_TF_STALL_SHUTDOWN_SECONDS"));
  CHECK_EQ(int64_t(o.heartbeat.count()), number("MLSL_TF_HEARTBEAT_MS"));
  CHECK_EQ(int64_t(o.spin.count()), number("MLSL_TF_SPIN_US"));
  CHECK_EQ(int64_t(o.comm_nice), number("MLSL_TF_COMM_NICE"));
  CHECK_EQ(o.engine.scheduler.ring_bytes, number("MLSL_TF_RING_BYTES"));
  CHECK(!o.engine.scheduler.fifo && o.engine.default_wire == DataType::kFloat32 && !o.mark_cycles);
}
