// EagerPath (eager_path.h).
#include "eager_path.h"

#include <algorithm>
#include <cstring>
#include <new>

#include "operations.h"
#include "reduce.h"

namespace mlsl {

EagerPath::EagerPath(int64_t bytes, int rank, int size, Timeline* timeline, Stats* stats)
    : bytes_(bytes), rank_(rank), size_(size), timeline_(timeline), stats_(stats) {}

bool EagerPath::Rides(const PendingRequest& p) const {
  OperationFacts f = FactsOf(p.meta);
  f.eager_bytes = bytes_;
  return ChooseRequest(f) == Way::kEager && p.request->inputs.size() == p.meta.shapes.size();
}

int64_t EagerPath::Fill(const PendingTable& pending, FailureNote* failure, std::vector<uint64_t>* region) const {
  region->assign(size_t(words_), ~uint64_t(0));
  const int64_t end = words_;
  int64_t at = 0;
  if (at < end) (*region)[at] = 0;
  if (pending.joining()) return 0;  // a joined rank contributes nothing, so nothing rides along
  // Every small allreduce pending here asks for room (one that is being negotiated or reduced
  // now will likely come back next step); only the ready ones ride along.
  std::vector<std::pair<int32_t, const PendingRequest*>> ready;
  int64_t wanted = 0, budget = bytes_;
  for (const auto& [name, p] : pending.table()) {
    if (!Rides(p)) continue;
    const int64_t bytes = Elements(p.meta) * int64_t(DataTypeSize(p.meta.dtype));
    if (bytes > budget) continue;
    budget -= bytes;
    wanted += EagerEntryWords(bytes);
    if (p.state == PendingRequest::kReady) ready.emplace_back(p.id, &p);
  }
  std::sort(ready.begin(), ready.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [id, p] : ready) {
    const RequestMeta& m = p->meta;
    // Its output first: one this rank cannot allocate fails the allreduce on every rank -- noted
    // before this cycle's message goes out (the cycle's failed flag), and it stays out of it.
    if (!failure->empty() || !AllocateOutputs(*p, failure)) continue;
    const size_t esize = DataTypeSize(m.dtype);
    const int64_t count = Elements(m), bytes = count * int64_t(esize);
    char* data = static_cast<char*>(PutEager(region->data(), end, &at, id, m.dtype, m.reduce_op, count));
    if (!data) continue;  // next cycle's region is made for it
    for (const TensorInput& t : p->request->inputs) {
      const size_t n = size_t(NumElements(t.shape)) * esize;
      if (n) std::memcpy(data, t.data, n);
      data += n;
    }
    if (m.prescale != 1.0) ScaleInPlace(data - bytes, count, m.dtype, m.prescale);
  }
  // Nothing pending (a heartbeat cycle, or waiting for a slower rank): keep the region as it is,
  // so a pause between two steps does not cost the next step its ride.
  if (pending.empty()) return words_;
  return wanted ? wanted + 1 : 0;
}

bool EagerPath::AllocateOutputs(const PendingRequest& p, FailureNote* failure) const {
  Request* r = p.request.get();
  for (size_t i = 0; i < r->inputs.size(); ++i) {
    void* out = nullptr;
    Status s;
    try {
      s = r->Output(int(i), r->inputs[i].shape, &out);
      if (!s.ok()) s = Status::Internal("could not allocate its output: " + s.message());
    } catch (const std::bad_alloc&) {
      s = Status::Internal("out of memory on this rank");
    }
    if (!s.ok()) {
      failure->Set("rank " + std::to_string(rank_) + ": allreduce '" + ShownName(p.meta.name) + "' failed: " + s.message());
      return false;
    }
  }
  return true;
}

std::string EagerPath::Finish(const std::vector<uint64_t>& region, const Coordinator& names, PendingTable* pending,
                              Clock::time_point cycle_started, Clock::time_point now, std::vector<int32_t>* ids) const {
  for (const EagerEntry& e : ValidEager(region.data(), int64_t(region.size()))) {
    // Every rank contributed it, this one too, so it is here and ready under this id -- unless
    // the ranks' ids disagree, which must end in an error, never in another tensor's data.
    const bool known = e.id >= 0 && e.id < names.num_ids();
    PendingRequest* p = known ? pending->Find(names.meta(e.id).name) : nullptr;
    if (!p || p->id != e.id || p->state != PendingRequest::kReady || p->meta.dtype != e.dtype ||
        Elements(p->meta) != e.count) {
      return "mlsl_tf: a small allreduce came back under id " + std::to_string(e.id) +
             (known ? " ('" + ShownName(names.meta(e.id).name) + "' on this rank)" : std::string()) +
             ", which no collective of rank " + std::to_string(rank_) + " is waiting under: the ranks' ids of "
             "collective names differ";
    }
    ids->push_back(e.id);
    const RequestMeta& meta = names.meta(e.id);
    pending->Finish(meta.name, FinishOne(e, meta, p, cycle_started, now));
  }
  std::sort(ids->begin(), ids->end());
  return "";
}

Status EagerPath::FinishOne(const EagerEntry& e, const RequestMeta& meta, PendingRequest* p,
                            Clock::time_point cycle_started, Clock::time_point now) const {
  Request* r = p->request.get();
  const size_t esize = DataTypeSize(meta.dtype);
  const double post = meta.reduce_op == ReduceOp::kAverage ? meta.postscale / size_ : meta.postscale;
  const char* src = static_cast<const char*>(e.data);
  Status s;
  for (size_t i = 0; i < r->inputs.size() && s.ok(); ++i) {
    const int64_t count = NumElements(r->inputs[i].shape);
    void* out = nullptr;
    s = r->Output(int(i), r->inputs[i].shape, &out);
    if (s.ok() && count) {
      std::memcpy(out, src, size_t(count) * esize);
      ScaleInPlace(out, count, meta.dtype, post);
    }
    src += count * esize;
  }
  stats_->Request();
  stats_->Eager();
  stats_->Ran(WayName(Way::kEager));
  if (timeline_->enabled()) {
    // The reduction rode in this cycle's control message: negotiated and done in one round.
    timeline_->Instant(ShownName(meta.name), "eager", "queue", now);
    timeline_->HorovodNegotiation(meta.name, OpTypeName(meta.op), p->submitted, cycle_started);
    timeline_->HorovodOp(meta.name, OpTypeName(meta.op), cycle_started, cycle_started, now);
  }
  return s;
}

}  // namespace mlsl
