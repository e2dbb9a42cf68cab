// Runtime: the background thread around the Engine, and its policy of spinning, polling and
// sleeping between steps (runtime.h).
#include "runtime.h"

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "logging.h"
#include "loop_policy.h"
#include "wait_ladder.h"

namespace mlsl {

Runtime::Runtime(std::unique_ptr<Communicator> comm, RuntimeOptions options, std::unique_ptr<Timeline> timeline)
    : comm_(std::move(comm)),
      rank_(comm_->rank()),
      size_(comm_->size()),
      topology_(comm_->topology()),
      options_(std::move(options)),
      timeline_(timeline ? std::move(timeline) : std::make_unique<Timeline>()),
      mark_cycles_(options_.mark_cycles),
      results_([this] {
        auto r = std::make_shared<Results>();
        r->Record(timeline_->enabled());
        return r;
      }()),
      thread_([this] { Loop(); }) {}

Runtime::~Runtime() { Shutdown(); }

Request Runtime::GroupChange(OpType op, std::vector<int> ranks, int id) {
  Request r;
  r.op = op;
  r.name = "mlsl_tf.group_change." + std::to_string(group_changes_++);
  r.ranks = std::move(ranks);
  r.root = id;
  return r;
}

void Runtime::Submit(std::unique_ptr<Request> request) {
  stats_.Submitted();
  std::string refused;
  StatusCode code = StatusCode::kAborted;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_.reason.empty() && !stop_requested_) {
      incoming_.push_back(std::move(request));
    } else {
      refused = closed_.reason.empty() ? "mlsl_tf is shutting down" : closed_.reason;
      if (!closed_.reason.empty()) code = closed_.code;
    }
  }
  if (!refused.empty()) {
    request->done(Status::WithCode(code, refused + " (collective '" + ShownName(request->name) + "' was not run)"));
    return;
  }
  cv_.notify_one();
}

void Runtime::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_requested_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

Status Runtime::PinBackgroundThread(int core) {
  const std::string what = "could not pin the background thread to core " + std::to_string(core);
  if (core < 0 || core >= CPU_SETSIZE) return Status::InvalidArgument(what + ": no such core");
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(core, &set);
  int rc = pthread_setaffinity_np(thread_.native_handle(), sizeof(set), &set);
  if (rc != 0) return Status::Internal(what + ": " + std::strerror(rc));
  Log(LogLevel::kInfo, "background thread pinned to core " + std::to_string(core));
  return Status::Ok();
}

void Runtime::RaisePriority() {
  // Linux nice values are per thread. Woken by the network, this thread must run before the
  // socket buffers drain, not after a compute thread's time slice; it sleeps most of the time,
  // so it takes little from the computation. Lowering nice needs CAP_SYS_NICE (or a
  // RLIMIT_NICE): without it the thread keeps the default, which is no error.
  const int nice = options_.comm_nice;
  if (nice == 0) return;
  const pid_t tid = pid_t(syscall(SYS_gettid));
  if (setpriority(PRIO_PROCESS, id_t(tid), nice) != 0) {
    Log(LogLevel::kInfo, "background thread keeps its priority (MLSL_TF_COMM_NICE=" + std::to_string(nice) +
                             " not permitted)");
  }
}

void Runtime::Loop() {
  pthread_setname_np(pthread_self(), "mlsl_tf_comm");  // as `top -H` and /proc show it
  SetLogRank(rank_);
  RaisePriority();
  // The control message gets its own communicator: MPI runs the collectives of one
  // communicator in order, so on the data communicator it would wait behind every chunk.
  std::unique_ptr<Communicator> control;
  std::vector<int> everyone(size_);
  for (int r = 0; r < size_; ++r) everyone[r] = r;
  Status s = comm_->Split(everyone, &control);
  if (!s.ok()) Log(LogLevel::kWarning, "no separate control communicator (" + s.message() + ")");
  EngineOptions engine_options = options_.engine;
  engine_options.tune.initial[kTuneSpinUs] = options_.spin.count();  // autotune starts from it
  engine_ = std::make_unique<Engine>(std::move(comm_), std::move(control), timeline_.get(), &stats_, engine_options);
  IdlePacer pacer(options_.heartbeat);
  while (true) {
    BetweenCycles(engine_.get(), pacer);
    const StepResult r = RunCycle(engine_.get());
    if (r.closed) {
      CloseQueue(*engine_);
      EndTimeline();
      return;
    }
    pacer.CycleEnded(r);
    const auto now = Clock::now();
    if (r.progress) last_progress_ = now;
    if (timeline_->enabled()) {
      for (const Results::Event& e : results_->Drain()) timeline_->Instant(e.name, e.kind, "framework", e.at);
      timeline_->MaybeFlush(now);  // a reader sees the events within about one flush interval
    }
  }
}

void Runtime::BetweenCycles(Engine* engine, const IdlePacer& pacer) {
  std::deque<std::unique_ptr<Request>> incoming;
  TimelineChange* timeline_change = nullptr;
  bool stop = false;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (incoming_.empty() && !engine->HasInbox() && !stop_requested_ && !timeline_change_) Sleep(&lock, *engine, pacer);
    incoming.swap(incoming_);
    stop = stop_requested_;
    timeline_change = timeline_change_;  // read under the lock this cycle takes anyway
  }
  for (auto& r : incoming) engine->Submit(std::move(r));
  if (stop) engine->Stop();
  if (timeline_change) ServeTimelineChange(timeline_change);
  if (mark_cycles_) timeline_->CycleStart(Clock::now());
}

void Runtime::Sleep(std::unique_lock<std::mutex>* lock, const Engine& engine, const IdlePacer& pacer) {
  const NextRun next = engine.WhenNext();  // asked once: the wait and the spin both follow it
  auto wait = pacer.Wait(next);
  if (IdlePacer::Quiet(next)) {
    // Just finished something: the next request usually follows within microseconds, so poll
    // briefly before sleeping (an idle process still sleeps, a busy one does not pay a
    // wake-up per collective).
    const auto until = last_progress_ + engine.spin();  // MLSL_TF_SPIN_US, or autotune's
    while (incoming_.empty() && !stop_requested_ && !timeline_change_ && Clock::now() < until) {
      lock->unlock();
      std::this_thread::yield();
      lock->lock();
    }
    if (!incoming_.empty()) wait = std::chrono::microseconds(0);
  }
  if (wait.count() > 0) {
    cv_.wait_for(*lock, wait, [this] { return !incoming_.empty() || stop_requested_ || timeline_change_; });
  }
}

StepResult Runtime::RunCycle(Engine* engine) {
  CycleStepper stepper(engine, Clock::now());
  while (true) {
    const auto now = Clock::now();
    const CycleStepper::Next next = stepper.Act(now);
    if (next.done) return next.result;
    if (next.finishing) continue;  // testing just-started transfers: at once
    if (next.at > now) {
      std::this_thread::sleep_for(next.at - now);
    } else if (next.yield) {
      std::this_thread::yield();
    }
  }
}

void Runtime::CloseQueue(const Engine& engine) {
  std::deque<std::unique_ptr<Request>> incoming;
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_.reason = engine.closed_reason();
    closed_.code = engine.closed_code();
    incoming.swap(incoming_);
  }
  for (auto& r : incoming) {
    std::string what = r->op == OpType::kJoin ? "join" : "collective '" + ShownName(r->name) + "'";
    r->done(Status::WithCode(closed_.code, closed_.reason + " (" + what + " did not complete)"));
  }
}

}  // namespace mlsl
