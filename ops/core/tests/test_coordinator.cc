#include "../coordinator.h"
#include "check.h"

using namespace mlsl;

static RequestMeta Meta(const std::string& name, Shape shape, DataType dtype = DataType::kFloat32,
                        OpType op = OpType::kAllreduce) {
  RequestMeta m;
  m.name = name;
  m.op = op;
  m.dtype = dtype;
  m.shapes = {shape};
  return m;
}

TEST(coordinator_agrees_when_all_ranks_announced) {
  Coordinator c(3);
  std::vector<bool> none(3, false);
  c.Announce(0, Meta("a", {2}));
  c.Announce(2, Meta("a", {2}));
  CHECK(c.Resolve(none).empty());  // rank 1 missing
  c.Announce(1, Meta("a", {2}));
  auto d = c.Resolve(none);
  CHECK_EQ(d.size(), size_t(1));
  CHECK(d[0].kind == Decision::kAgreed);
  CHECK_EQ(d[0].id, 0);
  CHECK_EQ(c.meta(0).name, std::string("a"));
}

TEST(coordinator_names_tensor_field_and_ranks_on_mismatch) {
  Coordinator c(2);
  std::vector<bool> none(2, false);
  c.Announce(0, Meta("grad", {2, 3}));
  c.Announce(1, Meta("grad", {4}));
  auto d = c.Resolve(none);
  CHECK_EQ(d.size(), size_t(1));
  CHECK(d[0].kind == Decision::kError);
  CHECK_CONTAINS(d[0].error, "'grad'");
  CHECK_CONTAINS(d[0].error, "shape [2, 3] on rank 0 vs [4] on rank 1");

  c.Announce(0, Meta("t", {2}, DataType::kFloat32));
  c.Announce(1, Meta("t", {2}, DataType::kInt32));
  d = c.Resolve(none);
  CHECK_CONTAINS(d[0].error, "dtype float32 on rank 0 vs int32 on rank 1");

  c.Announce(0, Meta("o", {2}, DataType::kFloat32, OpType::kAllreduce));
  c.Announce(1, Meta("o", {2}, DataType::kFloat32, OpType::kAllgather));
  d = c.Resolve(none);
  CHECK_CONTAINS(d[0].error, "operation allreduce on rank 0 vs allgather on rank 1");
}

TEST(coordinator_allgather_first_dimension_may_differ) {
  Coordinator c(2);
  std::vector<bool> none(2, false);
  RequestMeta a = Meta("g", {-1, 3}, DataType::kFloat32, OpType::kAllgather);
  c.Announce(0, a);
  c.Announce(1, a);
  CHECK(c.Resolve(none)[0].kind == Decision::kAgreed);
  c.Announce(0, Meta("h", {-1, 3}, DataType::kFloat32, OpType::kAllgather));
  c.Announce(1, Meta("h", {-1, 4}, DataType::kFloat32, OpType::kAllgather));
  CHECK_CONTAINS(c.Resolve(none)[0].error, "shape after the first dimension [3] on rank 0 vs [4] on rank 1");
}

TEST(coordinator_reports_local_errors_and_invalidates) {
  Coordinator c(2);
  std::vector<bool> none(2, false);
  c.Announce(0, Meta("x", {2}));
  c.Announce(1, Meta("x", {2}));
  CHECK(c.Resolve(none)[0].kind == Decision::kAgreed);
  // x has an id; rank 1 re-announces with other metadata: everyone must re-announce.
  RequestMeta bad = Meta("x", {5});
  bad.local_error = "splits are wrong";
  c.Announce(1, bad);
  auto d = c.Resolve(none);
  CHECK_EQ(d.size(), size_t(1));
  CHECK(d[0].kind == Decision::kInvalidate);
  c.Announce(0, Meta("x", {2}));
  d = c.Resolve(none);
  CHECK(d[0].kind == Decision::kError);
  CHECK_CONTAINS(d[0].error, "rank 1: splits are wrong");
}

TEST(coordinator_joined_ranks_count_as_announced) {
  Coordinator c(3);
  c.Announce(0, Meta("x", {2}));
  c.Announce(1, Meta("x", {2}));
  CHECK(c.Resolve({false, false, false}).empty());
  auto d = c.Resolve({false, false, true});
  CHECK(d.size() == 1 && d[0].kind == Decision::kAgreed);
  CHECK(c.Resolve({true, true, true}).empty());
}

TEST(metas_round_trip) {
  RequestMeta m = Meta("n", {3, -1, 2}, DataType::kBfloat16, OpType::kBroadcast);
  m.root = 2; m.priority = -4; m.prescale = 0.5; m.local_error = "e";
  std::string buf;
  SerializeMetas({m, Meta("second", {})}, &buf);
  std::vector<RequestMeta> back;
  CHECK(ParseMetas(buf.data(), buf.size(), &back));
  CHECK_EQ(back.size(), size_t(2));
  CHECK(back[0] == m);
  CHECK_EQ(back[1].name, std::string("second"));
  CHECK(!ParseMetas(buf.data(), buf.size() - 1, &back));
}

// Agrees `names` (in this order) on a one-rank coordinator.
static void AgreeAll(Coordinator* c, const std::vector<std::string>& names) {
  for (const auto& n : names) c->Announce(0, Meta(n, {1}));
  c->Resolve(std::vector<bool>(1, false));
}

TEST(coordinator_fingerprint_follows_the_id_table) {
  Coordinator a(1), b(1), swapped(1);
  CHECK_EQ(a.fingerprint(), b.fingerprint());
  AgreeAll(&a, {"x", "y", "z"});
  AgreeAll(&b, {"x", "y", "z"});
  AgreeAll(&swapped, {"y", "x", "z"});  // same names, other ids
  CHECK_EQ(a.fingerprint(), b.fingerprint());
  CHECK(a.fingerprint() != swapped.fingerprint());
  // The same history forgets the same names; a different number kept differs.
  a.Touch(2, 5);
  b.Touch(2, 5);
  a.Retire(2);
  b.Retire(1);
  CHECK(a.fingerprint() != b.fingerprint());
  Coordinator c(1);
  AgreeAll(&c, {"x", "y", "z"});
  c.Touch(2, 5);
  c.Retire(2);
  CHECK_EQ(a.fingerprint(), c.fingerprint());
  // A table rebuilt from scratch with the survivors in the same order matches too.
  Coordinator d(1);
  AgreeAll(&d, {"y", "z"});
  CHECK_EQ(a.fingerprint(), d.fingerprint());
}
