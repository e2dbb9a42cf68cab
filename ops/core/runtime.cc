#include "runtime.h"

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "logging.h"
#include "settings.h"

namespace mlsl {
namespace {

int Words(int64_t bits) { return int((bits + 63) / 64); }
void ClearBit(std::vector<uint64_t>& w, int64_t offset_words, int64_t bit) {
  w[offset_words + bit / 64] &= ~(uint64_t(1) << (bit % 64));
}
void SetBit(std::vector<uint64_t>& w, int64_t offset_words, int64_t bit) {
  w[offset_words + bit / 64] |= uint64_t(1) << (bit % 64);
}

SchedulerOptions OptionsFromSettings() {
  SchedulerOptions o;
  // The values were checked by CheckSettings at init (settings.cc declares their ranges).
  o.chunk_bytes = SettingInt("MLSL_TF_CHUNK_BYTES");
  o.inflight = int(SettingInt("MLSL_TF_INFLIGHT"));
  o.fusion_threshold = SettingInt("MLSL_TF_FUSION_THRESHOLD");
  o.fifo = SettingString("MLSL_TF_PRIORITY") == "fifo";
  return o;
}

DataType WireFromSettings() {
  std::string w = SettingString("MLSL_TF_WIRE_DTYPE");
  if (w == "bfloat16" || w == "bf16") return DataType::kBfloat16;
  if (w == "float16" || w == "fp16") return DataType::kFloat16;
  return DataType::kFloat32;
}

}  // namespace

std::vector<std::unique_ptr<Runtime::Group>> Runtime::WorldGroup(Communicator* comm, int rank, Timeline* timeline,
                                                                 Stats* stats, const SchedulerOptions& options) {
  auto g = std::make_unique<Group>();
  for (int r = 0; r < comm->size(); ++r) g->ranks.push_back(r);
  g->index = rank;
  g->comm = comm;
  Equip(g.get(), timeline, stats, options);
  std::vector<std::unique_ptr<Group>> groups;
  groups.push_back(std::move(g));
  return groups;
}

void Runtime::Equip(Group* g, Timeline* timeline, Stats* stats, const SchedulerOptions& options) {
  g->executor = std::make_unique<Executor>(g->comm);
  // On one host the pacer's rate would read latency-bound small transfers as a slow network
  // and sleep between the tests that move shared-memory data (4 MiB took 5x MPI's time).
  SchedulerOptions o = options;
  o.one_host = g->comm->topology().cross_size == 1;
  g->scheduler = std::make_unique<Scheduler>(g->comm, g->executor.get(), timeline, stats, o);
}

Request Runtime::GroupChange(OpType op, std::vector<int> ranks, int id) {
  Request r;
  r.op = op;
  r.name = "mlsl_tf.group_change." + std::to_string(group_changes_++);
  r.ranks = std::move(ranks);
  r.root = id;
  return r;
}

uint64_t Runtime::UnitEvents() const {
  uint64_t n = 0;
  for (const auto& g : groups_) if (g->member()) n += g->scheduler->started() + g->scheduler->completed_prefix();
  return n;
}

bool Runtime::AllIdle() const {
  for (const auto& g : groups_) if (g->member() && !g->scheduler->idle()) return false;
  return true;
}

std::chrono::microseconds Runtime::PollInterval() const {
  std::chrono::microseconds shortest = std::chrono::microseconds::max();
  for (const auto& g : groups_) {
    if (g->member() && !g->scheduler->idle()) shortest = std::min(shortest, g->scheduler->PollInterval());
  }
  return shortest == std::chrono::microseconds::max() ? std::chrono::microseconds(0) : shortest;
}

Runtime::Runtime(std::unique_ptr<Communicator> comm, std::unique_ptr<Timeline> timeline)
    : comm_(std::move(comm)),
      rank_(comm_->rank()),
      size_(comm_->size()),
      topology_(comm_->topology()),
      heartbeat_(SettingInt("MLSL_TF_HEARTBEAT_MS")),
      stall_warning_(SettingInt("MLSL_TF_STALL_WARNING_SECONDS")),
      stall_shutdown_(SettingInt("MLSL_TF_STALL_SHUTDOWN_SECONDS")),
      cache_capacity_(size_t(SettingInt("MLSL_TF_CACHE_CAPACITY"))),
      eager_bytes_(SettingInt("MLSL_TF_EAGER_BYTES")),
      spin_(SettingInt("MLSL_TF_SPIN_US")),
      timeline_(timeline ? std::move(timeline) : std::make_unique<Timeline>()),
      mark_cycles_(SettingFlag("MLSL_TF_TIMELINE_MARK_CYCLES")),
      options_(OptionsFromSettings()),
      default_wire_(WireFromSettings()),
      groups_(WorldGroup(comm_.get(), rank_, timeline_.get(), &stats_, options_)),
      coordinator_(size_),
      joined_before_(size_, false),
      results_([this] {
        auto r = std::make_shared<Results>();
        r->Record(timeline_->enabled());
        return r;
      }()),
      thread_([this] { Loop(); }) {}

Runtime::~Runtime() { Shutdown(); }

void Runtime::Submit(std::unique_ptr<Request> request) {
  stats_.Submitted();
  std::string refused;
  StatusCode code = StatusCode::kAborted;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_reason_.empty() && !stop_requested_) {
      incoming_.push_back(std::move(request));
    } else {
      refused = closed_reason_.empty() ? "mlsl_tf is shutting down" : closed_reason_;
      if (!closed_reason_.empty()) code = closed_code_;
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
  const int64_t nice = SettingInt("MLSL_TF_COMM_NICE");
  if (nice == 0) return;
  const pid_t tid = pid_t(syscall(SYS_gettid));
  if (setpriority(PRIO_PROCESS, id_t(tid), int(nice)) != 0) {
    Log(LogLevel::kInfo, "background thread keeps its priority (MLSL_TF_COMM_NICE=" + std::to_string(nice) +
                             " not permitted)");
  }
}

void Runtime::Loop() {
  pthread_setname_np(pthread_self(), "mlsl_tf_comm");  // as `top -H` and /proc show it
  SetLogRank(rank_);
  RaisePriority();
  {
    // The control message gets its own communicator: MPI runs the collectives of one
    // communicator in order, so on the data communicator it would wait behind every chunk.
    std::vector<int> everyone(size_);
    for (int r = 0; r < size_; ++r) everyone[r] = r;
    Status s = comm_->Split(everyone, &control_comm_);
    if (!s.ok()) Log(LogLevel::kWarning, "no separate control communicator (" + s.message() + ")");
  }
  int idle = 0;  // cycles in a row that moved nothing
  while (true) {
    TimelineChange* timeline_change = nullptr;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (incoming_.empty() && !stop_requested_ && !timeline_change_) {
        const bool idle_here = AllIdle();
        bool local_work = !pending_.empty() || join_ != nullptr || !idle_here;
        std::chrono::microseconds wait(0);
        if (!idle_here) {
          // transfers in flight: poll, or over a network sleep a little between tests
          wait = PollInterval();
        } else if (!local_work) {
          // Just finished something: the next request usually follows within microseconds,
          // so poll briefly before sleeping (an idle process still sleeps, a busy one does
          // not pay a wake-up per collective).
          const auto until = last_progress_ + spin_;
          while (incoming_.empty() && !stop_requested_ && !timeline_change_ &&
                 std::chrono::steady_clock::now() < until) {
            lock.unlock();
            std::this_thread::yield();
            lock.lock();
          }
          if (incoming_.empty()) wait = heartbeat_;
        } else if (idle >= 8) {
          // Waiting on peers: back off so two ranks waiting on each other do not spin.
          wait = std::min<std::chrono::microseconds>(std::chrono::microseconds(20 << std::min(idle - 8, 6)),
                                                     std::chrono::milliseconds(1));
        }
        if (wait.count() > 0) {
          cv_.wait_for(lock, wait, [this] { return !incoming_.empty() || stop_requested_ || timeline_change_; });
        }
      }
      timeline_change = timeline_change_;  // read under the lock this cycle takes anyway
    }
    if (timeline_change) ServeTimelineChange(timeline_change);
    if (mark_cycles_) timeline_->CycleStart(std::chrono::steady_clock::now());
    bool progress = false;
    if (!Cycle(&progress)) {
      EndTimeline();
      return;
    }
    idle = progress ? 0 : idle + 1;
    const auto now = std::chrono::steady_clock::now();
    if (progress) last_progress_ = now;
    if (timeline_->enabled()) {
      for (const Results::Event& e : results_->Drain()) timeline_->Instant(e.name, e.kind, "framework", e.at);
      timeline_->MaybeFlush(now);  // a reader sees the events within about one flush interval
    }
  }
}

std::string Runtime::GroupError(const Request& r) const {
  std::string what = std::string(OpTypeName(r.op)) + " '" + ShownName(r.name) + "'";
  if ((r.op == OpType::kAddGroup || r.op == OpType::kRemoveGroup) && r.group != 0) {
    return "mlsl_tf: " + what + " is collective over every rank; it cannot run in group " + std::to_string(r.group);
  }
  if (r.group < 0 || r.group >= int(groups_.size()) || groups_[r.group]->removed) {
    return "mlsl_tf: " + what + " names group " + std::to_string(r.group) +
           ", which does not exist (create it on every rank with mlsl_tf.Group(ranks) first)";
  }
  const Group& g = *groups_[r.group];
  if (!g.member()) {
    return "mlsl_tf: rank " + std::to_string(rank_) + " is not a member of group " + std::to_string(r.group) +
           " (ranks " + RankList(g.ranks) + "), so it cannot run " + what;
  }
  return "";
}

void Runtime::Intake(std::unique_ptr<Request> r) {
  if (r->op == OpType::kJoin) {
    if (join_) {
      r->done(Status::InvalidArgument("mlsl_tf: join is already pending on rank " + std::to_string(rank_)));
      return;
    }
    join_ = std::move(r);
    return;
  }
  std::string group_error = GroupError(*r);
  if (!group_error.empty()) {
    r->done(Status::InvalidArgument(group_error));
    return;
  }
  // Names are per group: the same program runs in every group (e.g. a model-parallel layer).
  if (r->group != 0) {
    int generation = groups_[r->group]->generation;
    r->name += " (group " + std::to_string(r->group) + (generation ? "." + std::to_string(generation) : "") + ")";
  }
  if (pending_.count(r->name)) {
    r->done(Status::InvalidArgument("mlsl_tf: a collective named '" + ShownName(r->name) + "' is already pending on rank " +
                                    std::to_string(rank_) + "; concurrent collectives need distinct names"));
    return;
  }
  Local local;
  local.submitted = std::chrono::steady_clock::now();
  local.meta = RequestMeta::From(*r);
  bool reduces = r->op == OpType::kAllreduce || r->op == OpType::kReducescatter;
  // Only float32 reductions are compressed, and never Adasum (an explicit wire is refused by ValidateLocally).
  if (!reduces || r->dtype != DataType::kFloat32 || (r->reduce_op == ReduceOp::kAdasum && r->wire < 0)) {
    local.meta.wire = r->dtype;
  } else if (r->wire < 0) {
    local.meta.wire = default_wire_;
  }
  if (!local.meta.compressed() || r->op != OpType::kAllreduce) local.meta.error_feedback = false;
  local.meta.local_error = ValidateLocally(*r, int(groups_[r->group]->ranks.size()));
  auto cached = cached_ids_.find(r->name);
  if (cached != cached_ids_.end() && local.meta.local_error.empty() && coordinator_.meta(cached->second) == local.meta) {
    local.state = Local::kReady;
    local.id = cached->second;
  }
  local.request = std::move(r);
  std::string name = local.request->name;
  pending_.emplace(name, std::move(local));
}

bool Runtime::Cycle(bool* progress) {
  std::deque<std::unique_ptr<Request>> incoming;
  bool stopping;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!drain_) incoming.swap(incoming_);  // draining: new requests wait a few cycles
    stopping = stop_requested_;
  }
  const uint64_t events_before = UnitEvents();
  *progress = !incoming.empty();
  for (auto& r : incoming) Intake(std::move(r));

  ControlMessage& m = message_;
  m = ControlMessage();
  m.joined.assign(size_, false);
  m.shut_down.assign(size_, false);
  if (join_) m.joined[rank_] = true;  // a joined rank is ready for everything
  if (stopping) m.shut_down[rank_] = true;
  m.busy = !AllIdle();
  m.waits = !pending_.empty() || join_;
  StallFlags(&m.stalled, &m.past_limit);
  const int32_t num_ids = coordinator_.num_ids();
  const int num_groups = int(groups_.size());
  m.ready.assign(Words(num_ids), join_ ? ~uint64_t(0) : 0);
  // Collectives of groups this rank is not in never wait for it.
  if (!join_) for (size_t w = 0; w < foreign_.size() && w < m.ready.size(); ++w) m.ready[w] |= foreign_[w];
  for (auto& [name, l] : pending_) {
    if (l.state == Local::kToAnnounce) m.announces = true;
    if (l.state == Local::kReady && !join_) m.SetReady(l.id);
  }
  m.units_done.assign(num_groups, ~uint64_t(0));
  for (int g = 0; g < num_groups; ++g) {
    if (groups_[g]->member()) m.units_done[g] = groups_[g]->scheduler->completed_prefix();
  }
  m.fingerprint = coordinator_.fingerprint();
  m.wanted_eager = FillEager(&m.eager);
  m.Encode(&words_);
  Communicator* control = control_comm_ ? control_comm_.get() : comm_.get();
  if (timeline_->enabled()) cycle_started_ = std::chrono::steady_clock::now();  // for the timeline only
  auto op = control->AllreduceWords(words_.data(), int64_t(words_.size()), &ControlMessage::Combine);
  Status s = Wait(op.get(), [this] {
    // chunks in flight keep moving while the control message travels
    for (auto& g : groups_) if (g->member()) g->scheduler->Progress();
    if (AllIdle()) return false;
    const auto pause = PollInterval();
    if (pause.count() > 0) std::this_thread::sleep_for(pause);
    return true;
  });
  if (!s.ok()) {
    Close("mlsl_tf: the background cycle failed: " + s.message(), StatusCode::kUnavailable);
    return false;
  }
  m.Decode(words_.data(), int64_t(words_.size()), size_);
  if (!m.agrees) {
    // Ids (ready bits, eager entries) would name different collectives on different ranks.
    Close("mlsl_tf: the ranks no longer agree on the ids of collective names (their caches of agreed names "
          "differ; is MLSL_TF_CACHE_CAPACITY the same on every rank?), so no collective can be paired safely");
    return false;
  }
  std::vector<int> gone;
  for (int r = 0; r < size_; ++r) if (r != rank_ && m.shut_down[r]) gone.push_back(r);
  if (!gone.empty()) {
    Close(std::string("mlsl_tf: rank") + (gone.size() > 1 ? "s " : " ") + RankList(gone) +
          " shut down, so collectives can no longer complete", StatusCode::kUnavailable);
    return false;
  }
  if (stopping) {
    Close("mlsl_tf has been shut down on rank " + std::to_string(rank_));
    return false;
  }
  if (m.stalled || m.past_limit) {
    if (!ReportStalls(m.past_limit)) return false;
  }

  std::vector<bool> joined(size_);
  bool all_joined = true;
  int newest = -1;
  for (int r = 0; r < size_; ++r) {
    joined[r] = m.joined[r];
    all_joined = all_joined && joined[r];
    if (joined[r] && !joined_before_[r]) newest = r;
  }
  if (newest >= 0) {
    last_joined_ = newest;
    *progress = true;
  }
  joined_before_ = joined;

  std::vector<int32_t> agreed;
  if (m.announces) {
    if (!Negotiate(joined, &agreed)) return false;
    stats_.NamesKnown(coordinator_.num_ids());
    *progress = true;
  }
  if (!all_joined) {
    for (int32_t id = 0; id < num_ids; ++id) {
      if (m.Ready(id) && !Foreign(id)) agreed.push_back(id);
    }
  }
  std::sort(agreed.begin(), agreed.end());
  ++cycle_;
  // Every rank has the same valid entries: those every rank contributed, reduced.
  std::vector<int32_t> eager;
  if (!FinishEager(m.eager.data(), int64_t(m.eager.size()), &eager)) return false;
  eager_words_ = m.wanted_eager;
  if (!eager.empty()) *progress = true;
  for (int32_t id : agreed) {
    coordinator_.Touch(id, cycle_);
    if (std::binary_search(eager.begin(), eager.end(), id)) continue;
    const RequestMeta& meta = coordinator_.meta(id);
    auto it = pending_.find(meta.name);
    Request* mine = nullptr;
    auto submitted = std::chrono::steady_clock::now();
    if (it != pending_.end() && it->second.id == id && it->second.state == Local::kReady) {
      it->second.state = Local::kScheduled;
      mine = it->second.request.get();
      submitted = it->second.submitted;
    }
    if (meta.op == OpType::kAddGroup || meta.op == OpType::kRemoveGroup) {
      ChangeGroups(meta, mine);
      continue;
    }
    if (meta.group >= int(groups_.size()) || !groups_[meta.group]->member()) continue;
    std::string name = meta.name;
    groups_[meta.group]->scheduler->Add(id, meta, mine, [this, name](const Status& st) { Finish(name, st); },
                                        submitted);
    if (mine) stats_.Request();
  }
  // Units completed on every member are common knowledge, so every member starts the same ones.
  for (int g = 0; g < num_groups; ++g) {
    Group& group = *groups_[g];
    if (!group.member()) continue;
    std::vector<bool> group_joined(group.ranks.size());
    for (size_t i = 0; i < group.ranks.size(); ++i) group_joined[i] = joined[group.ranks[i]];
    const uint64_t before = group.scheduler->started();
    group.scheduler->StartUpTo(m.units_done[g] + uint64_t(options_.inflight), group_joined, m.units_done[g]);
    group.scheduler->Progress();
    // Small transfers just started usually finish within microseconds: finishing them here
    // saves a control round trip before the framework sees the result.
    if (group.scheduler->started() != before) {
      const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(20);
      while (!group.scheduler->idle() && std::chrono::steady_clock::now() < until) group.scheduler->Progress();
    }
  }
  // Names are forgotten only when nothing anywhere refers to an id: no request waits or runs on
  // any rank and nothing was announced -- facts of the control message, so every rank forgets
  // the same names in the same cycle and the ids stay identical.
  // A program that keeps making names is rarely quiet between two of its requests, so when
  // there are too many names every rank holds back new requests for up to 4 cycles (at most
  // every 16 cycles) to let the requests already pending finish.
  const bool too_many = size_t(coordinator_.num_ids()) > cache_capacity_;
  if (too_many && !m.busy && !m.waits && !m.announces) {
    ForgetNames();
    drain_ = false;
  } else if (too_many && cycle_ >= next_drain_) {
    drain_ = true;  // for a few cycles: ranks finish the same collective a cycle or two apart
    next_drain_ = cycle_ + 16;
    drain_until_ = cycle_ + 4;
  } else if (cycle_ >= drain_until_) {
    drain_ = false;
  }
  // Join completes in the same cycle everywhere: all joined, nothing in flight anywhere and
  // nothing new -- all three facts come from the control message, so every rank sees them.
  if (all_joined && !m.announces && !m.busy) {
    FinishJoin(last_joined_);
    std::fill(joined_before_.begin(), joined_before_.end(), false);
    *progress = true;
  }
  *progress = *progress || UnitEvents() != events_before;
  return true;
}

void Runtime::ForgetNames() {
  const std::vector<int32_t> remap = coordinator_.Retire(cache_capacity_ / 2);
  std::unordered_map<std::string, int32_t> cached;
  for (const auto& [name, id] : cached_ids_) {
    if (id < int32_t(remap.size()) && remap[id] >= 0) cached[name] = remap[id];
  }
  cached_ids_.swap(cached);
  std::vector<uint64_t> foreign(Words(coordinator_.num_ids()), 0);
  for (int32_t old = 0; old < int32_t(remap.size()); ++old) {
    if (remap[old] >= 0 && Foreign(old)) SetBit(foreign, 0, remap[old]);
  }
  foreign_.swap(foreign);
  stats_.NamesForgotten(int64_t(std::count(remap.begin(), remap.end(), -1)));
  stats_.NamesKnown(coordinator_.num_ids());
}

void Runtime::ChangeGroups(const RequestMeta& meta, Request* mine) {
  Status status;
  int32_t result = 0;
  if (meta.op == OpType::kAddGroup) {
    auto g = std::make_unique<Group>();
    g->ranks.assign(meta.ranks.begin(), meta.ranks.end());
    auto at = std::find(g->ranks.begin(), g->ranks.end(), rank_);
    status = comm_->Split(g->ranks, &g->own);
    if (at != g->ranks.end() && status.ok()) {
      g->index = int(at - g->ranks.begin());
      g->comm = g->own.get();
      Equip(g.get(), timeline_.get(), &stats_, options_);
    }
    // As Horovod: the lowest id no live group has. A reused id's collectives get names of their
    // own generation, so no name the removed group agreed on is taken for one of the new group.
    result = 1;
    while (result < int32_t(groups_.size()) && !groups_[result]->removed) ++result;
    coordinator_.SetGroup(result, g->ranks);
    if (result < int32_t(groups_.size())) {
      g->generation = groups_[result]->generation + 1;
      groups_[result] = std::move(g);
    } else {
      groups_.push_back(std::move(g));
    }
  } else {
    int32_t id = meta.root;
    if (id <= 0 || id >= int32_t(groups_.size()) || groups_[id]->removed) {
      status = Status::InvalidArgument("mlsl_tf: remove_group: group " + std::to_string(id) + " does not exist" +
                                       (id == 0 ? " (group 0, the world, cannot be removed)" : ""));
    } else {
      Group& g = *groups_[id];
      if (g.member()) {
        g.scheduler->FailAll(Status::Aborted("mlsl_tf: group " + std::to_string(id) +
                                             " was removed (the collective did not complete)"));
      }
      g.removed = true;
      // The communicator and scheduler stay alive: MPI may still hold their buffers.
      auto keep = std::make_unique<Group>();
      keep->own = std::move(g.own);
      keep->executor = std::move(g.executor);
      keep->scheduler = std::move(g.scheduler);
      removed_groups_.push_back(std::move(keep));
      g.comm = nullptr;
      result = id;
    }
  }
  if (!mine) return;
  void* out = nullptr;
  if (status.ok()) status = mine->allocate_output(0, Shape{}, &out);
  if (status.ok() && out) *static_cast<int32_t*>(out) = result;
  Finish(meta.name, status);
}

bool Runtime::Negotiate(const std::vector<bool>& joined, std::vector<int32_t>* agreed) {
  std::vector<RequestMeta> mine;
  for (auto& [name, l] : pending_) {
    if (l.state == Local::kToAnnounce) {
      mine.push_back(l.meta);
      l.state = Local::kAnnounced;
    }
  }
  std::string payload;
  SerializeMetas(mine, &payload);
  std::vector<int64_t> sizes;
  std::string all;
  Status s = AllgatherStrings(comm_.get(), payload, &sizes, &all);
  if (!s.ok()) {
    Close("mlsl_tf: negotiation failed: " + s.message());
    return false;
  }
  int64_t offset = 0;
  for (int r = 0; r < size_; ++r) {
    std::vector<RequestMeta> metas;
    if (!ParseMetas(all.data() + offset, sizes[r], &metas)) {
      Close("mlsl_tf: internal error: could not parse the announcements of rank " + std::to_string(r));
      return false;
    }
    offset += sizes[r];
    for (RequestMeta& m : metas) coordinator_.Announce(r, std::move(m));
  }
  for (const Decision& d : coordinator_.Resolve(joined)) {
    auto it = pending_.find(d.name);
    switch (d.kind) {
      case Decision::kInvalidate:
        cached_ids_.erase(d.name);
        if (it != pending_.end() && it->second.state == Local::kReady) {
          it->second.state = Local::kToAnnounce;
          it->second.id = -1;
        }
        break;
      case Decision::kError:
        cached_ids_.erase(d.name);
        // As Horovod: an invalid input is InvalidArgument (on every rank); submissions that
        // disagree between ranks are FailedPrecondition
        if (it != pending_.end() && it->second.state == Local::kAnnounced) {
          Finish(d.name, d.invalid_input ? Status::InvalidArgument(d.error) : Status::FailedPrecondition(d.error));
        }
        break;
      case Decision::kAgreed: {
        const RequestMeta& meta = coordinator_.meta(d.id);
        if (int32_t(foreign_.size()) < Words(d.id + 1)) foreign_.resize(Words(d.id + 1), 0);
        bool foreign = meta.group > 0 && meta.group < int(groups_.size()) && !groups_[meta.group]->member();
        foreign ? SetBit(foreign_, 0, d.id) : ClearBit(foreign_, 0, d.id);
        cached_ids_[d.name] = d.id;
        if (it != pending_.end() && it->second.state == Local::kAnnounced) {
          it->second.state = Local::kReady;
          it->second.id = d.id;
        }
        agreed->push_back(d.id);
        break;
      }
    }
  }
  return true;
}

void Runtime::Finish(const std::string& name, const Status& s) {
  auto it = pending_.find(name);
  std::unique_ptr<Request> r = std::move(it->second.request);
  pending_.erase(it);
  r->done(s);
}

void Runtime::FinishJoin(int last_rank) {
  if (!join_) return;
  std::unique_ptr<Request> r = std::move(join_);
  void* out = nullptr;
  Status s = r->allocate_output(0, Shape{}, &out);
  if (s.ok() && out) *static_cast<int32_t*>(out) = last_rank;
  r->done(s);
}

void Runtime::Close(const std::string& reason, StatusCode code) {
  std::deque<std::unique_ptr<Request>> incoming;
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_reason_ = reason;
    closed_code_ = code;
    incoming.swap(incoming_);
  }
  for (auto& g : groups_) {
    if (g->member()) g->scheduler->FailAll(Status::WithCode(code, reason + " (the collective did not complete)"));
  }
  std::vector<std::unique_ptr<Request>> failed;
  for (auto& r : incoming) failed.push_back(std::move(r));
  for (auto& [name, l] : pending_) failed.push_back(std::move(l.request));
  pending_.clear();
  if (join_) failed.push_back(std::move(join_));
  for (auto& r : failed) {
    std::string what = r->op == OpType::kJoin ? "join" : "collective '" + ShownName(r->name) + "'";
    r->done(Status::WithCode(code, reason + " (" + what + " did not complete)"));
  }
}

}  // namespace mlsl
