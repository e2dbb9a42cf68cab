// LoopPolicy: when the background thread steps the Engine -- how long it waits between cycles and
// between two steps of a cycle -- as pure functions of what the engine says it next needs
// (Engine::WhenNext) and elapsed time; and
// CycleStepper, one cycle's loop as a state machine over the owner's clock. The Runtime follows
// them on the real clock (runtime.cc), the simulator on virtual time (sim/): one loop, two clocks.
#pragma once

#include <chrono>

#include "engine.h"
#include "wait_ladder.h"

namespace mlsl {

struct LoopPolicy {
  using us = std::chrono::microseconds;

  // After starting transfers, the thread keeps testing them this long: small ones complete within
  // microseconds, and completing them here lets the next control message carry them (a
  // collective finishes once every rank's message says it completed).
  static constexpr us kFinishStarted{20};

  // Between cycles with nothing submitted: the longest the thread waits for a submission before
  // it runs the next cycle anyway (0: at once). Transfers in flight: the poll interval (over a
  // network it sleeps a little between tests); nothing at all: `heartbeat` (after spinning for
  // the runtime's spin time, which on a virtual clock costs nothing); waiting on peers for
  // `idle_cycles` cycles in a row: a backoff, so two ranks waiting on each other do not spin.
  static us BetweenCycles(const NextRun& next, int idle_cycles, us heartbeat);

  // Within a cycle whose exchange travels, after `spins` steps and `waited` since it began: the
  // pause before the next step (0: at once). Transfers in flight: the poll interval; else the
  // WaitLadder (wait_ladder.h).
  static us WithinCycle(const NextRun& next, int spins, std::chrono::steady_clock::duration waited);
};

// Between two cycles of the background thread: counts the cycles in a row that moved nothing and
// says, from what the engine needs next, how long the owner waits for a submission before the
// next cycle. The Runtime and the simulator's driver each keep one.
class IdlePacer {
 public:
  explicit IdlePacer(LoopPolicy::us heartbeat) : heartbeat_(heartbeat) {}
  void CycleEnded(const StepResult& r) { idle_cycles_ = r.progress ? 0 : idle_cycles_ + 1; }
  LoopPolicy::us Wait(const NextRun& next) const { return LoopPolicy::BetweenCycles(next, idle_cycles_, heartbeat_); }
  LoopPolicy::us Wait(const Engine& engine) const { return Wait(engine.WhenNext()); }
  // Nothing of the engine's own to do: the real clock's owner polls for a submission a while
  // before it sleeps (on a virtual clock that costs nothing).
  static bool Quiet(const NextRun& next) { return next.kind == NextRun::Kind::kArrival; }
  static bool Quiet(const Engine& engine) { return Quiet(engine.WhenNext()); }

 private:
  const LoopPolicy::us heartbeat_;
  int idle_cycles_ = 0;
};

// One cycle of the background thread: step the engine; after a step that started transfers, test
// them until none is in flight or kFinishStarted has passed; while an exchange travels, step
// again after WithinCycle's pause (yielding now and then when it is 0) -- until the cycle
// completes or the engine closes. No thread and no clock: the owner calls Act at the time it
// last said, with its clock's `now`.
class CycleStepper {
 public:
  using Clock = std::chrono::steady_clock;
  struct Next {
    bool done = false;       // the cycle completed or the engine closed (result says which)
    StepResult result;       // of the step that ended the cycle
    Clock::time_point at{};  // act again then (<= now: at once): now + pause ...
    std::chrono::microseconds pause{0};
    bool yield = false;      // ... yielding the core first
    // Testing transfers just started: act again at once, for as long as one is in flight and
    // `at` (the end of kFinishStarted) has not passed -- on a virtual clock, when one completes.
    bool finishing = false;
  };
  CycleStepper(Engine* engine, Clock::time_point start) : engine_(engine), start_(start) {}
  // Does what is due at `now` and says what next.
  Next Act(Clock::time_point now);

 private:
  Next After(const StepResult& r, Clock::time_point now);

  Engine* const engine_;
  const Clock::time_point start_;
  int spins_ = 0;
  bool finishing_ = false;
  Clock::time_point finish_until_{};
  StepResult finished_;  // the step that started the transfers being finished
};

}  // namespace mlsl
