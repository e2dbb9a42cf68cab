// Compressed collectives: float32 data that travels as a 16-bit wire type (bfloat16 or
// float16) while every sum is accumulated in float32. Each element is rounded once on the way
// in and once on the way out, however many ranks there are:
//   encode -> all-to-all of 16-bit slices -> float32 reduction of my slice (times an average's 1/size)
//   -> encode -> allgather -> decode
// (a reduce-scatter by all-to-all, then an allgather; the reducescatter collective is the first
// half, in pieces: algo_wire_reducescatter.cc). Per-hop schemes (ring or tree reductions
// of 16-bit data) round at every hop instead, so their error grows with the number of ranks.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "communicator.h"
#include "status.h"
#include "types.h"

namespace mlsl {

// The working buffers of one compressed collective. Reused from one chunk to the next (the
// scheduler keeps one per in-flight slot, whose previous chunk has completed when the next one
// starts), so a step of many chunks neither allocates nor faults in fresh pages per chunk:
// resize only touches memory beyond what an earlier chunk already used.
struct WireScratch {
  std::vector<char> encoded, received, reduced;
  std::vector<float> acc, tmp, corrected, back;
};

// True for the wire types a float32 collective can be compressed to.
bool IsCompressedWire(DataType wire);
size_t WireElementSize(DataType wire);  // 2 for bfloat16 / float16, 4 for float32

// Round-to-nearest-even conversions between float32 and a 16-bit wire type.
void EncodeWire(DataType wire, const float* in, void* out, int64_t n);
void DecodeWire(DataType wire, const void* in, float* out, int64_t n);

// In place on buf (n float32 elements): the reduction over every rank of comm, with the
// data travelling as `wire`. Error feedback, when res_in / res_out (n elements each, aligned
// with buf) are given: res_in is added to the input before it is rounded and becomes what that
// rounding lost; res_out does the same for the rounding of this rank's slice of the sum. Nonblocking: the returned op runs its two steps as it is tested.
// The caller must start these ops on a communicator in the same order on every rank and must
// not start anything else on that communicator while one is in flight.
// `in` may be buf itself or a separate input of n elements.
// `scratch` must outlive the op and serve no other op while it is in flight.
// `scale` multiplies the result (an average's 1/size, a postscale factor): each rank scales its
// own slice of the float32 reduction before rounding it for the allgather, so the scaling costs
// 1/size of a pass over the data instead of a pass over all of it after.
std::unique_ptr<PendingOp> StartWireAllreduce(Communicator* comm, const float* in, float* buf, int64_t n, DataType wire,
                                              ReduceOp op, WireScratch* scratch,
                                              float* res_in = nullptr, float* res_out = nullptr, double scale = 1.0);

// acc (n float32 elements) = the reduction, in rank order, of `ranks` consecutive slices of n
// wire elements each (slice 0 decoded, the others reduced into it in float32). The reduce-scatter
// in pieces (algo_wire_reducescatter.cc) and the allreduce's slice step share it.
void ReduceWireSlices(DataType wire, const void* slices, int ranks, int64_t n, float* acc, ReduceOp op,
                      std::vector<float>* tmp);

}  // namespace mlsl
