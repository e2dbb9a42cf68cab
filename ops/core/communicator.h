// Communicator: the transport interface the runtime is written against. Algorithms above it
// never see MPI. Every operation is nonblocking: it returns a PendingOp that the caller drives
// with Test() until it reports done; buffers must stay valid until then. All ranks must start
// the same operations in the same order (the runtime's agreed queue guarantees that).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "status.h"
#include "types.h"

namespace mlsl {

class PendingOp {
 public:
  virtual ~PendingOp() = default;
  // Makes progress; sets *done when the operation has finished. A non-ok Status is final.
  virtual Status Test(bool* done) = 0;
};

// Where this process sits among the machines (Horovod's local_* / cross_* numbers).
struct Topology {
  int local_rank = 0, local_size = 1, cross_rank = 0, cross_size = 1;
  bool homogeneous = true;  // every machine runs the same number of ranks (Horovod's is_homogeneous)
};

// inout = inout (combined with) in, over `count` words (Communicator::AllreduceWords).
using CombineFn = void (*)(const uint64_t* in, uint64_t* inout, int64_t count);

// The tags of the point-to-point operations one communicator starts: a fresh tag per operation,
// so two in flight at once (a ring and an all-to-all, or two rings) never match each other's
// messages. Every rank starts the same operations in the same order, so the tags agree. Tags run
// 1..Communicator::kMaxTag and wrap: an operation must have finished before 32767 more have
// started (the in-flight window is a few operations).
class TagSequence {
 public:
  int Next();

 private:
  int tag_ = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual Topology topology() const = 0;
  // The most bytes one call may move per rank (MPI counts are int); callers cut larger ones.
  virtual int64_t max_message_bytes() const { return INT64_MAX; }

  // buf (count elements) becomes the reduction over all ranks of send (in place when send is null)
  // times scale (ScaleInPlace's arithmetic, once per element, so every rank holds the same bits).
  // `native`: with the transport's own reduction where it has one that gives every rank the same
  // bits (operations.h says when), else the core's kernels (reduce.h).
  virtual std::unique_ptr<PendingOp> Allreduce(void* buf, int64_t count, DataType dtype, ReduceOp op,
                                               const void* send = nullptr, double scale = 1.0,
                                               bool native = false) = 0;
  // `words` (count uint64s), in place, becomes every rank's words combined by `combine`
  // (associative and commutative; e.g. the runtime's control message: ControlMessage::Combine).
  // The words are combined whole: implementations must not cut them into pieces.
  virtual std::unique_ptr<PendingOp> AllreduceWords(uint64_t* words, int64_t count, CombineFn combine) = 0;
  // recv = concatenation, in rank order, of bytes[r] bytes from each rank r (send holds bytes[rank]).
  virtual std::unique_ptr<PendingOp> Allgatherv(const void* send, void* recv, const std::vector<int64_t>& bytes) = 0;
  // buf (bytes long) of `root` is copied to every rank's buf.
  virtual std::unique_ptr<PendingOp> Broadcast(void* buf, int64_t bytes, int root) = 0;
  // send is cut into send_bytes[r] slices for rank r (in order); recv receives recv_bytes[r] from rank r.
  virtual std::unique_ptr<PendingOp> Alltoallv(const void* send, const std::vector<int64_t>& send_bytes,
                                               void* recv, const std::vector<int64_t>& recv_bytes) = 0;
  // send holds sum(counts) elements; this rank receives the reduction of slice `rank` (counts[rank] elements).
  virtual std::unique_ptr<PendingOp> ReduceScatter(const void* send, void* recv, const std::vector<int64_t>& counts,
                                                   DataType dtype, ReduceOp op) = 0;
  virtual std::unique_ptr<PendingOp> Barrier() = 0;
  // Blocking, and collective over every rank of this communicator (called in the same order
  // everywhere): *out becomes a new communicator over `ranks` (sorted, unique, in range; the
  // new rank is the index in `ranks`) on the members, null on the others.
  virtual Status Split(const std::vector<int>& ranks, std::unique_ptr<Communicator>* out) = 0;

  // Point-to-point messages, for the algorithms written over this interface (p2p_algorithms.h).
  // Send posts the `bytes` at buf to rank `peer`; Recv posts a receive of `bytes` into buf from
  // `peer`; the buffers stay valid (and the send's unchanged) until the op is done. Matching is
  // MPI's: a receive matches a send from its peer with its tag, and the messages one rank sends
  // another with one tag are received in the order they were posted (different tags never match
  // each other, whatever the order). A rank may send itself. Unlike a collective, only the two
  // ends take part. The two sizes must be equal (a transport reports a mismatch as an error on
  // at least the receive); a message too large for the transport fails (MPI: over 2^31-1 bytes);
  // peer must be a rank of this communicator and 0 <= tag <= kMaxTag; those errors are reported
  // by the op's Test. Completion of a send says nothing about the receive having happened.
  static constexpr int kMaxTag = 32767;  // the least MPI_TAG_UB the MPI standard allows
  virtual std::unique_ptr<PendingOp> Send(const void* buf, int64_t bytes, int peer, int tag) = 0;
  virtual std::unique_ptr<PendingOp> Recv(void* buf, int64_t bytes, int peer, int tag) = 0;
  // A fresh tag from this communicator's TagSequence, for one point-to-point operation (the
  // ring, the all-to-all, one Adasum exchange). Every rank must take tags in the same order:
  // an operation takes its tag when it starts, whether or not this rank posts any message.
  int NextTag() { return tags_.Next(); }

 private:
  TagSequence tags_;
};

// Drives op to completion, spinning briefly and then sleeping in short steps so a waiting
// rank does not burn its core. `between_tests`, when given, runs after every unsuccessful
// test and returns true while other work is in flight (then the wait only yields, never sleeps).
Status Wait(PendingOp* op, const std::function<bool()>& between_tests = nullptr);

// Every rank's `mine`, concatenated in rank order into *all, with each rank's length in *sizes
// (two allgathers: the lengths, then the bytes). Collective over comm.
Status AllgatherStrings(Communicator* comm, const std::string& mine, std::vector<int64_t>* sizes, std::string* all);

// For implementations: op, then buf (count elements) multiplied by scale once op is done (op
// itself when scale is 1 and there is nothing to canonicalize). `canonicalize`: first turn every
// NaN into the canonical one (CanonicalizeNaN), for results of MPI's built-in operations.
std::unique_ptr<PendingOp> ScaledWhenDone(std::unique_ptr<PendingOp> op, void* buf, int64_t count, DataType dtype,
                                          double scale, bool canonicalize = false);

}  // namespace mlsl
