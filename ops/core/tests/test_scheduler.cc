// The priority scheduler on the fake communicator: preemption between chunks, identical order
// on every rank, no starvation, and fusion of mixed sizes.
#include <atomic>
#include <cstdlib>
#include <mutex>

#include "harness.h"

using namespace mlsl;
using namespace mlsl_test;

namespace {

Request Allreduce(const std::string& name, const std::vector<float>& data, int priority) {
  Request r;
  r.name = name;
  r.dtype = DataType::kFloat32;
  r.priority = priority;
  r.inputs = {TensorInput{data.data(), {int64_t(data.size())}}};
  return r;
}

// Completion order of named requests on one rank.
struct Order {
  std::mutex mu;
  std::vector<std::string> names;
  void Add(const std::string& n) { std::lock_guard<std::mutex> l(mu); names.push_back(n); }
};

std::future<Result> SubmitTracked(Runtime& rt, Request r, Order* order) {
  auto promise = std::make_shared<std::promise<Result>>();
  auto result = std::make_shared<Result>();
  auto req = std::make_unique<Request>(std::move(r));
  std::string name = req->name;
  req->allocate_output = [result](int index, const Shape& shape, void** data) {
    if (int(result->outputs.size()) <= index) { result->outputs.resize(index + 1); result->shapes.resize(index + 1); }
    result->outputs[index].assign(NumElements(shape) * 4, 0);
    result->shapes[index] = shape;
    *data = result->outputs[index].data();
    return Status::Ok();
  };
  req->done = [promise, result, order, name](const Status& s) {
    order->Add(name);
    result->status = s;
    promise->set_value(*result);
  };
  auto f = promise->get_future();
  rt.Submit(std::move(req));
  return f;
}

}  // namespace

TEST(urgent_tensor_overtakes_remaining_chunks_of_big_one) {
  RuntimeOptions o;
  o.engine.scheduler.chunk_bytes = 4096;
  o.engine.scheduler.inflight = 2;
  o.engine.scheduler.fusion_threshold = 0;
  std::vector<Order> orders(3);
  RunRanks(o, 3, [&](int rank, Runtime& rt) {
    std::vector<float> big(1 << 22, 1.0f), small(8, float(rank));  // 16 MiB = 4096 chunks
    auto b = SubmitTracked(rt, Allreduce("big", big, 100), &orders[rank]);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // big is being reduced now
    auto s = SubmitTracked(rt, Allreduce("urgent", small, 0), &orders[rank]);
    Result rs = Get(s), rb = Get(b);
    CHECK(rs.status.ok() && rb.status.ok());
    CHECK(rs.As<float>() == std::vector<float>(8, 3.0f));
    auto got = rb.As<float>();
    CHECK(got.front() == 3.0f && got.back() == 3.0f);
    CHECK_CONTAINS(rt.StatsJson(), "\"preemptions\": ");
    CHECK(rt.StatsJson().find("\"preemptions\": 0,") == std::string::npos);
  });
  for (auto& o : orders) CHECK(o.names == (std::vector<std::string>{"urgent", "big"}));
}

TEST(same_order_on_every_rank_whatever_the_submission_order) {
  RuntimeOptions o;
  o.engine.scheduler.chunk_bytes = 1024;
  o.engine.scheduler.inflight = 1;
  o.engine.scheduler.fusion_threshold = 0;
  std::vector<Order> orders(3);
  RunRanks(o, 3, [&](int rank, Runtime& rt) {
    std::vector<std::vector<float>> data(12);
    std::vector<std::future<Result>> fs;
    for (int k = 0; k < 12; ++k) {
      int i = (k * (rank == 0 ? 1 : rank == 1 ? 5 : 7) + rank) % 12;  // another order on each rank
      data[i].assign(512 * (1 + i % 4), 1.0f);
      fs.push_back(SubmitTracked(rt, Allreduce("t" + std::to_string(i), data[i], i % 3), &orders[rank]));
    }
    for (auto& f : fs) CHECK(Get(f).status.ok());
  });
  CHECK(orders[0].names == orders[1].names);
  CHECK(orders[0].names == orders[2].names);
}

TEST(low_priority_work_is_not_starved) {
  RuntimeOptions o;
  o.engine.scheduler.chunk_bytes = 2048;
  o.engine.scheduler.inflight = 2;
  RunRanks(o, 2, [&](int rank, Runtime& rt) {
    std::vector<float> big(64 * 1024, 2.0f);
    auto b = Submit(rt, Allreduce("background", big, 1000));
    std::vector<std::vector<float>> urgent(60, std::vector<float>(16, 1.0f));
    for (int i = 0; i < 60; ++i) {
      auto f = Submit(rt, Allreduce("u" + std::to_string(i), urgent[i], 0));
      Result r = Get(f);
      CHECK(r.status.ok());
      if (!r.status.ok()) std::fprintf(stderr, "%s\n", r.status.message().c_str());
    }
    Result r = Get(b);
    CHECK(r.status.ok());
    CHECK(r.As<float>() == std::vector<float>(64 * 1024, 4.0f));
  });
}

TEST(fusion_packs_and_unpacks_mixed_sizes) {
  RuntimeOptions o;
  o.engine.scheduler.chunk_bytes = 1000;
  o.engine.scheduler.fusion_threshold = 65536;
  o.engine.scheduler.inflight = 1;
  RunRanks(o, 3, [&](int rank, Runtime& rt) {
    // hold the queue with one big tensor so that the small ones are all agreed and waiting
    std::vector<float> head(200000, 1.0f);
    auto h = Submit(rt, Allreduce("head", head, 0));
    std::vector<std::vector<float>> small;
    for (int i = 0; i < 20; ++i) small.emplace_back((i * 37) % 300, float(rank + i));  // sizes 0..299
    std::vector<std::future<Result>> fs;
    for (int i = 0; i < 20; ++i) fs.push_back(Submit(rt, Allreduce("s" + std::to_string(i), small[i], 1 + i % 2)));
    std::vector<float> a(7, float(rank)), b(3, 1.0f);
    Request g;
    g.name = "grouped";
    g.dtype = DataType::kFloat32;
    g.priority = 1;
    g.inputs = {TensorInput{a.data(), {7}}, TensorInput{b.data(), {3}}};
    auto gf = Submit(rt, std::move(g));
    CHECK(Get(h).status.ok());
    for (int i = 0; i < 20; ++i) {
      Result r = Get(fs[i]);
      CHECK(r.status.ok());
      CHECK(r.As<float>() == std::vector<float>((i * 37) % 300, float(3 * i + 3)));
    }
    Result gr = Get(gf);
    CHECK(gr.As<float>(0) == std::vector<float>(7, 3.0f));
    CHECK(gr.As<float>(1) == std::vector<float>(3, 3.0f));
    CHECK(rt.StatsJson().find("\"fused_buffers\": 0,") == std::string::npos);
  });
}

TEST(fifo_policy_serves_in_agreement_order) {
  RuntimeOptions o;
  o.engine.scheduler.chunk_bytes = 4096;
  o.engine.scheduler.inflight = 1;
  o.engine.scheduler.fifo = true;
  o.engine.scheduler.fusion_threshold = 0;
  std::vector<Order> orders(2);
  RunRanks(o, 2, [&](int rank, Runtime& rt) {
    std::vector<float> big(1 << 18, 1.0f), small(8, 1.0f);
    auto b = SubmitTracked(rt, Allreduce("big", big, 100), &orders[rank]);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    auto s = SubmitTracked(rt, Allreduce("urgent", small, 0), &orders[rank]);
    CHECK(Get(s).status.ok() && Get(b).status.ok());
  });
  for (auto& o : orders) CHECK(o.names == (std::vector<std::string>{"big", "urgent"}));
}

TEST(priority_must_agree_across_ranks) {
  RunRanks(2, [&](int rank, Runtime& rt) {
    std::vector<float> x(4, 1.0f);
    auto f = Submit(rt, Allreduce("p", x, rank));
    CHECK_CONTAINS(Get(f).status.message(), "priority 0 on rank 0 vs 1 on rank 1");
  });
}
