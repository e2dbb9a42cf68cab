// Engine: one cycle's steps -- this rank's control message, the combined one read (shutdown,
// failures, stalls, joins), the negotiation, and the agreed collectives queued and started
// (engine.h).
#include <algorithm>

#include "engine.h"

namespace mlsl {
namespace {

int Words(int64_t bits) { return int((bits + 63) / 64); }

}  // namespace

void Engine::BeginCycle() {
  round_.events_before = groups_.UnitEvents();
  round_.progress = false;
  round_.stopping = stopping_;
  if (!names_.draining()) {  // draining: new requests wait a few cycles
    std::deque<std::unique_ptr<Request>> incoming = pending_.TakeInbox();
    round_.progress = !incoming.empty();
    for (auto& r : incoming) Intake(std::move(r));
  }
  FillMessage();
  round_.message.Encode(&round_.words);
  round_.started = now_;
  round_.control_op =
      control()->AllreduceWords(round_.words.data(), int64_t(round_.words.size()), &ControlMessage::Combine);
  round_.phase = Phase::kControl;
}

void Engine::FillMessage() {
  ControlMessage& m = round_.message;
  const bool joining = pending_.joining();
  m.announces = false;
  m.busy = !groups_.AllIdle();
  m.waits = !pending_.empty() || joining;
  m.wanted_eager = eager_.Fill(pending_, &failure_, &m.eager);  // first: it notes an output this rank cannot allocate
  failure_.Note(groups_);
  m.failed = !failure_.empty();
  m.stalled = m.past_limit = false;
  stalls_.Flags(pending_, now_, &m.stalled, &m.past_limit);
  m.joined.assign(size_t(size()), false);
  m.shut_down.assign(size_t(size()), false);
  if (joining) m.joined[rank()] = true;  // a joined rank is ready for everything
  if (round_.stopping) m.shut_down[rank()] = true;
  round_.ids = names_.coordinator().num_ids();
  m.ready.assign(size_t(Words(round_.ids)), joining ? ~uint64_t(0) : 0);
  // Collectives of groups this rank is not in never wait for it.
  const std::vector<uint64_t>& foreign = names_.foreign();
  if (!joining) for (size_t w = 0; w < foreign.size() && w < m.ready.size(); ++w) m.ready[w] |= foreign[w];
  for (const auto& [name, p] : pending_.table()) {
    if (p.state == PendingRequest::kToAnnounce) m.announces = true;
    if (p.state == PendingRequest::kReady && !joining) m.SetReady(p.id);
  }
  m.units_done = groups_.UnitsDone();
  m.fingerprint = names_.coordinator().fingerprint();
  round_.tuner.Fill(&m.tune);
}

void Engine::OnControl(StepResult* result) {
  ControlMessage& m = round_.message;
  m.Decode(round_.words.data(), int64_t(round_.words.size()), size());
  if (!m.agrees) {
    // Ids (ready bits, eager entries) would name different collectives on different ranks.
    Close("mlsl_tf: the ranks no longer agree on the ids of collective names (their caches of agreed names "
          "differ; is MLSL_TF_CACHE_CAPACITY the same on every rank?), so no collective can be paired safely");
    return;
  }
  if (m.failed) {  // before the shutdowns: every rank learns what failed (on the control
                   // communicator: the data communicators may hold the broken transfers)
    round_.gather.Start(control(), failure_.line());
    round_.phase = Phase::kFailures;
    return;
  }
  std::vector<int> gone;
  for (int r = 0; r < size(); ++r) if (r != rank() && m.shut_down[r]) gone.push_back(r);
  if (!gone.empty()) {
    Close(std::string("mlsl_tf: rank") + (gone.size() > 1 ? "s " : " ") + RankList(gone) +
          " shut down, so collectives can no longer complete", StatusCode::kUnavailable);
    return;
  }
  if (round_.stopping) {
    Close("mlsl_tf has been shut down on rank " + std::to_string(rank()));
    return;
  }
  if (m.stalled || m.past_limit) {
    round_.gather.Start(comm_.get(), stalls_.WaitingList(pending_, now_));
    round_.phase = Phase::kStalls;
    return;
  }
  AfterStalls(result);
}

void Engine::AfterStalls(StepResult* result) {
  int newest = -1;
  round_.joined = round_.message.joined;
  for (int r = 0; r < size(); ++r) if (round_.joined[r] && !round_.joined_before[r]) newest = r;
  if (newest >= 0) {
    round_.last_joined = newest;
    round_.progress = true;
  }
  round_.joined_before = round_.joined;
  round_.agreed.clear();
  if (round_.message.announces) {
    round_.gather.Start(comm_.get(), names_.Announcements(&pending_));
    round_.phase = Phase::kNegotiate;
    return;
  }
  Dispatch(result);
}

void Engine::OnNegotiated(StepResult* result) {
  std::string error = names_.Decide(round_.gather, round_.joined, groups_, &pending_, &round_.agreed);
  if (!error.empty()) {
    Close(error);
    return;
  }
  stats_->NamesKnown(names_.coordinator().num_ids());
  round_.progress = true;
  Dispatch(result);
}

void Engine::Dispatch(StepResult* result) {
  const ControlMessage& m = round_.message;
  const bool all_joined = std::all_of(round_.joined.begin(), round_.joined.end(), [](bool j) { return j; });
  if (!all_joined) {
    for (int32_t id = 0; id < round_.ids; ++id) if (m.Ready(id) && !names_.Foreign(id)) round_.agreed.push_back(id);
  }
  std::sort(round_.agreed.begin(), round_.agreed.end());
  const uint64_t cycle = ++round_.count;
  // Before any unit starts this cycle, on every rank alike.
  if (round_.tuner.Apply(m.tune, cycle)) stats_->Autotune(round_.tuner.Json());
  // Every rank has the same valid entries: those every rank contributed, reduced.
  std::vector<int32_t> eager;
  std::string error = eager_.Finish(m.eager, names_.coordinator(), &pending_, round_.started, now_, &eager);
  if (!error.empty()) {
    Close(error);
    return;
  }
  eager_.Agree(m.wanted_eager);
  if (!eager.empty()) round_.progress = true;
  for (int32_t id : round_.agreed) {
    names_.coordinator().Touch(id, cycle);
    if (!std::binary_search(eager.begin(), eager.end(), id)) Queue(id);
  }
  if (groups_.StartUnits(m.units_done, round_.joined, inflight(), now_)) result->started_units = true;
  names_.ForgetOrDrain(m, cycle, stats_);
  // Join completes in the same cycle everywhere: all joined, nothing in flight anywhere and
  // nothing new -- all three facts come from the control message, so every rank sees them.
  if (all_joined && !m.announces && !m.busy) {
    pending_.FinishJoin(round_.last_joined);
    std::fill(round_.joined_before.begin(), round_.joined_before.end(), false);
    round_.progress = true;
  }
  result->cycle_done = true;
  result->progress = round_.progress || groups_.UnitEvents() != round_.events_before;
}

void Engine::Queue(int32_t id) {
  const RequestMeta& meta = names_.coordinator().meta(id);
  PendingRequest* p = pending_.Find(meta.name);
  Request* mine = nullptr;
  Clock::time_point submitted = now_;
  if (p && p->id == id && p->state == PendingRequest::kReady) {
    p->state = PendingRequest::kScheduled;
    mine = p->request.get();
    submitted = p->submitted;
  }
  if (meta.op == OpType::kAddGroup || meta.op == OpType::kRemoveGroup) {
    ChangeGroups(meta, mine);
    return;
  }
  if (!groups_.member(meta.group)) return;
  std::string name = meta.name;
  groups_.scheduler(meta.group)->Add(id, meta, mine, [this, name](const Status& st) { pending_.Finish(name, st); },
                                     submitted, now_);
  if (mine) stats_->Request();
}

void Engine::ChangeGroups(const RequestMeta& meta, Request* mine) {
  int32_t result = 0;
  Status status;
  if (meta.op == OpType::kAddGroup) {
    status = groups_.Add(std::vector<int>(meta.ranks.begin(), meta.ranks.end()), &result);
    names_.coordinator().SetGroup(result, groups_[result].ranks);
  } else {
    status = groups_.Remove(meta.root);
    if (status.ok()) result = meta.root;
    // This rank's collectives on the group that were not agreed yet (a peer never submitted its
    // part) fail too: the set that would run them is gone.
    std::vector<std::string> orphaned;
    for (const auto& [name, p] : pending_.table()) {
      if (status.ok() && p.request && p.request->group == meta.root && p.state != PendingRequest::kScheduled) {
        orphaned.push_back(name);
      }
    }
    for (const std::string& name : orphaned) {
      pending_.Finish(name, Status::Aborted("mlsl_tf: collective '" + ShownName(name) + "' on process set " +
                                            std::to_string(meta.root) + " did not run: the set was removed before "
                                            "every member submitted it"));
    }
  }
  if (!mine) return;
  void* out = nullptr;
  if (status.ok()) status = mine->Output(0, Shape{}, &out);
  if (status.ok() && out) *static_cast<int32_t*>(out) = result;
  pending_.Finish(meta.name, status);
}

}  // namespace mlsl
