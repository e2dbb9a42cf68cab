// Adasum in pieces (algo_adasum.cc) gives exactly the bits of the whole algorithm it replaced.
// The reference here replays recursive vector halving / distance doubling on one thread over
// whole segments -- each level's dot products over the whole kept half, the block's sums added
// in rank order, one combination -- which is what the blocking AdasumAllreduce computed. Checked
// at 1, 2, 4 and 8 ranks with pieces of a few elements (several per level, several in flight),
// directly and through the runtime (Scheduler, sync pieces, a joined rank, two tensors,
// scaling). And an urgent allreduce overtakes a big Adasum between two of its pieces; every op
// gets an algorithm (MakeAlgorithm is never null).
#include <array>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>

#include "../adasum.h"
#include "../algorithm.h"
#include "../half.h"
#include "../reduce.h"
#include "harness.h"
#include "pieces.h"

using namespace mlsl;
using namespace mlsl_test;

namespace {

using Bytes = std::vector<char>;

// The whole algorithm on one thread: data[r] is rank r's vector; returns what every rank holds.
Bytes WholeReplay(std::vector<Bytes> data, int64_t count, DataType dtype) {
  const int n = int(data.size());
  const int64_t es = int64_t(DataTypeSize(dtype));
  std::vector<int64_t> offset(n, 0), mine(n, count), keep_at(n), keep(n);
  for (int dist = 1; dist < n; dist <<= 1) {
    const std::vector<Bytes> before = data;  // what each rank sends at this level
    std::vector<std::array<double, 3>> partial(n);
    for (int r = 0; r < n; ++r) {
      const bool left = (r & dist) == 0;
      const int64_t first = mine[r] / 2;
      keep_at[r] = left ? offset[r] : offset[r] + first;
      keep[r] = left ? first : mine[r] - first;
      const char* own = before[r].data() + keep_at[r] * es;
      const char* got = before[r ^ dist].data() + keep_at[r] * es;  // the partner's copy of my half
      partial[r] = {0, 0, 0};
      AdasumDots(left ? own : got, left ? got : own, keep[r], dtype, partial[r].data());
    }
    for (int r = 0; r < n; ++r) {
      const bool left = (r & dist) == 0;
      const int block = 2 * dist, first = r / block * block;
      double sums[3] = {0, 0, 0};
      for (int q = first; q < first + block; ++q) {
        for (int k = 0; k < 3; ++k) sums[k] += partial[q][k];
      }
      const char* own = before[r].data() + keep_at[r] * es;
      const char* got = before[r ^ dist].data() + keep_at[r] * es;
      AdasumScaledAdd(data[r].data() + keep_at[r] * es, left ? own : got, left ? got : own, keep[r], dtype, sums);
      offset[r] = keep_at[r];
      mine[r] = keep[r];
    }
  }
  // Distance halving only hands the combined segments round: each element is the one its holder has.
  Bytes whole(size_t(count * es));
  for (int r = 0; r < n; ++r) {
    if (mine[r]) std::memcpy(whole.data() + offset[r] * es, data[r].data() + offset[r] * es, mine[r] * es);
  }
  return whole;
}

// Random values in [-1, 2) (so dot products take both signs), a few exact zeros, as `dtype`.
Bytes RandomVector(unsigned seed, int64_t count, DataType dtype) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(-1.0f, 2.0f);
  const size_t es = DataTypeSize(dtype);
  Bytes b(count * es);
  for (int64_t i = 0; i < count; ++i) {
    float x = i % 17 == 5 ? 0.0f : d(gen);
    char* at = b.data() + i * es;
    if (dtype == DataType::kFloat32) std::memcpy(at, &x, 4);
    if (dtype == DataType::kFloat64) {
      double y = double(x) + double(d(gen)) * 1e-9;
      std::memcpy(at, &y, 8);
    }
    uint16_t h = dtype == DataType::kFloat16 ? FloatToFp16(x) : FloatToBf16(x);
    if (es == 2) std::memcpy(at, &h, 2);
  }
  return b;
}

// Every rank runs the pieces directly (several in flight) and must hold `want`'s bits.
void CheckDirect(int n, int64_t count, DataType dtype, int64_t piece) {
  std::vector<Bytes> inputs;
  for (int r = 0; r < n; ++r) inputs.push_back(RandomVector(100 * n + r, count, dtype));
  const Bytes want = WholeReplay(inputs, count, dtype);
  auto world = std::make_shared<FakeWorld>(n);
  std::vector<Status> statuses(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      FakeCommunicator comm(world, r);
      auto adasum = MakeAdasumVector(inputs[r].data(), count, dtype, r, n, piece);
      statuses[r] = RunPieces(adasum.get(), &comm, 3);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    CHECK(statuses[r].ok());
    const bool same = inputs[r] == want;
    if (!same) {
      std::fprintf(stderr, "  adasum n=%d count=%lld %s piece=%lld: rank %d differs from the whole algorithm\n", n,
                   (long long)count, DataTypeName(dtype), (long long)piece, r);
    }
    CHECK(same);
  }
}

// The tensors stay the caller's: the request points at them until it is done.
Request AdasumOf(const std::string& name, const std::vector<const Bytes*>& tensors, const std::vector<Shape>& shapes,
                 DataType dtype) {
  Request q;
  q.name = name;
  q.op = OpType::kAllreduce;
  q.reduce_op = ReduceOp::kAdasum;
  q.dtype = dtype;
  for (size_t i = 0; i < tensors.size(); ++i) q.inputs.push_back(TensorInput{tensors[i]->data(), shapes[i]});
  return q;
}

// What the runtime must return for one tensor: the inputs prescaled, combined, postscaled.
Bytes Expected(std::vector<Bytes> inputs, int64_t count, DataType dtype, double prescale, double postscale) {
  for (Bytes& b : inputs) ScaleInPlace(b.data(), count, dtype, prescale);
  Bytes out = WholeReplay(inputs, count, dtype);
  ScaleInPlace(out.data(), count, dtype, postscale);
  return out;
}

}  // namespace

TEST(adasum_pieces_equal_the_whole_algorithm_bit_for_bit) {
  for (int n : {1, 2, 4, 8}) {
    for (DataType dtype : {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16, DataType::kBfloat16}) {
      const int64_t es = int64_t(DataTypeSize(dtype));
      for (int64_t count : {1, 3, 64, 1001}) {
        // one element per piece; six (a piece size that is no multiple of the element); one per level
        for (int64_t piece : {es, 6 * es + 1, int64_t(1) << 20}) {
          if (piece == es && count > 64) continue;  // thousands of pieces: slow and says nothing new
          CheckDirect(n, count, dtype, piece);
        }
      }
    }
  }
}

TEST(adasum_in_pieces_through_the_runtime_bit_for_bit) {
  // 24-byte pieces, 3 in flight: each level is many pieces, the Scheduler's sync in between.
  RuntimeOptions o;
  o.engine.scheduler.chunk_bytes = 24;
  o.engine.scheduler.inflight = 3;
  for (int n : {1, 2, 4, 8}) {
    std::vector<Bytes> a, b, h;
    for (int r = 0; r < n; ++r) {
      a.push_back(RandomVector(7 * r + 1, 301, DataType::kFloat32));
      b.push_back(RandomVector(7 * r + 2, 15, DataType::kFloat32));
      h.push_back(RandomVector(7 * r + 3, 77, DataType::kBfloat16));
    }
    const Bytes want_a = Expected(a, 301, DataType::kFloat32, 0.5, 3.0);
    const Bytes want_b = Expected(b, 15, DataType::kFloat32, 0.5, 3.0);
    const Bytes want_h = Expected(h, 77, DataType::kBfloat16, 1.0, 1.0);
    RunRanks(o, n, [&](int rank, Runtime& rt) {
      Request two = AdasumOf("two_tensors", {&a[rank], &b[rank]}, {{301}, {3, 5}}, DataType::kFloat32);
      two.prescale = 0.5;
      two.postscale = 3.0;
      auto f = Submit(rt, std::move(two));
      auto g = Submit(rt, AdasumOf("bf16", {&h[rank]}, {{7, 11}}, DataType::kBfloat16));
      Result rf = Get(f), rg = Get(g);
      CHECK(rf.status.ok());
      CHECK(rg.status.ok());
      CHECK(rf.outputs[0] == want_a);
      CHECK(rf.outputs[1] == want_b);
      CHECK(rf.shapes[1] == (Shape{3, 5}));
      CHECK(rg.outputs[0] == want_h);
    });
  }
}

TEST(adasum_in_pieces_with_a_joined_rank_bit_for_bit) {
  RuntimeOptions o;
  o.engine.scheduler.chunk_bytes = 40;
  o.engine.scheduler.inflight = 2;
  std::vector<Bytes> x;
  for (int r = 0; r < 4; ++r) x.push_back(r == 0 ? Bytes(101 * 4, 0) : RandomVector(r, 101, DataType::kFloat32));
  const Bytes want = Expected(x, 101, DataType::kFloat32, 1.0, 1.0);  // the joined rank: zeros
  RunRanks(o, 4, [&](int rank, Runtime& rt) {
    Request join = JoinRequest();
    if (rank > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      auto f = Submit(rt, AdasumOf("after_join", {&x[rank]}, {{101}}, DataType::kFloat32));
      Result res = Get(f);
      CHECK(res.status.ok());
      CHECK(res.outputs[0] == want);
    }
    auto j = Submit(rt, std::move(join));
    CHECK(Get(j).status.ok());
  });
}

TEST(urgent_allreduce_overtakes_a_big_adasum) {
  RuntimeOptions o;
  o.engine.scheduler.chunk_bytes = 4096;
  o.engine.scheduler.inflight = 2;
  o.engine.scheduler.fusion_threshold = 0;
  for (int n : {2, 4}) {
    std::mutex mu;
    std::vector<std::vector<std::string>> orders(n);
    RunRanks(o, n, [&](int rank, Runtime& rt) {
      auto track = [&](Request r) {
        auto name = r.name;
        auto f = Submit(rt, std::move(r));
        return std::async(std::launch::async, [&, name, f = std::move(f)]() mutable {
          Result res = Get(f, 60);
          std::lock_guard<std::mutex> l(mu);
          orders[rank].push_back(name);
          return res;
        });
      };
      Bytes big = RandomVector(rank, 1 << 20, DataType::kFloat32);  // 4 MiB: hundreds of pieces a level
      Request b = AdasumOf("big", {&big}, {{1 << 20}}, DataType::kFloat32);
      b.priority = 100;
      auto bf = track(std::move(b));
      std::this_thread::sleep_for(std::chrono::milliseconds(5));  // big is on the wire now
      std::vector<float> small(1024, float(rank));
      Request s;
      s.name = "urgent";
      s.op = OpType::kAllreduce;
      s.inputs = {Input(small, {1024})};
      auto sf = track(std::move(s));
      Result rs = sf.get(), rb = bf.get();
      CHECK(rs.status.ok());
      CHECK(rb.status.ok());
      CHECK(rs.As<float>() == std::vector<float>(1024, float(n * (n - 1) / 2)));
    });
    for (auto& o : orders) CHECK(o == (std::vector<std::string>{"urgent", "big"}));
  }
}

TEST(make_algorithm_is_never_null) {
  const std::vector<bool> joined(3, false);
  auto meta = [](OpType op, ReduceOp reduce, DataType wire) {
    RequestMeta m;
    m.name = "m";
    m.op = op;
    m.reduce_op = reduce;
    m.wire = wire;
    m.shapes = {{6, 2}};
    return m;
  };
  const DataType f32 = DataType::kFloat32, bf16 = DataType::kBfloat16;
  for (OpType op : {OpType::kAllgather, OpType::kBroadcast, OpType::kAlltoall, OpType::kReducescatter,
                    OpType::kBarrier}) {
    for (DataType wire : {f32, bf16}) {
      if (wire == bf16 && op != OpType::kReducescatter) continue;
      auto a = MakeAlgorithm(meta(op, ReduceOp::kSum, wire), nullptr, joined, 1, 3, 64);
      CHECK(a != nullptr);
      CHECK(a && !a->started_all());  // pieces to run
    }
  }
  // Not algorithms (the Scheduler's chunks, the Runtime's own), or Adasum over 3 ranks: no
  // pieces, and Finish says why.
  for (auto [op, reduce] : {std::pair{OpType::kAllreduce, ReduceOp::kSum}, {OpType::kJoin, ReduceOp::kSum},
                            {OpType::kAddGroup, ReduceOp::kSum}, {OpType::kAllreduce, ReduceOp::kAdasum}}) {
    auto a = MakeAlgorithm(meta(op, reduce, f32), nullptr, joined, 1, 3, 64);
    CHECK(a != nullptr);
    if (!a) continue;
    CHECK(a->started_all());
    Status s = a->Finish();
    CHECK(!s.ok());
    CHECK_CONTAINS(s.message(), reduce == ReduceOp::kAdasum ? "power-of-two" : "not run as an algorithm");
  }
}
