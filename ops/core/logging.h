// Minimal leveled logging to stderr, prefixed with the rank.
#pragma once

#include <string>

namespace mlsl {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// The rank this thread's log lines name (each runtime's background thread sets its own).
void SetLogRank(int rank);
bool LogEnabled(LogLevel level);
void Log(LogLevel level, const std::string& message);

}  // namespace mlsl
