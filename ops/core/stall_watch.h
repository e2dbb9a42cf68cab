// StallWatch: requests that wait too long for their peers -- which of this rank's are due for a
// warning or past the shutdown limit, this rank's waiting list for the stall report, and from
// every rank's lists the warnings (naming the ranks that have not submitted a request) or the
// reason every rank closes. Owns no state but its limits; a request's last warning time lives
// with the request.
#pragma once

#include <chrono>
#include <string>

#include "group_set.h"
#include "pending.h"
#include "string_gather.h"

namespace mlsl {

class StallWatch {
 public:
  using Clock = std::chrono::steady_clock;
  // 0 s: never.
  StallWatch(std::chrono::seconds warning, std::chrono::seconds shutdown) : warning_(warning), shutdown_(shutdown) {}

  // Whether some request waiting here is due a warning (*warn) or past the limit (*shut).
  void Flags(const PendingTable& pending, Clock::time_point now, bool* warn, bool* shut) const;
  // This rank's waiting list: "group<TAB>seconds<TAB>name" lines.
  std::string WaitingList(const PendingTable& pending, Clock::time_point now) const;
  // From every rank's gathered lists: past the limit (`shut`), the reason every rank closes;
  // otherwise logs the warnings due about this rank's requests and returns "".
  std::string Report(const StringGather& lists, bool shut, PendingTable* pending, const GroupSet& groups,
                     int rank, Clock::time_point now) const;

 private:
  const std::chrono::seconds warning_, shutdown_;
};

}  // namespace mlsl
