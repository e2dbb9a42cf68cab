// GroupSet (group_set.h).
#include "group_set.h"

#include <algorithm>

#include "mpi_checks.h"

namespace mlsl {

GroupSet::GroupSet(Communicator* world, Timeline* timeline, Stats* stats, SchedulerOptions options)
    : world_(world), timeline_(timeline), stats_(stats), options_(options) {
  auto g = std::make_unique<Group>();
  for (int r = 0; r < world->size(); ++r) g->ranks.push_back(r);
  g->index = world->rank();
  g->comm = world;
  Equip(g.get());
  groups_.push_back(std::move(g));
}

void GroupSet::Equip(Group* g) {
  // On one host the pacer's rate would read latency-bound small transfers as a slow network
  // and sleep between the tests that move shared-memory data (4 MiB took 5x MPI's time).
  SchedulerOptions o = options_;
  o.one_host = OnOneMachine(g->comm->topology(), g->comm->size());  // the same on every rank
  g->scheduler = std::make_unique<Scheduler>(g->comm, timeline_, stats_, o);
}

std::string GroupSet::Refusal(const Request& r) const {
  std::string what = std::string(OpTypeName(r.op)) + " '" + ShownName(r.name) + "'";
  if ((r.op == OpType::kAddGroup || r.op == OpType::kRemoveGroup) && r.group != 0) {
    return "mlsl_tf: " + what + " is collective over every rank; it cannot run in group " + std::to_string(r.group);
  }
  if (r.group < 0 || r.group >= count() || groups_[r.group]->removed) {
    return "mlsl_tf: " + what + " names group " + std::to_string(r.group) +
           ", which does not exist (create it on every rank with mlsl_tf.Group(ranks) first)";
  }
  const Group& g = *groups_[r.group];
  if (!g.member()) {
    return "mlsl_tf: rank " + std::to_string(world_->rank()) + " is not a member of group " +
           std::to_string(r.group) + " (ranks " + RankList(g.ranks) + "), so it cannot run " + what;
  }
  return "";
}

std::string GroupSet::Existing(const std::vector<int>& ranks) const {
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  for (int g = 0; g < count(); ++g) {
    if (groups_[g]->removed || groups_[g]->ranks != sorted) continue;
    return "a group of ranks [" + RankList(sorted) + "] already exists (process set id " + std::to_string(g) + ")";
  }
  return "";
}

Status GroupSet::Add(const std::vector<int>& ranks, int32_t* id) {
  auto g = std::make_unique<Group>();
  g->ranks = ranks;
  auto at = std::find(g->ranks.begin(), g->ranks.end(), world_->rank());
  Status status = world_->Split(g->ranks, &g->own);
  if (at != g->ranks.end() && status.ok()) {
    g->index = int(at - g->ranks.begin());
    g->comm = g->own.get();
    Equip(g.get());
  }
  // As Horovod: the lowest id no live group has. A reused id's collectives get names of their
  // own generation, so no name the removed group agreed on is taken for one of the new group.
  int32_t result = 1;
  while (result < count() && !groups_[result]->removed) ++result;
  if (result < count()) {
    g->generation = groups_[result]->generation + 1;
    groups_[result] = std::move(g);
  } else {
    groups_.push_back(std::move(g));
  }
  *id = result;
  return status;
}

Status GroupSet::Remove(int32_t id) {
  if (id <= 0 || id >= count() || groups_[id]->removed) {
    return Status::InvalidArgument("mlsl_tf: remove_group: group " + std::to_string(id) + " does not exist" +
                                   (id == 0 ? " (group 0, the world, cannot be removed)" : ""));
  }
  Group& g = *groups_[id];
  if (g.member()) {
    g.scheduler->FailAll(Status::Aborted("mlsl_tf: group " + std::to_string(id) +
                                         " was removed (the collective did not complete)"));
  }
  g.removed = true;
  // The communicator and scheduler stay alive while MPI may still hold their buffers; those of
  // removed groups that are quiescent are freed now (an MPI library has a few thousand
  // communicator contexts: add/remove in a loop ran out of them).
  auto keep = std::make_unique<Group>();
  keep->own = std::move(g.own);
  keep->scheduler = std::move(g.scheduler);
  removed_.push_back(std::move(keep));
  g.comm = nullptr;
  removed_.erase(std::remove_if(removed_.begin(), removed_.end(),
                                [](const std::unique_ptr<Group>& r) { return !r->scheduler || r->scheduler->quiescent(); }),
                 removed_.end());
  return Status::Ok();
}

uint64_t GroupSet::UnitEvents() const {
  uint64_t n = 0;
  for (const auto& g : groups_) if (g->member()) n += g->scheduler->started() + g->scheduler->completed_prefix();
  return n;
}

bool GroupSet::AllIdle() const {
  for (const auto& g : groups_) if (g->member() && !g->scheduler->idle()) return false;
  return true;
}

bool GroupSet::Transferring() const {
  for (const auto& g : groups_) if (g->member() && g->scheduler->transferring()) return true;
  return false;
}

std::chrono::microseconds GroupSet::PollInterval() const {
  std::chrono::microseconds shortest = std::chrono::microseconds::max();
  for (const auto& g : groups_) {
    if (g->member() && !g->scheduler->idle()) shortest = std::min(shortest, g->scheduler->PollInterval());
  }
  return shortest == std::chrono::microseconds::max() ? std::chrono::microseconds(0) : shortest;
}

void GroupSet::Progress(std::chrono::steady_clock::time_point now) {
  for (auto& g : groups_) if (g->member()) g->scheduler->Progress(now);
}

void GroupSet::FailAll(const Status& s) {
  for (auto& g : groups_) if (g->member()) g->scheduler->FailAll(s);
}

std::string GroupSet::FirstFailure() const {
  for (int g = 0; g < count(); ++g) {
    const Group& group = *groups_[g];
    if (!group.member() || group.scheduler->failure().ok()) continue;
    return "rank " + std::to_string(world_->rank()) + (g ? " (group " + std::to_string(g) + ")" : std::string()) +
           ": " + group.scheduler->failure().message();
  }
  return "";
}

std::vector<uint64_t> GroupSet::UnitsDone() const {
  std::vector<uint64_t> done(groups_.size(), ~uint64_t(0));
  for (int g = 0; g < count(); ++g) if (groups_[g]->member()) done[g] = groups_[g]->scheduler->completed_prefix();
  return done;
}

bool GroupSet::StartUnits(const std::vector<uint64_t>& done, const std::vector<bool>& joined, int inflight,
                          std::chrono::steady_clock::time_point now) {
  // Units completed on every member are common knowledge, so every member starts the same ones.
  bool started = false;
  for (int g = 0; g < count(); ++g) {
    Group& group = *groups_[g];
    if (!group.member()) continue;
    const uint64_t common = size_t(g) < done.size() ? done[g] : 0;
    std::vector<bool> group_joined(group.ranks.size());
    for (size_t i = 0; i < group.ranks.size(); ++i) group_joined[i] = joined[group.ranks[i]];
    const uint64_t before = group.scheduler->started();
    group.scheduler->StartUpTo(now, common + uint64_t(inflight), group_joined, common);
    group.scheduler->Progress(now);
    if (group.scheduler->started() != before) started = true;
  }
  return started;
}

}  // namespace mlsl
