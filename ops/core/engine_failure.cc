// Engine: a transfer or an output allocation that failed on one rank -- noted in this rank's
// control message, every rank's failure line gathered, and every engine closed naming them
// (engine.h, step 2b).
#include <string>

#include "engine.h"

namespace mlsl {

void Engine::NoteFailure() {
  if (!failure_.empty()) return;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const Group& group = *groups_[g];
    if (!group.member() || group.scheduler->failure().ok()) continue;
    failure_ = "rank " + std::to_string(rank_) + (g ? " (group " + std::to_string(g) + ")" : std::string()) + ": " +
               group.scheduler->failure().message();
    return;
  }
}

void Engine::StartFailureReport() {
  // On the control communicator: the data communicators may hold the broken transfers.
  Communicator* control = control_comm_ ? control_comm_.get() : comm_.get();
  gather_.Start(control, failure_);
}

void Engine::CloseOnFailures() {
  std::string lines;
  int64_t offset = 0;
  for (int64_t bytes : gather_.sizes()) {
    if (bytes > 0) lines += (lines.empty() ? "" : "; ") + gather_.all().substr(size_t(offset), size_t(bytes));
    offset += bytes;
  }
  // The failing rank's peers go on waiting for messages it will never send: the collectives of
  // every rank fail, the peers' as caused by another rank.
  Close("mlsl_tf: a collective failed on one rank (a transfer, or an output it could not allocate), so the ranks' "
        "messages are out of step and no collective can complete: " + lines,
        failure_.empty() ? StatusCode::kUnavailable : StatusCode::kAborted);
}

}  // namespace mlsl
