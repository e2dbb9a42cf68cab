#include <cstdio>
#include <cstring>

#include "check.h"

namespace mlsl_test {

std::vector<TestCase>& Registry() {
  static std::vector<TestCase> r;
  return r;
}

static int g_failures = 0;

void RecordFailure(const char* file, int line, const std::string& what) {
  ++g_failures;
  std::cerr << "  FAILED " << file << ":" << line << ": " << what << "\n";
}

}  // namespace mlsl_test

int main(int argc, char** argv) {
  int passed = 0, failed = 0;
  for (auto& t : mlsl_test::Registry()) {
    if (argc > 1 && std::strstr(t.name, argv[1]) == nullptr) continue;
    int before = mlsl_test::g_failures;
    t.fn();
    bool ok = mlsl_test::g_failures == before;
    std::printf("%s %s\n", ok ? "[ ok ]" : "[FAIL]", t.name);
    (ok ? passed : failed)++;
  }
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
