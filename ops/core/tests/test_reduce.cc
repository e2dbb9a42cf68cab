#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <cstdint>
#include <vector>

#include "../half.h"
#include "../reduce.h"
#include "check.h"

using namespace mlsl;

TEST(reduce_every_op_int32) {
  std::vector<int32_t> a = {1, -5, 7}, b = {4, 2, -3};
  auto run = [&](ReduceOp op) {
    std::vector<int32_t> d = a;
    ReduceInto(d.data(), b.data(), 3, DataType::kInt32, op);
    return d;
  };
  CHECK(run(ReduceOp::kSum) == (std::vector<int32_t>{5, -3, 4}));
  CHECK(run(ReduceOp::kMin) == (std::vector<int32_t>{1, -5, -3}));
  CHECK(run(ReduceOp::kMax) == (std::vector<int32_t>{4, 2, 7}));
  CHECK(run(ReduceOp::kProduct) == (std::vector<int32_t>{4, -10, -21}));
}

TEST(reduce_sixteen_bit_floats) {
  std::vector<uint16_t> h = {FloatToFp16(1.5f), FloatToFp16(-2.0f)}, g = {FloatToFp16(0.25f), FloatToFp16(8.0f)};
  ReduceInto(h.data(), g.data(), 2, DataType::kFloat16, ReduceOp::kSum);
  CHECK_EQ(Fp16ToFloat(h[0]), 1.75f);
  CHECK_EQ(Fp16ToFloat(h[1]), 6.0f);
  std::vector<uint16_t> x = {FloatToBf16(3.0f)}, y = {FloatToBf16(-1.0f)};
  ReduceInto(x.data(), y.data(), 1, DataType::kBfloat16, ReduceOp::kMin);
  CHECK_EQ(Bf16ToFloat(x[0]), -1.0f);
}

TEST(reduce_bool_and_checks) {
  std::vector<uint8_t> a = {1, 1, 0, 0}, b = {1, 0, 1, 0};
  std::vector<uint8_t> d = a;
  ReduceInto(d.data(), b.data(), 4, DataType::kBool, ReduceOp::kMax);
  CHECK(d == (std::vector<uint8_t>{1, 1, 1, 0}));
  d = a;
  ReduceInto(d.data(), b.data(), 4, DataType::kBool, ReduceOp::kMin);
  CHECK(d == (std::vector<uint8_t>{1, 0, 0, 0}));
  CHECK(!CheckReducible(DataType::kBool, ReduceOp::kSum).ok());
  CHECK(CheckReducible(DataType::kBool, ReduceOp::kMax).ok());
  CHECK(CheckReducible(DataType::kFloat32, ReduceOp::kAdasum).ok());
  CHECK(!CheckReducible(DataType::kInt32, ReduceOp::kAdasum).ok());
}

TEST(scale_and_identity) {
  std::vector<int64_t> v = {7, -7};
  ScaleInPlace(v.data(), 2, DataType::kInt64, 0.5);
  CHECK(v == (std::vector<int64_t>{3, -3}));  // truncation toward zero
  std::vector<float> f(3);
  FillIdentity(f.data(), 3, DataType::kFloat32, ReduceOp::kMin);
  CHECK(std::isinf(f[0]) && f[0] > 0);
  FillIdentity(f.data(), 3, DataType::kFloat32, ReduceOp::kProduct);
  CHECK_EQ(f[2], 1.0f);
  std::vector<int8_t> i(2);
  FillIdentity(i.data(), 2, DataType::kInt8, ReduceOp::kMax);
  CHECK_EQ(int(i[0]), -128);
}

// The vectorised kernels against a plain scalar loop: lengths around the vector widths, inputs
// that start off the vector alignment, NaN, infinities, signed zeros and wrapping integers.
template <typename T>
void CheckKernelsMatchScalar(DataType dtype, std::vector<T> pool) {
  const ReduceOp ops[] = {ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax};
  for (ReduceOp op : ops) {
    for (int64_t n : {0, 1, 7, 15, 16, 17, 31, 33, 64, 65, 257}) {
      for (int64_t shift : {0, 1, 3}) {
        std::vector<T> d(n + shift), s(n + shift), want(n + shift);
        for (int64_t i = 0; i < n + shift; ++i) {
          d[i] = pool[(i * 7 + 1) % pool.size()];
          s[i] = pool[(i * 5 + 3) % pool.size()];
        }
        for (int64_t i = shift; i < n + shift; ++i) {
          T a = d[i], b = s[i];
          switch (op) {
            case ReduceOp::kProduct: want[i] = T(a * b); break;
            case ReduceOp::kMin: want[i] = std::min(a, b); break;
            case ReduceOp::kMax: want[i] = std::max(a, b); break;
            default: want[i] = T(a + b); break;
          }
        }
        ReduceInto(d.data() + shift, s.data() + shift, n, dtype, op);
        for (int64_t i = shift; i < n + shift; ++i) {
          bool same = std::memcmp(&d[i], &want[i], sizeof(T)) == 0;
          if (!same) std::fprintf(stderr, "%s op %d n %ld i %ld\n", DataTypeName(dtype), int(op), long(n), long(i));
          CHECK(same);
        }
      }
    }
  }
}

TEST(vectorised_kernels_match_scalar_loops) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  CheckKernelsMatchScalar<float>(DataType::kFloat32, {1.5f, -0.0f, 0.0f, 3e38f, -2.25f, inf, -inf, nan, 1e-40f, 7.0f});
  const double dinf = std::numeric_limits<double>::infinity(), dnan = std::numeric_limits<double>::quiet_NaN();
  CheckKernelsMatchScalar<double>(DataType::kFloat64, {1.5, -0.0, 0.0, 1e308, -2.25, dinf, -dinf, dnan, 5e-324, 7.0});
  CheckKernelsMatchScalar<int32_t>(DataType::kInt32, {1, -5, 2147483647, -2147483647 - 1, 0, 77, -3});
  CheckKernelsMatchScalar<int64_t>(DataType::kInt64, {1, -5, INT64_MAX, INT64_MIN, 0, 77, -3});
  CheckKernelsMatchScalar<uint8_t>(DataType::kUint8, {0, 1, 200, 255, 17, 128});
  CheckKernelsMatchScalar<int8_t>(DataType::kInt8, {0, 1, -128, 127, -17, 100});
}

// ScaleInPlace's float32 and float64 loops are cloned per instruction set: every element must be
// exactly x * f in double rounded once to the type, as the scalar formula, at every length (the
// vector body and its tail) and for overflow, denormals, signed zeros, inf and NaN.
TEST(vectorised_scale_matches_the_scalar_formula) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> pattern = {1.5f, -0.0f, 0.0f, 3e38f, -2.25f, inf, -inf, nan, 1e-40f, 7.0f, 0.1f, -1e-45f, 16777217.0f};
  for (double f : {1.0 / 3.0, 0.3000000119, 2.0, 1e-300, -7.5}) {
    for (int64_t n : {1, 7, 16, 33, 1001}) {
      std::vector<float> x(n), want(n);
      std::vector<double> d(n), dwant(n);
      for (int64_t i = 0; i < n; ++i) {
        x[i] = pattern[i % pattern.size()] * float(1 + i % 3);
        want[i] = float(double(x[i]) * f);
        d[i] = double(x[i]) * 1.000000001;
        dwant[i] = d[i] * f;
      }
      ScaleInPlace(x.data(), n, DataType::kFloat32, f);
      ScaleInPlace(d.data(), n, DataType::kFloat64, f);
      CHECK(std::memcmp(x.data(), want.data(), n * sizeof(float)) == 0);
      CHECK(std::memcmp(d.data(), dwant.data(), n * sizeof(double)) == 0);
    }
  }
}

namespace {
uint32_t Bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
float FromBits(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
}  // namespace

// Every op gives the same bits whatever the operand order (ranks combine in different orders):
// NaN results are the canonical quiet NaN, Min/Max propagate NaN and put -0 below +0.
TEST(reduce_nonfinite_is_order_independent) {
  const float nan_a = FromBits(0x7fc00001u), nan_b = FromBits(0xffc01234u), inf = INFINITY;
  const std::vector<float> a = {nan_a, 1.0f, nan_a, inf, -0.0f, 0.0f, -inf, 2.0f, 0.0f};
  const std::vector<float> b = {nan_b, nan_b, 3.0f, -inf, 0.0f, -0.0f, 5.0f, nan_a, inf};
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax}) {
    std::vector<float> ab = a, ba = b;
    ReduceInto(ab.data(), b.data(), int64_t(a.size()), DataType::kFloat32, op);
    ReduceInto(ba.data(), a.data(), int64_t(a.size()), DataType::kFloat32, op);
    for (size_t i = 0; i < a.size(); ++i) {
      CHECK_EQ(Bits(ab[i]), Bits(ba[i]));
      if (std::isnan(ab[i])) CHECK_EQ(Bits(ab[i]), 0x7fc00000u);
      if (std::isnan(a[i]) || std::isnan(b[i])) CHECK(std::isnan(ab[i]));
    }
  }
  std::vector<float> mn = {-0.0f, 0.0f}, mx = {-0.0f, 0.0f};
  const std::vector<float> other = {0.0f, -0.0f};
  ReduceInto(mn.data(), other.data(), 2, DataType::kFloat32, ReduceOp::kMin);
  ReduceInto(mx.data(), other.data(), 2, DataType::kFloat32, ReduceOp::kMax);
  CHECK(std::signbit(mn[0]) && std::signbit(mn[1]));
  CHECK(!std::signbit(mx[0]) && !std::signbit(mx[1]));
  // 16-bit floats: the codec path, same rules.
  for (DataType t : {DataType::kFloat16, DataType::kBfloat16}) {
    std::vector<uint16_t> x = {uint16_t(t == DataType::kFloat16 ? 0x7e05 : 0x7fc5), 0x3c00};
    std::vector<uint16_t> y = {0x3c00, uint16_t(t == DataType::kFloat16 ? 0xfe07 : 0xffc7)};
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax}) {
      std::vector<uint16_t> xy = x, yx = y;
      ReduceInto(xy.data(), y.data(), 2, t, op);
      ReduceInto(yx.data(), x.data(), 2, t, op);
      CHECK(xy == yx);
      CHECK_EQ(int(xy[0]), t == DataType::kFloat16 ? 0x7e00 : 0x7fc0);
    }
  }
  std::vector<double> d = {NAN, 1.0}, e = {2.0, NAN};
  ReduceInto(d.data(), e.data(), 2, DataType::kFloat64, ReduceOp::kMax);
  CHECK(std::isnan(d[0]) && std::isnan(d[1]));
  std::vector<float> c = {nan_b, 1.0f};
  CanonicalizeNaN(c.data(), 2, DataType::kFloat32);
  CHECK_EQ(Bits(c[0]), 0x7fc00000u);
  CHECK_EQ(c[1], 1.0f);
}

// A reduced chunk's completion canonicalises NaNs and scales in one pass: the same bits as the
// two passes it replaces, for NaNs of any payload and sign, infinities, subnormals, every dtype.
TEST(canonicalize_and_scale_is_both_passes_in_one) {
  const std::vector<uint32_t> special = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff812345u, 0x7fbfffffu,
                                         0x7f800000u, 0xff800000u, 0x00000001u, 0x80000000u, 0x3fc00000u};
  for (double f : {0.5, 1.0 / 3.0, 1.0, 2.0, -0.25}) {
    for (int64_t n : {1, 9, 64, 1003}) {
      std::vector<float> x(n);
      std::vector<double> d(n);
      std::vector<uint16_t> h(n), b(n);
      for (int64_t i = 0; i < n; ++i) {
        uint32_t u = i % 3 == 0 ? special[(i / 3) % special.size()] : 0x3f800000u + uint32_t(i * 2654435761u % 0x1000000u);
        std::memcpy(&x[i], &u, 4);
        uint64_t w = (uint64_t(u) << 32) | uint64_t(i * 40503u);
        std::memcpy(&d[i], &w, 8);
        h[i] = uint16_t(u >> 16) ^ uint16_t(i % 2 ? 0x0400 : 0);
        b[i] = uint16_t(u >> 16);
      }
      std::vector<float> x2 = x;
      std::vector<double> d2 = d;
      std::vector<uint16_t> h2 = h, b2 = b;
      CanonicalizeNaN(x2.data(), n, DataType::kFloat32);
      ScaleInPlace(x2.data(), n, DataType::kFloat32, f);
      CanonicalizeNaN(d2.data(), n, DataType::kFloat64);
      ScaleInPlace(d2.data(), n, DataType::kFloat64, f);
      CanonicalizeNaN(h2.data(), n, DataType::kFloat16);
      ScaleInPlace(h2.data(), n, DataType::kFloat16, f);
      CanonicalizeNaN(b2.data(), n, DataType::kBfloat16);
      ScaleInPlace(b2.data(), n, DataType::kBfloat16, f);
      CanonicalizeAndScale(x.data(), n, DataType::kFloat32, f);
      CanonicalizeAndScale(d.data(), n, DataType::kFloat64, f);
      CanonicalizeAndScale(h.data(), n, DataType::kFloat16, f);
      CanonicalizeAndScale(b.data(), n, DataType::kBfloat16, f);
      CHECK(std::memcmp(x.data(), x2.data(), n * sizeof(float)) == 0);
      CHECK(std::memcmp(d.data(), d2.data(), n * sizeof(double)) == 0);
      CHECK(h == h2);
      CHECK(b == b2);
      // and NaNs come out as the one canonical quiet NaN
      for (int64_t i = 0; i < n; ++i) {
        if (x[i] != x[i]) {
          uint32_t u;
          std::memcpy(&u, &x[i], 4);
          if (u != 0x7fc00000u) { CHECK_EQ(u, 0x7fc00000u); break; }
        }
      }
    }
  }
}
