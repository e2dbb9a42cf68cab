// Compressed (16-bit wire) reducescatter of float32 data in pieces. Piece j takes elements
// [j*e, (j+1)*e) of every rank's segment (e = piece bytes / 2), prescales them (a joined rank
// takes the identity), encodes them to the wire type and swaps them by all-to-all; when it
// completes, this rank reduces the slices it received, in rank order and in float32, into its
// output (wire.h's ReduceWireSlices). Each element is rounded once, on the way in: the bits of
// the whole collective at once, whatever the piece size. The segments are cut by rows of the
// agreed shape, so every rank makes the same pieces; none depends on another. Finish applies
// the postscale (and an average's division).
#include <algorithm>
#include <cstring>
#include <utility>

#include "algorithm.h"
#include "reduce.h"
#include "wire.h"

namespace mlsl {
namespace {

class WireReducescatter : public Algorithm {
 public:
  WireReducescatter(const RequestMeta& m, Request* r, int rank, int size, int64_t piece)
      : m_(m), r_(r), n_(size), rank_(rank), wsize_(int64_t(WireElementSize(m.wire))) {
    const Shape& shape = m.shapes[0];
    e_ = std::max<int64_t>(1, piece / wsize_);
    RowSplit split = SplitRows(shape[0], m.RowElements(0), n_);
    counts_ = std::move(split.counts);
    at_ = std::move(split.offsets);
    Shape out_shape = shape;
    out_shape[0] = split.rows[rank];
    void* out = nullptr;
    AllocOrScratch(r, 0, out_shape, size_t(counts_[rank] * sizeof(float)), &scratch_, &local_failure_, &out);
    out_ = static_cast<float*>(out);
    pieces_ = PiecesFor(counts_, e_);
    staged_.resize(pieces_);
  }
  bool started_all() const override { return next_ == pieces_; }
  Status Next(Communicator* comm, std::unique_ptr<PendingOp>* op, bool* sync, int64_t* bytes) override {
    const int64_t j = next_++;
    *sync = false;
    std::vector<int64_t> send_len(n_), recv_len(n_);
    int64_t total = 0, at, len;
    for (int i = 0; i < n_; ++i) {
      PieceRange(counts_[i], j, e_, &at, &len);
      send_len[i] = len * wsize_;
      total += len;
    }
    PieceRange(counts_[rank_], j, e_, &at, &len);
    recv_len.assign(n_, len * wsize_);
    Piece& p = staged_[j];
    p.send.resize(size_t(std::max<int64_t>(total, 1) * wsize_));
    p.recv.resize(size_t(std::max<int64_t>(len * n_, 1) * wsize_));
    int64_t packed = 0;
    for (int i = 0; i < n_; ++i) {
      PieceRange(counts_[i], j, e_, &at, &len);
      Encode(at_[i] + at, len, p.send.data() + packed * wsize_);
      packed += len;
    }
    *bytes = total * wsize_;
    *op = comm->Alltoallv(p.send.data(), send_len, p.recv.data(), recv_len);
    return Status::Ok();
  }
  void PieceDone(int index) override {
    if (index >= int(staged_.size())) return;
    int64_t at, len;
    PieceRange(counts_[rank_], index, e_, &at, &len);
    if (len) ReduceWireSlices(m_.wire, staged_[index].recv.data(), n_, len, out_ + at, m_.reduce_op, &tmp_);
    staged_[index] = Piece();
  }
  Status Finish() override {
    if (r_) {
      const double post = m_.reduce_op == ReduceOp::kAverage ? m_.postscale / n_ : m_.postscale;
      ScaleInPlace(out_, counts_[rank_], DataType::kFloat32, post);
    }
    return Status::Ok();
  }

 private:
  struct Piece {
    std::vector<char> send, recv;
  };
  // Elements [from, from + len) of the (prescaled) input, or the identity, rounded into out.
  void Encode(int64_t from, int64_t len, char* out) {
    if (!len) return;
    chunk_.resize(len);
    if (r_) {
      std::memcpy(chunk_.data(), static_cast<const float*>(r_->inputs[0].data) + from, len * sizeof(float));
      ScaleInPlace(chunk_.data(), len, DataType::kFloat32, m_.prescale);
    } else {
      FillIdentity(chunk_.data(), len, DataType::kFloat32, m_.reduce_op);
    }
    EncodeWire(m_.wire, chunk_.data(), out, len);
  }

  RequestMeta m_;
  Request* r_;
  int n_, rank_;
  int64_t wsize_, e_ = 1, pieces_ = 1, next_ = 0;
  std::vector<int64_t> counts_, at_;
  std::vector<Piece> staged_;
  std::vector<float> chunk_, tmp_;
  std::vector<char> scratch_;
  float* out_ = nullptr;
};

}  // namespace

std::unique_ptr<Algorithm> MakeWireReducescatter(const RequestMeta& m, Request* r, int rank, int size,
                                                 int64_t piece_bytes) {
  return std::make_unique<WireReducescatter>(m, r, rank, size, piece_bytes);
}

}  // namespace mlsl
