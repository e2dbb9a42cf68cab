#include "eager.h"

#include <cstring>

#include "reduce.h"

namespace mlsl {
namespace {

constexpr uint64_t kInvalid = uint64_t(1) << 63;

struct Header {
  int32_t id;  // -1: end of entries
  DataType dtype;
  ReduceOp op;
  bool valid;
  int64_t count;
  int64_t words;  // the whole entry
};

// The entry at words[at]; id -1 when the region ends there or is malformed.
Header Read(const uint64_t* words, int64_t count, int64_t at) {
  Header h{-1, DataType::kFloat32, ReduceOp::kSum, false, 0, 0};
  if (at + 2 > count || words[at] == 0) return h;
  const uint64_t w = words[at];
  const int dtype = int((w >> 32) & 0xff), op = int((w >> 40) & 0xff);
  if (dtype >= kNumDataTypes || op > int(ReduceOp::kProduct)) return h;
  const int64_t n = int64_t(words[at + 1]);
  const int64_t bytes = n * int64_t(DataTypeSize(DataType(dtype)));
  if (n < 0 || at + EagerEntryWords(bytes) > count) return h;
  h.id = int32_t((w & 0xffffffff) - 1);
  h.dtype = DataType(dtype);
  h.op = ReduceOp(op);
  h.valid = !(w & kInvalid);
  h.count = n;
  h.words = EagerEntryWords(bytes);
  return h;
}

}  // namespace

int64_t EagerEntryWords(int64_t bytes) { return 2 + (bytes + 7) / 8; }

void* PutEager(uint64_t* words, int64_t end, int64_t* at, int32_t id, DataType dtype, ReduceOp op, int64_t count) {
  const int64_t n = EagerEntryWords(count * int64_t(DataTypeSize(dtype)));
  if (*at + n + 1 > end) return nullptr;
  uint64_t* e = words + *at;
  e[0] = (uint64_t(uint32_t(id) + 1)) | (uint64_t(dtype) << 32) | (uint64_t(op) << 40);
  e[1] = uint64_t(count);
  std::memset(e + 2, 0, size_t(n - 2) * 8);
  *at += n;
  words[*at] = 0;  // the end marker until another entry follows
  return e + 2;
}

void CombineEager(const uint64_t* in, uint64_t* inout, int64_t count) {
  int64_t i = 0;
  Header a = Read(in, count, 0);
  for (int64_t o = 0;;) {
    Header b = Read(inout, count, o);
    if (b.id < 0) return;
    while (a.id >= 0 && a.id < b.id) {
      i += a.words;
      a = Read(in, count, i);
    }
    if (a.id == b.id && a.valid && b.valid && a.dtype == b.dtype && a.op == b.op && a.count == b.count) {
      const ReduceOp op = b.op == ReduceOp::kAverage ? ReduceOp::kSum : b.op;
      ReduceInto(inout + o + 2, in + i + 2, b.count, b.dtype, op);
    } else {
      inout[o] |= kInvalid;
    }
    o += b.words;
  }
}

std::vector<EagerEntry> ValidEager(const uint64_t* words, int64_t count) {
  std::vector<EagerEntry> out;
  for (int64_t at = 0;;) {
    Header h = Read(words, count, at);
    if (h.id < 0) return out;
    if (h.valid) out.push_back(EagerEntry{h.id, h.dtype, h.op, h.count, words + at + 2});
    at += h.words;
  }
}

}  // namespace mlsl
