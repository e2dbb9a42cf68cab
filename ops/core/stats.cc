#include "stats.h"

#include <sstream>

namespace mlsl {

std::string Stats::Json() const {
  std::lock_guard<std::mutex> l(mu_);
  std::ostringstream os;
  os << "{\"submitted\": " << submitted_ << ", \"requests\": " << requests_ << ", \"bytes_sent\": " << bytes_ << ", \"chunks\": " << chunks_
     << ", \"in_place\": " << in_place_ << ", \"eager\": " << eager_ << ", \"preemptions\": " << preemptions_ << ", \"fused_buffers\": " << fused_buffers_
     << ", \"fused_tensors\": " << fused_tensors_ << ", \"names_known\": " << names_known_
     << ", \"names_forgotten\": " << names_forgotten_ << ", \"wait_by_priority\": {";
  bool first = true;
  for (const auto& [priority, w] : waits_) {
    os << (first ? "" : ", ") << "\"" << priority << "\": {\"count\": " << w.first << ", \"total_s\": " << w.second
       << ", \"mean_s\": " << (w.first ? w.second / w.first : 0.0) << "}";
    first = false;
  }
  os << "}, \"ways\": {";
  first = true;
  for (const auto& [way, n] : ways_) {
    os << (first ? "" : ", ") << "\"" << way << "\": " << n;
    first = false;
  }
  os << "}, \"autotune\": " << autotune_ << "}";
  return os.str();
}

}  // namespace mlsl
