#include "pacer.h"

#include <algorithm>

namespace mlsl {

void Pacer::Poll(Clock::time_point now, bool busy) {
  if (was_busy_) window_busy_ += now - last_;
  last_ = now;
  was_busy_ = busy;
  if (window_busy_ < kWindow) return;
  const double seconds = std::chrono::duration<double>(window_busy_).count();
  const double measured = window_bytes_ / seconds;
  rate_ = rate_ == 0 ? measured : 0.5 * rate_ + 0.5 * measured;
  window_busy_ = Clock::duration(0);
  window_bytes_ = 0;
}

std::chrono::microseconds Pacer::Interval(int64_t inflight_bytes) const {
  if (rate_ <= 0 || rate_ >= kNetworkBytesPerSecond || inflight_bytes <= 0) return std::chrono::microseconds(0);
  const double sleep_us = inflight_bytes / rate_ * 1e6 / 16;
  return std::chrono::microseconds(int64_t(std::min<double>(sleep_us, double(kMaxSleep.count()))));
}

}  // namespace mlsl
