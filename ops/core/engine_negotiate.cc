// Engine: names, ids and groups -- the announcements gathered and decided by the replicated
// Coordinator, least recently used names forgotten, and agreed group changes (engine.h).
#include <algorithm>

#include "engine.h"

namespace mlsl {
namespace {

int Words(int64_t bits) { return int((bits + 63) / 64); }
void SetBit(std::vector<uint64_t>& w, int64_t bit) { w[bit / 64] |= uint64_t(1) << (bit % 64); }
void ClearBit(std::vector<uint64_t>& w, int64_t bit) { w[bit / 64] &= ~(uint64_t(1) << (bit % 64)); }

}  // namespace

void Engine::Announce() {
  std::vector<RequestMeta> mine;
  for (auto& [name, l] : pending_) {
    if (l.state == Local::kToAnnounce) {
      mine.push_back(l.meta);
      l.state = Local::kAnnounced;
    }
  }
  std::string payload;
  SerializeMetas(mine, &payload);
  gather_.Start(comm_.get(), std::move(payload));
}

bool Engine::Decide() {
  const std::vector<int64_t>& sizes = gather_.sizes();
  const std::string& all = gather_.all();
  int64_t offset = 0;
  for (int r = 0; r < size_; ++r) {
    std::vector<RequestMeta> metas;
    if (!ParseMetas(all.data() + offset, sizes[r], &metas)) {
      Close("mlsl_tf: internal error: could not parse the announcements of rank " + std::to_string(r));
      return false;
    }
    offset += sizes[r];
    for (RequestMeta& m : metas) coordinator_.Announce(r, std::move(m));
  }
  for (const Decision& d : coordinator_.Resolve(joined_)) ApplyDecision(d);
  return true;
}

void Engine::ApplyDecision(const Decision& d) {
  auto it = pending_.find(d.name);
  switch (d.kind) {
    case Decision::kInvalidate:
      cached_ids_.erase(d.name);
      if (it != pending_.end() && it->second.state == Local::kReady) {
        it->second.state = Local::kToAnnounce;
        it->second.id = -1;
      }
      break;
    case Decision::kError:
      cached_ids_.erase(d.name);
      // As Horovod: an invalid input is InvalidArgument (on every rank); submissions that
      // disagree between ranks are FailedPrecondition
      if (it != pending_.end() && it->second.state == Local::kAnnounced) {
        Finish(d.name, d.invalid_input ? Status::InvalidArgument(d.error) : Status::FailedPrecondition(d.error));
      }
      break;
    case Decision::kAgreed: {
      const RequestMeta& meta = coordinator_.meta(d.id);
      if (int32_t(foreign_.size()) < Words(d.id + 1)) foreign_.resize(Words(d.id + 1), 0);
      bool foreign = meta.group > 0 && meta.group < int(groups_.size()) && !groups_[meta.group]->member();
      foreign ? SetBit(foreign_, d.id) : ClearBit(foreign_, d.id);
      cached_ids_[d.name] = d.id;
      if (it != pending_.end() && it->second.state == Local::kAnnounced) {
        it->second.state = Local::kReady;
        it->second.id = d.id;
      }
      agreed_.push_back(d.id);
      break;
    }
  }
}

void Engine::ForgetNames() {
  const std::vector<int32_t> remap = coordinator_.Retire(options_.cache_capacity / 2);
  std::unordered_map<std::string, int32_t> cached;
  for (const auto& [name, id] : cached_ids_) {
    if (id < int32_t(remap.size()) && remap[id] >= 0) cached[name] = remap[id];
  }
  cached_ids_.swap(cached);
  std::vector<uint64_t> foreign(Words(coordinator_.num_ids()), 0);
  for (int32_t old = 0; old < int32_t(remap.size()); ++old) {
    if (remap[old] >= 0 && Foreign(old)) SetBit(foreign, remap[old]);
  }
  foreign_.swap(foreign);
  stats_->NamesForgotten(int64_t(std::count(remap.begin(), remap.end(), -1)));
  stats_->NamesKnown(coordinator_.num_ids());
}

void Engine::ChangeGroups(const RequestMeta& meta, Request* mine) {
  int32_t result = 0;
  Status status = meta.op == OpType::kAddGroup ? AddGroup(meta, &result) : RemoveGroup(meta.root);
  if (status.ok() && meta.op == OpType::kRemoveGroup) result = meta.root;
  if (!mine) return;
  void* out = nullptr;
  if (status.ok()) status = mine->Output(0, Shape{}, &out);
  if (status.ok() && out) *static_cast<int32_t*>(out) = result;
  Finish(meta.name, status);
}

Status Engine::AddGroup(const RequestMeta& meta, int32_t* id) {
  auto g = std::make_unique<Group>();
  g->ranks.assign(meta.ranks.begin(), meta.ranks.end());
  auto at = std::find(g->ranks.begin(), g->ranks.end(), rank_);
  // Blocking and collective over every rank (communicator.h): the same cycle everywhere.
  Status status = comm_->Split(g->ranks, &g->own);
  if (at != g->ranks.end() && status.ok()) {
    g->index = int(at - g->ranks.begin());
    g->comm = g->own.get();
    Equip(g.get());
  }
  // As Horovod: the lowest id no live group has. A reused id's collectives get names of their
  // own generation, so no name the removed group agreed on is taken for one of the new group.
  int32_t result = 1;
  while (result < int32_t(groups_.size()) && !groups_[result]->removed) ++result;
  coordinator_.SetGroup(result, g->ranks);
  if (result < int32_t(groups_.size())) {
    g->generation = groups_[result]->generation + 1;
    groups_[result] = std::move(g);
  } else {
    groups_.push_back(std::move(g));
  }
  *id = result;
  return status;
}

Status Engine::RemoveGroup(int32_t id) {
  if (id <= 0 || id >= int32_t(groups_.size()) || groups_[id]->removed) {
    return Status::InvalidArgument("mlsl_tf: remove_group: group " + std::to_string(id) + " does not exist" +
                                   (id == 0 ? " (group 0, the world, cannot be removed)" : ""));
  }
  Group& g = *groups_[id];
  if (g.member()) {
    g.scheduler->FailAll(Status::Aborted("mlsl_tf: group " + std::to_string(id) +
                                         " was removed (the collective did not complete)"));
  }
  // This rank's collectives on the group that were not agreed yet (a peer never submitted its
  // part) fail too: the set that would run them is gone.
  std::vector<std::string> orphaned;
  for (const auto& [name, l] : pending_) {
    if (l.request && l.request->group == id && l.state != Local::kScheduled) orphaned.push_back(name);
  }
  for (const std::string& name : orphaned) {
    Finish(name, Status::Aborted("mlsl_tf: collective '" + ShownName(name) + "' on process set " +
                                 std::to_string(id) + " did not run: the set was removed before every member "
                                 "submitted it"));
  }
  g.removed = true;
  // The communicator and scheduler stay alive while MPI may still hold their buffers; those of
  // removed groups that are quiescent are freed now (an MPI library has a few thousand
  // communicator contexts: add/remove in a loop ran out of them).
  auto keep = std::make_unique<Group>();
  keep->own = std::move(g.own);
  keep->scheduler = std::move(g.scheduler);
  removed_groups_.push_back(std::move(keep));
  g.comm = nullptr;
  removed_groups_.erase(std::remove_if(removed_groups_.begin(), removed_groups_.end(),
                                       [](const std::unique_ptr<Group>& r) {
                                         return !r->scheduler || r->scheduler->quiescent();
                                       }),
                        removed_groups_.end());
  return Status::Ok();
}

}  // namespace mlsl
