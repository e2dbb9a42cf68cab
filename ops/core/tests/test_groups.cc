// Groups and compressed (bf16/fp16 wire) reductions, end to end over the fake communicator.
#include <cmath>
#include <cstdlib>
#include <random>

#include "../half.h"
#include "harness.h"

using namespace mlsl;
using namespace mlsl_test;

static int AddGroup(Runtime& rt, std::vector<int> ranks, std::string* error = nullptr) {
  auto f = Submit(rt, rt.GroupChange(OpType::kAddGroup, std::move(ranks)));
  Result res = Get(f);
  if (!res.status.ok()) {
    if (error) *error = res.status.message();
    return -1;
  }
  return res.As<int32_t>()[0];
}

static Request Reduce(const std::string& name, const std::vector<float>& x, int group, ReduceOp op = ReduceOp::kSum) {
  Request r;
  r.name = name;
  r.op = OpType::kAllreduce;
  r.dtype = DataType::kFloat32;
  r.reduce_op = op;
  r.group = group;
  r.inputs = {Input(x, {int64_t(x.size())})};
  return r;
}

TEST(groups_disjoint_run_concurrently_with_the_same_names) {
  RunRanks(4, [](int rank, Runtime& rt) {
    int a = AddGroup(rt, {1, 0});  // sorted by the core
    int b = AddGroup(rt, {2, 3});
    CHECK_EQ(a, 1);
    CHECK_EQ(b, 2);
    int mine = rank < 2 ? a : b;
    // Same names in both groups, many in flight at once; each group sums only its own members.
    std::vector<std::vector<float>> xs(8);
    std::vector<std::future<Result>> fs;
    for (int k = 0; k < 8; ++k) {
      xs[k].assign(1000 + 37 * k, float(rank * 10 + k));
      fs.push_back(Submit(rt, Reduce("t" + std::to_string(k), xs[k], mine, k % 2 ? ReduceOp::kAverage : ReduceOp::kSum)));
    }
    for (int k = 0; k < 8; ++k) {
      Result res = Get(fs[k]);
      CHECK(res.status.ok());
      int lo = rank < 2 ? 0 : 2;
      float sum = float(lo * 10 + k) + float((lo + 1) * 10 + k);
      float want = k % 2 ? sum / 2 : sum;
      auto got = res.As<float>();
      CHECK_EQ(got.size(), xs[k].size());
      CHECK_EQ(got.front(), want);
      CHECK_EQ(got.back(), want);
    }
    // Broadcast's root is an index within the group; allgather is in group order.
    std::vector<int32_t> v = {rank};
    Request bc;
    bc.name = "bc";
    bc.op = OpType::kBroadcast;
    bc.dtype = DataType::kInt32;
    bc.root = 1;
    bc.group = mine;
    bc.inputs = {Input(v, {1})};
    auto fb = Submit(rt, std::move(bc));
    Result rb = Get(fb);
    CHECK(rb.status.ok());
    CHECK_EQ(rb.As<int32_t>()[0], rank < 2 ? 1 : 3);
    Request ag;
    ag.name = "ag";
    ag.op = OpType::kAllgather;
    ag.dtype = DataType::kInt32;
    ag.group = mine;
    ag.inputs = {Input(v, {1})};
    auto fg = Submit(rt, std::move(ag));
    Result rg = Get(fg);
    CHECK(rg.status.ok());
    auto all = rg.As<int32_t>();
    CHECK_EQ(all.size(), size_t(2));
    CHECK_EQ(all[0], rank < 2 ? 0 : 2);
    CHECK_EQ(all[1], rank < 2 ? 1 : 3);
    // The world still works alongside.
    std::vector<float> w = {1.0f};
    auto fw = Submit(rt, Reduce("t0", w, 0));
    Result rw = Get(fw);
    CHECK(rw.status.ok());
    CHECK_EQ(rw.As<float>()[0], 4.0f);
  });
}

TEST(groups_non_member_gets_a_clear_error) {
  RunRanks(3, [](int rank, Runtime& rt) {
    int g = AddGroup(rt, {0, 1});
    CHECK_EQ(g, 1);
    std::vector<float> x = {float(rank)};
    if (rank == 2) {
      auto f = Submit(rt, Reduce("x", x, g));
      Result res = Get(f);
      CHECK(!res.status.ok());
      CHECK_CONTAINS(res.status.message(), "rank 2 is not a member of group 1");
      auto f2 = Submit(rt, Reduce("y", x, 7));
      Result res2 = Get(f2);
      CHECK_CONTAINS(res2.status.message(), "group 7, which does not exist");
    } else {
      auto f = Submit(rt, Reduce("x", x, g));
      Result res = Get(f);
      CHECK(res.status.ok());
      CHECK_EQ(res.As<float>()[0], 1.0f);
    }
  });
}

TEST(groups_created_in_different_orders_fail_on_every_rank) {
  RunRanks(3, [](int rank, Runtime& rt) {
    std::string err;
    int g = AddGroup(rt, rank == 2 ? std::vector<int>{1, 2} : std::vector<int>{0, 1}, &err);
    CHECK_EQ(g, -1);
    CHECK_CONTAINS(err, "same order");
    CHECK_CONTAINS(err, "[0, 1] on rank 0 vs [1, 2] on rank 2");
    // Bad rank lists are refused on every rank too.
    std::string bad;
    CHECK_EQ(AddGroup(rt, rank == 0 ? std::vector<int>{0, 5} : std::vector<int>{0, 1}, &bad), -1);
    CHECK_CONTAINS(bad, "out of range");
    // And a later, consistent creation still works.
    CHECK_EQ(AddGroup(rt, {0, 2}), 1);
  });
}

TEST(groups_that_exist_or_removals_that_differ_fail_on_every_rank) {
  RunRanks(3, [](int rank, Runtime& rt) {
    std::string err;
    CHECK_EQ(AddGroup(rt, {0, 1, 2}, &err), -1);  // the world
    CHECK_CONTAINS(err, "a group of ranks [0, 1, 2] already exists (process set id 0)");
    const int a = AddGroup(rt, {0, 1}), b = AddGroup(rt, {1, 2});
    CHECK_EQ(AddGroup(rt, rank == 1 ? std::vector<int>{0, 1} : std::vector<int>{0, 2}, &err), -1);
    CHECK_CONTAINS(err, "rank 1: a group of ranks [0, 1] already exists (process set id 1)");
    // Rank 0 removes a, the others b: refused everywhere, naming both ids; both stay.
    auto f = Submit(rt, rt.GroupChange(OpType::kRemoveGroup, {}, rank == 0 ? a : b));
    Result removed = Get(f);
    CHECK(!removed.status.ok());
    CHECK_CONTAINS(removed.status.message(), "group id " + std::to_string(a) + " on rank 0 vs " + std::to_string(b));
    for (int g : {a, b}) {
      auto again = Submit(rt, rt.GroupChange(OpType::kRemoveGroup, {}, g));
      CHECK(Get(again).status.ok());
    }
  });
}

TEST(groups_removed_quiescent_groups_free_their_communicators) {
  // Add, use and remove a group 200 times: the removed groups' communicators (the group's own and
  // its scheduler's slots) are freed, not kept for the life of the job -- an MPI library has a
  // few thousand communicator contexts.
  std::atomic<int> before{0}, after{0};
  RunRanks(3, [&](int rank, Runtime& rt) {
    std::vector<float> one = {1.0f};
    auto sync = [&](const std::string& name) {
      auto f = Submit(rt, Reduce(name, one, 0, ReduceOp::kSum));
      CHECK(Get(f).status.ok());
    };
    sync("warm");
    if (rank == 0) before = mlsl::FakeCommunicator::live();
    sync("measured");
    for (int i = 0; i < 200; ++i) {
      const int g = AddGroup(rt, {0, 1});
      CHECK(g > 0);
      if (rank < 2) {
        std::vector<float> x(1000, 1.0f);
        auto f = Submit(rt, Reduce("in_group", x, g, ReduceOp::kSum));
        CHECK(Get(f).status.ok());
      }
      auto removed = Submit(rt, rt.GroupChange(OpType::kRemoveGroup, {}, g));
      CHECK(Get(removed).status.ok());
    }
    sync("done");
    if (rank == 0) after = mlsl::FakeCommunicator::live();
    sync("checked");
  });
  CHECK(after.load() <= before.load() + 12);  // one group's worth at most, not 200 groups'
}

TEST(groups_a_collective_pending_on_a_removed_group_fails_naming_it) {
  RunRanks(3, [](int rank, Runtime& rt) {
    const int g = AddGroup(rt, {0, 1});
    std::vector<float> x(4, 1.0f);
    std::future<Result> lonely;
    if (rank == 0) lonely = Submit(rt, Reduce("lonely", x, g, ReduceOp::kSum));  // rank 1 never joins in
    auto removed = Submit(rt, rt.GroupChange(OpType::kRemoveGroup, {}, g));
    CHECK(Get(removed).status.ok());
    if (rank == 0) {
      Result r = Get(lonely);  // finishes (Get fails the test on a hang), naming the set
      CHECK(!r.status.ok());
      CHECK_CONTAINS(r.status.message(), "on process set " + std::to_string(g) + " did not run: the set was removed");
    }
  });
}

TEST(groups_removed_group_refuses_work) {
  RunRanks(3, [](int rank, Runtime& rt) {
    int g = AddGroup(rt, {0, 1});
    auto f = Submit(rt, rt.GroupChange(OpType::kRemoveGroup, {}, g));
    CHECK(Get(f).status.ok());
    std::vector<float> x = {1.0f};
    auto f2 = Submit(rt, Reduce("x", x, g));
    CHECK_CONTAINS(Get(f2).status.message(), "does not exist");
  });
}

// Every rank reduces data[rank] alone and then as three tensors fused into one work; each result
// must be want, bit for bit (wire: Request::wire, -1 for the default, float32).
static void ExpectAllreduceBits(const std::vector<std::vector<float>>& data, const std::vector<float>& want,
                                ReduceOp op, double postscale, int wire, int64_t chunk_bytes) {
  RuntimeOptions o;
  o.engine.scheduler.chunk_bytes = chunk_bytes;
  RunRanks(o, int(data.size()), [&](int rank, Runtime& rt) {
    for (int fused = 0; fused < 2; ++fused) {
      std::vector<std::future<Result>> fs;
      for (int k = 0; k < (fused ? 3 : 1); ++k) {
        Request r = Reduce("w" + std::to_string(fused) + std::to_string(k), data[rank], 0, op);
        r.wire = wire;
        r.postscale = postscale;
        fs.push_back(Submit(rt, std::move(r)));
      }
      for (auto& f : fs) {
        Result res = Get(f);
        CHECK(res.status.ok());
        auto got = res.As<float>();
        int bad = 0;
        for (size_t i = 0; i < want.size(); ++i) bad += FloatBits(got[i]) != FloatBits(want[i]);
        CHECK_EQ(bad, 0);
      }
    }
  });
}

// bf16 on the wire: each element rounded once in, summed in float32 in rank order, rounded once out.
// An average (and a postscale) multiplies the float32 sum before that last rounding.
static void WireAllreduceExact(int n, DataType wire, int64_t count, const char* chunk_bytes,
                               ReduceOp op = ReduceOp::kSum, double postscale = 1.0) {
  std::vector<std::vector<float>> data(n, std::vector<float>(count));
  std::mt19937 gen(42);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (auto& d : data) for (float& v : d) v = dist(gen) * std::exp(dist(gen) * 3);
  auto enc = [wire](float f) { return wire == DataType::kBfloat16 ? Bf16ToFloat(FloatToBf16(f)) : Fp16ToFloat(FloatToFp16(f)); };
  std::vector<float> want(count);
  for (int64_t i = 0; i < count; ++i) {
    float acc = enc(data[0][i]);
    for (int r = 1; r < n; ++r) acc += enc(data[r][i]);
    const double factor = op == ReduceOp::kAverage ? postscale / n : postscale;
    want[i] = enc(factor == 1.0 ? acc : float(double(acc) * factor));
  }
  ExpectAllreduceBits(data, want, op, postscale, int(wire), std::atoll(chunk_bytes));
}

TEST(wire_bf16_allreduce_rounds_once_in_and_once_out) {
  WireAllreduceExact(2, DataType::kBfloat16, 1001, "1048576");
  WireAllreduceExact(3, DataType::kBfloat16, 5000, "4096");  // chunked, slices of unequal size
  WireAllreduceExact(4, DataType::kBfloat16, 3, "1048576");  // fewer elements than ranks
  WireAllreduceExact(3, DataType::kFloat16, 777, "1000");
}

TEST(wire_bf16_average_scales_each_slice_before_the_last_rounding) {
  WireAllreduceExact(3, DataType::kBfloat16, 5000, "4096", ReduceOp::kAverage);
  WireAllreduceExact(3, DataType::kBfloat16, 1001, "1048576", ReduceOp::kAverage, 2.0);
  WireAllreduceExact(2, DataType::kBfloat16, 777, "1000", ReduceOp::kSum, 0.3);
}

TEST(wire_bf16_reducescatter_and_average) {
  RunRanks(3, [](int rank, Runtime& rt) {
    std::vector<float> x(7 * 2);
    for (size_t i = 0; i < x.size(); ++i) x[i] = float(i) * 0.1f + float(rank);
    Request r;
    r.name = "rs";
    r.op = OpType::kReducescatter;
    r.dtype = DataType::kFloat32;
    r.reduce_op = ReduceOp::kAverage;
    r.wire = int(DataType::kBfloat16);
    r.inputs = {Input(x, {7, 2})};
    auto f = Submit(rt, std::move(r));
    Result res = Get(f);
    CHECK(res.status.ok());
    auto got = res.As<float>();
    int64_t rows = 7 / 3 + (rank < 7 % 3 ? 1 : 0), first = rank == 0 ? 0 : rank == 1 ? 3 : 5;
    CHECK_EQ(int64_t(got.size()), rows * 2);
    for (int64_t i = 0; i < rows * 2; ++i) {
      int64_t e = first * 2 + i;
      float acc = 0;
      for (int q = 0; q < 3; ++q) acc += Bf16ToFloat(FloatToBf16(float(e) * 0.1f + float(q)));
      CHECK_EQ(got[i], acc / 3);
    }
  });
}

// fp32: the communicator scales each chunk as it completes (Finalize no longer does): every
// element exactly once -- whole, chunked into pieces of unequal size, and fused -- with the
// arithmetic of ScaleInPlace (the float32 sum times the factor in double, rounded once).
TEST(fp32_average_and_postscale_scale_each_element_once) {
  const int n = 3;
  const int64_t count = 2500;
  for (const char* chunk : {"1048576", "4000"}) {
    for (auto [op, post] : {std::pair{ReduceOp::kAverage, 1.0}, {ReduceOp::kAverage, 2.0}, {ReduceOp::kSum, 0.3}}) {
      std::vector<std::vector<float>> data(n, std::vector<float>(count));
      for (int r = 0; r < n; ++r) for (int64_t i = 0; i < count; ++i) data[r][i] = float((i * 7 + 3 * r) % 5 + 1);
      const double factor = op == ReduceOp::kAverage ? post / n : post;
      std::vector<float> want(count);
      for (int64_t i = 0; i < count; ++i) want[i] = float(double(data[0][i] + data[1][i] + data[2][i]) * factor);
      ExpectAllreduceBits(data, want, op, post, -1, std::atoll(chunk));
    }
  }
}
