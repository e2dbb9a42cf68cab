// FailureNote: this rank's first failed transfer or output allocation -- a failure that is this
// rank's alone, so its peers would wait for it forever -- and, from every rank's notes gathered,
// the reason every engine closes with (engine.h, step 2b).
#pragma once

#include <string>

#include "group_set.h"
#include "string_gather.h"

namespace mlsl {

class FailureNote {
 public:
  bool empty() const { return line_.empty(); }
  const std::string& line() const { return line_; }
  // Keeps `line` unless a failure was noted before.
  void Set(std::string line) { if (line_.empty()) line_ = std::move(line); }
  // Notes the first failed transfer of this rank's groups, if any and none was noted.
  void Note(const GroupSet& groups) { if (line_.empty()) line_ = groups.FirstFailure(); }
  // The reason for closing, from every rank's gathered line.
  static std::string Reason(const StringGather& lines);

 private:
  std::string line_;
};

}  // namespace mlsl
