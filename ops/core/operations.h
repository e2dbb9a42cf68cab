// Operations: the one table that decides how a collective runs, from the request and the
// topology -- and, for an allreduce cut in chunks, how each chunk runs. Transports (MPI, the fake
// one, the simulator) only move bytes: they offer point-to-point messages and the few
// collectives MPI does itself, and choose nothing; the same facts give the same way on each.
// Each table is a list of rows in order, each with a test; the first row whose test holds wins.
// What MPI then does inside its own allreduce (recursive doubling, Rabenseifner, ring: MPICH
// picks by size) is MPI's; the simulator models that choice (sim_communicator.h).
#pragma once

#include <cstdint>
#include <vector>

#include "types.h"

namespace mlsl {

enum class Way {
  // A whole request:
  kEager,              // a small allreduce of the world rides in the control message (eager_path.h)
  kChunks,             // an allreduce cut in chunks, each run by a chunk way below (scheduler.h)
  kAdasum,             // Adasum's pairwise tree in pieces (algo_adasum.cc)
  kBroadcast,          // pieces of the transport's broadcast (algo_broadcast.cc)
  kAllgather,          // pieces of the transport's allgather (algo_allgather.cc)
  kAlltoall,           // pieces as point-to-point rounds (algo_alltoall.cc, algo_p2p_alltoall.cc)
  kReducescatter,      // pieces of the transport's reduce-scatter (algo_reducescatter.cc)
  kWireReducescatter,  // pieces over a 16-bit wire: all-to-all, then a local reduction (algo_wire_reducescatter.cc)
  kBarrier,            // the transport's barrier
  kNotACollective,     // join and group changes: the Engine's own
  // One chunk of kChunks:
  kWireAllreduce,      // float32 over a 16-bit wire (wire.h)
  kRingAllreduce,      // a ring of point-to-point messages (algo_ring_allreduce.cc)
  kNativeAllreduce,    // the transport's allreduce with its own reduction (MPI's built-in operation)
  kKernelAllreduce,    // the transport's allreduce with the core's kernels (reduce.h)
};
const char* WayName(Way w);

// What the choice depends on: agreed facts only, so every rank chooses the same way.
struct OperationFacts {
  OpType op = OpType::kAllreduce;
  DataType dtype = DataType::kFloat32;
  ReduceOp reduce_op = ReduceOp::kSum;
  bool compressed = false;      // a 16-bit wire (RequestMeta::compressed)
  bool error_feedback = false;
  int group = 0;
  int64_t bytes = 0;            // of the request (request ways) or of the chunk (chunk ways)
  // Of the transport and the settings:
  bool one_host = false;        // every member on one machine (OnOneMachine)
  int64_t eager_bytes = 0;      // MLSL_TF_EAGER_BYTES
  int64_t ring_bytes = 0;       // MLSL_TF_RING_BYTES (0: never the ring)
};

struct Operation {
  Way way;
  bool (*enabled)(const OperationFacts&);
  const char* when;  // the test in words
};
// The request's part of the facts (bytes: the whole request's); the caller adds the transport's.
struct RequestMeta;
OperationFacts FactsOf(const RequestMeta& m);
// The facts of `bytes` of m (a chunk) on a transport: all members on one host or not.
OperationFacts FactsOf(const RequestMeta& m, int64_t bytes, bool one_host, int64_t ring_bytes);

// Whether two chunked allreduces may share one fused buffer: the same kind (dtype, op, scales,
// group, wire), and never with error feedback -- the rank that reduces an element keeps its
// output residual, and in a fused buffer which rank that is would depend on what else was ready.
bool FuseTogether(const RequestMeta& a, const RequestMeta& b);

// The tables, in order: a whole request's, and one chunk's.
const std::vector<Operation>& RequestOperations();
const std::vector<Operation>& ChunkOperations();
// The first enabled row of each table.
Way ChooseRequest(const OperationFacts& f);
Way ChooseChunk(const OperationFacts& f);

}  // namespace mlsl
