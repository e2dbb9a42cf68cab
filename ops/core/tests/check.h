// A minimal test harness: TEST(name) registers a function, CHECK* record failures with the
// file and line, and main() (test_main.cc) runs every test and prints "N passed, N failed".
#pragma once

#include <functional>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace mlsl_test {

struct TestCase {
  const char* name;
  std::function<void()> fn;
};
std::vector<TestCase>& Registry();
void RecordFailure(const char* file, int line, const std::string& what);

struct Registrar {
  Registrar(const char* name, std::function<void()> fn) { Registry().push_back({name, std::move(fn)}); }
};

}  // namespace mlsl_test

#define TEST(name)                                                           \
  static void test_##name();                                                 \
  static ::mlsl_test::Registrar registrar_##name(#name, &test_##name);       \
  static void test_##name()

#define CHECK(cond)                                                                       \
  do {                                                                                    \
    if (!(cond)) ::mlsl_test::RecordFailure(__FILE__, __LINE__, "CHECK(" #cond ")");      \
  } while (0)

#define CHECK_EQ(a, b)                                                                    \
  do {                                                                                    \
    auto va_ = (a);                                                                       \
    auto vb_ = (b);                                                                       \
    if (!(va_ == vb_)) {                                                                  \
      std::ostringstream os_;                                                             \
      os_ << "CHECK_EQ(" #a ", " #b "): " << va_ << " vs " << vb_;                        \
      ::mlsl_test::RecordFailure(__FILE__, __LINE__, os_.str());                          \
    }                                                                                     \
  } while (0)

#define CHECK_CONTAINS(haystack, needle)                                                  \
  do {                                                                                    \
    std::string h_ = (haystack), n_ = (needle);                                           \
    if (h_.find(n_) == std::string::npos) {                                               \
      ::mlsl_test::RecordFailure(__FILE__, __LINE__, "\"" + h_ + "\" does not contain \"" + n_ + "\""); \
    }                                                                                     \
  } while (0)
