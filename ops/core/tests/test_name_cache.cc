// Ranks whose caches of agreed names differ (here: a different MLSL_TF_CACHE_CAPACITY, which
// init() refuses; the runtime must not rely on that) fail every pending collective with an
// error, never pair one rank's tensor with another name's.
#include <chrono>
#include <string>
#include <thread>

#include "harness.h"

using namespace mlsl;
using namespace mlsl_test;

static Request SumOf(const std::string& name, const std::vector<int32_t>& x) {
  Request r;
  r.name = name;
  r.op = OpType::kAllreduce;
  r.dtype = DataType::kInt32;
  r.reduce_op = ReduceOp::kSum;
  r.inputs = {Input(x, {int64_t(x.size())})};
  return r;
}

TEST(ranks_whose_name_caches_differ_fail_instead_of_pairing_other_tensors) {
  auto world = std::make_shared<FakeWorld>(2);
  std::vector<std::unique_ptr<Runtime>> rts;
  for (size_t capacity : {16, 64}) {
    RuntimeOptions o;
    o.engine.cache_capacity = capacity;
    rts.push_back(std::make_unique<Runtime>(std::make_unique<FakeCommunicator>(world, int(rts.size())), o));
  }
  std::vector<std::string> errors(2);
  std::vector<int> wrong(2, 0);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      for (int i = 0; i < 200 && errors[rank].empty(); ++i) {
        // pauses when no rank has anything pending: names are forgotten only then
        if (i % 10 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(30));
        // every name twice: the second time its cached id is what the ranks pair
        for (int again = 0; again < 2 && errors[rank].empty(); ++again) {
          std::vector<int32_t> x = {i, rank};
          auto f = Submit(*rts[rank], SumOf("n" + std::to_string(i % 40), x));
          Result r = Get(f);
          if (!r.status.ok()) errors[rank] = r.status.message();
          else if (r.As<int32_t>() != std::vector<int32_t>({2 * i, 1})) ++wrong[rank];
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int rank = 0; rank < 2; ++rank) {
    CHECK_EQ(wrong[rank], 0);
    CHECK_CONTAINS(errors[rank], "no longer agree on the ids of collective names");
    CHECK_CONTAINS(errors[rank], "collective 'n");
  }
  std::vector<std::thread> stoppers;
  for (auto& rt : rts) stoppers.emplace_back([&rt] { rt->Shutdown(); });
  for (auto& t : stoppers) t.join();
}
