// Memory for the large buffers collectives write: huge-page advice, and a pool that keeps
// buffers mapped from one collective to the next.
#pragma once

#include <cstddef>
#include <vector>

namespace mlsl {

// Asks the kernel to back the 2 MiB-aligned interior of [data, data + bytes) with transparent
// huge pages (madvise MADV_HUGEPAGE), for buffers of at least kHugePageMinBytes that have not
// been touched yet. Shared-memory MPI pins the peer's pages for every copy (CMA): with 4 KiB pages
// that pinning made a 16 MiB allreduce ~1.6x slower than on the huge pages numpy buffers get.
// A no-op where the kernel or the system's THP setting does not allow it.
constexpr size_t kHugePageMinBytes = size_t(4) << 20;
void AdviseHugePages(void* data, size_t bytes);

// Buffers handed back for the next operation: reused memory is already mapped, where a fresh
// allocation may come back from glibc unmapped and fault on every page again (measured: ~770k
// faults in one allreduce sweep, issue #13). Keeps up to `keep` buffers of at most `max_bytes`,
// the largest first. Not thread-safe: one thread (the background thread) uses a pool.
class BufferPool {
 public:
  BufferPool(size_t keep, size_t max_bytes) : keep_(keep), max_bytes_(max_bytes) {}
  // The smallest kept buffer of at least `bytes` (possibly larger: a vector is never grown,
  // which would clear it), else a new one.
  std::vector<char> Take(size_t bytes);
  void Give(std::vector<char> v);

 private:
  const size_t keep_, max_bytes_;
  std::vector<std::vector<char>> free_;
};

}  // namespace mlsl
