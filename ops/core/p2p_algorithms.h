// Collectives written over the communicator's point-to-point interface (Send/Recv), one file
// each: the ring allreduce (algo_ring_allreduce.cc) and the all-to-all (algo_p2p_alltoall.cc).
// They know nothing of MPI, so the fake transport runs them as N threads and the simulator on its
// virtual clock; MpiCommunicator chooses them for its Allreduce and Alltoallv. Each returns a
// PendingOp that makes progress only inside Test; comm must outlive those Test calls (destroying
// the op does not use comm).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "communicator.h"
#include "memory.h"

namespace mlsl {

// Communicator::Allreduce's semantics as a ring of point-to-point messages: p-1 steps of
// reduce-scatter, each rank receiving one segment and reducing it into the output, then p-1
// steps of allgather straight into the output. Out of place (send distinct from buf) it receives
// into the output itself (no temporary at all); in place into one segment of scratch taken from
// `pool` and given back when the op is destroyed (kept, not given back, when it is destroyed with
// a receive still posted). Every segment is reduced (ReduceInto: NaN canonical, operand order
// irrelevant) and scaled on exactly one rank and then copied, so all ranks hold identical bits;
// scaling only the segment it owns costs each rank 1/p of a pass. All messages carry `tag`.
std::unique_ptr<PendingOp> MakeRingAllreduce(Communicator* comm, int tag, void* buf, int64_t count, DataType dtype,
                                             ReduceOp op, const void* send, double scale,
                                             std::shared_ptr<BufferPool> pool);

// Communicator::Alltoallv's semantics as point-to-point messages: round k sends to rank+k and
// receives from rank-k, up to kP2PAlltoallRounds rounds posted at once; this rank's own slice is
// copied. Every message is posted, zero-length ones too, so the matching never depends on the
// counts agreeing; a rank whose slice to itself differs in size from what it expects from itself
// still takes part in every round and then fails with an error saying so. All messages carry `tag`.
constexpr int kP2PAlltoallRounds = 32;
std::unique_ptr<PendingOp> MakePointToPointAlltoallv(Communicator* comm, int tag, const void* send,
                                                     const std::vector<int64_t>& send_bytes, void* recv,
                                                     const std::vector<int64_t>& recv_bytes);

}  // namespace mlsl
