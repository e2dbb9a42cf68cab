// The core's configuration as values: one RuntimeOptions built once at init from the settings
// table (settings.h, the only reader of the environment) and handed down to the Runtime, its
// Engine and Schedulers; tests and the simulator build them directly.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "scheduler.h"
#include "tuner.h"
#include "types.h"

namespace mlsl {

// What the Engine (engine.h) takes; the defaults are the settings table's.
struct EngineOptions {
  SchedulerOptions scheduler{int64_t(1) << 20, 4, int64_t(1) << 20, false};
  DataType default_wire = DataType::kFloat32;        // MLSL_TF_WIRE_DTYPE, for float32 reductions
  std::chrono::seconds stall_warning{60};            // MLSL_TF_STALL_WARNING_SECONDS (0: never)
  std::chrono::seconds stall_shutdown{0};            // MLSL_TF_STALL_SHUTDOWN_SECONDS (0: never)
  size_t cache_capacity = 4096;                      // MLSL_TF_CACHE_CAPACITY
  int64_t eager_bytes = 8192;                        // MLSL_TF_EAGER_BYTES (0: none)
  // MLSL_TF_AUTOTUNE and its settings; the Engine takes the tuned knobs' starting values from
  // scheduler.inflight and the Runtime's spin.
  TuneOptions tune;
};

// What the Runtime (runtime.h) takes: the engine's, and the policy of its background thread.
struct RuntimeOptions {
  EngineOptions engine;
  std::chrono::milliseconds heartbeat{10};  // MLSL_TF_HEARTBEAT_MS: the idle thread's sleep
  std::chrono::microseconds spin{200};      // MLSL_TF_SPIN_US: polling after progress
  bool mark_cycles = false;                 // MLSL_TF_TIMELINE_MARK_CYCLES
  int comm_nice = 0;                        // MLSL_TF_COMM_NICE
  // Taken at init, before the Runtime exists:
  std::string timeline;                              // MLSL_TF_TIMELINE ("" or "DYNAMIC": none)
  std::string timeline_variable = "MLSL_TF_TIMELINE";  // ... or the alias it was read from
};

// Every option from the settings (the environment or the table's defaults), checked at init by
// CheckSettings: called once, by init (c_api.cc); the core's objects take the values.
RuntimeOptions RuntimeOptionsFromSettings();

}  // namespace mlsl
