#include "loop_policy.h"

#include <algorithm>

namespace mlsl {

LoopPolicy::us LoopPolicy::BetweenCycles(const Engine& engine, int idle_cycles, us heartbeat) {
  if (!engine.AllIdle()) return engine.PollInterval();
  if (!engine.HasWork()) return heartbeat;
  if (idle_cycles < 8) return us(0);
  return std::min<us>(us(20 << std::min(idle_cycles - 8, 6)), us(1000));
}

LoopPolicy::us LoopPolicy::WithinCycle(const Engine& engine, int spins, std::chrono::steady_clock::duration waited) {
  // MPI moves shared-memory data only inside Test, so without a network's pause the thread polls.
  if (!engine.AllIdle()) return engine.PollInterval();
  return WaitLadder::Pause(spins, waited);
}

}  // namespace mlsl
