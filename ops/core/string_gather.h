// StringGather: every rank's string, concatenated in rank order, as an exchange that its owner
// starts and then tests until done (two allgathers: the lengths, then the bytes) -- the
// non-blocking form of AllgatherStrings (communicator.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "communicator.h"

namespace mlsl {

class StringGather {
 public:
  // Starts gathering `mine` over comm; collective: every rank starts it at the same point.
  void Start(Communicator* comm, std::string mine);
  // Makes progress; sets *done once all() and sizes() hold every rank's string. A non-ok
  // Status is final.
  Status Test(bool* done);
  bool active() const { return stage_ != kIdle; }
  // Each rank's length, and every rank's string in rank order.
  const std::vector<int64_t>& sizes() const { return sizes_; }
  const std::string& all() const { return all_; }

 private:
  enum Stage { kIdle, kLengths, kBytes };
  Communicator* comm_ = nullptr;
  std::string mine_;
  int64_t my_size_ = 0;
  std::vector<int64_t> sizes_;
  std::string all_;
  std::unique_ptr<PendingOp> op_;
  Stage stage_ = kIdle;
};

}  // namespace mlsl
