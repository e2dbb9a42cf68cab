// Tuner (autotune): on a fake clock it picks the values with the shortest step time, discards
// the warm-up and the step under way when values change, keeps the knobs the user set, and
// freezes; only rank 0 proposes and every rank applies the same words in the same cycle; the
// control message carries rank 0's proposal; N runtimes under autotune agree on every change.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <sstream>

#include <unistd.h>

#include "../control_message.h"
#include "../tuner.h"
#include "harness.h"

using namespace mlsl;
using namespace mlsl_test;

namespace {

using Clock = std::chrono::steady_clock;

// Seconds per step under `v`: fastest at 8 in flight and 50 us of spin.
double Cost(const Tuner::Values& v) {
  return 0.01 + 0.001 * std::abs(std::log2(double(v[kTuneInflight])) - 3) + (v[kTuneSpinUs] == 50 ? 0 : 0.0005);
}

std::vector<std::string> Lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

std::vector<std::string> Fields(const std::string& line) {
  std::vector<std::string> out;
  std::stringstream ss(line);
  for (std::string f; std::getline(ss, f, ',');) out.push_back(f);
  return out;
}

// Steps a training loop on a fake clock with rank 0's tuner and a follower (rank 1): each step
// submits "grad.a" then "grad.b" and takes Cost(values in force at its start); a control cycle
// runs between the two submissions (the values may change mid-step). Stops when both froze.
struct Loop {
  Tuner lead, follower;
  std::function<double(const Tuner::Values&)> cost = Cost;
  Clock::time_point t{};
  uint64_t cycle = 0;
  int steps = 0;
  // `slow_steps`: the first steps take 100 s (a warm-up's compilation).
  void Run(int slow_steps = 0, int most = 500) {
    while ((!lead.frozen() || !follower.frozen()) && steps < most) {
      Tuner::Values v{lead.value(0), lead.value(1)};
      lead.Submitted("grad.a", t);
      follower.Submitted("grad.a", t);
      Cycle();
      lead.Submitted("grad.b", t + std::chrono::microseconds(1));
      t += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(steps < slow_steps ? 100 : cost(v)));
      ++steps;
    }
  }
  void Cycle() {
    std::vector<uint64_t> a, b;
    lead.Fill(&a);
    follower.Fill(&b);
    for (size_t i = 0; i < a.size(); ++i) a[i] = std::min(a[i], b[i]);  // the control message's MIN
    ++cycle;
    const bool x = lead.Apply(a, cycle), y = follower.Apply(a, cycle);
    CHECK_EQ(x, y);
  }
};

TuneOptions Options(const std::string& log, int warmup, int steps) {
  TuneOptions o;
  o.enabled = true;
  o.warmup_samples = warmup;
  o.steps_per_sample = steps;
  o.log = log;
  o.initial = {4, 200};
  std::FILE* f = std::fopen(log.c_str(), "w");  // init writes the header (c_api.cc)
  std::fputs(Tuner::LogHeader().c_str(), f);
  std::fclose(f);
  return o;
}

}  // namespace

TEST(tuner_on_a_fake_clock_picks_the_fastest_and_freezes_on_every_rank) {
  const std::string log = "/tmp/mlsl_tf_test_tuner_" + std::to_string(getpid()) + ".csv";
  TuneOptions o = Options(log, 2, 3);
  Loop loop{Tuner(o, 0), Tuner(o, 1)};
  loop.Run(/*slow_steps=*/6);
  CHECK(loop.lead.frozen() && loop.follower.frozen());
  CHECK_EQ(loop.lead.value(kTuneInflight), int64_t(8));
  CHECK_EQ(loop.lead.value(kTuneSpinUs), int64_t(50));
  CHECK_EQ(loop.lead.Json(), loop.follower.Json());  // the same values, applied in the same cycles
  CHECK_CONTAINS(loop.lead.Json(), "\"frozen\": true");
  CHECK_CONTAINS(loop.lead.Json(), "\"tuned\": [\"MLSL_TF_INFLIGHT\", \"MLSL_TF_SPIN_US\"]");
  const std::vector<std::string> lines = Lines(log);
  CHECK(!lines.empty() && lines[0] == "kind,sample,cycle,step,MLSL_TF_INFLIGHT,MLSL_TF_SPIN_US,seconds_per_step,best");
  int samples = 0;
  for (size_t i = 1; i < lines.size(); ++i) {
    std::vector<std::string> f = Fields(lines[i]);
    CHECK_EQ(f.size(), size_t(8));
    if (f.size() != 8) continue;
    Tuner::Values v{std::stoll(f[4]), std::stoll(f[5])};
    // Each score is exactly its values' cost: the 100 s warm-up steps and the steps under way
    // when values changed are not in any sample.
    CHECK(std::fabs(std::stod(f[6]) - Cost(v)) < 1e-6);
    if (f[0] == "sample") ++samples;
  }
  // The start (4, 200), inflight 1, 2, 8, 16 at spin 200, then spin 0, 50, 1000 at inflight 8;
  // then the start and the winner twice more each.
  CHECK_EQ(samples, 8);
  CHECK_EQ(int(std::count_if(lines.begin(), lines.end(), [](const std::string& l) { return l.rfind("confirm,", 0) == 0; })),
           2 * Tuner::kConfirmPairs);
  CHECK_CONTAINS(lines.back(), "final,12,");
  CHECK_CONTAINS(lines.back(), ",8,50,");
  std::remove(log.c_str());
}

TEST(tuner_does_not_freeze_a_winner_that_was_lucky_once) {
  // Inflight 2 measures fast the first time only (a quiet moment of a noisy machine); every other
  // sample of it is slower than the start. The confirmation finds that out and keeps the start.
  const std::string log = "/tmp/mlsl_tf_test_tuner_lucky_" + std::to_string(getpid()) + ".csv";
  TuneOptions o = Options(log, 0, 3);
  Loop loop{Tuner(o, 0), Tuner(o, 1)};
  int lucky_steps = 3;  // one sample's worth
  loop.cost = [&](const Tuner::Values& v) {
    if (v[kTuneInflight] == 2 && v[kTuneSpinUs] == 200) return lucky_steps-- > 0 ? 0.005 : 0.012;
    return v == Tuner::Values{4, 200} ? 0.011 : 0.02;
  };
  loop.Run();
  CHECK(loop.lead.frozen() && loop.follower.frozen());
  CHECK_EQ(loop.lead.value(kTuneInflight), int64_t(4));
  CHECK_EQ(loop.follower.value(kTuneSpinUs), int64_t(200));
  const std::vector<std::string> lines = Lines(log);
  int confirms = 0;
  for (const std::string& line : lines) confirms += line.rfind("confirm,", 0) == 0;
  CHECK_EQ(confirms, 2 * Tuner::kConfirmPairs);
  const std::vector<std::string> final_row = Fields(lines.back());
  CHECK(final_row.size() == 8 && final_row[0] == "final" && final_row[4] == "4" && final_row[5] == "200");
  if (final_row.size() == 8) CHECK(std::fabs(std::stod(final_row[6]) - 0.011) < 1e-6);  // the start's median
  // A winner that stays fast through the confirmation is kept (the first test: 8, 50).
  std::remove(log.c_str());
}

TEST(tuner_keeps_the_knobs_the_user_set) {
  const std::string log = "/tmp/mlsl_tf_test_tuner_fixed_" + std::to_string(getpid()) + ".csv";
  TuneOptions o = Options(log, 0, 2);
  o.initial = {4, 777};
  o.fixed[kTuneSpinUs] = true;
  Loop loop{Tuner(o, 0), Tuner(o, 1)};
  loop.Run();
  CHECK(loop.lead.frozen());
  CHECK_EQ(loop.lead.value(kTuneInflight), int64_t(8));
  CHECK_EQ(loop.follower.value(kTuneSpinUs), int64_t(777));
  CHECK_CONTAINS(loop.lead.Json(), "\"tuned\": [\"MLSL_TF_INFLIGHT\"]");
  int rows = 0;
  for (const std::string& line : Lines(log)) {
    if (line.rfind("sample,", 0) == 0 || line.rfind("final,", 0) == 0) {
      ++rows;
      CHECK_EQ(Fields(line)[5], std::string("777"));
    }
  }
  CHECK_EQ(rows, 1 + 4 + 1);  // the start, the other four windows, the final row (confirm rows apart)
  std::remove(log.c_str());
}

TEST(tuner_off_proposes_nothing_and_ignores_proposals) {
  TuneOptions o;
  o.initial = {3, 100};
  Tuner off(o, 0);
  std::vector<uint64_t> w;
  for (int i = 0; i < 100; ++i) off.Submitted(i % 2 ? "a" : "b", Clock::time_point(std::chrono::seconds(i)));
  off.Fill(&w);
  CHECK(w == std::vector<uint64_t>(size_t(kTuneWords), ~uint64_t(0)));
  CHECK(!off.Apply({0, 16, 0}, 1));
  CHECK_EQ(off.value(kTuneInflight), int64_t(3));
  CHECK_CONTAINS(off.Json(), "\"enabled\": false");
  CHECK_CONTAINS(off.Json(), "\"applied\": []");
}

TEST(tuner_follower_never_proposes) {
  TuneOptions o;
  o.enabled = true;
  o.warmup_samples = 0;
  o.steps_per_sample = 1;
  Tuner follower(o, 2);
  for (int i = 0; i < 50; ++i) follower.Submitted("a", Clock::time_point(std::chrono::seconds(i)));
  std::vector<uint64_t> w;
  follower.Fill(&w);
  CHECK(w == std::vector<uint64_t>(size_t(kTuneWords), ~uint64_t(0)));
  CHECK(follower.Apply({0, 2, ~uint64_t(0)}, 7));  // a trial: the window only
  CHECK_EQ(follower.value(kTuneInflight), int64_t(2));
  CHECK_EQ(follower.value(kTuneSpinUs), int64_t(200));
  CHECK(!follower.frozen());
  CHECK(follower.Apply({1, 8, 50}, 9));
  CHECK(follower.frozen());
  CHECK(!follower.Apply({0, 1, 0}, 10));  // frozen for good
  CHECK_CONTAINS(follower.Json(), "\"applied\": [[7, 0, 2, 200], [9, 1, 8, 50]]");
}

TEST(control_message_carries_rank_zeros_proposal) {
  auto message = [](const std::vector<uint64_t>& tune) {
    ControlMessage m;
    m.joined.assign(3, false);
    m.shut_down.assign(3, false);
    m.ready.assign(1, 0);
    m.units_done = {5};
    m.fingerprint = 42;
    m.tune = tune;
    return m;
  };
  const std::vector<uint64_t> none(size_t(kTuneWords), ~uint64_t(0)), proposal{0, 16, 50};
  std::vector<uint64_t> w0, w1, w2;
  message(proposal).Encode(&w0);
  message(none).Encode(&w1);
  message({}).Encode(&w2);  // an empty `tune` travels as all ones
  CHECK_EQ(w1.size(), w2.size());
  ControlMessage::Combine(w1.data(), w0.data(), int64_t(w0.size()));
  ControlMessage::Combine(w2.data(), w0.data(), int64_t(w0.size()));
  ControlMessage out;
  out.Decode(w0.data(), int64_t(w0.size()), 3);
  CHECK(out.agrees);
  CHECK(out.tune == proposal);
  CHECK(out.units_done == std::vector<uint64_t>{5});
  CHECK_EQ(out.fingerprint, uint64_t(42));
  ControlMessage quiet;
  message(none).Encode(&w1);
  quiet.Decode(w1.data(), int64_t(w1.size()), 3);
  CHECK(quiet.tune == none);
}

namespace {

Request Float(const std::string& name, const std::vector<float>& x) {
  Request r;
  r.name = name;
  r.op = OpType::kAllreduce;
  r.dtype = DataType::kFloat32;
  r.inputs = {Input(x, {int64_t(x.size())})};
  return r;
}

std::string AutotunePart(const std::string& stats) {
  const size_t at = stats.find("\"autotune\": ");
  return at == std::string::npos ? "" : stats.substr(at);
}

}  // namespace

TEST(runtimes_under_autotune_apply_the_same_values_in_the_same_cycles) {
  RuntimeOptions options;
  options.engine.tune.enabled = true;
  options.engine.tune.warmup_samples = 0;
  options.engine.tune.steps_per_sample = 2;
  options.engine.scheduler.chunk_bytes = 256;  // many units: windows of 1 to 16 all matter
  std::vector<std::string> tuned(3);
  RunRanks(options, 3, [&](int rank, Runtime& rt) {
    std::vector<float> a(1000), b(30);
    for (size_t i = 0; i < a.size(); ++i) a[i] = float((i * 7 + size_t(rank)) % 13);
    for (size_t i = 0; i < b.size(); ++i) b[i] = float(rank + 1);
    // A fixed number of steps on every rank (a rank that stopped early would leave its peers'
    // collectives unmatched); the search takes about 8 samples x 3 steps.
    for (int step = 0; step < 80; ++step) {
      auto fa = Submit(rt, Float("grad.a", a));
      auto fb = Submit(rt, Float("grad.b", b));
      Result ra = Get(fa), rb = Get(fb);
      CHECK(ra.status.ok() && rb.status.ok());
      std::vector<float> got = ra.As<float>();
      for (size_t i = 0; i < got.size(); ++i) {
        float want = 0;
        for (int r = 0; r < 3; ++r) want += float((i * 7 + size_t(r)) % 13);
        if (got[i] != want) { CHECK_EQ(got[i], want); break; }
      }
      CHECK(rb.As<float>() == std::vector<float>(30, 6.0f));
    }
    // Frozen long before: every rank ran the cycles that carried every change.
    auto last = Submit(rt, Float("last", b));
    CHECK(Get(last).status.ok());
    tuned[size_t(rank)] = AutotunePart(rt.StatsJson());
  });
  CHECK_CONTAINS(tuned[0], "\"frozen\": true");
  CHECK_CONTAINS(tuned[0], "\"applied\": [[");
  CHECK_EQ(tuned[1], tuned[0]);
  CHECK_EQ(tuned[2], tuned[0]);
}
