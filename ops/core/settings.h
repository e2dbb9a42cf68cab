// Every MLSL_TF_* environment setting, declared once with its default, what it allows (type,
// range, units) and a one-line doc. Python asks the library for this table (mlsl_tf.settings())
// instead of copying it, and init() refuses a value that does not parse or is out of range,
// naming the variable, the value and what is allowed -- never a silent fallback.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mlsl {

enum class SettingType {
  kText,      // any string (a path)
  kInt,       // an integer in [min, max]; "" allowed when the default is ""
  kBytes,     // a size: a number with an optional unit (B, KB, KiB, MB, MiB, GB, GiB) in [min, max]
  kChoice,    // one of `choices` ("a|b|c")
  kPython,    // parsed by Python, never by the library (MLSL_TF_COMM_CORE: mlsl_tf/cpu_placement.py, which
              // mlslrun needs before the library loads); the entry gives mlsl_tf.settings() and the
              // README its default and doc, and `choices` says in words what Python allows
  kThreads,   // one of `choices` or an integer in [min, max]
};

struct SettingInfo {
  const char* name;
  const char* default_value;
  const char* doc;
  SettingType type = SettingType::kText;
  int64_t min = 0, max = INT64_MAX;
  const char* choices = "";
  // Shapes the collectives every rank starts (chunks, slots, fusion, order, algorithm), the
  // control message (eager bytes, the name cache's ids) or the results (wire type): ranks with
  // different values would start different MPI operations, pair different collectives or get
  // different bits, so init() compares them.
  bool agreed = false;
  // Another variable read for this setting when it is unset (Horovod's name, e.g.
  // HOROVOD_TIMELINE): checked like it, and an error when both are set to different values.
  const char* alias = "";
};

const std::vector<SettingInfo>& AllSettings();

// What `info` allows, in words ("an integer from 1 to 64", "one of priority, fifo", ...).
std::string Allowed(const SettingInfo& info);
// Checks `text` against `info` (`variable`: the name to blame, default info.name): "" when valid, else the error (variable, value, what is allowed).
// For kInt and kBytes (and a kThreads number) *number receives the value.
std::string CheckSetting(const SettingInfo& info, const std::string& text, int64_t* number = nullptr,
                         const char* variable = nullptr);
// The errors of every setting's environment value, one per line ("" when all are valid).
std::string CheckSettings();

// The environment's value of a declared setting, or its default. Unknown names abort: a typo
// in the code must not silently read a default. SettingInt parses kInt and kBytes values
// (CheckSettings ran at init; an invalid value here reads as the default).
std::string SettingString(const std::string& name);
int64_t SettingInt(const std::string& name);
// A yes/no setting (choices 1|0|true|false|on|off|yes|no): true for 1, true, on, yes.
bool SettingFlag(const std::string& name);
// Whether the environment sets the setting (itself or its alias, non-empty).
bool SettingIsSet(const std::string& name);
// The variable a setting's value comes from: its name, or its alias when only that is set.
std::string SettingSource(const std::string& name);
// "NAME=value\n" for every `agreed` setting, numbers parsed (so " 8 " and "8" compare equal).
std::string AgreedSettings();

}  // namespace mlsl
