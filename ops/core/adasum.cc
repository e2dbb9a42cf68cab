// Adasum's checks and its arithmetic on one node (see adasum.h).
#include "adasum.h"

#include <algorithm>
#include <cfloat>
#include <cmath>

#include "half.h"

namespace mlsl {
namespace {

// How each floating storage type is read as a double and written back (rounded once).
template <typename T> struct Plain {
  using S = T;
  static double Load(S s) { return double(s); }
  static S Store(double v) { return S(v); }
};
struct Half {
  using S = uint16_t;
  static double Load(S s) { return double(Fp16ToFloat(s)); }
  static S Store(double v) { return FloatToFp16(float(v)); }
};
struct Brain {
  using S = uint16_t;
  static double Load(S s) { return double(Bf16ToFloat(s)); }
  static S Store(double v) { return FloatToBf16(float(v)); }
};

// sums += {a.b, |a|^2, |b|^2}, in double, in element order.
template <typename C>
void Dots(const void* va, const void* vb, int64_t n, double* sums) {
  const auto* a = static_cast<const typename C::S*>(va);
  const auto* b = static_cast<const typename C::S*>(vb);
  double dot = sums[0], aa = sums[1], bb = sums[2];
  for (int64_t i = 0; i < n; ++i) {
    double x = C::Load(a[i]), y = C::Load(b[i]);
    dot += x * y;
    aa += x * x;
    bb += y * y;
  }
  sums[0] = dot;
  sums[1] = aa;
  sums[2] = bb;
}

// dst = ca * a + cb * b (dst may be a or b).
template <typename C>
void ScaledAdd(void* vdst, const void* va, const void* vb, int64_t n, double ca, double cb) {
  auto* dst = static_cast<typename C::S*>(vdst);
  const auto* a = static_cast<const typename C::S*>(va);
  const auto* b = static_cast<const typename C::S*>(vb);
  for (int64_t i = 0; i < n; ++i) dst[i] = C::Store(ca * C::Load(a[i]) + cb * C::Load(b[i]));
}

#define MLSL_ADASUM_DISPATCH(dtype, CALL)            \
  switch (dtype) {                                   \
    case DataType::kFloat16: CALL(Half); break;      \
    case DataType::kBfloat16: CALL(Brain); break;    \
    case DataType::kFloat32: CALL(Plain<float>); break;  \
    case DataType::kFloat64: CALL(Plain<double>); break; \
    default: break;                                  \
  }

// Horovod's rule: a coefficient stays 1 when its vector's squared norm is (about) zero.
void Coefficients(const double* sums, double* ca, double* cb) {
  static const double kTiny = std::sqrt(DBL_MIN);
  *ca = sums[1] >= kTiny ? 1.0 - sums[0] / sums[1] * 0.5 : 1.0;
  *cb = sums[2] >= kTiny ? 1.0 - sums[0] / sums[2] * 0.5 : 1.0;
}

}  // namespace

Status CheckAdasumType(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat16:
    case DataType::kBfloat16:
    case DataType::kFloat32:
    case DataType::kFloat64: return Status::Ok();
    default:
      return Status::InvalidArgument(std::string("the Adasum reduction supports float16, bfloat16, float32 and "
                                                 "float64 tensors, not ") + DataTypeName(dtype));
  }
}

Status CheckAdasumSize(int size, const std::string& what) {
  if (size >= 1 && (size & (size - 1)) == 0) return Status::Ok();
  return Status::InvalidArgument("the Adasum reduction needs a power-of-two number of ranks (1, 2, 4, 8 ...): " +
                                 what + " is reduced over " + std::to_string(size) + " ranks");
}

void AdasumDots(const void* a, const void* b, int64_t n, DataType dtype, double* sums) {
#define CALL(C) Dots<C>(a, b, n, sums)
  MLSL_ADASUM_DISPATCH(dtype, CALL)
#undef CALL
}

void AdasumScaledAdd(void* dst, const void* a, const void* b, int64_t n, DataType dtype, const double* sums) {
  double ca, cb;
  Coefficients(sums, &ca, &cb);
#define CALL(C) ScaledAdd<C>(dst, a, b, n, ca, cb)
  MLSL_ADASUM_DISPATCH(dtype, CALL)
#undef CALL
}

void AdasumCombine(void* a, const void* b, int64_t count, DataType dtype) {
  double sums[3] = {0, 0, 0};
  AdasumDots(a, b, count, dtype, sums);
  AdasumScaledAdd(a, a, b, count, dtype, sums);
}

}  // namespace mlsl
