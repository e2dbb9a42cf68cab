// The timeline: a file that is a complete JSON array after every write, start/stop handed to
// the background thread while collectives run, Horovod's names, errors for unwritable paths
// (at init on every rank), and the HOROVOD_TIMELINE alias of the settings table.
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <sstream>

#include "../settings.h"
#include "harness.h"

using namespace mlsl;
using namespace mlsl_test;

namespace {

std::string Read(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

std::string TempPath(const std::string& name) {
  return "/tmp/mlsl_core_timeline_" + std::to_string(getpid()) + "_" + name;
}

// The file as the core leaves it between writes: "[\n" ... "\n]\n", no comma before the end.
bool Closed(const std::string& text) {
  return text.size() > 6 && text.compare(0, 2, "[\n") == 0 && text.compare(text.size() - 3, 3, "\n]\n") == 0 &&
         text[text.size() - 4] == '}';
}

Request SmallAllreduce(const std::string& name, const std::vector<float>& x) {
  Request r;
  r.name = name;
  r.op = OpType::kAllreduce;
  r.dtype = DataType::kFloat32;
  r.reduce_op = ReduceOp::kSum;
  r.inputs = {Input(x, {int64_t(x.size())})};
  return r;
}

// Polls `path` until it holds `needle` (the background thread flushes every few ms).
bool Eventually(const std::string& path, const std::string& needle) {
  for (int i = 0; i < 500; ++i) {
    if (Read(path).find(needle) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

}  // namespace

TEST(timeline_file_is_complete_after_every_write) {
  const std::string path = TempPath("writes.json");
  Timeline t;
  CHECK_EQ(t.Open(path, 0), std::string());
  CHECK(t.enabled());
  CHECK(Closed(Read(path)));  // valid at once, before any event
  auto now = Timeline::Clock::now();
  t.Span("g", "negotiate", "negotiation", now, now + std::chrono::microseconds(5));
  t.HorovodNegotiation("g", "allreduce", now, now + std::chrono::microseconds(5));
  t.HorovodOp("g", "allreduce", now + std::chrono::microseconds(5), now + std::chrono::microseconds(7),
              now + std::chrono::microseconds(9));
  t.CycleStart(now);
  t.Flush();
  std::string text = Read(path);
  CHECK(Closed(text));
  CHECK_CONTAINS(text, "\"name\": \"NEGOTIATE_ALLREDUCE\"");
  CHECK_CONTAINS(text, "\"name\": \"ALLREDUCE\"");
  CHECK_CONTAINS(text, "\"name\": \"QUEUE\"");
  CHECK_CONTAINS(text, "\"name\": \"CYCLE_START\"");
  CHECK_CONTAINS(text, "{\"name\": \"allreduce.g\"}");  // the tensor's row, named
  CHECK_CONTAINS(text, "start_time_since_epoch_in_micros");
  t.Instant("g", "done", "queue", now);
  t.Flush();
  std::string more = Read(path);
  CHECK(Closed(more) && more.size() > text.size());
  CHECK_EQ(more.compare(0, text.size() - 3, text, 0, text.size() - 3), 0);  // appended, not rewritten
  t.Close();
  CHECK(!t.enabled());
  CHECK(Closed(Read(path)));
  unlink(path.c_str());
}

TEST(timeline_who_writes_and_unwritable_paths) {
  CHECK(Timeline::Writes("t.json", 0) && !Timeline::Writes("t.json", 1));
  CHECK(Timeline::Writes("t{rank}.json", 1) && !Timeline::Writes("", 0));
  Timeline t;
  CHECK_EQ(t.Open("/nonexistent_mlsl_dir/t.json", 1), std::string());  // rank 1 does not write it
  CHECK(!t.enabled());
  int os_error = 0;
  std::string e = t.Open("/nonexistent_mlsl_dir/t{rank}.json", 3, &os_error);
  CHECK_CONTAINS(e, "rank 3 cannot write the timeline file '/nonexistent_mlsl_dir/t3.json'");
  CHECK_EQ(os_error, ENOENT);
  CHECK(!t.enabled());
}

TEST(timeline_started_and_stopped_while_collectives_run) {
  const std::string first = TempPath("first.json"), second = TempPath("second.json");
  RunRanks(2, [&](int rank, Runtime& rt) {
    std::vector<float> x(16, float(rank + 1));
    auto before = Submit(rt, SmallAllreduce("before", x));  // not recorded: no timeline yet
    CHECK(Get(before).status.ok());
    CHECK_EQ(rt.StartTimeline(first, false), std::string());  // rank 1: nothing to write
    for (int i = 0; i < 3; ++i) {  // the second and third ride in the control message
      auto f = Submit(rt, SmallAllreduce("during", x));
      Result r = Get(f);
      CHECK(r.status.ok());
      CHECK_EQ(r.As<float>()[0], 3.0f);
    }
    if (rank == 0) {
      CHECK(Eventually(first, "\"tensor\": \"during\""));  // read while the runtime runs
      CHECK(Closed(Read(first)));
    }
    rt.StopTimeline();
    rt.StopTimeline();  // nothing to stop: no error
    auto after = Submit(rt, SmallAllreduce("after_stop", x));
    CHECK(Get(after).status.ok());
    CHECK_EQ(rt.StartTimeline(second, true), std::string());
    auto again = Submit(rt, SmallAllreduce("second", x));
    CHECK(Get(again).status.ok());
    if (rank == 0) {
      CHECK(Eventually(second, "CYCLE_START"));
      CHECK(Eventually(second, "\"tensor\": \"second\""));
      const std::string text = Read(first);
      CHECK(Closed(text));
      CHECK(text.find("after_stop") == std::string::npos && text.find("before") == std::string::npos);
      size_t n = 0;
      for (size_t at = 0; (at = text.find("\"name\": \"ALLREDUCE\"", at)) != std::string::npos; ++at) ++n;
      CHECK_EQ(n, size_t(3));
      CHECK_CONTAINS(text, "\"name\": \"NEGOTIATE_ALLREDUCE\"");
    }
  });
  CHECK(Closed(Read(second)));  // shutdown closed it
  unlink(first.c_str());
  unlink(second.c_str());
}

TEST(timeline_start_after_the_background_thread_ended_does_not_hang) {
  const std::string path = TempPath("late.json");
  auto world = std::make_shared<FakeWorld>(1);
  Runtime rt(std::make_unique<FakeCommunicator>(world, 0), RuntimeOptions());
  rt.Shutdown();
  CHECK_EQ(rt.StartTimeline(path, false), std::string());
  rt.StopTimeline();
  CHECK(Closed(Read(path)));
  unlink(path.c_str());
}

TEST(timeline_at_init_fails_on_every_rank) {
  Env env({{"HOROVOD_TIMELINE", "/nonexistent_mlsl_dir/t{rank}.json"}});
  auto world = std::make_shared<FakeWorld>(3);
  std::vector<std::string> errors(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      FakeCommunicator comm(world, r);
      Timeline t;
      errors[r] = OpenTimelineAtInit(&comm, &t, RuntimeOptionsFromSettings()).message();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 3; ++r) {
    CHECK_EQ(errors[r], errors[0]);
    CHECK_CONTAINS(errors[r], "rank 0 cannot write the timeline file '/nonexistent_mlsl_dir/t0.json'");
    CHECK_CONTAINS(errors[r], "(HOROVOD_TIMELINE=/nonexistent_mlsl_dir/t{rank}.json) (and 2 other ranks)");
  }
}

TEST(timeline_settings_alias) {
  {
    Env env({{"HOROVOD_TIMELINE", "/h.json"}, {"HOROVOD_TIMELINE_MARK_CYCLES", "yes"}});
    CHECK_EQ(SettingString("MLSL_TF_TIMELINE"), std::string("/h.json"));
    CHECK_EQ(SettingSource("MLSL_TF_TIMELINE"), std::string("HOROVOD_TIMELINE"));
    CHECK(SettingFlag("MLSL_TF_TIMELINE_MARK_CYCLES"));
    CHECK_EQ(CheckSettings(), std::string());
  }
  {
    Env env({{"MLSL_TF_TIMELINE", "/m.json"}, {"HOROVOD_TIMELINE", "/m.json"},
             {"MLSL_TF_TIMELINE_MARK_CYCLES", "1"}, {"HOROVOD_TIMELINE_MARK_CYCLES", "0"}});
    CHECK_EQ(SettingSource("MLSL_TF_TIMELINE"), std::string("MLSL_TF_TIMELINE"));
    CHECK_EQ(CheckSettings(), std::string("MLSL_TF_TIMELINE_MARK_CYCLES=1 and HOROVOD_TIMELINE_MARK_CYCLES=0 "
                                          "disagree: HOROVOD_TIMELINE_MARK_CYCLES is another name for "
                                          "MLSL_TF_TIMELINE_MARK_CYCLES; set one of them (or both to the same value)"));
  }
  CHECK(!SettingFlag("MLSL_TF_TIMELINE_MARK_CYCLES"));
}
