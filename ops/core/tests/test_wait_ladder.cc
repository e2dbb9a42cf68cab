// WaitLadder: the one spin/yield/sleep ladder; LoopPolicy's pause within a cycle is the ladder's
// whenever no transfer is in flight (the simulator's driver and the Runtime both ask LoopPolicy).
#include <memory>

#include "../engine.h"
#include "../fake_communicator.h"
#include "../loop_policy.h"
#include "../wait_ladder.h"
#include "check.h"

using namespace mlsl;
using std::chrono::microseconds;
using std::chrono::milliseconds;

TEST(wait_ladder_spins_polls_then_sleeps_short_then_long) {
  for (int spins = 0; spins < WaitLadder::kSpins; ++spins) CHECK_EQ(WaitLadder::Pause(spins, milliseconds(50)).count(), 0);
  CHECK_EQ(WaitLadder::Pause(64, microseconds(199)).count(), 0);
  CHECK_EQ(WaitLadder::Pause(64, microseconds(200)).count(), 20);
  CHECK_EQ(WaitLadder::Pause(1000, milliseconds(4)).count(), 20);
  CHECK_EQ(WaitLadder::Pause(1000, milliseconds(5)).count(), 200);
  CHECK_EQ(WaitLadder::Pause(1000, milliseconds(50), /*busy=*/true).count(), 0);
  CHECK(!WaitLadder::Yields(0) && !WaitLadder::Yields(63) && WaitLadder::Yields(64) && !WaitLadder::Yields(65) &&
        WaitLadder::Yields(128));
  // The clock is not read while the spins last.
  int reads = 0;
  auto now = [&] { ++reads; return std::chrono::steady_clock::time_point(milliseconds(9)); };
  const std::chrono::steady_clock::time_point start(milliseconds(1));
  CHECK(WaitLadder::Waited(63, start, now) == std::chrono::steady_clock::duration::zero() && reads == 0);
  CHECK(WaitLadder::Waited(64, start, now) == milliseconds(8) && reads == 1);
}

TEST(an_idle_engine_within_a_cycle_follows_the_ladder_and_between_cycles_the_heartbeat) {
  auto world = std::make_shared<FakeWorld>(1);
  auto control = std::make_shared<FakeWorld>(1);
  Timeline timeline;
  Stats stats;
  Engine engine(std::make_unique<FakeCommunicator>(world, 0), std::make_unique<FakeCommunicator>(control, 0),
                &timeline, &stats, EngineOptions());
  CHECK(engine.AllIdle());
  for (int spins : {0, 63, 64, 65, 128, 5000}) {
    for (auto waited : {microseconds(0), microseconds(199), microseconds(200), microseconds(4999), microseconds(5000),
                        microseconds(80000)}) {
      CHECK_EQ(LoopPolicy::WithinCycle(engine.WhenNext(), spins, waited).count(), WaitLadder::Pause(spins, waited).count());
    }
  }
  // Nothing submitted: the engine says so, and between cycles the pacer waits the heartbeat,
  // however many idle cycles it counted.
  CHECK(engine.WhenNext().kind == NextRun::Kind::kArrival && IdlePacer::Quiet(engine));
  IdlePacer pacer(milliseconds(10));
  for (int i = 0; i < 20; ++i) pacer.CycleEnded(StepResult());
  CHECK_EQ(pacer.Wait(engine).count(), 10000);
}

TEST(between_cycles_the_wait_follows_what_the_engine_says_it_needs) {
  using K = NextRun::Kind;
  const microseconds beat(10000);
  // Transfers in flight: their poll interval, whatever the idle count; nothing to do: the heartbeat.
  for (int idle : {0, 8, 100}) {
    CHECK_EQ(LoopPolicy::BetweenCycles({K::kTransfers, microseconds(50)}, idle, beat).count(), 50);
    CHECK_EQ(LoopPolicy::BetweenCycles({K::kArrival, microseconds(0)}, idle, beat).count(), 10000);
  }
  // Waiting on peers: at once for 8 idle cycles, then 20 us doubling up to 1 ms.
  const NextRun peers{K::kPeers, microseconds(0)};
  CHECK_EQ(LoopPolicy::BetweenCycles(peers, 7, beat).count(), 0);
  CHECK_EQ(LoopPolicy::BetweenCycles(peers, 8, beat).count(), 20);
  CHECK_EQ(LoopPolicy::BetweenCycles(peers, 9, beat).count(), 40);
  CHECK_EQ(LoopPolicy::BetweenCycles(peers, 13, beat).count(), 640);
  CHECK_EQ(LoopPolicy::BetweenCycles(peers, 14, beat).count(), 1000);
  CHECK_EQ(LoopPolicy::BetweenCycles(peers, 1000, beat).count(), 1000);

}

namespace {

// One rank's Engine and the CycleStepper of its cycle under way, on a clock the test moves.
struct SteppedRank {
  std::unique_ptr<Engine> engine;
  std::unique_ptr<CycleStepper> cycle;
  std::vector<float> data;
  bool done = false;
};

}  // namespace

TEST(cycle_stepper_is_runcycle_finishing_started_transfers_then_pausing_as_the_ladder_says) {
  // Two ranks stepped round-robin from this thread, each cycle through a CycleStepper (the object
  // Runtime::RunCycle and the simulator's driver both run): a 1 MiB allreduce completes; a step
  // that started transfers is followed by tests of them until LoopPolicy::kFinishStarted has
  // passed or none is in flight; a cycle whose exchange travels waits WithinCycle's pause.
  const int n = 2;
  auto world = std::make_shared<FakeWorld>(n), control = std::make_shared<FakeWorld>(n);
  std::vector<Timeline> timelines(n);
  std::vector<Stats> stats(n);
  std::vector<SteppedRank> ranks(n);
  for (int r = 0; r < n; ++r) {
    ranks[r].engine = std::make_unique<Engine>(std::make_unique<FakeCommunicator>(world, r),
                                               std::make_unique<FakeCommunicator>(control, r), &timelines[r],
                                               &stats[r], EngineOptions());
    ranks[r].data.assign(262144, float(r + 1));
    auto req = std::make_unique<Request>();
    req->name = "w";
    req->inputs = {TensorInput{ranks[r].data.data(), {int64_t(ranks[r].data.size())}}};
    float* out = ranks[r].data.data();
    req->allocate_output = [out](int, const Shape&, void** p) { *p = out; return Status::Ok(); };
    bool* done = &ranks[r].done;
    req->done = [done](const Status& s) { CHECK(s.ok()); *done = true; };
    ranks[r].engine->Submit(std::move(req));
  }
  std::chrono::steady_clock::time_point now{};
  int finishing = 0, cycles = 0;
  for (int acts = 0; acts < 200000 && !(ranks[0].done && ranks[1].done); ++acts) {
    now += microseconds(1);
    SteppedRank& rank = ranks[acts % n];
    if (!rank.cycle) rank.cycle = std::make_unique<CycleStepper>(rank.engine.get(), now);
    const CycleStepper::Next next = rank.cycle->Act(now);
    if (next.done) {
      CHECK(!next.result.closed);
      rank.cycle.reset();
      ++cycles;
    } else if (next.finishing) {
      ++finishing;
      CHECK(next.at > now - LoopPolicy::kFinishStarted && next.at <= now + LoopPolicy::kFinishStarted);
    } else {
      CHECK(next.at == now + next.pause);
    }
  }
  CHECK(ranks[0].done && ranks[1].done);
  CHECK(finishing > 0);  // the chunks' start was followed by tests of them
  CHECK(cycles >= 2);
  for (int r = 0; r < n; ++r) CHECK_EQ(ranks[r].data[0], 3.0f);
}
