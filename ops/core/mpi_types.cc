// mpi_types.h: MPI's names for the core's data types and reductions.
#include "mpi_types.h"

#include <atomic>
#include <mutex>

#include "reduce.h"

namespace mlsl {

std::string MpiError(const char* what, int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  return std::string("MPI ") + what + " failed: " + std::string(text, len);
}

MPI_Datatype NativeType(DataType t) {
  switch (t) {
    case DataType::kUint8: return MPI_UINT8_T;
    case DataType::kInt8: return MPI_INT8_T;
    case DataType::kInt32: return MPI_INT32_T;
    case DataType::kInt64: return MPI_INT64_T;
    case DataType::kFloat32: return MPI_FLOAT;
    case DataType::kFloat64: return MPI_DOUBLE;
    case DataType::kFloat16: case DataType::kBfloat16: return MPI_UINT16_T;
    case DataType::kBool: return MPI_UINT8_T;
    case DataType::kUint16: return MPI_UINT16_T;
    case DataType::kInt16: return MPI_INT16_T;
  }
  return MPI_BYTE;
}

// Reductions on one host are user-defined MPI operations that forward to the core's kernels:
// MPI cannot reduce float16, bfloat16 or bool, and MPICH's built-in float sums are scalar loops
// (most of a large shared-memory allreduce's time) where the core's kernels are vectorised.
// Across hosts the built-in operation is used wherever MPI has one: MPICH's MPI_Iallreduce
// picks recursive doubling for every operation that is not built in, which sends log2(p)
// times the message per rank instead of reduce-scatter + allgather's 2(p-1)/p (measured with
// mpi4py, 16 MiB, 4 ranks on one 1 Gbit/s link: 1.08 s user-defined vs 0.81 s built in), and
// on a network the bytes, not the sum loop, are the cost.
// AllreduceWords's words travel as one element of a contiguous type (WordsType), so MPI hands
// the operation the whole message and never a piece of it (e.g. the control message's eager
// region is not element-wise). An MPI_Op callback gets no user pointer, so each combine function
// gets a slot of its own: a callback instantiated per slot calls the function stored there, and
// the slot's MPI_Op is created once, on the function's first use.
namespace {
std::atomic<CombineFn> g_words_fns[kWordsSlots];

template <int I>
void WordsOp(void* in, void* inout, int* len, MPI_Datatype* type) {
  int bytes = 0;
  MPI_Type_size(*type, &bytes);
  g_words_fns[I].load()(static_cast<const uint64_t*>(in), static_cast<uint64_t*>(inout), int64_t(*len) * bytes / 8);
}

}  // namespace

MPI_Op WordsOpFor(CombineFn fn) {
  static std::mutex mu;
  static MPI_Op ops[kWordsSlots] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL,
                                    MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
  static MPI_User_function* const callbacks[kWordsSlots] = {&WordsOp<0>, &WordsOp<1>, &WordsOp<2>, &WordsOp<3>,
                                                            &WordsOp<4>, &WordsOp<5>, &WordsOp<6>, &WordsOp<7>};
  std::lock_guard<std::mutex> lock(mu);
  for (int i = 0; i < kWordsSlots; ++i) {
    if (ops[i] != MPI_OP_NULL && g_words_fns[i].load() == fn) return ops[i];
    if (ops[i] == MPI_OP_NULL) {
      g_words_fns[i].store(fn);
      MPI_Op_create(callbacks[i], 1, &ops[i]);
      return ops[i];
    }
  }
  return MPI_OP_NULL;
}

namespace {

template <DataType D, ReduceOp O>
void UserReduce(void* in, void* inout, int* len, MPI_Datatype*) {
  ReduceInto(inout, in, *len, D, O);
}

}  // namespace

template <DataType D> void UserOps::Make() {
  MPI_Op_create(&UserReduce<D, ReduceOp::kSum>, 1, &ops[int(D)][int(ReduceOp::kSum)]);
  ops[int(D)][int(ReduceOp::kAverage)] = ops[int(D)][int(ReduceOp::kSum)];
  MPI_Op_create(&UserReduce<D, ReduceOp::kMin>, 1, &ops[int(D)][int(ReduceOp::kMin)]);
  MPI_Op_create(&UserReduce<D, ReduceOp::kMax>, 1, &ops[int(D)][int(ReduceOp::kMax)]);
  MPI_Op_create(&UserReduce<D, ReduceOp::kProduct>, 1, &ops[int(D)][int(ReduceOp::kProduct)]);
}

UserOps::UserOps() {
  for (auto& row : ops) for (auto& op : row) op = MPI_OP_NULL;
  Make<DataType::kUint8>();
  Make<DataType::kInt8>();
  Make<DataType::kInt32>();
  Make<DataType::kInt64>();
  Make<DataType::kFloat16>();
  Make<DataType::kBfloat16>();
  Make<DataType::kFloat32>();
  Make<DataType::kFloat64>();
  Make<DataType::kBool>();
  Make<DataType::kUint16>();
  Make<DataType::kInt16>();
}

// Every rank must hold the same bits. MPI_MIN / MPI_MAX on floats keep or drop a NaN by operand
// order (and ranks combine in different orders), so floats use the core's kernels for them;
// MPI_SUM / MPI_PROD differ only in which NaN payload survives, which the caller canonicalizes.
MPI_Op BuiltinOp(DataType t, ReduceOp op) {
  switch (t) {
    case DataType::kFloat16: case DataType::kBfloat16: case DataType::kBool: return MPI_OP_NULL;
    case DataType::kFloat32: case DataType::kFloat64:
      if (op == ReduceOp::kMin || op == ReduceOp::kMax) return MPI_OP_NULL;
      break;
    default: break;
  }
  switch (op) {
    case ReduceOp::kSum: case ReduceOp::kAverage: return MPI_SUM;
    case ReduceOp::kMin: return MPI_MIN;
    case ReduceOp::kMax: return MPI_MAX;
    case ReduceOp::kProduct: return MPI_PROD;
    default: return MPI_OP_NULL;
  }
}

// `builtin`: prefer MPI's own operation where it has one (groups that span several hosts).
MPI_Op OpFor(const UserOps& user, DataType t, ReduceOp op, bool builtin) {
  const MPI_Op b = builtin ? BuiltinOp(t, op) : MPI_OP_NULL;
  return b != MPI_OP_NULL ? b : user.ops[int(t)][int(op)];
}

}  // namespace mlsl
