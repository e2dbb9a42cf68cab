// MPI's names for the core's data types and reductions: the MPI datatype of a DataType, the
// MPI_Op that reduces it (the core's kernels as user-defined operations, or MPI's own across
// hosts), the operation that combines AllreduceWords' words by a CombineFn, and MPI's error text.
// Only the MPI transport includes it.
#pragma once

#include <mpi.h>

#include <string>

#include "communicator.h"
#include "types.h"

namespace mlsl {

std::string MpiError(const char* what, int code);
MPI_Datatype NativeType(DataType t);

// Words of AllreduceWords combine in one of this many MPI_Op slots, one per CombineFn.
constexpr int kWordsSlots = 8;
// The MPI_Op that combines by `fn`; MPI_OP_NULL when every slot holds another function.
MPI_Op WordsOpFor(CombineFn fn);

// The core's reduction kernels as MPI operations, by dtype and ReduceOp (kAverage is kSum's).
struct UserOps {
  MPI_Op ops[kNumDataTypes][6];
  UserOps();
  template <DataType D> void Make();
};

// MPI's own operation for t and op where every rank gets the same bits from it; MPI_OP_NULL otherwise.
MPI_Op BuiltinOp(DataType t, ReduceOp op);
// `builtin`: prefer MPI's own operation where it has one (groups that span several hosts).
MPI_Op OpFor(const UserOps& user, DataType t, ReduceOp op, bool builtin = false);

}  // namespace mlsl
