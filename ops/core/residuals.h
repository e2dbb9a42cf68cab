// Residuals: error feedback's memory -- by collective name, the input and output rounding
// residuals a compressed allreduce left, handed back to the same tensor's next allreduce. A
// tensor is sliced the same way every step, so its residuals return to the rank that made them.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace mlsl {

class Residuals {
 public:
  // Copies name's residuals of `count` elements into in/out; leaves them (zeros) when there are
  // none of that size.
  void Load(const std::string& name, int64_t count, float* in, float* out) const {
    auto it = kept_.find(name);
    if (it == kept_.end() || int64_t(it->second.first.size()) != count) return;
    std::copy(it->second.first.begin(), it->second.first.end(), in);
    std::copy(it->second.second.begin(), it->second.second.end(), out);
  }
  void Keep(const std::string& name, int64_t count, const float* in, const float* out) {
    auto& kept = kept_[name];
    kept.first.assign(in, in + count);
    kept.second.assign(out, out + count);
  }

 private:
  std::map<std::string, std::pair<std::vector<float>, std::vector<float>>> kept_;
};

}  // namespace mlsl
