// Runs N ranks as threads, each with a Runtime over a FakeCommunicator, and lets tests submit
// requests and wait for them with a deadline (a hang is a failure, not a stuck test).
#pragma once

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <functional>
#include <future>
#include <memory>
#include <thread>
#include <vector>

#include "../fake_communicator.h"
#include "check.h"
#include "../runtime.h"

namespace mlsl_test {

struct Result {
  mlsl::Status status;
  std::vector<std::vector<char>> outputs;
  std::vector<mlsl::Shape> shapes;
  template <typename T> std::vector<T> As(int i = 0) const {
    std::vector<T> v(outputs[i].size() / sizeof(T));
    if (!v.empty()) std::memcpy(v.data(), outputs[i].data(), outputs[i].size());
    return v;
  }
};

// A request whose outputs are kept in the returned future's Result.
inline std::future<Result> Submit(mlsl::Runtime& rt, mlsl::Request r) {
  auto promise = std::make_shared<std::promise<Result>>();
  auto result = std::make_shared<Result>();
  auto req = std::make_unique<mlsl::Request>(std::move(r));
  auto op = req->op;
  auto dtype = req->dtype;
  req->allocate_output = [result, op, dtype](int index, const mlsl::Shape& shape, void** data) {
    if (int(result->outputs.size()) <= index) {
      result->outputs.resize(index + 1);
      result->shapes.resize(index + 1);
    }
    bool int32_out = (op == mlsl::OpType::kAlltoall && index == 1) || op == mlsl::OpType::kJoin ||
                     op == mlsl::OpType::kAddGroup || op == mlsl::OpType::kRemoveGroup;
    size_t esize = int32_out ? 4 : mlsl::DataTypeSize(dtype);
    result->outputs[index].assign(mlsl::NumElements(shape) * esize, 0);
    result->shapes[index] = shape;
    *data = result->outputs[index].data();
    return mlsl::Status::Ok();
  };
  req->done = [promise, result](const mlsl::Status& s) {
    result->status = s;
    promise->set_value(*result);
  };
  auto f = promise->get_future();
  rt.Submit(std::move(req));
  return f;
}

inline Result Get(std::future<Result>& f, int seconds = 20) {
  if (f.wait_for(std::chrono::seconds(seconds)) != std::future_status::ready) {
    RecordFailure(__FILE__, __LINE__, "request did not finish in time (hang)");
    std::fprintf(stderr, "aborting: a hung test cannot be recovered\n");
    std::abort();
  }
  return f.get();
}

// A join request (Horovod's hvd.join()): the rank contributes the identity until every rank has joined.
inline mlsl::Request JoinRequest() {
  mlsl::Request join;
  join.name = "join";
  join.op = mlsl::OpType::kJoin;
  join.dtype = mlsl::DataType::kInt32;
  return join;
}

// Keeps input tensors alive for the duration of a test.
template <typename T> mlsl::TensorInput Input(const std::vector<T>& data, mlsl::Shape shape) {
  return mlsl::TensorInput{data.data(), std::move(shape)};
}

// Sets environment variables for a test of the settings table (settings.h, the only reader of
// the environment), and unsets them afterwards. Runtimes take RuntimeOptions instead.
struct Env {
  std::vector<std::string> names;
  Env(std::initializer_list<std::pair<const char*, const char*>> kv) {
    for (auto& [k, v] : kv) { setenv(k, v, 1); names.push_back(k); }
  }
  ~Env() { for (auto& n : names) unsetenv(n.c_str()); }
};

// Runs body(rank, runtime) on one thread per rank of `world`, each with its own Runtime (made
// with `options`).
inline void RunRanksOn(const mlsl::RuntimeOptions& options, const std::shared_ptr<mlsl::FakeWorld>& world,
                       const std::function<void(int, mlsl::Runtime&)>& body) {
  const int n = world->size();
  std::vector<std::unique_ptr<mlsl::Runtime>> rts;
  for (int r = 0; r < n; ++r) {
    rts.push_back(std::make_unique<mlsl::Runtime>(std::make_unique<mlsl::FakeCommunicator>(world, r), options));
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back([&, r] { body(r, *rts[r]); });
  for (auto& t : threads) t.join();
  std::vector<std::thread> stoppers;  // shut down together, as processes exiting would
  for (int r = 0; r < n; ++r) stoppers.emplace_back([&, r] { rts[r]->Shutdown(); });
  for (auto& t : stoppers) t.join();
}

// Runs body(rank, runtime) on n threads, each with its own Runtime (made with `options`) on
// one fake world.
inline void RunRanks(const mlsl::RuntimeOptions& options, int n, const std::function<void(int, mlsl::Runtime&)>& body,
                     int64_t max_message_bytes = INT64_MAX) {
  auto world = std::make_shared<mlsl::FakeWorld>(n);
  world->max_message_bytes = max_message_bytes;
  RunRanksOn(options, world, body);
}

// The same with the default options.
inline void RunRanks(int n, const std::function<void(int, mlsl::Runtime&)>& body,
                     int64_t max_message_bytes = INT64_MAX) {
  RunRanks(mlsl::RuntimeOptions(), n, body, max_message_bytes);
}

}  // namespace mlsl_test
