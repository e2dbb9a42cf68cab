#include "executor.h"

#include <algorithm>
#include <cstring>

#include "reduce.h"
#include "wire.h"

namespace mlsl {
namespace {

Status Alloc(Request* r, int index, const Shape& shape, void** data) {
  Status s = r->allocate_output(index, shape, data);
  if (s.ok() && *data == nullptr && NumElements(shape) > 0) return Status::Internal("output allocation returned null");
  return s;
}

double PostFactor(const RequestMeta& m, int size) {
  return m.reduce_op == ReduceOp::kAverage ? m.postscale / size : m.postscale;
}

}  // namespace

Status Executor::Execute(const RequestMeta& meta, Request* request, const std::vector<bool>& joined) {
  if (meta.op == OpType::kReducescatter && meta.compressed()) return Reducescatter(meta, request);
  if (meta.op == OpType::kAllreduce && meta.reduce_op == ReduceOp::kAdasum) return Adasum(meta, request);
  // Broadcast, allgather, alltoall, barrier and uncompressed reducescatter run in pieces
  // (algorithm.h); other allreduces in the Scheduler's chunks; join, add/remove group in the Runtime.
  return Status::Internal(std::string(OpTypeName(meta.op)) + " is not executed by the Executor");
}

Status Executor::Reducescatter(const RequestMeta& m, Request* r) {
  const int n = comm_->size();
  const size_t esize = DataTypeSize(m.dtype);
  const Shape& shape = m.shapes[0];
  const int64_t row = m.RowElements(0), total = NumElements(shape);
  std::vector<int64_t> counts(n);
  for (int i = 0; i < n; ++i) counts[i] = (shape[0] / n + (i < shape[0] % n ? 1 : 0)) * row;  // elements
  // The input is copied so prescaling never writes into the caller's tensor.
  staging_.resize(total * esize);
  if (r) {
    if (total) std::memcpy(staging_.data(), r->inputs[0].data, total * esize);
    ScaleInPlace(staging_.data(), total, m.dtype, m.prescale);
  } else {
    FillIdentity(staging_.data(), total, m.dtype, m.reduce_op);
  }
  const int me = comm_->rank();
  void* out;
  if (r) {
    Shape out_shape = shape;
    out_shape[0] = shape[0] / n + (me < shape[0] % n ? 1 : 0);
    Status s = Alloc(r, 0, out_shape, &out);
    if (!s.ok()) return s;
  } else {
    scratch_.resize(counts[me] * esize);
    out = scratch_.data();
  }
  Status s = WireReduceScatter(comm_, reinterpret_cast<const float*>(staging_.data()), counts,
                               static_cast<float*>(out), m.wire, m.reduce_op);
  if (s.ok() && r) ScaleInPlace(out, counts[me], m.dtype, PostFactor(m, n));
  return s;
}

}  // namespace mlsl
