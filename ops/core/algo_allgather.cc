// Allgather in pieces. Piece 0 allgathers each rank's row count (8 bytes); once it has completed
// everywhere, the output is allocated and piece j (j >= 1) allgathers bytes
// [(j-1)*piece, j*piece) of every rank's block into a staging buffer that is copied into place
// when the piece completes. With a single data piece the blocks land in the output directly.
// A joined rank sends no rows and receives into scratch.
#include <algorithm>
#include <cstring>

#include "algorithm.h"

namespace mlsl {
namespace {

class Allgather : public Algorithm {
 public:
  Allgather(const RequestMeta& m, Request* r, int rank, int size, int64_t piece)
      : m_(m), r_(r), size_(size), rank_(rank), piece_(piece), rows_(size, 0) {
    mine_ = r ? r->inputs[0].shape[0] : 0;
    row_bytes_ = m.RowElements(0) * int64_t(DataTypeSize(m.dtype));
  }
  bool started_all() const override { return pieces_ > 0 && next_ == pieces_ + 1; }
  Status Next(Communicator* comm, std::unique_ptr<PendingOp>* op, bool* sync, int64_t* bytes) override {
    *sync = next_ == 0;
    if (next_++ == 0) {
      *bytes = 8;
      *op = comm->Allgatherv(&mine_, rows_.data(), std::vector<int64_t>(size_, 8));
      return Status::Ok();
    }
    if (next_ == 2) Layout();
    const int64_t j = next_ - 2;
    std::vector<int64_t> len(size_), at(size_);
    for (int i = 0; i < size_; ++i) PieceRange(bytes_[i], j, piece_, &at[i], &len[i]);
    const char* in = r_ ? static_cast<const char*>(r_->inputs[0].data) : nullptr;
    *bytes = len[0];
    for (int i = 1; i < size_; ++i) *bytes += len[i];
    if (pieces_ == 1) {
      *op = comm->Allgatherv(in, out_, bytes_);
      return Status::Ok();
    }
    staging_[j].resize(std::max<int64_t>(*bytes, 1));
    *op = comm->Allgatherv(in ? in + at[rank_] : nullptr, staging_[j].data(), len);
    return Status::Ok();
  }
  void PieceDone(int index) override {
    if (index == 0 || pieces_ == 1) return;
    const int64_t j = index - 1;
    int64_t from = 0;
    for (int i = 0; i < size_; ++i) {
      int64_t at, len;
      PieceRange(bytes_[i], j, piece_, &at, &len);
      if (len) std::memcpy(static_cast<char*>(out_) + offset_[i] + at, staging_[j].data() + from, len);
      from += len;
    }
    std::vector<char>().swap(staging_[j]);
  }
  Status Finish() override { return Status::Ok(); }

 private:
  // The rows every rank sends are known: the output's shape, each block's place, the pieces.
  void Layout() {
    bytes_.resize(size_);
    offset_.resize(size_);
    int64_t total_rows = 0, at = 0;
    for (int i = 0; i < size_; ++i) {
      total_rows += rows_[i];
      bytes_[i] = rows_[i] * row_bytes_;
      offset_[i] = at;
      at += bytes_[i];
    }
    Shape shape = m_.shapes[0];
    shape[0] = total_rows;
    AllocOrScratch(r_, 0, shape, size_t(at), &scratch_, &local_failure_, &out_);
    pieces_ = PiecesFor(bytes_, piece_);
    staging_.resize(pieces_);
  }

  RequestMeta m_;
  Request* r_;
  int size_, rank_;
  int64_t piece_, mine_ = 0, row_bytes_ = 0, pieces_ = 0, next_ = 0;
  std::vector<int64_t> rows_, bytes_, offset_;
  std::vector<std::vector<char>> staging_;
  void* out_ = nullptr;
  std::vector<char> scratch_;
};

}  // namespace

std::unique_ptr<Algorithm> MakeAllgather(const RequestMeta& m, Request* r, int rank, int size, int64_t piece_bytes) {
  return std::make_unique<Allgather>(m, r, rank, size, piece_bytes);
}

}  // namespace mlsl
