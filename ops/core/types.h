// Element types, reduction ops and collective kinds shared by every layer. The numeric values
// of ReduceOp are Horovod's (Average=0, Sum=1, Adasum=2, Min=3, Max=4, Product=5) so that
// `hvd.Sum` means the same thing in Python, in the TF attr and here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace mlsl {

enum class DataType : int32_t {
  kUint8 = 0, kInt8 = 1, kInt32 = 2, kInt64 = 3,
  kFloat16 = 4, kBfloat16 = 5, kFloat32 = 6, kFloat64 = 7, kBool = 8,
  kUint16 = 9, kInt16 = 10,
};
constexpr int kNumDataTypes = 11;

enum class ReduceOp : int32_t { kAverage = 0, kSum = 1, kAdasum = 2, kMin = 3, kMax = 4, kProduct = 5 };

enum class OpType : int32_t {
  kAllreduce = 0, kAllgather = 1, kBroadcast = 2, kAlltoall = 3, kReducescatter = 4,
  kBarrier = 5, kJoin = 6,
  kAddGroup = 7, kRemoveGroup = 8,  // group management: collective over every rank of the world
};

using Shape = std::vector<int64_t>;

size_t DataTypeSize(DataType t);
const char* DataTypeName(DataType t);
const char* ReduceOpName(ReduceOp op);
const char* OpTypeName(OpType op);
bool IsFloating(DataType t);
bool ValidDataType(int32_t v);
bool ValidReduceOp(int32_t v);

int64_t NumElements(const Shape& s);
std::string ShapeString(const Shape& s);
// "1, 3, 4": ranks for messages.
std::string RankList(const std::vector<int>& ranks);
// A collective's name for messages: names longer than kMaxShownName keep their head and tail
// around "...", so an error about a generated 10 kB name stays one readable line.
constexpr size_t kMaxShownName = 120;
std::string ShownName(const std::string& name);

}  // namespace mlsl
