#include "settings.h"

#include <cstdio>
#include <cstdlib>

namespace mlsl {

const std::vector<SettingInfo>& AllSettings() {
  static const std::vector<SettingInfo> table = {
      {"MLSL_TF_HEARTBEAT_MS", "10",
       "longest an idle background thread sleeps between cycles (bounds how fast a peer's shutdown is seen)"},
      {"MLSL_TF_SPIN_US", "200",
       "after finishing work the background thread polls this long for the next request before sleeping"},
      {"MLSL_TF_STALL_WARNING_SECONDS", "60",
       "warn when a collective has been submitted by some ranks but not others for this long (0 = never)"},
      {"MLSL_TF_CHUNK_BYTES", "1048576",
       "allreduces larger than this are cut into chunks of this many bytes; the scheduler re-picks between chunks"},
      {"MLSL_TF_INFLIGHT", "4", "chunks (or whole collectives) in flight at once"},
      {"MLSL_TF_FUSION_THRESHOLD", "1048576",
       "small allreduces of the same kind are fused into one buffer of up to this many bytes (0 = no fusion)"},
      {"MLSL_TF_PRIORITY", "priority",
       "'priority': most urgent (lowest priority number) first; 'fifo': first agreed, first served"},
      {"MLSL_TF_WIRE_DTYPE", "float32",
       "wire type of float32 allreduces/reducescatters without an explicit compression: float32, bfloat16 or float16"},
      {"MLSL_TF_COMM_CORE", "",
       "pin the background thread to this core; a list 'a,b' gives local rank i the (i mod n)-th core"},
      {"MLSL_TF_TIMELINE", "",
       "write a Chrome-trace timeline to this path (rank 0; '{rank}' in the path: every rank)"},
      {"MLSL_TF_INTER_OP_THREADS", "auto",
       "TensorFlow inter-op threads per rank that init() sets: 'auto' (2), a number, or 'tf' for TensorFlow's "
       "default (one per core of the machine, too many with several ranks per machine)"},
      {"MLSL_TF_CROSS_ITERATION", "1",
       "1: DistributedOptimizer / DistributedGradientTape apply each variable's update just before its next "
       "access (the next forward pass), so reductions overlap the next step; 0: apply inside the step"},
      {"MLSL_TF_LOG_LEVEL", "warning", "core log level: debug, info, warning or error"},
      {"MLSL_TF_START_TIMEOUT", "",
       "seconds mlslrun waits for every rank to start (set by mlslrun --start-timeout; informational for ranks)"},
  };
  return table;
}

static const SettingInfo& Find(const std::string& name) {
  for (const SettingInfo& s : AllSettings()) {
    if (name == s.name) return s;
  }
  std::fprintf(stderr, "mlsl_tf: internal error: undeclared setting %s\n", name.c_str());
  std::abort();
}

std::string SettingString(const std::string& name) {
  const SettingInfo& info = Find(name);
  const char* env = std::getenv(info.name);
  return env && *env ? env : info.default_value;
}

int64_t SettingInt(const std::string& name) { return std::strtoll(SettingString(name).c_str(), nullptr, 10); }
double SettingDouble(const std::string& name) { return std::strtod(SettingString(name).c_str(), nullptr); }

}  // namespace mlsl
