#include "loop_policy.h"

#include <algorithm>

namespace mlsl {

LoopPolicy::us LoopPolicy::BetweenCycles(const NextRun& next, int idle_cycles, us heartbeat) {
  switch (next.kind) {
    case NextRun::Kind::kTransfers: return next.poll;
    case NextRun::Kind::kArrival: return heartbeat;
    case NextRun::Kind::kPeers: break;
  }
  if (idle_cycles < 8) return us(0);
  return std::min<us>(us(20 << std::min(idle_cycles - 8, 6)), us(1000));
}

LoopPolicy::us LoopPolicy::WithinCycle(const NextRun& next, int spins, std::chrono::steady_clock::duration waited) {
  // MPI moves shared-memory data only inside Test, so without a network's pause the thread polls.
  if (next.kind == NextRun::Kind::kTransfers) return next.poll;
  return WaitLadder::Pause(spins, waited);
}

CycleStepper::Next CycleStepper::Act(Clock::time_point now) {
  if (finishing_) {
    if (engine_->Transferring() && now < finish_until_) {
      engine_->Progress(now);
      Next next;
      next.at = finish_until_;
      next.finishing = true;
      return next;
    }
    finishing_ = false;
    return After(finished_, now);
  }
  const StepResult r = engine_->Step(now);
  if (r.started_units && !r.closed) {
    // Small transfers complete within microseconds; completing them here lets the next control
    // message carry them.
    finishing_ = true;
    finish_until_ = now + LoopPolicy::kFinishStarted;
    finished_ = r;
    if (engine_->Transferring()) engine_->Progress(now);
    Next next;
    next.at = finish_until_;
    next.finishing = true;
    return next;
  }
  return After(r, now);
}

CycleStepper::Next CycleStepper::After(const StepResult& r, Clock::time_point now) {
  Next next;
  if (r.closed || r.cycle_done) {
    next.done = true;
    next.result = r;
    return next;
  }
  // An exchange travels: step again at once, after a yield, or after the policy's pause.
  const auto pause = LoopPolicy::WithinCycle(engine_->WhenNext(), spins_, WaitLadder::Waited(spins_, start_, [now] { return now; }));
  next.at = now + pause;
  next.pause = pause;
  next.yield = pause.count() == 0 && WaitLadder::Yields(spins_);
  ++spins_;
  return next;
}

}  // namespace mlsl
