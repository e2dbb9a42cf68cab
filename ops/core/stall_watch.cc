// StallWatch (stall_watch.h).
#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "stall_watch.h"
#include "logging.h"

namespace mlsl {
namespace {

struct Waiting {
  int group;
  long seconds;
  std::string name;
};

// Each rank's waiting list from the gathered "group<TAB>seconds<TAB>name" lines.
std::vector<std::vector<Waiting>> ParseWaiting(const std::string& all, const std::vector<int64_t>& sizes) {
  std::vector<std::vector<Waiting>> by_rank(sizes.size());
  int64_t offset = 0;
  for (size_t r = 0; r < sizes.size(); ++r) {
    std::string text = all.substr(offset, sizes[r]);
    offset += sizes[r];
    size_t pos = 0;
    while (pos < text.size()) {
      size_t end = text.find('\n', pos), t1 = text.find('\t', pos), t2 = text.find('\t', t1 + 1);
      if (end == std::string::npos || t1 > end || t2 > end) break;
      by_rank[r].push_back({std::atoi(text.substr(pos, t1 - pos).c_str()),
                            std::atol(text.substr(t1 + 1, t2 - t1 - 1).c_str()), text.substr(t2 + 1, end - t2 - 1)});
      pos = end + 1;
    }
  }
  return by_rank;
}

// What one rank waits for, at most `most` names.
std::string WaitsFor(const std::vector<Waiting>& list, size_t most) {
  std::string out;
  for (size_t i = 0; i < list.size() && i < most; ++i) {
    out += std::string(i ? ", " : "") + "'" + ShownName(list[i].name) + "' (" + std::to_string(list[i].seconds) + " s)";
  }
  if (list.size() > most) out += " and " + std::to_string(list.size() - most) + " more";
  return out.empty() ? std::string("nothing (it has not submitted them)") : out;
}

}  // namespace

void StallWatch::Flags(const PendingTable& pending, Clock::time_point now, bool* warn, bool* shut) const {
  if (warning_.count() == 0 && shutdown_.count() == 0) return;
  for (const auto& [name, p] : pending.table()) {
    if (p.state == PendingRequest::kScheduled) continue;  // agreed: moving, not waiting for ranks
    const auto waited = now - p.submitted;
    if (warning_.count() > 0 && waited >= warning_ && now - p.warned >= warning_) *warn = true;
    if (shutdown_.count() > 0 && waited >= shutdown_) *shut = true;
  }
}

std::string StallWatch::WaitingList(const PendingTable& pending, Clock::time_point now) const {
  std::string payload;
  for (const auto& [name, p] : pending.table()) {
    if (p.state == PendingRequest::kScheduled) continue;
    payload += std::to_string(p.meta.group) + "\t" +
               std::to_string(std::chrono::duration_cast<std::chrono::seconds>(now - p.submitted).count()) + "\t" +
               name + "\n";
  }
  return payload;
}

std::string StallWatch::Report(const StringGather& lists, bool shut, PendingTable* pending, const GroupSet& groups,
                               int rank, Clock::time_point now) const {
  const auto by_rank = ParseWaiting(lists.all(), lists.sizes());
  if (shut) {
    std::string what;
    for (size_t r = 0; r < by_rank.size(); ++r) what += "; rank " + std::to_string(r) + " waits for " + WaitsFor(by_rank[r], 4);
    return "mlsl_tf: collectives stalled for more than " + std::to_string(shutdown_.count()) +
           " s (MLSL_TF_STALL_SHUTDOWN_SECONDS), so every pending one fails" + what;
  }
  for (auto& [name, p] : pending->table()) {
    if (p.state == PendingRequest::kScheduled || now - p.submitted < warning_ || now - p.warned < warning_) continue;
    p.warned = now;
    const int group = p.meta.group;
    std::vector<int> members;
    if (group >= 0 && group < groups.count()) members = groups[group].ranks;
    std::vector<int> missing;
    std::string elsewhere;
    for (int r : members) {
      bool has = false;
      for (const Waiting& w : by_rank[r]) has = has || (w.group == group && w.name == name);
      if (has) continue;
      missing.push_back(r);
      if (!by_rank[r].empty()) elsewhere += "; rank " + std::to_string(r) + " waits for " + WaitsFor(by_rank[r], 3);
    }
    Log(LogLevel::kWarning,
        std::string(OpTypeName(p.meta.op)) + " '" + ShownName(name) + "' has waited " +
            std::to_string(std::chrono::duration_cast<std::chrono::seconds>(now - p.submitted).count()) +
            " s on rank " + std::to_string(rank) + (missing.empty() ? std::string(" to be agreed")
                                                     : " for rank(s) " + RankList(missing) + " to submit it") +
            elsewhere + " (MLSL_TF_STALL_WARNING_SECONDS=" + std::to_string(warning_.count()) + ")");
  }
  return "";
}

}  // namespace mlsl
