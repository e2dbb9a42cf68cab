// Every MLSL_TF_* environment setting, declared once with its default and a one-line doc.
// Python asks the library for this table (mlsl_tf.settings()) instead of copying it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mlsl {

struct SettingInfo {
  const char* name;
  const char* default_value;
  const char* doc;
};

const std::vector<SettingInfo>& AllSettings();

// The environment's value of a declared setting, or its default. Unknown names abort: a typo
// in the code must not silently read a default.
std::string SettingString(const std::string& name);
int64_t SettingInt(const std::string& name);
double SettingDouble(const std::string& name);

}  // namespace mlsl
