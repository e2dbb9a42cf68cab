#include "settings.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iterator>

namespace mlsl {

namespace {

using T = SettingType;

// The table itself: constant data (every field a literal), so it exists before any code runs.
constexpr SettingInfo kTable[] = {
  {"MLSL_TF_HEARTBEAT_MS", "10",
   "longest an idle background thread sleeps between cycles (bounds how fast a peer's shutdown is seen)",
   T::kInt, 1, 60000},
  {"MLSL_TF_SPIN_US", "200",
   "after finishing work the background thread polls this long for the next request before sleeping",
   T::kInt, 0, 1000000},
  {"MLSL_TF_STALL_WARNING_SECONDS", "60",
   "warn when a collective submitted on this rank has waited this long for other ranks, naming them, and "
   "again every this many seconds (0 = never)",
   T::kInt, 0, 31536000},
  {"MLSL_TF_STALL_SHUTDOWN_SECONDS", "0",
   "when a collective has waited this long for other ranks, fail every pending collective on every rank "
   "with what each rank waits for (0 = never)",
   T::kInt, 0, 31536000},
  {"MLSL_TF_CHUNK_BYTES", "1048576",
   "allreduces larger than this are cut into chunks of this size; the scheduler re-picks between chunks",
   T::kBytes, 256, int64_t(1) << 31, "", true},
  {"MLSL_TF_RING_BYTES", "262144",
   "allreduces of at least this many bytes among ranks of one machine run as a point-to-point ring that "
   "reduces into the output and reuses its own buffers, instead of MPI's allreduce (0 = always MPI's)",
   T::kBytes, 0, int64_t(1) << 31, "", true},
  {"MLSL_TF_EAGER_BYTES", "8192",
   "allreduces of at most this many bytes whose name every rank already knows ride in the control "
   "message and finish in its one round trip (0 = never); also the most such data one message carries",
   T::kBytes, 0, int64_t(1) << 20, "", true},
  {"MLSL_TF_INFLIGHT", "4", "chunks (or whole collectives) in flight at once", T::kInt, 1, 64, "", true},
  {"MLSL_TF_FUSION_THRESHOLD", "1048576",
   "small allreduces of the same kind are fused into one buffer of up to this size (0 = no fusion)",
   T::kBytes, 0, int64_t(1) << 31, "", true},
  {"MLSL_TF_CACHE_CAPACITY", "4096",
   "collective names whose agreement is remembered (a remembered name needs no negotiation); when there are "
   "more and every rank is idle, the least recently used are forgotten",
   T::kInt, 16, 1 << 24, "", true},
  {"MLSL_TF_PRIORITY", "priority",
   "'priority': most urgent (lowest priority number) first; 'fifo': first agreed, first served",
   T::kChoice, 0, 0, "priority|fifo", true},
  {"MLSL_TF_WIRE_DTYPE", "float32",
   "wire type of float32 allreduces/reducescatters without an explicit compression",
   T::kChoice, 0, 0, "float32|bfloat16|float16|fp32|bf16|fp16|none", true},
  // init() hands the library this local rank's core (mlsl_tf_pin_background_thread); the
  // allowed words are mlsl_tf/cpu_placement.py's COMM_CORE_ALLOWED (tests/unit/test_comm_core.py compares them).
  {"MLSL_TF_COMM_CORE", "",
   "pin the background thread to this core; a list 'a,b' gives local rank i the (i mod n)-th core", T::kPython,
   0, 0, "empty, or a core number or a comma-separated list of them (e.g. 3 or 2,3)"},
  {"MLSL_TF_BIND", "auto",
   "'auto': init() binds each rank's threads to its own block of the machine's physical cores when the launcher "
   "did not bind it and every local rank can have a whole core (see mlsl_tf/cpu_placement.py); 'none': leave them",
   T::kChoice, 0, 0, "auto|none"},
  {"MLSL_TF_COMM_NICE", "0",
   "nice value of the background thread (negative: it preempts compute threads when the network wakes it; "
   "needs the permission to lower nice, else ignored)",
   T::kInt, -20, 19},
  {"MLSL_TF_TIMELINE", "",
   "write a Chrome-trace timeline to this path (rank 0; '{rank}' in the path: every rank), readable while the "
   "job runs; 'DYNAMIC' or empty: none until mlsl_tf.start_timeline (also read as HOROVOD_TIMELINE)",
   T::kText, 0, INT64_MAX, "", false, "HOROVOD_TIMELINE"},
  {"MLSL_TF_TIMELINE_MARK_CYCLES", "0",
   "1: the timeline marks the start of every background cycle (CYCLE_START; also read as "
   "HOROVOD_TIMELINE_MARK_CYCLES)",
   T::kChoice, 0, 0, "1|0|true|false|on|off|yes|no", false, "HOROVOD_TIMELINE_MARK_CYCLES"},
  {"MLSL_TF_DYNAMIC_PROCESS_SETS", "1",
   "1: process sets (groups) may be added and removed after init(); 0: only init(process_sets=...) makes "
   "them, as Horovod without HOROVOD_DYNAMIC_PROCESS_SETS (also read as HOROVOD_DYNAMIC_PROCESS_SETS)",
   T::kChoice, 0, 0, "1|0|true|false|on|off|yes|no", true, "HOROVOD_DYNAMIC_PROCESS_SETS"},
  {"MLSL_TF_INTER_OP_THREADS", "auto",
   "TensorFlow inter-op threads per rank that init() sets: 'auto' (2), a number, or 'tf' for TensorFlow's "
   "default (one per core of the machine, too many with several ranks per machine)",
   T::kThreads, 1, 1024, "auto|tf"},
  {"MLSL_TF_THREAD_SPINNING", "0",
   "1: TensorFlow's thread pools spin while they wait for work (TensorFlow's default); 0: they sleep, "
   "leaving the cores to the background thread and the other ranks of the machine",
   T::kChoice, 0, 0, "1|0|true|false|on|off|yes|no"},
  {"MLSL_TF_CROSS_ITERATION", "1",
   "1: DistributedOptimizer / DistributedGradientTape apply each variable's update just before its next "
   "access (the next forward pass), so reductions overlap the next step; 0: apply inside the step",
   T::kChoice, 0, 0, "1|0|true|false|on|off|yes|no"},
  {"MLSL_TF_AUTOTUNE", "0",
   "1: in the first steps rank 0 times training steps under candidate values of the settings that change no "
   "result bit (MLSL_TF_INFLIGHT, MLSL_TF_SPIN_US; one set in the environment stays), every rank applies each "
   "choice in the same cycle, and the fastest is frozen (docs/autotune.md; also read as HOROVOD_AUTOTUNE)",
   T::kChoice, 0, 0, "1|0|true|false|on|off|yes|no", true, "HOROVOD_AUTOTUNE"},
  {"MLSL_TF_AUTOTUNE_LOG", "",
   "autotune: rank 0 writes a CSV row per sample (the values tried, seconds per step) and a final row (what won, "
   "the cycle and step it froze at) to this file (also read as HOROVOD_AUTOTUNE_LOG)",
   T::kText, 0, INT64_MAX, "", false, "HOROVOD_AUTOTUNE_LOG"},
  {"MLSL_TF_AUTOTUNE_WARMUP_SAMPLES", "3",
   "autotune: samples' worth of steps discarded before the first sample (also read as "
   "HOROVOD_AUTOTUNE_WARMUP_SAMPLES)",
   T::kInt, 0, 1000, "", false, "HOROVOD_AUTOTUNE_WARMUP_SAMPLES"},
  {"MLSL_TF_AUTOTUNE_STEPS_PER_SAMPLE", "10",
   "autotune: training steps timed per sample, their mean its score (also read as "
   "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE)",
   T::kInt, 1, 100000, "", false, "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE"},
  {"MLSL_TF_LOG_LEVEL", "warning", "core log level", T::kChoice, 0, 0, "debug|info|warning|error"},
  {"MLSL_TF_START_TIMEOUT", "",
   "seconds mlslrun waits for every rank to start (set by mlslrun --start-timeout; informational for ranks)",
   T::kInt, 0, 31536000},
};

}  // namespace

const std::vector<SettingInfo>& AllSettings() {
  static const std::vector<SettingInfo> table(std::begin(kTable), std::end(kTable));
  return table;
}

static const SettingInfo& Find(const std::string& name) {
  for (const SettingInfo& s : AllSettings()) {
    if (name == s.name) return s;
  }
  std::fprintf(stderr, "mlsl_tf: internal error: undeclared setting %s\n", name.c_str());
  std::abort();
}

namespace {

std::string Lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string Trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

std::vector<std::string> Choices(const SettingInfo& info) {
  std::vector<std::string> out;
  std::string c = info.choices;
  size_t pos = 0;
  while (pos <= c.size()) {
    size_t bar = c.find('|', pos);
    out.push_back(c.substr(pos, bar == std::string::npos ? std::string::npos : bar - pos));
    if (bar == std::string::npos) break;
    pos = bar + 1;
  }
  return out;
}

// A decimal integer (optional sign), nothing else.
bool ParseInteger(const std::string& s, int64_t* out) {
  if (s.empty()) return false;
  size_t i = (s[0] == '-' || s[0] == '+') ? 1 : 0;
  if (i == s.size()) return false;
  for (size_t j = i; j < s.size(); ++j) if (!std::isdigit(static_cast<unsigned char>(s[j]))) return false;
  errno = 0;
  long long v = std::strtoll(s.c_str(), nullptr, 10);
  if (errno == ERANGE) return false;
  *out = v;
  return true;
}

// A non-negative decimal number with an optional unit; the result in bytes.
bool ParseBytes(const std::string& s, int64_t* out) {
  size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  std::string number = s.substr(0, i), unit = Lower(Trim(s.substr(i)));
  if (number.empty() || number == "." || number.find('.') != number.rfind('.')) return false;
  static const struct { const char* name; double factor; } units[] = {
      {"", 1}, {"b", 1}, {"k", 1e3}, {"kb", 1e3}, {"kib", 1024.0}, {"m", 1e6}, {"mb", 1e6},
      {"mib", 1048576.0}, {"g", 1e9}, {"gb", 1e9}, {"gib", 1073741824.0}};
  for (const auto& u : units) {
    if (unit == u.name) {
      double v = std::strtod(number.c_str(), nullptr) * u.factor;
      if (!(v < 9e18)) return false;
      double rounded = std::floor(v + 0.5);
      if (std::fabs(v - rounded) > 1e-6 * std::max(1.0, v)) return false;  // a fraction of a byte
      *out = int64_t(rounded);
      return true;
    }
  }
  return false;
}

std::string Range(const SettingInfo& info) {
  return "from " + std::to_string(info.min) + " to " + std::to_string(info.max);
}

}  // namespace

std::string Allowed(const SettingInfo& info) {
  switch (info.type) {
    case SettingType::kText: return "any text";
    case SettingType::kInt:
      return std::string("an integer ") + Range(info) + (*info.default_value ? "" : ", or empty");
    case SettingType::kBytes:
      return "a size in bytes " + Range(info) + ", optionally with a unit (KB, KiB, MB, MiB, GB, GiB)";
    case SettingType::kPython: return info.choices;
    case SettingType::kChoice:
    case SettingType::kThreads: {
      std::string out = "one of ";
      auto choices = Choices(info);
      for (size_t i = 0; i < choices.size(); ++i) out += (i ? ", " : "") + choices[i];
      if (info.type == SettingType::kThreads) out += ", or an integer " + Range(info);
      return out;
    }
  }
  return "";
}

std::string CheckSetting(const SettingInfo& info, const std::string& raw, int64_t* number, const char* variable) {
  const std::string text = Trim(raw);
  bool ok = true;
  int64_t value = 0;
  switch (info.type) {
    case SettingType::kText: break;
    case SettingType::kInt:
      ok = (text.empty() && !*info.default_value) ||
           (ParseInteger(text, &value) && value >= info.min && value <= info.max);
      break;
    case SettingType::kBytes:
      ok = ParseBytes(text, &value) && value >= info.min && value <= info.max;
      break;
    case SettingType::kChoice:
    case SettingType::kThreads: {
      ok = false;
      for (const std::string& c : Choices(info)) ok = ok || Lower(text) == c;
      if (!ok && info.type == SettingType::kThreads) {
        ok = ParseInteger(text, &value) && value >= info.min && value <= info.max;
      }
      break;
    }
    case SettingType::kPython: break;  // Python's to check (init() does, before the library's)
  }
  if (!ok) return std::string(variable ? variable : info.name) + "=" + raw + " is not valid: expected " + Allowed(info);
  if (number) *number = value;
  return "";
}

namespace {

const char* Env(const char* variable) {
  const char* v = *variable ? std::getenv(variable) : nullptr;
  return v && *v ? v : nullptr;
}

bool IsFlag(const SettingInfo& info) { return std::string(info.choices) == "1|0|true|false|on|off|yes|no"; }
bool FlagValue(const std::string& lowered) { return lowered == "1" || lowered == "true" || lowered == "on" || lowered == "yes"; }

// What a value means, so "1" and "true" (or " a " and "a") compare equal.
std::string Canonical(const SettingInfo& info, const std::string& raw) {
  std::string text = Trim(raw);
  if (info.type == SettingType::kChoice || info.type == SettingType::kThreads) text = Lower(text);
  if (IsFlag(info)) return FlagValue(text) ? "1" : "0";
  int64_t number = 0;
  if ((info.type == SettingType::kInt || info.type == SettingType::kBytes) && CheckSetting(info, text, &number).empty()) {
    return std::to_string(number);
  }
  return text;
}

}  // namespace

std::string CheckSettings() {
  std::string errors;
  auto add = [&errors](const std::string& e) { if (!e.empty()) errors += (errors.empty() ? "" : "\n") + e; };
  for (const SettingInfo& s : AllSettings()) {
    const char* env = Env(s.name);
    const char* alias = Env(s.alias);
    if (env) add(CheckSetting(s, env));
    if (alias) add(CheckSetting(s, alias, nullptr, s.alias));
    if (env && alias && Canonical(s, env) != Canonical(s, alias)) {
      add(std::string(s.name) + "=" + env + " and " + s.alias + "=" + alias + " disagree: " + s.alias +
          " is another name for " + s.name + "; set one of them (or both to the same value)");
    }
  }
  return errors;
}

std::string SettingSource(const std::string& name) {
  const SettingInfo& info = Find(name);
  return !Env(info.name) && Env(info.alias) ? info.alias : info.name;
}

std::string SettingString(const std::string& name) {
  const SettingInfo& info = Find(name);
  const char* env = Env(info.name);
  if (!env) env = Env(info.alias);
  std::string value = Trim(env ? env : info.default_value);
  return info.type == SettingType::kChoice || info.type == SettingType::kThreads ? Lower(value) : value;
}

bool SettingFlag(const std::string& name) { return FlagValue(SettingString(name)); }

bool SettingIsSet(const std::string& name) {
  const SettingInfo& info = Find(name);
  return Env(info.name) || Env(info.alias);
}

int64_t SettingInt(const std::string& name) {
  const SettingInfo& info = Find(name);
  int64_t value = 0;
  if (CheckSetting(info, SettingString(name), &value).empty()) return value;
  CheckSetting(info, info.default_value, &value);
  return value;
}

std::string AgreedSettings() {
  std::string out;
  for (const SettingInfo& s : AllSettings()) {
    if (!s.agreed) continue;
    const bool number = s.type == SettingType::kInt || s.type == SettingType::kBytes;
    // flags as 1/0 and choices in lower case, so spellings of one value compare equal
    std::string value = number ? std::to_string(SettingInt(s.name)) : Canonical(s, SettingString(s.name));
    if (std::string(s.name) == "MLSL_TF_WIRE_DTYPE") {  // aliases of one wire type compare equal
      value = value == "bf16" ? "bfloat16" : value == "fp16" ? "float16" : (value == "fp32" || value == "none") ? "float32" : value;
    }
    out += std::string(s.name) + "=" + value + "\n";
  }
  return out;
}

}  // namespace mlsl
