#include "fake_communicator.h"

#include <cstring>
#include <stdexcept>
#include <string>

#include "p2p_algorithms.h"
#include "reduce.h"

namespace mlsl {
namespace {

enum Kind { kAllreduce = 1, kWords, kAllgatherv, kBroadcast, kReduceScatter, kBarrier, kSplit };

class FailedPending : public PendingOp {
 public:
  explicit FailedPending(std::string why) : why_(std::move(why)) {}
  Status Test(bool* done) override {
    *done = true;
    return Status::Internal(why_);
  }

 private:
  std::string why_;
};

class FakePending : public PendingOp {
 public:
  FakePending(FakeWorld* world, uint64_t seq, int rank) : world_(world), seq_(seq), rank_(rank) {}
  Status Test(bool* done) override {
    if (!finished_) finished_ = world_->Done(seq_, rank_);
    *done = finished_;
    return Status::Ok();
  }

 private:
  FakeWorld* world_;
  uint64_t seq_;
  int rank_;
  bool finished_ = false;
};

int64_t Sum(const std::vector<int64_t>& v, size_t end) {
  int64_t s = 0;
  for (size_t i = 0; i < end; ++i) s += v[i];
  return s;
}

}  // namespace

uint64_t FakeWorld::Arrive(int rank, uint64_t seq, Part part) {
  std::lock_guard<std::mutex> lock(mu_);
  Slot& slot = slots_[seq];
  if (slot.parts.empty()) slot.parts.resize(size_);
  slot.parts[rank] = std::move(part);
  if (++slot.arrived == size_) {
    for (const Part& p : slot.parts) {
      if (p.kind != slot.parts[0].kind) throw std::logic_error("FakeWorld: ranks started different operations");
    }
    Compute(&slot);
    slot.done = true;
    if (slot.parts[0].kind == kSplit) slots_.erase(seq);  // nobody tests a split (SplitWorld)
  }
  return seq;
}

bool FakeWorld::Done(uint64_t seq, int rank) {
  (void)rank;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = slots_.find(seq);
  if (it == slots_.end() || !it->second.done) return false;
  if (++it->second.consumed == size_) slots_.erase(it);
  return true;
}

// Rank r's block of the sum (or other reduction) of every rank's input, into rank r's output.
static void ReduceScatter(std::vector<FakeWorld::Part>& p) {
  const size_t esize = DataTypeSize(p[0].dtype);
  for (size_t r = 0; r < p.size(); ++r) {
    int64_t off = Sum(p[0].sizes, r), cnt = p[0].sizes[r];
    std::vector<char> acc(static_cast<const char*>(p[0].send) + off * esize,
                          static_cast<const char*>(p[0].send) + (off + cnt) * esize);
    for (size_t s = 1; s < p.size(); ++s) {
      ReduceInto(acc.data(), static_cast<const char*>(p[s].send) + off * esize, cnt, p[0].dtype, p[0].op);
    }
    if (cnt) std::memcpy(p[r].buf, acc.data(), cnt * esize);
  }
}

void FakeWorld::Compute(Slot* slot) {
  std::vector<Part>& p = slot->parts;
  const int n = size_;
  switch (p[0].kind) {
    case kAllreduce:
    case kWords: {
      size_t bytes = p[0].count * (p[0].kind == kWords ? 8 : DataTypeSize(p[0].dtype));
      std::vector<char> acc(static_cast<char*>(p[0].buf), static_cast<char*>(p[0].buf) + bytes);
      for (int r = 1; r < n; ++r) {
        if (p[0].kind == kWords) {
          p[0].combine(static_cast<const uint64_t*>(p[r].buf), reinterpret_cast<uint64_t*>(acc.data()), p[0].count);
        } else {
          ReduceInto(acc.data(), p[r].buf, p[0].count, p[0].dtype, p[0].op);
        }
      }
      for (int r = 0; r < n; ++r) std::memcpy(p[r].buf, acc.data(), bytes);
      break;
    }
    case kAllgatherv:
      for (int r = 0; r < n; ++r) {
        char* out = static_cast<char*>(p[r].buf);
        for (int s = 0; s < n; ++s) {
          std::memcpy(out, p[s].send, p[r].sizes[s]);
          out += p[r].sizes[s];
        }
      }
      break;
    case kBroadcast:
      for (int r = 0; r < n; ++r) {
        if (r != p[0].root) std::memcpy(p[r].buf, p[p[0].root].buf, p[0].count);
      }
      break;
    case kReduceScatter:
      ReduceScatter(p);
      break;
    case kBarrier:
      break;
    case kSplit:  // the new world is SplitWorld's
      break;
  }
}

Topology FakeCommunicator::topology() const {
  Topology t;
  t.local_rank = rank_;
  t.local_size = size();
  return t;
}

std::unique_ptr<PendingOp> FakeCommunicator::Start(FakeWorld::Part part) {
  uint64_t seq = seq_++;
  world_->Arrive(rank_, seq, std::move(part));
  return std::make_unique<FakePending>(world_.get(), seq, rank_);
}

std::unique_ptr<PendingOp> FakeCommunicator::Allreduce(void* buf, int64_t count, DataType dtype, ReduceOp op,
                                                       const void* send, double scale, bool /*native*/) {
  if (send && send != buf && count) std::memcpy(buf, send, count * DataTypeSize(dtype));
  FakeWorld::Part p;
  p.kind = kAllreduce; p.buf = buf; p.count = count; p.dtype = dtype; p.op = op;
  return ScaledWhenDone(Start(std::move(p)), buf, count, dtype, scale);
}

std::unique_ptr<PendingOp> FakeCommunicator::AllreduceWords(uint64_t* words, int64_t count, CombineFn combine) {
  FakeWorld::Part p;
  p.kind = kWords; p.buf = words; p.count = count; p.combine = combine;
  return Start(std::move(p));
}

std::unique_ptr<PendingOp> FakeCommunicator::Allgatherv(const void* send, void* recv, const std::vector<int64_t>& bytes) {
  FakeWorld::Part p;
  p.kind = kAllgatherv; p.send = send; p.buf = recv; p.sizes = bytes;
  return Start(std::move(p));
}

std::unique_ptr<PendingOp> FakeCommunicator::Broadcast(void* buf, int64_t bytes, int root) {
  if (bytes > world_->max_message_bytes) return std::make_unique<FailedPending>("broadcast: message too large");
  FakeWorld::Part p;
  p.kind = kBroadcast; p.buf = buf; p.count = bytes; p.root = root;
  return Start(std::move(p));
}

std::unique_ptr<PendingOp> FakeCommunicator::Alltoallv(const void* send, const std::vector<int64_t>& send_bytes,
                                                       void* recv, const std::vector<int64_t>& recv_bytes) {
  // As the MPI transport: rounds of point-to-point messages.
  return MakePointToPointAlltoallv(this, NextTag(), send, send_bytes, recv, recv_bytes);
}

std::unique_ptr<PendingOp> FakeCommunicator::ReduceScatter(const void* send, void* recv, const std::vector<int64_t>& counts,
                                                           DataType dtype, ReduceOp op) {
  FakeWorld::Part p;
  p.kind = kReduceScatter; p.send = send; p.buf = recv; p.sizes = counts; p.dtype = dtype; p.op = op;
  return Start(std::move(p));
}

std::unique_ptr<PendingOp> FakeCommunicator::Barrier() {
  FakeWorld::Part p;
  p.kind = kBarrier;
  return Start(std::move(p));
}

std::shared_ptr<FakeWorld> FakeWorld::SplitWorld(uint64_t seq, int members) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& [world, taken] = splits_[seq];
  if (!world) {
    world = std::make_shared<FakeWorld>(members);
    world->faults = faults;
  }
  std::shared_ptr<FakeWorld> out = world;
  if (++taken == size_) splits_.erase(seq);
  return out;
}

Status FakeCommunicator::Split(const std::vector<int>& ranks, std::unique_ptr<Communicator>* out) {
  // Returns at once (one thread can step every rank's engine); the ranks' operations are still
  // matched, so a rank that started something else here is caught.
  const uint64_t seq = seq_;
  FakeWorld::Part p;
  p.kind = kSplit;
  p.sizes.assign(ranks.begin(), ranks.end());
  Start(std::move(p));
  std::shared_ptr<FakeWorld> sub = world_->SplitWorld(seq, int(ranks.size()));
  out->reset();
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] == rank_) *out = std::make_unique<FakeCommunicator>(sub, int(i));
  }
  return Status::Ok();
}

}  // namespace mlsl
