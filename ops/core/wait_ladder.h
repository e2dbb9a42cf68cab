// WaitLadder: how every loop that waits on transfers paces its tests -- spin, then yield now and
// then, then sleep 20 us, then 200 us -- as pure functions of the tests made and the time waited.
// The one copy: the background thread's cycle (LoopPolicy), Wait (communicator.cc) and, through
// LoopPolicy, the simulator's driver follow it.
#pragma once

#include <chrono>

namespace mlsl {

struct WaitLadder {
  using us = std::chrono::microseconds;

  // Tests that spin before the clock is read at all.
  static constexpr int kSpins = 64;
  // Below this wait the loop keeps polling: MPI moves shared-memory data only inside Test.
  static constexpr us kPoll{200};
  // Below this wait a pause is short (20 us); beyond it, 200 us.
  static constexpr std::chrono::milliseconds kShortPauses{5};

  // After `spins` tests and `waited` since the wait began: the pause before the next test (0: at
  // once). `busy`: the caller has other work between tests, so it keeps polling.
  static us Pause(int spins, std::chrono::steady_clock::duration waited, bool busy = false) {
    if (spins < kSpins || busy || waited < kPoll) return us(0);
    return waited < kShortPauses ? us(20) : us(200);
  }
  // Whether a test that pauses 0 yields the core first: one in kSpins once the spins are spent (a
  // yield per test would spend most of the time in the OS scheduler; one in 64 still lets a
  // waiting thread run).
  static bool Yields(int spins) { return spins >= kSpins && spins % kSpins == 0; }
  // The wait so far, read only once the spins are spent (`now` is called then, not before).
  template <typename Now>
  static std::chrono::steady_clock::duration Waited(int spins, std::chrono::steady_clock::time_point start, Now now) {
    return spins < kSpins ? std::chrono::steady_clock::duration::zero() : now() - start;
  }
};

}  // namespace mlsl
