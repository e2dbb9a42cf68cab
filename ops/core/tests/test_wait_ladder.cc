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

TEST(loop_policy_within_a_cycle_is_the_ladder_when_nothing_is_in_flight) {
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
      CHECK_EQ(LoopPolicy::WithinCycle(engine, spins, waited).count(), WaitLadder::Pause(spins, waited).count());
    }
  }
}
