// Adasum: the adaptive-summation allreduce (Horovod's op=Adasum). Pairs of vectors a, b are
// combined as (1 - a.b/(2|a|^2)) a + (1 - a.b/(2|b|^2)) b, in a binary tree over the ranks:
// (0,1), (2,3) ... at the first level, then the pair results, and so on. This file holds the
// checks and the arithmetic on one node; algo_adasum.cc runs it over the ranks in pieces
// (recursive vector halving / distance doubling, then distance halving gathers the result back,
// so every rank ends with the same bits). Power-of-two rank counts only (as Horovod).
#pragma once

#include <cstdint>
#include <string>

#include "status.h"
#include "types.h"

namespace mlsl {

// Ok for the floating dtypes Adasum combines (float16, bfloat16, float32, float64).
Status CheckAdasumType(DataType dtype);
// Ok for the rank counts Adasum runs on (1, 2, 4, 8 ...); `what` names the tensor in the error.
Status CheckAdasumSize(int size, const std::string& what);

// sums[0..2] += {a.b, |a|^2, |b|^2} over n elements, accumulated in double in element order, so
// running it over consecutive ranges with the same sums gives the bits of one run over the whole.
void AdasumDots(const void* a, const void* b, int64_t n, DataType dtype, double* sums);
// dst = ca a + cb b over n elements (dst may be a or b), with the coefficients that
// sums = {a.b, |a|^2, |b|^2} give (a coefficient stays 1 when its vector's norm is about zero);
// each element computed in double and rounded once.
void AdasumScaledAdd(void* dst, const void* a, const void* b, int64_t n, DataType dtype, const double* sums);

// The pairwise combination on one node, for tests and references: a = combine(a, b).
void AdasumCombine(void* a, const void* b, int64_t count, DataType dtype);

}  // namespace mlsl
