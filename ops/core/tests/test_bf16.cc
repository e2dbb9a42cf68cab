// The bf16 array codec: every path this CPU can run, bit for bit, against references written
// here (not the library's FloatToBf16): an integer one that compares the dropped half with the
// halfway point, and a double-arithmetic one that rounds the exact value to a multiple of the
// bf16 unit in the last place.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "../bf16.h"
#include "check.h"

using namespace mlsl;

namespace {

uint32_t Bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
float Float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

bool IsNanBits(uint32_t u) { return (u & 0x7fffffffu) > 0x7f800000u; }

// Reference 1: keep the top half, round up when the dropped half is above 0x8000, or exactly
// 0x8000 with an odd kept half. A carry out of the mantissa moves into the exponent, which is
// the next binade (or Inf from the largest one). NaN: top half with the quiet bit set.
uint16_t RefInt(uint32_t u) {
  uint32_t hi = u >> 16, lo = u & 0xffffu;
  if (IsNanBits(u)) return uint16_t(hi | 0x0040u);
  if (lo > 0x8000u || (lo == 0x8000u && (hi & 1u))) ++hi;
  return uint16_t(hi);
}

// Reference 2: the exact value in double, divided by the bf16 ulp of its binade (2^(e-7), with
// e clamped at -126 for subnormals), rounded to nearest even by nearbyint, scaled back.
uint16_t RefDouble(uint32_t u) {
  if (IsNanBits(u)) return uint16_t((u >> 16) | 0x0040u);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const double a = std::fabs(double(Float(u)));
  if (std::isinf(a)) return uint16_t(sign | 0x7f80u);
  if (a == 0) return sign;
  int e;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1): binade exponent is e - 1
  const int binade = e - 1 < -126 ? -126 : e - 1;
  const double ulp = std::ldexp(1.0, binade - 7);
  const double r = std::nearbyint(a / ulp) * ulp;  // default rounding mode: ties to even
  if (r >= std::ldexp(1.0, 128)) return uint16_t(sign | 0x7f80u);
  const uint32_t rb = Bits(float(r));  // exact: r has at most 8 significant bits
  if ((rb & 0xffffu) != 0) return 0xdeadu;  // cannot happen; makes a broken reference loud
  return uint16_t(sign | (rb >> 16));
}

std::string Hex(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

// Values that exercise every branch: zeros, subnormals (smallest, ties, largest), normals at the
// binade edges, ties with even and odd kept halves, the top of the range, Inf, NaNs.
const std::vector<uint32_t>& Specials() {
  static const std::vector<uint32_t> v = [] {
    std::vector<uint32_t> s = {
        0x00000000u, 0x80000000u,                            // +-0
        0x00000001u, 0x80000001u,                            // smallest subnormal
        0x00007fffu, 0x00008000u, 0x00008001u,               // around the first tie (to 0)
        0x00018000u, 0x00028000u, 0x80018000u,               // subnormal ties, odd/even
        0x0000ffffu, 0x00010000u, 0x007f7fffu, 0x007f8000u,  // subnormals
        0x007fffffu, 0x807fffffu,                            // largest subnormal: -> min normal
        0x00800000u, 0x80800000u, 0x00808000u, 0x00818000u,  // min normal and ties
        0x3f800000u, 0xbf800000u, 0x3f808000u, 0x3f818000u, 0x3f808001u, 0x3f807fffu,
        0x3fff8000u, 0x3fffffffu, 0x3f7f8000u,               // round up into the next binade
        0x7f7f0000u, 0x7f7f7fffu, 0x7f7f8000u, 0x7f7fffffu,  // top: max bf16, ties to Inf
        0xff7f8000u, 0xff7fffffu, 0x7f7e8000u,               // negative top, tie kept even
        0x7f800000u, 0xff800000u,                            // +-Inf
        0x7fc00000u, 0xffc00000u, 0x7fc00001u, 0x7fffffffu,  // quiet NaNs, payloads
        0x7f800001u, 0xff800001u, 0x7f810000u, 0x7fbfffffu,  // signalling NaNs
        0xffbf1234u, 0x7fa5a5a5u,
    };
    return s;
  }();
  return v;
}

struct Case {
  uint32_t in;
  uint16_t want;
};

// The expected bits written out by hand (not computed), as a check on both references.
const Case kHandCases[] = {
    {0x00000000u, 0x0000}, {0x80000000u, 0x8000},  // +-0 keep their sign
    {0x00000001u, 0x0000}, {0x80000001u, 0x8000},  // tiny subnormals round to +-0
    {0x00008000u, 0x0000}, {0x00008001u, 0x0001},  // tie to even (0), just above rounds up
    {0x00018000u, 0x0002}, {0x00028000u, 0x0002},  // subnormal ties: odd rounds up, even stays
    {0x00010000u, 0x0001},                         // exact subnormal bf16
    {0x007fffffu, 0x0080},                         // largest subnormal rounds to min normal
    {0x00800000u, 0x0080}, {0x3f800000u, 0x3f80}, {0xbf800000u, 0xbf80},
    {0x3f808000u, 0x3f80}, {0x3f818000u, 0x3f82}, {0x3f808001u, 0x3f81},
    {0x3fffffffu, 0x4000},                         // 2 - ulp rounds up to 2: next binade
    {0x7f7f7fffu, 0x7f7f},                         // just below the top tie stays max bf16
    {0x7f7f8000u, 0x7f80}, {0xff7f8000u, 0xff80},  // top tie: odd 0x7f7f rounds to +-Inf
    {0x7f7fffffu, 0x7f80},                         // FLT_MAX -> Inf
    {0x7f7e8000u, 0x7f7e},                         // tie with even kept half stays
    {0x7f800000u, 0x7f80}, {0xff800000u, 0xff80},  // +-Inf
    {0x7fc00000u, 0x7fc0}, {0xffc00000u, 0xffc0},  // quiet NaN, sign kept
    {0x7fffffffu, 0x7fff},                         // all-ones payload, no rounding carry
    {0x7f800001u, 0x7fc0},                         // signalling NaN, payload only low: quiet
    {0xff810000u, 0xffc1},                         // signalling NaN, top payload bit kept
    {0x7fbfffffu, 0x7fff},
};

}  // namespace

TEST(bf16_references_agree_with_hand_written_bits) {
  for (const Case& c : kHandCases) {
    CHECK_EQ(RefInt(c.in), c.want);
    CHECK_EQ(RefDouble(c.in), c.want);
  }
  // The two references against each other: every special, and every 4093rd bit pattern.
  for (uint32_t u : Specials()) CHECK_EQ(RefInt(u), RefDouble(u));
  int64_t bad = 0;
  for (uint64_t u = 0; u < (uint64_t(1) << 32); u += 4093) {
    if (RefInt(uint32_t(u)) != RefDouble(uint32_t(u))) {
      if (++bad <= 5) CHECK_EQ(Hex(uint32_t(u)), "references disagree");
    }
  }
  CHECK_EQ(bad, 0);
}

TEST(bf16_paths_detected) {
  std::vector<Bf16Path> paths = AvailableBf16Paths();
  CHECK(!paths.empty());
  CHECK(paths.front() == Bf16Path::kScalar);
  CHECK(paths.back() == ActiveBf16Path());  // the fastest available one is used
  __builtin_cpu_init();
  bool has_avx2 = false, has_avx512 = false;
  for (Bf16Path p : paths) {
    has_avx2 |= p == Bf16Path::kAvx2;
    has_avx512 |= p == Bf16Path::kAvx512Bf16;
  }
  CHECK_EQ(has_avx2, bool(__builtin_cpu_supports("avx2")));
  CHECK_EQ(has_avx512, bool(__builtin_cpu_supports("avx512f") &&
                            __builtin_cpu_supports("avx512bw") &&
                            __builtin_cpu_supports("avx512bf16")));
  CHECK_EQ(std::string(Bf16PathName(Bf16Path::kScalar)), "scalar");
  CHECK_EQ(std::string(Bf16PathName(Bf16Path::kAvx2)), "avx2");
  CHECK_EQ(std::string(Bf16PathName(Bf16Path::kAvx512Bf16)), "avx512bf16");
  std::printf("  bf16 paths:");
  for (Bf16Path p : paths) std::printf(" %s", Bf16PathName(p));
  std::printf(" (active: %s)\n", Bf16PathName(ActiveBf16Path()));
}

TEST(bf16_hand_cases_every_path) {
  // Each value alone, and all of them in one array (so vector lanes see them next to others).
  std::vector<float> all;
  std::vector<uint16_t> want;
  for (const Case& c : kHandCases) {
    all.push_back(Float(c.in));
    want.push_back(c.want);
  }
  for (uint32_t u : Specials()) {
    all.push_back(Float(u));
    want.push_back(RefInt(u));
  }
  for (Bf16Path p : AvailableBf16Paths()) {
    for (const Case& c : kHandCases) {
      float f = Float(c.in);
      uint16_t got = 0xabcd;
      Fp32ToBf16With(p, &f, &got, 1);
      if (got != c.want) CHECK_EQ(std::string(Bf16PathName(p)) + " " + Hex(c.in), Hex(got));
    }
    std::vector<uint16_t> got(all.size(), 0xabcd);
    Fp32ToBf16With(p, all.data(), got.data(), int64_t(all.size()));
    for (size_t i = 0; i < all.size(); ++i) {
      if (got[i] != want[i]) {
        CHECK_EQ(std::string(Bf16PathName(p)) + " array " + Hex(Bits(all[i])), Hex(got[i]));
      }
    }
  }
}

// All 2^32 fp32 bit patterns through every path, against RefInt.
TEST(bf16_exhaustive_all_patterns_every_path) {
  const int64_t kChunk = 1 << 16;
  std::vector<uint32_t> in(kChunk);
  std::vector<uint16_t> want(kChunk), got(kChunk);
  std::vector<Bf16Path> paths = AvailableBf16Paths();
  std::vector<int64_t> bad(paths.size(), 0);
  for (uint64_t base = 0; base < (uint64_t(1) << 32); base += kChunk) {
    for (int64_t i = 0; i < kChunk; ++i) {
      in[i] = uint32_t(base + i);
      want[i] = RefInt(in[i]);
    }
    for (size_t k = 0; k < paths.size(); ++k) {
      Fp32ToBf16With(paths[k], reinterpret_cast<const float*>(in.data()), got.data(), kChunk);
      if (std::memcmp(got.data(), want.data(), kChunk * 2) == 0) continue;
      for (int64_t i = 0; i < kChunk; ++i) {
        if (got[i] != want[i] && ++bad[k] <= 3) {
          CHECK_EQ(std::string(Bf16PathName(paths[k])) + " " + Hex(in[i]) + " want " +
                       Hex(want[i]),
                   Hex(got[i]));
        }
      }
    }
  }
  for (size_t k = 0; k < paths.size(); ++k) CHECK_EQ(bad[k], 0);
}

// Lengths 0..70 at unaligned offsets: the tails (scalar or masked) give the same bits, and
// nothing past the end is written.
TEST(bf16_tails_every_path) {
  std::mt19937 rng(7);
  const std::vector<uint32_t>& sp = Specials();
  for (Bf16Path p : AvailableBf16Paths()) {
    const std::string name = Bf16PathName(p);
    for (int64_t n = 0; n <= 70; ++n) {
      for (int64_t offset : {0, 1, 3}) {
        std::vector<uint32_t> in(offset + n + 8);
        // specials (subnormals included) land in the masked/scalar tail as well as the body
        for (auto& u : in) u = (rng() & 1) ? sp[rng() % sp.size()] : uint32_t(rng());
        std::vector<uint16_t> out(offset + n + 8, 0x5a5a);
        Fp32ToBf16With(p, reinterpret_cast<const float*>(in.data() + offset), out.data() + offset,
                       n);
        for (int64_t i = 0; i < int64_t(out.size()); ++i) {
          uint16_t want = (i >= offset && i < offset + n) ? RefInt(in[i]) : uint16_t(0x5a5a);
          if (out[i] != want) {
            CHECK_EQ(name + " fp32->bf16 n=" + std::to_string(n) + " i=" + std::to_string(i),
                     Hex(out[i]) + " want " + Hex(want));
          }
        }
        // bf16 -> fp32 over the same tails
        std::vector<uint16_t> h(offset + n + 8);
        for (auto& x : h) x = uint16_t(rng());
        std::vector<uint32_t> back(offset + n + 8, 0xa5a5a5a5u);
        Bf16ToFp32With(p, h.data() + offset, reinterpret_cast<float*>(back.data() + offset), n);
        for (int64_t i = 0; i < int64_t(back.size()); ++i) {
          uint32_t want = (i >= offset && i < offset + n) ? uint32_t(h[i]) << 16 : 0xa5a5a5a5u;
          if (back[i] != want) {
            CHECK_EQ(name + " bf16->fp32 n=" + std::to_string(n) + " i=" + std::to_string(i),
                     Hex(back[i]) + " want " + Hex(want));
          }
        }
      }
    }
  }
}

TEST(bf16_negative_or_zero_length_touches_nothing) {
  for (Bf16Path p : AvailableBf16Paths()) {
    float f = 1.5f;
    uint16_t h = 0x1234;
    for (int64_t n : {int64_t(0), int64_t(-1), int64_t(-100)}) {
      Fp32ToBf16With(p, &f, &h, n);
      Bf16ToFp32With(p, &h, &f, n);
      AccumulateBf16With(p, &h, &f, n);
    }
    CHECK_EQ(h, 0x1234);
    CHECK_EQ(f, 1.5f);
  }
}

// Every one of the 65536 bf16 patterns widens to exactly its bits << 16, NaN payloads included.
TEST(bf16_to_fp32_exact_every_path) {
  std::vector<uint16_t> in(65536);
  for (uint32_t h = 0; h < 65536; ++h) in[h] = uint16_t(h);
  for (Bf16Path p : AvailableBf16Paths()) {
    std::vector<uint32_t> out(65536, 0);
    Bf16ToFp32With(p, in.data(), reinterpret_cast<float*>(out.data()), 65536);
    int bad = 0;
    for (uint32_t h = 0; h < 65536; ++h) bad += out[h] != (h << 16);
    CHECK_EQ(std::string(Bf16PathName(p)) + " mismatches " + std::to_string(bad),
             std::string(Bf16PathName(p)) + " mismatches 0");
    // and back: every non-NaN bf16 survives bf16 -> fp32 -> bf16 unchanged
    std::vector<uint16_t> again(65536);
    Fp32ToBf16With(p, reinterpret_cast<const float*>(out.data()), again.data(), 65536);
    int changed = 0;
    for (uint32_t h = 0; h < 65536; ++h) {
      uint16_t want = ((h & 0x7f80u) == 0x7f80u && (h & 0x7fu)) ? uint16_t(h | 0x40u) : uint16_t(h);
      changed += again[h] != want;
    }
    CHECK_EQ(changed, 0);
  }
  // The default entry point is the active path.
  std::vector<uint32_t> out(65536, 0);
  Bf16ToFp32(in.data(), reinterpret_cast<float*>(out.data()), 65536);
  for (uint32_t h = 0; h < 65536; h += 257) CHECK_EQ(out[h], h << 16);
}

// out[i] += float(in[i]), checked against the sum formed in double and rounded once to float
// (exact for two floats: double holds their sum to within half an fp32 ulp without double
// rounding trouble), with NaN compared as NaN.
TEST(bf16_accumulate_every_path) {
  std::mt19937 rng(11);
  const int64_t n = 1000;
  std::vector<uint16_t> in(n + 4);
  std::vector<float> init(n + 4);
  for (int64_t i = 0; i < n + 4; ++i) {
    in[i] = uint16_t(rng());
    init[i] = Float(rng());  // any pattern: subnormals, Inf and NaN too
  }
  // a few chosen pairs: cancellation, Inf - Inf, a subnormal sum, 1 + tiny
  const uint16_t pick_in[] = {0x3f80, 0xff80, 0x0001, 0x3380, 0x8000};
  const float pick_init[] = {-1.0f, INFINITY, Float(0x00000001u), 1.0f, 0.0f};
  for (int k = 0; k < 5; ++k) {
    in[k] = pick_in[k];
    init[k] = pick_init[k];
  }
  for (Bf16Path p : AvailableBf16Paths()) {
    for (int64_t len : {n, int64_t(1), int64_t(15), int64_t(17), int64_t(33)}) {
      std::vector<float> out = init;
      AccumulateBf16With(p, in.data(), out.data(), len);
      int bad = 0;
      for (int64_t i = 0; i < n + 4; ++i) {
        float want = init[i];
        if (i < len) {
          want = float(double(init[i]) + double(Float(uint32_t(in[i]) << 16)));
        }
        bool same = std::isnan(want) ? std::isnan(out[i]) : Bits(out[i]) == Bits(want);
        bad += !same;
      }
      CHECK_EQ(std::string(Bf16PathName(p)) + " len " + std::to_string(len) + " bad " +
                   std::to_string(bad),
               std::string(Bf16PathName(p)) + " len " + std::to_string(len) + " bad 0");
    }
    std::vector<float> out = init;
    AccumulateBf16With(p, in.data(), out.data(), 5);
    CHECK_EQ(out[0], 0.0f);
    CHECK(std::isnan(out[1]));
    CHECK_EQ(Bits(out[2]), 0x00010001u);  // 2^-133 + 2^-149: exact subnormal sum
    CHECK_EQ(out[3], 1.0f);                             // 1 + 2^-24 is a tie: even is 1
    CHECK_EQ(Bits(out[4]), 0x00000000u);                // +0 + -0 = +0
  }
}
