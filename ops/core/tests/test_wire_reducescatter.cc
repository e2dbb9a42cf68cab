// The compressed (16-bit wire) reducescatter in pieces (algo_wire_reducescatter.cc) on the fake
// transport at 2-5 ranks, with pieces of a few elements and several in flight: each rank's slice
// is exactly the float32 reduction, in rank order, of every rank's prescaled input rounded once
// to the wire type (the bits of the collective run whole), then postscaled (an average divided
// by the rank count); bf16 and fp16, sum and average; a joined rank contributes the identity.
#include <random>
#include <thread>

#include "../half.h"
#include "harness.h"

using namespace mlsl;
using namespace mlsl_test;

namespace {

constexpr int kCols = 33;

float WireRound(DataType wire, float x) {
  return wire == DataType::kBfloat16 ? Bf16ToFloat(FloatToBf16(x)) : Fp16ToFloat(FloatToFp16(x));
}

std::vector<float> RankInput(int rank, int64_t count) {
  std::mt19937 gen(77 + rank);
  std::uniform_real_distribution<float> d(-3.0f, 3.0f);
  std::vector<float> x(count);
  for (auto& v : x) v = d(gen);
  return x;
}

// Rank `rank`'s slice, computed here element by element; `joined` ranks bring zeros.
std::vector<float> Expected(int n, int rank, int rows, DataType wire, ReduceOp op, double prescale, double postscale,
                            const std::vector<bool>& joined) {
  int first = 0;
  for (int i = 0; i < rank; ++i) first += rows / n + (i < rows % n ? 1 : 0);
  const int mine = rows / n + (rank < rows % n ? 1 : 0);
  std::vector<std::vector<float>> in(n);
  for (int r = 0; r < n; ++r) in[r] = RankInput(r, int64_t(rows) * kCols);
  const double post = op == ReduceOp::kAverage ? postscale / n : postscale;
  std::vector<float> out(mine * kCols);
  for (int k = 0; k < mine * kCols; ++k) {
    float acc = 0;
    for (int r = 0; r < n; ++r) {
      const float x = joined[r] ? 0.0f : WireRound(wire, float(double(in[r][first * kCols + k]) * prescale));
      acc = r == 0 ? x : acc + x;
    }
    out[k] = float(double(acc) * post);
  }
  return out;
}

void CheckWireReducescatter(int n, int rank, Runtime& rt, DataType wire, ReduceOp op,
                            const std::vector<bool>& joined) {
  const int rows = 2 * n + 1;
  std::vector<float> x = RankInput(rank, int64_t(rows) * kCols);
  Request q;
  q.name = std::string("wire_rs_") + DataTypeName(wire) + "_" + ReduceOpName(op);
  q.op = OpType::kReducescatter;
  q.reduce_op = op;
  q.wire = int(wire);
  q.prescale = 3.0;
  q.postscale = 0.75;
  q.inputs = {Input(x, {rows, kCols})};
  auto f = Submit(rt, std::move(q));
  Result res = Get(f);
  CHECK(res.status.ok());
  const int mine = rows / n + (rank < rows % n ? 1 : 0);
  CHECK(res.shapes[0] == (Shape{mine, kCols}));
  const std::vector<float> want = Expected(n, rank, rows, wire, op, 3.0, 0.75, joined);
  const std::vector<float> got = res.As<float>();
  const bool same = got.size() == want.size() && std::memcmp(got.data(), want.data(), got.size() * 4) == 0;
  if (!same) std::fprintf(stderr, "  wire reducescatter n=%d rank %d %s %s differs\n", n, rank, DataTypeName(wire),
                          ReduceOpName(op));
  CHECK(same);
}

}  // namespace

TEST(wire_reducescatter_in_pieces_at_2_to_5_ranks) {
  // 64-byte pieces: 32 wire elements of each rank's segment (66 to 165 elements) per piece.
  RuntimeOptions o;
  o.engine.scheduler.chunk_bytes = 64;
  o.engine.scheduler.inflight = 3;
  for (int n = 2; n <= 5; ++n) {
    RunRanks(o, n, [n](int rank, Runtime& rt) {
      for (DataType wire : {DataType::kBfloat16, DataType::kFloat16}) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage}) {
          CheckWireReducescatter(n, rank, rt, wire, op, std::vector<bool>(n, false));
        }
      }
    });
  }
}

TEST(wire_reducescatter_in_pieces_with_a_joined_rank) {
  RuntimeOptions o;
  o.engine.scheduler.chunk_bytes = 48;
  o.engine.scheduler.inflight = 2;
  RunRanks(o, 3, [](int rank, Runtime& rt) {
    Request join = JoinRequest();
    if (rank > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      CheckWireReducescatter(3, rank, rt, DataType::kBfloat16, ReduceOp::kSum, {true, false, false});
    }
    auto j = Submit(rt, std::move(join));
    CHECK(Get(j).status.ok());
  });
}
