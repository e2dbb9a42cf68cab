#include "mpi_communicator.h"

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>

#include "half.h"
#include "memory.h"
#include "mpi_checks.h"
#include "mpi_types.h"
#include "p2p_algorithms.h"
#include "reduce.h"

namespace mlsl {
namespace {

std::once_flag g_finalize_once;
int g_thread_level = MPI_THREAD_SINGLE;
std::atomic<bool> g_skip_finalize{false};

void FinalizeAtExit() {
  if (g_skip_finalize.load()) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

// One nonblocking MPI request (plus any buffers that must outlive it).
class MpiPending : public PendingOp {
 public:
  MpiPending() = default;
  MPI_Request* request() { return &request_; }
  std::vector<int>& ints() { return ints_; }
  void SetError(std::string e) { error_ = std::move(e); }
  Status Test(bool* done) override {
    if (!error_.empty()) return Status::Internal(error_);
    *done = completed_;
    if (completed_) return Status::Ok();  // tested again: the status is gone, the checks passed
    int flag = 0;
    MPI_Status status;
    int rc = MPI_Test(&request_, &flag, &status);
    if (rc != MPI_SUCCESS) return Failed(rc);
    if (!flag) return Status::Ok();
    Status s = Completed(status);
    if (!s.ok()) error_ = s.message();
    *done = completed_ = s.ok();
    return s;
  }

 protected:
  // Checks on a completed request's status (a receive's size), and the error of a failed test.
  virtual Status Completed(const MPI_Status&) { return Status::Ok(); }
  virtual Status Failed(int rc) { return Status::Internal(MpiError("MPI_Test", rc)); }

 private:
  MPI_Request request_ = MPI_REQUEST_NULL;
  std::vector<int> ints_;  // counts/displacements for the v-collectives
  std::string error_;
  bool completed_ = false;
};

std::unique_ptr<PendingOp> Checked(std::unique_ptr<MpiPending> p, int rc, const char* what) {
  if (rc != MPI_SUCCESS) p->SetError(MpiError(what, rc));
  return p;
}

// MPI counts are int: refuse (clearly) what does not fit rather than truncate.
bool FitsInt(int64_t v) { return v >= 0 && v <= 0x7fffffff; }

std::unique_ptr<PendingOp> TooLarge(const char* what) {
  auto p = std::make_unique<MpiPending>();
  p->SetError(std::string(what) + ": message larger than 2^31-1 elements is not supported");
  return p;
}

// A point-to-point message: MPI_Isend/MPI_Irecv's request, freed if the op is dropped before
// it completed (a failure elsewhere; freeing a collective's request would be erroneous).
class MpiMessage : public MpiPending {
 public:
  ~MpiMessage() override {
    if (*request() == MPI_REQUEST_NULL) return;  // completed (or never posted)
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Request_free(request());
  }
};

// A receive: MPI completes one of a shorter message than posted without complaint (the rest of
// the buffer untouched), so the count is checked here; a longer one fails MPI_Test (truncation).
class MpiReceive : public MpiMessage {
 public:
  MpiReceive(int64_t bytes, int peer) : bytes_(bytes), peer_(peer) {}

 protected:
  Status Completed(const MPI_Status& status) override {
    int got = 0;
    int rc = MPI_Get_count(&status, MPI_BYTE, &got);
    if (rc != MPI_SUCCESS) return Status::Internal(MpiError("MPI_Get_count", rc));
    if (got == bytes_) return Status::Ok();
    return Status::Internal("point-to-point receive from rank " + std::to_string(peer_) + ": expected " +
                            std::to_string(bytes_) + " bytes, the message has " + std::to_string(got));
  }
  Status Failed(int rc) override {
    int cls = 0;
    MPI_Error_class(rc, &cls);
    if (cls != MPI_ERR_TRUNCATE) return MpiMessage::Failed(rc);
    return Status::Internal("point-to-point receive from rank " + std::to_string(peer_) + ": expected " +
                            std::to_string(bytes_) + " bytes, the message is longer (" + MpiError("MPI_Test", rc) +
                            ")");
  }

 private:
  const int64_t bytes_;
  const int peer_;
};

class MpiCommunicator : public Communicator {
 public:
  explicit MpiCommunicator(MPI_Comm comm) : comm_(comm) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Comm local;
    MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local);
    MPI_Comm_rank(local, &topo_.local_rank);
    MPI_Comm_size(local, &topo_.local_size);
    MPI_Comm cross;
    MPI_Comm_split(comm_, topo_.local_rank, rank_, &cross);
    MPI_Comm_rank(cross, &topo_.cross_rank);
    MPI_Comm_size(cross, &topo_.cross_size);
    MPI_Comm_free(&local);
    MPI_Comm_free(&cross);
    int extremes[2] = {topo_.local_size, -topo_.local_size};  // the largest and smallest machine
    MPI_Allreduce(MPI_IN_PLACE, extremes, 2, MPI_INT, MPI_MAX, comm_);
    topo_.homogeneous = extremes[0] == -extremes[1];
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    for (auto& [count, type] : words_types_) MPI_Type_free(&type);
    for (auto& row : user_.ops) {
      for (int op = 0; op < 6; ++op) {  // kAverage shares kSum's handle
        if (op != int(ReduceOp::kAverage) && row[op] != MPI_OP_NULL) MPI_Op_free(&row[op]);
      }
    }
    MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Topology topology() const override { return topo_; }
  int64_t max_message_bytes() const override { return int64_t(1) << 30; }

  std::unique_ptr<PendingOp> Allreduce(void* buf, int64_t count, DataType dtype, ReduceOp op, const void* send,
                                       double scale, bool native) override {
    if (!FitsInt(count)) return TooLarge("allreduce");
    auto p = std::make_unique<MpiPending>();
    const MPI_Op mpi_op = OpFor(user_, dtype, op, native);
    // MPI's own float Sum/Product keep whichever NaN payload its order met first: canonicalize
    const bool builtin = mpi_op == BuiltinOp(dtype, op) && (dtype == DataType::kFloat32 || dtype == DataType::kFloat64);
    int rc = MPI_Iallreduce(send && send != buf ? send : MPI_IN_PLACE, buf, int(count), NativeType(dtype), mpi_op, comm_, p->request());
    return ScaledWhenDone(Checked(std::move(p), rc, "MPI_Iallreduce"), buf, count, dtype, scale, builtin);
  }
  std::unique_ptr<PendingOp> AllreduceWords(uint64_t* words, int64_t count, CombineFn combine) override {
    const MPI_Op op = WordsOpFor(combine);
    auto p = std::make_unique<MpiPending>();
    if (op == MPI_OP_NULL) {
      p->SetError("AllreduceWords: more combine functions than the " + std::to_string(kWordsSlots) + " MPI_Op slots");
      return p;
    }
    int rc = MPI_Iallreduce(MPI_IN_PLACE, words, 1, WordsType(count), op, comm_, p->request());
    return Checked(std::move(p), rc, "MPI_Iallreduce(words)");
  }
  std::unique_ptr<PendingOp> Allgatherv(const void* send, void* recv, const std::vector<int64_t>& bytes) override {
    auto p = std::make_unique<MpiPending>();
    if (!CountsAndDispls(bytes, &p->ints())) return TooLarge("allgather");
    int* counts = p->ints().data();
    int* displs = counts + size_;
    int rc = MPI_Iallgatherv(send, counts[rank_], MPI_BYTE, recv, counts, displs, MPI_BYTE, comm_, p->request());
    return Checked(std::move(p), rc, "MPI_Iallgatherv");
  }
  std::unique_ptr<PendingOp> Broadcast(void* buf, int64_t bytes, int root) override {
    if (!FitsInt(bytes)) return TooLarge("broadcast");
    auto p = std::make_unique<MpiPending>();
    int rc = MPI_Ibcast(buf, int(bytes), MPI_BYTE, root, comm_, p->request());
    return Checked(std::move(p), rc, "MPI_Ibcast");
  }
  std::unique_ptr<PendingOp> Alltoallv(const void* send, const std::vector<int64_t>& send_bytes, void* recv,
                                       const std::vector<int64_t>& recv_bytes) override {
    std::vector<int> s, r;  // refused as before the move to point-to-point: a slice or offset past int
    if (!CountsAndDispls(send_bytes, &s) || !CountsAndDispls(recv_bytes, &r)) return TooLarge("alltoall");
    return MakePointToPointAlltoallv(this, NextTag(), send, send_bytes, recv, recv_bytes);
  }
  std::unique_ptr<PendingOp> ReduceScatter(const void* send, void* recv, const std::vector<int64_t>& counts,
                                           DataType dtype, ReduceOp op) override {
    auto p = std::make_unique<MpiPending>();
    for (int64_t c : counts) if (!FitsInt(c)) return TooLarge("reducescatter");
    p->ints().assign(counts.begin(), counts.end());
    int rc = MPI_Ireduce_scatter(send, recv, p->ints().data(), NativeType(dtype), OpFor(user_, dtype, op), comm_,
                                 p->request());
    return Checked(std::move(p), rc, "MPI_Ireduce_scatter");
  }
  std::unique_ptr<PendingOp> Barrier() override {
    auto p = std::make_unique<MpiPending>();
    int rc = MPI_Ibarrier(comm_, p->request());
    return Checked(std::move(p), rc, "MPI_Ibarrier");
  }
  Status Split(const std::vector<int>& ranks, std::unique_ptr<Communicator>* out) override {
    auto at = std::find(ranks.begin(), ranks.end(), rank_);
    bool member = at != ranks.end();
    MPI_Comm sub = MPI_COMM_NULL;
    int rc = MPI_Comm_split(comm_, member ? 0 : MPI_UNDEFINED, int(at - ranks.begin()), &sub);
    if (rc != MPI_SUCCESS) return Status::Internal(MpiError("MPI_Comm_split", rc));
    out->reset();
    if (sub != MPI_COMM_NULL) {
      MPI_Comm_set_errhandler(sub, MPI_ERRORS_RETURN);
      *out = std::make_unique<MpiCommunicator>(sub);
    }
    return Status::Ok();
  }
  std::unique_ptr<PendingOp> Send(const void* buf, int64_t bytes, int peer, int tag) override {
    auto p = std::make_unique<MpiMessage>();
    if (!MessageOk("send", bytes, peer, tag, p.get())) return p;
    int rc = MPI_Isend(buf, int(bytes), MPI_BYTE, peer, tag, comm_, p->request());
    return Checked(std::move(p), rc, "MPI_Isend");
  }
  std::unique_ptr<PendingOp> Recv(void* buf, int64_t bytes, int peer, int tag) override {
    auto p = std::make_unique<MpiReceive>(bytes, peer);
    if (!MessageOk("receive", bytes, peer, tag, p.get())) return p;
    int rc = MPI_Irecv(buf, int(bytes), MPI_BYTE, peer, tag, comm_, p->request());
    return Checked(std::move(p), rc, "MPI_Irecv");
  }

 private:
  // Whether a message's arguments are valid for MPI; otherwise the reason is set on p.
  bool MessageOk(const char* what, int64_t bytes, int peer, int tag, MpiPending* p) const {
    std::string why;
    if (!FitsInt(bytes)) why = std::to_string(bytes) + " bytes (more than 2^31-1)";
    if (peer < 0 || peer >= size_) why = "peer " + std::to_string(peer) + " of " + std::to_string(size_) + " ranks";
    if (tag < 0 || tag > kMaxTag) why = "tag " + std::to_string(tag) + " outside 0.." + std::to_string(kMaxTag);
    if (!why.empty()) p->SetError(std::string("point-to-point ") + what + ": " + why);
    return why.empty();
  }
  // out = counts[size] followed by displacements[size], as MPI ints.
  bool CountsAndDispls(const std::vector<int64_t>& sizes, std::vector<int>* out) const {
    out->assign(2 * size_, 0);
    int64_t off = 0;
    for (int r = 0; r < size_; ++r) {
      if (!FitsInt(sizes[r]) || !FitsInt(off)) return false;
      (*out)[r] = int(sizes[r]);
      (*out)[size_ + r] = int(off);
      off += sizes[r];
    }
    return true;
  }

  // One contiguous type per message length (lengths change as names are learned and the eager
  // region grows or shrinks); freeing a type that an operation in flight uses is allowed.
  MPI_Datatype WordsType(int64_t count) {
    auto it = words_types_.find(count);
    if (it != words_types_.end()) return it->second;
    if (words_types_.size() >= 64) {
      for (auto& [c, type] : words_types_) MPI_Type_free(&type);
      words_types_.clear();
    }
    MPI_Datatype t;
    MPI_Type_contiguous(int(count), MPI_UINT64_T, &t);
    MPI_Type_commit(&t);
    words_types_[count] = t;
    return t;
  }

  std::map<int64_t, MPI_Datatype> words_types_;
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  Topology topo_;
  UserOps user_;
};

// The thread level and the launcher's world (mpi_checks.h), before any communication.
Status CheckWorld(bool initialised_by_us) {
  ThreadLevel level = g_thread_level == MPI_THREAD_MULTIPLE     ? ThreadLevel::kMultiple
                      : g_thread_level == MPI_THREAD_SERIALIZED ? ThreadLevel::kSerialized
                      : g_thread_level == MPI_THREAD_FUNNELED   ? ThreadLevel::kFunneled
                                                                : ThreadLevel::kSingle;
  Status s = CheckThreadLevel(level, initialised_by_us);
  if (!s.ok()) return s;
  int size = 0, len = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  char version[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
  MPI_Get_library_version(version, &len);
  std::string library(version, len);  // Open MPI counts the terminating NUL in len
  library = library.substr(0, library.find_first_of(std::string("\r\n\0", 3)));
  return CheckLauncherWorld(size, [](const char* name) { return std::getenv(name); }, library);
}

}  // namespace

Status CreateMpiCommunicator(std::unique_ptr<Communicator>* out) {
  int initialised = 0, finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return Status::FailedPrecondition("MPI has already been finalized in this process");
  MPI_Initialized(&initialised);
  if (!initialised) {
    int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &g_thread_level);
    if (rc != MPI_SUCCESS) return Status::Internal(MpiError("MPI_Init_thread", rc));
    std::call_once(g_finalize_once, [] { std::atexit(FinalizeAtExit); });
  } else {
    MPI_Query_thread(&g_thread_level);
  }
  Status world = CheckWorld(!initialised);
  if (!world.ok()) return world;
  MPI_Comm comm;
  int rc = MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  if (rc != MPI_SUCCESS) return Status::Internal(MpiError("MPI_Comm_dup", rc));
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  *out = std::make_unique<MpiCommunicator>(comm);
  return Status::Ok();
}

void SkipFinalizeAtExit() { g_skip_finalize.store(true); }

bool MpiThreadsSupported() {
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (!initialised) return false;
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);
  return level == MPI_THREAD_MULTIPLE;
}

}  // namespace mlsl
