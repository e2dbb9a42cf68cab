// Pacer: poll over fast transports, sleep a fraction of the transfer time over slow ones.
#include "../pacer.h"
#include "check.h"

using namespace mlsl;
using Clock = Pacer::Clock;
using std::chrono::microseconds;

// Feeds `ms` milliseconds of busy polling every 100 us, completing bytes at `bytes_per_s`.
static void Run(Pacer& p, Clock::time_point& t, double bytes_per_s, int ms) {
  for (int i = 0; i < ms * 10; ++i) {
    p.Poll(t, true);
    p.Completed(int64_t(bytes_per_s * 100e-6));
    t += microseconds(100);
  }
  p.Poll(t, true);
}

TEST(pacer_polls_until_measured_and_over_fast_links) {
  Pacer p;
  Clock::time_point t{};
  CHECK_EQ(p.Interval(4 << 20).count(), 0);  // nothing measured yet
  Run(p, t, 3e9, 50);                        // shared memory: 3 GB/s
  CHECK(p.rate() > 2.5e9);
  CHECK_EQ(p.Interval(4 << 20).count(), 0);
}

TEST(pacer_sleeps_a_sixteenth_over_slow_links_capped) {
  Pacer p;
  Clock::time_point t{};
  Run(p, t, 1.25e9, 50);  // 10 Gbit/s
  CHECK(p.rate() > 1.2e9 && p.rate() < 1.3e9);
  // 1 MiB at 1.25 GB/s is 839 us; a sixteenth is 52 us.
  CHECK(p.Interval(1 << 20).count() >= 50 && p.Interval(1 << 20).count() <= 54);
  Run(p, t, 0.25e9, 100);  // 2 Gbit/s: 4 MiB take 16.8 ms, capped
  CHECK_EQ(p.Interval(4 << 20).count(), int64_t(Pacer::kMaxSleep.count()));
  CHECK_EQ(p.Interval(0).count(), 0);
}

TEST(pacer_counts_only_busy_time) {
  Pacer p;
  Clock::time_point t{};
  // Long idle gaps between bursts must not dilute the rate.
  for (int burst = 0; burst < 10; ++burst) {
    Run(p, t, 3e9, 5);
    p.Poll(t, false);
    t += std::chrono::milliseconds(100);
    p.Poll(t, false);
  }
  CHECK(p.rate() > 2.5e9);
}
