// Results: park, complete and take in every order, exactly one callback each.
#include <atomic>
#include <memory>
#include <thread>

#include "../results.h"
#include "check.h"

using namespace mlsl;

TEST(results_take_after_completion) {
  Results r;
  auto payload = std::make_shared<int>(7);
  CHECK(r.Park("g", payload).ok());
  CHECK_EQ(r.size(), size_t(1));
  r.Complete("g", Status::Ok());
  int calls = 0, seen = 0;
  CHECK(r.Take("g", [&](const Status& s, Results::Payload p) {
    ++calls;
    CHECK(s.ok());
    seen = *static_cast<int*>(p.get());
  }));
  CHECK_EQ(calls, 1);
  CHECK_EQ(seen, 7);
  CHECK_EQ(r.size(), size_t(0));
  CHECK(!r.Take("g", [&](const Status&, Results::Payload) { ++calls; }));  // taken once only
  CHECK_EQ(calls, 1);
}

TEST(results_take_before_completion_waits) {
  Results r;
  CHECK(r.Park("g", std::make_shared<int>(1)).ok());
  int calls = 0;
  Status got;
  CHECK(r.Take("g", [&](const Status& s, Results::Payload) { ++calls; got = s; }));
  CHECK_EQ(calls, 0);
  CHECK(!r.Take("g", [&](const Status&, Results::Payload) { ++calls; }));  // one waiter at a time
  r.Complete("g", Status::Aborted("peer left"));
  CHECK_EQ(calls, 1);
  CHECK(got.code() == StatusCode::kAborted);
  CHECK_EQ(got.message(), std::string("peer left"));
  r.Complete("g", Status::Ok());  // unknown by now: ignored
  CHECK_EQ(calls, 1);
}

TEST(results_unknown_name_and_double_park) {
  Results r;
  CHECK(!r.Take("nothing", [](const Status&, Results::Payload) {}));
  CHECK(r.Park("g", nullptr).ok());
  Status again = r.Park("g", nullptr);
  CHECK(again.code() == StatusCode::kFailedPrecondition);
  CHECK(again.message().find("'g'") != std::string::npos);
  r.Complete("g", Status::Ok());
  CHECK(r.Take("g", [](const Status&, Results::Payload) {}));
  CHECK(r.Park("g", nullptr).ok());  // free again once taken
}

TEST(results_concurrent_take_and_complete) {
  for (int round = 0; round < 200; ++round) {
    Results r;
    CHECK(r.Park("g", std::make_shared<int>(round)).ok());
    std::atomic<int> calls{0};
    std::thread completer([&] { r.Complete("g", Status::Ok()); });
    CHECK(r.Take("g", [&](const Status& s, Results::Payload p) {
      CHECK(s.ok());
      CHECK_EQ(*static_cast<int*>(p.get()), round);
      ++calls;
    }));
    completer.join();
    CHECK_EQ(calls.load(), 1);
    CHECK_EQ(r.size(), size_t(0));
  }
}
