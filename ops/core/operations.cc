// The operation tables (operations.h).
#include "operations.h"

#include "meta.h"

namespace mlsl {
namespace {

bool Allreduce(const OperationFacts& f) { return f.op == OpType::kAllreduce; }
bool Always(const OperationFacts&) { return true; }

}  // namespace

const std::vector<Operation>& RequestOperations() {
  static const std::vector<Operation> table = {
      {Way::kAdasum, [](const OperationFacts& f) { return Allreduce(f) && f.reduce_op == ReduceOp::kAdasum; },
       "an Adasum allreduce (its dot products are per tensor: never fused, chunked or eager)"},
      {Way::kEager,
       [](const OperationFacts& f) {
         return Allreduce(f) && f.group == 0 && !f.compressed && !f.error_feedback && f.bytes <= f.eager_bytes;
       },
       "an uncompressed allreduce of the world of at most MLSL_TF_EAGER_BYTES, ready on every rank"},
      {Way::kChunks, Allreduce, "any other allreduce"},
      {Way::kBroadcast, [](const OperationFacts& f) { return f.op == OpType::kBroadcast; }, "a broadcast"},
      {Way::kAllgather, [](const OperationFacts& f) { return f.op == OpType::kAllgather; }, "an allgather"},
      {Way::kAlltoall, [](const OperationFacts& f) { return f.op == OpType::kAlltoall; }, "an all-to-all"},
      {Way::kWireReducescatter,
       [](const OperationFacts& f) { return f.op == OpType::kReducescatter && f.compressed; },
       "a float32 reduce-scatter over a 16-bit wire"},
      {Way::kReducescatter, [](const OperationFacts& f) { return f.op == OpType::kReducescatter; },
       "any other reduce-scatter"},
      {Way::kBarrier, [](const OperationFacts& f) { return f.op == OpType::kBarrier; }, "a barrier"},
      {Way::kNotACollective, Always, "join, add_group, remove_group"},
  };
  return table;
}

const std::vector<Operation>& ChunkOperations() {
  static const std::vector<Operation> table = {
      {Way::kWireAllreduce, [](const OperationFacts& f) { return f.compressed; },
       "float32 compressed to bfloat16 or float16 on the wire"},
      // On one host MPICH's allreduce is bound by its scalar sum loop and copies; the ring's
      // segments are reduced by the core's vectorised kernels, each once, on one rank.
      {Way::kRingAllreduce,
       [](const OperationFacts& f) {
         return f.one_host && f.ring_bytes > 0 && f.bytes >= f.ring_bytes && f.bytes <= 0x7fffffff;
       },
       "every member on one host and the chunk at least MLSL_TF_RING_BYTES"},
      // Across hosts the bytes cost, not the sum: MPICH picks recursive doubling for every
      // operation that is not built in (log2(p) times the message per rank, where
      // reduce-scatter + allgather sends 2(p-1)/p).
      {Way::kNativeAllreduce, [](const OperationFacts& f) { return !f.one_host; },
       "members on several hosts (MPI's own operation where it has one that gives every rank the same bits)"},
      {Way::kKernelAllreduce, Always, "one host, a chunk under MLSL_TF_RING_BYTES"},
  };
  return table;
}

namespace {

Way First(const std::vector<Operation>& table, const OperationFacts& f) {
  for (const Operation& o : table) if (o.enabled(f)) return o.way;
  return table.back().way;
}

}  // namespace

OperationFacts FactsOf(const RequestMeta& m) {
  OperationFacts f;
  f.op = m.op;
  f.dtype = m.dtype;
  f.reduce_op = m.reduce_op;
  f.compressed = m.compressed();
  f.error_feedback = m.error_feedback;
  f.group = m.group;
  f.bytes = Elements(m) * int64_t(DataTypeSize(m.dtype));
  return f;
}

OperationFacts FactsOf(const RequestMeta& m, int64_t bytes, bool one_host, int64_t ring_bytes) {
  OperationFacts f = FactsOf(m);
  f.bytes = bytes;
  f.one_host = one_host;
  f.ring_bytes = ring_bytes;
  return f;
}

bool FuseTogether(const RequestMeta& a, const RequestMeta& b) {
  return a.op == OpType::kAllreduce && b.op == OpType::kAllreduce && a.dtype == b.dtype &&
         a.reduce_op == b.reduce_op && a.prescale == b.prescale && a.postscale == b.postscale && a.group == b.group &&
         a.wire == b.wire && !a.error_feedback && !b.error_feedback;
}

Way ChooseRequest(const OperationFacts& f) { return First(RequestOperations(), f); }
Way ChooseChunk(const OperationFacts& f) { return First(ChunkOperations(), f); }

const char* WayName(Way w) {
  switch (w) {
    case Way::kEager: return "eager";
    case Way::kChunks: return "chunks";
    case Way::kAdasum: return "adasum";
    case Way::kBroadcast: return "broadcast";
    case Way::kAllgather: return "allgather";
    case Way::kAlltoall: return "alltoall";
    case Way::kReducescatter: return "reducescatter";
    case Way::kWireReducescatter: return "wire_reducescatter";
    case Way::kBarrier: return "barrier";
    case Way::kNotACollective: return "not_a_collective";
    case Way::kWireAllreduce: return "wire_allreduce";
    case Way::kRingAllreduce: return "ring_allreduce";
    case Way::kNativeAllreduce: return "native_allreduce";
    case Way::kKernelAllreduce: return "kernel_allreduce";
  }
  return "?";
}

}  // namespace mlsl
