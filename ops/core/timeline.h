// Timeline: a Chrome-trace JSON file (chrome://tracing, Perfetto) of what the background
// thread did: each tensor's negotiation and queueing, every chunk with its bytes, preemptions
// and completion. Written only by the background thread; disabled when no path is given.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace mlsl {

class Timeline {
 public:
  using Clock = std::chrono::steady_clock;
  // `path` empty = disabled. "{rank}" in the path is replaced by the rank.
  Timeline(const std::string& path, int rank);
  ~Timeline();
  bool enabled() const { return file_ != nullptr; }

  // A span on lane `lane` ("negotiation", "queue", "chunk 0", ...).
  void Span(const std::string& name, const char* category, const std::string& lane, Clock::time_point start,
            Clock::time_point end, const std::string& args_json = "");
  void Instant(const std::string& name, const char* category, const std::string& lane, Clock::time_point at,
               const std::string& args_json = "");

 private:
  int LaneId(const std::string& lane);
  int64_t Micros(Clock::time_point t) const;
  void Write(const std::string& event);

  std::FILE* file_ = nullptr;
  int rank_;
  Clock::time_point origin_;
  std::string lanes_[32];
  int num_lanes_ = 0;
};

// Escapes a string for a JSON string literal.
std::string JsonEscape(const std::string& s);

}  // namespace mlsl
