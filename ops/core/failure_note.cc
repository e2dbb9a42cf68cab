// FailureNote (failure_note.h).
#include "failure_note.h"

#include <cstdint>

namespace mlsl {

std::string FailureNote::Reason(const StringGather& gathered) {
  std::string lines;
  int64_t offset = 0;
  for (int64_t bytes : gathered.sizes()) {
    if (bytes > 0) lines += (lines.empty() ? "" : "; ") + gathered.all().substr(size_t(offset), size_t(bytes));
    offset += bytes;
  }
  // The failing rank's peers go on waiting for messages it will never send: the collectives of
  // every rank fail, the peers' as caused by another rank.
  return "mlsl_tf: a collective failed on one rank (a transfer, or an output it could not allocate), so the ranks' "
         "messages are out of step and no collective can complete: " + lines;
}

}  // namespace mlsl
