// AsyncOpKernels for the collectives. Every kernel has the same shape: read attrs, wrap the
// inputs in an mlsl::Request, submit it to the runtime, and in the request's callbacks
// allocate outputs and finish with SetStatus + done. All logic lives in ops/core.
#include <memory>
#include <string>

#include "absl/strings/cord.h"
#include "tensorflow/core/framework/allocator.h"
#include "tensorflow/core/framework/log_memory.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

#include "../core/c_api.h"
#include "../core/request.h"
#include "../core/runtime.h"

namespace mlsl_tf {

using tensorflow::AsyncOpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;

namespace {

tensorflow::Status ToTfClass(const mlsl::Status& s) {
  switch (s.code()) {
    case mlsl::StatusCode::kOk: return tensorflow::Status();
    case mlsl::StatusCode::kInvalidArgument: return tensorflow::errors::InvalidArgument(s.message());
    case mlsl::StatusCode::kFailedPrecondition: return tensorflow::errors::FailedPrecondition(s.message());
    case mlsl::StatusCode::kAborted: return tensorflow::errors::Aborted(s.message());
    case mlsl::StatusCode::kInternal: return tensorflow::errors::Internal(s.message());
    // A peer's end stays AbortedError, as in Horovod (TensorFlow turns an UnavailableError of a
    // non-communication op into an InternalError inside tf.function); the payload tells it apart.
    case mlsl::StatusCode::kUnavailable: return tensorflow::errors::Aborted(s.message());
  }
  return tensorflow::errors::Unknown(s.message());
}

// The core's StatusCode rides along as a payload (Python: OpError.experimental_payloads).
tensorflow::Status ToTf(const mlsl::Status& s) {
  tensorflow::Status t = ToTfClass(s);
  const std::string code = std::to_string(int(s.code()));
  if (!s.ok()) t.SetPayload(mlsl::kStatusCodePayload, absl::Cord(absl::string_view(code)));
  return t;
}

bool ToCore(tensorflow::DataType t, mlsl::DataType* out) {
  switch (t) {
    case tensorflow::DT_UINT8: *out = mlsl::DataType::kUint8; return true;
    case tensorflow::DT_INT8: *out = mlsl::DataType::kInt8; return true;
    case tensorflow::DT_INT32: *out = mlsl::DataType::kInt32; return true;
    case tensorflow::DT_INT64: *out = mlsl::DataType::kInt64; return true;
    case tensorflow::DT_HALF: *out = mlsl::DataType::kFloat16; return true;
    case tensorflow::DT_BFLOAT16: *out = mlsl::DataType::kBfloat16; return true;
    case tensorflow::DT_FLOAT: *out = mlsl::DataType::kFloat32; return true;
    case tensorflow::DT_DOUBLE: *out = mlsl::DataType::kFloat64; return true;
    case tensorflow::DT_BOOL: *out = mlsl::DataType::kBool; return true;
    case tensorflow::DT_UINT16: *out = mlsl::DataType::kUint16; return true;
    case tensorflow::DT_INT16: *out = mlsl::DataType::kInt16; return true;
    default: return false;
  }
}

mlsl::Shape ShapeOf(const Tensor& t) {
  mlsl::Shape s;
  for (int i = 0; i < t.dims(); ++i) s.push_back(t.dim_size(i));
  return s;
}

bool HasNameAttr(const tensorflow::NodeDef& def) { return def.attr().count("tensor_name") > 0; }

// Attrs every collective kernel reads, and the request skeleton built from them.
class CollectiveKernel : public AsyncOpKernel {
 public:
  CollectiveKernel(OpKernelConstruction* c, mlsl::OpType op) : AsyncOpKernel(c), op_(op) {
    // Most collectives take their name as their last input; barrier and start keep an attr.
    if (c->HasAttr("tensor_name")) OP_REQUIRES_OK(c, c->GetAttr("tensor_name", &tensor_name_));
    if (c->HasAttr("priority")) OP_REQUIRES_OK(c, c->GetAttr("priority", &priority_));
    if (c->HasAttr("process_set_id")) OP_REQUIRES_OK(c, c->GetAttr("process_set_id", &group_));
    if (c->HasAttr("reduce_op")) {
      int v;
      OP_REQUIRES_OK(c, c->GetAttr("reduce_op", &v));
      OP_REQUIRES(c, v >= 0 && v <= 5, tensorflow::errors::InvalidArgument("unknown reduce_op ", v));
      reduce_op_ = mlsl::ReduceOp(v);
    }
    if (c->HasAttr("prescale_factor")) OP_REQUIRES_OK(c, c->GetAttr("prescale_factor", &prescale_));
    if (c->HasAttr("postscale_factor")) OP_REQUIRES_OK(c, c->GetAttr("postscale_factor", &postscale_));
    if (c->HasAttr("root_rank")) OP_REQUIRES_OK(c, c->GetAttr("root_rank", &root_));
    if (c->HasAttr("wire_dtype")) {
      // '' = MLSL_TF_WIRE_DTYPE; 'none'/'float32' = uncompressed; 'bfloat16' / 'float16'.
      std::string w;
      OP_REQUIRES_OK(c, c->GetAttr("wire_dtype", &w));
      if (w == "none" || w == "float32") wire_ = int(mlsl::DataType::kFloat32);
      else if (w == "bfloat16") wire_ = int(mlsl::DataType::kBfloat16);
      else if (w == "bfloat16_ef") wire_ = int(mlsl::DataType::kBfloat16), error_feedback_ = true;
      else if (w == "float16") wire_ = int(mlsl::DataType::kFloat16);
      else OP_REQUIRES(c, w.empty(), tensorflow::errors::InvalidArgument(
                                         "wire_dtype must be '', 'none', 'float32', 'bfloat16', 'bfloat16_ef' or "
                                         "'float16', not '", w, "'"));
    }
  }

  // Submitting returns at once, so the executor runs this kernel inline on the thread that
  // produced its input (TF dispatches "expensive" kernels to the inter-op pool, and async
  // kernels never get a measured cost that would make them cheap): the collective is enqueued
  // as soon as its input exists, whatever else the pool is busy with.
  bool IsExpensive() override { return false; }

 protected:
  // A request described by this node's attrs and `tensor_name` ('' = the node's name),
  // without inputs or callbacks.
  std::unique_ptr<mlsl::Request> NewRequest(const std::string& tensor_name) const {
    auto r = std::make_unique<mlsl::Request>();
    r->name = tensor_name.empty() ? name() : tensor_name;
    r->op = op_;
    r->reduce_op = reduce_op_;
    r->prescale = prescale_;
    r->postscale = postscale_;
    r->root = root_;
    r->priority = priority_;
    r->group = group_;
    r->wire = wire_;
    r->error_feedback = error_feedback_;
    return r;
  }

  // A request for this node's inputs [first, first+count), with outputs allocated on ctx.
  std::unique_ptr<mlsl::Request> MakeRequest(OpKernelContext* ctx, int first, int count, DoneCallback done) {
    auto r = NewRequest(InputName(ctx));
    for (int i = first; i < first + count; ++i) {
      const Tensor& t = ctx->input(i);
      r->inputs.push_back(mlsl::TensorInput{t.tensor_data().data(), ShapeOf(t)});
    }
    if (count > 0) ToCore(ctx->input(first).dtype(), &r->dtype);
    const bool forwardable = op_ == mlsl::OpType::kAllreduce;
    r->allocate_output = [ctx, first, forwardable](int index, const mlsl::Shape& shape, void** data) {
      TensorShape ts;
      for (int64_t d : shape) ts.AddDim(d);
      Tensor* out = nullptr;
      // An allreduce may write into its input when TF holds no other reference to it: the
      // collective then runs in place on memory that is already mapped and warm.
      tensorflow::Status s = forwardable ? ctx->forward_input_or_allocate_output({first + index}, index, ts, &out)
                                         : ctx->allocate_output(index, ts, &out);
      if (!s.ok()) return mlsl::Status::Internal("could not allocate output: " + std::string(s.message()));
      *data = const_cast<char*>(out->tensor_data().data());
      return mlsl::Status::Ok();
    };
    r->done = [ctx, done](const mlsl::Status& s) {
      ctx->SetStatus(ToTf(s));
      done();
    };
    return r;
  }

  // Checks init and dtype, then hands the request over; finishes the op at once on error.
  void Submit(OpKernelContext* ctx, std::unique_ptr<mlsl::Request> r, const DoneCallback& done) {
    std::shared_ptr<mlsl::Runtime> rt = mlsl::CurrentRuntime();
    OP_REQUIRES_ASYNC(ctx, rt != nullptr,
                      tensorflow::errors::FailedPrecondition(
                          "mlsl_tf has not been initialised: call mlsl_tf.init() before running '", r->name, "'"),
                      done);
    rt->Submit(std::move(r));
  }

  // The name the op was given: its last input, or the tensor_name attr of ops without one.
  std::string InputName(OpKernelContext* ctx) const {
    if (!takes_name_input_) return tensor_name_;
    const Tensor& t = ctx->input(ctx->num_inputs() - 1);
    return std::string(t.scalar<tensorflow::tstring>()());
  }

  // False (and the op finished with an error) when this kernel must not run the collective.
  bool Admit(OpKernelContext* ctx, int input, const DoneCallback& done) {
    if (takes_name_input_) {
      const Tensor& t = ctx->input(ctx->num_inputs() - 1);
      if (t.dtype() != tensorflow::DT_STRING || t.dims() != 0) {
        ctx->SetStatus(tensorflow::errors::InvalidArgument("mlsl_tf: the tensor_name input of '", name(),
                                                           "' must be a scalar string, got ",
                                                           tensorflow::DataTypeString(t.dtype()), " of shape ",
                                                           t.shape().DebugString()));
        done();
        return false;
      }
    }
    // Constant folding (the function runtime's, with step id CONSTANT_FOLDING_STEP_ID, and
    // Grappler's, without a runner) evaluates a node whose inputs are all constants once, while
    // optimising the graph; a collective folded that way would run at optimisation time, on the
    // ranks that fold it, and never at run time. Failing here keeps the node (a failed fold is
    // silent), so the collective runs at every call as written.
    if (ctx->runner() == nullptr || ctx->step_id() == tensorflow::LogMemory::CONSTANT_FOLDING_STEP_ID) {
      ctx->SetStatus(tensorflow::errors::FailedPrecondition(
          "mlsl_tf collectives are not constant-folded: '", name(), "' runs in an executor only"));
      done();
      return false;
    }
    mlsl::DataType unused;
    if (ctx->num_inputs() > input && !ToCore(ctx->input(input).dtype(), &unused)) {
      ctx->SetStatus(tensorflow::errors::InvalidArgument("mlsl_tf does not support dtype ",
                                                         tensorflow::DataTypeString(ctx->input(input).dtype())));
      done();
      return false;
    }
    return true;
  }

  const mlsl::OpType op_;
  const bool takes_name_input_ = !HasNameAttr(def());
  std::string tensor_name_;
  int priority_ = 0, group_ = 0, root_ = 0, wire_ = -1;
  bool error_feedback_ = false;
  mlsl::ReduceOp reduce_op_ = mlsl::ReduceOp::kSum;
  float prescale_ = 1.0f, postscale_ = 1.0f;
};

template <mlsl::OpType kOp>
class SingleTensorKernel : public CollectiveKernel {
 public:
  explicit SingleTensorKernel(OpKernelConstruction* c) : CollectiveKernel(c, kOp) {}
  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    if (!Admit(ctx, 0, done)) return;
    auto r = MakeRequest(ctx, 0, 1, done);
    Submit(ctx, std::move(r), done);
  }
};

class GroupedAllreduceKernel : public CollectiveKernel {
 public:
  explicit GroupedAllreduceKernel(OpKernelConstruction* c) : CollectiveKernel(c, mlsl::OpType::kAllreduce) {}
  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    if (!Admit(ctx, 0, done)) return;
    auto r = MakeRequest(ctx, 0, ctx->num_inputs() - 1, done);
    Submit(ctx, std::move(r), done);
  }
};

class AlltoallKernel : public CollectiveKernel {
 public:
  explicit AlltoallKernel(OpKernelConstruction* c) : CollectiveKernel(c, mlsl::OpType::kAlltoall) {}
  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    if (!Admit(ctx, 0, done)) return;
    OP_REQUIRES_ASYNC(ctx, ctx->input(1).dims() == 1,
                      tensorflow::errors::InvalidArgument("mlsl_tf: alltoall splits must be a vector (one entry per "
                                                          "rank), got shape ", ctx->input(1).shape().DebugString()),
                      done);
    auto r = MakeRequest(ctx, 0, 1, done);
    auto splits = ctx->input(1).flat<int32_t>();
    for (int i = 0; i < splits.size(); ++i) r->splits.push_back(splits(i));
    Submit(ctx, std::move(r), done);
  }
};

// What a started allreduce keeps alive until its result is taken: the input (read by the
// background thread after the op has returned) and the output.
struct DeferredTensors {
  Tensor input, output;
};

class StartAllreduceKernel : public CollectiveKernel {
 public:
  explicit StartAllreduceKernel(OpKernelConstruction* c) : CollectiveKernel(c, mlsl::OpType::kAllreduce) {
    OP_REQUIRES(c, !tensor_name_.empty(), tensorflow::errors::InvalidArgument("MlslStartAllreduce needs a tensor_name"));
  }
  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    if (!Admit(ctx, 0, done)) return;
    std::shared_ptr<mlsl::Runtime> rt = mlsl::CurrentRuntime();
    OP_REQUIRES_ASYNC(ctx, rt != nullptr,
                      tensorflow::errors::FailedPrecondition(
                          "mlsl_tf has not been initialised: call mlsl_tf.init() before running '", tensor_name_, "'"),
                      done);
    auto tensors = std::make_shared<DeferredTensors>();
    tensors->input = ctx->input(0);
    auto r = NewRequest(tensor_name_);
    ToCore(tensors->input.dtype(), &r->dtype);
    r->inputs.push_back(mlsl::TensorInput{tensors->input.tensor_data().data(), ShapeOf(tensors->input)});
    r->allocate_output = [tensors](int, const mlsl::Shape& shape, void** data) {
      Tensor& in = tensors->input;
      // By now the executor has usually dropped its reference to the gradient: reduce into
      // its buffer, which is mapped and warm, unless someone else still reads it.
      if (in.RefCountIsOne() && ShapeOf(in) == shape) {
        tensors->output = in;
      } else {
        TensorShape ts;
        for (int64_t d : shape) ts.AddDim(d);
        tensors->output = Tensor(tensorflow::cpu_allocator(), in.dtype(), ts);
        if (!tensors->output.IsInitialized()) return mlsl::Status::Internal("could not allocate the result");
      }
      *data = const_cast<char*>(tensors->output.tensor_data().data());
      return mlsl::Status::Ok();
    };
    std::shared_ptr<mlsl::Results> results = rt->results();
    r->done = [results, name = r->name](const mlsl::Status& s) { results->Complete(name, s); };
    mlsl::Status parked = results->Park(r->name, tensors);
    OP_REQUIRES_ASYNC(ctx, parked.ok(), ToTf(parked), done);
    rt->Submit(std::move(r));
    done();
  }
};

class TakeResultKernel : public AsyncOpKernel {
 public:
  explicit TakeResultKernel(OpKernelConstruction* c) : AsyncOpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("tensor_name", &tensor_name_));
    OP_REQUIRES_OK(c, c->GetAttr("T", &dtype_));
    tensorflow::PartialTensorShape shape;
    OP_REQUIRES_OK(c, c->GetAttr("shape", &shape));
    OP_REQUIRES(c, shape.AsTensorShape(&shape_),
                tensorflow::errors::InvalidArgument("MlslTakeResult needs a fully defined shape"));
  }
  bool IsExpensive() override { return false; }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    // Without a runtime (before init, after shutdown) nothing is parked: found = false, so a
    // model whose updates were deferred still runs its graphs.
    std::shared_ptr<mlsl::Runtime> rt = mlsl::CurrentRuntime();
    auto finish = [this, ctx, done](const mlsl::Status& s, mlsl::Results::Payload payload) {
      const Tensor& out = static_cast<DeferredTensors*>(payload.get())->output;
      if (!s.ok()) {
        ctx->SetStatus(ToTf(s));
      } else if (out.dtype() != dtype_ || out.shape() != shape_) {
        ctx->SetStatus(tensorflow::errors::InvalidArgument(
            "mlsl_tf: the result of '", tensor_name_, "' is ", tensorflow::DataTypeString(out.dtype()),
            out.shape().DebugString(), ", taken as ", tensorflow::DataTypeString(dtype_), shape_.DebugString()));
      } else {
        SetFound(ctx, true);
        ctx->set_output(1, out);
      }
      done();
    };
    if (rt != nullptr && rt->results()->Take(tensor_name_, std::move(finish))) return;
    // Nothing started under this name: found = false, and an output of the declared shape that
    // nobody reads (it is not written).
    SetFound(ctx, false);
    Tensor* out = nullptr;
    OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(1, shape_, &out), done);
    done();
  }

 private:
  static void SetFound(OpKernelContext* ctx, bool found) {
    Tensor* flag = nullptr;
    if (ctx->allocate_output(0, TensorShape({}), &flag).ok()) flag->scalar<bool>()() = found;
  }

  std::string tensor_name_;
  tensorflow::DataType dtype_;
  TensorShape shape_;
};

class NoInputKernel : public CollectiveKernel {
 public:
  NoInputKernel(OpKernelConstruction* c, mlsl::OpType op) : CollectiveKernel(c, op) {}
  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    auto r = MakeRequest(ctx, 0, 0, done);
    r->dtype = mlsl::DataType::kInt32;
    Submit(ctx, std::move(r), done);
  }
};

class BarrierKernel : public NoInputKernel {
 public:
  explicit BarrierKernel(OpKernelConstruction* c) : NoInputKernel(c, mlsl::OpType::kBarrier) {}
};

// Join has no tensor_name attr: every rank's join is the same rendezvous.
class JoinKernel : public AsyncOpKernel {
 public:
  explicit JoinKernel(OpKernelConstruction* c) : AsyncOpKernel(c) {}
  bool IsExpensive() override { return false; }
  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    std::shared_ptr<mlsl::Runtime> rt = mlsl::CurrentRuntime();
    OP_REQUIRES_ASYNC(ctx, rt != nullptr,
                      tensorflow::errors::FailedPrecondition(
                          "mlsl_tf has not been initialised: call mlsl_tf.init() before join()"),
                      done);
    auto r = std::make_unique<mlsl::Request>();
    r->name = "join";
    r->op = mlsl::OpType::kJoin;
    r->dtype = mlsl::DataType::kInt32;
    r->allocate_output = [ctx](int index, const mlsl::Shape&, void** data) {
      Tensor* out = nullptr;
      tensorflow::Status s = ctx->allocate_output(index, TensorShape({}), &out);
      if (!s.ok()) return mlsl::Status::Internal("could not allocate output: " + std::string(s.message()));
      *data = out->flat<int32_t>().data();
      return mlsl::Status::Ok();
    };
    r->done = [ctx, done](const mlsl::Status& s) {
      ctx->SetStatus(ToTf(s));
      done();
    };
    rt->Submit(std::move(r));
  }
};

}  // namespace

using tensorflow::DEVICE_CPU;
REGISTER_KERNEL_BUILDER(Name("MlslAllreduce").Device(DEVICE_CPU), SingleTensorKernel<mlsl::OpType::kAllreduce>);
REGISTER_KERNEL_BUILDER(Name("MlslGroupedAllreduce").Device(DEVICE_CPU), GroupedAllreduceKernel);
REGISTER_KERNEL_BUILDER(Name("MlslAllgather").Device(DEVICE_CPU), SingleTensorKernel<mlsl::OpType::kAllgather>);
REGISTER_KERNEL_BUILDER(Name("MlslBroadcast").Device(DEVICE_CPU), SingleTensorKernel<mlsl::OpType::kBroadcast>);
REGISTER_KERNEL_BUILDER(Name("MlslAlltoall").Device(DEVICE_CPU), AlltoallKernel);
REGISTER_KERNEL_BUILDER(Name("MlslReducescatter").Device(DEVICE_CPU), SingleTensorKernel<mlsl::OpType::kReducescatter>);
REGISTER_KERNEL_BUILDER(Name("MlslStartAllreduce").Device(DEVICE_CPU), StartAllreduceKernel);
REGISTER_KERNEL_BUILDER(Name("MlslTakeResult").Device(DEVICE_CPU), TakeResultKernel);
REGISTER_KERNEL_BUILDER(Name("MlslBarrier").Device(DEVICE_CPU), BarrierKernel);
REGISTER_KERNEL_BUILDER(Name("MlslJoin").Device(DEVICE_CPU), JoinKernel);

}  // namespace mlsl_tf
