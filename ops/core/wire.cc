// The 16-bit wire collectives (wire.h): the codec entry points, the two-step allreduce, and the
// float32 reduction of received slices.
#include "wire.h"

#include <cmath>
#include <cstring>

#include "bf16.h"
#include "half.h"
#include "reduce.h"

namespace mlsl {
namespace {

// Reduces n wire elements into the float32 accumulator; decodes through `tmp`.
void ReduceWireInto(DataType wire, const void* in, float* acc, int64_t n, ReduceOp op, std::vector<float>* tmp) {
  if (wire == DataType::kBfloat16 && (op == ReduceOp::kSum || op == ReduceOp::kAverage)) {
    AccumulateBf16(static_cast<const uint16_t*>(in), acc, n);
    return;
  }
  tmp->resize(n);
  DecodeWire(wire, in, tmp->data(), n);
  ReduceInto(acc, tmp->data(), n, DataType::kFloat32, op);
}

// Elements of slice r when n elements are cut into p near-equal slices (the first n % p get one more).
std::vector<int64_t> Slices(int64_t n, int p) {
  std::vector<int64_t> c(p);
  for (int r = 0; r < p; ++r) c[r] = n / p + (r < n % p ? 1 : 0);
  return c;
}

// Rounds in (+ residual) to the wire; the residual becomes what the rounding lost -- 0 where that
// is not finite (an Inf or NaN input, or a sum that overflowed): a residual holding Inf or NaN
// would add it to the element at every later step, one overflow step would poison it for good.
void EncodeWithFeedback(DataType wire, const float* in, float* residual, void* out, int64_t n, WireScratch* s) {
  if (!residual) {
    EncodeWire(wire, in, out, n);
    return;
  }
  s->corrected.resize(n);
  s->back.resize(n);
  float* corrected = s->corrected.data();
  for (int64_t i = 0; i < n; ++i) corrected[i] = in[i] + residual[i];
  EncodeWire(wire, corrected, out, n);
  DecodeWire(wire, out, s->back.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    const float lost = corrected[i] - s->back[i];
    residual[i] = std::isfinite(lost) ? lost : 0.0f;
  }
}

std::vector<int64_t> Scaled(const std::vector<int64_t>& v, int64_t k) {
  std::vector<int64_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = v[i] * k;
  return out;
}

// Step 1 (all-to-all of encoded slices) and the float32 reduction of this rank's slice.
class SliceReduce {
 public:
  SliceReduce(Communicator* comm, const float* in, std::vector<int64_t> counts, DataType wire, ReduceOp op,
              WireScratch* scratch, float* res_in = nullptr)
      : comm_(comm), counts_(std::move(counts)), wire_(wire), op_(op), esize_(WireElementSize(wire)), s_(scratch) {
    int64_t n = 0;
    for (int64_t c : counts_) n += c;
    const int p = comm_->size();
    const int64_t mine = counts_[comm_->rank()];
    s_->encoded.resize(n * esize_);
    EncodeWithFeedback(wire_, in, res_in, s_->encoded.data(), n, s_);
    s_->received.resize(p * mine * esize_);
    op_step_ = comm_->Alltoallv(s_->encoded.data(), Scaled(counts_, esize_), s_->received.data(),
                                std::vector<int64_t>(p, mine * int64_t(esize_)));
  }
  Status Test(bool* done) { return op_step_->Test(done); }
  // After Test reported done: acc (counts[rank] elements) = the float32 reduction, in rank order.
  void Reduce(float* acc) {
    ReduceWireSlices(wire_, s_->received.data(), comm_->size(), counts_[comm_->rank()], acc, op_, &s_->tmp);
  }
  std::vector<char>& encoded() { return s_->encoded; }

 private:
  Communicator* comm_;
  std::vector<int64_t> counts_;
  DataType wire_;
  ReduceOp op_;
  size_t esize_;
  WireScratch* s_;
  std::unique_ptr<PendingOp> op_step_;
};

class WireAllreduce : public PendingOp {
 public:
  WireAllreduce(Communicator* comm, const float* in, float* buf, int64_t n, DataType wire, ReduceOp op,
                WireScratch* scratch, float* res_in, float* res_out, double scale)
      : comm_(comm), buf_(buf), n_(n), wire_(wire), res_out_(res_out), scale_(scale), s_(scratch),
        counts_(Slices(n, comm->size())), slices_(comm, in, counts_, wire, op, scratch, res_in) {}

  Status Test(bool* done) override {
    *done = false;
    if (!gather_) {
      bool step_done = false;
      Status s = slices_.Test(&step_done);
      if (!s.ok() || !step_done) return s;
      const int64_t mine = counts_[comm_->rank()];
      s_->acc.resize(mine);
      slices_.Reduce(s_->acc.data());
      ScaleInPlace(s_->acc.data(), mine, DataType::kFloat32, scale_);
      const size_t esize = WireElementSize(wire_);
      s_->reduced.resize(mine * esize);
      int64_t first = 0;
      for (int r = 0; r < comm_->rank(); ++r) first += counts_[r];
      EncodeWithFeedback(wire_, s_->acc.data(), res_out_ ? res_out_ + first : nullptr, s_->reduced.data(), mine, s_);
      gather_ = comm_->Allgatherv(s_->reduced.data(), slices_.encoded().data(), Scaled(counts_, esize));
    }
    Status s = gather_->Test(done);
    if (s.ok() && *done) DecodeWire(wire_, slices_.encoded().data(), buf_, n_);
    return s;
  }

 private:
  Communicator* comm_;
  float* buf_;
  int64_t n_;
  DataType wire_;
  float* res_out_;
  double scale_;
  WireScratch* s_;
  std::vector<int64_t> counts_;
  SliceReduce slices_;
  std::unique_ptr<PendingOp> gather_;
};

}  // namespace

bool IsCompressedWire(DataType wire) { return wire == DataType::kBfloat16 || wire == DataType::kFloat16; }

size_t WireElementSize(DataType wire) { return IsCompressedWire(wire) ? 2 : 4; }

void EncodeWire(DataType wire, const float* in, void* out, int64_t n) {
  uint16_t* o = static_cast<uint16_t*>(out);
  if (wire == DataType::kBfloat16) {
    Fp32ToBf16(in, o, n);
  } else if (wire == DataType::kFloat16) {
    for (int64_t i = 0; i < n; ++i) o[i] = FloatToFp16(in[i]);
  } else if (n) {
    std::memcpy(out, in, n * sizeof(float));
  }
}

void DecodeWire(DataType wire, const void* in, float* out, int64_t n) {
  const uint16_t* h = static_cast<const uint16_t*>(in);
  if (wire == DataType::kBfloat16) {
    Bf16ToFp32(h, out, n);
  } else if (wire == DataType::kFloat16) {
    for (int64_t i = 0; i < n; ++i) out[i] = Fp16ToFloat(h[i]);
  } else if (n) {
    std::memcpy(out, in, n * sizeof(float));
  }
}

std::unique_ptr<PendingOp> StartWireAllreduce(Communicator* comm, const float* in, float* buf, int64_t n, DataType wire,
                                              ReduceOp op, WireScratch* scratch, float* res_in, float* res_out,
                                              double scale) {
  return std::make_unique<WireAllreduce>(comm, in, buf, n, wire, op, scratch, res_in, res_out, scale);
}

void ReduceWireSlices(DataType wire, const void* slices, int ranks, int64_t n, float* acc, ReduceOp op,
                      std::vector<float>* tmp) {
  const char* in = static_cast<const char*>(slices);
  const int64_t stride = n * int64_t(WireElementSize(wire));
  DecodeWire(wire, in, acc, n);
  for (int r = 1; r < ranks; ++r) ReduceWireInto(wire, in + r * stride, acc, n, op, tmp);
}

}  // namespace mlsl
