// PendingTable: this rank's requests between Submit and their end -- the inbox of those no cycle
// has taken yet, the table by name with each one's negotiation state, and a pending join. Each
// request leaves exactly once, through Finish, FinishJoin or FailAll.
#pragma once

#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <string>

#include "meta.h"
#include "request.h"
#include "status.h"

namespace mlsl {

struct PendingRequest {
  using Clock = std::chrono::steady_clock;
  std::unique_ptr<Request> request;
  RequestMeta meta;
  enum State { kToAnnounce, kAnnounced, kReady, kScheduled } state = kToAnnounce;
  int32_t id = -1;             // the agreed id (kReady, kScheduled)
  Clock::time_point submitted;
  Clock::time_point warned{};  // last stall warning about it
};

class PendingTable {
 public:
  using Table = std::map<std::string, PendingRequest>;

  void Push(std::unique_ptr<Request> r) { inbox_.push_back(std::move(r)); }
  std::deque<std::unique_ptr<Request>> TakeInbox();
  bool has_inbox() const { return !inbox_.empty(); }

  bool empty() const { return table_.empty(); }
  bool Has(const std::string& name) const { return table_.count(name) > 0; }
  PendingRequest* Find(const std::string& name);
  void Add(PendingRequest p);  // under p.request->name, which no pending request has
  Table& table() { return table_; }
  const Table& table() const { return table_; }
  // Ends `name`'s request with `s` and forgets it.
  void Finish(const std::string& name, const Status& s);

  bool joining() const { return join_ != nullptr; }
  // Takes r as this rank's join; refuses it (r's done runs) when one is already pending.
  void SetJoin(std::unique_ptr<Request> r, int rank);
  // Ends the join with the last rank that joined as its output.
  void FinishJoin(int last_rank);

  // Ends every request (inbox, table, join) with `code`: reason + " (<what> did not complete)".
  void FailAll(StatusCode code, const std::string& reason);

 private:
  std::deque<std::unique_ptr<Request>> inbox_;
  Table table_;
  std::unique_ptr<Request> join_;
};

}  // namespace mlsl
