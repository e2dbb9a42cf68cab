#include "background_thread.h"

#include <algorithm>
#include <cmath>
#include <limits>


namespace mlsl {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

double Seconds(std::chrono::microseconds d) { return std::chrono::duration<double>(d).count(); }
double Seconds(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(t.time_since_epoch()).count();
}

}  // namespace

SimBackgroundThread::SimBackgroundThread(SimNetwork* net, const RuntimeOptions& options, double cycle_bound_s,
                                         Timeline* timeline, Stats* stats)
    : net_(net), options_(options), cycle_bound_s_(cycle_bound_s) {
  auto comm = std::make_unique<SimCommunicator>(net_);
  std::vector<int> everyone(comm->size());
  for (int r = 0; r < comm->size(); ++r) everyone[r] = r;
  std::unique_ptr<Communicator> control;
  comm->Split(everyone, &control);
  EngineOptions engine = options.engine;
  engine.stall_warning = engine.stall_shutdown = std::chrono::seconds(0);
  engine_ = std::make_unique<Engine>(std::move(comm), std::move(control), timeline, stats, engine);
}

bool SimBackgroundThread::Quiet() const {
  return incoming_.empty() && !cycle_ && IdlePacer::Quiet(*engine_);
}

double SimBackgroundThread::NextAction() const {
  const double now = net_->now();
  if (!cycle_) {
    // Runtime::BetweenCycles: a submission ends the wait at once.
    const double wake = incoming_.empty() && !engine_->HasInbox() ? wake_at_ : now;
    return std::max({wake, next_cycle_, now});
  }
  const double at = Seconds(next_.at);
  if (next_.finishing) return !engine_->Transferring() || Changed() ? now : std::max(now, at);
  // Steps with no completion between them change nothing: the thread's next useful step is its
  // first (after its pause: a poll interval or a sleep) once something completed.
  if (!Changed()) return kInf;
  const double pause = Seconds(next_.pause);
  return pause <= 0 ? now : last_act_ + std::ceil((now - last_act_) / pause - 1e-9) * pause;
}

void SimBackgroundThread::Act() {
  const double now = net_->now();
  if (!cycle_) {
    // Runtime::BetweenCycles then RunCycle: the submissions go to the engine, the cycle begins.
    for (auto& r : incoming_) engine_->Submit(std::move(r));
    incoming_.clear();
    cycle_ = std::make_unique<CycleStepper>(engine_.get(), net_->Now());
    next_cycle_ = now + cycle_bound_s_;
  }
  last_act_ = now;
  seen_ = net_->completed();
  next_ = cycle_->Act(net_->Now());
  if (next_.done) EndCycle(next_.result);
}

void SimBackgroundThread::EndCycle(const StepResult& r) {
  cycle_.reset();
  if (r.closed) {
    error_ = "the engine closed: " + engine_->closed_reason();
    wake_at_ = kInf;
    return;
  }
  pacer_.CycleEnded(r);
  wake_at_ = net_->now() + Seconds(pacer_.Wait(*engine_));
}

}  // namespace mlsl
