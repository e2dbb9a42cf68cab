#include <cmath>
#include <limits>

#include "../half.h"
#include "check.h"

using namespace mlsl;

TEST(bf16_round_to_nearest_even) {
  CHECK_EQ(FloatToBf16(1.0f), 0x3f80);
  // 1 + 2^-8 lies exactly between two bf16 values: ties go to the even one (1.0).
  CHECK_EQ(FloatToBf16(BitsFloat(0x3f808000u)), 0x3f80);
  // 1 + 3*2^-8 is a tie between 0x3f81 and 0x3f82: even is 0x3f82.
  CHECK_EQ(FloatToBf16(BitsFloat(0x3f818000u)), 0x3f82);
  CHECK_EQ(FloatToBf16(BitsFloat(0x3f808001u)), 0x3f81);  // just above the tie rounds up
  CHECK_EQ(FloatToBf16(std::numeric_limits<float>::infinity()), 0x7f80);
  CHECK_EQ(FloatToBf16(-std::numeric_limits<float>::infinity()), 0xff80);
  CHECK(std::isnan(Bf16ToFloat(FloatToBf16(std::nanf("")))));
  CHECK_EQ(FloatToBf16(BitsFloat(0x7f7fffffu)), 0x7f80);  // FLT_MAX rounds to Inf
  CHECK_EQ(FloatToBf16(BitsFloat(0x00010000u)), 0x0001);  // subnormal kept
}

TEST(fp16_round_trip_and_specials) {
  CHECK_EQ(FloatToFp16(1.0f), 0x3c00);
  CHECK_EQ(FloatToFp16(-2.0f), 0xc000);
  CHECK_EQ(FloatToFp16(65504.0f), 0x7bff);
  CHECK_EQ(FloatToFp16(65520.0f), 0x7c00);  // rounds to Inf
  CHECK_EQ(FloatToFp16(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  CHECK_EQ(FloatToFp16(std::ldexp(1.0f, -25)), 0x0000);  // tie with 0 goes to even (0)
  CHECK_EQ(FloatToFp16(std::ldexp(3.0f, -25)), 0x0002);  // tie 1.5 ulp goes to 2
  CHECK_EQ(FloatToFp16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie to even
  CHECK(std::isnan(Fp16ToFloat(FloatToFp16(std::nanf("")))));
  // every finite half survives half -> float -> half
  int bad = 0;
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue;  // NaN payloads
    if (FloatToFp16(Fp16ToFloat(uint16_t(h))) != h) ++bad;
  }
  CHECK_EQ(bad, 0);
}
