#include "logging.h"

#include <atomic>
#include <cstdio>

#include "settings.h"

namespace mlsl {
namespace {
thread_local int t_rank = -1;  // set by each runtime's background thread

LogLevel Threshold() {
  static const LogLevel level = [] {
    std::string v = SettingString("MLSL_TF_LOG_LEVEL");
    if (v == "debug") return LogLevel::kDebug;  // lower case; checked at init
    if (v == "info") return LogLevel::kInfo;
    if (v == "error") return LogLevel::kError;
    return LogLevel::kWarning;
  }();
  return level;
}
}  // namespace

void SetLogRank(int rank) { t_rank = rank; }
bool LogEnabled(LogLevel level) { return level >= Threshold(); }

void Log(LogLevel level, const std::string& message) {
  if (!LogEnabled(level)) return;
  static const char* names[] = {"DEBUG", "INFO", "WARNING", "ERROR"};
  std::fprintf(stderr, "[mlsl_tf %s rank %d] %s\n", names[int(level)], t_rank, message.c_str());
}

}  // namespace mlsl
