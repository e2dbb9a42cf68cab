// Op registrations and shape functions for the mlsl_tf collectives. Kernels are in kernels.cc.
// reduce_op uses Horovod's numbering (Average=0, Sum=1, Min=3, Max=4, Product=5).
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace mlsl_tf {

using tensorflow::Status;
using tensorflow::shape_inference::DimensionHandle;
using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

#define MLSL_TYPES "T: {uint8, int8, uint16, int16, int32, int64, half, bfloat16, float, double, bool}"
// The collective's name is an input (a scalar string), not an attr: eager calls with many
// distinct names then share one cached kernel instead of building one per name.
#define MLSL_COMMON_ATTRS                         \
  .Attr("priority: int = 0")                      \
      .Attr("process_set_id: int = 0")

// Same shape as the input, except an unknown first dimension (allgather, alltoall, reducescatter).
static Status FirstDimUnknown(InferenceContext* c) {
  ShapeHandle in = c->input(0);
  if (!c->RankKnown(in)) {
    c->set_output(0, c->UnknownShape());
    return Status();
  }
  ShapeHandle out;
  TF_RETURN_IF_ERROR(c->WithRankAtLeast(in, 1, &in));
  TF_RETURN_IF_ERROR(c->ReplaceDim(in, 0, c->UnknownDim(), &out));
  c->set_output(0, out);
  return Status();
}

REGISTER_OP("MlslAllreduce")
    .Attr(MLSL_TYPES)
    .Attr("reduce_op: int")
    .Attr("prescale_factor: float = 1.0")
    .Attr("postscale_factor: float = 1.0")
    .Attr("wire_dtype: string = ''")
    MLSL_COMMON_ATTRS
    .Input("tensor: T")
    .Input("tensor_name: string")
    .Output("sum: T")
    .SetShapeFn(tensorflow::shape_inference::UnchangedShape)
    .Doc("Reduces `tensor` over all ranks with `reduce_op`; every rank receives the result.");

REGISTER_OP("MlslGroupedAllreduce")
    .Attr(MLSL_TYPES)
    .Attr("num_tensors: int >= 1")
    .Attr("reduce_op: int")
    .Attr("prescale_factor: float = 1.0")
    .Attr("postscale_factor: float = 1.0")
    .Attr("wire_dtype: string = ''")
    MLSL_COMMON_ATTRS
    .Input("tensors: num_tensors * T")
    .Input("tensor_name: string")
    .Output("sums: num_tensors * T")
    .SetShapeFn([](InferenceContext* c) {
      for (int i = 0; i + 1 < c->num_inputs(); ++i) c->set_output(i, c->input(i));
      return Status();
    })
    .Doc("Allreduces a list of tensors as one negotiated, fused collective.");

REGISTER_OP("MlslAllgather")
    .Attr(MLSL_TYPES)
    MLSL_COMMON_ATTRS
    .Input("tensor: T")
    .Input("tensor_name: string")
    .Output("output: T")
    .SetShapeFn(FirstDimUnknown)
    .Doc("Concatenates every rank's `tensor` along the first dimension, which may differ per rank.");

REGISTER_OP("MlslBroadcast")
    .Attr(MLSL_TYPES)
    .Attr("root_rank: int")
    MLSL_COMMON_ATTRS
    .Input("tensor: T")
    .Input("tensor_name: string")
    .Output("output: T")
    .SetShapeFn(tensorflow::shape_inference::UnchangedShape)
    .Doc("Every rank receives root_rank's `tensor`.");

REGISTER_OP("MlslAlltoall")
    .Attr(MLSL_TYPES)
    MLSL_COMMON_ATTRS
    .Input("tensor: T")
    .Input("splits: int32")
    .Input("tensor_name: string")
    .Output("output: T")
    .Output("received_splits: int32")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle splits;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &splits));  // one entry per rank, not a matrix
      TF_RETURN_IF_ERROR(FirstDimUnknown(c));
      c->set_output(1, c->Vector(c->UnknownDim()));
      return Status();
    })
    .Doc("Sends splits[r] rows of `tensor` to rank r (equal parts when splits is empty).");

REGISTER_OP("MlslReducescatter")
    .Attr(MLSL_TYPES)
    .Attr("reduce_op: int")
    .Attr("prescale_factor: float = 1.0")
    .Attr("postscale_factor: float = 1.0")
    .Attr("wire_dtype: string = ''")
    MLSL_COMMON_ATTRS
    .Input("tensor: T")
    .Input("tensor_name: string")
    .Output("output: T")
    .SetShapeFn(FirstDimUnknown)
    .Doc("Reduces `tensor` over all ranks; rank r keeps the r-th block of rows.");

// Deferred allreduce: Start submits and returns at once, leaving the result with the runtime
// under tensor_name; a later TakeResult (in this call of the function or a later one) waits for
// it. Both take a resource handle (the variable the result will update) that they never read:
// TF's automatic control dependencies then order them with that variable's other reads and
// writes only, instead of chaining every stateful op of the function in program order.
REGISTER_OP("MlslStartAllreduce")
    .Attr(MLSL_TYPES)
    .Attr("reduce_op: int")
    .Attr("prescale_factor: float = 1.0")
    .Attr("postscale_factor: float = 1.0")
    .Attr("wire_dtype: string = ''")
    .Attr("tensor_name: string")
    MLSL_COMMON_ATTRS
    .Input("tensor: T")
    .Input("order: resource")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc("Starts an allreduce of `tensor`; MlslTakeResult with the same tensor_name receives it.");

REGISTER_OP("MlslTakeResult")
    .Attr(MLSL_TYPES)
    .Attr("shape: shape")
    .Attr("tensor_name: string")
    .Input("order: resource")
    .Output("found: bool")
    .Output("output: T")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Scalar());
      tensorflow::PartialTensorShape shape;
      TF_RETURN_IF_ERROR(c->GetAttr("shape", &shape));
      ShapeHandle out;
      TF_RETURN_IF_ERROR(c->MakeShapeFromPartialTensorShape(shape, &out));
      c->set_output(1, out);
      return Status();
    })
    .Doc("The result of the MlslStartAllreduce named tensor_name, once done (found = true), or, when "
         "none was started, found = false and an uninitialised tensor of `shape`.");

REGISTER_OP("MlslBarrier")
    .Attr("tensor_name: string = ''")
    .Attr("process_set_id: int = 0")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc("Returns when every rank has reached it.");

REGISTER_OP("MlslJoin")
    .Output("last_rank: int32")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc("Marks this rank as done; returns, once every rank has joined, the last rank to join.");

}  // namespace mlsl_tf
