// Executor: runs the agreed collectives that are not yet cut in pieces -- an Adasum allreduce
// and a compressed (bf16 wire) reducescatter -- to completion, blocking. Every rank calls Execute
// for the same ids in the same order; other allreduces go through the Scheduler's chunks, the
// other collectives through its pieces (algorithm.h). A rank that has joined (Horovod's join) has no request of its
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
  Status Reducescatter(const RequestMeta& m, Request* r);
  // Adasum allreduce (adasum_executor.cc): each tensor of the request combined on its own.
  Status Adasum(const RequestMeta& m, Request* r);

  Communicator* comm_;
  std::vector<char> staging_;  // reducescatter's prescaled copy of the input, reused across calls
  std::vector<char> scratch_;  // a joined rank's stand-in buffers
};

}  // namespace mlsl
