// Reducescatter (uncompressed) in pieces. The input is copied and prescaled once (a joined rank
// holds the identity); piece j reduces elements [j*e, (j+1)*e) of every rank's segment (e =
// piece bytes / element size), packed into a send buffer, straight into this rank's output.
// The segments are cut by rows of the agreed shape, so every rank makes the same pieces.
// Finish applies the postscale (and an average's division).
#include <algorithm>
#include <cstring>
#include <utility>

#include "algorithm.h"
#include "reduce.h"

namespace mlsl {
namespace {

class Reducescatter : public Algorithm {
 public:
  Reducescatter(const RequestMeta& m, Request* r, int rank, int size, int64_t piece)
      : m_(m), r_(r), n_(size), rank_(rank), esize_(int64_t(DataTypeSize(m.dtype))) {
    const Shape& shape = m.shapes[0];
    const int64_t total = NumElements(shape);
    e_ = std::max<int64_t>(1, piece / esize_);
    RowSplit split = SplitRows(shape[0], m.RowElements(0), n_);
    counts_ = std::move(split.counts);
    at_ = std::move(split.offsets);
    staging_.resize(size_t(std::max<int64_t>(total, 1) * esize_));
    if (r) {
      if (total) std::memcpy(staging_.data(), r->inputs[0].data, total * esize_);
      ScaleInPlace(staging_.data(), total, m.dtype, m.prescale);
    } else {
      FillIdentity(staging_.data(), total, m.dtype, m.reduce_op);
    }
    Shape out_shape = shape;
    out_shape[0] = split.rows[rank];
    AllocOrScratch(r, 0, out_shape, size_t(counts_[rank] * esize_), &scratch_, &local_failure_, &out_);
    pieces_ = PiecesFor(counts_, e_);
    packed_.resize(pieces_);
  }
  bool started_all() const override { return next_ == pieces_; }
  Status Next(Communicator* comm, std::unique_ptr<PendingOp>* op, bool* sync, int64_t* bytes) override {
    const int64_t j = next_++;
    *sync = false;
    char* out = static_cast<char*>(out_);
    if (pieces_ == 1) {
      *bytes = counts_[rank_] * esize_;
      *op = comm->ReduceScatter(staging_.data(), out, counts_, m_.dtype, m_.reduce_op);
      return Status::Ok();
    }
    std::vector<int64_t> len(n_);
    int64_t total = 0, at;
    for (int i = 0; i < n_; ++i) {
      PieceRange(counts_[i], j, e_, &at, &len[i]);
      total += len[i];
    }
    std::vector<char>& send = packed_[j];
    send.resize(size_t(std::max<int64_t>(total, 1) * esize_));
    int64_t packed = 0;
    for (int i = 0; i < n_; ++i) {
      PieceRange(counts_[i], j, e_, &at, &len[i]);
      if (len[i]) std::memcpy(send.data() + packed * esize_, staging_.data() + (at_[i] + at) * esize_, len[i] * esize_);
      packed += len[i];
    }
    PieceRange(counts_[rank_], j, e_, &at, &len[rank_]);
    *bytes = total * esize_;
    *op = comm->ReduceScatter(send.data(), out + at * esize_, len, m_.dtype, m_.reduce_op);
    return Status::Ok();
  }
  void PieceDone(int index) override {
    if (index < int(packed_.size())) std::vector<char>().swap(packed_[index]);
  }
  Status Finish() override {
    if (r_) {
      const double post = m_.reduce_op == ReduceOp::kAverage ? m_.postscale / n_ : m_.postscale;
      ScaleInPlace(out_, counts_[rank_], m_.dtype, post);
    }
    return Status::Ok();
  }

 private:
  RequestMeta m_;
  Request* r_;
  int n_, rank_;
  int64_t esize_, e_ = 1, pieces_ = 1, next_ = 0;
  std::vector<int64_t> counts_, at_;
  std::vector<char> staging_, scratch_;
  std::vector<std::vector<char>> packed_;
  void* out_ = nullptr;
};

}  // namespace

std::unique_ptr<Algorithm> MakeReducescatter(const RequestMeta& m, Request* r, int rank, int size,
                                             int64_t piece_bytes) {
  return std::make_unique<Reducescatter>(m, r, rank, size, piece_bytes);
}

}  // namespace mlsl
