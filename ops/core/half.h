// Scalar float16 / bfloat16 <-> float32 conversions (round-to-nearest-even, NaN and Inf kept).
// Used by the reduction kernels for 16-bit types.
#pragma once

#include <cstdint>
#include <cstring>

namespace mlsl {

inline uint32_t FloatBits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float BitsFloat(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

inline float Bf16ToFloat(uint16_t h) { return BitsFloat(uint32_t(h) << 16); }

inline uint16_t FloatToBf16(float f) {
  uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x0040u);  // quiet NaN
  uint32_t lsb = (u >> 16) & 1u;
  u += 0x7fffu + lsb;  // ties go to the even neighbour
  return uint16_t(u >> 16);
}

inline float Fp16ToFloat(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) return BitsFloat(sign | 0x7f800000u | (man << 13));  // Inf / NaN
  if (exp == 0) {
    if (man == 0) return BitsFloat(sign);
    // subnormal: value = man * 2^-24
    float v = float(man) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  return BitsFloat(sign | ((exp + 112u) << 23) | (man << 13));
}

inline uint16_t FloatToFp16(float f) {
  uint32_t u = FloatBits(f);
  uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return uint16_t(sign | 0x7e00u | ((a >> 13) & 0x3ffu));  // NaN
  if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds to >= 65520: Inf
  if (a < 0x38800000u) {  // below the smallest normal half (2^-14): subnormal or zero
    // scale so that the half subnormal unit (2^-24) becomes 1, then round to nearest even
    float v = BitsFloat(a) * 16777216.0f;
    uint32_t r = uint32_t(v);
    float frac = v - float(r);
    if (frac > 0.5f || (frac == 0.5f && (r & 1u))) ++r;
    return uint16_t(sign | r);
  }
  uint32_t lsb = (a >> 13) & 1u;
  a += 0xfffu + lsb;
  return uint16_t(sign | (((a >> 23) - 112u) << 10) | ((a >> 13) & 0x3ffu));
}

}  // namespace mlsl
