// Element-wise reduction kernels for every supported DataType and ReduceOp, vectorised for
// the native types. Both communicators reduce with them: the MPI one through user-defined MPI
// operations (MPI has no float16/bfloat16, and MPICH's built-in float sum is a scalar loop).
#pragma once

#include <cstdint>

#include "status.h"
#include "types.h"

namespace mlsl {

// Checks that `op` is meaningful for `dtype` (e.g. Sum of bool is not).
Status CheckReducible(DataType dtype, ReduceOp op);

// dst[i] = dst[i] (op) src[i] for i < count. Average reduces like Sum (scaling is separate).
void ReduceInto(void* dst, const void* src, int64_t count, DataType dtype, ReduceOp op);

// dst[i] = dst[i] (op) src[i] gives the same bits whatever the operand order (so whatever order
// MPI combines the ranks in): NaN results are the canonical quiet NaN, Min/Max propagate NaN and
// take -0 as below +0. CanonicalizeNaN turns every NaN of a float buffer into that NaN (for
// results MPI's built-in operations computed).
void CanonicalizeNaN(void* data, int64_t count, DataType dtype);

// data[i] *= factor, computed in double and converted back (integers truncate toward zero).
void ScaleInPlace(void* data, int64_t count, DataType dtype, double factor);

// CanonicalizeNaN, then ScaleInPlace: the same bits, in one pass over float32 and float64 data
// (a reduced chunk's completion; the average's 1/size).
void CanonicalizeAndScale(void* data, int64_t count, DataType dtype, double factor);

// Fills data with the identity element of op (0 for Sum, 1 for Product, +max for Min ...),
// which is what a rank that has joined contributes.
void FillIdentity(void* data, int64_t count, DataType dtype, ReduceOp op);

}  // namespace mlsl
