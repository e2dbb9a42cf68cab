// Broadcast in pieces: piece j broadcasts bytes [j*piece, (j+1)*piece) of the root's buffer.
// The pieces do not depend on each other. A joined rank receives into scratch; a joined root
// fails the collective on every rank without a transfer.
#include <algorithm>
#include <cstring>

#include "algorithm.h"

namespace mlsl {
namespace {

class Broadcast : public Algorithm {
 public:
  Broadcast(const RequestMeta& m, Request* r, int rank, int64_t piece) : m_(m), piece_(piece) {
    bytes_ = NumElements(m.shapes[0]) * int64_t(DataTypeSize(m.dtype));
    pieces_ = std::max<int64_t>(1, (bytes_ + piece - 1) / piece);
    AllocOrScratch(r, 0, m.shapes[0], size_t(bytes_), &scratch_, &local_failure_, &out_);
    if (r && rank == m.root && out_ != r->inputs[0].data && bytes_) std::memcpy(out_, r->inputs[0].data, bytes_);
  }
  bool started_all() const override { return next_ == pieces_; }
  Status Next(Communicator* comm, std::unique_ptr<PendingOp>* op, bool* sync, int64_t* bytes) override {
    int64_t at, len;
    PieceRange(bytes_, next_++, piece_, &at, &len);
    *sync = false;
    *bytes = len;
    *op = comm->Broadcast(static_cast<char*>(out_) + at, len, m_.root);
    return Status::Ok();
  }
  void PieceDone(int) override {}
  Status Finish() override { return Status::Ok(); }

 private:
  RequestMeta m_;
  int64_t piece_, bytes_ = 0, pieces_ = 1, next_ = 0;
  void* out_ = nullptr;
  std::vector<char> scratch_;
};

}  // namespace

std::unique_ptr<Algorithm> MakeBroadcast(const RequestMeta& m, Request* r, const std::vector<bool>& joined, int rank,
                                         int64_t piece_bytes) {
  if (m.root >= 0 && m.root < int(joined.size()) && joined[m.root]) {
    return MakeFailed(Status::InvalidArgument("mlsl_tf: broadcast '" + ShownName(m.name) + "': root rank " +
                                              std::to_string(m.root) + " has already joined"));
  }
  return std::make_unique<Broadcast>(m, r, rank, piece_bytes);
}

}  // namespace mlsl
