#include "options.h"

#include "settings.h"

namespace mlsl {
namespace {

DataType WireFromSettings() {
  std::string w = SettingString("MLSL_TF_WIRE_DTYPE");
  if (w == "bfloat16" || w == "bf16") return DataType::kBfloat16;
  if (w == "float16" || w == "fp16") return DataType::kFloat16;
  return DataType::kFloat32;
}

}  // namespace

RuntimeOptions RuntimeOptionsFromSettings() {
  // The values were checked by CheckSettings at init (settings.cc declares their ranges).
  RuntimeOptions o;
  EngineOptions& e = o.engine;
  e.scheduler.chunk_bytes = SettingInt("MLSL_TF_CHUNK_BYTES");
  e.scheduler.inflight = int(SettingInt("MLSL_TF_INFLIGHT"));
  e.scheduler.fusion_threshold = SettingInt("MLSL_TF_FUSION_THRESHOLD");
  e.scheduler.fifo = SettingString("MLSL_TF_PRIORITY") == "fifo";
  e.scheduler.ring_bytes = SettingInt("MLSL_TF_RING_BYTES");
  e.default_wire = WireFromSettings();
  e.stall_warning = std::chrono::seconds(SettingInt("MLSL_TF_STALL_WARNING_SECONDS"));
  e.stall_shutdown = std::chrono::seconds(SettingInt("MLSL_TF_STALL_SHUTDOWN_SECONDS"));
  e.cache_capacity = size_t(SettingInt("MLSL_TF_CACHE_CAPACITY"));
  e.eager_bytes = SettingInt("MLSL_TF_EAGER_BYTES");
  o.heartbeat = std::chrono::milliseconds(SettingInt("MLSL_TF_HEARTBEAT_MS"));
  o.spin = std::chrono::microseconds(SettingInt("MLSL_TF_SPIN_US"));
  o.mark_cycles = SettingFlag("MLSL_TF_TIMELINE_MARK_CYCLES");
  o.comm_nice = int(SettingInt("MLSL_TF_COMM_NICE"));
  o.timeline = SettingString("MLSL_TF_TIMELINE");
  o.timeline_variable = SettingSource("MLSL_TF_TIMELINE");
  TuneOptions& t = e.tune;
  t.enabled = SettingFlag("MLSL_TF_AUTOTUNE");
  t.warmup_samples = int(SettingInt("MLSL_TF_AUTOTUNE_WARMUP_SAMPLES"));
  t.steps_per_sample = int(SettingInt("MLSL_TF_AUTOTUNE_STEPS_PER_SAMPLE"));
  t.log = SettingString("MLSL_TF_AUTOTUNE_LOG");
  t.initial[kTuneInflight] = e.scheduler.inflight;
  t.initial[kTuneSpinUs] = o.spin.count();
  for (int k = 0; k < kTuneKnobs; ++k) t.fixed[k] = SettingIsSet(Tuner::Name(k));
  return o;
}

}  // namespace mlsl
