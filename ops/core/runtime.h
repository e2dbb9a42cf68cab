// Runtime: the request table, the negotiation and the background cycle (docs/design.md).
//
// One background thread owns the communicator (and so MPI): only it starts or tests
// communication, which keeps the order of collectives identical on every rank and needs no
// lock around MPI. Framework threads only Submit requests, which never blocks; each request
// is finished exactly once, with a Status, by that thread (or at once by Submit when the
// runtime is closed).
//
// One cycle, the same on every rank:
//   1. take newly submitted requests; a name whose metadata matches its cached id is ready,
//      anything else is announced;
//   2. AND-allreduce a bitset: [flags | joined ranks | shut-down ranks | ready ids]; flags and
//      per-rank bits are stored inverted so the AND works as an OR for them;
//   3. if some rank announced, allgather the announcements and let the (replicated)
//      Coordinator decide: agreed names are ready everywhere at once, errors fail everywhere;
//   4. queue the agreed ids in their group's Scheduler, which starts chunks most-urgent-first
//      up to a window that is common knowledge (the MIN of every member's completed units, one
//      word per group in the same control message, plus MLSL_TF_INFLIGHT) -- identically on
//      all members.
// Small ready allreduces of the world group (<= MLSL_TF_EAGER_BYTES) also ride in step 2's
// message (eager.h): those every rank contributed come back reduced and finish there, one round
// instead of two; the region's size is agreed a cycle ahead (the largest any rank asked for).
// Groups (add_group / remove_group are agreed requests too) each have their own communicator,
// executor and scheduler; collective names are per group; a rank marks the ids of groups it is
// not in as ready, so they never wait for it. The control message has its own communicator.
// While the control message is in flight, the thread keeps testing the chunks in flight.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "communicator.h"
#include "control_message.h"
#include "coordinator.h"
#include "executor.h"
#include "scheduler.h"
#include "stats.h"
#include "timeline.h"
#include "request.h"
#include "results.h"

namespace mlsl {

class Runtime {
 public:
  // `timeline`: already opened (OpenTimelineAtInit); null: none until StartTimeline.
  explicit Runtime(std::unique_ptr<Communicator> comm, std::unique_ptr<Timeline> timeline = nullptr);
  ~Runtime();  // shuts down
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  // Hands a request to the background thread. Never blocks; request->done runs exactly once.
  void Submit(std::unique_ptr<Request> request);
  // Tells every rank this one is leaving, fails what is pending here, joins the thread.
  void Shutdown();

  // An add_group (ranks) or remove_group (id) request, named by this process's count of group
  // changes so far -- the same on every rank that changes groups in the same order.
  Request GroupChange(OpType op, std::vector<int> ranks, int id = 0);

  // Horovod's start_timeline / stop_timeline (runtime_timeline.cc). Start: this rank writes
  // `path` if Timeline::Writes says so (rank 0, or every rank with "{rank}" in it), after
  // closing the file open; the path already open again only sets mark_cycles. Stop: closes
  // it, a complete file; nothing when none is open. Both are handed to the background thread,
  // which applies them between two cycles, and return once applied. Start returns "" or the
  // error naming the file (*os_error: its errno).
  std::string StartTimeline(const std::string& path, bool mark_cycles, int* os_error = nullptr);
  void StopTimeline();

  // Pins the background thread to CPU `core` (MLSL_TF_COMM_CORE, which Python parses and
  // resolves for this local rank: mlsl_tf/cores.py).
  Status PinBackgroundThread(int core);

  int rank() const { return rank_; }
  int size() const { return size_; }
  Topology topology() const { return topology_; }
  // Counters as a JSON object (mlsl_tf.stats()).
  std::string StatsJson() const { return stats_.Json(); }
  // Results of collectives started now and taken later (deferred updates); they live as long
  // as this runtime, so a shutdown forgets them.
  const std::shared_ptr<Results>& results() const { return results_; }

 private:
  // A set of ranks with its own communicator, executor and scheduler; group 0 is the world.
  // Groups are created collectively (an agreed add_group request), so every rank holds the
  // same list; a rank outside a group keeps only its member list.
  struct Group {
    std::vector<int> ranks;  // world ranks, sorted
    int index = -1;          // this rank's position in ranks; -1 when not a member
    bool removed = false;
    int generation = 0;      // how many removed groups had this id before (ids are reused, lowest first)
    std::unique_ptr<Communicator> own;  // null for the world and on non-members
    Communicator* comm = nullptr;
    std::unique_ptr<Executor> executor;
    std::unique_ptr<Scheduler> scheduler;
    bool member() const { return index >= 0 && !removed; }
  };

  struct Local {
    std::unique_ptr<Request> request;
    RequestMeta meta;
    enum State { kToAnnounce, kAnnounced, kReady, kScheduled } state = kToAnnounce;
    int32_t id = -1;
    std::chrono::steady_clock::time_point submitted;
    std::chrono::steady_clock::time_point warned{};  // last stall warning about it
  };

  static std::vector<std::unique_ptr<Group>> WorldGroup(Communicator* comm, int rank, Timeline* timeline,
                                                        Stats* stats, const SchedulerOptions& options);
  void Loop();
  // One cycle; returns false when the runtime has closed. *progress: something moved.
  bool Cycle(bool* progress);
  void Intake(std::unique_ptr<Request> r);
  // Refuses a request that cannot be announced (unknown group, not a member); "" when fine.
  std::string GroupError(const Request& r) const;
  // Gives a member's group its executor and scheduler.
  static void Equip(Group* g, Timeline* timeline, Stats* stats, const SchedulerOptions& options);
  bool Foreign(int32_t id) const { return id / 64 < int32_t(foreign_.size()) && (foreign_[id / 64] >> (id % 64)) & 1; }
  // Units started plus units completed over this rank's groups: it changes iff a transfer moved.
  uint64_t UnitEvents() const;
  bool AllIdle() const;
  // The sleep between tests of the transfers in flight: the shortest any busy group allows.
  std::chrono::microseconds PollInterval() const;
  // Every rank's `mine`, concatenated in rank order into *all; *sizes: each rank's length.
  // Forgets the least recently used collective names beyond MLSL_TF_CACHE_CAPACITY / 2.
  void ForgetNames();
  // Runs an agreed add_group / remove_group (every rank, same cycle, same order).
  void ChangeGroups(const RequestMeta& meta, Request* mine);
  bool Negotiate(const std::vector<bool>& joined, std::vector<int32_t>* agreed);
  void RaisePriority();  // MLSL_TF_COMM_NICE
  void Finish(const std::string& name, const Status& s);
  // Eager allreduces (eager.h): whether a request is of a kind and size that may ride in the
  // control message (once ready); fills *region (this cycle's agreed size) with this rank's
  // ready ones and returns the region it wants next cycle (0: none); finishes the requests of a combined
  // region's valid entries, putting their ids in order into *ids; false (the runtime closed)
  // when an entry's id is not one of this rank's ready requests.
  bool Eager(const Local& l) const;
  int64_t FillEager(std::vector<uint64_t>* region);
  bool FinishEager(const uint64_t* region, int64_t words, std::vector<int32_t>* ids);
  void FinishJoin(int last_rank);
  // A timeline start / stop handed from a framework thread to the background thread.
  struct TimelineChange {
    bool start = false;
    std::string path;
    bool mark_cycles = false;
    std::string error;
    int os_error = 0;
    bool done = false;
  };
  void ChangeTimeline(TimelineChange* change);  // framework thread: hands over, waits
  void ServeTimelineChange(TimelineChange* change);  // background thread, between cycles
  void ApplyTimelineChange(TimelineChange* change);
  void EndTimeline();                           // the background thread is ending
  // Refuses future submissions with `reason` and fails everything pending with it.
  // kUnavailable when a peer's end closes it (Python tells that from a failure of its own).
  void Close(const std::string& reason, StatusCode code = StatusCode::kAborted);
  // Whether this rank has a request due for a stall warning / past the stall shutdown time.
  void StallFlags(bool* warn, bool* shut) const;
  // Every rank's waiting requests gathered (all ranks call it in the same cycle): warns about
  // this rank's due ones, naming the ranks that have not submitted them, or, with `shut`,
  // closes the runtime everywhere with what each rank waits for. False when closed.
  bool ReportStalls(bool shut);

  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<Communicator> control_comm_;  // a duplicate of comm_ for the control message
  const int rank_, size_;
  const Topology topology_;
  const std::chrono::milliseconds heartbeat_;
  const std::chrono::seconds stall_warning_, stall_shutdown_;
  const size_t cache_capacity_;
  uint64_t cycle_ = 0;  // control cycles so far: the same count on every rank
  const int64_t eager_bytes_;  // MLSL_TF_EAGER_BYTES
  int64_t eager_words_ = 0;    // this cycle's eager region (agreed in the previous cycle)
  bool drain_ = false;   // this cycle takes no new requests (to forget names when all is quiet)
  uint64_t next_drain_ = 0, drain_until_ = 0;
  const std::chrono::microseconds spin_;  // MLSL_TF_SPIN_US
  std::chrono::steady_clock::time_point last_progress_;
  ControlMessage message_;       // this cycle's, reused
  std::vector<uint64_t> words_;  // ... as words

  // Shared with submitting threads.
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Request>> incoming_;
  bool stop_requested_ = false;
  std::string closed_reason_;  // non-empty once closed: new requests fail with it
  StatusCode closed_code_ = StatusCode::kAborted;  // ... and this code
  TimelineChange* timeline_change_ = nullptr;  // waiting for the background thread
  std::condition_variable timeline_cv_;        // a change was applied
  bool loop_ended_ = false;                    // the background thread no longer writes the timeline

  // Owned by the background thread.
  std::unique_ptr<Timeline> timeline_;
  bool mark_cycles_;  // MLSL_TF_TIMELINE_MARK_CYCLES, or start_timeline's mark_cycles
  std::chrono::steady_clock::time_point cycle_started_;  // this cycle's control message started
  Stats stats_;
  const SchedulerOptions options_;
  const DataType default_wire_;  // MLSL_TF_WIRE_DTYPE, for float32 reductions
  std::vector<std::unique_ptr<Group>> groups_;  // by id; [0] is the world
  std::vector<std::unique_ptr<Group>> removed_groups_;  // kept while MPI may still use their buffers
  std::vector<uint64_t> foreign_;  // bit per collective id: it belongs to a group this rank is not in
  Coordinator coordinator_;
  std::map<std::string, Local> pending_;
  std::unordered_map<std::string, int32_t> cached_ids_;
  std::unique_ptr<Request> join_;
  std::vector<bool> joined_before_;
  int last_joined_ = -1;

  std::atomic<int> group_changes_{0};
  const std::shared_ptr<Results> results_;  // records start/take events when timeline_ is enabled

  std::thread thread_;  // last member: starts after everything above exists
};

// Opens the timeline of MLSL_TF_TIMELINE (or HOROVOD_TIMELINE; "DYNAMIC" = none) on the ranks
// that write it. Collective over `comm`: when a rank cannot open its file, every rank gets the
// error (naming the variable, the rank and the file), so no rank goes on to wait for it.
Status OpenTimelineAtInit(Communicator* comm, Timeline* timeline);

}  // namespace mlsl
