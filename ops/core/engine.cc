// Engine: construction, intake, Step and the exchanges in flight (engine.h).
#include "engine.h"

#include <algorithm>

#include "logging.h"
#include "mpi_checks.h"

namespace mlsl {

Engine::Engine(std::unique_ptr<Communicator> comm, std::unique_ptr<Communicator> control, Timeline* timeline,
               Stats* stats, EngineOptions options)
    : comm_(std::move(comm)),
      control_comm_(std::move(control)),
      stats_(stats),
      options_(options),
      groups_(comm_.get(), timeline, stats, WithSlots(options)),
      names_(comm_->size(), options.cache_capacity),
      eager_(options.eager_bytes, comm_->rank(), comm_->size(), timeline, stats),
      stalls_(options.stall_warning, options.stall_shutdown) {
  round_.joined_before.assign(size_t(comm_->size()), false);
  TuneOptions tune = options.tune;
  tune.initial[kTuneInflight] = options.scheduler.inflight;
  round_.tuner = Tuner(tune, comm_->rank());
  stats_->Autotune(round_.tuner.Json());
}

SchedulerOptions Engine::WithSlots(const EngineOptions& options) {
  SchedulerOptions s = options.scheduler;
  // Depends only on agreed settings (MLSL_TF_AUTOTUNE, MLSL_TF_INFLIGHT): unit seq runs on slot
  // seq % slots on every rank.
  if (options.tune.enabled) s.slots = std::max(s.inflight, int(Tuner::MostInflight()));
  return s;
}

Engine::~Engine() = default;

void Engine::Submit(std::unique_ptr<Request> request) {
  if (closed_.closed) {
    std::string what = request->op == OpType::kJoin ? "join" : "collective '" + ShownName(request->name) + "'";
    request->done(Status::WithCode(closed_.code, closed_.reason + " (" + what + " was not run)"));
    return;
  }
  pending_.Push(std::move(request));
}

StepResult Engine::Step(Clock::time_point now) {
  now_ = now;
  StepResult result;
  if (!closed_.closed) {
    if (round_.phase == Phase::kIdle) BeginCycle();
    Advance(&result);
    // chunks in flight keep moving while an exchange travels
    if (!closed_.closed && round_.phase != Phase::kIdle) Progress(now);
  }
  result.closed = closed_.closed;
  result.in_cycle = !closed_.closed && round_.phase != Phase::kIdle;
  return result;
}

void Engine::Advance(StepResult* result) {
  while (!closed_.closed && round_.phase != Phase::kIdle) {
    const Phase phase = round_.phase;
    bool done = false;
    Status s = phase == Phase::kControl ? round_.control_op->Test(&done) : round_.gather.Test(&done);
    if (!s.ok()) {
      if (phase == Phase::kControl) {
        Close("mlsl_tf: the background cycle failed: " + s.message(), StatusCode::kUnavailable);
      } else if (phase == Phase::kFailures) {
        Close("mlsl_tf: a transfer failed on some rank" + (failure_.empty() ? "" : " (" + failure_.line() + ")") +
              ", and gathering the failures failed too: " + s.message());
      } else {
        Close(std::string("mlsl_tf: ") + (phase == Phase::kStalls ? "the stall report" : "negotiation") +
              " failed: " + s.message());
      }
      return;
    }
    if (!done) return;
    round_.phase = Phase::kIdle;
    if (phase == Phase::kControl) {
      round_.control_op.reset();
      OnControl(result);
    } else if (phase == Phase::kFailures) {
      Close(FailureNote::Reason(round_.gather), failure_.empty() ? StatusCode::kUnavailable : StatusCode::kAborted);
    } else if (phase == Phase::kStalls) {
      std::string reason = stalls_.Report(round_.gather, round_.message.past_limit, &pending_, groups_, rank(), now_);
      reason.empty() ? AfterStalls(result) : Close(reason);
    } else if (phase == Phase::kNegotiate) {
      OnNegotiated(result);
    }
  }
}

void Engine::Intake(std::unique_ptr<Request> r) {
  if (r->op == OpType::kJoin) {
    pending_.SetJoin(std::move(r), rank());
    return;
  }
  round_.tuner.Submitted(r->name, now_);  // rank 0 times steps
  std::string group_error = groups_.Refusal(*r);
  if (!group_error.empty()) {
    r->done(Status::InvalidArgument(group_error));
    return;
  }
  // Names are per group: the same program runs in every group (e.g. a model-parallel layer).
  if (r->group != 0) {
    int generation = groups_[r->group].generation;
    r->name += " (group " + std::to_string(r->group) + (generation ? "." + std::to_string(generation) : "") + ")";
  }
  if (pending_.Has(r->name)) {
    r->done(Status::InvalidArgument("mlsl_tf: a collective named '" + ShownName(r->name) + "' is already pending on rank " +
                                    std::to_string(rank()) + "; concurrent collectives need distinct names"));
    return;
  }
  PendingRequest p;
  p.submitted = now_;
  p.meta = RequestMeta::From(*r);
  bool reduces = r->op == OpType::kAllreduce || r->op == OpType::kReducescatter;
  // Only float32 reductions are compressed, and never Adasum (an explicit wire is refused by ValidateLocally).
  if (!reduces || r->dtype != DataType::kFloat32 || (r->reduce_op == ReduceOp::kAdasum && r->wire < 0)) {
    p.meta.wire = r->dtype;
  } else if (r->wire < 0) {
    p.meta.wire = options_.default_wire;
  }
  if (!p.meta.compressed() || r->op != OpType::kAllreduce) p.meta.error_feedback = false;
  p.meta.local_error = ValidateLocally(*r, int(groups_[r->group].ranks.size()));
  if (p.meta.local_error.empty() && r->op == OpType::kAddGroup) p.meta.local_error = groups_.Existing(r->ranks);
  const int32_t cached = p.meta.local_error.empty() ? names_.CachedId(r->name, p.meta) : -1;
  if (cached >= 0) {
    p.state = PendingRequest::kReady;
    p.id = cached;
  }
  p.request = std::move(r);
  pending_.Add(std::move(p));
}

void Engine::Close(const std::string& reason, StatusCode code) {
  closed_ = Closure{true, reason, code};
  round_.phase = Phase::kIdle;
  groups_.FailAll(Status::WithCode(code, reason + " (the collective did not complete)"));
  pending_.FailAll(code, reason);
}

}  // namespace mlsl
