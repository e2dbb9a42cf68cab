// RequestMeta: the part of a Request that every rank must agree on, and its wire format for
// negotiation. For allgather and alltoall the first dimension may differ per rank, so it is
// recorded as -1 here and exchanged when the collective runs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "request.h"
#include "types.h"

namespace mlsl {

struct RequestMeta {
  std::string name;
  OpType op = OpType::kAllreduce;
  DataType dtype = DataType::kFloat32;
  ReduceOp reduce_op = ReduceOp::kSum;
  double prescale = 1.0, postscale = 1.0;
  int32_t root = 0, priority = 0, group = 0;
  DataType wire = DataType::kFloat32;  // what travels: dtype itself unless compressed (runtime sets it)
  bool error_feedback = false;
  std::vector<Shape> shapes;
  std::vector<int32_t> ranks;  // add_group: the sorted member ranks
  std::string local_error;  // this rank's own input was invalid; reported to every rank

  static RequestMeta From(const Request& r);
  // Travels as a 16-bit wire type (only float32 reductions are: Runtime::Intake sets wire).
  bool compressed() const { return wire != dtype; }
  bool operator==(const RequestMeta& o) const;
  bool operator!=(const RequestMeta& o) const { return !(*this == o); }
  // Names the first field in which `other` differs, e.g. "shape [2] vs [3]"; "" when equal.
  std::string Difference(const RequestMeta& other) const;
  // Elements in one row of tensor i: the product of the dimensions after the first.
  int64_t RowElements(size_t i) const;
};

// Elements over all of its tensors.
int64_t Elements(const RequestMeta& m);

// Appends/reads a list of metas to/from a byte buffer (same layout on every rank).
void SerializeMetas(const std::vector<RequestMeta>& metas, std::string* out);
bool ParseMetas(const char* data, size_t size, std::vector<RequestMeta>* out);

// Checks a request's own input (shapes, splits, reduce op vs dtype, root range); returns the
// message, or "" when valid.
// `size` is the number of ranks of the request's group.
std::string ValidateLocally(const Request& r, int size);

}  // namespace mlsl
