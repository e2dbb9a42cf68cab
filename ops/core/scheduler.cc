// Scheduler (scheduler.h).
#include "scheduler.h"

#include <algorithm>
#include <cstring>
#include <new>

#include "memory.h"
#include "p2p_algorithms.h"
#include "reduce.h"
#include "scheduler_work.h"
#include "wire.h"

namespace mlsl {

Scheduler::Scheduler(Communicator* comm, Timeline* timeline, Stats* stats, SchedulerOptions options)
    : comm_(comm), timeline_(timeline), stats_(stats), options_(options), slots_(comm, options.Slots()) {}

// The transfers go first: they may use the works' buffers and the slots' communicators.
Scheduler::~Scheduler() {
  broken_.clear();
  inflight_.clear();
}

void Scheduler::Add(int32_t id, const RequestMeta& meta, Request* request, Finish finish, Clock::time_point submitted,
                    Clock::time_point now) {
  now_ = now;
  auto w = std::make_unique<Work>();
  w->meta = meta;
  w->order = order_++;
  // An eager allreduce that missed its ride (not ready on every rank in time) runs as chunks.
  w->way = ChooseRequest(FactsOf(meta));
  w->chunked = w->way == Way::kChunks || w->way == Way::kEager;
  w->total = Elements(meta);
    Part p{id, meta.name, request, std::move(finish), 0, w->total, {}, submitted, Now()};
  if (request && timeline_->enabled()) {
    timeline_->Span(meta.name, "negotiate", "negotiation", submitted, p.agreed);
    timeline_->HorovodNegotiation(meta.name, OpTypeName(meta.op), submitted, p.agreed);
  }
  w->parts.push_back(std::move(p));
  Insert(std::move(w));
}

void Scheduler::Insert(std::unique_ptr<Work> w) {
  auto before = [this](const std::unique_ptr<Work>& a, const std::unique_ptr<Work>& b) {
    if (options_.fifo) return a->order < b->order;
    if (a->meta.priority != b->meta.priority) return a->meta.priority < b->meta.priority;
    return a->parts[0].id < b->parts[0].id;
  };
  auto at = std::upper_bound(queue_.begin(), queue_.end(), w, before);
  queue_.insert(at, std::move(w));
}

std::vector<std::unique_ptr<Scheduler::Work>>::iterator Scheduler::Queued(const Work* w) {
  return std::find_if(queue_.begin(), queue_.end(), [w](const std::unique_ptr<Work>& a) { return a.get() == w; });
}

void Scheduler::Fuse(Work* head) {
  // Error feedback is never fused: the rank that reduces an element keeps its output residual,
  // and in a fused buffer which rank that is depends on what else was ready at the time. A
  // tensor alone is sliced the same way every step, so its residuals return to the same rank.
  if (options_.fusion_threshold <= 0 || !head->chunked || head->bytes() > options_.fusion_threshold ||
      head->meta.error_feedback)
    return;
  int64_t bytes = head->bytes();
  auto self = Queued(head);
  for (auto it = self + 1; it != queue_.end();) {
    Work* w = it->get();
    if (w->prepared || !FuseTogether(head->meta, w->meta) || bytes + w->bytes() > options_.fusion_threshold) {
      if (options_.fifo) break;  // first come, first served: nothing jumps over a tensor it cannot join
      ++it;
      continue;
    }
    for (Part& p : w->parts) {
      p.offset = head->total;
      head->total += Elements(w->meta);
      head->parts.push_back(std::move(p));
    }
    bytes += w->bytes();
    it = queue_.erase(it);
  }
  if (head->parts.size() > 1) stats_->Fused(int(head->parts.size()));
}

// Allocates outputs and fills the buffer the chunks reduce: the output itself for a single
// tensor, otherwise a packed buffer; a joined rank's parts hold the identity.
void Scheduler::Prepare(Work* w) {
  w->prepared = true;
  stats_->Ran(WayName(Way::kChunks));
  w->first_start = Now();
  const size_t esize = DataTypeSize(w->meta.dtype);
  for (Part& p : w->parts) {
    if (!p.request) continue;
    for (size_t i = 0; i < p.request->inputs.size(); ++i) {
      void* out = nullptr;
      Status s = p.request->Output(int(i), p.request->inputs[i].shape, &out);
      if (!s.ok()) {
        FailHere(*w, Status::WithCode(s.code(), "could not allocate its output: " + s.message()));
        return;
      }
      // A fresh output (not the forwarded input) is not touched yet: let it fault in huge pages.
      if (out && out != p.request->inputs[i].data) AdviseHugePages(out, NumElements(p.request->inputs[i].shape) * esize);
      p.outputs.push_back(out);
    }
    stats_->Wait(w->meta.priority, std::chrono::duration<double>(w->first_start - p.agreed).count());
    if (timeline_->enabled()) timeline_->Span(p.name, "queue", "queue", p.agreed, w->first_start);
  }
  bool direct = w->parts.size() == 1 && w->parts[0].request && w->parts[0].outputs.size() == 1 &&
                (w->parts[0].outputs[0] || w->total == 0);
  if (direct) {
    w->buf = static_cast<char*>(w->parts[0].outputs[0]);
  } else {
    w->own = spare_.Take(size_t(w->total) * esize);
    w->buf = w->own.data();
  }
  if (direct && w->meta.prescale == 1.0) {
    // The collective reads the input and writes the output: no copy.
    w->src = static_cast<const char*>(w->parts[0].request->inputs[0].data);
    if (w->src == w->buf) stats_->InPlace();
  }
  if (!w->src) {
    for (Part& p : w->parts) {
      char* dst = w->buf + p.offset * esize;
      if (!p.request) {
        FillIdentity(dst, p.count, w->meta.dtype, w->meta.reduce_op);
        continue;
      }
      int64_t n = 0;
      for (const TensorInput& t : p.request->inputs) {
        size_t bytes = NumElements(t.shape) * esize;
        if (bytes && dst + n * esize != t.data) std::memcpy(dst + n * esize, t.data, bytes);
        n += NumElements(t.shape);
      }
      ScaleInPlace(dst, n, w->meta.dtype, w->meta.prescale);
    }
  }
  if (w->meta.error_feedback) {  // only ever set on compressed allreduces (Runtime::Intake)
    w->res_in.assign(w->total, 0.0f);
    w->res_out.assign(w->total, 0.0f);
    for (Part& p : w->parts) {
      if (p.request) residuals_.Load(p.name, p.count, w->res_in.data() + p.offset, w->res_out.data() + p.offset);
    }
  }
}

void Scheduler::StartChunk(Work* w) {
  const size_t esize = DataTypeSize(w->meta.dtype);
  // A chunk is chunk_bytes on the wire (a bf16 chunk holds twice the float32 elements).
  const bool compressed = w->meta.compressed();
  const int64_t wire_size = compressed ? int64_t(WireElementSize(w->meta.wire)) : int64_t(esize);
  int64_t per_chunk = std::max<int64_t>(1, options_.chunk_bytes / wire_size);
  int64_t n = std::min(per_chunk, w->total - w->next);
  auto unit = std::make_unique<Unit>();
  unit->seq = ledger_.Start();
  unit->work = w;
  unit->bytes = n * int64_t(esize);
  unit->chunk = w->chunks++;
  unit->start = Now();
  // Each in-flight slot has its own communicator (slot_set.h).
  const int slot_index = int(unit->seq % uint64_t(options_.Slots()));
  Communicator* slot = slots_.Get(slot_index);
  const Way way = ChooseChunk(FactsOf(w->meta, n * int64_t(esize), options_.one_host, options_.ring_bytes));
  if (way == Way::kWireAllreduce) {
    float* data = reinterpret_cast<float*>(w->buf) + w->next;
    const float* in = w->src ? reinterpret_cast<const float*>(w->src) + w->next : data;
    float* res_in = w->res_in.empty() ? nullptr : w->res_in.data() + w->next;
    float* res_out = w->res_out.empty() ? nullptr : w->res_out.data() + w->next;
    // The slot's previous unit has completed (the window never lets more than `slots` run).
    // The average's division and the postscale happen on each rank's slice inside (Finalize skips them).
    unit->op = slot ? StartWireAllreduce(slot, in, data, n, w->meta.wire, w->meta.reduce_op,
                                         slots_.scratch(slot_index), res_in, res_out, PostFactor(*w))
                    : nullptr;
    unit->bytes = n * int64_t(WireElementSize(w->meta.wire));
  } else if (way == Way::kRingAllreduce) {
    // The average's division and the postscale too, to the segment each rank reduced.
    unit->op = slot ? MakeRingAllreduce(slot, slot->NextTag(), w->buf + w->next * esize, n, w->meta.dtype,
                                        w->meta.reduce_op, w->src ? w->src + w->next * esize : nullptr,
                                        PostFactor(*w), slots_.ring_pool())
                    : nullptr;
  } else {
    // The average's division and the postscale too: the communicator applies them as each chunk
    // completes, so Finalize does not.
    unit->op = slot ? slot->Allreduce(w->buf + w->next * esize, n, w->meta.dtype, w->meta.reduce_op,
                                      w->src ? w->src + w->next * esize : nullptr, PostFactor(*w),
                                      way == Way::kNativeAllreduce)
                    : nullptr;
  }
  w->last_seq = unit->seq;
  w->next += n;
  w->outstanding++;
  stats_->Chunk(unit->bytes, WayName(way));
  inflight_.push_back(std::move(unit));
}

size_t Scheduler::Startable(const std::vector<bool>& joined, uint64_t common_done) {
  for (size_t i = 0; i < queue_.size();) {
    Work* w = queue_[i].get();
    if (w->chunked) return i;
    if (!w->algo) {
      Part& p = w->parts[0];
      int64_t piece = std::max<int64_t>(1, std::min(options_.chunk_bytes, comm_->max_message_bytes()));
      starting_ = w;
      w->algo = MakeAlgorithm(w->way, w->meta, p.request, joined, comm_->rank(), comm_->size(), piece);
      stats_->Ran(WayName(w->way));
      if (!w->algo->local_failure().ok()) {
        FailHere(*w, LocalFailure(w->algo->local_failure()));
        return queue_.size();
      }
      w->prepared = true;
      w->first_start = Now();
      if (p.request) {
        stats_->Wait(w->meta.priority, std::chrono::duration<double>(w->first_start - p.agreed).count());
        if (timeline_->enabled()) timeline_->Span(p.name, "queue", "queue", p.agreed, w->first_start);
      }
      if (w->algo->started_all()) {  // failed on agreed facts, or nothing to move: no piece at all
        Activate(i);
        FinishPieces(w);
        continue;
      }
    }
    if (w->synced || w->sync_seq < common_done) return i;
    ++i;  // waits for its previous piece on every rank; what is behind it may go
  }
  return queue_.size();
}

void Scheduler::Activate(size_t at) {
  active_.push_back(std::move(queue_[at]));
  queue_.erase(queue_.begin() + std::ptrdiff_t(at));
}

void Scheduler::StartPiece(size_t at) {
  Work* w = queue_[at].get();
  auto unit = std::make_unique<Unit>();
  unit->seq = ledger_.Start();
  unit->work = w;
  unit->chunk = w->chunks++;
  unit->start = Now();
  unit->bytes = 0;
  Communicator* slot = slots_.Get(int(unit->seq % uint64_t(options_.Slots())));
  bool sync = false;
  if (slot) {
    unit->error = w->algo->Next(slot, &unit->op, &sync, &unit->bytes);
    if (unit->error.ok() && !unit->op) unit->error = Status::Internal("an algorithm piece started nothing");
    if (!w->algo->local_failure().ok()) FailHere(*w, LocalFailure(w->algo->local_failure()));
  } else {
    unit->error = slots_.error();
  }
  w->synced = !sync;
  w->sync_seq = unit->seq;
  w->last_seq = unit->seq;
  w->outstanding++;
  inflight_.push_back(std::move(unit));
  if (w->algo->started_all()) Activate(at);
}

void Scheduler::StartUpTo(Clock::time_point now, uint64_t limit, const std::vector<bool>& joined,
                          uint64_t common_done) {
  now_ = now;
  if (common_done != UINT64_MAX) ledger_.Agree(common_done);
  common_done = ledger_.agreed_done();
  starting_ = nullptr;
  try {
    StartUnits(limit, joined, common_done);
  } catch (const std::bad_alloc&) {
    // Buffers, scratch, the units' own bookkeeping: this rank's alone, as a failed output is.
    const Status s = Status::Internal("out of memory on this rank");
    if (starting_) FailHere(*starting_, s);
    else failure_ = s;
  }
  starting_ = nullptr;
}

Status Scheduler::LocalFailure(const Status& s) {
  return Status::WithCode(s.code(), "could not allocate its output: " + s.message());
}

void Scheduler::StartUnits(uint64_t limit, const std::vector<bool>& joined, uint64_t common_done) {
  // A failure here is out of step with the peers: nothing more starts, the owner closes.
  while (failure_.ok() && ledger_.started() < limit && !queue_.empty()) {
    const size_t at = Startable(joined, common_done);  // the one walk: `at` stays head's place
    if (at == queue_.size()) break;
    Work* head = queue_[at].get();
    starting_ = head;
    if (!head->prepared) {
      Fuse(head);  // takes only works behind head out of the queue
      Prepare(head);
      if (!failure_.ok()) return;
    }
    if (last_started_ && last_started_ != head && last_started_->unfinished()) {
      stats_->Preemption();
      if (timeline_->enabled()) {
        timeline_->Instant("preempted by " + head->label(), "preempt", "queue", Now(),
                           "{\"tensor\": \"" + JsonEscape(last_started_->label()) + "\"}");
      }
    }
    last_started_ = head;
    if (!head->chunked) {
      StartPiece(at);
      continue;
    }
    StartChunk(head);
    if (head->next == head->total) Activate(at);
  }
}

std::chrono::microseconds Scheduler::PollInterval() const {
  int64_t bytes = 0;
  for (const auto& u : inflight_) bytes += u->bytes;
  return options_.one_host ? std::chrono::microseconds(0) : pacer_.Interval(bytes);
}

void Scheduler::Progress(Clock::time_point now) {
  now_ = now;
  pacer_.Poll(Now(), !inflight_.empty());
  for (size_t i = 0; i < inflight_.size();) {
    Unit* u = inflight_[i].get();
    bool done = false;
    Status s = u->op ? u->op->Test(&done) : (u->error.ok() ? slots_.error() : u->error);
    if (!s.ok()) {
      Broke(i, s);
      continue;
    }
    if (!done) {
      ++i;
      continue;
    }
    Work* w = u->work;
    if (timeline_->enabled()) {
      timeline_->Span(w->label(), "chunk", "inflight " + std::to_string(u->seq % uint64_t(options_.Slots())), u->start,
                      Now(),
                      "{\"bytes\": " + std::to_string(u->bytes) + ", \"chunk\": " + std::to_string(u->chunk) +
                          ", \"priority\": " + std::to_string(w->meta.priority) + "}");
    }
    pacer_.Completed(u->bytes);
    ledger_.Complete(u->seq);
    const int chunk = u->chunk;
    inflight_.erase(inflight_.begin() + i);  // u is gone
    if (w->algo) w->algo->PieceDone(chunk);
    if (--w->outstanding == 0 && !w->unfinished()) settling_.push_back(w);
  }
  if (!settling_.empty()) Release();
}

void Scheduler::Release() {
  // A collective whose units all completed here may still fail on a peer (its last receive, an
  // output it could not allocate); it finishes only when every rank's completed prefix covers
  // it, a fact of the control message that also carries any rank's failure -- so no rank
  // returns success for a collective that fails on another. A failure here since that message
  // is of later units: what it agreed still finishes, as it does on every peer.
  const uint64_t agreed = ledger_.agreed_done();
  size_t kept = 0;
  for (size_t i = 0; i < settling_.size(); ++i) {
    Work* w = settling_[i];
    if (w->last_seq >= agreed) {
      settling_[kept++] = w;
    } else if (w->algo) {
      FinishPieces(w);
    } else {
      Finalize(w);
    }
  }
  settling_.resize(kept);
}

void Scheduler::FailHere(const Work& w, const Status& s) {
  if (failure_.ok()) {
    failure_ = Status::WithCode(s.code(), std::string(OpTypeName(w.meta.op)) + " '" + ShownName(w.label()) +
                                              "' failed: " + s.message());
  }
}

void Scheduler::Broke(size_t i, const Status& s) {
  FailHere(*inflight_[i]->work, s);
  broken_.push_back(std::move(inflight_[i]));
  inflight_.erase(inflight_.begin() + i);
}

double Scheduler::PostFactor(const Work& w) const {
  return w.meta.reduce_op == ReduceOp::kAverage ? w.meta.postscale / comm_->size() : w.meta.postscale;
}

void Scheduler::Finalize(Work* w) {
  const size_t esize = DataTypeSize(w->meta.dtype);
  const double post = w->chunked ? 1.0 : PostFactor(*w);  // an allreduce's chunks scaled their own results
  for (Part& p : w->parts) {
    if (!p.request) continue;
    char* src = w->buf + p.offset * esize;
    int64_t n = 0;
    for (size_t i = 0; i < p.request->inputs.size(); ++i) {
      int64_t count = NumElements(p.request->inputs[i].shape);
      ScaleInPlace(src + n * esize, count, w->meta.dtype, post);
      if (count && p.outputs[i] != src + n * esize) std::memcpy(p.outputs[i], src + n * esize, count * esize);
      n += count;
    }
    if (!w->res_in.empty()) residuals_.Keep(p.name, p.count, w->res_in.data() + p.offset, w->res_out.data() + p.offset);
    if (timeline_->enabled()) {
      const auto done = Now();
      timeline_->Instant(p.name, "done", "queue", done);
      timeline_->HorovodOp(p.name, OpTypeName(w->meta.op), p.agreed, w->first_start, done);
    }
    p.finish(Status::Ok());
  }
  spare_.Give(std::move(w->own));
  Retire(w);
}

void Scheduler::FinishPieces(Work* w) {
  Status s = w->algo->Finish();
  Part& p = w->parts[0];
  if (timeline_->enabled() && p.request) {
    const auto done = Now();
    timeline_->Span(p.name, OpTypeName(w->meta.op), "collective", w->first_start, done);
    timeline_->HorovodOp(p.name, OpTypeName(w->meta.op), p.agreed, w->first_start, done);
  }
  if (p.request) p.finish(s);
  Retire(w);
}

// Only fully started works finish, and those have moved to active_.
void Scheduler::Retire(Work* w) {
  if (last_started_ == w) last_started_ = nullptr;
  active_.erase(std::find_if(active_.begin(), active_.end(), [w](const std::unique_ptr<Work>& a) { return a.get() == w; }));
}

void Scheduler::FailAll(const Status& status) {
  // In-flight MPI operations cannot be cancelled portably; the buffers they use stay alive
  // with this scheduler, and the requests are failed now.
  std::vector<std::unique_ptr<Work>> all;
  for (auto& w : queue_) all.push_back(std::move(w));
  for (auto& w : active_) all.push_back(std::move(w));
  queue_.clear();
  active_.clear();
  settling_.clear();
  for (auto& w : all) {
    for (Part& p : w->parts) if (p.request) p.finish(status);
    for (Part& p : w->parts) p.request = nullptr;
  }
  orphans_.insert(orphans_.end(), std::make_move_iterator(all.begin()), std::make_move_iterator(all.end()));
  last_started_ = nullptr;
}

}  // namespace mlsl
