// The eager region's format and combining rule (eager.h), without a runtime.
#include <cstring>
#include <vector>

#include "../communicator.h"
#include "../control_message.h"
#include "../eager.h"
#include "check.h"

using namespace mlsl;

namespace {

struct Region {
  std::vector<uint64_t> words;
  int64_t at = 0;
  explicit Region(int64_t n) : words(size_t(n), ~uint64_t(0)) { words[0] = 0; }
  template <typename T> bool Put(int32_t id, DataType dtype, ReduceOp op, std::vector<T> v) {
    void* d = PutEager(words.data(), int64_t(words.size()), &at, id, dtype, op, int64_t(v.size()));
    if (d) std::memcpy(d, v.data(), v.size() * sizeof(T));
    return d != nullptr;
  }
};

template <typename T> std::vector<T> Data(const EagerEntry& e) {
  const T* p = static_cast<const T*>(e.data);
  return std::vector<T>(p, p + e.count);
}

}  // namespace

TEST(eager_entries_take_header_count_and_padded_data) {
  CHECK_EQ(EagerEntryWords(0), int64_t(2));
  CHECK_EQ(EagerEntryWords(1), int64_t(3));
  CHECK_EQ(EagerEntryWords(8), int64_t(3));
  CHECK_EQ(EagerEntryWords(4096), int64_t(2 + 512));
  // 3 floats = 12 bytes -> 2 data words; one word stays for the end marker.
  Region r(2 + 2 + 1);
  CHECK(r.Put<float>(7, DataType::kFloat32, ReduceOp::kSum, {1, 2, 3}));
  CHECK(!r.Put<float>(8, DataType::kFloat32, ReduceOp::kSum, {1}));
  CHECK_EQ(r.at, int64_t(4));
  auto v = ValidEager(r.words.data(), int64_t(r.words.size()));
  CHECK_EQ(v.size(), size_t(1));
  CHECK_EQ(v[0].id, 7);
  CHECK(Data<float>(v[0]) == std::vector<float>({1, 2, 3}));
  // An empty region and one whose end marker is missing read as no entries / the ones that fit.
  Region empty(4);
  CHECK(ValidEager(empty.words.data(), 4).empty());
  CHECK(ValidEager(r.words.data(), 3).empty());  // the entry would overrun 3 words
}

TEST(eager_combining_keeps_what_every_rank_holds_reduced) {
  // Three ranks: ids {1, 4, 9}, {1, 4, 5, 9}, {1, 9} with 4 ranks-worth of data each; id 9's
  // count differs on the last rank, so only id 1 survives everywhere.
  Region a(64), b(64), c(64);
  CHECK(a.Put<float>(1, DataType::kFloat32, ReduceOp::kSum, {1, 10}));
  CHECK(a.Put<int32_t>(4, DataType::kInt32, ReduceOp::kMin, {5, -1, 7}));
  CHECK(a.Put<float>(9, DataType::kFloat32, ReduceOp::kMax, {1}));
  CHECK(b.Put<float>(1, DataType::kFloat32, ReduceOp::kSum, {2, 20}));
  CHECK(b.Put<int32_t>(4, DataType::kInt32, ReduceOp::kMin, {3, 0, 9}));
  CHECK(b.Put<float>(5, DataType::kFloat32, ReduceOp::kSum, {3}));
  CHECK(b.Put<float>(9, DataType::kFloat32, ReduceOp::kMax, {2}));
  CHECK(c.Put<float>(1, DataType::kFloat32, ReduceOp::kSum, {4, 40}));
  CHECK(c.Put<float>(9, DataType::kFloat32, ReduceOp::kMax, {3, 3}));
  // a (+) b first: ids 1, 4, 9 valid, 5 dropped
  std::vector<uint64_t> ab = b.words;
  CombineEager(a.words.data(), ab.data(), 64);
  auto v = ValidEager(ab.data(), 64);
  CHECK_EQ(v.size(), size_t(3));
  CHECK(Data<float>(v[0]) == std::vector<float>({3, 30}));
  CHECK(Data<int32_t>(v[1]) == std::vector<int32_t>({3, -1, 7}));
  CHECK(Data<float>(v[2]) == std::vector<float>({2}));
  // then c, in either order: the same valid set and values
  std::vector<uint64_t> abc = ab, cab = c.words;
  CombineEager(c.words.data(), abc.data(), 64);
  CombineEager(ab.data(), cab.data(), 64);
  for (auto* w : {&abc, &cab}) {
    auto e = ValidEager(w->data(), 64);
    CHECK_EQ(e.size(), size_t(1));
    CHECK_EQ(e[0].id, 1);
    CHECK(Data<float>(e[0]) == std::vector<float>({7, 70}));
  }
  // an op or dtype that differs invalidates too; average reduces as a sum
  Region x(16), y(16);
  CHECK(x.Put<float>(2, DataType::kFloat32, ReduceOp::kAverage, {1, 2}));
  CHECK(y.Put<float>(2, DataType::kFloat32, ReduceOp::kAverage, {3, 4}));
  CombineEager(x.words.data(), y.words.data(), 16);
  CHECK(Data<float>(ValidEager(y.words.data(), 16)[0]) == std::vector<float>({4, 6}));
  Region p(16), q(16);
  CHECK(p.Put<float>(2, DataType::kFloat32, ReduceOp::kSum, {1}));
  CHECK(q.Put<float>(2, DataType::kFloat32, ReduceOp::kMax, {1}));
  CombineEager(p.words.data(), q.words.data(), 16);
  CHECK(ValidEager(q.words.data(), 16).empty());
}

// Two control messages with different layouts (word 0) are not combined: the layout flag
// (kLayoutAgrees in word 1) is cleared so every rank can fail instead of misreading the words.
TEST(control_messages_of_different_layouts_are_flagged) {
  std::vector<uint64_t> a = {3 | (uint64_t(2) << 32), ~uint64_t(0), 0xf0, 7, 9};
  std::vector<uint64_t> same = a, other = {4 | (uint64_t(1) << 32), ~uint64_t(0), 0x0f, 1, 2};
  same[2] = 0x3c;
  same[4] = 1;
  ControlMessage::Combine(same.data(), a.data(), 5);
  CHECK(a[1] & kLayoutAgrees);
  CHECK_EQ(a[2], uint64_t(0x30));
  CHECK_EQ(a[4], uint64_t(1));
  std::vector<uint64_t> before = a;
  ControlMessage::Combine(other.data(), a.data(), 5);
  CHECK(!(a[1] & kLayoutAgrees));
  CHECK_EQ(a[2], before[2]);
  CHECK_EQ(a[4], before[4]);
}
