// The Scheduler's items (scheduler.h), for its own implementation only: a Part is one request
// (or a joined rank's stand-in), a Work one collective or several fused allreduces, a Unit one
// started chunk or piece with its sequence number.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "scheduler.h"

namespace mlsl {

// One request (or one joined rank's stand-in) inside a Work.
struct Scheduler::Part {
  int32_t id;
  std::string name;
  Request* request;  // null: joined rank
  Finish finish;
  int64_t offset;    // first element in the work's buffer
  int64_t count;     // elements (all of the request's tensors)
  std::vector<void*> outputs;
  Clock::time_point submitted, agreed;
};

// A unit of scheduling: one collective, or several fused allreduces.
struct Scheduler::Work {
  RequestMeta meta;
  Way way;  // how it runs (operations.h): chunks, or an algorithm in pieces
  uint64_t order;  // fifo key
  std::vector<Part> parts;
  bool chunked = false;  // an allreduce in chunks; else an algorithm in pieces, made on first start
  bool prepared = false;
  char* buf = nullptr;
  const char* src = nullptr;  // direct work without prescaling: the chunks read the input here
  std::vector<char> own;
  std::vector<float> res_in, res_out;  // error feedback: the parts' residuals, packed like buf
  int64_t total = 0, next = 0;  // elements
  int outstanding = 0, chunks = 0;
  Clock::time_point first_start;
  std::unique_ptr<Algorithm> algo;
  uint64_t sync_seq = 0;  // with `synced` false: the unit that must complete everywhere first
  bool synced = true;
  uint64_t last_seq = 0;  // its latest unit
  bool unfinished() const { return algo ? !algo->started_all() : next < total; }
  int64_t bytes() const { return total * int64_t(DataTypeSize(meta.dtype)); }
  std::string label() const {
    return parts.size() == 1 ? parts[0].name : "fused[" + std::to_string(parts.size()) + "] " + parts[0].name;
  }
};

struct Scheduler::Unit {
  uint64_t seq;
  std::unique_ptr<PendingOp> op;
  Work* work;
  int64_t bytes;
  int chunk;
  Clock::time_point start;
  Status error;  // the unit could not start
};

}  // namespace mlsl
