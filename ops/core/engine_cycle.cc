// Engine: one cycle's steps -- this rank's control message, the combined one read (shutdown,
// stalls, joins), and the agreed collectives queued and started (engine.h).
#include <algorithm>

#include "engine.h"

namespace mlsl {
namespace {

int Words(int64_t bits) { return int((bits + 63) / 64); }

}  // namespace

void Engine::BeginCycle() {
  events_before_ = UnitEvents();
  cycle_progress_ = false;
  cycle_stopping_ = stopping_;
  if (!drain_) {  // draining: new requests wait a few cycles
    std::deque<std::unique_ptr<Request>> incoming;
    incoming.swap(inbox_);
    cycle_progress_ = !incoming.empty();
    for (auto& r : incoming) Intake(std::move(r));
  }
  ControlMessage& m = message_;
  m.announces = false;
  m.busy = !AllIdle();
  m.waits = !pending_.empty() || join_;
  m.wanted_eager = FillEager(&m.eager);  // first: it notes an output this rank cannot allocate
  NoteFailure();
  m.failed = !failure_.empty();
  m.stalled = m.past_limit = false;
  StallFlags(&m.stalled, &m.past_limit);
  m.joined.assign(size_, false);
  m.shut_down.assign(size_, false);
  if (join_) m.joined[rank_] = true;  // a joined rank is ready for everything
  if (cycle_stopping_) m.shut_down[rank_] = true;
  cycle_ids_ = coordinator_.num_ids();
  m.ready.assign(size_t(Words(cycle_ids_)), join_ ? ~uint64_t(0) : 0);
  // Collectives of groups this rank is not in never wait for it.
  if (!join_) for (size_t w = 0; w < foreign_.size() && w < m.ready.size(); ++w) m.ready[w] |= foreign_[w];
  for (auto& [name, l] : pending_) {
    if (l.state == Local::kToAnnounce) m.announces = true;
    if (l.state == Local::kReady && !join_) m.SetReady(l.id);
  }
  m.units_done.assign(groups_.size(), ~uint64_t(0));
  for (size_t g = 0; g < groups_.size(); ++g) {
    if (groups_[g]->member()) m.units_done[g] = groups_[g]->scheduler->completed_prefix();
  }
  m.fingerprint = coordinator_.fingerprint();
  m.Encode(&words_);
  cycle_started_ = now_;
  Communicator* control = control_comm_ ? control_comm_.get() : comm_.get();
  control_op_ = control->AllreduceWords(words_.data(), int64_t(words_.size()), &ControlMessage::Combine);
  phase_ = Phase::kControl;
}

void Engine::OnControl(StepResult* result) {
  phase_ = Phase::kIdle;
  ControlMessage& m = message_;
  m.Decode(words_.data(), int64_t(words_.size()), size_);
  if (!m.agrees) {
    // Ids (ready bits, eager entries) would name different collectives on different ranks.
    Close("mlsl_tf: the ranks no longer agree on the ids of collective names (their caches of agreed names "
          "differ; is MLSL_TF_CACHE_CAPACITY the same on every rank?), so no collective can be paired safely");
    return;
  }
  if (m.failed) {  // before the shutdowns: every rank learns what failed
    StartFailureReport();
    phase_ = Phase::kFailures;
    return;
  }
  std::vector<int> gone;
  for (int r = 0; r < size_; ++r) if (r != rank_ && m.shut_down[r]) gone.push_back(r);
  if (!gone.empty()) {
    Close(std::string("mlsl_tf: rank") + (gone.size() > 1 ? "s " : " ") + RankList(gone) +
          " shut down, so collectives can no longer complete", StatusCode::kUnavailable);
    return;
  }
  if (cycle_stopping_) {
    Close("mlsl_tf has been shut down on rank " + std::to_string(rank_));
    return;
  }
  if (m.stalled || m.past_limit) {
    StartStallReport();
    phase_ = Phase::kStalls;
    return;
  }
  AfterStalls(result);
}

void Engine::AfterStalls(StepResult* result) {
  int newest = -1;
  joined_ = message_.joined;
  for (int r = 0; r < size_; ++r) if (joined_[r] && !joined_before_[r]) newest = r;
  if (newest >= 0) {
    last_joined_ = newest;
    cycle_progress_ = true;
  }
  joined_before_ = joined_;
  agreed_.clear();
  if (message_.announces) {
    Announce();
    phase_ = Phase::kNegotiate;
    return;
  }
  Dispatch(result);
}

void Engine::OnNegotiated(StepResult* result) {
  if (!Decide()) return;
  stats_->NamesKnown(coordinator_.num_ids());
  cycle_progress_ = true;
  Dispatch(result);
}

void Engine::Dispatch(StepResult* result) {
  const ControlMessage& m = message_;
  const bool all_joined = std::all_of(joined_.begin(), joined_.end(), [](bool j) { return j; });
  if (!all_joined) {
    for (int32_t id = 0; id < cycle_ids_; ++id) if (m.Ready(id) && !Foreign(id)) agreed_.push_back(id);
  }
  std::sort(agreed_.begin(), agreed_.end());
  ++cycle_;
  // Every rank has the same valid entries: those every rank contributed, reduced.
  std::vector<int32_t> eager;
  if (!FinishEager(m.eager, &eager)) return;
  eager_words_ = m.wanted_eager;
  if (!eager.empty()) cycle_progress_ = true;
  for (int32_t id : agreed_) {
    coordinator_.Touch(id, cycle_);
    if (!std::binary_search(eager.begin(), eager.end(), id)) Queue(id);
  }
  StartUnits(result);
  ForgetOrDrain();
  // Join completes in the same cycle everywhere: all joined, nothing in flight anywhere and
  // nothing new -- all three facts come from the control message, so every rank sees them.
  if (all_joined && !m.announces && !m.busy) {
    FinishJoin(last_joined_);
    std::fill(joined_before_.begin(), joined_before_.end(), false);
    cycle_progress_ = true;
  }
  result->cycle_done = true;
  result->progress = cycle_progress_ || UnitEvents() != events_before_;
}

void Engine::Queue(int32_t id) {
  const RequestMeta& meta = coordinator_.meta(id);
  auto it = pending_.find(meta.name);
  Request* mine = nullptr;
  Clock::time_point submitted = now_;
  if (it != pending_.end() && it->second.id == id && it->second.state == Local::kReady) {
    it->second.state = Local::kScheduled;
    mine = it->second.request.get();
    submitted = it->second.submitted;
  }
  if (meta.op == OpType::kAddGroup || meta.op == OpType::kRemoveGroup) {
    ChangeGroups(meta, mine);
    return;
  }
  if (meta.group >= int(groups_.size()) || !groups_[meta.group]->member()) return;
  std::string name = meta.name;
  groups_[meta.group]->scheduler->Add(id, meta, mine, [this, name](const Status& st) { Finish(name, st); },
                                      submitted);
  if (mine) stats_->Request();
}

void Engine::StartUnits(StepResult* result) {
  // Units completed on every member are common knowledge, so every member starts the same ones.
  for (size_t g = 0; g < groups_.size(); ++g) {
    Group& group = *groups_[g];
    if (!group.member()) continue;
    const uint64_t done = g < message_.units_done.size() ? message_.units_done[g] : 0;
    std::vector<bool> group_joined(group.ranks.size());
    for (size_t i = 0; i < group.ranks.size(); ++i) group_joined[i] = joined_[group.ranks[i]];
    const uint64_t before = group.scheduler->started();
    group.scheduler->StartUpTo(done + uint64_t(options_.scheduler.inflight), group_joined, done);
    group.scheduler->Progress();
    if (group.scheduler->started() != before) result->started_units = true;
  }
}

void Engine::ForgetOrDrain() {
  // Names are forgotten only when nothing anywhere refers to an id: no request waits or runs on
  // any rank and nothing was announced -- facts of the control message, so every rank forgets
  // the same names in the same cycle and the ids stay identical.
  // A program that keeps making names is rarely quiet between two of its requests, so when
  // there are too many names every rank holds back new requests for up to 4 cycles (at most
  // every 16 cycles) to let the requests already pending finish.
  const ControlMessage& m = message_;
  const bool too_many = size_t(coordinator_.num_ids()) > options_.cache_capacity;
  if (too_many && !m.busy && !m.waits && !m.announces) {
    ForgetNames();
    drain_ = false;
  } else if (too_many && cycle_ >= next_drain_) {
    drain_ = true;  // for a few cycles: ranks finish the same collective a cycle or two apart
    next_drain_ = cycle_ + 16;
    drain_until_ = cycle_ + 4;
  } else if (cycle_ >= drain_until_) {
    drain_ = false;
  }
}

}  // namespace mlsl
