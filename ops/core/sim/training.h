// Simulated data-parallel training: plays forward and backward passes of a model's layers on
// the virtual clock of a SimNetwork and hands each layer's gradients, the moment its backward
// pass ends, to the real Engine (engine.h) over a SimCommunicator, stepped as the Runtime steps
// it (SimBackgroundThread, background_thread.h); reports the steady-state step time. The
// cycle, negotiation, eager path, scheduling, fusion, chunking and pacing are the core's own
// code: only the compute, the network and the background thread's clock are simulated. One
// process stands for every rank (the ranks are identical: SimCommunicator), so what is agreed
// is what this rank submits; steps before `warmup` (the first announces every name) are not
// measured.
#pragma once

#include <cstdint>
#include <istream>
#include <string>
#include <vector>

#include "../options.h"
#include "../sim_communicator.h"

namespace mlsl {

struct SimLayer {
  std::string name;
  double fwd = 0, bwd = 0;      // s of compute per step
  std::vector<int64_t> grads;   // bytes of each float32 gradient tensor
};

// A collective of the requests mode (requests.h): an allreduce of `bytes` of float32.
struct SimRequest {
  std::string name;
  int64_t bytes = 0;
  int priority = 0;
  double at_s = 0;  // submitted this long after the round began
};

struct SimConfig {
  SimFabric fabric;
  RuntimeOptions runtime;       // the settings table's defaults; the keys below override some
  bool cross_iteration = true;  // the next forward of layer i waits only for layer i's gradients
  bool bf16 = false;            // gradients travel as bfloat16 (the real wire path: all-to-all + allgather)
  double cycle_s = 0;           // least time between the starts of two cycles (Horovod's cycle time; 0: none)
  double interference = 0;      // compute runs 1 + this times slower while the link carries data
  double contention = 0;        // the link runs 1 + this times slower while compute runs
  // The bf16 codec is CPU work of the background thread (SimCost::cpu): compute runs 1 + this
  // times slower while it runs, and it 1 + codec_contention times slower while compute runs.
  // 0 and 0: a core of its own; 1 and 1: the two split the same cores evenly.
  double codec_interference = 0;
  double codec_contention = 0;
  int steps = 6, warmup = 2;    // steps played; steps before `warmup` are not measured
  // Step-time variance (synchronous SGD: a step goes at the pace of its slowest rank). Each of
  // fabric.ranks ranks computes step s in its nominal time (the layers' fwd + bwd) times a factor
  // drawn from a lognormal of mean 1 whose log has this standard deviation, independently per
  // rank and step; the simulated rank computes step s at the largest of the ranks' factors,
  // so its gradients reach the collectives when the slowest rank's would. 0: no variance.
  double variance = 0;
  uint64_t seed = 1;            // of the draws (mt19937_64): equal seeds, equal results
  std::string timeline;         // Chrome-trace of the scheduler on virtual time ("" = none)
  std::string label;            // echoed in the result
  std::vector<SimLayer> layers;
  std::vector<SimRequest> requests;  // "request NAME BYTES PRIORITY [AT_S]" lines (requests.h)
  int rounds = 2;                    // times the requests are submitted, each once the last completed
};

struct SimResult {
  double step = 0;           // s per step, steady state
  double compute = 0;        // s of compute per step (nominal: the mean rank's)
  double slowest = 1;        // the slowest rank's factor (SimConfig::variance), mean over measured steps
  double efficiency = 0;     // compute / step (nominal compute: variance lowers it)
  double exposed = 0;        // step - compute: computation waiting for communication
  double first_exposed = 0;  // from the end of backprop to the next step's first forward layer
  double link_busy = 0;      // s per step the link carried data
  int64_t bytes = 0;         // gradient bytes per step (float32)
  int64_t cycles = 0;        // control cycles per step
  std::string stats;         // the scheduler's counters (Stats::Json)
};

// Reads "key value" lines (fabric: ranks ... thread_progress; engine: chunk_bytes, inflight,
// fusion_threshold, fifo, eager_bytes, heartbeat_ms; the rest of SimConfig) and "layer NAME FWD_S BWD_S [BYTES ...]" lines ('#' comments);
// `layers`: at least one layer is required. Also "request NAME BYTES PRIORITY [AT_S]" lines.
bool ParseConfig(std::istream& in, SimConfig* config, std::string* error, bool layers = true);
// Plays config.steps steps; false with *error when the simulation cannot finish.
bool RunTraining(const SimConfig& config, SimResult* result, std::string* error);
// One JSON object: the inputs that matter and the result.
std::string ResultJson(const SimConfig& config, const SimResult& result);

}  // namespace mlsl
