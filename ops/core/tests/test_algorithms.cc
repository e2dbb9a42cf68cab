// The algorithms cut in pieces (algorithm.h) on the fake transport at 2-5 ranks, with tiny
// pieces so every collective is many of them: broadcast, allgather, alltoall, reducescatter
// (sum and average) give the exact results; joined ranks contribute nothing; and an urgent
// allreduce overtakes a big broadcast, allgather and alltoall between two pieces.
#include <mutex>

#include "../algorithm.h"
#include "harness.h"

using namespace mlsl;
using namespace mlsl_test;

namespace {

template <typename T> Request Make(const std::string& name, OpType op, const std::vector<T>& x, Shape shape,
                                   DataType dtype, int priority = 0) {
  Request r;
  r.name = name;
  r.op = op;
  r.dtype = dtype;
  r.priority = priority;
  r.inputs = {Input(x, std::move(shape))};
  return r;
}

void CheckBroadcast(int n, int rank, Runtime& rt) {
  std::vector<int32_t> x(1001);
  for (size_t i = 0; i < x.size(); ++i) x[i] = rank == n - 1 ? int32_t(i * 7 + 1) : -1;
  Request r = Make("bcast", OpType::kBroadcast, x, {1001}, DataType::kInt32);
  r.root = n - 1;
  auto f = Submit(rt, std::move(r));
  Result res = Get(f);
  CHECK(res.status.ok());
  auto got = res.As<int32_t>();
  for (size_t i = 0; i < got.size(); ++i) CHECK_EQ(got[i], int32_t(i * 7 + 1));
}

void CheckAllgather(int n, int rank, Runtime& rt) {
  const int cols = 37, rows = rank + 1;  // uneven blocks
  std::vector<float> x(rows * cols);
  for (int i = 0; i < rows * cols; ++i) x[i] = float(rank * 1000 + i);
  auto f = Submit(rt, Make("gather", OpType::kAllgather, x, {rows, cols}, DataType::kFloat32));
  Result res = Get(f);
  CHECK(res.status.ok());
  CHECK(res.shapes[0] == (Shape{n * (n + 1) / 2, cols}));
  std::vector<float> want;
  for (int s = 0; s < n; ++s) for (int i = 0; i < (s + 1) * cols; ++i) want.push_back(float(s * 1000 + i));
  CHECK(res.As<float>() == want);
}

void CheckAlltoall(int n, int rank, Runtime& rt) {
  const int cols = 5;
  auto rows = [](int src, int dst) { return (src + dst) % 3 + (dst == 0 ? 20 : 0); };
  std::vector<int64_t> splits, x;
  for (int d = 0; d < n; ++d) {
    splits.push_back(rows(rank, d));
    for (int i = 0; i < rows(rank, d) * cols; ++i) x.push_back(10000 * rank + 100 * d + i);
  }
  Request r = Make("a2a", OpType::kAlltoall, x, {int64_t(x.size()) / cols, cols}, DataType::kInt64);
  r.splits = splits;
  auto f = Submit(rt, std::move(r));
  Result res = Get(f);
  CHECK(res.status.ok());
  std::vector<int64_t> want;
  std::vector<int32_t> want_splits;
  for (int s = 0; s < n; ++s) {
    want_splits.push_back(rows(s, rank));
    for (int i = 0; i < rows(s, rank) * cols; ++i) want.push_back(10000 * s + 100 * rank + i);
  }
  CHECK(res.As<int64_t>(0) == want);
  CHECK(res.As<int32_t>(1) == want_splits);
}

void CheckReducescatter(int n, int rank, Runtime& rt, ReduceOp op) {
  const int rows = 2 * n + 1, cols = 33;
  std::vector<float> x(rows * cols);
  for (int i = 0; i < rows * cols; ++i) x[i] = float(i + rank);
  Request r = Make(op == ReduceOp::kSum ? "rs_sum" : "rs_avg", OpType::kReducescatter, x, {rows, cols},
                   DataType::kFloat32);
  r.reduce_op = op;
  auto f = Submit(rt, std::move(r));
  Result res = Get(f);
  CHECK(res.status.ok());
  int mine = rows / n + (rank < rows % n ? 1 : 0), first = 0;
  for (int i = 0; i < rank; ++i) first += rows / n + (i < rows % n ? 1 : 0);
  CHECK(res.shapes[0] == (Shape{mine, cols}));
  auto got = res.As<float>();
  const float ranks_sum = float(n * (n - 1) / 2);
  for (int i = 0; i < mine * cols; ++i) {
    float sum = float(n * (first * cols + i)) + ranks_sum;
    CHECK_EQ(got[i], op == ReduceOp::kSum ? sum : sum / n);
  }
}

}  // namespace

TEST(algorithms_in_many_pieces_at_2_to_5_ranks) {
  RuntimeOptions o;
  o.engine.scheduler.chunk_bytes = 64;
  o.engine.scheduler.inflight = 3;
  for (int n = 2; n <= 5; ++n) {
    RunRanks(o, n, [n](int rank, Runtime& rt) {
      CheckBroadcast(n, rank, rt);
      CheckAllgather(n, rank, rt);
      CheckAlltoall(n, rank, rt);
      CheckReducescatter(n, rank, rt, ReduceOp::kSum);
      CheckReducescatter(n, rank, rt, ReduceOp::kAverage);
    });
  }
}

TEST(algorithms_in_pieces_with_a_joined_rank) {
  RuntimeOptions o;
  o.engine.scheduler.chunk_bytes = 48;
  o.engine.scheduler.inflight = 2;
  RunRanks(o, 3, [](int rank, Runtime& rt) {
    Request join = JoinRequest();
    if (rank == 0) {
      auto j = Submit(rt, std::move(join));
      CHECK(Get(j).status.ok());
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    std::vector<float> x(40 * rank, float(rank));
    auto g = Submit(rt, Make("gather_joined", OpType::kAllgather, x, {rank * 10, 4}, DataType::kFloat32));
    Result res = Get(g);
    CHECK(res.status.ok());
    std::vector<float> want(40, 1.0f);
    want.resize(120, 2.0f);
    CHECK(res.As<float>() == want);
    std::vector<float> y(30, float(rank));
    auto s = Submit(rt, Make("rs_joined", OpType::kReducescatter, y, {3, 10}, DataType::kFloat32));
    Result rs = Get(s);
    CHECK(rs.status.ok());
    CHECK(rs.As<float>() == std::vector<float>(10, 3.0f));  // rank 0 contributes zeros
    std::vector<float> b(100, float(rank));
    Request r = Make("bcast_joined_root", OpType::kBroadcast, b, {100}, DataType::kFloat32);
    r.root = 0;
    auto bf = Submit(rt, std::move(r));
    Result br = Get(bf);
    CHECK(!br.status.ok());
    CHECK_CONTAINS(br.status.message(), "root rank 0 has already joined");
    auto j = Submit(rt, std::move(join));
    CHECK(Get(j).status.ok());
  });
}

TEST(urgent_allreduce_overtakes_big_broadcast_allgather_alltoall) {
  RuntimeOptions o;
  o.engine.scheduler.chunk_bytes = 4096;
  o.engine.scheduler.inflight = 2;
  o.engine.scheduler.fusion_threshold = 0;
  for (OpType op : {OpType::kBroadcast, OpType::kAllgather, OpType::kAlltoall}) {
    std::mutex mu;
    std::vector<std::vector<std::string>> orders(3);
    RunRanks(o, 3, [&](int rank, Runtime& rt) {
      auto track = [&](Request r) {
        auto name = r.name;
        auto f = Submit(rt, std::move(r));
        return std::async(std::launch::async, [&, name, f = std::move(f)]() mutable {
          Result res = Get(f);
          std::lock_guard<std::mutex> l(mu);
          orders[rank].push_back(name);
          return res;
        });
      };
      std::vector<float> big(3 << 20, float(rank)), small(1024, float(rank));  // 12 MiB = 3072 pieces
      Request b = Make("big", op, big, {int64_t(big.size()) / 4, 4}, DataType::kFloat32, 100);  // rows: 3 * 2^18
      auto bf = track(std::move(b));
      std::this_thread::sleep_for(std::chrono::milliseconds(5));  // big is on the wire now
      Request s = Make("urgent", OpType::kAllreduce, small, {1024}, DataType::kFloat32, 0);
      auto sf = track(std::move(s));
      Result rs = sf.get(), rb = bf.get();
      CHECK(rs.status.ok());
      CHECK(rb.status.ok());
      if (!rb.status.ok()) std::fprintf(stderr, "  big %s: %s\n", OpTypeName(op), rb.status.message().c_str());
      CHECK(rs.As<float>() == std::vector<float>(1024, 3.0f));
    });
    for (auto& o : orders) CHECK(o == (std::vector<std::string>{"urgent", "big"}));
  }
}

// The one row split both reducescatters use: the rows add up, the first rows % size ranks take
// one more, and the segments follow each other in rank order.
TEST(reducescatter_row_split) {
  for (int64_t rows = 0; rows <= 11; ++rows) {
    for (int size = 1; size <= 5; ++size) {
      const RowSplit s = SplitRows(rows, 3, size);
      int64_t total = 0;
      for (int i = 0; i < size; ++i) {
        CHECK_EQ(s.rows[i], rows / size + (i < rows % size ? 1 : 0));
        CHECK_EQ(s.counts[i], s.rows[i] * 3);
        CHECK_EQ(s.offsets[i], total);
        total += s.counts[i];
      }
      CHECK_EQ(total, rows * 3);
    }
  }
  const RowSplit s = SplitRows(7, 2, 3);
  CHECK(s.rows == (std::vector<int64_t>{3, 2, 2}) && s.offsets == (std::vector<int64_t>{0, 6, 10}));
}
