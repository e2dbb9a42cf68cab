// Runs one Algorithm's pieces (algorithm.h) on a communicator without a Scheduler, for tests of
// an algorithm alone: up to `window` pieces in flight, completions reported newest first (pieces
// on different communicators complete in any order), and after a *sync piece every piece in
// flight completes before the next starts.
#pragma once

#include <memory>
#include <thread>
#include <vector>

#include "../algorithm.h"

namespace mlsl_test {

inline mlsl::Status RunPieces(mlsl::Algorithm* a, mlsl::Communicator* comm, int window = 1) {
  struct Flying {
    int index;
    std::unique_ptr<mlsl::PendingOp> op;
  };
  std::vector<Flying> flying;
  mlsl::Status status;
  auto settle = [&](size_t at_most) {
    while (flying.size() > at_most) {
      for (size_t k = flying.size(); k-- > 0;) {
        bool done = false;
        mlsl::Status s = flying[k].op->Test(&done);
        if (!s.ok() && status.ok()) status = s;
        if (!done && s.ok()) continue;
        if (s.ok()) a->PieceDone(flying[k].index);
        flying.erase(flying.begin() + k);
      }
      std::this_thread::yield();
    }
  };
  for (int index = 0; !a->started_all(); ++index) {
    std::unique_ptr<mlsl::PendingOp> op;
    bool sync = false;
    int64_t bytes = 0;
    mlsl::Status s = a->Next(comm, &op, &sync, &bytes);
    if (!s.ok() && status.ok()) status = s;
    if (op) flying.push_back({index, std::move(op)});
    settle(sync ? 0 : size_t(window > 0 ? window - 1 : 0));
  }
  settle(0);
  mlsl::Status finished = a->Finish();
  return status.ok() ? finished : status;
}

}  // namespace mlsl_test
