#include "string_gather.h"

namespace mlsl {

void StringGather::Start(Communicator* comm, std::string mine) {
  comm_ = comm;
  mine_ = std::move(mine);
  my_size_ = int64_t(mine_.size());
  const int n = comm->size();
  sizes_.assign(n, 0);
  all_.clear();
  op_ = comm->Allgatherv(&my_size_, sizes_.data(), std::vector<int64_t>(n, int64_t(sizeof(int64_t))));
  stage_ = kLengths;
}

Status StringGather::Test(bool* done) {
  *done = false;
  while (stage_ != kIdle) {
    bool finished = false;
    Status s = op_->Test(&finished);
    if (!s.ok()) {
      op_.reset();
      stage_ = kIdle;
      return s;
    }
    if (!finished) return Status::Ok();
    if (stage_ == kBytes) {
      op_.reset();
      stage_ = kIdle;
      *done = true;
      return Status::Ok();
    }
    int64_t total = 0;
    for (int64_t v : sizes_) total += v;
    all_.assign(size_t(total), '\0');
    op_ = comm_->Allgatherv(mine_.data(), all_.data(), sizes_);
    stage_ = kBytes;
  }
  return Status::Ok();
}

}  // namespace mlsl
