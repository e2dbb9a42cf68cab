// The ring allreduce over the communicator's point-to-point messages (contract: p2p_algorithms.h).
#include <cstring>
#include <string>

#include "p2p_algorithms.h"
#include "reduce.h"

namespace mlsl {
namespace {

class RingAllreduce : public PendingOp {
 public:
  RingAllreduce(Communicator* comm, int tag, void* buf, int64_t count, DataType dtype, ReduceOp op, const void* send,
                double scale, std::shared_ptr<BufferPool> pool)
      : comm_(comm), rank_(comm->rank()), size_(comm->size()), tag_(tag), buf_(static_cast<char*>(buf)),
        send_(static_cast<const char*>(send && send != buf ? send : nullptr)), count_(count), dtype_(dtype), op_(op),
        esize_(DataTypeSize(dtype)), scale_(scale), pool_(std::move(pool)) {
    offsets_.resize(size_ + 1, 0);
    for (int i = 0; i < size_; ++i) offsets_[i + 1] = offsets_[i] + count_ / size_ + (i < count_ % size_ ? 1 : 0);
    if (size_ == 1) {  // no step: the result is the input, scaled
      if (send_ && count_) std::memcpy(buf_, send_, size_t(count_) * esize_);
      if (scale_ != 1.0) ScaleInPlace(buf_, count_, dtype_, scale_);
      return;
    }
    if (!send_) {  // in place: one segment (the first is the largest) of scratch to receive into
      const size_t bytes = size_t(Count(0)) * esize_;
      scratch_ = pool_ ? pool_->Take(bytes) : std::vector<char>(bytes);
    }
    Post();
  }
  ~RingAllreduce() override {
    if (recv_) {  // abandoned with a receive posted (a failure): it may still write into the scratch, so leak it
      new std::vector<char>(std::move(scratch_));
      return;
    }
    if (pool_) pool_->Give(std::move(scratch_));
  }

  Status Test(bool* done) override {
    *done = false;
    if (!error_.ok()) return error_;
    while (step_ < Steps()) {
      bool finished = false;
      if (recv_) {
        Status s = recv_->Test(&finished);
        if (!s.ok()) return Fail(s);
        if (!finished) return Status::Ok();
        recv_.reset();
      }
      if (send_op_) {
        Status s = send_op_->Test(&finished);
        if (!s.ok()) return Fail(s);
        if (!finished) return Status::Ok();
        send_op_.reset();
      }
      // Only now, as before the ring had files of its own: over shared memory a send may need
      // the sender's own MPI calls to move, and folding first would hold the peer up.
      Fold();
      if (++step_ < Steps()) Post();
    }
    *done = true;
    return Status::Ok();
  }

 private:
  int Steps() const { return 2 * (size_ - 1); }
  int Mod(int v) const { return ((v % size_) + size_) % size_; }
  int64_t Count(int seg) const { return offsets_[seg + 1] - offsets_[seg]; }
  char* Segment(char* base, int seg) const { return base + offsets_[seg] * int64_t(esize_); }
  const char* Segment(const char* base, int seg) const { return base + offsets_[seg] * int64_t(esize_); }
  // Step k < p-1 sends segment rank-k and receives rank-k-1 (reduce-scatter); afterwards this
  // rank holds the reduced segment rank+1, and step p-1+j sends rank+1-j, receives rank-j.
  int SendSegment() const { return step_ < size_ - 1 ? Mod(rank_ - step_) : Mod(rank_ + 1 - (step_ - size_ + 1)); }
  int RecvSegment() const { return step_ < size_ - 1 ? Mod(rank_ - step_ - 1) : Mod(rank_ - (step_ - size_ + 1)); }

  // Posts step_'s receive (from the left) and send (to the right).
  void Post() {
    const int s = SendSegment(), r = RecvSegment();
    const char* src = step_ == 0 && send_ ? Segment(send_, s) : Segment(buf_, s);
    char* dst = step_ < size_ - 1 && !send_ ? scratch_.data() : Segment(buf_, r);
    recv_ = comm_->Recv(dst, Count(r) * int64_t(esize_), Mod(rank_ - 1), tag_);
    send_op_ = comm_->Send(src, Count(s) * int64_t(esize_), Mod(rank_ + 1), tag_);
  }
  // Reduce-scatter: folds the segment that arrived into the output (out of place it arrived in
  // the output, and this rank's input is folded into it); the last fold completes this rank's
  // own segment: it is scaled while it is in cache. Allgather: the segment arrived in place.
  void Fold() {
    if (step_ >= size_ - 1) return;
    const int seg = RecvSegment();
    char* out = Segment(buf_, seg);
    ReduceInto(out, send_ ? Segment(send_, seg) : scratch_.data(), Count(seg), dtype_, op_);
    if (step_ == size_ - 2 && scale_ != 1.0) ScaleInPlace(out, Count(seg), dtype_, scale_);
  }
  Status Fail(Status s) {
    error_ = s;
    return s;
  }

  Communicator* comm_;
  const int rank_, size_, tag_;
  char* buf_;
  const char* send_;
  const int64_t count_;
  const DataType dtype_;
  const ReduceOp op_;
  const size_t esize_;
  const double scale_;
  std::shared_ptr<BufferPool> pool_;  // shared: an operation may outlive its communicator
  std::vector<char> scratch_;
  std::vector<int64_t> offsets_;
  std::unique_ptr<PendingOp> recv_, send_op_;  // the step's messages, null once done
  int step_ = 0;
  Status error_;
};

}  // namespace

std::unique_ptr<PendingOp> MakeRingAllreduce(Communicator* comm, int tag, void* buf, int64_t count, DataType dtype,
                                             ReduceOp op, const void* send, double scale,
                                             std::shared_ptr<BufferPool> pool) {
  return std::make_unique<RingAllreduce>(comm, tag, buf, count, dtype, op, send, scale, std::move(pool));
}

}  // namespace mlsl
