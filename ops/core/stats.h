// Counters the runtime keeps for mlsl_tf.stats(). Written by the background thread (Submitted:
// by the submitting thread), read by any thread (under the mutex), reported as JSON.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <utility>

namespace mlsl {

class Stats {
 public:
  void Request() { std::lock_guard<std::mutex> l(mu_); ++requests_; }
  // A request handed to Runtime::Submit (any thread): the framework enqueued it.
  void Submitted() { std::lock_guard<std::mutex> l(mu_); ++submitted_; }
  // A chunk or piece started, of `bytes`; `way` (operations.h), when given, counted as Ran's.
  void Chunk(int64_t bytes, const char* way = nullptr) {
    std::lock_guard<std::mutex> l(mu_);
    ++chunks_;
    bytes_ += bytes;
    if (way) CountWay(way);
  }
  void InPlace() { std::lock_guard<std::mutex> l(mu_); ++in_place_; }
  void Eager() { std::lock_guard<std::mutex> l(mu_); ++eager_; }
  void Preemption() { std::lock_guard<std::mutex> l(mu_); ++preemptions_; }
  void Fused(int parts) { std::lock_guard<std::mutex> l(mu_); ++fused_buffers_; fused_tensors_ += parts; }
  // Collective names whose agreement is remembered now, and names forgotten so far.
  void NamesKnown(int64_t n) { std::lock_guard<std::mutex> l(mu_); names_known_ = n; }
  void NamesForgotten(int64_t n) { std::lock_guard<std::mutex> l(mu_); names_forgotten_ += n; }
  void Wait(int priority, double seconds) {
    std::lock_guard<std::mutex> l(mu_);
    auto& w = waits_[priority];
    w.first += 1;
    w.second += seconds;
  }
  // A collective (a way of operations.h: "chunks" once per allreduce, then each chunk's way)
  // started running; how many did, by way.
  void Ran(const char* way) {
    std::lock_guard<std::mutex> l(mu_);
    CountWay(way);
  }
  int64_t ran(const std::string& way) const {
    std::lock_guard<std::mutex> l(mu_);
    auto it = ways_.find(way);
    return it == ways_.end() ? 0 : it->second;
  }
  // The autotune state (tuner.h's Json), shown as "autotune".
  void Autotune(std::string json) { std::lock_guard<std::mutex> l(mu_); autotune_ = std::move(json); }
  std::string Json() const;

 private:
  void CountWay(const char* way) {  // under mu_; no string made once the way has run
    auto it = ways_.find(way);
    if (it == ways_.end()) it = ways_.emplace(way, 0).first;
    ++it->second;
  }

  mutable std::mutex mu_;
  int64_t submitted_ = 0, requests_ = 0, chunks_ = 0, bytes_ = 0, preemptions_ = 0, fused_buffers_ = 0, fused_tensors_ = 0;
  int64_t names_known_ = 0, names_forgotten_ = 0;
  int64_t eager_ = 0;     // allreduces finished inside the control message
  int64_t in_place_ = 0;  // allreduces whose output is their input's buffer (TF forwarded it)
  std::map<int, std::pair<int64_t, double>> waits_;  // priority -> (count, total queue wait s)
  std::map<std::string, int64_t, std::less<>> ways_;
  std::string autotune_ = "null";  // until an engine exists              // operations.h's way -> collectives or chunks run
};

}  // namespace mlsl
