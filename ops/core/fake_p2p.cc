// FakeCommunicator's point-to-point messages: per-(from, to, tag) queues in the FakeWorld that
// pair each send with a receive in posting order (contract: fake_communicator.h).
#include <algorithm>
#include <cstring>
#include <string>

#include "fake_communicator.h"

namespace mlsl {
namespace {

class FailedMessage : public PendingOp {
 public:
  explicit FailedMessage(std::string why) : why_(std::move(why)) {}
  Status Test(bool* done) override {
    *done = true;
    return Status::Internal(why_);
  }

 private:
  std::string why_;
};

class FakeMessage : public PendingOp {
 public:
  FakeMessage(std::shared_ptr<FakeWorld> world, int from, int to, int tag, std::shared_ptr<FakeWorld::Message> m)
      : world_(std::move(world)), from_(from), to_(to), tag_(tag), m_(std::move(m)) {}
  ~FakeMessage() override {
    if (!finished_) world_->Drop(from_, to_, tag_, m_);
  }
  Status Test(bool* done) override {
    std::string error;
    *done = world_->MessageDone(*m_, &error);
    finished_ = *done;
    return error.empty() ? Status::Ok() : Status::Internal(error);
  }

 private:
  std::shared_ptr<FakeWorld> world_;
  const int from_, to_, tag_;
  std::shared_ptr<FakeWorld::Message> m_;
  bool finished_ = false;
};

// A receive posted as usual whose Test fails (FakeWorld::Faults); destroying it destroys the
// posted receive, which cancels it unless the faults keep dropped receives.
// With `on_arrival` it fails only once its message has arrived.
class InjectedFailure : public PendingOp {
 public:
  InjectedFailure(std::unique_ptr<PendingOp> posted, std::string why, bool on_arrival)
      : posted_(std::move(posted)), why_(std::move(why)), on_arrival_(on_arrival) {}
  Status Test(bool* done) override {
    if (on_arrival_ && !arrived_) {
      Status s = posted_->Test(&arrived_);
      if (!s.ok() || !arrived_) {
        *done = false;
        return s;
      }
    }
    *done = true;
    return Status::Internal(why_);
  }

 private:
  std::unique_ptr<PendingOp> posted_;
  std::string why_;
  bool on_arrival_;
  bool arrived_ = false;
};

}  // namespace

void FakeWorld::Post(bool is_send, int from, int to, int tag, std::shared_ptr<Message> m) {
  std::lock_guard<std::mutex> lock(p2p_mu_);
  const auto key = std::make_tuple(from, to, tag);
  Queues& q = p2p_[key];
  auto& mine = is_send ? q.sends : q.recvs;
  auto& theirs = is_send ? q.recvs : q.sends;
  if (theirs.empty()) {
    mine.push_back(std::move(m));
    return;
  }
  std::shared_ptr<Message> other = std::move(theirs.front());
  theirs.pop_front();
  Message& send = is_send ? *m : *other;
  Message& recv = is_send ? *other : *m;
  if (send.bytes != recv.bytes) {
    send.error = recv.error = "point-to-point: rank " + std::to_string(from) + " sends " + std::to_string(send.bytes) +
                              " bytes to rank " + std::to_string(to) + " (tag " + std::to_string(tag) +
                              "), which receives " + std::to_string(recv.bytes);
  } else if (send.bytes > 0) {
    std::memcpy(recv.buf, send.data, size_t(send.bytes));
  }
  send.done = recv.done = true;
  if (q.sends.empty() && q.recvs.empty()) p2p_.erase(key);
}

bool FakeWorld::MessageDone(const Message& m, std::string* error) {
  std::lock_guard<std::mutex> lock(p2p_mu_);
  if (m.done) *error = m.error;
  return m.done;
}

void FakeWorld::Drop(int from, int to, int tag, const std::shared_ptr<Message>& m) {
  if (m->buf && faults && faults->keep_dropped) return;  // as MPI_Request_free: still posted
  std::lock_guard<std::mutex> lock(p2p_mu_);
  auto it = p2p_.find(std::make_tuple(from, to, tag));
  if (it == p2p_.end()) return;
  for (auto* queue : {&it->second.sends, &it->second.recvs}) {
    queue->erase(std::remove(queue->begin(), queue->end(), m), queue->end());
  }
  if (it->second.sends.empty() && it->second.recvs.empty()) p2p_.erase(it);
}

namespace {

// Why a message with these arguments cannot be posted ("" when it can).
std::string MessageProblem(const FakeWorld& world, int64_t bytes, int peer, int tag) {
  if (peer < 0 || peer >= world.size()) {
    return "peer " + std::to_string(peer) + " of " + std::to_string(world.size()) + " ranks";
  }
  if (tag < 0 || tag > Communicator::kMaxTag) {
    return "tag " + std::to_string(tag) + " outside 0.." + std::to_string(Communicator::kMaxTag);
  }
  if (bytes < 0 || bytes > world.max_message_bytes) {
    return std::to_string(bytes) + " bytes (the world carries 0.." + std::to_string(world.max_message_bytes) + ")";
  }
  return "";
}

}  // namespace

std::unique_ptr<PendingOp> FakeCommunicator::Send(const void* buf, int64_t bytes, int peer, int tag) {
  const std::string problem = MessageProblem(*world_, bytes, peer, tag);
  if (!problem.empty()) return std::make_unique<FailedMessage>("point-to-point send: " + problem);
  auto m = std::make_shared<FakeWorld::Message>();
  m->data = buf;
  m->bytes = bytes;
  world_->Post(true, rank_, peer, tag, m);
  return std::make_unique<FakeMessage>(world_, rank_, peer, tag, std::move(m));
}

std::unique_ptr<PendingOp> FakeCommunicator::Recv(void* buf, int64_t bytes, int peer, int tag) {
  const std::string problem = MessageProblem(*world_, bytes, peer, tag);
  if (!problem.empty()) return std::make_unique<FailedMessage>("point-to-point receive: " + problem);
  auto m = std::make_shared<FakeWorld::Message>();
  m->buf = buf;
  m->bytes = bytes;
  world_->Post(false, peer, rank_, tag, m);
  auto op = std::make_unique<FakeMessage>(world_, peer, rank_, tag, std::move(m));
  const auto& faults = world_->faults;
  if (faults && faults->rank == rank_ && ++faults->recvs == faults->nth_recv) {
    return std::make_unique<InjectedFailure>(std::move(op), "injected failure of receive " +
                                                                std::to_string(faults->nth_recv) + " from rank " +
                                                                std::to_string(peer) + " on rank " + std::to_string(rank_),
                                           faults->on_arrival);
  }
  return op;
}

}  // namespace mlsl
