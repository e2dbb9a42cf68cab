#include "requests.h"

#include <algorithm>
#include <limits>
#include <memory>

#include "background_thread.h"

namespace mlsl {

namespace {

// s as an allreduce of float32 reading and writing `buf` (only the timing matters).
std::unique_ptr<Request> MakeRequest(const SimRequest& s, float* buf) {
  auto r = std::make_unique<Request>();
  r->name = s.name;
  r->priority = s.priority;
  r->inputs = {TensorInput{buf, {s.bytes / 4}}};
  r->allocate_output = [buf](int, const Shape&, void** p) {
    *p = buf;
    return Status::Ok();
  };
  return r;
}

}  // namespace

bool RunRequests(const SimConfig& cfg, std::vector<SimCompletion>* done, std::string* error) {
  if (cfg.requests.empty()) {
    *error = "no requests";
    return false;
  }
  SimNetwork net(cfg.fabric);
  Timeline timeline(cfg.timeline, 0);
  Stats stats;
  SimBackgroundThread thread(&net, cfg.runtime, cfg.cycle_s, &timeline, &stats);
  int64_t largest = 0;
  for (const SimRequest& r : cfg.requests) largest = std::max(largest, r.bytes);
  std::vector<float> data(size_t(std::max<int64_t>(1, largest / 4)), 1.0f);  // only the timing matters
  float* buf = data.data();
  std::string failed;
  std::vector<const SimRequest*> by_time;
  for (const SimRequest& r : cfg.requests) by_time.push_back(&r);
  std::stable_sort(by_time.begin(), by_time.end(), [](const SimRequest* a, const SimRequest* b) { return a->at_s < b->at_s; });
  for (int round = 0; round < cfg.rounds; ++round) {
    const double start = net.now();
    int left = int(cfg.requests.size());
    size_t next_submit = 0;
    auto submit_due = [&] {
      for (; next_submit < by_time.size() && start + by_time[next_submit]->at_s <= net.now(); ++next_submit) {
        const SimRequest& s = *by_time[next_submit];
        std::unique_ptr<Request> r = MakeRequest(s, buf);
        r->done = [&, round, name = s.name](const Status& st) {
          if (!st.ok() && failed.empty()) failed = name + ": " + st.message();
          done->push_back(SimCompletion{round, name, net.now() - start});
          --left;
        };
        thread.Submit(std::move(r));
      }
    };
    while (left > 0 && failed.empty() && thread.error().empty()) {
      submit_due();
      if (thread.NextAction() <= net.now()) {
        thread.Act();
        continue;
      }
      double next = std::min(net.NextEvent(), thread.NextAction());
      if (next_submit < by_time.size()) next = std::min(next, start + by_time[next_submit]->at_s);
      if (!(next < std::numeric_limits<double>::infinity())) {
        *error = "the simulation stalled with " + std::to_string(left) + " requests of round " +
                 std::to_string(round) + " not done";
        return false;
      }
      net.AdvanceTo(next);
    }
    if (!failed.empty() || !thread.error().empty()) {
      *error = failed.empty() ? thread.error() : failed;
      return false;
    }
  }
  return true;
}

}  // namespace mlsl
