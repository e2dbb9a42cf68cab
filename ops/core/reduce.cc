#include "reduce.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "adasum.h"
#include "half.h"

namespace mlsl {
namespace {

// A "storage" type and how to load/store it as an arithmetic value.
template <typename S> struct Native {
  using V = S;
  static V Load(S s) { return s; }
  static S Store(V v) { return v; }
};
struct Half16 {
  using V = float;
  static V Load(uint16_t s) { return Fp16ToFloat(s); }
  static uint16_t Store(V v) { return FloatToFp16(v); }
};
struct Brain16 {
  using V = float;
  static V Load(uint16_t s) { return Bf16ToFloat(s); }
  static uint16_t Store(V v) { return FloatToBf16(v); }
};

// The hot loops for types the CPU adds natively: restrict pointers so the compiler vectorises
// them, one clone per instruction set (the loader picks the widest this CPU has). MPICH's own
// reductions are scalar loops, which made the sum most of a large allreduce's time.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MLSL_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define MLSL_CLONES  // other CPUs and compilers: the compiler's own vectorisation of the loop
#endif
// Floating-point results are the same bits whatever the operand order, so every rank holds the
// same bits however MPI combined the ranks' data: a NaN result is always the one canonical
// quiet NaN (x86 keeps the first operand's payload and sign), Min and Max propagate NaN (as
// np.minimum / np.maximum do; a plain `a < b ? a : b` keeps or drops it by operand order) and
// order -0 before +0 (IEEE 754-2019 minimum / maximum).
template <typename V> inline V Canon(V v) {
  if constexpr (std::is_floating_point_v<V>) return v == v ? v : std::numeric_limits<V>::quiet_NaN();
  return v;
}
template <typename V> inline V MinOf(V a, V b) {
  if constexpr (std::is_floating_point_v<V>) {
    if (a != a || b != b) return std::numeric_limits<V>::quiet_NaN();
    if (a == b) return std::signbit(a) ? a : b;  // equal values differ only as -0 / +0
  }
  return b < a ? b : a;
}
template <typename V> inline V MaxOf(V a, V b) {
  if constexpr (std::is_floating_point_v<V>) {
    if (a != a || b != b) return std::numeric_limits<V>::quiet_NaN();
    if (a == b) return std::signbit(a) ? b : a;
  }
  return a < b ? b : a;
}

#define MLSL_KERNELS(T)                                                                                   \
  MLSL_CLONES void Sum(T* __restrict d, const T* __restrict s, int64_t n) {                              \
    for (int64_t i = 0; i < n; ++i) d[i] = Canon(T(d[i] + s[i]));                                         \
  }                                                                                                       \
  MLSL_CLONES void Prod(T* __restrict d, const T* __restrict s, int64_t n) {                             \
    for (int64_t i = 0; i < n; ++i) d[i] = Canon(T(d[i] * s[i]));                                         \
  }                                                                                                       \
  MLSL_CLONES void Min(T* __restrict d, const T* __restrict s, int64_t n) {                              \
    for (int64_t i = 0; i < n; ++i) d[i] = MinOf(d[i], s[i]);                                             \
  }                                                                                                       \
  MLSL_CLONES void Max(T* __restrict d, const T* __restrict s, int64_t n) {                              \
    for (int64_t i = 0; i < n; ++i) d[i] = MaxOf(d[i], s[i]);                                             \
  }
// x times f in double, rounded once back to float: the arithmetic of every ScaleInPlace.
MLSL_CLONES void Scale(float* __restrict d, int64_t n, double f) {
  for (int64_t i = 0; i < n; ++i) d[i] = float(double(d[i]) * f);
}
MLSL_CLONES void Scale(double* __restrict d, int64_t n, double f) {
  for (int64_t i = 0; i < n; ++i) d[i] = d[i] * f;
}
// Both of a result's passes in one: Canon, then Scale, per element (the same bits as the two).
MLSL_CLONES void CanonScale(float* __restrict d, int64_t n, double f) {
  for (int64_t i = 0; i < n; ++i) d[i] = float(double(Canon(d[i])) * f);
}
MLSL_CLONES void CanonScale(double* __restrict d, int64_t n, double f) {
  for (int64_t i = 0; i < n; ++i) d[i] = Canon(d[i]) * f;
}
MLSL_KERNELS(float)
MLSL_KERNELS(double)
MLSL_KERNELS(int32_t)
MLSL_KERNELS(int64_t)
MLSL_KERNELS(uint8_t)
MLSL_KERNELS(int8_t)
MLSL_KERNELS(uint16_t)
MLSL_KERNELS(int16_t)
#undef MLSL_KERNELS
#undef MLSL_CLONES

template <typename S, typename C>
void ReduceTyped(S* dst, const S* src, int64_t n, ReduceOp op) {
  using V = typename C::V;
  if constexpr (std::is_same_v<C, Native<S>>) {
    switch (op) {
      case ReduceOp::kAverage:
      case ReduceOp::kSum:
      case ReduceOp::kAdasum: Sum(dst, src, n); return;
      case ReduceOp::kProduct: Prod(dst, src, n); return;
      case ReduceOp::kMin: Min(dst, src, n); return;
      case ReduceOp::kMax: Max(dst, src, n); return;
    }
  }
  switch (op) {
    case ReduceOp::kAverage:
    case ReduceOp::kSum:
    case ReduceOp::kAdasum:
      for (int64_t i = 0; i < n; ++i) dst[i] = C::Store(Canon(V(C::Load(dst[i]) + C::Load(src[i]))));
      break;
    case ReduceOp::kProduct:
      for (int64_t i = 0; i < n; ++i) dst[i] = C::Store(Canon(V(C::Load(dst[i]) * C::Load(src[i]))));
      break;
    case ReduceOp::kMin:
      for (int64_t i = 0; i < n; ++i) dst[i] = C::Store(MinOf(C::Load(dst[i]), C::Load(src[i])));
      break;
    case ReduceOp::kMax:
      for (int64_t i = 0; i < n; ++i) dst[i] = C::Store(MaxOf(C::Load(dst[i]), C::Load(src[i])));
      break;
  }
}

void ReduceBool(uint8_t* dst, const uint8_t* src, int64_t n, ReduceOp op) {
  // Min and Product are logical AND, Max is logical OR.
  if (op == ReduceOp::kMax) {
    for (int64_t i = 0; i < n; ++i) dst[i] = (dst[i] || src[i]) ? 1 : 0;
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = (dst[i] && src[i]) ? 1 : 0;
  }
}

template <typename S, typename C>
void ScaleTyped(S* data, int64_t n, double f) {
  if constexpr (std::is_same_v<C, Native<S>> && std::is_floating_point_v<S>) {
    Scale(data, n, f);
  } else {
    for (int64_t i = 0; i < n; ++i) data[i] = C::Store(typename C::V(double(C::Load(data[i])) * f));
  }
}

template <typename S, typename C>
void FillTyped(S* data, int64_t n, ReduceOp op) {
  using V = typename C::V;
  V v = V(0);
  if (op == ReduceOp::kProduct) v = V(1);
  if (op == ReduceOp::kMin) v = std::numeric_limits<V>::has_infinity ? std::numeric_limits<V>::infinity() : std::numeric_limits<V>::max();
  if (op == ReduceOp::kMax) v = std::numeric_limits<V>::has_infinity ? -std::numeric_limits<V>::infinity() : std::numeric_limits<V>::lowest();
  S s = C::Store(v);
  std::fill(data, data + n, s);
}

// Calls f.template operator()<Storage, Codec>() for the dtype.
#define MLSL_DISPATCH(dtype, CALL)                                          \
  switch (dtype) {                                                          \
    case DataType::kUint8: CALL(uint8_t, Native<uint8_t>); break;           \
    case DataType::kInt8: CALL(int8_t, Native<int8_t>); break;              \
    case DataType::kInt32: CALL(int32_t, Native<int32_t>); break;           \
    case DataType::kInt64: CALL(int64_t, Native<int64_t>); break;           \
    case DataType::kFloat16: CALL(uint16_t, Half16); break;                 \
    case DataType::kBfloat16: CALL(uint16_t, Brain16); break;               \
    case DataType::kFloat32: CALL(float, Native<float>); break;             \
    case DataType::kFloat64: CALL(double, Native<double>); break;           \
    case DataType::kBool: CALL(uint8_t, Native<uint8_t>); break;            \
    case DataType::kUint16: CALL(uint16_t, Native<uint16_t>); break;        \
    case DataType::kInt16: CALL(int16_t, Native<int16_t>); break;           \
  }

}  // namespace

Status CheckReducible(DataType dtype, ReduceOp op) {
  if (op == ReduceOp::kAdasum) return CheckAdasumType(dtype);
  if (dtype == DataType::kBool && (op == ReduceOp::kSum || op == ReduceOp::kAverage)) {
    return Status::InvalidArgument(std::string("reduction ") + ReduceOpName(op) +
                                   " is not meaningful for bool tensors (use Min, Max or Product)");
  }
  return Status::Ok();
}

void ReduceInto(void* dst, const void* src, int64_t count, DataType dtype, ReduceOp op) {
  if (dtype == DataType::kBool) {
    ReduceBool(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), count, op);
    return;
  }
#define CALL(S, C) ReduceTyped<S, C>(static_cast<S*>(dst), static_cast<const S*>(src), count, op)
  MLSL_DISPATCH(dtype, CALL)
#undef CALL
}

void CanonicalizeNaN(void* data, int64_t count, DataType dtype) {
  if (dtype == DataType::kFloat32) {
    float* d = static_cast<float*>(data);
    for (int64_t i = 0; i < count; ++i) d[i] = Canon(d[i]);
  } else if (dtype == DataType::kFloat64) {
    double* d = static_cast<double*>(data);
    for (int64_t i = 0; i < count; ++i) d[i] = Canon(d[i]);
  } else if (dtype == DataType::kFloat16 || dtype == DataType::kBfloat16) {
    uint16_t* d = static_cast<uint16_t*>(data);
    const uint16_t exp = dtype == DataType::kFloat16 ? 0x7c00 : 0x7f80, nan = dtype == DataType::kFloat16 ? 0x7e00 : 0x7fc0;
    for (int64_t i = 0; i < count; ++i) {
      if ((d[i] & exp) == exp && (d[i] & uint16_t(~exp & 0x7fff))) d[i] = nan;
    }
  }
}

void ScaleInPlace(void* data, int64_t count, DataType dtype, double factor) {
  if (factor == 1.0 || dtype == DataType::kBool) return;
#define CALL(S, C) ScaleTyped<S, C>(static_cast<S*>(data), count, factor)
  MLSL_DISPATCH(dtype, CALL)
#undef CALL
}

void CanonicalizeAndScale(void* data, int64_t count, DataType dtype, double factor) {
  if (factor != 1.0 && dtype == DataType::kFloat32) {
    CanonScale(static_cast<float*>(data), count, factor);
  } else if (factor != 1.0 && dtype == DataType::kFloat64) {
    CanonScale(static_cast<double*>(data), count, factor);
  } else {
    CanonicalizeNaN(data, count, dtype);
    ScaleInPlace(data, count, dtype, factor);
  }
}

void FillIdentity(void* data, int64_t count, DataType dtype, ReduceOp op) {
  if (dtype == DataType::kBool) {
    std::fill(static_cast<uint8_t*>(data), static_cast<uint8_t*>(data) + count,
              uint8_t(op == ReduceOp::kMax ? 0 : (op == ReduceOp::kSum || op == ReduceOp::kAverage) ? 0 : 1));
    return;
  }
#define CALL(S, C) FillTyped<S, C>(static_cast<S*>(data), count, op)
  MLSL_DISPATCH(dtype, CALL)
#undef CALL
}

}  // namespace mlsl
