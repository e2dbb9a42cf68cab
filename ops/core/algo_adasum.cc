// Adasum allreduce in pieces (adasum.h has the arithmetic). One vector runs as recursive vector
// halving / distance doubling: at level d (distance 2^d) each rank swaps half of its segment with
// its partner rank ^ 2^d (exchange pieces of at most `piece` bytes per peer), adds up the dot
// products of the half it keeps as the pieces arrive (in element order, so the bits are those of
// one pass), allgathers them (one piece: the sums of its block of 2^(d+1) ranks, added in rank
// order), and combines the half. Distance halving then swaps the combined segments back until
// every rank holds the whole. The number of pieces of each level comes from the element count
// alone, so every rank cuts the same pieces, pairs with less to swap included. *sync marks the
// last exchange piece of a level and its allgather: what follows reads their data. The work on
// the data is spread over the pieces too (each element is computed exactly as in one pass): a
// piece of the first level copies and prescales the input it covers, a piece of a later level
// (or of the first halving) combines the previous level's elements it sends and keeps.
// A request's tensors run one after the other, each combined on its own; a joined rank
// contributes zeros, which leave the other side of each pair as it is.
#include <algorithm>
#include <cstring>
#include <memory>

#include "adasum.h"
#include "algorithm.h"
#include "reduce.h"

namespace mlsl {
namespace {

// One exchange piece: a send to the partner and a receive from it, each posted only when it
// has bytes (the two ranks of a pair compute the same two sizes, crossed, from the element count
// alone, so each message posted is matched by one of the same size; a pair with nothing to swap
// posts nothing and is done at once). Done when both are.
// The tag: both ranks start the same piece on the same communicator (the Scheduler gives unit
// seq to slot seq % inflight on every rank, each slot its own communicator), and every rank
// takes one tag from that communicator's TagSequence per exchange piece, in the same order, so
// the partners' tags agree. A ring allreduce or all-to-all on that communicator takes its own
// tag from the same sequence, and so does another Adasum's piece, so no two point-to-point
// operations started on one communicator within 32767 of each other share a tag: none can
// match another's messages, however the ranks' postings interleave (a slot runs one unit at a
// time here, but the partner may still be posting the previous one's messages).
class PairExchange : public PendingOp {
 public:
  PairExchange(Communicator* comm, int tag, int peer, const void* send, int64_t send_bytes, void* recv,
               int64_t recv_bytes) {
    if (recv_bytes > 0) recv_ = comm->Recv(recv, recv_bytes, peer, tag);
    if (send_bytes > 0) send_ = comm->Send(send, send_bytes, peer, tag);
  }
  Status Test(bool* done) override {
    *done = false;
    for (std::unique_ptr<PendingOp>* op : {&recv_, &send_}) {
      if (!*op) continue;
      bool finished = false;
      Status s = (*op)->Test(&finished);
      if (!s.ok()) return s;
      if (finished) op->reset();
    }
    *done = !recv_ && !send_;
    return Status::Ok();
  }

 private:
  std::unique_ptr<PendingOp> recv_, send_;
};

class AdasumVector : public Algorithm {
 public:
  // buf: where the result goes; src: the input (buf itself, or null: buf already holds it),
  // multiplied by prescale as the first level's pieces take it.
  AdasumVector(void* buf, const void* src, double prescale, int64_t count, DataType dtype, int rank, int size,
               int64_t piece)
      : data_(static_cast<char*>(buf)), src_(static_cast<const char*>(src)), prescale_(prescale), dtype_(dtype),
        esize_(int64_t(DataTypeSize(dtype))), rank_(rank) {
    if (count == 0 || size <= 1) {
      Fill(0, count);  // nothing to exchange
      return;
    }
    e_ = std::max<int64_t>(1, piece / esize_);
    Plan(count, size);
  }
  int64_t pieces() const { return int64_t(steps_.size()); }
  bool started_all() const override { return next_ == int(steps_.size()); }
  Status Next(Communicator* comm, std::unique_ptr<PendingOp>* op, bool* sync, int64_t* bytes) override {
    const int index = next_++;
    const Step& s = steps_[index];
    *sync = s.sync;
    *bytes = 0;
    if (s.kind == kGather) {
      *bytes = sizeof(sums_);
      all_sums_.assign(3 * size_t(comm->size()), 0.0);
      *op = comm->Allgatherv(sums_, all_sums_.data(), std::vector<int64_t>(comm->size(), sizeof(sums_)));
      return Status::Ok();
    }
    const Level& l = levels_[s.level];
    const bool doubling = s.kind == kDoubling;
    if (doubling && s.piece == 0) {
      Recv(s.level).Reserve(std::max<int64_t>(l.keep, 1) * esize_);
      sums_[0] = sums_[1] = sums_[2] = 0;
      dots_next_ = index;
    }
    Prepare(s);
    // Doubling: send the half given away, receive the partner's copy of the half kept.
    // Halving: send the combined segment kept, receive the partner's into the half given away.
    const int64_t send_at = doubling ? l.send_at : l.keep_at, send = doubling ? l.send : l.keep;
    char* recv = doubling ? Recv(s.level).data() : data_ + l.send_at * esize_;
    int64_t out_at, out_len, in_at, in_len;
    PieceRange(send, s.piece, e_, &out_at, &out_len);
    PieceRange(doubling ? l.keep : l.send, s.piece, e_, &in_at, &in_len);
    *bytes = out_len * esize_;
    // Every rank takes a tag for every exchange piece (even one it posts nothing for), so the
    // communicator's tags stay agreed for what follows it (see PairExchange).
    const int tag = comm->NextTag(), peer = rank_ ^ l.dist;
    *op = std::make_unique<PairExchange>(comm, tag, peer, data_ + (send_at + out_at) * esize_, out_len * esize_,
                                         recv + in_at * esize_, in_len * esize_);
    return Status::Ok();
  }
  void PieceDone(int index) override {
    if (index >= int(steps_.size())) return;
    done_[index] = true;
    const Step& s = steps_[index];
    if (s.kind == kDoubling) AddDots();
    if (s.kind == kGather) BlockSums(s.level);
  }
  Status Finish() override { return Status::Ok(); }

 private:
  enum Kind { kDoubling, kGather, kHalving };
  struct Level {
    int dist = 1;
    bool left = true;
    int64_t keep_at = 0, keep = 0, send_at = 0, send = 0, pieces = 1;
    double sums[3] = {0, 0, 0};  // the block's {a.b, |a|^2, |b|^2}, once its allgather is done
  };
  struct Step {
    Kind kind;
    int level;
    int64_t piece;
    bool sync;
  };

  // This rank's segment at each level, and the pieces: each level's exchange, then its
  // allgather; then the halving exchanges, level by level back.
  void Plan(int64_t count, int size) {
    int64_t offset = 0, mine = count;
    int64_t largest = count;  // the largest segment any rank holds: every rank cuts as many pieces
    for (int dist = 1; dist < size; dist <<= 1) {
      Level l;
      l.dist = dist;
      l.left = (rank_ & dist) == 0;
      const int64_t first = mine / 2;
      l.keep_at = l.left ? offset : offset + first;
      l.keep = l.left ? first : mine - first;
      l.send_at = l.left ? offset + first : offset;
      l.send = mine - l.keep;
      largest = (largest + 1) / 2;  // no pair swaps more than ceil(count / 2^(d+1)) elements
      l.pieces = std::max<int64_t>(1, (largest + e_ - 1) / e_);
      levels_.push_back(l);
      offset = l.keep_at;
      mine = l.keep;
    }
    const int depth = int(levels_.size());
    for (int d = 0; d < depth; ++d) {
      for (int64_t j = 0; j < levels_[d].pieces; ++j) steps_.push_back({kDoubling, d, j, j + 1 == levels_[d].pieces});
      steps_.push_back({kGather, d, 0, true});
    }
    for (int d = depth - 1; d >= 0; --d) {
      for (int64_t j = 0; j < levels_[d].pieces; ++j) {
        steps_.push_back({kHalving, d, j, d > 0 && j + 1 == levels_[d].pieces});
      }
    }
    done_.assign(steps_.size(), false);
  }
  // Not zeroed: the pages are touched as the pieces arrive, not all at once before the first.
  struct Buffer {
    std::unique_ptr<char[]> bytes;
    int64_t size = 0;
    void Reserve(int64_t n) {
      if (n <= size) return;
      bytes.reset(new char[size_t(n)]);
      size = n;
    }
    char* data() const { return bytes.get(); }
  };
  Buffer& Recv(int level) { return recv_[level % 2]; }
  // What piece s reads is made ready just before it starts, so the work is spread over the
  // pieces: the first level takes (and prescales) the input; a later level, and the last
  // level's first halving, combine the previous level's kept half where this piece reads it.
  void Prepare(const Step& s) {
    const Level& l = levels_[s.level];
    int64_t at, len;
    if (s.kind == kDoubling) {
      PieceRange(l.keep, s.piece, e_, &at, &len);
      Ready(s.level, l.keep_at + at, len);
      PieceRange(l.send, s.piece, e_, &at, &len);
      Ready(s.level, l.send_at + at, len);
    } else if (s.level + 1 == int(levels_.size())) {
      PieceRange(l.keep, s.piece, e_, &at, &len);
      Combine(s.level, l.keep_at + at, len);
      if (s.piece + 1 == l.pieces) recv_[0] = Buffer(), recv_[1] = Buffer();  // the rest arrives in place
    }
  }
  // Elements [x, x + len) as level d reads them: the input, or level d - 1's combination.
  void Ready(int d, int64_t x, int64_t len) {
    if (d == 0) {
      Fill(x, len);
    } else {
      Combine(d - 1, x, len);
    }
  }
  void Fill(int64_t x, int64_t len) {
    if (!len) return;
    if (src_ && src_ != data_) std::memcpy(data_ + x * esize_, src_ + x * esize_, len * esize_);
    ScaleInPlace(data_ + x * esize_, len, dtype_, prescale_);
  }
  // Elements [x, x + len) of level d's kept half become the combination of the pair's halves.
  void Combine(int d, int64_t x, int64_t len) {
    const Level& l = levels_[d];
    char* own = data_ + x * esize_;
    const char* got = Recv(d).data() + (x - l.keep_at) * esize_;
    AdasumScaledAdd(own, l.left ? own : got, l.left ? got : own, len, dtype_, l.sums);
  }
  // The dot products over the kept half grow by each exchange piece received, in piece order
  // (pieces may complete out of order: the ones after a gap wait for it).
  void AddDots() {
    while (dots_next_ < int(steps_.size()) && steps_[dots_next_].kind == kDoubling && done_[dots_next_]) {
      const Step& s = steps_[dots_next_++];
      const Level& l = levels_[s.level];
      int64_t at, len;
      PieceRange(l.keep, s.piece, e_, &at, &len);
      const char* own = data_ + (l.keep_at + at) * esize_;
      const char* got = Recv(s.level).data() + at * esize_;
      AdasumDots(l.left ? own : got, l.left ? got : own, len, dtype_, sums_);
    }
  }
  // Level d's allgather is done: the sums of its block of 2 * dist ranks (those holding parts
  // of the same pair), added in rank order so every member has the same bits.
  void BlockSums(int d) {
    Level& l = levels_[d];
    const int block = 2 * l.dist, first = rank_ / block * block;
    l.sums[0] = l.sums[1] = l.sums[2] = 0;
    for (int r = first; r < first + block; ++r) {
      for (int k = 0; k < 3; ++k) l.sums[k] += all_sums_[3 * size_t(r) + k];
    }
  }

  char* data_;
  const char* src_;
  double prescale_;
  DataType dtype_;
  int64_t esize_, e_ = 1;
  int rank_;
  std::vector<Level> levels_;
  std::vector<Step> steps_;
  std::vector<bool> done_;
  int next_ = 0, dots_next_ = 0;
  Buffer recv_[2];  // by level parity: a level receives while the last one's is combined
  double sums_[3] = {0, 0, 0};  // this rank's part of the current level's sums
  std::vector<double> all_sums_;
};

// A request: each tensor's output receives its input, prescaled (zeros on a joined rank) as
// the first level's pieces take it, is combined by its own AdasumVector after the previous
// tensor's pieces, and is postscaled in Finish.
class Adasum : public Algorithm {
 public:
  Adasum(const RequestMeta& m, Request* r, int rank, int size, int64_t piece)
      : m_(m), r_(r), outs_(m.shapes.size()), scratch_(m.shapes.size()) {
    const int64_t esize = int64_t(DataTypeSize(m.dtype));
    for (size_t i = 0; i < m.shapes.size(); ++i) {
      const int64_t count = NumElements(m.shapes[i]);
      // A failed allocation leaves scratch to point into; the Scheduler then fails every rank.
      AllocOrScratch(r, int(i), m.shapes[i], size_t(count * esize), &scratch_[i], &local_failure_, &outs_[i]);
      const void* src = r ? r->inputs[i].data : nullptr;
      vectors_.push_back(std::make_unique<AdasumVector>(outs_[i], src, r ? m.prescale : 1.0, count, m.dtype, rank,
                                                        size, piece));
      first_.push_back(total_);
      total_ += vectors_.back()->pieces();
    }
    Skip();
  }
  bool started_all() const override { return current_ == vectors_.size(); }
  Status Next(Communicator* comm, std::unique_ptr<PendingOp>* op, bool* sync, int64_t* bytes) override {
    Status s = vectors_[current_]->Next(comm, op, sync, bytes);
    Skip();
    return s;
  }
  void PieceDone(int index) override {
    size_t t = std::upper_bound(first_.begin(), first_.end(), int64_t(index)) - first_.begin() - 1;
    vectors_[t]->PieceDone(int(index - first_[t]));
  }
  Status Finish() override {
    if (r_) {
      for (size_t i = 0; i < outs_.size(); ++i) {
        ScaleInPlace(outs_[i], NumElements(m_.shapes[i]), m_.dtype, m_.postscale);
      }
    }
    return Status::Ok();
  }

 private:
  void Skip() {
    while (current_ < vectors_.size() && vectors_[current_]->started_all()) ++current_;
  }

  RequestMeta m_;
  Request* r_;
  std::vector<void*> outs_;
  std::vector<std::vector<char>> scratch_;
  std::vector<std::unique_ptr<AdasumVector>> vectors_;
  std::vector<int64_t> first_;  // the request's index of each tensor's first piece
  int64_t total_ = 0;
  size_t current_ = 0;
};

}  // namespace

std::unique_ptr<Algorithm> MakeAdasum(const RequestMeta& m, Request* r, int rank, int size, int64_t piece_bytes) {
  Status s = CheckAdasumType(m.dtype);
  if (s.ok()) s = CheckAdasumSize(size, "'" + m.name + "'");
  if (!s.ok()) return MakeFailed(s);
  return std::make_unique<Adasum>(m, r, rank, size, piece_bytes);
}

std::unique_ptr<Algorithm> MakeAdasumVector(void* buf, int64_t count, DataType dtype, int rank, int size,
                                            int64_t piece_bytes) {
  Status s = CheckAdasumType(dtype);
  if (s.ok()) s = CheckAdasumSize(size, "the tensor");
  if (!s.ok()) return MakeFailed(s);
  return std::make_unique<AdasumVector>(buf, buf, 1.0, count, dtype, rank, size, std::max<int64_t>(piece_bytes, 1));
}

}  // namespace mlsl
