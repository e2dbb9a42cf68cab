#include "communicator.h"

#include <chrono>
#include <thread>

namespace mlsl {

Status Wait(PendingOp* op) {
  using Clock = std::chrono::steady_clock;
  auto start = Clock::now();
  for (int spins = 0;; ++spins) {
    bool done = false;
    Status s = op->Test(&done);
    if (!s.ok() || done) return s;
    if (spins < 64) continue;
    auto waited = Clock::now() - start;
    if (waited < std::chrono::microseconds(200)) {
      std::this_thread::yield();
    } else if (waited < std::chrono::milliseconds(5)) {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
}

}  // namespace mlsl
