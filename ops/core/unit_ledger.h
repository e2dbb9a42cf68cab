// UnitLedger: a scheduler's units by sequence number -- how many started, the prefix completed
// here (units complete out of order), and the prefix completed on every rank as the control
// message last said (until it says, this rank's own: one process playing every rank).
#pragma once

#include <cstdint>
#include <set>

namespace mlsl {

class UnitLedger {
 public:
  uint64_t Start() { return started_++; }  // the next unit's sequence number
  void Complete(uint64_t seq) {
    if (seq != prefix_) {
      out_of_order_.insert(seq);
      return;
    }
    ++prefix_;
    while (!out_of_order_.empty() && *out_of_order_.begin() == prefix_) {
      out_of_order_.erase(out_of_order_.begin());
      ++prefix_;
    }
  }
  void Agree(uint64_t common_done) {
    agreed_ = common_done;
    agreed_given_ = true;
  }
  uint64_t started() const { return started_; }
  uint64_t completed_prefix() const { return prefix_; }
  uint64_t agreed_done() const { return agreed_given_ ? agreed_ : prefix_; }

 private:
  uint64_t started_ = 0, prefix_ = 0, agreed_ = 0;
  bool agreed_given_ = false;
  std::set<uint64_t> out_of_order_;
};

}  // namespace mlsl
