// Engine's eager allreduces (eager.h): which pending requests may ride in the control message,
// writing this rank's ready ones into it, and finishing those every rank contributed.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <new>
#include <vector>

#include "eager.h"
#include "engine.h"
#include "reduce.h"

namespace mlsl {

bool Engine::Eager(const Local& l) const {
  const RequestMeta& m = l.meta;
  return options_.eager_bytes > 0 && m.op == OpType::kAllreduce && m.group == 0 && !m.compressed() &&
         !m.error_feedback && m.reduce_op != ReduceOp::kAdasum && l.request->inputs.size() == m.shapes.size() &&
         Elements(m) * int64_t(DataTypeSize(m.dtype)) <= options_.eager_bytes;
}

int64_t Engine::FillEager(std::vector<uint64_t>* region) {
  region->assign(size_t(eager_words_), ~uint64_t(0));
  const int64_t end = eager_words_;
  int64_t at = 0;
  if (at < end) (*region)[at] = 0;
  if (join_) return 0;  // a joined rank contributes nothing, so nothing rides along
  // Every small allreduce pending here asks for room (one that is being negotiated or reduced
  // now will likely come back next step); only the ready ones ride along.
  std::vector<std::pair<int32_t, const Local*>> ready;
  int64_t wanted = 0, budget = options_.eager_bytes;
  for (const auto& [name, l] : pending_) {
    if (!Eager(l)) continue;
    const int64_t bytes = Elements(l.meta) * int64_t(DataTypeSize(l.meta.dtype));
    if (bytes > budget) continue;
    budget -= bytes;
    wanted += EagerEntryWords(bytes);
    if (l.state == Local::kReady) ready.emplace_back(l.id, &l);
  }
  std::sort(ready.begin(), ready.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [id, l] : ready) {
    const RequestMeta& m = l->meta;
    // Its output first: one this rank cannot allocate fails the allreduce on every rank -- noted
    // before this cycle's message goes out (the cycle's failed flag), and it stays out of it.
    if (!failure_.empty() || !AllocateOutputs(*l)) continue;
    const size_t esize = DataTypeSize(m.dtype);
    const int64_t count = Elements(m), bytes = count * int64_t(esize);
    char* data = static_cast<char*>(PutEager(region->data(), end, &at, id, m.dtype, m.reduce_op, count));
    if (!data) continue;  // next cycle's region is made for it
    for (const TensorInput& t : l->request->inputs) {
      const size_t n = size_t(NumElements(t.shape)) * esize;
      if (n) std::memcpy(data, t.data, n);
      data += n;
    }
    if (m.prescale != 1.0) ScaleInPlace(data - bytes, count, m.dtype, m.prescale);
  }
  // Nothing pending (a heartbeat cycle, or waiting for a slower rank): keep the region as it is,
  // so a pause between two steps does not cost the next step its ride.
  if (pending_.empty()) return eager_words_;
  return wanted ? wanted + 1 : 0;
}

bool Engine::AllocateOutputs(const Local& l) {
  Request* r = l.request.get();
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
      failure_ = "rank " + std::to_string(rank_) + ": allreduce '" + ShownName(l.meta.name) + "' failed: " + s.message();
      return false;
    }
  }
  return true;
}

bool Engine::FinishEager(const std::vector<uint64_t>& region, std::vector<int32_t>* ids) {
  for (const EagerEntry& e : ValidEager(region.data(), int64_t(region.size()))) {
    // Every rank contributed it, this one too, so it is here and ready under this id -- unless
    // the ranks' ids disagree, which must end in an error, never in another tensor's data.
    const bool known = e.id >= 0 && e.id < coordinator_.num_ids();
    auto it = known ? pending_.find(coordinator_.meta(e.id).name) : pending_.end();
    if (it == pending_.end() || it->second.id != e.id || it->second.state != Local::kReady ||
        it->second.meta.dtype != e.dtype || Elements(it->second.meta) != e.count) {
      Close("mlsl_tf: a small allreduce came back under id " + std::to_string(e.id) +
            (known ? " ('" + ShownName(coordinator_.meta(e.id).name) + "' on this rank)" : std::string()) +
            ", which no collective of rank " + std::to_string(rank_) + " is waiting under: the ranks' ids of "
            "collective names differ");
      return false;
    }
    ids->push_back(e.id);
    FinishOneEager(e, &it->second);
  }
  std::sort(ids->begin(), ids->end());
  return true;
}

void Engine::FinishOneEager(const EagerEntry& e, Local* l) {
  const RequestMeta& meta = coordinator_.meta(e.id);
  Request* r = l->request.get();
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
  if (timeline_->enabled()) {
    // The reduction rode in this cycle's control message: negotiated and done in one round.
    timeline_->Instant(ShownName(meta.name), "eager", "queue", now_);
    timeline_->HorovodNegotiation(meta.name, OpTypeName(meta.op), l->submitted, cycle_started_);
    timeline_->HorovodOp(meta.name, OpTypeName(meta.op), cycle_started_, cycle_started_, now_);
  }
  Finish(meta.name, s);
}

}  // namespace mlsl
