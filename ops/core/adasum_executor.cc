// Executor::Adasum: runs an agreed Adasum allreduce whole (not chunked, not fused) with
// AdasumAllreduce, one tensor at a time, prescaling the input and postscaling the result.
#include <cstring>

#include "adasum.h"
#include "executor.h"
#include "reduce.h"

namespace mlsl {

Status Executor::Adasum(const RequestMeta& m, Request* r) {
  const size_t esize = DataTypeSize(m.dtype);
  for (size_t i = 0; i < m.shapes.size(); ++i) {
    const int64_t count = NumElements(m.shapes[i]);
    void* out = nullptr;
    if (r) {
      Status s = r->allocate_output(int(i), m.shapes[i], &out);
      if (s.ok() && out == nullptr && count > 0) s = Status::Internal("output allocation returned null");
      if (!s.ok()) return s;
      if (count && out != r->inputs[i].data) std::memcpy(out, r->inputs[i].data, count * esize);
      ScaleInPlace(out, count, m.dtype, m.prescale);
    } else {
      // A joined rank contributes zeros, which Adasum leaves the other side unchanged for.
      scratch_.assign(count * esize, 0);
      out = scratch_.data();
    }
    Status s = AdasumAllreduce(comm_, out, count, m.dtype);
    if (!s.ok()) return s;
    if (r) ScaleInPlace(out, count, m.dtype, m.postscale);
  }
  return Status::Ok();
}

}  // namespace mlsl
