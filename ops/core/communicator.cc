#include "communicator.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "reduce.h"
#include "wait_ladder.h"

namespace mlsl {

namespace {

class Scaled : public PendingOp {
 public:
  Scaled(std::unique_ptr<PendingOp> op, void* buf, int64_t count, DataType dtype, double scale, bool canonicalize)
      : op_(std::move(op)), buf_(buf), count_(count), dtype_(dtype), scale_(scale), canonicalize_(canonicalize) {}
  Status Test(bool* done) override {
    if (finished_) {
      *done = true;
      return Status::Ok();
    }
    Status s = op_->Test(done);
    if (s.ok() && *done) {
      // right after the data arrived: still in cache
      if (canonicalize_) {
        CanonicalizeAndScale(buf_, count_, dtype_, scale_);
      } else {
        ScaleInPlace(buf_, count_, dtype_, scale_);
      }
      finished_ = true;
    }
    return s;
  }

 private:
  std::unique_ptr<PendingOp> op_;
  void* buf_;
  int64_t count_;
  DataType dtype_;
  double scale_;
  bool canonicalize_;
  bool finished_ = false;
};

}  // namespace

std::unique_ptr<PendingOp> ScaledWhenDone(std::unique_ptr<PendingOp> op, void* buf, int64_t count, DataType dtype,
                                          double scale, bool canonicalize) {
  if (scale == 1.0 && !canonicalize) return op;
  return std::make_unique<Scaled>(std::move(op), buf, count, dtype, scale, canonicalize);
}

Status AllgatherStrings(Communicator* comm, const std::string& mine, std::vector<int64_t>* sizes, std::string* all) {
  const int n = comm->size();
  sizes->assign(n, 0);
  const int64_t my_size = int64_t(mine.size());
  auto op = comm->Allgatherv(&my_size, sizes->data(), std::vector<int64_t>(n, int64_t(sizeof(int64_t))));
  Status s = Wait(op.get());
  if (!s.ok()) return s;
  int64_t total = 0;
  for (int64_t v : *sizes) total += v;
  all->assign(size_t(total), '\0');
  op = comm->Allgatherv(mine.data(), all->data(), *sizes);
  return Wait(op.get());
}

int TagSequence::Next() { return tag_ = tag_ % Communicator::kMaxTag + 1; }

Status Wait(PendingOp* op, const std::function<bool()>& between_tests) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  for (int spins = 0;; ++spins) {
    bool done = false;
    Status s = op->Test(&done);
    if (!s.ok() || done) return s;
    const bool busy = between_tests && between_tests();
    const auto pause = WaitLadder::Pause(spins, WaitLadder::Waited(spins, start, Clock::now), busy);
    if (pause.count() > 0) {
      std::this_thread::sleep_for(pause);
    } else if (WaitLadder::Yields(spins)) {
      std::this_thread::yield();
    }
  }
}

}  // namespace mlsl
