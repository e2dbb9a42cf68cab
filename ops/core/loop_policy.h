// LoopPolicy: when the background thread steps the Engine -- how long it waits between cycles and
// between two steps of a cycle -- as pure functions of the engine's state and elapsed time. The
// Runtime follows them on the real clock (runtime.cc), the simulator on virtual time (sim/).
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
  static us BetweenCycles(const Engine& engine, int idle_cycles, us heartbeat);

  // Within a cycle whose exchange travels, after `spins` steps and `waited` since it began: the
  // pause before the next step (0: at once). Transfers in flight: the poll interval; else the
  // WaitLadder (wait_ladder.h).
  static us WithinCycle(const Engine& engine, int spins, std::chrono::steady_clock::duration waited);
};

}  // namespace mlsl
