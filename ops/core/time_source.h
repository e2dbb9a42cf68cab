// TimeSource: where the scheduler reads the time (queue waits, timeline spans, the pacer).
// The runtime leaves SchedulerOptions::clock null, meaning std::chrono::steady_clock; the
// simulator (sim_communicator.h, sim/) passes a virtual clock so that the same scheduling code
// runs on simulated time. No decision of the scheduler depends on the time except the pacer's
// poll interval.
#pragma once

#include <chrono>

namespace mlsl {

class TimeSource {
 public:
  virtual ~TimeSource() = default;
  virtual std::chrono::steady_clock::time_point Now() const = 0;
};

}  // namespace mlsl
