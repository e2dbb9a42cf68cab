#include "results.h"

#include <utility>

#include "types.h"

namespace mlsl {

Status Results::Park(const std::string& name, Payload payload) {
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, inserted] = entries_.try_emplace(name);
  if (!inserted) {
    return Status::FailedPrecondition("collective '" + ShownName(name) +
                                      "' was started again before its previous result was taken");
  }
  it->second.payload = std::move(payload);
  if (record_) events_.push_back({name, "start", std::chrono::steady_clock::now()});
  return Status::Ok();
}

void Results::Complete(const std::string& name, const Status& status) {
  Callback waiter;
  Payload payload;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(name);
    if (it == entries_.end()) return;
    if (!it->second.waiter) {
      it->second.done = true;
      it->second.status = status;
      return;
    }
    waiter = std::move(it->second.waiter);
    payload = std::move(it->second.payload);
    entries_.erase(it);
    if (record_) events_.push_back({name, "take", std::chrono::steady_clock::now()});
  }
  waiter(status, std::move(payload));
}

bool Results::Take(const std::string& name, Callback callback) {
  Status status;
  Payload payload;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(name);
    if (it == entries_.end() || it->second.waiter) return false;
    if (!it->second.done) {
      it->second.waiter = std::move(callback);
      return true;
    }
    status = it->second.status;
    payload = std::move(it->second.payload);
    entries_.erase(it);
    if (record_) events_.push_back({name, "take", std::chrono::steady_clock::now()});
  }
  callback(status, std::move(payload));
  return true;
}

void Results::Record(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  record_ = on;
  if (!on) events_.clear();
}

std::vector<Results::Event> Results::Drain() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Event> out;
  out.swap(events_);
  return out;
}

size_t Results::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

}  // namespace mlsl
