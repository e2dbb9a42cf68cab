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
//   5. queue the agreed ids in their group's Scheduler, which starts chunks most-urgent-first
//      up to a window that is common knowledge (the least of every member's completed units,
//      carried in step 2, plus the in-flight window) -- identically on all members.
// While an exchange of steps 2-4 travels, Step keeps testing the transfers in flight.
// Small ready allreduces of the world group ride in step 2's message (eager.h) and finish there;
// the region's size is agreed a cycle ahead (the largest any rank asked for). Groups (add_group
// / remove_group are agreed requests too) each have their own communicator and scheduler;
// collective names are per group; a rank marks the ids of groups it is not in as ready, so they
// never wait for it. The control message has its own communicator.
#pragma once

#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "communicator.h"
#include "control_message.h"
#include "coordinator.h"
#include "eager.h"
#include "options.h"
#include "request.h"
#include "scheduler.h"
#include "stats.h"
#include "string_gather.h"
#include "timeline.h"

namespace mlsl {

// What one Step did.
struct StepResult {
  bool closed = false;         // the engine has closed (closed_reason, closed_code): stop stepping
  bool in_cycle = false;       // a cycle is under way (an exchange travels): step again soon
  bool cycle_done = false;     // a cycle completed in this step ...
  bool progress = false;       // ... and moved something (a request, a transfer, a join)
  bool started_units = false;  // transfers were started: small ones finish within microseconds
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
  // Tests the transfers in flight (between steps, e.g. right after units started).
  void Progress();

  bool AllIdle() const;  // no transfer queued or in flight, no collective left to finish
  bool Transferring() const;  // a unit in flight in some group
  bool HasWork() const { return !pending_.empty() || join_ != nullptr || !inbox_.empty(); }
  bool HasInbox() const { return !inbox_.empty(); }
  // The sleep between tests of the transfers in flight: the shortest any busy group allows.
  std::chrono::microseconds PollInterval() const;
  bool closed() const { return closed_; }
  const std::string& closed_reason() const { return closed_reason_; }
  StatusCode closed_code() const { return closed_code_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  uint64_t cycles() const { return cycle_; }

 private:
  // A set of ranks with its own communicator and scheduler; group 0 is the world.
  // Groups are created collectively (an agreed add_group request), so every rank holds the
  // same list; a rank outside a group keeps only its member list.
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

  struct Local {
    std::unique_ptr<Request> request;
    RequestMeta meta;
    enum State { kToAnnounce, kAnnounced, kReady, kScheduled } state = kToAnnounce;
    int32_t id = -1;
    Clock::time_point submitted;
    Clock::time_point warned{};  // last stall warning about it
  };

  // Where the cycle stands: between cycles, or waiting for the exchange of one of its steps.
  enum class Phase { kIdle, kControl, kFailures, kStalls, kNegotiate };

  // engine.cc: intake and the cycle's phases.
  void Intake(std::unique_ptr<Request> r);
  // Refuses a request that cannot be announced (unknown group, not a member); "" when fine.
  std::string GroupError(const Request& r) const;
  void BeginCycle();                     // intake, this rank's message, the allreduce started
  void Advance(StepResult* result);      // tests the exchange in flight; moves past those done
  void OnControl(StepResult* result);    // the combined message arrived
  void AfterStalls(StepResult* result);  // joins noted; the negotiation started, or Dispatch
  void OnNegotiated(StepResult* result); // the announcements arrived
  void Dispatch(StepResult* result);     // agreed ids queued, units started, the cycle ends
  void Queue(int32_t id);                // an agreed id to its group's scheduler (or a group change)
  void StartUnits(StepResult* result);
  void ForgetOrDrain();
  // engine_failure.cc: notes this rank's first failed transfer (failure_); every rank's
  // failure lines gathered (started); the engine closed with them.
  void NoteFailure();
  void StartFailureReport();
  void CloseOnFailures();
  // Gives a member's group its scheduler.
  void Equip(Group* g);
  bool Foreign(int32_t id) const { return id / 64 < int32_t(foreign_.size()) && (foreign_[id / 64] >> (id % 64)) & 1; }
  // Units started plus units completed over this rank's groups: it changes iff a transfer moved.
  uint64_t UnitEvents() const;
  void Finish(const std::string& name, const Status& s);
  void FinishJoin(int last_rank);
  // Refuses future submissions with `reason` and fails everything pending with it.
  // kUnavailable when a peer's end closes it (Python tells that from a failure of its own).
  void Close(const std::string& reason, StatusCode code = StatusCode::kAborted);

  // engine_negotiate.cc: names, ids and groups.
  void Announce();                       // this rank's announcements gathered (started)
  bool Decide();                         // every rank's announcements into decisions
  void ApplyDecision(const Decision& d);
  // Forgets the least recently used collective names beyond cache_capacity / 2.
  void ForgetNames();
  // Runs an agreed add_group / remove_group (every rank, same cycle, same order).
  void ChangeGroups(const RequestMeta& meta, Request* mine);
  Status AddGroup(const RequestMeta& meta, int32_t* id);
  Status RemoveGroup(int32_t id);

  // engine_eager.cc (eager.h): whether a request is of a kind and size that may ride in the
  // control message (once ready); fills *region (this cycle's agreed size) with this rank's
  // ready ones and returns the region it wants next cycle (0: none); finishes the requests of
  // a combined region's valid entries, putting their ids in order into *ids; false (the engine
  // closed) when an entry's id is not one of this rank's ready requests.
  bool Eager(const Local& l) const;
  int64_t FillEager(std::vector<uint64_t>* region);
  // l's outputs (Request::Output); false, with failure_ noted, when one cannot be allocated.
  bool AllocateOutputs(const Local& l);
  // An add_group's ranks that a live group (the world included) already has: why, else "".
  std::string ExistingGroup(const std::vector<int>& ranks) const;
  bool FinishEager(const std::vector<uint64_t>& region, std::vector<int32_t>* ids);
  void FinishOneEager(const EagerEntry& e, Local* l);

  // engine_stalls.cc: whether this rank has a request due for a stall warning / past the stall
  // shutdown time; every rank's waiting list gathered (started); the warnings about this
  // rank's due ones, naming the ranks that have not submitted them, or, past the limit,
  // closing the engine everywhere with what each rank waits for.
  void StallFlags(bool* warn, bool* shut) const;
  void StartStallReport();
  void ReportStalls(bool shut);

  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<Communicator> control_comm_;
  const int rank_, size_;
  Timeline* const timeline_;
  Stats* const stats_;
  const EngineOptions options_;
  Clock::time_point now_{};  // the latest Step's
  uint64_t cycle_ = 0;       // control cycles completed: the same count on every rank
  int64_t eager_words_ = 0;  // this cycle's eager region (agreed in the previous cycle)
  bool drain_ = false;       // this cycle takes no new requests (to forget names when all is quiet)
  uint64_t next_drain_ = 0, drain_until_ = 0;
  bool stopping_ = false;
  std::string failure_;      // this rank's first failed transfer or allocation, "" while none
  bool closed_ = false;
  std::string closed_reason_;
  StatusCode closed_code_ = StatusCode::kAborted;

  // The cycle in flight.
  Phase phase_ = Phase::kIdle;
  bool cycle_stopping_ = false;    // this cycle tells the others this rank leaves
  bool cycle_progress_ = false;    // this cycle moved something so far
  uint64_t events_before_ = 0;     // UnitEvents() when it began
  int32_t cycle_ids_ = 0;          // ids known when it began (the ready bits' extent)
  Clock::time_point cycle_started_{};
  ControlMessage message_;         // this rank's, then the combined one
  std::vector<uint64_t> words_;    // ... as words
  std::unique_ptr<PendingOp> control_op_;
  StringGather gather_;            // the stall report's or the negotiation's allgather
  std::vector<bool> joined_;       // by world rank, from the combined message
  std::vector<int32_t> agreed_;    // ids agreed this cycle

  std::deque<std::unique_ptr<Request>> inbox_;
  std::vector<std::unique_ptr<Group>> groups_;  // by id; [0] is the world
  std::vector<std::unique_ptr<Group>> removed_groups_;  // until quiescent: MPI may still use their buffers
  std::vector<uint64_t> foreign_;  // bit per collective id: it belongs to a group this rank is not in
  Coordinator coordinator_;
  std::map<std::string, Local> pending_;
  std::unordered_map<std::string, int32_t> cached_ids_;
  std::unique_ptr<Request> join_;
  std::vector<bool> joined_before_;
  int last_joined_ = -1;
};

}  // namespace mlsl
