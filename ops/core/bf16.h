// Array codec between float32 and bfloat16, the wire format of bf16 collectives.
//
// Contract (every path gives the same bits; the scalar FloatToBf16 in half.h is the definition):
//   fp32 -> bf16 rounds the exact value to nearest, ties to even, including subnormal inputs;
//   values that round past the largest bf16 become Inf; Inf stays Inf; a NaN stays a quiet NaN
//   with its sign and top 7 payload bits: bits >> 16 with the quiet bit (0x0040) set.
//   bf16 -> fp32 is exact (the 16 bits become the high half of the float).
// The vector paths are compiled with per-function target attributes and picked at run time from
// CPUID, so the library builds without -mavx flags and runs on CPUs that lack them.
#pragma once

#include <cstdint>
#include <vector>

namespace mlsl {

enum class Bf16Path { kScalar, kAvx2, kAvx512Bf16 };

// The fastest path this CPU (and OS) can run; chosen once, on the first call.
Bf16Path ActiveBf16Path();
// Every path this CPU can run, kScalar first.
std::vector<Bf16Path> AvailableBf16Paths();
// "scalar", "avx2", "avx512bf16".
const char* Bf16PathName(Bf16Path p);

// With the active path. n <= 0 does nothing; in and out must not overlap.
void Fp32ToBf16(const float* in, uint16_t* out, int64_t n);
void Bf16ToFp32(const uint16_t* in, float* out, int64_t n);
// out[i] += float(in[i]): fp32 accumulation of a bf16 slice (the local sum of bf16 reductions).
void AccumulateBf16(const uint16_t* in, float* out, int64_t n);

// The same with a named path, for tests and benchmarks. A path that is not in
// AvailableBf16Paths() aborts with a message naming it (running it would be SIGILL).
void Fp32ToBf16With(Bf16Path p, const float* in, uint16_t* out, int64_t n);
void Bf16ToFp32With(Bf16Path p, const uint16_t* in, float* out, int64_t n);
void AccumulateBf16With(Bf16Path p, const uint16_t* in, float* out, int64_t n);

}  // namespace mlsl
