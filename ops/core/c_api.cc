#include "c_api.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <mutex>
#include <string>

#include "mpi_communicator.h"
#include "runtime.h"
#include "settings.h"

namespace mlsl {
namespace {

// The one handle. Leaked on purpose: no static destructor may run after MPI_Finalize.
struct Handle {
  std::mutex mu;
  std::shared_ptr<Runtime> runtime;
};
Handle& TheHandle() {
  static Handle* h = new Handle;
  return *h;
}

thread_local std::string t_last_error;
thread_local StatusCode t_last_code = StatusCode::kOk;

int Fail(const std::string& message, StatusCode code = StatusCode::kFailedPrecondition) {
  t_last_error = message;
  t_last_code = code;
  return -1;
}

void ShutdownAtExit() { mlsl_tf_shutdown(); }

int Query(int (*get)(const Runtime&)) {
  auto rt = CurrentRuntime();
  if (!rt) return Fail("mlsl_tf has not been initialised: call mlsl_tf.init() first");
  return get(*rt);
}

// Compares the settings that shape the collectives (settings.h: `agreed`) across ranks: with
// different values ranks would start different MPI operations and hang. Every rank gathers
// every rank's values, so every rank fails with the same message, naming setting and values.
// `extra`: more "NAME=value\n" lines to compare.
Status AgreeOnSettings(Communicator* comm, const std::string& extra) {
  const std::string mine = AgreedSettings() + extra;
  const int n = comm->size();
  std::vector<int64_t> lengths;
  std::string all;
  Status s = AllgatherStrings(comm, mine, &lengths, &all);
  if (!s.ok()) return s;
  std::vector<std::vector<std::string>> lines(n);  // per rank, "NAME=value"
  int64_t at = 0;
  for (int r = 0; r < n; ++r) {
    const std::string text = all.substr(size_t(at), size_t(lengths[r]));
    at += lengths[r];
    for (size_t from = 0, nl; (nl = text.find('\n', from)) != std::string::npos; from = nl + 1) {
      lines[r].push_back(text.substr(from, nl - from));
    }
  }
  std::string error;
  for (size_t i = 0; i < lines[0].size(); ++i) {
    bool same = true;
    for (int r = 1; r < n; ++r) same = same && i < lines[r].size() && lines[r][i] == lines[0][i];
    if (same) continue;
    const std::string name = lines[0][i].substr(0, lines[0][i].find('='));
    error += "mlsl_tf: " + name + " must be the same on every rank (it shapes the collectives every rank starts):";
    for (int r = 0; r < n && r < 16; ++r) {
      const std::string& line = i < lines[r].size() ? lines[r][i] : std::string("?=?");
      error += " rank " + std::to_string(r) + " has " + line.substr(line.find('=') + 1) + (r + 1 < n ? "," : "");
    }
    if (n > 16) error += " ...";
    error += "\n";
  }
  if (!error.empty()) error.pop_back();
  return error.empty() ? Status::Ok() : Status::InvalidArgument(error);
}

// Under autotune, the knobs the environment sets (never tuned) as a line for AgreeOnSettings:
// rank 0 decides what is tuned, so every rank must mean the same.
std::string AutotuneFixed(const TuneOptions& tune) {
  if (!tune.enabled) return "";
  std::string names;
  for (int k = 0; k < kTuneKnobs; ++k) if (tune.fixed[k]) names += (names.empty() ? "" : " ") + std::string(Tuner::Name(k));
  return "MLSL_TF_AUTOTUNE's settings set in the environment (not tuned)=" + (names.empty() ? "none" : names) + "\n";
}

// Rank 0 starts the autotune log (its CSV header); a file it cannot write fails init on every rank.
Status StartAutotuneLog(Communicator* comm, const TuneOptions& tune) {
  std::string mine;
  if (comm->rank() == 0 && tune.enabled && !tune.log.empty()) {
    std::FILE* f = std::fopen(tune.log.c_str(), "w");
    const int error = f ? 0 : errno;
    const std::string header = Tuner::LogHeader();
    if (!f || std::fwrite(header.data(), 1, header.size(), f) != header.size()) {
      mine = "mlsl_tf: rank 0 cannot write the autotune log " + tune.log + " (" + SettingSource("MLSL_TF_AUTOTUNE_LOG") +
             "): " + std::strerror(error ? error : EIO);
    }
    if (f && std::fclose(f) != 0 && mine.empty()) mine = "mlsl_tf: rank 0 cannot write the autotune log " + tune.log;
  }
  std::vector<int64_t> lengths;
  std::string all;
  Status s = AllgatherStrings(comm, mine, &lengths, &all);
  if (!s.ok()) return s;
  return all.empty() ? Status::Ok() : Status::InvalidArgument(all);
}

// Submits an add_group / remove_group request and waits for it (it needs every rank).
int ChangeGroups(OpType op, std::vector<int> ranks, int id) {
  auto rt = CurrentRuntime();
  if (!rt) return Fail("mlsl_tf has not been initialised: call mlsl_tf.init() first");
  auto r = std::make_unique<Request>(rt->GroupChange(op, std::move(ranks), id));
  auto result = std::make_shared<int32_t>(-1);
  auto status = std::make_shared<std::promise<Status>>();
  std::future<Status> finished = status->get_future();
  r->allocate_output = [result](int, const Shape&, void** data) {
    *data = result.get();
    return Status::Ok();
  };
  r->done = [status](const Status& s) { status->set_value(s); };
  rt->Submit(std::move(r));
  Status s = finished.get();
  if (!s.ok()) return Fail(s.message(), s.code());
  return *result;
}

}  // namespace

std::shared_ptr<Runtime> CurrentRuntime() {
  Handle& h = TheHandle();
  std::lock_guard<std::mutex> lock(h.mu);
  return h.runtime;
}

}  // namespace mlsl

using mlsl::Runtime;

extern "C" int mlsl_tf_init(void) {
  mlsl::Handle& h = mlsl::TheHandle();
  std::lock_guard<std::mutex> lock(h.mu);
  if (h.runtime) return 0;  // init twice is harmless
  std::string bad = mlsl::CheckSettings();
  if (!bad.empty()) return mlsl::Fail(bad);
  // The one reading of the settings: every object below takes its values from these options.
  const mlsl::RuntimeOptions options = mlsl::RuntimeOptionsFromSettings();
  std::unique_ptr<mlsl::Communicator> comm;
  mlsl::Status s = mlsl::CreateMpiCommunicator(&comm);
  if (!s.ok()) return mlsl::Fail(s.message());
  s = mlsl::AgreeOnSettings(comm.get(), mlsl::AutotuneFixed(options.engine.tune));
  if (!s.ok()) return mlsl::Fail(s.message());
  s = mlsl::StartAutotuneLog(comm.get(), options.engine.tune);
  if (!s.ok()) return mlsl::Fail(s.message());
  auto timeline = std::make_unique<mlsl::Timeline>();
  s = mlsl::OpenTimelineAtInit(comm.get(), timeline.get(), options);
  if (!s.ok()) return mlsl::Fail(s.message());
  static std::once_flag at_exit;
  // Registered after MPI's finaliser, so it runs before it.
  std::call_once(at_exit, [] { std::atexit(mlsl::ShutdownAtExit); });
  h.runtime = std::make_shared<Runtime>(std::move(comm), options, std::move(timeline));
  return 0;
}

extern "C" int mlsl_tf_shutdown(void) {
  std::shared_ptr<Runtime> rt;
  {
    mlsl::Handle& h = mlsl::TheHandle();
    std::lock_guard<std::mutex> lock(h.mu);
    rt.swap(h.runtime);
  }
  if (rt) rt->Shutdown();
  return 0;
}

extern "C" int mlsl_tf_is_initialized(void) { return mlsl::CurrentRuntime() ? 1 : 0; }
extern "C" int mlsl_tf_rank(void) { return mlsl::Query([](const Runtime& r) { return r.rank(); }); }
extern "C" int mlsl_tf_size(void) { return mlsl::Query([](const Runtime& r) { return r.size(); }); }
extern "C" int mlsl_tf_local_rank(void) { return mlsl::Query([](const Runtime& r) { return r.topology().local_rank; }); }
extern "C" int mlsl_tf_local_size(void) { return mlsl::Query([](const Runtime& r) { return r.topology().local_size; }); }
extern "C" int mlsl_tf_cross_rank(void) { return mlsl::Query([](const Runtime& r) { return r.topology().cross_rank; }); }
extern "C" int mlsl_tf_cross_size(void) { return mlsl::Query([](const Runtime& r) { return r.topology().cross_size; }); }
extern "C" int mlsl_tf_is_homogeneous(void) {
  return mlsl::Query([](const Runtime& r) { return r.topology().homogeneous ? 1 : 0; });
}
extern "C" int mlsl_tf_mpi_threads_supported(void) { return mlsl::MpiThreadsSupported() ? 1 : 0; }
extern "C" int mlsl_tf_exit_failing(void) {
  mlsl::SkipFinalizeAtExit();
  return 0;
}
extern "C" const char* mlsl_tf_last_error(void) { return mlsl::t_last_error.c_str(); }
extern "C" int mlsl_tf_last_error_code(void) { return int(mlsl::t_last_code); }

extern "C" const char* mlsl_tf_stats_json(void) {
  static thread_local std::string json;
  auto rt = mlsl::CurrentRuntime();
  if (!rt) {
    mlsl::Fail("mlsl_tf has not been initialised: call mlsl_tf.init() first");
    return nullptr;
  }
  json = rt->StatsJson();
  return json.c_str();
}

extern "C" int mlsl_tf_parked(void) {
  auto rt = mlsl::CurrentRuntime();
  return rt ? int(rt->results()->size()) : 0;
}

extern "C" int mlsl_tf_start_timeline(const char* path, int mark_cycles, int* os_error) {
  auto rt = mlsl::CurrentRuntime();
  if (!rt) return mlsl::Fail("mlsl_tf has not been initialised: call mlsl_tf.init() first");
  int error_number = 0;
  std::string error = rt->StartTimeline(path ? path : "", mark_cycles != 0, &error_number);
  if (os_error) *os_error = error_number;
  if (!error.empty()) {
    mlsl::Fail(error);
    return -2;
  }
  return 0;
}

extern "C" int mlsl_tf_pin_background_thread(int core) {
  auto rt = mlsl::CurrentRuntime();
  if (!rt) return mlsl::Fail("mlsl_tf has not been initialised: call mlsl_tf.init() first");
  mlsl::Status s = rt->PinBackgroundThread(core);
  return s.ok() ? 0 : mlsl::Fail(s.message(), s.code());
}

extern "C" int mlsl_tf_stop_timeline(void) {
  auto rt = mlsl::CurrentRuntime();
  if (!rt) return mlsl::Fail("mlsl_tf has not been initialised: call mlsl_tf.init() first");
  rt->StopTimeline();
  return 0;
}

extern "C" int mlsl_tf_setting_count(void) { return int(mlsl::AllSettings().size()); }
extern "C" const char* mlsl_tf_setting_name(int i) { return mlsl::AllSettings().at(i).name; }
extern "C" const char* mlsl_tf_setting_default(int i) { return mlsl::AllSettings().at(i).default_value; }
extern "C" const char* mlsl_tf_setting_doc(int i) { return mlsl::AllSettings().at(i).doc; }
extern "C" const char* mlsl_tf_setting_allowed(int i) {
  static thread_local std::string text;
  text = mlsl::Allowed(mlsl::AllSettings().at(i));
  return text.c_str();
}

extern "C" const char* mlsl_tf_setting_alias(int i) { return mlsl::AllSettings().at(i).alias; }

extern "C" int mlsl_tf_add_group(const int* ranks, int n) {
  if (n < 0 || (n > 0 && !ranks)) return mlsl::Fail("mlsl_tf_add_group: invalid rank list");
  return mlsl::ChangeGroups(mlsl::OpType::kAddGroup, std::vector<int>(ranks, ranks + n), 0);
}

extern "C" int mlsl_tf_remove_group(int id) {
  int rc = mlsl::ChangeGroups(mlsl::OpType::kRemoveGroup, {}, id);
  return rc < 0 ? -1 : 0;
}
