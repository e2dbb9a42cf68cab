// The point-to-point interface (Communicator::Send/Recv) on the fake transport and the simulated
// one, and the algorithms written over it (p2p_algorithms.h) at 2-5 ranks as threads: the ring
// allreduce (every op, float32 and int32, in and out of place, counts not divisible by the ranks
// or smaller than them, scale != 1, NaN and Inf giving the same bits on every rank) and the
// all-to-all (uneven and zero-length slices, a rank sending itself, more rounds than are posted
// at once, a bad count failing only its rank), both in flight at once on their own tags; on the
// simulator, a ring costs the simulator's ring formula.
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <thread>
#include <type_traits>
#include <vector>

#include "../fake_communicator.h"
#include "../p2p_algorithms.h"
#include "../reduce.h"
#include "../sim_communicator.h"
#include "check.h"

using namespace mlsl;

namespace {

// Drives op to completion; a hang (30 s) aborts, since a stuck thread cannot be recovered.
Status Finish(PendingOp* op) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (true) {
    bool done = false;
    Status s = op->Test(&done);
    if (!s.ok() || done) return s;
    if (std::chrono::steady_clock::now() > deadline) {
      std::fprintf(stderr, "aborting: a point-to-point test hung\n");
      std::abort();
    }
    std::this_thread::yield();
  }
}

// Runs body(rank, comm) on n threads over one fake world (checks belong after, on the main thread).
void OnRanks(int n, const std::function<void(int, Communicator*)>& body) {
  auto world = std::make_shared<FakeWorld>(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      FakeCommunicator comm(world, r);
      body(r, &comm);
    });
  }
  for (auto& t : threads) t.join();
}

std::vector<char> Bytes(const void* p, size_t n) {
  return std::vector<char>(static_cast<const char*>(p), static_cast<const char*>(p) + n);
}

}  // namespace

TEST(p2p_messages_match_per_peer_and_tag_in_order) {
  std::vector<std::vector<int32_t>> got(3);
  std::vector<Status> status(3);
  OnRanks(3, [&](int rank, Communicator* c) {
    const int32_t a[2] = {10 * rank + 1, 10 * rank + 2}, b[2] = {10 * rank + 3, 10 * rank + 4}, z[1] = {10 * rank + 5};
    std::vector<int32_t> in(7, -1);
    std::vector<std::unique_ptr<PendingOp>> ops;
    const int to = (rank + 1) % 3, from = (rank + 2) % 3;
    // receives of tag 9 first, then two of tag 4 (in order), then one from itself
    ops.push_back(c->Recv(&in[4], 4, from, 9));
    ops.push_back(c->Recv(&in[0], 8, from, 4));
    ops.push_back(c->Recv(&in[2], 8, from, 4));
    ops.push_back(c->Recv(&in[5], 4, rank, 0));
    ops.push_back(c->Send(a, 8, to, 4));
    ops.push_back(c->Send(b, 8, to, 4));
    ops.push_back(c->Send(z, 4, to, 9));
    ops.push_back(c->Send(z, 4, rank, 0));
    for (auto& op : ops) {
      Status s = Finish(op.get());
      if (!s.ok()) status[rank] = s;
    }
    got[rank] = in;
  });
  for (int r = 0; r < 3; ++r) {
    const int f = (r + 2) % 3;
    CHECK(status[r].ok());
    CHECK(got[r] == (std::vector<int32_t>{10 * f + 1, 10 * f + 2, 10 * f + 3, 10 * f + 4, 10 * f + 5, 10 * r + 5, -1}));
  }
}

TEST(p2p_size_mismatch_and_bad_arguments_are_errors) {
  std::vector<Status> send(2), recv(2);
  OnRanks(2, [&](int rank, Communicator* c) {
    int64_t x[2] = {1, 2}, y[2] = {0, 0};
    auto r = c->Recv(y, 8, 1 - rank, 3);
    auto s = c->Send(x, rank == 0 ? 16 : 8, 1 - rank, 3);  // rank 0 sends more than rank 1 receives
    recv[rank] = Finish(r.get());
    send[rank] = Finish(s.get());
  });
  CHECK(!recv[1].ok());
  CHECK_CONTAINS(recv[1].message(), "rank 0 sends 16 bytes to rank 1 (tag 3), which receives 8");
  CHECK(!send[0].ok());
  CHECK(recv[0].ok() && send[1].ok());

  auto world = std::make_shared<FakeWorld>(2);
  world->max_message_bytes = 100;
  FakeCommunicator c(world, 0);
  char buf[200];
  Status s = Finish(c.Send(buf, 8, 2, 0).get());
  CHECK_CONTAINS(s.message(), "point-to-point send: peer 2 of 2 ranks");
  s = Finish(c.Recv(buf, 8, 1, Communicator::kMaxTag + 1).get());
  CHECK_CONTAINS(s.message(), "point-to-point receive: tag 32768 outside 0..32767");
  s = Finish(c.Send(buf, 101, 1, 0).get());
  CHECK_CONTAINS(s.message(), "101 bytes");
  c.Recv(buf, 8, 1, 0);  // dropped unmatched: the next send pairs with the next receive
  std::vector<Status> after(2);
  std::vector<int64_t> got(2, 0);
  std::vector<std::thread> t;
  for (int r = 0; r < 2; ++r) {
    t.emplace_back([&, r] {
      FakeCommunicator cr(world, r);
      int64_t v = 40 + r;
      auto op = r == 0 ? cr.Recv(&got[0], 8, 1, 0) : cr.Send(&v, 8, 0, 0);
      after[r] = Finish(op.get());
    });
  }
  for (auto& th : t) th.join();
  CHECK(after[0].ok() && after[1].ok());
  CHECK_EQ(got[0], int64_t(41));
}

namespace {

// What rank r contributes at element i (small integers, so every reduction is exact).
template <typename T> T Value(int r, int64_t i, ReduceOp op) {
  const int top = op == ReduceOp::kProduct ? 2 : 5;
  const int64_t v = (i * 7 + 3 * r) % top + 1;
  return T(i % 3 == 1 && std::is_signed_v<T> ? -v : v);
}

template <typename T> std::vector<T> Input(int r, int64_t count, ReduceOp op) {
  std::vector<T> v(count);
  for (int64_t i = 0; i < count; ++i) v[i] = Value<T>(r, i, op);
  return v;
}

// The reduction of every rank's input by the core's kernels, then scaled: the result every rank must hold.
template <typename T> std::vector<T> Expected(int n, int64_t count, DataType dtype, ReduceOp op, double scale) {
  std::vector<T> acc = Input<T>(0, count, op);
  for (int r = 1; r < n; ++r) {
    std::vector<T> x = Input<T>(r, count, op);
    ReduceInto(acc.data(), x.data(), count, dtype, op);
  }
  ScaleInPlace(acc.data(), count, dtype, scale);
  return acc;
}

template <typename T> void CheckRing(int n, int64_t count, DataType dtype, ReduceOp op, bool in_place, double scale) {
  std::vector<std::vector<T>> out(n), in(n);
  std::vector<Status> status(n);
  OnRanks(n, [&](int rank, Communicator* c) {
    in[rank] = Input<T>(rank, count, op);
    out[rank] = in_place ? in[rank] : std::vector<T>(count, T(99));
    auto pool = std::make_shared<BufferPool>(2, size_t(1) << 20);
    TagSequence tags;
    auto ring = MakeRingAllreduce(c, tags.Next(), out[rank].data(), count, dtype, op, in_place ? nullptr : in[rank].data(),
                                  scale, pool);
    status[rank] = Finish(ring.get());
  });
  const std::vector<T> want = Expected<T>(n, count, dtype, op, scale);
  for (int r = 0; r < n; ++r) {
    CHECK(status[r].ok());
    if (!(out[r] == want)) {
      mlsl_test::RecordFailure(__FILE__, __LINE__, "ring allreduce: wrong result at " + std::to_string(n) + " ranks, count " +
                                                       std::to_string(count) + ", dtype " + DataTypeName(dtype) +
                                                       ", op " + ReduceOpName(op) + (in_place ? ", in place" : ""));
    }
    if (!in_place) CHECK(in[r] == Input<T>(r, count, op));  // the input is left as it was
  }
}

}  // namespace

TEST(ring_allreduce_every_op_at_2_to_5_ranks) {
  for (int n = 2; n <= 5; ++n) {
    for (int64_t count : {int64_t(0), int64_t(1), int64_t(n - 1), int64_t(n + 1), int64_t(1003)}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
        for (bool in_place : {false, true}) {
          for (double scale : {1.0, 0.5}) {
            CheckRing<float>(n, count, DataType::kFloat32, op, in_place, scale);
            CheckRing<int32_t>(n, count, DataType::kInt32, op, in_place, scale);
          }
        }
      }
    }
  }
}

TEST(ring_allreduce_nan_and_inf_give_the_same_bits_everywhere) {
  const float inf = std::numeric_limits<float>::infinity();
  auto nan_bits = [](uint32_t bits) {
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  };
  for (int n = 2; n <= 5; ++n) {
    // per rank: NaNs with different payloads and signs, +-Inf, and ordinary values mixed
    auto input = [&](int r) {
      std::vector<float> v(23);
      for (int i = 0; i < 23; ++i) v[i] = float(i + r);
      v[0] = nan_bits(0x7fc00001u + r);
      v[3] = r % 2 ? inf : -inf;             // Inf - Inf = NaN when n > 1
      v[5] = inf;
      v[7] = nan_bits(0xffc00000u + 7 * r);  // negative NaN
      v[11 + r] = nan_bits(0x7f800001u);     // a signalling NaN on one rank each
      return v;
    };
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
      for (bool in_place : {false, true}) {
        std::vector<std::vector<float>> out(n), in(n);
        std::vector<Status> status(n);
        OnRanks(n, [&](int rank, Communicator* c) {
          in[rank] = input(rank);
          out[rank] = in_place ? in[rank] : std::vector<float>(23, 0.0f);
          auto ring = MakeRingAllreduce(c, 1, out[rank].data(), 23, DataType::kFloat32, op,
                                        in_place ? nullptr : in[rank].data(), 0.25, nullptr);
          status[rank] = Finish(ring.get());
        });
        std::vector<float> want = input(0);
        for (int r = 1; r < n; ++r) ReduceInto(want.data(), input(r).data(), 23, DataType::kFloat32, op);
        ScaleInPlace(want.data(), 23, DataType::kFloat32, 0.25);
        for (int r = 0; r < n; ++r) {
          CHECK(status[r].ok());
          CHECK(Bytes(out[r].data(), 92) == Bytes(want.data(), 92));  // bit for bit, NaN payloads included
          CHECK(std::isnan(out[r][0]) && std::isnan(out[r][7]) && std::isnan(out[r][11]));
        }
      }
    }
  }
}

namespace {

// Bytes rank s sends rank d (zero for some pairs, including a rank to itself).
int64_t SliceBytes(int s, int d) { return ((s * 3 + d * 5) % 4) * 3; }
char SliceByte(int s, int d, int64_t i) { return char((s * 31 + d * 17 + i) & 0xff); }

struct AlltoallRun {
  std::vector<std::vector<char>> out;
  std::vector<Status> status;
};

// An all-to-all at n ranks; `self_mismatch`: that rank expects one byte more from itself.
AlltoallRun RunAlltoall(int n, int self_mismatch = -1) {
  AlltoallRun run{std::vector<std::vector<char>>(n), std::vector<Status>(n)};
  OnRanks(n, [&](int rank, Communicator* c) {
    std::vector<int64_t> send_bytes(n), recv_bytes(n);
    std::vector<char> send;
    for (int d = 0; d < n; ++d) {
      send_bytes[d] = SliceBytes(rank, d);
      recv_bytes[d] = SliceBytes(d, rank) + (d == rank && rank == self_mismatch ? 1 : 0);
      for (int64_t i = 0; i < send_bytes[d]; ++i) send.push_back(SliceByte(rank, d, i));
    }
    int64_t total = 0;
    for (int64_t b : recv_bytes) total += b;
    run.out[rank].assign(total, '\x7f');
    auto op = MakePointToPointAlltoallv(c, 7, send.data(), send_bytes, run.out[rank].data(), recv_bytes);
    run.status[rank] = Finish(op.get());
  });
  return run;
}

std::vector<char> AlltoallExpected(int n, int rank) {
  std::vector<char> want;
  for (int s = 0; s < n; ++s) {
    for (int64_t i = 0; i < SliceBytes(s, rank); ++i) want.push_back(SliceByte(s, rank, i));
  }
  return want;
}

}  // namespace

TEST(p2p_alltoall_uneven_and_empty_slices_at_2_to_5_ranks) {
  // 34 ranks: 33 rounds, more than are posted at once
  for (int n : {2, 3, 4, 5, kP2PAlltoallRounds + 2}) {
    AlltoallRun run = RunAlltoall(n);
    for (int r = 0; r < n; ++r) {
      CHECK(run.status[r].ok());
      CHECK(run.out[r] == AlltoallExpected(n, r));
    }
  }
}

TEST(p2p_alltoall_bad_self_count_fails_its_rank_only) {
  const int n = 3;
  AlltoallRun run = RunAlltoall(n, 1);  // the peers still finish: no hang
  CHECK(!run.status[1].ok());
  CHECK_CONTAINS(run.status[1].message(), "alltoall: this rank sends itself");
  for (int r : {0, 2}) {
    CHECK(run.status[r].ok());
    CHECK(run.out[r] == AlltoallExpected(n, r));
  }
}

TEST(p2p_ring_and_alltoall_in_flight_together_keep_their_messages) {
  for (int n = 2; n <= 4; ++n) {
    std::vector<std::vector<float>> a(n), b(n);
    std::vector<std::vector<int32_t>> x(n);
    std::vector<Status> status(n);
    OnRanks(n, [&](int rank, Communicator* c) {
      TagSequence tags;
      a[rank] = Input<float>(rank, 257, ReduceOp::kSum);
      b[rank] = Input<float>(rank + 1, 257, ReduceOp::kSum);  // same sizes: only the tags keep them apart
      std::vector<int32_t> send(n, rank);
      x[rank].assign(n, -1);
      std::vector<int64_t> four(n, 4);
      auto r1 = MakeRingAllreduce(c, tags.Next(), a[rank].data(), 257, DataType::kFloat32, ReduceOp::kSum, nullptr,
                                  1.0, nullptr);
      auto a2a = MakePointToPointAlltoallv(c, tags.Next(), send.data(), four, x[rank].data(), four);
      auto r2 = MakeRingAllreduce(c, tags.Next(), b[rank].data(), 257, DataType::kFloat32, ReduceOp::kSum, nullptr,
                                  1.0, nullptr);
      // driven in another order than started, and alternately
      std::vector<PendingOp*> ops = {r2.get(), a2a.get(), r1.get()};
      std::vector<bool> done(3, false);
      while (!(done[0] && done[1] && done[2])) {
        for (int i = 0; i < 3; ++i) {
          if (done[i]) continue;
          bool d = false;
          Status s = ops[i]->Test(&d);
          if (!s.ok()) status[rank] = s;
          done[i] = d || !s.ok();
        }
        std::this_thread::yield();
      }
    });
    std::vector<float> want_a(257, 0), want_b(257, 0);
    for (int r = 0; r < n; ++r) {
      std::vector<float> ia = Input<float>(r, 257, ReduceOp::kSum), ib = Input<float>(r + 1, 257, ReduceOp::kSum);
      for (int i = 0; i < 257; ++i) want_a[i] += ia[i], want_b[i] += ib[i];
    }
    std::vector<int32_t> want_x(n);
    for (int r = 0; r < n; ++r) want_x[r] = r;
    for (int r = 0; r < n; ++r) {
      CHECK(status[r].ok());
      CHECK(a[r] == want_a);
      CHECK(b[r] == want_b);
      CHECK(x[r] == want_x);
    }
  }
}

namespace {

SimFabric P2PFabric(int ranks, int per_host = 1) {
  SimFabric f;
  f.ranks = ranks;
  f.ranks_per_host = per_host;
  f.alpha = 2e-6;
  f.beta = 1e-9;
  f.alpha_shm = 0.5e-6;
  f.beta_shm = 1e-10;
  return f;
}

// Runs op on the virtual clock to completion; returns the time it took.
double SimRun(SimNetwork* net, PendingOp* op) {
  const double start = net->now();
  for (int i = 0; i < 100000; ++i) {
    bool done = false;
    Status s = op->Test(&done);
    if (!s.ok()) mlsl_test::RecordFailure(__FILE__, __LINE__, s.message());
    if (done || !s.ok()) return net->now() - start;
    const double next = net->NextEvent();
    if (std::isinf(next)) break;  // nothing in flight: it can never finish
    net->AdvanceTo(next);
  }
  mlsl_test::RecordFailure(__FILE__, __LINE__, "simulated operation never finished");
  return 0;
}

bool Close(double a, double b) { return std::fabs(a - b) <= 1e-12 + 1e-9 * std::fabs(b); }

}  // namespace

TEST(sim_p2p_ring_costs_the_ring_formula) {
  for (int p : {2, 4, 5}) {
    SimFabric f = P2PFabric(p);
    f.allreduce = "ring";
    SimNetwork net(f);
    SimCommunicator comm(&net);
    const int64_t count = 1000 * p;  // segments of 1000 floats
    std::vector<float> buf(count, 1.0f);
    auto ring = MakeRingAllreduce(&comm, 1, buf.data(), count, DataType::kFloat32, ReduceOp::kSum, nullptr, 1.0, nullptr);
    const double took = SimRun(&net, ring.get());
    CHECK(Close(took, AllreduceCost(f, count * 4).total()));
    CHECK(Close(took, 2.0 * (p - 1) * (f.alpha + 4000 * f.beta)));
  }
}

TEST(sim_p2p_receive_completes_with_its_mirrored_send) {
  SimFabric f = P2PFabric(4, 2);  // ranks 0 and 1 share this host
  SimNetwork net(f);
  SimCommunicator comm(&net);
  char buf[4096] = {0};
  // rank 1 sends this rank what this rank sends rank 3: the receive from 1 pairs with the send to 3
  auto recv = comm.Recv(buf, 4096, 1, 5);
  auto other = comm.Send(buf, 4096, 3, 6);  // another tag: not its pair
  bool done = false;
  net.AdvanceTo(1.0);
  CHECK(recv->Test(&done).ok() && !done);
  auto send = comm.Send(buf, 4096, 3, 5);
  CHECK(Close(SimRun(&net, recv.get()), f.alpha + 4096 * f.beta));
  CHECK(send->Test(&done).ok() && done);
  // to a rank of this host: shared memory, off the link; to itself: free
  auto shm = comm.Send(buf, 4096, 1, 0);
  auto shm_recv = comm.Recv(buf, 4096, 3, 0);
  CHECK(Close(SimRun(&net, shm_recv.get()), f.alpha_shm + 4096 * f.beta_shm));
  auto self = comm.Send(buf, 4096, 0, 0);
  CHECK(self->Test(&done).ok() && done);
  std::vector<char> in(4000), out(4000);
  auto sim_a2a = MakePointToPointAlltoallv(&comm, 9, in.data(), std::vector<int64_t>(4, 1000), out.data(),
                                           std::vector<int64_t>(4, 1000));
  // the two messages to the other host, posted at once, share the link; the one to this host's
  // other rank does not use it
  CHECK(Close(SimRun(&net, sim_a2a.get()), f.alpha + 2 * 1000 * f.beta));
}
