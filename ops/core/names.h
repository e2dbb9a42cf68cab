// NameTable: the ranks' agreement on collective names -- the replicated Coordinator that gives
// agreed names ids, this rank's cache of its names' ids, which ids belong to groups this rank is
// not in (they never wait for it), and forgetting the least recently used names, every rank in
// the same cycle, holding back new requests for a few cycles when the ranks are never quiet
// together.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "control_message.h"
#include "coordinator.h"
#include "group_set.h"
#include "pending.h"
#include "stats.h"
#include "string_gather.h"

namespace mlsl {

class NameTable {
 public:
  NameTable(int size, size_t capacity);

  Coordinator& coordinator() { return coordinator_; }
  const Coordinator& coordinator() const { return coordinator_; }
  // The id `name` was agreed under, while `meta` still matches what was agreed; -1 otherwise.
  int32_t CachedId(const std::string& name, const RequestMeta& meta) const;
  bool Foreign(int32_t id) const { return id / 64 < int32_t(foreign_.size()) && (foreign_[id / 64] >> (id % 64)) & 1; }
  const std::vector<uint64_t>& foreign() const { return foreign_; }

  // This rank's announcements (its kToAnnounce requests, now kAnnounced) as one payload.
  std::string Announcements(PendingTable* pending) const;
  // Every rank's gathered announcements into decisions: agreed ids are appended to *agreed and
  // make this rank's requests ready; errors finish them. Returns why it could not ("" when fine).
  std::string Decide(const StringGather& gathered, const std::vector<bool>& joined, const GroupSet& groups,
                     PendingTable* pending, std::vector<int32_t>* agreed);
  // After a cycle: forgets names when there are too many and nothing anywhere refers to an id,
  // or starts draining (from the combined control message: the same on every rank).
  void ForgetOrDrain(const ControlMessage& m, uint64_t cycle, Stats* stats);
  // While draining, cycles take no new requests.
  bool draining() const { return drain_; }

 private:
  void Apply(const Decision& d, const GroupSet& groups, PendingTable* pending, std::vector<int32_t>* agreed);
  void Forget(Stats* stats);

  Coordinator coordinator_;
  std::unordered_map<std::string, int32_t> cached_ids_;
  std::vector<uint64_t> foreign_;  // bit per id: it belongs to a group this rank is not in
  const size_t capacity_;
  bool drain_ = false;
  uint64_t next_drain_ = 0, drain_until_ = 0;
};

}  // namespace mlsl
