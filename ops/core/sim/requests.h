// The simulator's requests mode: a fixed set of allreduces submitted to the core's engine on
// virtual time (SimBackgroundThread), each at its time from the round's start, `rounds` times,
// each round once the last completed; reports when each one completed -- the order a real job of the same ranks should
// see (tests/mpi/test_sim_order.py compares them).
#pragma once

#include <string>
#include <vector>

#include "training.h"

namespace mlsl {

struct SimCompletion {
  int round = 0;
  std::string name;
  double done_s = 0;  // from the round's submission
};

// config.requests (at least one), config.rounds; false with *error when it cannot finish.
bool RunRequests(const SimConfig& config, std::vector<SimCompletion>* done, std::string* error);

}  // namespace mlsl
