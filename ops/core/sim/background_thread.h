// SimBackgroundThread: the Runtime's background thread on a SimNetwork's virtual clock -- the
// real Engine (engine.h) stepped by the Runtime's own loop: between cycles LoopPolicy's wait (a
// cycle as soon as something is submitted, after the poll interval while transfers are in
// flight, after the heartbeat when there is nothing), and each cycle a CycleStepper
// (loop_policy.h), the object Runtime::RunCycle runs. What only a virtual clock adds: a step with
// no completion since the last one changes nothing, so the thread's next step is the first tick
// of its pause after a completion.
#pragma once

#include <deque>
#include <memory>
#include <string>

#include "../engine.h"
#include "../loop_policy.h"
#include "../options.h"
#include "../sim_communicator.h"
#include "../stats.h"
#include "../timeline.h"

namespace mlsl {

class SimBackgroundThread {
 public:
  // Its own Engine over a SimCommunicator of `net` (and one for the control message, as the
  // Runtime has), with `options`, the scheduler on net's clock and no stall reports (a stall is
  // a rank that never submits: the simulated ranks are identical). `net`, `timeline` and `stats`
  // must outlive it. `cycle_bound_s`: least time between the starts of two cycles (0: none;
  // Horovod's cycle time when the simulator plays Horovod).
  SimBackgroundThread(SimNetwork* net, const RuntimeOptions& options, double cycle_bound_s, Timeline* timeline,
                      Stats* stats);
  const Engine& engine() const { return *engine_; }
  // The framework's side (Runtime::Submit): wakes the thread if it waits between cycles.
  void Submit(std::unique_ptr<Request> request) { incoming_.push_back(std::move(request)); }
  // When the thread acts next on virtual time (>= now; infinity: it waits for a submission).
  double NextAction() const;
  // Acts at net->now() (== NextAction()): a cycle begins, a step, or a test of new transfers.
  void Act();
  // Nothing submitted, queued, in flight or under way.
  bool Quiet() const;
  const std::string& error() const { return error_; }

 private:
  // Whether an operation completed since the thread last stepped or tested.
  bool Changed() const { return net_->completed() != seen_; }
  void EndCycle(const StepResult& r);

  SimNetwork* const net_;
  std::unique_ptr<Engine> engine_;
  const RuntimeOptions options_;
  const double cycle_bound_s_;
  std::deque<std::unique_ptr<Request>> incoming_;
  std::unique_ptr<CycleStepper> cycle_;  // the cycle under way (null: between cycles)
  CycleStepper::Next next_;              // ... and what it said to do next
  double wake_at_ = 0;          // between cycles: the end of the wait for a submission
  double next_cycle_ = 0;       // cycle_bound_s after the last cycle began
  double last_act_ = 0;         // when the cycle last acted
  uint64_t seen_ = 0;           // the network's completions when it last stepped or tested
  IdlePacer pacer_{options_.heartbeat};  // between cycles, as the Runtime's
  std::string error_;
};

}  // namespace mlsl
