// SlotSet: a scheduler's in-flight slots, each with a communicator of its own over the same
// ranks (made on first use, collectively: every rank starts the same units, so every rank makes
// the same slot at the same point) and the scratch buffers of its compressed units. Chunks in
// different slots never queue behind each other inside MPI, and a two-step (compressed) chunk's
// steps stay in order.
#pragma once

#include <memory>
#include <vector>

#include "communicator.h"
#include "memory.h"
#include "wire.h"

namespace mlsl {

class SlotSet {
 public:
  SlotSet(Communicator* comm, int count) : comm_(comm), count_(count) {}
  // Slot i's communicator; null when making it failed (error() says why).
  Communicator* Get(int i);
  WireScratch* scratch(int i) { return &scratch_[i]; }
  const Status& error() const { return error_; }
  // The ring's in-place scratch (p2p_algorithms.h), one segment per unit in flight.
  const std::shared_ptr<BufferPool>& ring_pool() const { return ring_pool_; }

 private:
  Communicator* const comm_;
  const int count_;
  // Sized once, before any unit starts; the units point into it.
  std::vector<WireScratch> scratch_;
  std::vector<std::unique_ptr<Communicator>> slots_;
  Status error_;
  std::shared_ptr<BufferPool> ring_pool_ = std::make_shared<BufferPool>(4, size_t(1) << 30);
};

}  // namespace mlsl
