// Adasum's exchange pieces (algo_adasum.cc) are point-to-point messages with the partner only:
// no all-to-all, no zero-length message, every message to a rank rank ^ 2^d, and what each rank
// sends another matches, in order and size, what that rank receives from it -- with several
// pieces in flight on one communicator, a count that leaves some pieces one-sided, and the
// result still that of the pieces run on a plain fake communicator.
#include <cstring>
#include <mutex>
#include <thread>

#include "../algorithm.h"
#include "harness.h"
#include "pieces.h"

using namespace mlsl;
using namespace mlsl_test;

namespace {

struct Message {
  int from, to;
  int64_t bytes;
};

// The fake transport, recording every point-to-point message posted and every all-to-all.
class RecordingCommunicator : public FakeCommunicator {
 public:
  RecordingCommunicator(std::shared_ptr<FakeWorld> world, int rank) : FakeCommunicator(std::move(world), rank) {}
  std::unique_ptr<PendingOp> Send(const void* buf, int64_t bytes, int peer, int tag) override {
    sends.push_back({rank(), peer, bytes});
    return FakeCommunicator::Send(buf, bytes, peer, tag);
  }
  std::unique_ptr<PendingOp> Recv(void* buf, int64_t bytes, int peer, int tag) override {
    recvs.push_back({peer, rank(), bytes});
    return FakeCommunicator::Recv(buf, bytes, peer, tag);
  }
  std::unique_ptr<PendingOp> Alltoallv(const void* send, const std::vector<int64_t>& send_bytes, void* recv,
                                       const std::vector<int64_t>& recv_bytes) override {
    ++alltoalls;
    return FakeCommunicator::Alltoallv(send, send_bytes, recv, recv_bytes);
  }
  std::vector<Message> sends, recvs;
  int alltoalls = 0;
};

bool OneBitApart(int a, int b) {
  const int x = a ^ b;
  return x != 0 && (x & (x - 1)) == 0;
}

void CheckMessages(int n, int64_t count, int64_t piece) {
  std::vector<std::vector<float>> data(n), plain(n);
  for (int r = 0; r < n; ++r) {
    for (int64_t i = 0; i < count; ++i) data[r].push_back(float((r + 1) * (i % 7) - 3) * 0.25f);
    plain[r] = data[r];
  }
  // The reference: the same pieces on the plain fake transport.
  {
    auto world = std::make_shared<FakeWorld>(n);
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        FakeCommunicator comm(world, r);
        auto a = MakeAdasumVector(plain[r].data(), count, DataType::kFloat32, r, n, piece);
        CHECK(RunPieces(a.get(), &comm, 3).ok());
      });
    }
    for (auto& t : threads) t.join();
  }
  auto world = std::make_shared<FakeWorld>(n);
  std::vector<std::unique_ptr<RecordingCommunicator>> comms;
  for (int r = 0; r < n; ++r) comms.push_back(std::make_unique<RecordingCommunicator>(world, r));
  std::vector<Status> statuses(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      auto a = MakeAdasumVector(data[r].data(), count, DataType::kFloat32, r, n, piece);
      statuses[r] = RunPieces(a.get(), comms[r].get(), 3);
    });
  }
  for (auto& t : threads) t.join();
  int64_t messages = 0;
  for (int r = 0; r < n; ++r) {
    CHECK(statuses[r].ok());
    CHECK(std::memcmp(data[r].data(), plain[r].data(), size_t(count) * 4) == 0);
    CHECK(comms[r]->alltoalls == 0);
    for (const Message& m : comms[r]->sends) {
      CHECK(m.bytes > 0);
      CHECK(OneBitApart(m.from, m.to));
    }
    for (const Message& m : comms[r]->recvs) {
      CHECK(m.bytes > 0);
      CHECK(OneBitApart(m.from, m.to));
    }
    messages += int64_t(comms[r]->sends.size());
    // What r sends q, in order, is what q receives from r.
    for (int q = 0; q < n; ++q) {
      std::vector<int64_t> sent, received;
      for (const Message& m : comms[r]->sends) {
        if (m.to == q) sent.push_back(m.bytes);
      }
      for (const Message& m : comms[q]->recvs) {
        if (m.from == r) received.push_back(m.bytes);
      }
      CHECK(sent == received);
    }
  }
  CHECK(messages > 0);
}

}  // namespace

TEST(adasum_exchanges_only_messages_with_the_partner) {
  for (int n : {2, 4, 8}) {
    for (int64_t count : {5, 64}) CheckMessages(n, count, 4);  // one element per piece
  }
}
