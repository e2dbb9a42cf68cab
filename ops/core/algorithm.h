// Algorithm: one agreed collective other than a (non-Adasum) allreduce -- broadcast, allgather,
// alltoall, reducescatter (plain or over a 16-bit wire), an Adasum allreduce, barrier -- as
// non-blocking work in pieces, each a bounded transfer of at most about piece_bytes per peer, so
// the Scheduler can start an urgent request between two pieces; nothing runs whole and nothing
// blocks (the other allreduces are the Scheduler's own chunks). Every rank makes the same pieces
// in the same order: their number and sizes come only from agreed facts (the meta, the joined
// ranks, and the counts the first piece exchanged). One file per algorithm.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "communicator.h"
#include "meta.h"
#include "operations.h"
#include "request.h"

namespace mlsl {

class Algorithm {
 public:
  virtual ~Algorithm() = default;
  // No piece is left to start.
  virtual bool started_all() const = 0;
  // Starts the next piece on comm. *sync: the piece after it may start only once this one has
  // completed on every rank (it exchanges the counts later pieces are cut by, or data the next
  // piece computes from: Adasum's levels). *bytes: what this rank moves. A failure to start is
  // this rank's; the piece still counts as started.
  virtual Status Next(Communicator* comm, std::unique_ptr<PendingOp>* op, bool* sync, int64_t* bytes) = 0;
  // Piece `index` (0-based, in start order) has completed here (pieces in flight together may
  // complete in any order; a piece that failed is not reported).
  virtual void PieceDone(int index) = 0;
  // Every piece has completed: the outputs are made final (scaling). Returns the request's Status.
  virtual Status Finish() = 0;
  // An output this rank could not allocate (made, or by its last Next): ok while none. The peers
  // cannot know it, so the Scheduler starts nothing more here and the owner fails the collective
  // on every rank; the algorithm's pieces keep writing into scratch until then.
  const Status& local_failure() const { return local_failure_; }

 protected:
  Status local_failure_;
};

// The algorithm of `way` (operations.h's choice for m), for a rank of `size` ranks (request
// null: this rank has joined and contributes the identity, or no rows). Never null: a collective
// that fails on agreed facts (a joined broadcast root, Adasum over a rank count that is not a
// power of two, a way that is not an algorithm in pieces) gets an algorithm with no pieces whose
// Finish says why; one with nothing to move (Adasum of one rank) gets no pieces and Finish makes
// its outputs.
std::unique_ptr<Algorithm> MakeAlgorithm(Way way, const RequestMeta& m, Request* r, const std::vector<bool>& joined,
                                         int rank, int size, int64_t piece_bytes);
// The same, with the way operations.h chooses for m.
std::unique_ptr<Algorithm> MakeAlgorithm(const RequestMeta& m, Request* r, const std::vector<bool>& joined, int rank,
                                         int size, int64_t piece_bytes);

// The per-algorithm factories (algo_*.cc).
std::unique_ptr<Algorithm> MakeBroadcast(const RequestMeta& m, Request* r, const std::vector<bool>& joined, int rank,
                                         int64_t piece_bytes);
std::unique_ptr<Algorithm> MakeAllgather(const RequestMeta& m, Request* r, int rank, int size, int64_t piece_bytes);
std::unique_ptr<Algorithm> MakeAlltoall(const RequestMeta& m, Request* r, int rank, int size, int64_t piece_bytes);
std::unique_ptr<Algorithm> MakeReducescatter(const RequestMeta& m, Request* r, int rank, int size,
                                             int64_t piece_bytes);
// Over a 16-bit wire (m.wire): algo_wire_reducescatter.cc.
std::unique_ptr<Algorithm> MakeWireReducescatter(const RequestMeta& m, Request* r, int rank, int size,
                                                 int64_t piece_bytes);
// An Adasum allreduce, each of the request's tensors combined on its own (algo_adasum.cc).
std::unique_ptr<Algorithm> MakeAdasum(const RequestMeta& m, Request* r, int rank, int size, int64_t piece_bytes);
// Adasum of one buffer of `count` elements in place, the same on every rank of `size` (tests).
std::unique_ptr<Algorithm> MakeAdasumVector(void* buf, int64_t count, DataType dtype, int rank, int size,
                                            int64_t piece_bytes);
std::unique_ptr<Algorithm> MakeBarrier();
std::unique_ptr<Algorithm> MakeFailed(const Status& s);

// Helpers for the algorithm files.
// r's output `index` allocated with `shape` (Request::Output); a failure (or a null buffer) is
// kept in *error -- an algorithm's local_failure_ -- and *data points into `fallback` instead,
// so nothing this rank has posted writes through a null pointer.
void AllocOrScratch(Request* r, int index, const Shape& shape, size_t bytes, std::vector<char>* fallback,
                    Status* error, void** data);
// A reducescatter's split of the agreed shape's `rows` rows (of `row` elements each) among `size`
// ranks, in rank order: rank i gets rows / size rows, and one more when i < rows % size.
struct RowSplit {
  std::vector<int64_t> rows;     // rank i's rows (its output's first dimension)
  std::vector<int64_t> counts;   // ... as elements
  std::vector<int64_t> offsets;  // where rank i's elements start in the input
};
RowSplit SplitRows(int64_t rows, int64_t row, int size);
// How many pieces of at most `piece` bytes carry the largest of `bytes` (at least 1).
int64_t PiecesFor(const std::vector<int64_t>& bytes, int64_t piece);
// The part of a `total`-byte run that piece j of `piece` bytes covers: [*at, *at + *len).
void PieceRange(int64_t total, int64_t j, int64_t piece, int64_t* at, int64_t* len);

}  // namespace mlsl
