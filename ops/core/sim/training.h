// Simulated data-parallel training: plays forward and backward passes of a model's layers on
// the virtual clock of a SimNetwork and hands each layer's gradients, the moment its backward
// pass ends, to the real Scheduler (ops/core/scheduler.cc) over a SimCommunicator, through a
// model of the Runtime's background cycle; reports the steady-state step time.
//
// Why the Scheduler and not the Runtime: the Runtime's background thread waits on real time
// (condition variables, sleeps) and cannot be stepped by a virtual clock without rewriting it.
// Every scheduling decision -- order by (priority, id) or agreement, fusion, chunking,
// preemption between chunks, the window of units in flight -- is the Scheduler's, and is used
// here unchanged. What the Runtime adds is when the Scheduler is called, and that is modelled
// as Runtime::Cycle does it (see RunTraining in training.cc): one control allreduce per cycle,
// cycles back to back while there is work, requests submitted during a cycle agreed at the end
// of the next, new units started only at the end of a cycle, up to the units completed when
// that cycle began plus the in-flight window; with transfers in flight and nothing submitted,
// the cycle waits the Pacer's poll interval first. Names are taken as already negotiated
// (the first step's announcement is not simulated; steps before `warmup` are not measured).
#pragma once

#include <cstdint>
#include <istream>
#include <string>
#include <vector>

#include "../scheduler.h"
#include "../sim_communicator.h"

namespace mlsl {

struct SimLayer {
  std::string name;
  double fwd = 0, bwd = 0;      // s of compute per step
  std::vector<int64_t> grads;   // bytes of each float32 gradient tensor
};

struct SimConfig {
  SimFabric fabric;
  SchedulerOptions scheduler{1 << 20, 4, 1 << 20, false, nullptr};
  bool cross_iteration = true;  // the next forward of layer i waits only for layer i's gradients
  bool bf16 = false;            // gradients travel as bfloat16 (the real wire path: all-to-all + allgather)
  double cycle_s = 0;           // least time between two control cycles (Horovod's cycle time)
  double interference = 0;      // compute runs 1 + this times slower while the link carries data
  double contention = 0;        // the link runs 1 + this times slower while compute runs
  // The bf16 codec is CPU work of the background thread (SimCost::cpu): compute runs 1 + this
  // times slower while it runs, and it 1 + codec_contention times slower while compute runs.
  // 0 and 0: a core of its own; 1 and 1: the two split the same cores evenly.
  double codec_interference = 0;
  double codec_contention = 0;
  int steps = 6, warmup = 2;    // steps played; steps before `warmup` are not measured
  std::string timeline;         // Chrome-trace of the scheduler on virtual time ("" = none)
  std::string label;            // echoed in the result
  std::vector<SimLayer> layers;
};

struct SimResult {
  double step = 0;           // s per step, steady state
  double compute = 0;        // s of compute per step
  double efficiency = 0;     // compute / step
  double exposed = 0;        // step - compute: computation waiting for communication
  double first_exposed = 0;  // from the end of backprop to the next step's first forward layer
  double link_busy = 0;      // s per step the link carried data
  int64_t bytes = 0;         // gradient bytes per step (float32)
  int64_t cycles = 0;        // control cycles per step
  std::string stats;         // the scheduler's counters (Stats::Json)
};

// Reads "key value" lines and "layer NAME FWD_S BWD_S [BYTES ...]" lines ('#' comments);
// `layers`: at least one layer is required.
bool ParseConfig(std::istream& in, SimConfig* config, std::string* error, bool layers = true);
// Plays config.steps steps; false with *error when the simulation cannot finish.
bool RunTraining(const SimConfig& config, SimResult* result, std::string* error);
// One JSON object: the inputs that matter and the result.
std::string ResultJson(const SimConfig& config, const SimResult& result);

}  // namespace mlsl
