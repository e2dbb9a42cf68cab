// The settings table's checks (settings.h): the library refuses bad values of the settings it
// parses, and leaves MLSL_TF_COMM_CORE (kPython) to its one parser, mlsl_tf/cpu_placement.py.
#include <string>

#include "../settings.h"
#include "harness.h"

using namespace mlsl;
using namespace mlsl_test;

namespace {

const SettingInfo& Info(const std::string& name) {
  for (const SettingInfo& s : AllSettings()) {
    if (name == s.name) return s;
  }
  CHECK(false);
  return AllSettings().front();
}

}  // namespace

// The library does not parse MLSL_TF_COMM_CORE: init()'s check passes any value (Python refused
// a bad one before calling it).
TEST(settings_comm_core_is_not_the_librarys_to_parse) {
  const SettingInfo& info = Info("MLSL_TF_COMM_CORE");
  CHECK(info.type == SettingType::kPython);
  {
    Env env({{"MLSL_TF_COMM_CORE", "one"}});
    CHECK_EQ(CheckSettings(), std::string());
  }
  {  // the settings the library parses are still refused beside it
    Env env({{"MLSL_TF_COMM_CORE", "one"}, {"MLSL_TF_INFLIGHT", "0"}});
    CHECK_EQ(CheckSettings(), std::string("MLSL_TF_INFLIGHT=0 is not valid: expected an integer from 1 to 64"));
  }
}
