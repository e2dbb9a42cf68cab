// MakeAlgorithm (the algorithm of a way, operations.h), the barrier and failed algorithms, and the
// piece and row arithmetic shared by the algorithm files.
#include "algorithm.h"

#include <algorithm>

namespace mlsl {
namespace {

class Barrier : public Algorithm {
 public:
  bool started_all() const override { return started_; }
  Status Next(Communicator* comm, std::unique_ptr<PendingOp>* op, bool* sync, int64_t* bytes) override {
    started_ = true;
    *sync = false;
    *bytes = 0;
    *op = comm->Barrier();
    return Status::Ok();
  }
  void PieceDone(int) override {}
  Status Finish() override { return Status::Ok(); }

 private:
  bool started_ = false;
};

class Failed : public Algorithm {
 public:
  explicit Failed(Status s) : status_(std::move(s)) {}
  bool started_all() const override { return true; }
  Status Next(Communicator*, std::unique_ptr<PendingOp>*, bool*, int64_t*) override {
    return Status::Internal("a failed collective has no pieces");
  }
  void PieceDone(int) override {}
  Status Finish() override { return status_; }

 private:
  Status status_;
};

}  // namespace

std::unique_ptr<Algorithm> MakeBarrier() { return std::make_unique<Barrier>(); }
std::unique_ptr<Algorithm> MakeFailed(const Status& s) { return std::make_unique<Failed>(s); }

std::unique_ptr<Algorithm> MakeAlgorithm(const RequestMeta& m, Request* r, const std::vector<bool>& joined, int rank,
                                         int size, int64_t piece_bytes) {
  return MakeAlgorithm(ChooseRequest(FactsOf(m)), m, r, joined, rank, size, piece_bytes);
}

std::unique_ptr<Algorithm> MakeAlgorithm(Way way, const RequestMeta& m, Request* r, const std::vector<bool>& joined,
                                         int rank, int size, int64_t piece_bytes) {
  piece_bytes = std::max<int64_t>(piece_bytes, 1);
  switch (way) {
    case Way::kBroadcast: return MakeBroadcast(m, r, joined, rank, piece_bytes);
    case Way::kAllgather: return MakeAllgather(m, r, rank, size, piece_bytes);
    case Way::kAlltoall: return MakeAlltoall(m, r, rank, size, piece_bytes);
    case Way::kWireReducescatter: return MakeWireReducescatter(m, r, rank, size, piece_bytes);
    case Way::kReducescatter: return MakeReducescatter(m, r, rank, size, piece_bytes);
    case Way::kBarrier: return MakeBarrier();
    case Way::kAdasum: return MakeAdasum(m, r, rank, size, piece_bytes);
    default: break;
  }
  // Other allreduces are the Scheduler's chunks; join and group changes the Runtime's own.
  return MakeFailed(Status::Internal(std::string(OpTypeName(m.op)) + " is not run as an algorithm in pieces"));
}

void AllocOrScratch(Request* r, int index, const Shape& shape, size_t bytes, std::vector<char>* fallback,
                    Status* error, void** data) {
  *data = nullptr;
  if (r) {
    Status s = r->Output(index, shape, data);  // a null buffer for bytes that exist is its failure
    if (!s.ok()) {
      if (error->ok()) *error = s;
      *data = nullptr;
    }
  }
  if (!*data) {
    fallback->resize(std::max<size_t>(bytes, 1));
    *data = fallback->data();
  }
}

RowSplit SplitRows(int64_t rows, int64_t row, int size) {
  RowSplit split{std::vector<int64_t>(size), std::vector<int64_t>(size), std::vector<int64_t>(size)};
  int64_t at = 0;
  for (int i = 0; i < size; ++i) {
    split.rows[i] = rows / size + (i < rows % size ? 1 : 0);
    split.counts[i] = split.rows[i] * row;
    split.offsets[i] = at;
    at += split.counts[i];
  }
  return split;
}

int64_t PiecesFor(const std::vector<int64_t>& bytes, int64_t piece) {
  int64_t most = 0;
  for (int64_t b : bytes) most = std::max(most, b);
  return std::max<int64_t>(1, (most + piece - 1) / piece);
}

void PieceRange(int64_t total, int64_t j, int64_t piece, int64_t* at, int64_t* len) {
  *at = std::min(total, j * piece);
  *len = std::min(piece, total - *at);
}

}  // namespace mlsl
