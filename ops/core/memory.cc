#include "memory.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>

namespace mlsl {

void AdviseHugePages(void* data, size_t bytes) {
#ifdef MADV_HUGEPAGE
  constexpr uintptr_t kHuge = uintptr_t(2) << 20;
  if (!data || bytes < kHugePageMinBytes) return;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(data) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + bytes) & ~(kHuge - 1);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);  // advice only
#else
  (void)data;
  (void)bytes;
#endif
}

std::vector<char> BufferPool::Take(size_t bytes) {
  auto best = free_.end();
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->size() >= bytes && (best == free_.end() || it->size() < best->size())) best = it;
  }
  if (best == free_.end()) return std::vector<char>(bytes);
  std::vector<char> v = std::move(*best);
  free_.erase(best);
  return v;
}

void BufferPool::Give(std::vector<char> v) {
  if (v.empty() || v.size() > max_bytes_) return;
  if (free_.size() < keep_) {
    free_.push_back(std::move(v));
    return;
  }
  auto smallest = std::min_element(free_.begin(), free_.end(),
                                   [](const std::vector<char>& a, const std::vector<char>& b) { return a.size() < b.size(); });
  if (smallest != free_.end() && smallest->size() < v.size()) *smallest = std::move(v);
}

}  // namespace mlsl
