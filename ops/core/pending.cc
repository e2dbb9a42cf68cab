// PendingTable (pending.h).
#include "pending.h"

#include <vector>

namespace mlsl {

std::deque<std::unique_ptr<Request>> PendingTable::TakeInbox() {
  std::deque<std::unique_ptr<Request>> taken;
  taken.swap(inbox_);
  return taken;
}

PendingRequest* PendingTable::Find(const std::string& name) {
  auto it = table_.find(name);
  return it == table_.end() ? nullptr : &it->second;
}

void PendingTable::Add(PendingRequest p) {
  std::string name = p.request->name;
  table_.emplace(std::move(name), std::move(p));
}

void PendingTable::Finish(const std::string& name, const Status& s) {
  auto it = table_.find(name);
  std::unique_ptr<Request> r = std::move(it->second.request);
  table_.erase(it);
  r->done(s);
}

void PendingTable::SetJoin(std::unique_ptr<Request> r, int rank) {
  if (join_) {
    r->done(Status::InvalidArgument("mlsl_tf: join is already pending on rank " + std::to_string(rank)));
    return;
  }
  join_ = std::move(r);
}

void PendingTable::FinishJoin(int last_rank) {
  if (!join_) return;
  std::unique_ptr<Request> r = std::move(join_);
  void* out = nullptr;
  Status s = r->Output(0, Shape{}, &out);
  if (s.ok() && out) *static_cast<int32_t*>(out) = last_rank;
  r->done(s);
}

void PendingTable::FailAll(StatusCode code, const std::string& reason) {
  std::vector<std::unique_ptr<Request>> failed;
  for (auto& r : inbox_) failed.push_back(std::move(r));
  inbox_.clear();
  for (auto& [name, p] : table_) failed.push_back(std::move(p.request));
  table_.clear();
  if (join_) failed.push_back(std::move(join_));
  for (auto& r : failed) {
    std::string what = r->op == OpType::kJoin ? "join" : "collective '" + ShownName(r->name) + "'";
    r->done(Status::WithCode(code, reason + " (" + what + " did not complete)"));
  }
}

}  // namespace mlsl
