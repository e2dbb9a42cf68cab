// Element-wise reduction kernels for every supported DataType and ReduceOp. The MPI
// communicator uses them for types MPI cannot reduce natively (float16, bfloat16); the fake
// communicator uses them for everything.
#pragma once

#include <cstdint>

#include "status.h"
#include "types.h"

namespace mlsl {

// Checks that `op` is meaningful for `dtype` (e.g. Sum of bool is not).
Status CheckReducible(DataType dtype, ReduceOp op);

// dst[i] = dst[i] (op) src[i] for i < count. Average reduces like Sum (scaling is separate).
void ReduceInto(void* dst, const void* src, int64_t count, DataType dtype, ReduceOp op);

// data[i] *= factor, computed in double and converted back (integers truncate toward zero).
void ScaleInPlace(void* data, int64_t count, DataType dtype, double factor);

// Fills data with the identity element of op (0 for Sum, 1 for Product, +max for Min ...),
// which is what a rank that has joined contributes.
void FillIdentity(void* data, int64_t count, DataType dtype, ReduceOp op);

}  // namespace mlsl
