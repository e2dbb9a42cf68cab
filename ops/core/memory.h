// Memory advice for the large buffers collectives write.
#pragma once

#include <cstddef>

namespace mlsl {

// Asks the kernel to back the 2 MiB-aligned interior of [data, data + bytes) with transparent
// huge pages (madvise MADV_HUGEPAGE), for buffers of at least kHugePageMinBytes that have not
// been touched yet. Shared-memory MPI pins the peer's pages for every copy (CMA): with 4 KiB pages
// that pinning made a 16 MiB allreduce ~1.6x slower than on the huge pages numpy buffers get.
// A no-op where the kernel or the system's THP setting does not allow it.
constexpr size_t kHugePageMinBytes = size_t(4) << 20;
void AdviseHugePages(void* data, size_t bytes);

}  // namespace mlsl
