// Request: one collective submitted by the framework layer, with its lifecycle. It is created
// by a TF kernel (or a test), handed to Runtime::Submit, and finished exactly once by calling
// `done` with a Status -- from the background thread, or from Submit itself when it is
// refused at once.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "status.h"
#include "types.h"

namespace mlsl {

struct TensorInput {
  const void* data = nullptr;  // caller-owned, valid until done
  Shape shape;
};

struct Request {
  std::string name;  // identifies the collective across ranks
  OpType op = OpType::kAllreduce;
  DataType dtype = DataType::kFloat32;
  ReduceOp reduce_op = ReduceOp::kSum;
  double prescale = 1.0, postscale = 1.0;
  int root = 0;      // broadcast: the root's rank in the group; remove_group: the group's id
  int priority = 0;  // lower = more urgent
  int group = 0;     // 0 = all ranks
  int wire = -1;     // reducing float32 collectives: the DataType on the wire; -1 = MLSL_TF_WIRE_DTYPE
  bool error_feedback = false;  // compressed allreduce: keep what rounding lost, add it next time
  std::vector<int> ranks;  // add_group: the member ranks (world ranks)
  std::vector<TensorInput> inputs;  // several only for grouped allreduce; none for barrier/join
  std::vector<int64_t> splits;      // alltoall: rows sent to each rank; empty = equal split

  // Allocates output `index` with `shape` (dtype as the request's, except alltoall's output 1,
  // the int32 received splits, and join's output 0, an int32 scalar). Called by the background
  // thread before `done`, through Output, never twice for one index.
  std::function<Status(int index, const Shape& shape, void** data)> allocate_output;
  std::function<void(const Status&)> done;

  // Output `index`: allocated on the first call, the same buffer after (a small allreduce's
  // output is allocated before it rides in a control message, and again asked for if it is
  // reduced by the scheduler instead). A failure is returned every time; a null buffer for
  // bytes that exist is a failure.
  Status Output(int index, const Shape& shape, void** data) {
    if (size_t(index) < outputs_.size() && outputs_[index].first) {
      *data = outputs_[index].second;
      return Status::Ok();
    }
    *data = nullptr;
    Status s = allocate_output(index, shape, data);
    if (s.ok() && !*data && NumElements(shape) > 0) s = Status::Internal("output allocation returned null");
    if (!s.ok()) {
      *data = nullptr;
      return s;
    }
    if (outputs_.size() <= size_t(index)) outputs_.resize(size_t(index) + 1, {false, nullptr});
    outputs_[index] = {true, *data};
    return s;
  }

 private:
  std::vector<std::pair<bool, void*>> outputs_;  // (allocated, buffer) per index
};

}  // namespace mlsl
