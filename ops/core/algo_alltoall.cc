// Alltoall in pieces. Piece 0 allgathers every rank's split vector (rows to each peer), so every
// rank knows the whole matrix and therefore the same number of pieces; once it has completed
// everywhere the outputs are allocated and piece j (j >= 1) sends bytes [(j-1)*q, j*q) of each
// peer's slice (q = piece / size), packed, and receives into a staging buffer that is copied into
// place when the piece completes. With a single data piece the slices move directly. A joined
// rank sends and receives no rows.
#include <algorithm>
#include <cstring>

#include "algorithm.h"

namespace mlsl {
namespace {

class Alltoall : public Algorithm {
 public:
  Alltoall(const RequestMeta& m, Request* r, int rank, int size, int64_t piece)
      : m_(m), r_(r), n_(size), rank_(rank), matrix_(size_t(size) * size, 0), mine_(size, 0) {
    q_ = std::max<int64_t>(1, piece / size);
    row_bytes_ = m.RowElements(0) * int64_t(DataTypeSize(m.dtype));
    if (r) {
      if (r->splits.empty()) {
        mine_.assign(n_, r->inputs[0].shape[0] / n_);
      } else {
        mine_ = r->splits;
      }
    }
  }
  bool started_all() const override { return pieces_ > 0 && next_ == pieces_ + 1; }
  Status Next(Communicator* comm, std::unique_ptr<PendingOp>* op, bool* sync, int64_t* bytes) override {
    *sync = next_ == 0;
    if (next_++ == 0) {
      *bytes = 8 * n_;
      *op = comm->Allgatherv(mine_.data(), matrix_.data(), std::vector<int64_t>(n_, 8 * n_));
      return Status::Ok();
    }
    if (next_ == 2) Layout();
    const char* in = r_ ? static_cast<const char*>(r_->inputs[0].data) : nullptr;
    if (pieces_ == 1) {
      *bytes = 0;
      for (int64_t b : send_) *bytes += b;
      *op = comm->Alltoallv(in, send_, out_, recv_);
      return Status::Ok();
    }
    const int64_t j = next_ - 2;
    std::vector<int64_t> send_len(n_), recv_len(n_);
    int64_t send_total = 0, recv_total = 0, at;
    for (int i = 0; i < n_; ++i) {
      PieceRange(send_[i], j, q_, &at, &send_len[i]);
      PieceRange(recv_[i], j, q_, &at, &recv_len[i]);
      send_total += send_len[i];
      recv_total += recv_len[i];
    }
    Piece& p = staged_[j];
    p.send.resize(std::max<int64_t>(send_total, 1));
    p.recv.resize(std::max<int64_t>(recv_total, 1));
    int64_t packed = 0;
    for (int i = 0; i < n_; ++i) {
      PieceRange(send_[i], j, q_, &at, &send_len[i]);
      if (send_len[i]) std::memcpy(p.send.data() + packed, in + send_at_[i] + at, send_len[i]);
      packed += send_len[i];
    }
    *bytes = send_total;
    *op = comm->Alltoallv(p.send.data(), send_len, p.recv.data(), recv_len);
    return Status::Ok();
  }
  void PieceDone(int index) override {
    if (index == 0 || pieces_ == 1) return;
    const int64_t j = index - 1;
    int64_t from = 0;
    for (int i = 0; i < n_; ++i) {
      int64_t at, len;
      PieceRange(recv_[i], j, q_, &at, &len);
      if (len) std::memcpy(static_cast<char*>(out_) + recv_at_[i] + at, staged_[j].recv.data() + from, len);
      from += len;
    }
    staged_[j] = Piece();
  }
  Status Finish() override { return Status::Ok(); }

 private:
  struct Piece {
    std::vector<char> send, recv;
  };
  // The matrix is known: this rank's slices, the outputs, the pieces.
  void Layout() {
    send_.resize(n_);
    recv_.resize(n_);
    send_at_.resize(n_);
    recv_at_.resize(n_);
    std::vector<int64_t> all(matrix_.size());
    int64_t send_at = 0, recv_at = 0, rows = 0;
    for (int i = 0; i < n_; ++i) {
      send_[i] = matrix_[size_t(rank_) * n_ + i] * row_bytes_;
      recv_[i] = matrix_[size_t(i) * n_ + rank_] * row_bytes_;
      send_at_[i] = send_at;
      recv_at_[i] = recv_at;
      send_at += send_[i];
      recv_at += recv_[i];
      rows += matrix_[size_t(i) * n_ + rank_];
    }
    for (size_t i = 0; i < all.size(); ++i) all[i] = matrix_[i] * row_bytes_;
    Shape shape = m_.shapes[0];
    shape[0] = rows;
    AllocOrScratch(r_, 0, shape, size_t(recv_at), &scratch_, &local_failure_, &out_);
    if (r_) {
      void* splits = nullptr;
      AllocOrScratch(r_, 1, Shape{n_}, size_t(n_) * 4, &splits_scratch_, &local_failure_, &splits);
      for (int i = 0; i < n_; ++i) static_cast<int32_t*>(splits)[i] = int32_t(matrix_[size_t(i) * n_ + rank_]);
    }
    pieces_ = PiecesFor(all, q_);
    staged_.resize(pieces_);
  }

  RequestMeta m_;
  Request* r_;
  int n_, rank_;
  int64_t q_ = 1, row_bytes_ = 0, pieces_ = 0, next_ = 0;
  std::vector<int64_t> matrix_, mine_, send_, recv_, send_at_, recv_at_;
  std::vector<Piece> staged_;
  void* out_ = nullptr;
  std::vector<char> scratch_, splits_scratch_;
};

}  // namespace

std::unique_ptr<Algorithm> MakeAlltoall(const RequestMeta& m, Request* r, int rank, int size, int64_t piece_bytes) {
  return std::make_unique<Alltoall>(m, r, rank, size, piece_bytes);
}

}  // namespace mlsl
