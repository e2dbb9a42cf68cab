// NameTable (names.h).
#include "names.h"

#include <algorithm>

namespace mlsl {
namespace {

int Words(int64_t bits) { return int((bits + 63) / 64); }
void SetBit(std::vector<uint64_t>& w, int64_t bit) { w[bit / 64] |= uint64_t(1) << (bit % 64); }
void ClearBit(std::vector<uint64_t>& w, int64_t bit) { w[bit / 64] &= ~(uint64_t(1) << (bit % 64)); }

}  // namespace

NameTable::NameTable(int size, size_t capacity) : coordinator_(size), capacity_(capacity) {}

int32_t NameTable::CachedId(const std::string& name, const RequestMeta& meta) const {
  auto cached = cached_ids_.find(name);
  return cached != cached_ids_.end() && coordinator_.meta(cached->second) == meta ? cached->second : -1;
}

std::string NameTable::Announcements(PendingTable* pending) const {
  std::vector<RequestMeta> mine;
  for (auto& [name, p] : pending->table()) {
    if (p.state != PendingRequest::kToAnnounce) continue;
    mine.push_back(p.meta);
    p.state = PendingRequest::kAnnounced;
  }
  std::string payload;
  SerializeMetas(mine, &payload);
  return payload;
}

std::string NameTable::Decide(const StringGather& gathered, const std::vector<bool>& joined, const GroupSet& groups,
                              PendingTable* pending, std::vector<int32_t>* agreed) {
  const std::vector<int64_t>& sizes = gathered.sizes();
  int64_t offset = 0;
  for (size_t r = 0; r < sizes.size(); ++r) {
    std::vector<RequestMeta> metas;
    if (!ParseMetas(gathered.all().data() + offset, sizes[r], &metas)) {
      return "mlsl_tf: internal error: could not parse the announcements of rank " + std::to_string(r);
    }
    offset += sizes[r];
    for (RequestMeta& m : metas) coordinator_.Announce(int(r), std::move(m));
  }
  for (const Decision& d : coordinator_.Resolve(joined)) Apply(d, groups, pending, agreed);
  return "";
}

void NameTable::Apply(const Decision& d, const GroupSet& groups, PendingTable* pending, std::vector<int32_t>* agreed) {
  PendingRequest* p = pending->Find(d.name);
  switch (d.kind) {
    case Decision::kInvalidate:
      cached_ids_.erase(d.name);
      if (p && p->state == PendingRequest::kReady) {
        p->state = PendingRequest::kToAnnounce;
        p->id = -1;
      }
      break;
    case Decision::kError:
      cached_ids_.erase(d.name);
      // As Horovod: an invalid input is InvalidArgument (on every rank); submissions that
      // disagree between ranks are FailedPrecondition
      if (p && p->state == PendingRequest::kAnnounced) {
        pending->Finish(d.name, d.invalid_input ? Status::InvalidArgument(d.error) : Status::FailedPrecondition(d.error));
      }
      break;
    case Decision::kAgreed: {
      const RequestMeta& meta = coordinator_.meta(d.id);
      if (int32_t(foreign_.size()) < Words(d.id + 1)) foreign_.resize(Words(d.id + 1), 0);
      bool foreign = meta.group > 0 && meta.group < groups.count() && !groups[meta.group].member();
      foreign ? SetBit(foreign_, d.id) : ClearBit(foreign_, d.id);
      cached_ids_[d.name] = d.id;
      if (p && p->state == PendingRequest::kAnnounced) {
        p->state = PendingRequest::kReady;
        p->id = d.id;
      }
      agreed->push_back(d.id);
      break;
    }
  }
}

void NameTable::ForgetOrDrain(const ControlMessage& m, uint64_t cycle, Stats* stats) {
  // Names are forgotten only when nothing anywhere refers to an id: no request waits or runs on
  // any rank and nothing was announced -- facts of the control message, so every rank forgets
  // the same names in the same cycle and the ids stay identical.
  // A program that keeps making names is rarely quiet between two of its requests, so when
  // there are too many names every rank holds back new requests for up to 4 cycles (at most
  // every 16 cycles) to let the requests already pending finish.
  const bool too_many = size_t(coordinator_.num_ids()) > capacity_;
  if (too_many && !m.busy && !m.waits && !m.announces) {
    Forget(stats);
    drain_ = false;
  } else if (too_many && cycle >= next_drain_) {
    drain_ = true;  // for a few cycles: ranks finish the same collective a cycle or two apart
    next_drain_ = cycle + 16;
    drain_until_ = cycle + 4;
  } else if (cycle >= drain_until_) {
    drain_ = false;
  }
}

void NameTable::Forget(Stats* stats) {
  const std::vector<int32_t> remap = coordinator_.Retire(capacity_ / 2);
  std::unordered_map<std::string, int32_t> cached;
  for (const auto& [name, id] : cached_ids_) {
    if (id < int32_t(remap.size()) && remap[id] >= 0) cached[name] = remap[id];
  }
  cached_ids_.swap(cached);
  std::vector<uint64_t> foreign(Words(coordinator_.num_ids()), 0);
  for (int32_t old = 0; old < int32_t(remap.size()); ++old) {
    if (remap[old] >= 0 && Foreign(old)) SetBit(foreign, remap[old]);
  }
  foreign_.swap(foreign);
  stats->NamesForgotten(int64_t(std::count(remap.begin(), remap.end(), -1)));
  stats->NamesKnown(coordinator_.num_ids());
}

}  // namespace mlsl
