// Executor: nothing any more. Every agreed collective runs in pieces (algorithm.h) or chunks
// (scheduler.h) and nothing executes whole. This empty stand-in remains only because
// runtime.cc and sim/training.cc still make one and hand it to the Scheduler, which ignores it;
// delete this file with those lines and the Scheduler's transitional constructor.
#pragma once

namespace mlsl {

class Communicator;

class Executor {
 public:
  explicit Executor(Communicator*) {}
};

}  // namespace mlsl
