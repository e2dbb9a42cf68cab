// Scheduler: the agreed queue and the transfers in flight.
//
// Agreed collectives wait in one queue ordered by (priority, id) -- or by agreement order
// under the fifo policy -- which is identical on every rank because it is built only from
// agreed facts. Allreduces are cut into chunks of at most chunk_bytes; small allreduces of the
// same kind are first fused into one buffer of at most fusion_threshold bytes, which takes
// the most urgent priority of its parts. Every other collective (broadcast, allgather,
// alltoall, reducescatter, Adasum, barrier) is an Algorithm cut in pieces (algorithm.h). Every
// started chunk or piece is one "unit" with a sequence number; nothing runs whole and nothing
// blocks the thread that calls the scheduler. The runtime lets the scheduler start units
// only up to a limit that is common knowledge (units completed on every rank + inflight),
// and the choice of the next unit is re-made from the queue each time -- so a newly agreed
// urgent tensor overtakes the remaining chunks or pieces of a big one, and all ranks start the
// same units in the same order. Every part finishes exactly once, and only once its units
// have completed on every rank (the common prefix of the control message), so that a failure on
// one rank fails it on every rank.
//
// A unit that fails here (its transfer's Test, or its start, returns an error) is this rank's
// alone: the peers go on waiting for its messages. So is an output or buffer this rank cannot
// allocate (Request::Output fails, or std::bad_alloc while starting units): the peers would
// return success for a collective that fails here. The scheduler then keeps the unit -- its
// transfers and the work whose buffers they use -- and starts nothing more; the work does not
// finish. failure() says what failed, and the owner (the Engine) closes every rank, which fails
// the work through FailAll; nothing a transfer may still write is released before the
// scheduler is destroyed.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "algorithm.h"
#include "communicator.h"
#include "memory.h"
#include "meta.h"
#include "operations.h"
#include "pacer.h"
#include "request.h"
#include "residuals.h"
#include "slot_set.h"
#include "stats.h"
#include "timeline.h"
#include "unit_ledger.h"
#include "wire.h"

namespace mlsl {


// Filled from MLSL_TF_CHUNK_BYTES, MLSL_TF_INFLIGHT, MLSL_TF_FUSION_THRESHOLD, MLSL_TF_PRIORITY
// (settings.cc holds the defaults).
struct SchedulerOptions {
  int64_t chunk_bytes;
  int inflight;
  int64_t fusion_threshold;  // 0 = no fusion
  bool fifo;
  // Every member on this host (MPI moves the data only inside Test): poll, never pace; and
  // chunks of at least ring_bytes run as the ring (operations.h).
  bool one_host = false;
  int64_t ring_bytes = 262144;  // MLSL_TF_RING_BYTES
  // In-flight slots (communicators) unit seq maps to, seq % slots; 0: `inflight`. More than
  // `inflight` when autotune may widen the window (the owner's StartUpTo limit): the slots of the
  // units in flight stay distinct whatever window in [1, slots] was in force when each started.
  int slots = 0;
  int Slots() const { return slots > 0 ? slots : inflight; }
};

class Scheduler {
 public:
  using Clock = std::chrono::steady_clock;
  using Finish = std::function<void(const Status&)>;

  Scheduler(Communicator* comm, Timeline* timeline, Stats* stats, SchedulerOptions options);
  ~Scheduler();

  // Queues an agreed collective. `request` is null on a rank that has joined (it contributes
  // the identity). `finish` runs exactly once, on this thread.
  // `now` (here and below): the owner's clock -- the only way time enters (queue waits,
  // timeline spans, the pacer; no decision but the pacer's poll interval depends on it).
  void Add(int32_t id, const RequestMeta& meta, Request* request, Finish finish, Clock::time_point submitted,
           Clock::time_point now);
  // Tests the units in flight; finishes collectives whose units have completed on every rank
  // (the common prefix StartUpTo was last given).
  void Progress(Clock::time_point now);
  // Starts units, most urgent first, until `limit` units have been started since creation.
  // `common_done` (default: this rank's completed prefix, right where one process plays every
  // rank) is how many units have completed on every rank: a collective whose next piece needs
  // its previous one done everywhere (Algorithm::Next's sync) waits for it, and the queue
  // behind it goes on meanwhile.
  void StartUpTo(Clock::time_point now, uint64_t limit, const std::vector<bool>& joined,
                 uint64_t common_done = UINT64_MAX);
  // Fails everything queued or in flight (used when the runtime closes).
  void FailAll(const Status& status);
  // The first unit failure here ("<op> '<name>' failed: <reason>", with the transfer's code);
  // ok while none.
  const Status& failure() const { return failure_; }

  uint64_t started() const { return ledger_.started(); }
  uint64_t completed_prefix() const { return ledger_.completed_prefix(); }
  bool queue_empty() const { return queue_.empty(); }
  bool idle() const { return queue_.empty() && active_.empty(); }
  bool transferring() const { return !inflight_.empty(); }
  // Nothing queued, in flight, failed or orphaned: no transfer of MPI's may use this scheduler's
  // buffers or communicators any more, so it may be destroyed.
  bool quiescent() const {
    return idle() && inflight_.empty() && broken_.empty() && orphans_.empty();
  }
  // How long the background thread may sleep between tests of the units in flight (Pacer).
  std::chrono::microseconds PollInterval() const;
  const SchedulerOptions& options() const { return options_; }

 private:
  struct Part;
  struct Work;
  struct Unit;

  Clock::time_point Now() const { return now_; }  // the latest the owner gave
  void Insert(std::unique_ptr<Work> w);
  // Where `w` stands in queue_ (it must be there).
  std::vector<std::unique_ptr<Work>>::iterator Queued(const Work* w);
  void Fuse(Work* head);
  void Prepare(Work* w);
  void StartChunk(Work* w);
  // Where in queue_ the first work stands whose next unit may start now (queue_.size(): none);
  // makes algorithms. The caller keeps the position: nothing before it moves until it starts.
  size_t Startable(const std::vector<bool>& joined, uint64_t common_done);
  // Starts the next piece of the algorithm's work queue_[at] (algorithm.h).
  void StartPiece(size_t at);
  // queue_[at] has started its last unit: it moves to active_.
  void Activate(size_t at);
  // Every piece of w has completed here: its requests finish.
  void FinishPieces(Work* w);
  void Retire(Work* w);
  // Finishes the works done here whose units all lie inside the agreed completed prefix.
  void Release();
  void Finalize(Work* w);
  // inflight_[i] failed with s: kept in broken_, noted in failure_.
  void Broke(size_t i, const Status& s);
  // Notes "<op> '<name>' failed: <s>" as failure_ (the first failure only).
  void FailHere(const Work& w, const Status& s);
  // An output the algorithm could not allocate, as failure_'s reason.
  static Status LocalFailure(const Status& s);
  // StartUpTo's loop.
  void StartUnits(uint64_t limit, const std::vector<bool>& joined, uint64_t common_done);
  // What the result of w is multiplied by: postscale, and 1/size for an average.
  double PostFactor(const Work& w) const;

  Communicator* comm_;
  Timeline* timeline_;
  Stats* stats_;
  const SchedulerOptions options_;

  SlotSet slots_;  // declared first: it outlives the units that use its communicators and scratch
  std::vector<std::unique_ptr<Work>> queue_;   // not fully started, in scheduling order
  std::vector<std::unique_ptr<Work>> active_;  // fully started, units still in flight
  std::vector<std::unique_ptr<Unit>> inflight_;
  std::vector<Work*> settling_;  // in active_, every unit completed here: finish once they have everywhere
  UnitLedger ledger_;
  Clock::time_point now_{};
  uint64_t order_ = 0;  // collectives agreed: the fifo key
  std::vector<std::unique_ptr<Work>> orphans_;  // failed while MPI may still use their buffers
  std::vector<std::unique_ptr<Unit>> broken_;   // failed units: their transfers may still run
  Status failure_;
  Work* last_started_ = nullptr;
  Work* starting_ = nullptr;  // inside StartUpTo: the work being made, prepared or started (named on bad_alloc)
  // Packed buffers (fused tensors, prescaled inputs), handed back when their work finishes.
  BufferPool spare_{8, size_t(64) << 20};
  Residuals residuals_;  // error feedback
  Pacer pacer_;
};

}  // namespace mlsl
