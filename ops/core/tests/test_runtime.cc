// The runtime end to end: N ranks as threads over the fake communicator.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <numeric>

#include "../half.h"
#include "harness.h"

using namespace mlsl;
using namespace mlsl_test;

static Request Allreduce(const std::string& name, TensorInput in, DataType dtype, ReduceOp op = ReduceOp::kSum) {
  Request r;
  r.name = name;
  r.op = OpType::kAllreduce;
  r.dtype = dtype;
  r.reduce_op = op;
  r.inputs = {std::move(in)};
  return r;
}

template <typename T> static void AllreduceOps(DataType dtype, int n) {
  RunRanks(n, [&](int rank, Runtime& rt) {
    std::vector<T> x = {T(rank + 1), T(2 * rank + 1), T(3)};
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
      auto f = Submit(rt, Allreduce(std::string("ar_") + ReduceOpName(op), Input(x, {3}), dtype, op));
      Result res = Get(f);
      CHECK(res.status.ok());
      auto got = res.As<T>();
      for (int i = 0; i < 3; ++i) {
        double want = op == ReduceOp::kProduct ? 1 : op == ReduceOp::kMin ? 1e300 : op == ReduceOp::kMax ? -1e300 : 0;
        for (int r = 0; r < n; ++r) {
          double v = i == 0 ? r + 1 : i == 1 ? 2 * r + 1 : 3;
          if (op == ReduceOp::kSum) want += v;
          if (op == ReduceOp::kProduct) want *= v;
          if (op == ReduceOp::kMin) want = std::min(want, v);
          if (op == ReduceOp::kMax) want = std::max(want, v);
        }
        CHECK_EQ(double(got[i]), want);
      }
    }
  });
}

TEST(allreduce_ops_native_types_three_ranks) {
  AllreduceOps<int32_t>(DataType::kInt32, 3);
  AllreduceOps<int64_t>(DataType::kInt64, 3);
  AllreduceOps<float>(DataType::kFloat32, 3);
  AllreduceOps<double>(DataType::kFloat64, 2);
  AllreduceOps<uint8_t>(DataType::kUint8, 2);
  AllreduceOps<int8_t>(DataType::kInt8, 2);
}

TEST(allreduce_average_and_scaling_float16) {
  RunRanks(2, [](int rank, Runtime& rt) {
    std::vector<uint16_t> x = {FloatToFp16(rank ? 3.0f : 1.0f), FloatToFp16(rank ? -4.0f : 0.0f)};
    Request r = Allreduce("avg16", Input(x, {2}), DataType::kFloat16, ReduceOp::kAverage);
    r.prescale = 2.0;
    r.postscale = 0.5;
    auto f = Submit(rt, std::move(r));
    Result res = Get(f);
    CHECK(res.status.ok());
    auto got = res.As<uint16_t>();
    CHECK_EQ(Fp16ToFloat(got[0]), 2.0f);   // ((1+3)*2/2)*0.5
    CHECK_EQ(Fp16ToFloat(got[1]), -2.0f);
  });
}

TEST(grouped_allreduce_packs_and_unpacks) {
  RunRanks(3, [](int rank, Runtime& rt) {
    std::vector<float> a = {1.0f * rank, 2.0f}, b(5, float(rank)), c;  // c is empty
    Request r;
    r.name = "grouped";
    r.dtype = DataType::kFloat32;
    r.inputs = {Input(a, {2}), Input(b, {5}), Input(c, {0})};
    auto f = Submit(rt, std::move(r));
    Result res = Get(f);
    CHECK(res.status.ok());
    CHECK(res.As<float>(0) == (std::vector<float>{3.0f, 6.0f}));
    CHECK(res.As<float>(1) == std::vector<float>(5, 3.0f));
    CHECK_EQ(res.shapes[2].size(), size_t(1));
  });
}

TEST(allgather_uneven_first_dimension) {
  RunRanks(3, [](int rank, Runtime& rt) {
    std::vector<int32_t> x(2 * (rank + 1), rank);  // rank r has r+1 rows of 2
    Request r;
    r.name = "ag";
    r.op = OpType::kAllgather;
    r.dtype = DataType::kInt32;
    r.inputs = {Input(x, {rank + 1, 2})};
    auto f = Submit(rt, std::move(r));
    Result res = Get(f);
    CHECK(res.status.ok());
    CHECK(res.shapes[0] == (Shape{6, 2}));
    CHECK(res.As<int32_t>() == (std::vector<int32_t>{0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2}));
  });
}

TEST(broadcast_from_every_root) {
  RunRanks(3, [](int rank, Runtime& rt) {
    for (int root = 0; root < 3; ++root) {
      std::vector<double> x = {double(rank * 10), double(rank)};
      Request r;
      r.name = "bc" + std::to_string(root);
      r.op = OpType::kBroadcast;
      r.dtype = DataType::kFloat64;
      r.root = root;
      r.inputs = {Input(x, {2})};
      auto f = Submit(rt, std::move(r));
      Result res = Get(f);
      CHECK(res.status.ok());
      CHECK(res.As<double>() == (std::vector<double>{root * 10.0, double(root)}));
    }
  });
}

TEST(broadcast_larger_than_one_message_is_cut_into_pieces) {
  // The fake refuses messages over 64 bytes, as MPI refuses counts over 2^31-1.
  RunRanks(2, [](int rank, Runtime& rt) {
    for (int64_t n : {int64_t(0), int64_t(16), int64_t(17), int64_t(100)}) {  // int32: 64 bytes = 16 elements
      std::vector<int32_t> x(n);
      for (int64_t i = 0; i < n; ++i) x[i] = int32_t(rank * 1000 + i);
      Request r;
      r.name = "big_bcast" + std::to_string(n);
      r.op = OpType::kBroadcast;
      r.dtype = DataType::kInt32;
      r.root = 1;
      r.inputs = {Input(x, {n})};
      auto f = Submit(rt, std::move(r));
      Result res = Get(f);
      CHECK(res.status.ok());
      std::vector<int32_t> want(n);
      for (int64_t i = 0; i < n; ++i) want[i] = int32_t(1000 + i);
      CHECK(res.As<int32_t>() == want);
    }
  }, 64);
}

TEST(alltoall_with_splits_returns_received_splits) {
  RunRanks(3, [](int rank, Runtime& rt) {
    // rank r sends (d + r) rows of value 100*r + d to rank d
    std::vector<int64_t> splits = {rank, rank + 1, rank + 2};
    std::vector<int64_t> x;
    for (int d = 0; d < 3; ++d) for (int i = 0; i < splits[d]; ++i) x.push_back(100 * rank + d);
    Request r;
    r.name = "a2a";
    r.op = OpType::kAlltoall;
    r.dtype = DataType::kInt64;
    r.splits = splits;
    r.inputs = {Input(x, {int64_t(x.size())})};
    auto f = Submit(rt, std::move(r));
    Result res = Get(f);
    CHECK(res.status.ok());
    std::vector<int64_t> want;
    std::vector<int32_t> want_splits;
    for (int s = 0; s < 3; ++s) {
      want_splits.push_back(rank + s);
      for (int i = 0; i < rank + s; ++i) want.push_back(100 * s + rank);
    }
    CHECK(res.As<int64_t>(0) == want);
    CHECK(res.As<int32_t>(1) == want_splits);
  });
}

TEST(reducescatter_uneven_rows_average) {
  RunRanks(3, [](int rank, Runtime& rt) {
    std::vector<float> x(5 * 2);
    for (int i = 0; i < 10; ++i) x[i] = float(i + rank);
    Request r;
    r.name = "rs";
    r.op = OpType::kReducescatter;
    r.dtype = DataType::kFloat32;
    r.reduce_op = ReduceOp::kAverage;
    r.inputs = {Input(x, {5, 2})};
    auto f = Submit(rt, std::move(r));
    Result res = Get(f);
    CHECK(res.status.ok());
    int rows = rank < 2 ? 2 : 1, first = rank == 0 ? 0 : rank == 1 ? 2 : 4;
    CHECK(res.shapes[0] == (Shape{rows, 2}));
    auto got = res.As<float>();
    for (int i = 0; i < rows * 2; ++i) CHECK_EQ(got[i], float(first * 2 + i + 1));  // mean of i+0, i+1, i+2
  });
}

TEST(mismatched_shapes_fail_on_every_rank) {
  RunRanks(2, [](int rank, Runtime& rt) {
    std::vector<float> x(rank ? 3 : 2, 1.0f);
    auto f = Submit(rt, Allreduce("bad", Input(x, {int64_t(x.size())}), DataType::kFloat32));
    Result res = Get(f);
    CHECK(!res.status.ok());
    CHECK_CONTAINS(res.status.message(), "'bad'");
    CHECK_CONTAINS(res.status.message(), "shape [2] on rank 0 vs [3] on rank 1");
    // the runtime is still usable afterwards
    auto g = Submit(rt, Allreduce("good", Input(x, {1}), DataType::kFloat32));
    CHECK(Get(g).status.ok());
  });
}

TEST(mismatched_root_and_op_fail_on_every_rank) {
  RunRanks(2, [](int rank, Runtime& rt) {
    std::vector<float> x(2, 1.0f);
    Request r;
    r.name = "root";
    r.op = OpType::kBroadcast;
    r.root = rank;
    r.inputs = {Input(x, {2})};
    auto f = Submit(rt, std::move(r));
    CHECK_CONTAINS(Get(f).status.message(), "root_rank 0 on rank 0 vs 1 on rank 1");
    auto g = Submit(rt, Allreduce("op", Input(x, {2}), DataType::kFloat32, rank ? ReduceOp::kMax : ReduceOp::kSum));
    CHECK_CONTAINS(Get(g).status.message(), "reduction Sum on rank 0 vs Max on rank 1");
  });
}

TEST(local_input_error_reaches_every_rank) {
  RunRanks(2, [](int rank, Runtime& rt) {
    std::vector<float> x(4, 1.0f);
    Request r;
    r.name = "splits";
    r.op = OpType::kAlltoall;
    r.splits = rank ? std::vector<int64_t>{1, 1} : std::vector<int64_t>{2, 2};  // rank 1's sum is wrong
    r.inputs = {Input(x, {4})};
    auto f = Submit(rt, std::move(r));
    Result res = Get(f);
    CHECK(!res.status.ok());
    CHECK_CONTAINS(res.status.message(), "rank 1: alltoall splits sum to 2 but the first dimension is 4");
  });
}

TEST(different_submission_orders_agree) {
  RunRanks(3, [](int rank, Runtime& rt) {
    std::vector<std::vector<float>> data(6);
    std::vector<int> order(6);
    std::iota(order.begin(), order.end(), 0);
    if (rank == 1) std::reverse(order.begin(), order.end());
    if (rank == 2) std::rotate(order.begin(), order.begin() + 2, order.end());
    std::vector<std::future<Result>> fs(6);
    for (int i : order) {
      data[i].assign(i + 1, float(i * (rank + 1)));
      fs[i] = Submit(rt, Allreduce("t" + std::to_string(i), Input(data[i], {i + 1}), DataType::kFloat32));
    }
    for (int i = 0; i < 6; ++i) {
      Result res = Get(fs[i]);
      CHECK(res.status.ok());
      CHECK(res.As<float>() == std::vector<float>(i + 1, float(i * 6)));
    }
  });
}

TEST(cached_names_renegotiate_when_shapes_change) {
  RunRanks(2, [](int rank, Runtime& rt) {
    for (int step = 0; step < 4; ++step) {
      int len = step < 2 ? 2 : 3;  // both ranks change shape at step 2: fine
      std::vector<int32_t> x(len, rank + step);
      auto f = Submit(rt, Allreduce("step", Input(x, {len}), DataType::kInt32));
      Result res = Get(f);
      CHECK(res.status.ok());
      CHECK(res.As<int32_t>() == std::vector<int32_t>(len, 1 + 2 * step));
    }
    // now only rank 1 changes: a cached id must not let a wrong shape through
    std::vector<int32_t> y(rank ? 4 : 3, 1);
    auto f = Submit(rt, Allreduce("step", Input(y, {int64_t(y.size())}), DataType::kInt32));
    CHECK_CONTAINS(Get(f).status.message(), "shape [3] on rank 0 vs [4] on rank 1");
  });
}

TEST(duplicate_pending_name_is_refused) {
  RunRanks(2, [](int rank, Runtime& rt) {
    std::vector<float> x(1, 1.0f);
    if (rank == 0) {
      auto a = Submit(rt, Allreduce("dup", Input(x, {1}), DataType::kFloat32));
      auto b = Submit(rt, Allreduce("dup", Input(x, {1}), DataType::kFloat32));
      CHECK_CONTAINS(Get(b).status.message(), "already pending");
      CHECK(Get(a).status.ok());
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      auto a = Submit(rt, Allreduce("dup", Input(x, {1}), DataType::kFloat32));
      CHECK(Get(a).status.ok());
    }
  });
}

TEST(peer_shutdown_fails_pending_requests) {
  auto world = std::make_shared<FakeWorld>(2);
  Runtime r0(std::make_unique<FakeCommunicator>(world, 0), RuntimeOptions());
  Runtime r1(std::make_unique<FakeCommunicator>(world, 1), RuntimeOptions());
  std::vector<float> x(1, 1.0f);
  auto f = Submit(r0, Allreduce("never", Input(x, {1}), DataType::kFloat32));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  r1.Shutdown();
  Result res = Get(f);
  CHECK(res.status.code() == StatusCode::kUnavailable);  // a peer's end, told apart from our own shutdown
  CHECK_CONTAINS(res.status.message(), "rank 1 shut down");
  CHECK_CONTAINS(res.status.message(), "'never'");
  auto g = Submit(r0, Allreduce("later", Input(x, {1}), DataType::kFloat32));
  Result later = Get(g);
  CHECK(later.status.code() == StatusCode::kUnavailable);
  CHECK_CONTAINS(later.status.message(), "rank 1 shut down");
  auto own = Submit(r1, Allreduce("after_own_shutdown", Input(x, {1}), DataType::kFloat32));
  CHECK(Get(own).status.code() == StatusCode::kAborted);  // this rank's own shutdown
  r0.Shutdown();
}

TEST(join_contributes_identity_and_returns_last_rank) {
  RunRanks(3, [](int rank, Runtime& rt) {
    std::vector<float> x(2, float(rank + 1));
    Request join = JoinRequest();
    if (rank == 0) {
      auto j = Submit(rt, std::move(join));
      Result res = Get(j);
      CHECK(res.status.ok());
      CHECK_EQ(res.As<int32_t>()[0], 2);
    } else {
      // ranks 1 and 2 keep reducing after rank 0 has joined; rank 0 contributes zeros / +inf
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      auto s = Submit(rt, Allreduce("after_join", Input(x, {2}), DataType::kFloat32));
      CHECK(Get(s).As<float>() == std::vector<float>(2, 5.0f));
      auto m = Submit(rt, Allreduce("min_after_join", Input(x, {2}), DataType::kFloat32, ReduceOp::kMin));
      CHECK(Get(m).As<float>() == std::vector<float>(2, 2.0f));
      if (rank == 2) std::this_thread::sleep_for(std::chrono::milliseconds(30));
      auto j = Submit(rt, std::move(join));
      Result res = Get(j);
      CHECK(res.status.ok());
      CHECK_EQ(res.As<int32_t>()[0], 2);
    }
  });
}

TEST(barrier_and_size_one) {
  RunRanks(1, [](int, Runtime& rt) {
    Request b;
    b.name = "barrier";
    b.op = OpType::kBarrier;
    auto f = Submit(rt, std::move(b));
    CHECK(Get(f).status.ok());
    std::vector<float> x = {2.0f};
    auto g = Submit(rt, Allreduce("one", Input(x, {1}), DataType::kFloat32, ReduceOp::kAverage));
    CHECK(Get(g).As<float>() == std::vector<float>{2.0f});
  });
}

TEST(stall_shutdown_fails_every_rank_with_what_each_waits_for) {
  RuntimeOptions o;
  o.engine.stall_shutdown = std::chrono::seconds(1);
  o.engine.stall_warning = std::chrono::seconds(0);
  const auto start = std::chrono::steady_clock::now();
  RunRanks(o, 3, [](int rank, Runtime& rt) {
    std::vector<float> x = {1};
    // Out of step: every rank waits in a different collective.
    auto f = Submit(rt, Allreduce("step." + std::to_string(rank), Input(x, {1}), DataType::kFloat32));
    Result res = Get(f, 10);
    CHECK(res.status.code() == StatusCode::kAborted);
    CHECK_CONTAINS(res.status.message(), "stalled for more than 1 s (MLSL_TF_STALL_SHUTDOWN_SECONDS)");
    for (int r = 0; r < 3; ++r) CHECK_CONTAINS(res.status.message(), "rank " + std::to_string(r) + " waits for 'step." +
                                                                    std::to_string(r) + "'");
  });
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(4));
}

TEST(no_stall_shutdown_by_default) {
  RunRanks(2, [](int rank, Runtime& rt) {
    std::vector<float> x = {1};
    if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    auto f = Submit(rt, Allreduce("late", Input(x, {1}), DataType::kFloat32));
    CHECK(Get(f, 10).status.ok());
  });
}

static int64_t StatsField(const Runtime& rt, const std::string& field) {
  const std::string json = rt.StatsJson();
  size_t at = json.find("\"" + field + "\": ");
  return at == std::string::npos ? -1 : std::stoll(json.substr(at + field.size() + 4));
}

TEST(names_beyond_cache_capacity_are_forgotten_and_renegotiated) {
  RuntimeOptions o;
  o.engine.cache_capacity = 16;
  RunRanks(o, 2, [](int rank, Runtime& rt) {
    for (int i = 0; i < 200; ++i) {
      // a hot name every step, and a distinct one; rank 1 sometimes lags, so ranks are not
      // always idle together
      if (rank == 1 && i % 7 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
      std::vector<int32_t> x = {rank + i, 1};
      auto hot = Submit(rt, Allreduce("hot", Input(x, {2}), DataType::kInt32));
      auto once = Submit(rt, Allreduce("step." + std::to_string(i), Input(x, {2}), DataType::kInt32));
      Result a = Get(hot), b = Get(once);
      CHECK(a.status.ok() && b.status.ok());
      CHECK(a.As<int32_t>() == std::vector<int32_t>({1 + 2 * i, 2}));
      CHECK(b.As<int32_t>() == std::vector<int32_t>({1 + 2 * i, 2}));
    }
    // While steps run, names may outgrow the capacity by those of a few cycles (how many depends
    // on when both ranks are quiet); once they are, the next cycles forget down to capacity.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (StatsField(rt, "names_known") > 16 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    CHECK(StatsField(rt, "names_known") <= 16);
    CHECK(StatsField(rt, "names_forgotten") >= 120);
    // A forgotten name runs again, and a mismatch on it is still caught.
    std::vector<int32_t> y(rank ? 3 : 2, 5);
    auto f = Submit(rt, Allreduce("step.3", Input(y, {int64_t(y.size())}), DataType::kInt32));
    CHECK_CONTAINS(Get(f).status.message(), "shape [2] on rank 0 vs [3] on rank 1");
    std::vector<int32_t> z = {rank, 7};
    auto g = Submit(rt, Allreduce("step.4", Input(z, {2}), DataType::kInt32));
    Result c = Get(g);
    CHECK(c.status.ok());
    CHECK(c.As<int32_t>() == std::vector<int32_t>({1, 14}));
  });
}

TEST(small_cached_allreduces_ride_in_the_control_message) {
  // Repeated names become eager once every rank knows them: averages with scaling, a grouped
  // allreduce and an int32 min, on 3 ranks that drift apart (one sometimes lags), must give the
  // same values as the two-round path every time, and most of them ride along.
  RunRanks(3, [](int rank, Runtime& rt) {
    for (int i = 0; i < 60; ++i) {
      if (rank == 2 && i % 5 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      std::vector<float> x = {float(rank + i), -2.0f * rank};
      Request avg = Allreduce("avg", Input(x, {2}), DataType::kFloat32, ReduceOp::kAverage);
      avg.prescale = 2.0;
      avg.postscale = 0.5;
      std::vector<float> g0 = {float(rank)}, g1(3, float(i));
      Request grouped;
      grouped.name = "grouped";
      grouped.dtype = DataType::kFloat32;
      grouped.inputs = {Input(g0, {1}), Input(g1, {3})};
      std::vector<int32_t> m = {rank - i, 10 * rank};
      auto fa = Submit(rt, std::move(avg));
      auto fg = Submit(rt, std::move(grouped));
      auto fm = Submit(rt, Allreduce("min", Input(m, {2}), DataType::kInt32, ReduceOp::kMin));
      Result a = Get(fa), g = Get(fg), n = Get(fm);
      CHECK(a.status.ok() && g.status.ok() && n.status.ok());
      CHECK(a.As<float>() == std::vector<float>({float(1 + i), -2.0f}));  // ((0+1+2+3i)*2/3)*0.5
      CHECK(g.As<float>(0) == std::vector<float>({3.0f}));
      CHECK(g.As<float>(1) == std::vector<float>(3, 3.0f * i));
      CHECK(n.As<int32_t>() == std::vector<int32_t>({-i, 0}));
    }
    CHECK(StatsField(rt, "eager") >= 60);
    CHECK_EQ(StatsField(rt, "requests"), int64_t(180));
  });
}

TEST(eager_off_and_too_large_take_the_two_round_path) {
  for (const char* bytes : {"0", "4"}) {  // 4 bytes: smaller than every request below
    RuntimeOptions o;
    o.engine.eager_bytes = std::atoll(bytes);
    RunRanks(o, 2, [](int rank, Runtime& rt) {
      for (int i = 0; i < 10; ++i) {
        std::vector<float> x = {float(rank), 1.0f};
        auto f = Submit(rt, Allreduce("x", Input(x, {2}), DataType::kFloat32));
        CHECK(Get(f).As<float>() == std::vector<float>({1.0f, 2.0f}));
      }
      CHECK_EQ(StatsField(rt, "eager"), int64_t(0));
    });
  }
}
