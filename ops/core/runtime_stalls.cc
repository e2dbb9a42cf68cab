// Runtime's stall handling: which pending requests are due for a warning or past the stall
// shutdown limit, and the report every rank builds from everyone's waiting lists.
#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "logging.h"
#include "runtime.h"

namespace mlsl {

void Runtime::StallFlags(bool* warn, bool* shut) const {
  if (stall_warning_.count() == 0 && stall_shutdown_.count() == 0) return;
  const auto now = std::chrono::steady_clock::now();
  for (const auto& [name, l] : pending_) {
    if (l.state == Local::kScheduled) continue;  // agreed: moving, not waiting for ranks
    const auto waited = now - l.submitted;
    if (stall_warning_.count() > 0 && waited >= stall_warning_ && now - l.warned >= stall_warning_) *warn = true;
    if (stall_shutdown_.count() > 0 && waited >= stall_shutdown_) *shut = true;
  }
}

bool Runtime::ReportStalls(bool shut) {
  // One line per waiting request: "group<TAB>seconds<TAB>name".
  const auto now = std::chrono::steady_clock::now();
  std::string payload;
  for (const auto& [name, l] : pending_) {
    if (l.state == Local::kScheduled) continue;
    payload += std::to_string(l.meta.group) + "\t" +
               std::to_string(std::chrono::duration_cast<std::chrono::seconds>(now - l.submitted).count()) + "\t" +
               name + "\n";
  }
  std::vector<int64_t> sizes;
  std::string all;
  Status s = AllgatherStrings(comm_.get(), payload, &sizes, &all);
  if (!s.ok()) {
    Close("mlsl_tf: the stall report failed: " + s.message());
    return false;
  }
  struct Waiting {
    int group;
    long seconds;
    std::string name;
  };
  std::vector<std::vector<Waiting>> by_rank(size_);
  int64_t offset = 0;
  for (int r = 0; r < size_; ++r) {
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
  auto waits_for = [&](int r, size_t most) {
    std::string out;
    for (size_t i = 0; i < by_rank[r].size() && i < most; ++i) {
      out += std::string(i ? ", " : "") + "'" + ShownName(by_rank[r][i].name) + "' (" +
             std::to_string(by_rank[r][i].seconds) + " s)";
    }
    if (by_rank[r].size() > most) out += " and " + std::to_string(by_rank[r].size() - most) + " more";
    return out.empty() ? std::string("nothing (it has not submitted them)") : out;
  };
  if (shut) {
    std::string what;
    for (int r = 0; r < size_; ++r) what += "; rank " + std::to_string(r) + " waits for " + waits_for(r, 4);
    Close("mlsl_tf: collectives stalled for more than " + std::to_string(stall_shutdown_.count()) +
          " s (MLSL_TF_STALL_SHUTDOWN_SECONDS), so every pending one fails" + what);
    return false;
  }
  for (auto& [name, l] : pending_) {
    if (l.state == Local::kScheduled || now - l.submitted < stall_warning_ || now - l.warned < stall_warning_) continue;
    l.warned = now;
    const int group = l.meta.group;
    std::vector<int> members;
    if (group >= 0 && group < int(groups_.size())) members = groups_[group]->ranks;
    std::vector<int> missing;
    std::string elsewhere;
    for (int r : members) {
      bool has = false;
      for (const Waiting& w : by_rank[r]) has = has || (w.group == group && w.name == name);
      if (has) continue;
      missing.push_back(r);
      if (!by_rank[r].empty()) elsewhere += "; rank " + std::to_string(r) + " waits for " + waits_for(r, 3);
    }
    Log(LogLevel::kWarning,
        std::string(OpTypeName(l.meta.op)) + " '" + ShownName(name) + "' has waited " +
            std::to_string(std::chrono::duration_cast<std::chrono::seconds>(now - l.submitted).count()) +
            " s on rank " + std::to_string(rank_) + (missing.empty() ? std::string(" to be agreed")
                                                      : " for rank(s) " + RankList(missing) + " to submit it") +
            elsewhere + " (MLSL_TF_STALL_WARNING_SECONDS=" + std::to_string(stall_warning_.count()) + ")");
  }
  return true;
}

}  // namespace mlsl
