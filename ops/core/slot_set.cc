// SlotSet (slot_set.h).
#include "slot_set.h"

namespace mlsl {

Communicator* SlotSet::Get(int i) {
  if (slots_.empty()) {
    slots_.resize(size_t(count_));
    scratch_.resize(size_t(count_));
  }
  if (!slots_[i]) {
    std::vector<int> everyone(comm_->size());
    for (int r = 0; r < comm_->size(); ++r) everyone[r] = r;
    Status s = comm_->Split(everyone, &slots_[i]);
    if (!s.ok()) error_ = s;
  }
  return slots_[i].get();
}

}  // namespace mlsl
