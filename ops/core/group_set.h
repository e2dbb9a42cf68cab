// GroupSet: the world and the process sets (groups) of this job by id, each member's communicator
// and Scheduler. Groups are added and removed collectively (agreed requests, the same cycle on
// every rank), so every rank holds the same list; a rank outside a group keeps only its member
// list. A removed group's communicator and scheduler live on until MPI holds none of their
// buffers. Group 0 is the world.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "communicator.h"
#include "request.h"
#include "scheduler.h"
#include "stats.h"
#include "timeline.h"

namespace mlsl {

class GroupSet {
 public:
  struct Group {
    std::vector<int> ranks;  // world ranks, sorted
    int index = -1;          // this rank's position in ranks; -1 when not a member
    bool removed = false;
    int generation = 0;      // how many removed groups had this id before (ids are reused, lowest first)
    std::unique_ptr<Communicator> own;  // null for the world and on non-members
    Communicator* comm = nullptr;
    std::unique_ptr<Scheduler> scheduler;
    bool member() const { return index >= 0 && !removed; }
  };

  // `world` (the job's communicator), `timeline` and `stats` must outlive the set.
  GroupSet(Communicator* world, Timeline* timeline, Stats* stats, SchedulerOptions options);

  int count() const { return int(groups_.size()); }  // ids in use, removed ones included
  const Group& operator[](int id) const { return *groups_[id]; }
  bool member(int id) const { return id >= 0 && id < count() && groups_[id]->member(); }
  Scheduler* scheduler(int id) { return groups_[id]->scheduler.get(); }

  // Why `r` cannot be announced (its group does not exist, or this rank is not in it); "" when fine.
  std::string Refusal(const Request& r) const;
  // An add_group's ranks that a live group (the world included) already has: why, else "".
  std::string Existing(const std::vector<int>& ranks) const;
  // Runs an agreed add_group: the lowest free id in *id (also when the split failed).
  // Blocking and collective over every rank (Communicator::Split).
  Status Add(const std::vector<int>& ranks, int32_t* id);
  // Runs an agreed remove_group: its scheduler's work fails; quiescent removed groups are freed.
  Status Remove(int32_t id);

  // Over this rank's groups:
  uint64_t UnitEvents() const;  // units started plus completed: it changes iff a transfer moved
  bool AllIdle() const;         // no transfer queued or in flight, no collective left to finish
  bool Transferring() const;    // a unit in flight
  std::chrono::microseconds PollInterval() const;  // the shortest any busy group allows; 0 when none
  void Progress(std::chrono::steady_clock::time_point now);
  void FailAll(const Status& s);
  // The first scheduler failure, as "rank R (group G): what", or "".
  std::string FirstFailure() const;
  // Units completed here, by group id (~0 for groups this rank is not in): the control message's.
  std::vector<uint64_t> UnitsDone() const;
  // Starts every member group's units up to its common completed prefix (`done`, by group id)
  // plus `inflight`; true when some started.
  bool StartUnits(const std::vector<uint64_t>& done, const std::vector<bool>& joined, int inflight,
                  std::chrono::steady_clock::time_point now);

 private:
  void Equip(Group* g);  // a member's scheduler

  Communicator* const world_;
  Timeline* const timeline_;
  Stats* const stats_;
  const SchedulerOptions options_;
  std::vector<std::unique_ptr<Group>> groups_;   // by id; [0] is the world
  std::vector<std::unique_ptr<Group>> removed_;  // until quiescent: MPI may still use their buffers
};

}  // namespace mlsl
