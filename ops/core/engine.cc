// Engine: construction, intake, Step and the phases of one cycle (engine.h).
#include "engine.h"

#include <algorithm>

#include "logging.h"
#include "mpi_checks.h"

namespace mlsl {

Engine::Engine(std::unique_ptr<Communicator> comm, std::unique_ptr<Communicator> control, Timeline* timeline,
               Stats* stats, EngineOptions options)
    : comm_(std::move(comm)),
      control_comm_(std::move(control)),
      rank_(comm_->rank()),
      size_(comm_->size()),
      timeline_(timeline),
      stats_(stats),
      options_(options),
      coordinator_(size_),
      joined_before_(size_, false) {
  auto g = std::make_unique<Group>();
  for (int r = 0; r < size_; ++r) g->ranks.push_back(r);
  g->index = rank_;
  g->comm = comm_.get();
  Equip(g.get());
  groups_.push_back(std::move(g));
}

Engine::~Engine() = default;

void Engine::Equip(Group* g) {
  // On one host the pacer's rate would read latency-bound small transfers as a slow network
  // and sleep between the tests that move shared-memory data (4 MiB took 5x MPI's time).
  SchedulerOptions o = options_.scheduler;
  o.one_host = OnOneMachine(g->comm->topology(), g->comm->size());  // the same on every rank
  g->scheduler = std::make_unique<Scheduler>(g->comm, timeline_, stats_, o);
}

void Engine::Submit(std::unique_ptr<Request> request) {
  if (closed_) {
    std::string what = request->op == OpType::kJoin ? "join" : "collective '" + ShownName(request->name) + "'";
    request->done(Status::WithCode(closed_code_, closed_reason_ + " (" + what + " was not run)"));
    return;
  }
  inbox_.push_back(std::move(request));
}

uint64_t Engine::UnitEvents() const {
  uint64_t n = 0;
  for (const auto& g : groups_) if (g->member()) n += g->scheduler->started() + g->scheduler->completed_prefix();
  return n;
}

bool Engine::AllIdle() const {
  for (const auto& g : groups_) if (g->member() && !g->scheduler->idle()) return false;
  return true;
}

bool Engine::Transferring() const {
  for (const auto& g : groups_) if (g->member() && g->scheduler->transferring()) return true;
  return false;
}

std::chrono::microseconds Engine::PollInterval() const {
  std::chrono::microseconds shortest = std::chrono::microseconds::max();
  for (const auto& g : groups_) {
    if (g->member() && !g->scheduler->idle()) shortest = std::min(shortest, g->scheduler->PollInterval());
  }
  return shortest == std::chrono::microseconds::max() ? std::chrono::microseconds(0) : shortest;
}

void Engine::Progress() {
  for (auto& g : groups_) if (g->member()) g->scheduler->Progress();
}

StepResult Engine::Step(Clock::time_point now) {
  now_ = now;
  StepResult result;
  if (!closed_) {
    if (phase_ == Phase::kIdle) BeginCycle();
    Advance(&result);
    // chunks in flight keep moving while an exchange travels
    if (!closed_ && phase_ != Phase::kIdle) Progress();
  }
  result.closed = closed_;
  result.in_cycle = !closed_ && phase_ != Phase::kIdle;
  return result;
}

void Engine::Advance(StepResult* result) {
  while (!closed_ && phase_ != Phase::kIdle) {
    bool done = false;
    Status s = phase_ == Phase::kControl ? control_op_->Test(&done) : gather_.Test(&done);
    if (!s.ok()) {
      if (phase_ == Phase::kControl) {
        Close("mlsl_tf: the background cycle failed: " + s.message(), StatusCode::kUnavailable);
      } else if (phase_ == Phase::kFailures) {
        Close("mlsl_tf: a transfer failed on some rank" + (failure_.empty() ? "" : " (" + failure_ + ")") +
              ", and gathering the failures failed too: " + s.message());
      } else {
        Close(std::string("mlsl_tf: ") + (phase_ == Phase::kStalls ? "the stall report" : "negotiation") +
              " failed: " + s.message());
      }
      return;
    }
    if (!done) return;
    switch (phase_) {
      case Phase::kControl:
        control_op_.reset();
        OnControl(result);
        break;
      case Phase::kFailures:
        phase_ = Phase::kIdle;
        CloseOnFailures();
        break;
      case Phase::kStalls:
        phase_ = Phase::kIdle;
        ReportStalls(message_.past_limit);
        if (!closed_) AfterStalls(result);
        break;
      case Phase::kNegotiate:
        phase_ = Phase::kIdle;
        OnNegotiated(result);
        break;
      case Phase::kIdle:
        break;
    }
  }
}

std::string Engine::GroupError(const Request& r) const {
  std::string what = std::string(OpTypeName(r.op)) + " '" + ShownName(r.name) + "'";
  if ((r.op == OpType::kAddGroup || r.op == OpType::kRemoveGroup) && r.group != 0) {
    return "mlsl_tf: " + what + " is collective over every rank; it cannot run in group " + std::to_string(r.group);
  }
  if (r.group < 0 || r.group >= int(groups_.size()) || groups_[r.group]->removed) {
    return "mlsl_tf: " + what + " names group " + std::to_string(r.group) +
           ", which does not exist (create it on every rank with mlsl_tf.Group(ranks) first)";
  }
  const Group& g = *groups_[r.group];
  if (!g.member()) {
    return "mlsl_tf: rank " + std::to_string(rank_) + " is not a member of group " + std::to_string(r.group) +
           " (ranks " + RankList(g.ranks) + "), so it cannot run " + what;
  }
  return "";
}

void Engine::Intake(std::unique_ptr<Request> r) {
  if (r->op == OpType::kJoin) {
    if (join_) {
      r->done(Status::InvalidArgument("mlsl_tf: join is already pending on rank " + std::to_string(rank_)));
      return;
    }
    join_ = std::move(r);
    return;
  }
  std::string group_error = GroupError(*r);
  if (!group_error.empty()) {
    r->done(Status::InvalidArgument(group_error));
    return;
  }
  // Names are per group: the same program runs in every group (e.g. a model-parallel layer).
  if (r->group != 0) {
    int generation = groups_[r->group]->generation;
    r->name += " (group " + std::to_string(r->group) + (generation ? "." + std::to_string(generation) : "") + ")";
  }
  if (pending_.count(r->name)) {
    r->done(Status::InvalidArgument("mlsl_tf: a collective named '" + ShownName(r->name) + "' is already pending on rank " +
                                    std::to_string(rank_) + "; concurrent collectives need distinct names"));
    return;
  }
  Local local;
  local.submitted = now_;
  local.meta = RequestMeta::From(*r);
  bool reduces = r->op == OpType::kAllreduce || r->op == OpType::kReducescatter;
  // Only float32 reductions are compressed, and never Adasum (an explicit wire is refused by ValidateLocally).
  if (!reduces || r->dtype != DataType::kFloat32 || (r->reduce_op == ReduceOp::kAdasum && r->wire < 0)) {
    local.meta.wire = r->dtype;
  } else if (r->wire < 0) {
    local.meta.wire = options_.default_wire;
  }
  if (!local.meta.compressed() || r->op != OpType::kAllreduce) local.meta.error_feedback = false;
  local.meta.local_error = ValidateLocally(*r, int(groups_[r->group]->ranks.size()));
  if (local.meta.local_error.empty() && r->op == OpType::kAddGroup) local.meta.local_error = ExistingGroup(r->ranks);
  auto cached = cached_ids_.find(r->name);
  if (cached != cached_ids_.end() && local.meta.local_error.empty() && coordinator_.meta(cached->second) == local.meta) {
    local.state = Local::kReady;
    local.id = cached->second;
  }
  local.request = std::move(r);
  std::string name = local.request->name;
  pending_.emplace(name, std::move(local));
}

void Engine::Finish(const std::string& name, const Status& s) {
  auto it = pending_.find(name);
  std::unique_ptr<Request> r = std::move(it->second.request);
  pending_.erase(it);
  r->done(s);
}

std::string Engine::ExistingGroup(const std::vector<int>& ranks) const {
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  for (size_t g = 0; g < groups_.size(); ++g) {
    if (groups_[g]->removed || groups_[g]->ranks != sorted) continue;
    return "a group of ranks [" + RankList(sorted) + "] already exists (process set id " + std::to_string(g) + ")";
  }
  return "";
}

void Engine::FinishJoin(int last_rank) {
  if (!join_) return;
  std::unique_ptr<Request> r = std::move(join_);
  void* out = nullptr;
  Status s = r->Output(0, Shape{}, &out);
  if (s.ok() && out) *static_cast<int32_t*>(out) = last_rank;
  r->done(s);
}

void Engine::Close(const std::string& reason, StatusCode code) {
  closed_ = true;
  closed_reason_ = reason;
  closed_code_ = code;
  phase_ = Phase::kIdle;
  for (auto& g : groups_) {
    if (g->member()) g->scheduler->FailAll(Status::WithCode(code, reason + " (the collective did not complete)"));
  }
  std::vector<std::unique_ptr<Request>> failed;
  for (auto& r : inbox_) failed.push_back(std::move(r));
  inbox_.clear();
  for (auto& [name, l] : pending_) failed.push_back(std::move(l.request));
  pending_.clear();
  if (join_) failed.push_back(std::move(join_));
  for (auto& r : failed) {
    std::string what = r->op == OpType::kJoin ? "join" : "collective '" + ShownName(r->name) + "'";
    r->done(Status::WithCode(code, reason + " (" + what + " did not complete)"));
  }
}

}  // namespace mlsl
