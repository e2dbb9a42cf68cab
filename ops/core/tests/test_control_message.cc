// ControlMessage: encoding, the combine rule over two ranks' words, and decoding.
#include <vector>

#include "../control_message.h"
#include "../eager.h"
#include "check.h"

using namespace mlsl;

namespace {

ControlMessage Empty(int ranks, int ids, int groups) {
  ControlMessage m;
  m.joined.assign(ranks, false);
  m.shut_down.assign(ranks, false);
  m.ready.assign(size_t((ids + 63) / 64), 0);
  m.units_done.assign(groups, 0);
  return m;
}

ControlMessage Combined(const ControlMessage& a, const ControlMessage& b, int ranks) {
  std::vector<uint64_t> wa, wb;
  a.Encode(&wa);
  b.Encode(&wb);
  ControlMessage::Combine(wb.data(), wa.data(), int64_t(wa.size()));
  ControlMessage out;
  out.Decode(wa.data(), int64_t(wa.size()), ranks);
  return out;
}

}  // namespace

TEST(control_message_combines_flags_as_or_ready_as_and_units_as_min) {
  ControlMessage a = Empty(3, 70, 2), b = Empty(3, 70, 2);
  a.announces = true;
  b.past_limit = true;
  a.joined[0] = true;
  b.shut_down[2] = true;
  for (int id : {1, 5, 69}) a.SetReady(id);
  for (int id : {5, 69, 7}) b.SetReady(id);
  a.units_done = {10, 4};
  b.units_done = {8, UINT64_MAX};
  a.wanted_eager = 12;
  b.wanted_eager = 30;
  a.fingerprint = b.fingerprint = 0xabcdef;
  ControlMessage c = Combined(a, b, 3);
  CHECK(c.agrees);
  CHECK(c.announces && c.past_limit && !c.busy && !c.stalled && !c.waits);
  CHECK(c.joined == (std::vector<bool>{true, false, false}));
  CHECK(c.shut_down == (std::vector<bool>{false, false, true}));
  CHECK(!c.Ready(1) && c.Ready(5) && c.Ready(69) && !c.Ready(7));
  CHECK(c.units_done == (std::vector<uint64_t>{8, 4}));
  CHECK_EQ(c.wanted_eager, int64_t(30));
  CHECK_EQ(c.fingerprint, uint64_t(0xabcdef));
}

TEST(control_message_flags_different_fingerprints_and_layouts) {
  ControlMessage a = Empty(2, 10, 1), b = Empty(2, 10, 1);
  a.fingerprint = 1;
  b.fingerprint = 2;
  CHECK(!Combined(a, b, 2).agrees);
  ControlMessage c = Empty(2, 10, 1), d = Empty(2, 200, 1);  // a different number of ids
  CHECK(!Combined(c, d, 2).agrees);
  CHECK(Combined(c, Empty(2, 10, 1), 2).agrees);
}

TEST(control_message_eager_region_keeps_entries_every_rank_sent) {
  ControlMessage a = Empty(2, 4, 1), b = Empty(2, 4, 1);
  a.eager.assign(8, ~uint64_t(0));
  b.eager.assign(8, ~uint64_t(0));
  a.eager[0] = b.eager[0] = 0;
  int64_t at_a = 0, at_b = 0;
  auto* da = static_cast<float*>(PutEager(a.eager.data(), 8, &at_a, 3, DataType::kFloat32, ReduceOp::kSum, 2));
  auto* db = static_cast<float*>(PutEager(b.eager.data(), 8, &at_b, 3, DataType::kFloat32, ReduceOp::kSum, 2));
  CHECK(da && db);
  da[0] = 1; da[1] = 2;
  db[0] = 10; db[1] = 20;
  ControlMessage c = Combined(a, b, 2);
  auto entries = ValidEager(c.eager.data(), int64_t(c.eager.size()));
  CHECK_EQ(entries.size(), size_t(1));
  CHECK_EQ(entries[0].id, 3);
  const float* got = static_cast<const float*>(entries[0].data);
  CHECK_EQ(got[0], 11.0f);
  CHECK_EQ(got[1], 22.0f);
}
