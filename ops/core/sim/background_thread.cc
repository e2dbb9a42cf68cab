#include "background_thread.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "../loop_policy.h"

namespace mlsl {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

double Seconds(std::chrono::microseconds d) { return std::chrono::duration<double>(d).count(); }

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
  engine.scheduler.clock = net_;
  engine.stall_warning = engine.stall_shutdown = std::chrono::seconds(0);
  engine_ = std::make_unique<Engine>(std::move(comm), std::move(control), timeline, stats, engine);
}

bool SimBackgroundThread::Quiet() const {
  return incoming_.empty() && state_ == State::kBetween && !engine_->HasWork() && engine_->AllIdle();
}

double SimBackgroundThread::NextAction() const {
  const double now = net_->now();
  switch (state_) {
    case State::kBetween: {
      // Runtime::BetweenCycles: a submission ends the wait at once.
      const double wake = incoming_.empty() && !engine_->HasInbox() ? wake_at_ : now;
      return std::max({wake, next_cycle_, now});
    }
    case State::kStepping:
      // Steps with no completion between them change nothing: the thread's next useful step is
      // its first (after its pause: a poll interval or a sleep) once something completed.
      if (!Changed()) return kInf;
      return pause_s_ <= 0 ? now : last_step_ + std::ceil((now - last_step_) / pause_s_ - 1e-9) * pause_s_;
    case State::kFinishing:
      return !engine_->Transferring() || Changed() ? now : std::max(now, finish_until_);
  }
  return kInf;
}

void SimBackgroundThread::Act() {
  const double now = net_->now();
  if (state_ == State::kBetween) {
    // Runtime::BetweenCycles then RunCycle: the submissions go to the engine, the cycle begins.
    for (auto& r : incoming_) engine_->Submit(std::move(r));
    incoming_.clear();
    state_ = State::kStepping;
    cycle_start_ = now;
    next_cycle_ = now + cycle_bound_s_;
    spins_ = 0;
    Step();
    return;
  }
  if (state_ == State::kFinishing) {
    // RunCycle: while (Transferring && now < until) Progress().
    if (engine_->Transferring() && now < finish_until_) {
      seen_ = net_->completed();
      engine_->Progress();
      return;
    }
    AfterStep(finishing_);
    return;
  }
  Step();
}

void SimBackgroundThread::Step() {
  last_step_ = net_->now();
  seen_ = net_->completed();
  const StepResult r = engine_->Step(net_->Now());
  if (r.closed) {
    error_ = "the engine closed: " + engine_->closed_reason();
    state_ = State::kBetween;
    wake_at_ = kInf;
    return;
  }
  if (r.started_units) {
    finish_until_ = net_->now() + Seconds(LoopPolicy::kFinishStarted);
    finishing_ = r;
    state_ = State::kFinishing;
    if (engine_->Transferring()) engine_->Progress();  // at once, as RunCycle does
    return;
  }
  AfterStep(r);
}

void SimBackgroundThread::AfterStep(const StepResult& r) {
  const double now = net_->now();
  if (!r.cycle_done) {
    state_ = State::kStepping;
    const auto waited = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(now - cycle_start_));
    pause_s_ = Seconds(LoopPolicy::WithinCycle(*engine_, spins_++, waited));
    return;
  }
  idle_cycles_ = r.progress ? 0 : idle_cycles_ + 1;
  state_ = State::kBetween;
  wake_at_ = now + Seconds(LoopPolicy::BetweenCycles(*engine_, idle_cycles_, options_.heartbeat));
}

}  // namespace mlsl
