// Runtime: the owner of the background thread around the Engine (engine.h), which does the
// cycle's work: this file holds the thread, the queue of submitted requests and the policy of
// when the thread spins, polls or sleeps between the engine's steps (docs/design.md).
//
// One background thread owns the communicator (and so MPI): only it starts or tests
// communication, which keeps the order of collectives identical on every rank and needs no
// lock around MPI. Framework threads only Submit requests, which never blocks; each request
// is finished exactly once, with a Status, by that thread (or at once by Submit when the
// runtime is closed). The thread hands queued requests to the engine between cycles and
// steps it with the real clock until the engine closes.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "communicator.h"
#include "engine.h"
#include "loop_policy.h"
#include "options.h"
#include "request.h"
#include "results.h"
#include "stats.h"
#include "timeline.h"

namespace mlsl {

class Runtime {
 public:
  // `timeline`: already opened (OpenTimelineAtInit); null: none until StartTimeline.
  Runtime(std::unique_ptr<Communicator> comm, RuntimeOptions options, std::unique_ptr<Timeline> timeline = nullptr);
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
  // resolves for this local rank: mlsl_tf/cpu_placement.py).
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
  using Clock = std::chrono::steady_clock;
  void Loop();
  // Before a cycle: sleeps as the policy says while nothing is queued, then hands the queue,
  // a shutdown and a timeline change to the engine (`pacer`: how long to wait for them).
  void BetweenCycles(Engine* engine, const IdlePacer& pacer);
  void Sleep(std::unique_lock<std::mutex>* lock, const Engine& engine, const IdlePacer& pacer);
  // Steps the engine until its cycle completes or it closes, polling while exchanges travel.
  StepResult RunCycle(Engine* engine);
  // The engine closed: refuses future submissions with its reason and fails the queued ones.
  void CloseQueue(const Engine& engine);
  void RaisePriority();  // MLSL_TF_COMM_NICE
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

  std::unique_ptr<Communicator> comm_;  // until the background thread hands it to the engine
  const int rank_, size_;
  const Topology topology_;
  const RuntimeOptions options_;
  Clock::time_point last_progress_;

  // Shared with submitting threads.
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Request>> incoming_;
  bool stop_requested_ = false;
  struct {
    std::string reason;                      // non-empty once closed: new requests fail with it
    StatusCode code = StatusCode::kAborted;  // ... and this code
  } closed_;
  TimelineChange* timeline_change_ = nullptr;  // waiting for the background thread
  std::condition_variable timeline_cv_;        // a change was applied
  bool loop_ended_ = false;                    // the background thread no longer writes the timeline

  // Owned by the background thread.
  std::unique_ptr<Timeline> timeline_;
  bool mark_cycles_;  // MLSL_TF_TIMELINE_MARK_CYCLES, or start_timeline's mark_cycles
  Stats stats_;
  std::unique_ptr<Engine> engine_;  // made by the background thread

  std::atomic<int> group_changes_{0};
  const std::shared_ptr<Results> results_;  // records start/take events when timeline_ is enabled

  std::thread thread_;  // last member: starts after everything above exists
};

// Opens options.timeline (MLSL_TF_TIMELINE or HOROVOD_TIMELINE; "DYNAMIC" = none) on the ranks
// that write it. Collective over `comm`: when a rank cannot open its file, every rank gets the
// error (naming the variable, the rank and the file), so no rank goes on to wait for it.
Status OpenTimelineAtInit(Communicator* comm, Timeline* timeline, const RuntimeOptions& options);

}  // namespace mlsl
