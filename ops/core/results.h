// Results: collectives started by one op and taken by a later one (deferred optimizer updates).
// A started collective is parked under its name with an opaque payload (the framework's
// buffers); its completion status is recorded when the background thread finishes it; Take
// hands payload and status to a callback exactly once, when both the take and the completion
// have happened. Thread-safe: parked and taken from framework threads, completed by the runtime.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "status.h"

namespace mlsl {

class Results {
 public:
  using Payload = std::shared_ptr<void>;
  using Callback = std::function<void(const Status&, Payload)>;

  // Parks `payload` under `name`. FailedPrecondition when a result of that name is parked and
  // not yet taken (its update would be lost).
  Status Park(const std::string& name, Payload payload);
  // Records the outcome of the collective parked under `name` (no-op for an unknown name).
  void Complete(const std::string& name, const Status& status);
  // False when nothing is parked under `name` (or another take of it is already waiting);
  // otherwise `callback` runs once the collective has completed -- here, when it already has.
  bool Take(const std::string& name, Callback callback);
  // Results parked and not yet taken.
  size_t size() const;

  // For the timeline: when each result was parked ("start") and handed to its taker ("take":
  // the later of the take and the completion, when the framework can go on), recorded
  // once Record(true) and handed over (and cleared) by Drain.
  struct Event {
    std::string name;
    const char* kind;
    std::chrono::steady_clock::time_point at;
  };
  void Record(bool on);  // from any thread (a timeline started or stopped at run time)
  std::vector<Event> Drain();

 private:
  struct Entry {
    Payload payload;
    bool done = false;
    Status status;
    Callback waiter;
  };
  mutable std::mutex mu_;
  std::unordered_map<std::string, Entry> entries_;
  bool record_ = false;
  std::vector<Event> events_;
};

}  // namespace mlsl
