#include "timeline.h"

namespace mlsl {

std::string JsonEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') { out += '\\'; out += c; }
    else if (static_cast<unsigned char>(c) < 0x20) { char b[8]; std::snprintf(b, sizeof b, "\\u%04x", c); out += b; }
    else out += c;
  }
  return out;
}

Timeline::Timeline(const std::string& path, int rank) : rank_(rank), origin_(Clock::now()) {
  if (path.empty()) return;
  std::string p = path;
  size_t at = p.find("{rank}");
  if (at != std::string::npos) {
    p.replace(at, 6, std::to_string(rank));
  } else if (rank != 0) {
    return;  // like Horovod: one timeline, written by rank 0
  }
  file_ = std::fopen(p.c_str(), "w");
  if (!file_) return;
  std::fputs("[\n", file_);
  Write("{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": " + std::to_string(rank_) +
        ", \"args\": {\"name\": \"mlsl_tf rank " + std::to_string(rank_) + "\"}}");
}

Timeline::~Timeline() {
  if (!file_) return;
  for (int i = 0; i < num_lanes_; ++i) {
    Write("{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": " + std::to_string(rank_) + ", \"tid\": " +
          std::to_string(i) + ", \"args\": {\"name\": \"" + JsonEscape(lanes_[i]) + "\"}}");
  }
  std::fputs("{\"name\": \"end\", \"ph\": \"i\", \"s\": \"g\", \"pid\": 0, \"ts\": 0}\n]\n", file_);
  std::fclose(file_);
}

int Timeline::LaneId(const std::string& lane) {
  for (int i = 0; i < num_lanes_; ++i) if (lanes_[i] == lane) return i;
  if (num_lanes_ == 32) return 31;
  lanes_[num_lanes_] = lane;
  return num_lanes_++;
}

int64_t Timeline::Micros(Clock::time_point t) const {
  return std::chrono::duration_cast<std::chrono::microseconds>(t - origin_).count();
}

void Timeline::Write(const std::string& event) {
  std::fputs(event.c_str(), file_);
  std::fputs(",\n", file_);
}

void Timeline::Span(const std::string& name, const char* category, const std::string& lane, Clock::time_point start,
                    Clock::time_point end, const std::string& args_json) {
  if (!file_) return;
  int64_t ts = Micros(start), dur = Micros(end) - ts;
  Write("{\"name\": \"" + JsonEscape(name) + "\", \"cat\": \"" + category + "\", \"ph\": \"X\", \"pid\": " +
        std::to_string(rank_) + ", \"tid\": " + std::to_string(LaneId(lane)) + ", \"ts\": " + std::to_string(ts) +
        ", \"dur\": " + std::to_string(dur < 0 ? 0 : dur) + (args_json.empty() ? "" : ", \"args\": " + args_json) +
        "}");
}

void Timeline::Instant(const std::string& name, const char* category, const std::string& lane, Clock::time_point at,
                       const std::string& args_json) {
  if (!file_) return;
  Write("{\"name\": \"" + JsonEscape(name) + "\", \"cat\": \"" + category + "\", \"ph\": \"i\", \"s\": \"t\", "
        "\"pid\": " + std::to_string(rank_) + ", \"tid\": " + std::to_string(LaneId(lane)) + ", \"ts\": " +
        std::to_string(Micros(at)) + (args_json.empty() ? "" : ", \"args\": " + args_json) + "}");
}

}  // namespace mlsl
