// fp32 <-> bf16 array codec: a scalar path (the definition) and AVX2 / AVX-512 BF16 paths that
// give the same bits. Each vector function carries its own target attribute; nothing here needs
// -mavx flags, and a path is only ever run after CPUID said the CPU has it.
#include "bf16.h"

// GCC 12's _mm512_undefined_* (self-initialised on purpose) trips -Wmaybe-uninitialized in
// every AVX-512 intrinsic that uses it (gcc.gnu.org bug 105593): a false positive.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstdio>
#include <cstdlib>

#include "half.h"

namespace mlsl {
namespace {

// ---- scalar: the reference every other path must match bit for bit ----

void Fp32ToBf16Scalar(const float* in, uint16_t* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = FloatToBf16(in[i]);
}

void Bf16ToFp32Scalar(const uint16_t* in, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = Bf16ToFloat(in[i]);
}

void AccumulateBf16Scalar(const uint16_t* in, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] += Bf16ToFloat(in[i]);
}

// ---- AVX2: integer round-to-nearest-even on the bit pattern, 16 values per step ----

// 8 floats (as bits) -> 8 bf16 values in the low halves of 32-bit lanes.
__attribute__((target("avx2"))) inline __m256i RneAvx2(__m256i u) {
  const __m256i hi = _mm256_srli_epi32(u, 16);
  const __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(
      _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)), 16);
  // |x| > Inf as signed ints is safe: both sides are non-negative after masking the sign.
  const __m256i abs = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
  const __m256i is_nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f800000));
  const __m256i quiet = _mm256_or_si256(hi, _mm256_set1_epi32(0x0040));
  return _mm256_blendv_epi8(rounded, quiet, is_nan);
}

__attribute__((target("avx2"))) void Fp32ToBf16Avx2(const float* in, uint16_t* out, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i a = RneAvx2(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i)));
    const __m256i b = RneAvx2(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i + 8)));
    // packus works per 128-bit half: a0..3 b0..3 a4..7 b4..7; the permute restores the order.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xd8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), packed);
  }
  Fp32ToBf16Scalar(in + i, out + i, n - i);
}

__attribute__((target("avx2"))) inline __m256 LoadBf16Avx2(const uint16_t* p) {
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

__attribute__((target("avx2"))) void Bf16ToFp32Avx2(const uint16_t* in, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, LoadBf16Avx2(in + i));
  Bf16ToFp32Scalar(in + i, out + i, n - i);
}

__attribute__((target("avx2"))) void AccumulateBf16Avx2(const uint16_t* in, float* out,
                                                        int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(out + i, _mm256_add_ps(_mm256_loadu_ps(out + i), LoadBf16Avx2(in + i)));
  }
  AccumulateBf16Scalar(in + i, out + i, n - i);
}

// ---- AVX-512 BF16: vcvtneps2bf16, 16 values per step, masked tails ----
//
// vcvtneps2bf16 rounds to nearest even and quiets NaNs exactly like FloatToBf16, but treats
// denormal inputs as zero (Intel SDM: "input denormals are always treated as zero", MXCSR not
// consulted). Lanes holding an fp32 subnormal are redone with the integer rounding, which is
// the exact value's RNE (a subnormal's bits round like any other: no exponent arithmetic).
#define MLSL_AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512bf16")))

MLSL_AVX512BF16 inline __m256i CvtAvx512(__m512i u) {
  __m256i r = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_castsi512_ps(u)));
  const __m512i abs = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
  // abs in [1, 0x7fffff]  <=>  abs - 1 < 0x7fffff as unsigned (abs == 0 wraps to 0xffffffff)
  const __mmask16 subnormal = _mm512_cmplt_epu32_mask(_mm512_sub_epi32(abs, _mm512_set1_epi32(1)),
                                                      _mm512_set1_epi32(0x7fffff));
  if (__builtin_expect(subnormal != 0, 0)) {
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i fixed = _mm512_srli_epi32(
        _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)), 16);
    const __m512i merged = _mm512_mask_mov_epi32(_mm512_cvtepu16_epi32(r), subnormal, fixed);
    r = _mm512_cvtepi32_epi16(merged);
  }
  return r;
}

MLSL_AVX512BF16 void Fp32ToBf16Avx512(const float* in, uint16_t* out, int64_t n) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256i a = CvtAvx512(_mm512_loadu_si512(in + i));
    const __m256i b = CvtAvx512(_mm512_loadu_si512(in + i + 16));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), a);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i + 16), b);
  }
  for (; i < n; i += 16) {
    const int64_t left = n - i < 16 ? n - i : 16;
    const __mmask16 m = __mmask16((1u << left) - 1);
    const __m256i r = CvtAvx512(_mm512_maskz_loadu_epi32(m, in + i));
    _mm512_mask_storeu_epi16(out + i, __mmask32(m), _mm512_castsi256_si512(r));
  }
}

MLSL_AVX512BF16 inline __m512 WidenAvx512(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

MLSL_AVX512BF16 void Bf16ToFp32Avx512(const uint16_t* in, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(out + i,
                     WidenAvx512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i))));
  }
  if (i < n) {
    const __mmask16 m = __mmask16((1u << (n - i)) - 1);
    const __m256i h = _mm512_castsi512_si256(_mm512_maskz_loadu_epi16(__mmask32(m), in + i));
    _mm512_mask_storeu_ps(out + i, m, WidenAvx512(h));
  }
}

MLSL_AVX512BF16 void AccumulateBf16Avx512(const uint16_t* in, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = WidenAvx512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i)));
    _mm512_storeu_ps(out + i, _mm512_add_ps(_mm512_loadu_ps(out + i), v));
  }
  if (i < n) {
    const __mmask16 m = __mmask16((1u << (n - i)) - 1);
    const __m256i h = _mm512_castsi512_si256(_mm512_maskz_loadu_epi16(__mmask32(m), in + i));
    _mm512_mask_storeu_ps(out + i, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, out + i),
                                                    WidenAvx512(h)));
  }
}

#undef MLSL_AVX512BF16

std::vector<Bf16Path> DetectPaths() {
  std::vector<Bf16Path> paths{Bf16Path::kScalar};
  __builtin_cpu_init();
  // libgcc's feature bits already include the OS check (XCR0 saves the ymm/zmm state).
  if (__builtin_cpu_supports("avx2")) paths.push_back(Bf16Path::kAvx2);
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512bf16")) {
    paths.push_back(Bf16Path::kAvx512Bf16);
  }
  return paths;
}

const std::vector<Bf16Path>& Paths() {
  static const std::vector<Bf16Path> paths = DetectPaths();
  return paths;
}

// Running a path the CPU lacks would be SIGILL somewhere later; say which path instead.
void RequireAvailable(Bf16Path p) {
  for (Bf16Path q : Paths()) {
    if (q == p) return;
  }
  std::fprintf(stderr, "mlsl bf16: path %s (%d) is not available on this CPU\n", Bf16PathName(p),
               int(p));
  std::abort();
}

// Dispatch without the availability check (callers have done it, or use the active path).
void Fp32ToBf16On(Bf16Path p, const float* in, uint16_t* out, int64_t n) {
  if (n <= 0) return;
  switch (p) {
    case Bf16Path::kScalar: return Fp32ToBf16Scalar(in, out, n);
    case Bf16Path::kAvx2: return Fp32ToBf16Avx2(in, out, n);
    case Bf16Path::kAvx512Bf16: return Fp32ToBf16Avx512(in, out, n);
  }
}

void Bf16ToFp32On(Bf16Path p, const uint16_t* in, float* out, int64_t n) {
  if (n <= 0) return;
  switch (p) {
    case Bf16Path::kScalar: return Bf16ToFp32Scalar(in, out, n);
    case Bf16Path::kAvx2: return Bf16ToFp32Avx2(in, out, n);
    case Bf16Path::kAvx512Bf16: return Bf16ToFp32Avx512(in, out, n);
  }
}

void AccumulateBf16On(Bf16Path p, const uint16_t* in, float* out, int64_t n) {
  if (n <= 0) return;
  switch (p) {
    case Bf16Path::kScalar: return AccumulateBf16Scalar(in, out, n);
    case Bf16Path::kAvx2: return AccumulateBf16Avx2(in, out, n);
    case Bf16Path::kAvx512Bf16: return AccumulateBf16Avx512(in, out, n);
  }
}

}  // namespace

Bf16Path ActiveBf16Path() {
  static const Bf16Path active = Paths().back();
  return active;
}

std::vector<Bf16Path> AvailableBf16Paths() { return Paths(); }

const char* Bf16PathName(Bf16Path p) {
  switch (p) {
    case Bf16Path::kScalar: return "scalar";
    case Bf16Path::kAvx2: return "avx2";
    case Bf16Path::kAvx512Bf16: return "avx512bf16";
  }
  return "unknown";
}

void Fp32ToBf16With(Bf16Path p, const float* in, uint16_t* out, int64_t n) {
  RequireAvailable(p);
  Fp32ToBf16On(p, in, out, n);
}

void Bf16ToFp32With(Bf16Path p, const uint16_t* in, float* out, int64_t n) {
  RequireAvailable(p);
  Bf16ToFp32On(p, in, out, n);
}

void AccumulateBf16With(Bf16Path p, const uint16_t* in, float* out, int64_t n) {
  RequireAvailable(p);
  AccumulateBf16On(p, in, out, n);
}

void Fp32ToBf16(const float* in, uint16_t* out, int64_t n) {
  Fp32ToBf16On(ActiveBf16Path(), in, out, n);
}

void Bf16ToFp32(const uint16_t* in, float* out, int64_t n) {
  Bf16ToFp32On(ActiveBf16Path(), in, out, n);
}

void AccumulateBf16(const uint16_t* in, float* out, int64_t n) {
  AccumulateBf16On(ActiveBf16Path(), in, out, n);
}

}  // namespace mlsl
