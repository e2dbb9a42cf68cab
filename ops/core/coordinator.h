// Coordinator: turns every rank's announcements of new collective names into decisions --
// an id when all ranks agree, an error naming the tensor, the field and the ranks when they
// do not. Every rank runs an identical Coordinator over the same allgathered announcements,
// so the verdict that rank 0 would broadcast is reached everywhere without a broadcast; ids
// are therefore the same small integers on every rank.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "meta.h"

namespace mlsl {

struct Decision {
  enum Kind { kAgreed, kError, kInvalidate } kind;
  std::string name;
  int32_t id = -1;           // kAgreed
  std::string error;         // kError
  bool invalid_input = false;  // kError: some rank's own input was invalid (not a mismatch between ranks)
};

class Coordinator {
 public:
  explicit Coordinator(int size);

  // Declares group `id`'s member ranks: its names are decided once all of them announced.
  void SetGroup(int32_t id, std::vector<int> ranks);

  // Records that `rank` has a request `meta` pending. May yield a kInvalidate decision (a
  // name with an id was re-announced with different metadata: every rank must re-announce).
  void Announce(int rank, RequestMeta meta);

  // Decides every name that all ranks not in `joined` have announced, in announcement order.
  std::vector<Decision> Resolve(const std::vector<bool>& joined);

  const RequestMeta& meta(int32_t id) const { return metas_[id]; }
  int32_t num_ids() const { return int32_t(metas_.size()); }

  // A digest of the id -> name table (every name with an id, and its id). Ranks compare it in
  // every control message: ids are only meaningful while every rank's table is the same.
  uint64_t fingerprint() const { return fingerprint_; }

  // Notes that id ran (was agreed or ready everywhere) in control cycle `cycle`.
  void Touch(int32_t id, uint64_t cycle) { used_[id] = cycle; }
  // Forgets every id but the `keep` most recently touched and renumbers the survivors
  // 0..keep-1 in their old order. Only safe when no rank holds a request under any id (all
  // idle): every rank calls it in the same cycle, so ids stay identical everywhere. Returns
  // old id -> new id, -1 for a forgotten one.
  std::vector<int32_t> Retire(size_t keep);

 private:
  struct Pending {
    std::string name;
    std::vector<std::optional<RequestMeta>> by_rank;
    bool invalidated = false;
  };
  std::string Mismatch(const Pending& p, const std::vector<bool>& joined) const;
  // The ranks that must announce p: the members of the group its first announcement names.
  const std::vector<int>& Members(const Pending& p) const;

  const int size_;
  std::vector<Pending> pending_;           // in order of first announcement
  std::map<std::string, int32_t> ids_;     // every name that was ever agreed
  std::vector<RequestMeta> metas_;         // by id: the metadata last agreed
  std::vector<uint64_t> used_;             // by id: the cycle it last ran in
  std::vector<Decision> early_;            // invalidations produced by Announce
  std::vector<std::vector<int>> groups_;   // by group id: member ranks
  uint64_t fingerprint_ = 0;               // sum of Entry(id, name) over every id
};

}  // namespace mlsl
