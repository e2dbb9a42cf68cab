// Executor: runs one agreed non-chunked collective (allgather, broadcast, alltoall,
// reducescatter, barrier, Adasum allreduce) to completion. Every rank calls Execute for the same
// ids in the same order; other allreduces go through the Scheduler's chunks instead. A rank that has joined (Horovod's join) has no request of its
// own: it passes request == nullptr and contributes the op's identity, or no rows.
#pragma once

#include <vector>

#include "communicator.h"
#include "meta.h"
#include "request.h"

namespace mlsl {

class Executor {
 public:
  explicit Executor(Communicator* comm) : comm_(comm) {}
  // `joined` is the common knowledge of which ranks are in join. Returns the request's Status.
  Status Execute(const RequestMeta& meta, Request* request, const std::vector<bool>& joined);

 private:
  Status Allgather(const RequestMeta& m, Request* r);
  Status Broadcast(const RequestMeta& m, Request* r, const std::vector<bool>& joined);
  Status Alltoall(const RequestMeta& m, Request* r);
  Status Reducescatter(const RequestMeta& m, Request* r);
  // Adasum allreduce (adasum_executor.cc): each tensor of the request combined on its own.
  Status Adasum(const RequestMeta& m, Request* r);
  // Allgathers one int64 per rank.
  Status GatherCounts(int64_t mine, std::vector<int64_t>* all);

  Communicator* comm_;
  std::vector<char> staging_;  // reducescatter's prescaled copy of the input, reused across calls
  std::vector<char> scratch_;  // a joined rank's stand-in buffers
};

}  // namespace mlsl
