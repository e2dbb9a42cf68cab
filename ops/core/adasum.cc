// Adasum's vector halving / distance doubling over a Communicator (see adasum.h).
#include "adasum.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <utility>
#include <vector>

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

// out = {a.b, |a|^2, |b|^2}, in double.
template <typename C>
void Dots(const void* va, const void* vb, int64_t n, double* out) {
  const auto* a = static_cast<const typename C::S*>(va);
  const auto* b = static_cast<const typename C::S*>(vb);
  double dot = 0, aa = 0, bb = 0;
  for (int64_t i = 0; i < n; ++i) {
    double x = C::Load(a[i]), y = C::Load(b[i]);
    dot += x * y;
    aa += x * x;
    bb += y * y;
  }
  out[0] = dot;
  out[1] = aa;
  out[2] = bb;
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

void DotsOf(const void* a, const void* b, int64_t n, DataType dtype, double* out) {
#define CALL(C) Dots<C>(a, b, n, out)
  MLSL_ADASUM_DISPATCH(dtype, CALL)
#undef CALL
}

// Horovod's rule: a coefficient stays 1 when its vector's squared norm is (about) zero.
void Coefficients(const double* sums, double* ca, double* cb) {
  static const double kTiny = std::sqrt(DBL_MIN);
  *ca = sums[1] >= kTiny ? 1.0 - sums[0] / sums[1] * 0.5 : 1.0;
  *cb = sums[2] >= kTiny ? 1.0 - sums[0] / sums[2] * 0.5 : 1.0;
}

void Combine(void* dst, const void* a, const void* b, int64_t n, DataType dtype, const double* sums) {
  double ca, cb;
  Coefficients(sums, &ca, &cb);
#define CALL(C) ScaledAdd<C>(dst, a, b, n, ca, cb)
  MLSL_ADASUM_DISPATCH(dtype, CALL)
#undef CALL
}

// Sends send_bytes to `partner` while receiving recv_bytes from it (an Alltoallv in which only
// the partner's slices are non-empty), in pieces the communicator can carry. The Alltoallv is
// collective, so every rank makes the same number of calls, `bound` bytes' worth (the largest
// exchange of any pair), even when its own pair has less or nothing to swap.
Status Exchange(Communicator* comm, const char* send, int64_t send_bytes, char* recv, int64_t recv_bytes,
                int partner, int64_t bound) {
  const int n = comm->size();
  const int64_t piece = std::max<int64_t>(1, comm->max_message_bytes());
  for (int64_t at = 0; at == 0 || at < bound; at += piece) {
    std::vector<int64_t> out(n, 0), in(n, 0);
    out[partner] = std::clamp<int64_t>(send_bytes - at, 0, piece);
    in[partner] = std::clamp<int64_t>(recv_bytes - at, 0, piece);
    auto op = comm->Alltoallv(send + std::min(at, send_bytes), out, recv + std::min(at, recv_bytes), in);
    Status s = Wait(op.get());
    if (!s.ok()) return s;
  }
  return Status::Ok();
}

// The sums of {a.b, |a|^2, |b|^2} over the ranks of this rank's block of `block` ranks (those
// holding pieces of the same pair), added in rank order so every member gets the same bits.
Status BlockSums(Communicator* comm, const double* mine, int block, double* sums) {
  const int n = comm->size();
  std::vector<double> all(3 * size_t(n));
  auto op = comm->Allgatherv(mine, all.data(), std::vector<int64_t>(n, 3 * sizeof(double)));
  Status s = Wait(op.get());
  if (!s.ok()) return s;
  const int first = comm->rank() / block * block;
  sums[0] = sums[1] = sums[2] = 0;
  for (int r = first; r < first + block; ++r) {
    for (int k = 0; k < 3; ++k) sums[k] += all[3 * size_t(r) + k];
  }
  return Status::Ok();
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

void AdasumCombine(void* a, const void* b, int64_t count, DataType dtype) {
  double sums[3];
  DotsOf(a, b, count, dtype, sums);
  Combine(a, a, b, count, dtype, sums);
}

Status AdasumAllreduce(Communicator* comm, void* buf, int64_t count, DataType dtype) {
  Status s = CheckAdasumType(dtype);
  if (s.ok()) s = CheckAdasumSize(comm->size(), "the tensor");
  if (!s.ok() || count == 0 || comm->size() == 1) return s;
  const int size = comm->size(), rank = comm->rank();
  const int64_t esize = int64_t(DataTypeSize(dtype));
  char* data = static_cast<char*>(buf);
  const int64_t bound = (count + 1) / 2 * esize;  // no exchange is larger
  std::vector<char> recv(static_cast<size_t>(bound));
  // This rank's segment [offset, offset + mine) of the vector, before each level.
  std::vector<std::pair<int64_t, int64_t>> segments;
  int64_t offset = 0, mine = count;
  for (int level = 1; level < size; level <<= 1) {
    const bool left = (rank & level) == 0;  // holds the "a" half of the pair
    const int64_t first = mine / 2;
    const int64_t keep_at = left ? offset : offset + first, keep = left ? first : mine - first;
    const int64_t send_at = left ? offset + first : offset, send = mine - keep;
    segments.emplace_back(offset, mine);
    s = Exchange(comm, data + send_at * esize, send * esize, recv.data(), keep * esize, rank ^ level, bound);
    if (!s.ok()) return s;
    char* own = data + keep_at * esize;
    const char* a = left ? own : recv.data();
    const char* b = left ? recv.data() : own;
    double partial[3], sums[3];
    DotsOf(a, b, keep, dtype, partial);
    s = BlockSums(comm, partial, 2 * level, sums);
    if (!s.ok()) return s;
    Combine(own, a, b, keep, dtype, sums);
    offset = keep_at;
    mine = keep;
  }
  // Distance halving: each pair swaps its combined pieces until everyone holds the whole.
  for (int level = size >> 1; level >= 1; level >>= 1) {
    const auto [whole_at, whole] = segments.back();
    segments.pop_back();
    const bool left = (rank & level) == 0;
    const int64_t other_at = left ? offset + mine : whole_at, other = whole - mine;
    s = Exchange(comm, data + offset * esize, mine * esize, data + other_at * esize, other * esize, rank ^ level,
                 bound);
    if (!s.ok()) return s;
    offset = whole_at;
    mine = whole;
  }
  return Status::Ok();
}

}  // namespace mlsl
