// Adasum: the adaptive-summation allreduce (Horovod's op=Adasum). Pairs of vectors a, b are
// combined as (1 - a.b/(2|a|^2)) a + (1 - a.b/(2|b|^2)) b, in a binary tree over the ranks:
// (0,1), (2,3) ... at the first level, then the pair results, and so on. It runs as recursive
// vector halving / distance doubling over the communicator, then distance halving gathers the
// result back, so every rank ends with the same bits. Power-of-two rank counts only (as Horovod).
#pragma once

#include <cstdint>
#include <string>

#include "communicator.h"
#include "status.h"
#include "types.h"

namespace mlsl {

// Ok for the floating dtypes Adasum combines (float16, bfloat16, float32, float64).
Status CheckAdasumType(DataType dtype);
// Ok for the rank counts Adasum runs on (1, 2, 4, 8 ...); `what` names the tensor in the error.
Status CheckAdasumSize(int size, const std::string& what);

// buf (count elements of dtype) becomes the Adasum combination of every rank's buf. Collective
// over comm: every rank calls it with the same count and dtype. The dot products and norms are
// accumulated in double; each combined element is computed in double and rounded once.
Status AdasumAllreduce(Communicator* comm, void* buf, int64_t count, DataType dtype);

// The pairwise combination on one node, for tests and references: a = combine(a, b).
void AdasumCombine(void* a, const void* b, int64_t count, DataType dtype);

}  // namespace mlsl
