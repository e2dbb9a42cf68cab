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
  switch (meta.op) {
    case OpType::kAllgather: return Allgather(meta, request);
    case OpType::kBroadcast: return Broadcast(meta, request, joined);
    case OpType::kAlltoall: return Alltoall(meta, request);
    case OpType::kReducescatter: return Reducescatter(meta, request);
    case OpType::kBarrier: {
      auto op = comm_->Barrier();
      return Wait(op.get());
    }
    case OpType::kAllreduce:  // chunked by the Scheduler, except Adasum
      if (meta.reduce_op == ReduceOp::kAdasum) return Adasum(meta, request);
      break;
    case OpType::kJoin:       // a rendezvous in the control message
    case OpType::kAddGroup:   // run by the Runtime itself
    case OpType::kRemoveGroup:
      break;
  }
  return Status::Internal(std::string(OpTypeName(meta.op)) + " is not executed by the Executor");
}

Status Executor::GatherCounts(int64_t mine, std::vector<int64_t>* all) {
  all->assign(comm_->size(), 0);
  auto op = comm_->Allgatherv(&mine, all->data(), std::vector<int64_t>(comm_->size(), 8));
  return Wait(op.get());
}

Status Executor::Allgather(const RequestMeta& m, Request* r) {
  const int64_t row_bytes = m.RowElements(0) * DataTypeSize(m.dtype);
  std::vector<int64_t> rows;
  Status s = GatherCounts(r ? r->inputs[0].shape[0] : 0, &rows);
  if (!s.ok()) return s;
  int64_t total_rows = 0;
  std::vector<int64_t> bytes(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    total_rows += rows[i];
    bytes[i] = rows[i] * row_bytes;
  }
  void* out;
  const void* in = r ? r->inputs[0].data : nullptr;
  if (r) {
    Shape shape = m.shapes[0];
    shape[0] = total_rows;
    s = Alloc(r, 0, shape, &out);
    if (!s.ok()) return s;
  } else {
    scratch_.resize(total_rows * row_bytes);
    out = scratch_.data();
  }
  auto op = comm_->Allgatherv(in, out, bytes);
  return Wait(op.get());
}

Status Executor::Broadcast(const RequestMeta& m, Request* r, const std::vector<bool>& joined) {
  if (joined[m.root]) {
    return Status::InvalidArgument("mlsl_tf: broadcast '" + ShownName(m.name) + "': root rank " + std::to_string(m.root) +
                                   " has already joined");
  }
  const int64_t bytes = NumElements(m.shapes[0]) * DataTypeSize(m.dtype);
  void* out;
  if (r) {
    Status s = Alloc(r, 0, m.shapes[0], &out);
    if (!s.ok()) return s;
    if (comm_->rank() == m.root && out != r->inputs[0].data && bytes) std::memcpy(out, r->inputs[0].data, bytes);
  } else {
    scratch_.resize(bytes);
    out = scratch_.data();
  }
  // In pieces the communicator can carry (MPI: int counts), one after the other.
  const int64_t piece = comm_->max_message_bytes();
  for (int64_t at = 0; at < bytes || (at == 0 && bytes == 0); at += piece) {
    auto op = comm_->Broadcast(static_cast<char*>(out) + at, std::min(piece, bytes - at), m.root);
    Status s = Wait(op.get());
    if (!s.ok() || bytes == 0) return s;
  }
  return Status::Ok();
}

Status Executor::Alltoall(const RequestMeta& m, Request* r) {
  const int n = comm_->size();
  const int64_t row_bytes = m.RowElements(0) * DataTypeSize(m.dtype);
  std::vector<int64_t> send_rows(n, 0), recv_rows(n, 0);
  if (r) {
    if (r->splits.empty()) {
      send_rows.assign(n, r->inputs[0].shape[0] / n);
    } else {
      send_rows = r->splits;
    }
  }
  auto counts = comm_->Alltoallv(send_rows.data(), std::vector<int64_t>(n, 8), recv_rows.data(),
                                 std::vector<int64_t>(n, 8));
  Status s = Wait(counts.get());
  if (!s.ok()) return s;
  std::vector<int64_t> send_bytes(n), recv_bytes(n);
  int64_t total = 0;
  for (int i = 0; i < n; ++i) {
    send_bytes[i] = send_rows[i] * row_bytes;
    recv_bytes[i] = recv_rows[i] * row_bytes;
    total += recv_rows[i];
  }
  void* out;
  if (r) {
    Shape shape = m.shapes[0];
    shape[0] = total;
    s = Alloc(r, 0, shape, &out);
    if (!s.ok()) return s;
    void* splits_out;
    s = Alloc(r, 1, Shape{n}, &splits_out);
    if (!s.ok()) return s;
    for (int i = 0; i < n; ++i) static_cast<int32_t*>(splits_out)[i] = int32_t(recv_rows[i]);
  } else {
    scratch_.resize(total * row_bytes);
    out = scratch_.data();
  }
  auto op = comm_->Alltoallv(r ? r->inputs[0].data : nullptr, send_bytes, out, recv_bytes);
  return Wait(op.get());
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
  Status s;
  if (m.compressed()) {
    s = WireReduceScatter(comm_, reinterpret_cast<const float*>(staging_.data()), counts, static_cast<float*>(out),
                          m.wire, m.reduce_op);
  } else {
    auto op = comm_->ReduceScatter(staging_.data(), out, counts, m.dtype, m.reduce_op);
    s = Wait(op.get());
  }
  if (s.ok() && r) ScaleInPlace(out, counts[me], m.dtype, PostFactor(m, n));
  return s;
}

}  // namespace mlsl
