// Pacer: how long the background thread may sleep between tests of the transfers in flight.
// Over shared memory MPI moves data only inside Test, so the thread must keep polling; over a
// network the kernel moves it, and polling only takes a core from the computation (measured on
// a 2-core machine, 2 ranks over 2 Gbit/s links: a full core per rank, 0.46 CPU-seconds per
// ResNet-50 step, for no more bandwidth). The pacer measures the bytes completed per second of
// busy time (transfers in flight); when that is below kNetworkBytesPerSecond it lets the
// thread sleep for 1/16 of the time the bytes in flight take at that rate, at most kMaxSleep
// (measured there: the same bandwidth for a third of the CPU). Until it has measured enough,
// or above the threshold, it says poll.
#pragma once

#include <chrono>
#include <cstdint>

namespace mlsl {

class Pacer {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr double kNetworkBytesPerSecond = 2e9;
  static constexpr std::chrono::microseconds kMaxSleep{200};
  static constexpr std::chrono::microseconds kWindow{20000};  // busy time per measurement

  // Called at every test of the transfers in flight: `busy` whether any were in flight.
  void Poll(Clock::time_point now, bool busy);
  // A transfer of `bytes` completed.
  void Completed(int64_t bytes) { window_bytes_ += bytes; }
  // The sleep between tests while `inflight_bytes` are in flight (zero: poll).
  std::chrono::microseconds Interval(int64_t inflight_bytes) const;
  // Measured bytes per second of busy time (0 until measured).
  double rate() const { return rate_; }

 private:
  bool was_busy_ = false;
  Clock::time_point last_{};
  Clock::duration window_busy_{0};
  int64_t window_bytes_ = 0;
  double rate_ = 0;
};

}  // namespace mlsl
