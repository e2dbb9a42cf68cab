// Engine's stall handling: which pending requests are due for a warning or past the stall
// shutdown limit, and the report every rank builds from everyone's waiting lists.
#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "engine.h"
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

void Engine::StallFlags(bool* warn, bool* shut) const {
  const auto warning = options_.stall_warning, shutdown = options_.stall_shutdown;
  if (warning.count() == 0 && shutdown.count() == 0) return;
  for (const auto& [name, l] : pending_) {
    if (l.state == Local::kScheduled) continue;  // agreed: moving, not waiting for ranks
    const auto waited = now_ - l.submitted;
    if (warning.count() > 0 && waited >= warning && now_ - l.warned >= warning) *warn = true;
    if (shutdown.count() > 0 && waited >= shutdown) *shut = true;
  }
}

void Engine::StartStallReport() {
  // One line per waiting request: "group<TAB>seconds<TAB>name".
  std::string payload;
  for (const auto& [name, l] : pending_) {
    if (l.state == Local::kScheduled) continue;
    payload += std::to_string(l.meta.group) + "\t" +
               std::to_string(std::chrono::duration_cast<std::chrono::seconds>(now_ - l.submitted).count()) + "\t" +
               name + "\n";
  }
  gather_.Start(comm_.get(), std::move(payload));
}

void Engine::ReportStalls(bool shut) {
  const auto by_rank = ParseWaiting(gather_.all(), gather_.sizes());
  if (shut) {
    std::string what;
    for (int r = 0; r < size_; ++r) what += "; rank " + std::to_string(r) + " waits for " + WaitsFor(by_rank[r], 4);
    Close("mlsl_tf: collectives stalled for more than " + std::to_string(options_.stall_shutdown.count()) +
          " s (MLSL_TF_STALL_SHUTDOWN_SECONDS), so every pending one fails" + what);
    return;
  }
  const auto warning = options_.stall_warning;
  for (auto& [name, l] : pending_) {
    if (l.state == Local::kScheduled || now_ - l.submitted < warning || now_ - l.warned < warning) continue;
    l.warned = now_;
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
      if (!by_rank[r].empty()) elsewhere += "; rank " + std::to_string(r) + " waits for " + WaitsFor(by_rank[r], 3);
    }
    Log(LogLevel::kWarning,
        std::string(OpTypeName(l.meta.op)) + " '" + ShownName(name) + "' has waited " +
            std::to_string(std::chrono::duration_cast<std::chrono::seconds>(now_ - l.submitted).count()) +
            " s on rank " + std::to_string(rank_) + (missing.empty() ? std::string(" to be agreed")
                                                      : " for rank(s) " + RankList(missing) + " to submit it") +
            elsewhere + " (MLSL_TF_STALL_WARNING_SECONDS=" + std::to_string(warning.count()) + ")");
  }
}

}  // namespace mlsl
