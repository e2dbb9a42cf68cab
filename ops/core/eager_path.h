// EagerPath: the small-tensor path -- small ready allreduces of the world group ride in the
// control message (the wire format is eager.h) and finish in its one round. It decides which
// pending requests may ride, writes this rank's ready ones into the message's region, and
// finishes those every rank contributed. The region's size is agreed a cycle ahead: the
// largest any rank asked for.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "coordinator.h"
#include "eager.h"
#include "failure_note.h"
#include "pending.h"
#include "stats.h"
#include "timeline.h"

namespace mlsl {

class EagerPath {
 public:
  using Clock = std::chrono::steady_clock;
  // `bytes`: the most one cycle carries (MLSL_TF_EAGER_BYTES; 0: none). timeline and stats must
  // outlive the path.
  EagerPath(int64_t bytes, int rank, int size, Timeline* timeline, Stats* stats);

  // Fills *region (this cycle's agreed size) with this rank's ready eager requests and returns
  // the region it wants next cycle (0: none). An output it cannot allocate is noted in *failure
  // (it fails on every rank) and that request stays out.
  int64_t Fill(const PendingTable& pending, FailureNote* failure, std::vector<uint64_t>* region) const;
  // The size every rank agreed for the next cycle's region (the combined message's).
  void Agree(int64_t words) { words_ = words; }
  // Finishes the requests of the combined region's valid entries, their ids in order into *ids;
  // returns why the engine must close ("" when fine): an entry's id none of this rank's ready
  // requests has (the ranks' ids disagree).
  std::string Finish(const std::vector<uint64_t>& region, const Coordinator& names, PendingTable* pending,
                     Clock::time_point cycle_started, Clock::time_point now, std::vector<int32_t>* ids) const;

 private:
  bool Rides(const PendingRequest& p) const;
  bool AllocateOutputs(const PendingRequest& p, FailureNote* failure) const;
  Status FinishOne(const EagerEntry& e, const RequestMeta& meta, PendingRequest* p, Clock::time_point cycle_started,
                 Clock::time_point now) const;

  const int64_t bytes_;
  const int rank_, size_;
  Timeline* const timeline_;
  Stats* const stats_;
  int64_t words_ = 0;  // this cycle's region (agreed in the previous cycle)
};

}  // namespace mlsl
