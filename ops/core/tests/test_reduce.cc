#include <cmath>
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
  CHECK(!CheckReducible(DataType::kFloat32, ReduceOp::kAdasum).ok());
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
