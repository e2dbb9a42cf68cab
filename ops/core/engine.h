// Engine: the request table, the negotiation and the background cycle as a state machine with
// no thread, no lock and no clock of its own (docs/design.md). Its owner -- the Runtime's
// background thread in production, a test's loop over N engines, the simulator -- hands it
// requests with Submit and moves it with Step(now), always from one thread; Step never waits
// for a peer: it starts an exchange or tests it and returns.
//
// One cycle, the same on every rank:
//   1. take the requests submitted since the last cycle; a name whose metadata matches its
//      cached id is ready, anything else is announced;
//   2. allreduce the ControlMessage (control_message.h): flags, joined and shut-down ranks,
//      ready ids, units done per group, the eager region;
//   2b. if a transfer failed on some rank (a unit's error is that rank's alone, its peers would
//      wait for it forever), allgather every rank's failure line (a sub-step) and close every
//      engine with them: the failing ranks with kAborted, the others with kUnavailable;
//   3. if some rank is due a stall warning, allgather every rank's waiting list (a sub-step);
//   4. if some rank announced, allgather the announcements (a sub-step) and let the
//      (replicated) Coordinator decide: agreed names are ready everywhere at once, errors fail
//      everywhere;
//   4b. apply the autotune values the combined message carries (tuner.h: rank 0's proposal), so
//      every rank changes its in-flight window and spin in the same cycle;
//   5. queue the agreed ids in their group's Scheduler, which starts chunks most-urgent-first
//      up to a window that is common knowledge (the least of every member's completed units,
//      carried in step 2, plus the in-flight window) -- identically on all members.
// While an exchange of steps 2-4 travels, Step keeps testing the transfers in flight.
// Small ready allreduces of the world group ride in step 2's message (eager.h) and finish there;
// the region's size is agreed a cycle ahead (the largest any rank asked for). Groups (add_group
// / remove_group are agreed requests too) each have their own communicator and scheduler;
// collective names are per group; a rank marks the ids of groups it is not in as ready, so they
// never wait for it. The control message has its own communicator.
//
// The Engine wires parts that own their state: PendingTable (intake and completion), NameTable
// (negotiation: ids and the name cache), GroupSet (groups, their communicators and schedulers),
// StallWatch, FailureNote and EagerPath (the small-tensor path); it keeps the cycle in flight.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "communicator.h"
#include "control_message.h"
#include "eager_path.h"
#include "failure_note.h"
#include "group_set.h"
#include "names.h"
#include "options.h"
#include "pending.h"
#include "request.h"
#include "stall_watch.h"
#include "stats.h"
#include "string_gather.h"
#include "timeline.h"
#include "tuner.h"

namespace mlsl {

// What one Step did.
struct StepResult {
  bool closed = false;         // the engine has closed (closed_reason, closed_code): stop stepping
  bool in_cycle = false;       // a cycle is under way (an exchange travels): step again soon
  bool cycle_done = false;     // a cycle completed in this step ...
  bool progress = false;       // ... and moved something (a request, a transfer, a join)
  bool started_units = false;  // transfers were started: small ones finish within microseconds
};

// When the engine next needs a step, as it says of itself (LoopPolicy turns it into a wait).
struct NextRun {
  enum class Kind {
    kTransfers,  // transfers queued or in flight: test them after `poll` (0: keep polling)
    kPeers,      // requests waiting on other ranks' messages: step now (the owner backs off)
    kArrival,    // nothing of its own to do: when a submission arrives (or a heartbeat)
  };
  Kind kind = Kind::kArrival;
  std::chrono::microseconds poll{0};
};

class Engine {
 public:
  using Clock = std::chrono::steady_clock;
  // `control`: a communicator over the same ranks for the control message (null: `comm`); MPI
  // runs one communicator's collectives in order, so on `comm` it would wait behind every chunk.
  // `timeline` and `stats` must outlive the engine.
  Engine(std::unique_ptr<Communicator> comm, std::unique_ptr<Communicator> control, Timeline* timeline,
         Stats* stats, EngineOptions options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a request for the next cycle; request->done runs exactly once (at once when closed).
  void Submit(std::unique_ptr<Request> request);
  // This rank is leaving: the next cycle tells every rank, and the engine closes.
  void Stop() { stopping_ = true; }
  // Advances the cycle as far as it can without waiting; `now` is the owner's clock.
  StepResult Step(Clock::time_point now);
  // Tests the transfers in flight (between steps, e.g. right after units started); `now`: the
  // owner's clock, as for Step.
  void Progress(Clock::time_point now) { groups_.Progress(now); }

  bool AllIdle() const { return groups_.AllIdle(); }  // no transfer queued or in flight, no collective left to finish
  bool Transferring() const { return groups_.Transferring(); }  // a unit in flight in some group
  bool HasWork() const { return !pending_.empty() || pending_.joining() || pending_.has_inbox(); }
  bool HasInbox() const { return pending_.has_inbox(); }
  // The sleep between tests of the transfers in flight: the shortest any busy group allows.
  std::chrono::microseconds PollInterval() const { return groups_.PollInterval(); }
  // When it next needs a step: the one answer every owner's pacing follows (loop_policy.h).
  NextRun WhenNext() const {
    if (!AllIdle()) return {NextRun::Kind::kTransfers, PollInterval()};
    return {HasWork() ? NextRun::Kind::kPeers : NextRun::Kind::kArrival, std::chrono::microseconds(0)};
  }
  bool closed() const { return closed_.closed; }
  const std::string& closed_reason() const { return closed_.reason; }
  StatusCode closed_code() const { return closed_.code; }
  int rank() const { return comm_->rank(); }
  int size() const { return comm_->size(); }
  uint64_t cycles() const { return round_.count; }
  // The spin (MLSL_TF_SPIN_US) and in-flight window (MLSL_TF_INFLIGHT) in force: autotune's.
  std::chrono::microseconds spin() const { return std::chrono::microseconds(round_.tuner.value(kTuneSpinUs)); }
  int inflight() const { return int(round_.tuner.value(kTuneInflight)); }

 private:
  // Where the cycle stands: between cycles, or waiting for the exchange of one of its steps.
  enum class Phase { kIdle, kControl, kFailures, kStalls, kNegotiate };
  // The cycle in flight, and what one cycle carries to the next.
  struct Round {
    Phase phase = Phase::kIdle;
    uint64_t count = 0;              // control cycles completed: the same count on every rank
    bool stopping = false;           // this cycle tells the others this rank leaves
    bool progress = false;           // this cycle moved something so far
    uint64_t events_before = 0;      // UnitEvents() when it began
    int32_t ids = 0;                 // ids known when it began (the ready bits' extent)
    Clock::time_point started{};
    ControlMessage message;          // this rank's, then the combined one
    std::vector<uint64_t> words;     // ... as words
    std::unique_ptr<PendingOp> control_op;
    StringGather gather;             // the failure lines', the stall report's or the negotiation's allgather
    std::vector<bool> joined;        // by world rank, from the combined message
    std::vector<int32_t> agreed;     // ids agreed this cycle
    std::vector<bool> joined_before; // the joins seen in earlier cycles (until the join completes)
    int last_joined = -1;
    Tuner tuner;                     // autotune: what rank 0 proposes and this rank applied
  };
  struct Closure {
    bool closed = false;
    std::string reason;
    StatusCode code = StatusCode::kAborted;
  };

  // engine.cc: intake and the exchanges in flight.
  // The scheduler options groups get: as many slots as autotune's widest window.
  static SchedulerOptions WithSlots(const EngineOptions& options);
  void Intake(std::unique_ptr<Request> r);
  void Advance(StepResult* result);      // tests the exchange in flight; moves past those done
  Communicator* control() { return control_comm_ ? control_comm_.get() : comm_.get(); }
  // Refuses future submissions with `reason` and fails everything pending with it.
  // kUnavailable when a peer's end closes it (Python tells that from a failure of its own).
  void Close(const std::string& reason, StatusCode code = StatusCode::kAborted);

  // engine_cycle.cc: the steps of one cycle.
  void BeginCycle();                     // intake, this rank's message, the allreduce started
  void FillMessage();
  void OnControl(StepResult* result);    // the combined message arrived
  void AfterStalls(StepResult* result);  // joins noted; the negotiation started, or Dispatch
  void OnNegotiated(StepResult* result); // the announcements arrived
  void Dispatch(StepResult* result);     // agreed ids queued, units started, the cycle ends
  void Queue(int32_t id);                // an agreed id to its group's scheduler (or a group change)
  // Runs an agreed add_group / remove_group (every rank, same cycle, same order).
  void ChangeGroups(const RequestMeta& meta, Request* mine);

  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<Communicator> control_comm_;
  Stats* const stats_;
  const EngineOptions options_;
  Clock::time_point now_{};  // the latest Step's
  bool stopping_ = false;
  Closure closed_;
  PendingTable pending_;
  GroupSet groups_;
  NameTable names_;
  EagerPath eager_;
  StallWatch stalls_;
  FailureNote failure_;  // this rank's first failed transfer or allocation
  Round round_;
};

}  // namespace mlsl
