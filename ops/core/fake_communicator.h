// FakeCommunicator: N ranks as threads of one process, for the core's C++ tests. A FakeWorld
// is shared by the N communicators; the k-th operation each rank starts meets the k-th of
// every other rank in one slot, and the last rank to arrive computes everybody's result.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "communicator.h"

namespace mlsl {

class FakeWorld {
 public:
  explicit FakeWorld(int size) : size_(size) {}
  int size() const { return size_; }
  // Messages larger than this fail (as MPI's int counts would): tests of cutting them.
  int64_t max_message_bytes = INT64_MAX;
  // Fault injection for tests of failures on one rank: rank `rank`'s `nth_recv`-th receive
  // (counted from 1 over this world and every world split from it) is posted as usual but its
  // Test fails. With `keep_dropped`, a receive whose op is destroyed before it completed stays
  // posted (what MPI_Request_free does to a pending receive) instead of being cancelled, so a
  // later send still writes into its buffer. Set before the communicators are made.
  struct Faults {
    int rank = -1;
    int nth_recv = 0;
    bool keep_dropped = false;
    bool on_arrival = false;  // the receive fails only once its message has arrived: a late failure
    std::atomic<int> recvs{0};
  };
  std::shared_ptr<Faults> faults;

  // What one rank brings to a collective.
  struct Part {
    int kind = 0;
    void* buf = nullptr;          // in-place buffer or receive buffer
    const void* send = nullptr;   // send buffer (when distinct)
    int64_t count = 0;
    DataType dtype = DataType::kUint8;
    ReduceOp op = ReduceOp::kSum;
    CombineFn combine = nullptr;  // AllreduceWords
    int root = 0;
    std::vector<int64_t> sizes;
  };
  // Deposits rank's part of its seq-th operation; returns that operation's slot number.
  uint64_t Arrive(int rank, uint64_t seq, Part part);
  bool Done(uint64_t seq, int rank);
  // The new world of the seq-th operation, a Split into `members` ranks: the first rank to ask
  // makes it and every member shares it, so no rank waits for the others.
  std::shared_ptr<FakeWorld> SplitWorld(uint64_t seq, int members);

  // Point-to-point (fake_p2p.cc): a send or receive waits in the queue of its (from, to, tag)
  // until the other end is posted; then the bytes are copied and both are done. A rendezvous:
  // a send is done only once received, the strictest a transport may be, so an algorithm that
  // relied on a send finishing alone would hang its test rather than pass it.
  struct Message {
    const void* data = nullptr;  // a send's bytes
    void* buf = nullptr;         // a receive's buffer
    int64_t bytes = 0;
    bool done = false;
    std::string error;           // set with done: the sizes of the two ends differed
  };
  void Post(bool is_send, int from, int to, int tag, std::shared_ptr<Message> m);
  // Whether m is done (*error: why it failed).
  bool MessageDone(const Message& m, std::string* error);
  // Takes m out of its queue if it is still waiting there (its op was dropped).
  void Drop(int from, int to, int tag, const std::shared_ptr<Message>& m);

 private:
  struct Slot {
    std::vector<Part> parts;
    int arrived = 0, consumed = 0;
    bool done = false;
  };
  void Compute(Slot* slot);

  const int size_;
  std::mutex mu_;
  std::map<uint64_t, Slot> slots_;
  struct Queues {
    std::deque<std::shared_ptr<Message>> sends, recvs;  // unmatched, oldest first (one is empty)
  };
  std::mutex p2p_mu_;
  std::map<std::tuple<int, int, int>, Queues> p2p_;  // by (from, to, tag)
  std::map<uint64_t, std::pair<std::shared_ptr<FakeWorld>, int>> splits_;  // new world, ranks that took it
};

class FakeCommunicator : public Communicator {
 public:
  FakeCommunicator(std::shared_ptr<FakeWorld> world, int rank) : world_(std::move(world)), rank_(rank) { ++live_; }
  ~FakeCommunicator() override { --live_; }
  // How many fake communicators exist in this process (tests of communicators being freed).
  static int live() { return live_.load(); }
  int rank() const override { return rank_; }
  int size() const override { return world_->size(); }
  Topology topology() const override;
  std::unique_ptr<PendingOp> Allreduce(void* buf, int64_t count, DataType dtype, ReduceOp op,
                                       const void* send = nullptr, double scale = 1.0, bool native = false) override;
  std::unique_ptr<PendingOp> AllreduceWords(uint64_t* words, int64_t count, CombineFn combine) override;
  std::unique_ptr<PendingOp> Allgatherv(const void* send, void* recv, const std::vector<int64_t>& bytes) override;
  std::unique_ptr<PendingOp> Broadcast(void* buf, int64_t bytes, int root) override;
  int64_t max_message_bytes() const override { return world_->max_message_bytes; }
  std::unique_ptr<PendingOp> Alltoallv(const void* send, const std::vector<int64_t>& send_bytes, void* recv,
                                       const std::vector<int64_t>& recv_bytes) override;
  std::unique_ptr<PendingOp> ReduceScatter(const void* send, void* recv, const std::vector<int64_t>& counts,
                                           DataType dtype, ReduceOp op) override;
  std::unique_ptr<PendingOp> Barrier() override;
  Status Split(const std::vector<int>& ranks, std::unique_ptr<Communicator>* out) override;
  std::unique_ptr<PendingOp> Send(const void* buf, int64_t bytes, int peer, int tag) override;  // fake_p2p.cc
  std::unique_ptr<PendingOp> Recv(void* buf, int64_t bytes, int peer, int tag) override;

 private:
  std::unique_ptr<PendingOp> Start(FakeWorld::Part part);
  std::shared_ptr<FakeWorld> world_;
  const int rank_;
  static inline std::atomic<int> live_{0};
  uint64_t seq_ = 0;
};

}  // namespace mlsl
