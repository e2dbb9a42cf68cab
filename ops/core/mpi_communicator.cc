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

std::string MpiError(const char* what, int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  return std::string("MPI ") + what + " failed: " + std::string(text, len);
}

MPI_Datatype NativeType(DataType t) {
  switch (t) {
    case DataType::kUint8: return MPI_UINT8_T;
    case DataType::kInt8: return MPI_INT8_T;
    case DataType::kInt32: return MPI_INT32_T;
    case DataType::kInt64: return MPI_INT64_T;
    case DataType::kFloat32: return MPI_FLOAT;
    case DataType::kFloat64: return MPI_DOUBLE;
    case DataType::kFloat16: case DataType::kBfloat16: return MPI_UINT16_T;
    case DataType::kBool: return MPI_UINT8_T;
    case DataType::kUint16: return MPI_UINT16_T;
    case DataType::kInt16: return MPI_INT16_T;
  }
  return MPI_BYTE;
}

// Reductions on one host are user-defined MPI operations that forward to the core's kernels:
// MPI cannot reduce float16, bfloat16 or bool, and MPICH's built-in float sums are scalar loops
// (most of a large shared-memory allreduce's time) where the core's kernels are vectorised.
// Across hosts the built-in operation is used wherever MPI has one: MPICH's MPI_Iallreduce
// picks recursive doubling for every operation that is not built in, which sends log2(p)
// times the message per rank instead of reduce-scatter + allgather's 2(p-1)/p (measured with
// mpi4py, 16 MiB, 4 ranks on one 1 Gbit/s link: 1.08 s user-defined vs 0.81 s built in), and
// on a network the bytes, not the sum loop, are the cost.
// AllreduceWords's words travel as one element of a contiguous type (WordsType), so MPI hands
// the operation the whole message and never a piece of it (e.g. the control message's eager
// region is not element-wise). An MPI_Op callback gets no user pointer, so each combine function
// gets a slot of its own: a callback instantiated per slot calls the function stored there, and
// the slot's MPI_Op is created once, on the function's first use.
constexpr int kWordsSlots = 8;
std::atomic<CombineFn> g_words_fns[kWordsSlots];

template <int I>
void WordsOp(void* in, void* inout, int* len, MPI_Datatype* type) {
  int bytes = 0;
  MPI_Type_size(*type, &bytes);
  g_words_fns[I].load()(static_cast<const uint64_t*>(in), static_cast<uint64_t*>(inout), int64_t(*len) * bytes / 8);
}

// The MPI_Op that combines by `fn`; MPI_OP_NULL when every slot holds another function.
MPI_Op WordsOpFor(CombineFn fn) {
  static std::mutex mu;
  static MPI_Op ops[kWordsSlots] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL,
                                    MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
  static MPI_User_function* const callbacks[kWordsSlots] = {&WordsOp<0>, &WordsOp<1>, &WordsOp<2>, &WordsOp<3>,
                                                            &WordsOp<4>, &WordsOp<5>, &WordsOp<6>, &WordsOp<7>};
  std::lock_guard<std::mutex> lock(mu);
  for (int i = 0; i < kWordsSlots; ++i) {
    if (ops[i] != MPI_OP_NULL && g_words_fns[i].load() == fn) return ops[i];
    if (ops[i] == MPI_OP_NULL) {
      g_words_fns[i].store(fn);
      MPI_Op_create(callbacks[i], 1, &ops[i]);
      return ops[i];
    }
  }
  return MPI_OP_NULL;
}

template <DataType D, ReduceOp O>
void UserReduce(void* in, void* inout, int* len, MPI_Datatype*) {
  ReduceInto(inout, in, *len, D, O);
}

struct UserOps {
  MPI_Op ops[kNumDataTypes][6];
  UserOps() {
    for (auto& row : ops) for (auto& op : row) op = MPI_OP_NULL;
    Make<DataType::kUint8>();
    Make<DataType::kInt8>();
    Make<DataType::kInt32>();
    Make<DataType::kInt64>();
    Make<DataType::kFloat16>();
    Make<DataType::kBfloat16>();
    Make<DataType::kFloat32>();
    Make<DataType::kFloat64>();
    Make<DataType::kBool>();
    Make<DataType::kUint16>();
    Make<DataType::kInt16>();
  }
  template <DataType D> void Make() {
    MPI_Op_create(&UserReduce<D, ReduceOp::kSum>, 1, &ops[int(D)][int(ReduceOp::kSum)]);
    ops[int(D)][int(ReduceOp::kAverage)] = ops[int(D)][int(ReduceOp::kSum)];
    MPI_Op_create(&UserReduce<D, ReduceOp::kMin>, 1, &ops[int(D)][int(ReduceOp::kMin)]);
    MPI_Op_create(&UserReduce<D, ReduceOp::kMax>, 1, &ops[int(D)][int(ReduceOp::kMax)]);
    MPI_Op_create(&UserReduce<D, ReduceOp::kProduct>, 1, &ops[int(D)][int(ReduceOp::kProduct)]);
  }
};

// Every rank must hold the same bits. MPI_MIN / MPI_MAX on floats keep or drop a NaN by operand
// order (and ranks combine in different orders), so floats use the core's kernels for them;
// MPI_SUM / MPI_PROD differ only in which NaN payload survives, which the caller canonicalizes.
MPI_Op BuiltinOp(DataType t, ReduceOp op) {
  switch (t) {
    case DataType::kFloat16: case DataType::kBfloat16: case DataType::kBool: return MPI_OP_NULL;
    case DataType::kFloat32: case DataType::kFloat64:
      if (op == ReduceOp::kMin || op == ReduceOp::kMax) return MPI_OP_NULL;
      break;
    default: break;
  }
  switch (op) {
    case ReduceOp::kSum: case ReduceOp::kAverage: return MPI_SUM;
    case ReduceOp::kMin: return MPI_MIN;
    case ReduceOp::kMax: return MPI_MAX;
    case ReduceOp::kProduct: return MPI_PROD;
    default: return MPI_OP_NULL;
  }
}

// `builtin`: prefer MPI's own operation where it has one (groups that span several hosts).
MPI_Op OpFor(const UserOps& user, DataType t, ReduceOp op, bool builtin = false) {
  const MPI_Op b = builtin ? BuiltinOp(t, op) : MPI_OP_NULL;
  return b != MPI_OP_NULL ? b : user.ops[int(t)][int(op)];
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
    int flag = 0;
    int rc = MPI_Test(&request_, &flag, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return Status::Internal(MpiError("MPI_Test", rc));
    *done = flag != 0;
    return Status::Ok();
  }

 private:
  MPI_Request request_ = MPI_REQUEST_NULL;
  std::vector<int> ints_;  // counts/displacements for the v-collectives
  std::string error_;
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

// Allreduce among the ranks of one machine as a ring of point-to-point messages: p-1 steps of
// reduce-scatter, each rank receiving one segment and reducing it into the output, then p-1
// steps of allgather straight into the output. Out of place it receives into the output
// itself (no temporary at all); in place into one segment of pooled scratch. Every segment is
// reduced (and scaled) on exactly one rank and then copied, so all ranks hold identical bits;
// scaling only the segment it owns costs each rank 1/p of a pass. Driven by Test.
class RingAllreduce : public PendingOp {
 public:
  RingAllreduce(MPI_Comm comm, int rank, int size, int tag, void* buf, int64_t count, DataType dtype, ReduceOp op,
                const void* send, std::shared_ptr<BufferPool> pool, double scale)
      : comm_(comm), rank_(rank), size_(size), tag_(tag), buf_(static_cast<char*>(buf)),
        send_(static_cast<const char*>(send && send != buf ? send : nullptr)), count_(count), dtype_(dtype), op_(op),
        esize_(DataTypeSize(dtype)), scale_(scale), pool_(std::move(pool)) {
    offsets_.resize(size_ + 1, 0);
    for (int i = 0; i < size_; ++i) offsets_[i + 1] = offsets_[i] + count_ / size_ + (i < count_ % size_ ? 1 : 0);
    if (!send_) scratch_ = pool_->Take(size_t(offsets_[1] - offsets_[0]) * esize_);
    if (size_ == 1) {
      if (send_ && count_) std::memcpy(buf_, send_, size_t(count_) * esize_);
      if (scale_ != 1.0) ScaleInPlace(buf_, count_, dtype_, scale_);
      step_ = Steps();
    } else {
      Post();
    }
  }
  ~RingAllreduce() override {
    if (active_) {  // abandoned mid-way (a failure): MPI may still write into the scratch, so leak it
      for (MPI_Request& r : reqs_) if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
      new std::vector<char>(std::move(scratch_));
      return;
    }
    pool_->Give(std::move(scratch_));
  }

  Status Test(bool* done) override {
    if (!error_.empty()) return Status::Internal(error_);
    while (step_ < Steps()) {
      int flag = 0;
      int rc = MPI_Testall(2, reqs_, &flag, MPI_STATUSES_IGNORE);
      if (rc != MPI_SUCCESS) return Fail(MpiError("MPI_Testall(ring allreduce)", rc));
      if (!flag) {
        *done = false;
        return Status::Ok();
      }
      active_ = false;
      if (step_ < size_ - 1) {  // reduce-scatter: fold what arrived into the output
        const int seg = RecvSegment();
        char* out = Segment(buf_, seg);
        if (send_) {
          ReduceInto(out, Segment(send_, seg), Count(seg), dtype_, op_);
        } else {
          ReduceInto(out, scratch_.data(), Count(seg), dtype_, op_);
        }
        // the last fold leaves this rank's own segment complete: scale it while it is in cache
        if (step_ == size_ - 2 && scale_ != 1.0) ScaleInPlace(out, Count(seg), dtype_, scale_);
      }
      if (++step_ < Steps()) {
        Post();
        if (!error_.empty()) return Status::Internal(error_);
      }
    }
    *done = true;
    return Status::Ok();
  }

 private:
  int Steps() const { return 2 * (size_ - 1); }
  int Mod(int v) const { return ((v % size_) + size_) % size_; }
  int64_t Count(int seg) const { return offsets_[seg + 1] - offsets_[seg]; }
  char* Segment(char* base, int seg) const { return base + offsets_[seg] * int64_t(esize_); }
  const char* Segment(const char* base, int seg) const { return base + offsets_[seg] * int64_t(esize_); }
  // Step k < p-1 sends segment rank-k and receives rank-k-1 (reduce-scatter); afterwards this
  // rank holds the reduced segment rank+1, and step p-1+j sends rank+1-j, receives rank-j.
  int SendSegment() const { return step_ < size_ - 1 ? Mod(rank_ - step_) : Mod(rank_ + 1 - (step_ - size_ + 1)); }
  int RecvSegment() const { return step_ < size_ - 1 ? Mod(rank_ - step_ - 1) : Mod(rank_ - (step_ - size_ + 1)); }

  void Post() {
    const int to = Mod(rank_ + 1), from = Mod(rank_ - 1);
    const int s = SendSegment(), r = RecvSegment();
    const bool first = step_ == 0;
    const char* src = first && send_ ? Segment(send_, s) : Segment(buf_, s);
    char* dst = step_ < size_ - 1 && !send_ ? scratch_.data() : Segment(buf_, r);
    int rc = MPI_Irecv(dst, int(Count(r) * int64_t(esize_)), MPI_BYTE, from, tag_, comm_, &reqs_[0]);
    if (rc == MPI_SUCCESS) rc = MPI_Isend(src, int(Count(s) * int64_t(esize_)), MPI_BYTE, to, tag_, comm_, &reqs_[1]);
    active_ = true;
    if (rc != MPI_SUCCESS) Fail(MpiError("MPI_Isend/MPI_Irecv(ring allreduce)", rc));
  }
  Status Fail(std::string e) {
    error_ = std::move(e);
    return Status::Internal(error_);
  }

  MPI_Comm comm_;
  const int rank_, size_, tag_;
  char* buf_;
  const char* send_;
  const int64_t count_;
  const DataType dtype_;
  const ReduceOp op_;
  const size_t esize_;
  const double scale_;
  std::shared_ptr<BufferPool> pool_;  // shared: an operation may outlive its communicator
  std::vector<char> scratch_;
  std::vector<int64_t> offsets_;
  MPI_Request reqs_[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  int step_ = 0;
  bool active_ = false;
  std::string error_;
};

// All-to-all as point-to-point messages: round k sends to rank+k and receives from rank-k,
// up to kRounds rounds posted at once, this rank's own slice copied. MPICH's MPI_Ialltoallv
// advances one small step per MPI_Test, so over TCP, tested every ~100 us by a thread that
// sleeps between tests, a 256 KiB-per-peer exchange took 7.9 ms instead of 0.4 ms
// (2 ranks, 10 Gbit/s emulated link); plain sends and receives move within one test.
// Every message is posted, zero-length ones too, so the matching never depends on the counts
// agreeing. `sends` and `recvs` are byte counts[size] then displacements[size]. Driven by Test.
class PointToPointAlltoallv : public PendingOp {
 public:
  static constexpr int kRounds = 32;
  PointToPointAlltoallv(MPI_Comm comm, int rank, int size, int tag, const void* send, std::vector<int> sends,
                        void* recv, std::vector<int> recvs)
      : comm_(comm), rank_(rank), size_(size), tag_(tag), send_(static_cast<const char*>(send)),
        recv_(static_cast<char*>(recv)), sends_(std::move(sends)), recvs_(std::move(recvs)) {
    if (sends_[rank_] != recvs_[rank_]) {
      error_ = "alltoall: this rank sends itself " + std::to_string(sends_[rank_]) + " bytes but expects " +
               std::to_string(recvs_[rank_]);
      return;
    }
    reqs_.reserve(2 * size_t(std::min(size_ - 1, kRounds)));
    if (sends_[rank_] > 0) std::memcpy(recv_ + recvs_[size_ + rank_], send_ + sends_[size_ + rank_], sends_[rank_]);
    PostRounds();
  }
  ~PointToPointAlltoallv() override {
    for (MPI_Request& r : reqs_) if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
  }

  Status Test(bool* done) override {
    *done = false;
    while (error_.empty()) {
      int flag = 0;
      if (!reqs_.empty()) {
        int rc = MPI_Testall(int(reqs_.size()), reqs_.data(), &flag, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS) return Status::Internal(MpiError("MPI_Testall(alltoall)", rc));
        if (!flag) return Status::Ok();
        reqs_.clear();
      }
      if (next_ >= size_) {
        *done = true;
        return Status::Ok();
      }
      PostRounds();
    }
    return Status::Internal(error_);
  }

 private:
  void PostRounds() {
    const int last = std::min(size_, next_ + kRounds);
    for (; next_ < last; ++next_) {
      const int to = (rank_ + next_) % size_, from = (rank_ - next_ + size_) % size_;
      reqs_.push_back(MPI_REQUEST_NULL);
      int rc = MPI_Irecv(recv_ + recvs_[size_ + from], recvs_[from], MPI_BYTE, from, tag_, comm_, &reqs_.back());
      if (rc == MPI_SUCCESS) {
        reqs_.push_back(MPI_REQUEST_NULL);
        rc = MPI_Isend(send_ + sends_[size_ + to], sends_[to], MPI_BYTE, to, tag_, comm_, &reqs_.back());
      }
      if (rc != MPI_SUCCESS) {
        error_ = MpiError("MPI_Isend/MPI_Irecv(alltoall)", rc);
        return;
      }
    }
  }

  MPI_Comm comm_;
  const int rank_, size_, tag_;
  const char* send_;
  char* recv_;
  const std::vector<int> sends_, recvs_;
  std::vector<MPI_Request> reqs_;
  int next_ = 1;  // the next round to post
  std::string error_;
};

class MpiCommunicator : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, int64_t ring_bytes) : comm_(comm), ring_bytes_(ring_bytes) {
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
                                       double scale) override {
    if (!FitsInt(count)) return TooLarge("allreduce");
    const int64_t bytes = count * int64_t(DataTypeSize(dtype));
    if (topo_.cross_size == 1 && ring_bytes_ > 0 && bytes >= ring_bytes_ && FitsInt(bytes)) {
      return std::make_unique<RingAllreduce>(comm_, rank_, size_, NextTag(), buf, count, dtype, op, send, pool_,
                                             scale);
    }
    auto p = std::make_unique<MpiPending>();
    const MPI_Op mpi_op = OpFor(user_, dtype, op, topo_.cross_size > 1);
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
    std::vector<int> s, r;
    if (!CountsAndDispls(send_bytes, &s) || !CountsAndDispls(recv_bytes, &r)) return TooLarge("alltoall");
    return std::make_unique<PointToPointAlltoallv>(comm_, rank_, size_, NextTag(), send, std::move(s), recv,
                                                   std::move(r));
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
      *out = std::make_unique<MpiCommunicator>(sub, ring_bytes_);
    }
    return Status::Ok();
  }

 private:
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

  // Tags of the point-to-point operations (ring allreduce, all-to-all). Every rank starts the
  // same operations in the same order, so the tags agree.
  int NextTag() { return tag_ = tag_ % kMaxTag + 1; }
  static constexpr int kMaxTag = 32767;  // the least MPI_TAG_UB the standard allows
  std::map<int64_t, MPI_Datatype> words_types_;
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  Topology topo_;
  UserOps user_;
  const int64_t ring_bytes_;  // MLSL_TF_RING_BYTES
  int tag_ = 0;
  // The ring's in-place scratch, one segment per operation in flight on this communicator.
  std::shared_ptr<BufferPool> pool_ = std::make_shared<BufferPool>(4, size_t(1) << 30);
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

Status CreateMpiCommunicator(int64_t ring_bytes, std::unique_ptr<Communicator>* out) {
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
  *out = std::make_unique<MpiCommunicator>(comm, ring_bytes);
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
