// Adasum: the halving/doubling algorithm's pieces (algo_adasum.cc, run by pieces.h with several
// in flight) against a plain tree reduction written here, on the fake communicator (2, 4 and 8
// ranks as threads), and end to end through the runtime
// (refused rank counts and dtypes, mismatched ops, groups, grouped tensors, scaling, joins).
#include <cmath>
#include <random>
#include <thread>

#include "../adasum.h"
#include "../algorithm.h"
#include "../half.h"
#include "harness.h"
#include "pieces.h"

using namespace mlsl;
using namespace mlsl_test;

namespace {

// The reference: Horovod's tree, (0,1), (2,3) ... then the pair results, on whole vectors in
// double, each combination rounded through `round` (the element type's precision).
std::vector<double> TreeReference(std::vector<std::vector<double>> v, double (*round)(double)) {
  for (size_t width = v.size(); width > 1; width /= 2) {
    for (size_t i = 0; i < width / 2; ++i) {
      const auto& a = v[2 * i];
      const auto& b = v[2 * i + 1];
      double dot = 0, aa = 0, bb = 0;
      for (size_t k = 0; k < a.size(); ++k) {
        dot += a[k] * b[k];
        aa += a[k] * a[k];
        bb += b[k] * b[k];
      }
      double ca = aa == 0 ? 1 : 1 - dot / (2 * aa), cb = bb == 0 ? 1 : 1 - dot / (2 * bb);
      std::vector<double> c(a.size());
      for (size_t k = 0; k < a.size(); ++k) c[k] = round(ca * a[k] + cb * b[k]);
      v[i] = c;
    }
  }
  return v[0];
}

double RoundF32(double x) { return double(float(x)); }
double RoundF64(double x) { return x; }
double RoundF16(double x) { return double(Fp16ToFloat(FloatToFp16(float(x)))); }

// Each rank's input: random values, some negative, so the dot products take both signs.
std::vector<double> RankInput(int rank, int64_t count, double (*round)(double)) {
  std::mt19937 gen(1234 + rank);
  std::uniform_real_distribution<double> d(-1.0, 2.0);
  std::vector<double> v(count);
  for (auto& x : v) x = round(d(gen));
  return v;
}

template <typename T> T Encode(double x);
template <> float Encode<float>(double x) { return float(x); }
template <> double Encode<double>(double x) { return x; }
template <> uint16_t Encode<uint16_t>(double x) { return FloatToFp16(float(x)); }
template <typename T> double Decode(T x) { return double(x); }
template <> double Decode<uint16_t>(uint16_t x) { return double(Fp16ToFloat(x)); }

// Runs the Adasum pieces directly on n fake ranks, at most max_message_bytes per piece and peer;
// checks every rank holds the same bits and that they match the tree reference within `tol`
// (relative to the largest value).
template <typename T>
void CheckAgainstTree(int n, int64_t count, DataType dtype, double (*round)(double), double tol,
                      int64_t max_message_bytes = INT64_MAX) {
  auto world = std::make_shared<FakeWorld>(n);
  world->max_message_bytes = max_message_bytes;
  std::vector<std::vector<double>> inputs;
  for (int r = 0; r < n; ++r) inputs.push_back(RankInput(r, count, round));
  std::vector<double> want = TreeReference(inputs, round);
  std::vector<std::vector<T>> bufs(n);
  std::vector<Status> statuses(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    for (double x : inputs[r]) bufs[r].push_back(Encode<T>(x));
    threads.emplace_back([&, r] {
      FakeCommunicator comm(world, r);
      const int64_t piece = std::min<int64_t>(max_message_bytes, 1 << 20);
      auto adasum = MakeAdasumVector(bufs[r].data(), count, dtype, r, n, piece);
      statuses[r] = RunPieces(adasum.get(), &comm, 3);
    });
  }
  for (auto& t : threads) t.join();
  double scale = 1e-30;
  for (double x : want) scale = std::max(scale, std::fabs(x));
  for (int r = 0; r < n; ++r) {
    CHECK(statuses[r].ok());
    CHECK(std::memcmp(bufs[r].data(), bufs[0].data(), count * sizeof(T)) == 0);
  }
  double worst = 0;
  for (int64_t k = 0; k < count; ++k) worst = std::max(worst, std::fabs(Decode(bufs[0][k]) - want[k]) / scale);
  if (!(worst <= tol)) std::fprintf(stderr, "adasum n=%d count=%lld: worst relative error %g\n", n, (long long)count, worst);
  CHECK(worst <= tol);
}

Request AdasumRequest(const std::string& name, std::vector<TensorInput> inputs, DataType dtype = DataType::kFloat32) {
  Request r;
  r.name = name;
  r.op = OpType::kAllreduce;
  r.dtype = dtype;
  r.reduce_op = ReduceOp::kAdasum;
  r.inputs = std::move(inputs);
  return r;
}

}  // namespace

TEST(adasum_matches_tree_reference_two_four_eight_ranks) {
  for (int n : {2, 4, 8}) {
    for (int64_t count : {1, 2, 3, 7, 64, 1001}) {
      CheckAgainstTree<float>(n, count, DataType::kFloat32, RoundF32, 1e-5);
      CheckAgainstTree<double>(n, count, DataType::kFloat64, RoundF64, 1e-12);
      CheckAgainstTree<uint16_t>(n, count, DataType::kFloat16, RoundF16, 1e-2);
    }
  }
}

TEST(adasum_exchanges_are_cut_into_pieces) {
  // 12-byte pieces: every exchange takes several, and pairs with less to swap keep step.
  CheckAgainstTree<float>(4, 1001, DataType::kFloat32, RoundF32, 1e-5, 12);
  CheckAgainstTree<double>(4, 5, DataType::kFloat64, RoundF64, 1e-12, 8);
}

TEST(adasum_pair_combination_and_zero_vectors) {
  // Orthogonal vectors add; a vector combined with itself stays itself; zero leaves the other.
  std::vector<float> a = {1, 0}, b = {0, 2};
  AdasumCombine(a.data(), b.data(), 2, DataType::kFloat32);
  CHECK(a == (std::vector<float>{1, 2}));
  std::vector<double> c = {3, -4}, d = c;
  AdasumCombine(c.data(), d.data(), 2, DataType::kFloat64);
  CHECK(c == (std::vector<double>{3, -4}));
  std::vector<float> z = {0, 0}, e = {5, 6};
  AdasumCombine(z.data(), e.data(), 2, DataType::kFloat32);
  CHECK(z == (std::vector<float>{5, 6}));
}

TEST(adasum_refuses_other_dtypes_and_rank_counts) {
  CHECK(CheckAdasumType(DataType::kBfloat16).ok());
  CHECK_CONTAINS(CheckAdasumType(DataType::kInt32).message(), "not int32");
  CHECK(CheckAdasumSize(1, "x").ok());
  CHECK(CheckAdasumSize(8, "x").ok());
  CHECK_CONTAINS(CheckAdasumSize(6, "'t'").message(), "'t' is reduced over 6 ranks");
}

TEST(adasum_runtime_three_ranks_fail_on_every_rank) {
  RunRanks(3, [](int rank, Runtime& rt) {
    std::vector<float> x(4, float(rank));
    auto f = Submit(rt, AdasumRequest("ada3", {Input(x, {4})}));
    Result res = Get(f);
    CHECK(!res.status.ok());
    CHECK_CONTAINS(res.status.message(), "power-of-two number of ranks");
    CHECK_CONTAINS(res.status.message(), "over 3 ranks");
    // The runtime carries on: a Sum afterwards works.
    Request sum = AdasumRequest("sum3", {Input(x, {4})});
    sum.reduce_op = ReduceOp::kSum;
    auto g = Submit(rt, std::move(sum));
    CHECK(Get(g).As<float>() == std::vector<float>(4, 3.0f));
  });
}

TEST(adasum_runtime_mismatched_op_and_bad_input_fail_on_every_rank) {
  RunRanks(2, [](int rank, Runtime& rt) {
    std::vector<float> x(2, 1.0f);
    Request r = AdasumRequest("mixed", {Input(x, {2})});
    if (rank == 1) r.reduce_op = ReduceOp::kSum;
    auto f = Submit(rt, std::move(r));
    CHECK_CONTAINS(Get(f).status.message(), "reduction Adasum on rank 0 vs Sum on rank 1");
    std::vector<int32_t> i(2, 1);
    auto g = Submit(rt, AdasumRequest("ints", {Input(i, {2})}, DataType::kInt32));
    CHECK_CONTAINS(Get(g).status.message(), "not int32");
    Request w = AdasumRequest("wire", {Input(x, {2})});
    w.wire = int(DataType::kBfloat16);
    auto h = Submit(rt, std::move(w));
    CHECK_CONTAINS(Get(h).status.message(), "cannot travel compressed");
  });
}

TEST(adasum_runtime_grouped_tensors_each_combined_with_scaling) {
  // Two tensors in one request: each is combined on its own (a fused dot product would differ).
  RunRanks(2, [](int rank, Runtime& rt) {
    std::vector<float> a = rank ? std::vector<float>{0, 2} : std::vector<float>{1, 0};  // orthogonal: a+b
    std::vector<float> b = {3, 4};                                                     // equal: stays
    Request r = AdasumRequest("grouped", {Input(a, {2}), Input(b, {1, 2})});
    r.prescale = 2.0;
    r.postscale = 0.25;
    auto f = Submit(rt, std::move(r));
    Result res = Get(f);
    CHECK(res.status.ok());
    CHECK(res.As<float>(0) == (std::vector<float>{0.5f, 1.0f}));
    CHECK(res.As<float>(1) == (std::vector<float>{1.5f, 2.0f}));
    CHECK(res.shapes[1] == (Shape{1, 2}));
  });
}

TEST(adasum_runtime_in_a_group_of_two_of_four) {
  RunRanks(4, [](int rank, Runtime& rt) {
    auto add = Submit(rt, rt.GroupChange(OpType::kAddGroup, {1, 3}));
    Result g = Get(add);
    CHECK(g.status.ok());
    if (rank % 2 == 0) return;
    std::vector<double> x = rank == 1 ? std::vector<double>{1, 1} : std::vector<double>{1, -1};
    Request r = AdasumRequest("in_group", {Input(x, {2})}, DataType::kFloat64);
    r.group = g.As<int32_t>()[0];
    auto f = Submit(rt, std::move(r));
    Result res = Get(f);
    CHECK(res.status.ok());
    CHECK(res.As<double>() == (std::vector<double>{2, 0}));
  });
}

TEST(adasum_runtime_joined_rank_contributes_zeros) {
  // Rank 0 has joined: its zeros leave rank 1's vector as it is at the first level.
  RunRanks(4, [](int rank, Runtime& rt) {
    Request join = JoinRequest();
    if (rank > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      std::vector<float> x(3, 0.0f);
      x[rank - 1] = 2.0f;  // orthogonal at every level: the answer is their sum
      auto f = Submit(rt, AdasumRequest("after_join", {Input(x, {3})}));
      Result res = Get(f);
      CHECK(res.status.ok());
      CHECK(res.As<float>() == std::vector<float>(3, 2.0f));
    }
    auto j = Submit(rt, std::move(join));
    CHECK(Get(j).status.ok());
  });
}
