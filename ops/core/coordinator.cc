#include "coordinator.h"

#include <algorithm>

namespace mlsl {
namespace {

// One id's share of the fingerprint: FNV-1a of the name, mixed with the id (splitmix64's finaliser).
uint64_t Entry(int32_t id, const std::string& name) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  h ^= uint64_t(uint32_t(id)) * 0x9e3779b97f4a7c15ull;
  h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
  h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
  return h ^ (h >> 31);
}

}  // namespace

Coordinator::Coordinator(int size) : size_(size) {
  std::vector<int> everyone(size);
  for (int r = 0; r < size; ++r) everyone[r] = r;
  groups_.push_back(everyone);
}

void Coordinator::SetGroup(int32_t id, std::vector<int> ranks) {
  if (int32_t(groups_.size()) <= id) groups_.resize(id + 1);
  groups_[id] = std::move(ranks);
}

const std::vector<int>& Coordinator::Members(const Pending& p) const {
  for (const auto& m : p.by_rank) {
    if (m && m->group >= 0 && m->group < int32_t(groups_.size())) return groups_[m->group];
  }
  return groups_[0];
}

void Coordinator::Announce(int rank, RequestMeta meta) {
  auto it = std::find_if(pending_.begin(), pending_.end(), [&](const Pending& p) { return p.name == meta.name; });
  if (it == pending_.end()) {
    Pending p;
    p.name = meta.name;
    p.by_rank.resize(size_);
    pending_.push_back(std::move(p));
    it = pending_.end() - 1;
  }
  // A name that already has an id is announced only when its metadata changed on that rank;
  // ranks still holding the old cached id must announce too, so they can be compared.
  if (!it->invalidated && ids_.count(meta.name)) {
    it->invalidated = true;
    early_.push_back(Decision{Decision::kInvalidate, meta.name, -1, ""});
  }
  it->by_rank[rank] = std::move(meta);
}

std::string Coordinator::Mismatch(const Pending& p, const std::vector<bool>& joined) const {
  std::string err;
  for (int r = 0; r < size_; ++r) {
    if (p.by_rank[r] && !p.by_rank[r]->local_error.empty()) {
      err += (err.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) + ": " + p.by_rank[r]->local_error;
    }
  }
  if (!err.empty()) return err;
  int first = -1;
  for (int r = 0; r < size_; ++r) {
    if (joined[r] || !p.by_rank[r]) continue;
    if (first < 0) { first = r; continue; }
    std::string diff = p.by_rank[first]->Difference(*p.by_rank[r]);
    if (!diff.empty()) {
      // "shape [2] vs [3]" -> "shape [2] on rank 0 vs [3] on rank 1"
      size_t vs = diff.rfind(" vs ");
      return diff.substr(0, vs) + " on rank " + std::to_string(first) + " vs" + diff.substr(vs + 3) + " on rank " +
             std::to_string(r);
    }
  }
  return "";
}

std::vector<Decision> Coordinator::Resolve(const std::vector<bool>& joined) {
  std::vector<Decision> out;
  out.swap(early_);
  bool anyone_active = std::find(joined.begin(), joined.end(), false) != joined.end();
  if (!anyone_active) return out;
  for (auto it = pending_.begin(); it != pending_.end();) {
    bool complete = true;
    for (int r : Members(*it)) complete = complete && (joined[r] || it->by_rank[r].has_value());
    if (!complete) { ++it; continue; }
    std::string err = Mismatch(*it, joined);
    if (!err.empty()) {
      const RequestMeta* any = nullptr;
      for (auto& m : it->by_rank) if (m) { any = &*m; break; }
      if (any->op == OpType::kAddGroup) {
        err = "groups must be created on every rank in the same order with the same ranks, but group creation #" +
              it->name.substr(it->name.rfind('.') + 1) + " differs: " + err;
      }
      // A grouped allreduce is an allreduce of several tensors: call it by the user's name.
      bool grouped = false;
      bool invalid_input = false;
      for (auto& m : it->by_rank) {
        grouped = grouped || (m && m->op == OpType::kAllreduce && m->shapes.size() != 1);
        invalid_input = invalid_input || (m && !m->local_error.empty());
      }
      out.push_back(Decision{Decision::kError, it->name, -1,
                             std::string("mlsl_tf: ") + (grouped ? "grouped_allreduce" : OpTypeName(any->op)) +
                                 " '" + ShownName(it->name) + "': " + err,
                             invalid_input});
    } else {
      const RequestMeta* canonical = nullptr;
      for (int r = 0; r < size_ && !canonical; ++r) if (!joined[r] && it->by_rank[r]) canonical = &*it->by_rank[r];
      auto id = ids_.find(it->name);
      int32_t value;
      if (id == ids_.end()) {
        value = int32_t(metas_.size());
        ids_[it->name] = value;
        fingerprint_ += Entry(value, it->name);
        metas_.push_back(*canonical);
        used_.push_back(0);
      } else {
        value = id->second;
        metas_[value] = *canonical;
      }
      out.push_back(Decision{Decision::kAgreed, it->name, value, ""});
    }
    it = pending_.erase(it);
  }
  return out;
}

std::vector<int32_t> Coordinator::Retire(size_t keep) {
  const int32_t n = num_ids();
  std::vector<int32_t> order(n);
  for (int32_t i = 0; i < n; ++i) order[i] = i;
  // Most recently used first; among equals the newer id first. Same inputs on every rank.
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return used_[a] != used_[b] ? used_[a] > used_[b] : a > b; });
  std::vector<bool> survives(n, false);
  for (size_t i = 0; i < keep && i < order.size(); ++i) survives[order[i]] = true;
  std::vector<int32_t> remap(n, -1);
  std::vector<RequestMeta> metas;
  std::vector<uint64_t> used;
  ids_.clear();
  fingerprint_ = 0;
  for (int32_t id = 0; id < n; ++id) {
    if (!survives[id]) continue;
    remap[id] = int32_t(metas.size());
    ids_[metas_[id].name] = remap[id];
    fingerprint_ += Entry(remap[id], metas_[id].name);
    metas.push_back(std::move(metas_[id]));
    used.push_back(used_[id]);
  }
  metas_.swap(metas);
  used_.swap(used);
  return remap;
}

}  // namespace mlsl
