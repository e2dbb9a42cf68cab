// SimCommunicator: rank 0 of N identical data-parallel ranks on a virtual clock; every operation
// completes when virtual time passes its start plus the alpha-beta cost of the algorithm MPICH
// would pick for it, its link time shared with the other operations in flight.
//
// Cost model (Thakur, Rabenseifner & Gropp, "Optimization of Collective Communication Operations
// in MPICH", 2005; p = ranks, n = bytes per rank, alpha = seconds per message, beta = seconds
// per byte of one host's link, gamma = seconds per byte reduced locally):
//   allreduce, recursive doubling   log2(p) (alpha + n beta + n gamma)           n <  2 KiB (MPICH's
//                                                                                MPIR_CVAR_ALLREDUCE_SHORT_MSG_SIZE)
//   allreduce, Rabenseifner          2 log2(p) alpha + 2 (p-1)/p n beta + (p-1)/p n gamma   n >= 2 KiB
//   allreduce, ring                  2 (p-1) alpha + 2 (p-1)/p n beta + (p-1)/p n gamma     (on request)
//   p not a power of two: recursive doubling and Rabenseifner first fold the extra ranks into
//   the largest power of two below p and send them the result after: + 2 (alpha + n beta) + n gamma.
//   ranks_per_host r > 1 (MPICH's SMP-aware collectives): a binomial reduce inside the host,
//   the allreduce above over the p/r hosts, a binomial bcast inside the host; the intra-host
//   steps cost log2(r) (alpha_shm + n beta_shm) each (plus n gamma per reduce step).
//   hierarchical false (one algorithm over all p ranks, r to a host in rank order; NCCL's ring over
//   the GPUs of several servers): ring as above over p, each host's link crossed once each way,
//   2 (p/r - 1) of its steps at alpha and the other 2 (p - p/r) at alpha_shm;
//   recursive doubling and Rabenseifner (MPICH's mask order: nearest partner first) take their
//   first log2(r) steps inside the host (alpha_shm + n' beta_shm, n' the step's bytes) and the
//   rest across hosts, where the r ranks of a host send at once over its one link (contention):
//   recursive doubling log2(p/r) (alpha + n r beta); Rabenseifner 2 log2(p/r) alpha +
//   2 (q-1)/q n beta, q = pof2/r (its r ranks' halves add up to what one rank per host would send).
//   allgather(v) of n bytes in all   short (< 512 KiB): log2(p) alpha; long: (p-1) alpha; + (p-1)/p n beta
//   alltoall(v), n bytes sent        (p-1) alpha + (p-r)/p n beta r   (pairwise; the r ranks of a host share its link)
//   broadcast of n bytes             short (< 12 KiB): log2(p) (alpha + n beta); long: scatter + allgather,
//                                    (log2(p) + p-1) alpha + 2 (p-1)/p n beta
//   reduce-scatter, n bytes in all   (p-1) alpha + (p-1)/p n (beta + gamma)       (pairwise)
//   barrier                          log2(p) alpha                                 (dissemination)
//   point-to-point message of n B    alpha + n beta (beta: SendBeta(p), every rank sending at once);
//                                    to a rank of this host alpha_shm + n beta_shm, not on the link
//   all-to-all and allgather(v) also pay codec x bytes of CPU work (the bf16 path's encode,
//   reduce and decode on the background thread).
//   shared_cores c > 0 (every rank's host emulated on one machine of c cores, as in
//   benchmarks/hosts.py): sending a byte also costs cpu_beta of the machine's CPU, so a phase in
//   which s ranks send at once moves bytes at max(beta, cpu_beta max(1, s / c)) per byte
//   (s: pof2 for recursive doubling's and Rabenseifner's main part, p - pof2 for the fold,
//   p for ring, all-to-all, allgather, broadcast and reduce-scatter). thread_progress: every
//   transfer, not only the CPU-bound ones, is driven by the background thread (below).
// Each cost has a CPU part (codec), a latency part (alpha and intra-host terms, gamma) and a
// link part (beta terms, at the full link), played in that order. Sharing: operations in their
// link part progress together, each at 1/k of the link when k are in that part (processor
// sharing), as chunks on separate communicators share one NIC. CPU parts run one at a time in
// start order, as the one background thread does them; the latency parts never contend. Link
// parts that the thread itself drives (SimCost::on_thread) stop while it does a CPU part.
//
// One process stands for every rank: results are the local data (a sum over identical ranks
// is not formed; the simulator only needs the timing). AllreduceWords keeps its words.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "communicator.h"

namespace mlsl {

struct SimFabric {
  int ranks = 8;
  int ranks_per_host = 1;
  double alpha = 1e-6;               // s per inter-host message
  double beta = 8.0 / 100e9;         // s per byte on one host's link (100 Gbit/s)
  double alpha_shm = 0.3e-6;         // s per intra-host (shared memory) message
  double beta_shm = 1.0 / 10e9;      // s per byte copied through shared memory
  double gamma = 0;                  // s per byte reduced (0: not modelled)
  std::string allreduce = "auto";    // auto (MPICH's choice) | rd | rabenseifner | ring
  int64_t short_allreduce = 2048;    // auto: recursive doubling below this many bytes
  // CPU s per byte of 16-bit data on the compressed path (wire.h): its encode and float32 reduce
  // before the all-to-all, encode and decode around the allgather; charged to each as CPU work.
  double codec = 0;
  // The ranks' hosts emulated on one machine: its cores (0: every host has its own CPU) and the
  // CPU s per byte one rank's TCP sending costs.
  int shared_cores = 0;
  double cpu_beta = 0;
  // Every transfer is progressed by the background thread's MPI calls (MPICH over TCP: the
  // rendezvous handshakes and refilling the sockets happen inside them), so it stalls while the
  // thread does a CPU part, whatever binds its rate; false: only where the CPU binds (an RDMA NIC,
  // or the kernel with full socket buffers, moves the bytes on its own).
  bool thread_progress = false;
  // ranks_per_host > 1: MPICH's SMP-aware allreduce (reduce in the host, allreduce across hosts,
  // bcast in the host); false: one algorithm over every rank, the host's link shared by its ranks.
  bool hierarchical = true;
};

// s per byte when `senders` ranks send at once (beta, or the shared cores' rate when slower).
double SendBeta(const SimFabric& f, int senders);
// Whether a transfer at `beta` (SendBeta's) needs the background thread to move (SimCost::on_thread).
bool OnThread(const SimFabric& f, double beta);

struct SimCost {
  double latency = 0;  // s, not shared
  double link = 0;     // s at the full link, shared with the other operations in flight
  double cpu = 0;      // s of the background thread's work at full speed, before the latency part
  // The link part is the background thread's CPU work too (TCP progressed inside its MPI calls,
  // with the shared cores rather than the link setting the rate): it stalls while that thread
  // does some operation's CPU part.
  bool on_thread = false;
  double total() const { return cpu + latency + link; }
};

// The algorithm `auto` picks for an allreduce of `bytes` (per rank): "rd" or "rabenseifner".
std::string AllreduceAlgorithm(const SimFabric& f, int64_t bytes);
SimCost AllreduceCost(const SimFabric& f, int64_t bytes);
SimCost AllgatherCost(const SimFabric& f, int64_t total_bytes);
SimCost AlltoallCost(const SimFabric& f, int64_t sent_bytes);
SimCost BroadcastCost(const SimFabric& f, int64_t bytes);
SimCost ReduceScatterCost(const SimFabric& f, int64_t total_bytes);
SimCost BarrierCost(const SimFabric& f);
// One point-to-point message of `bytes` to a rank on another host, or on this one.
SimCost MessageCost(const SimFabric& f, int64_t bytes, bool same_host);

// The virtual clock and the link shared by every operation in flight. Time only moves by
// AdvanceTo; it starts at 0 (seconds).
class SimNetwork {
 public:
  explicit SimNetwork(SimFabric fabric) : fabric_(std::move(fabric)) {}
  const SimFabric& fabric() const { return fabric_; }
  double now() const { return now_; }
  // The virtual time as a steady_clock time point (what the engine's owner passes to Step).
  std::chrono::steady_clock::time_point Now() const;
  // Starts an operation of cost c now; returns its handle.
  uint64_t Start(SimCost c);
  bool Done(uint64_t handle) const { return !ops_.count(handle); }
  // When the next operation in flight completes (infinity when none is).
  double NextEvent() const;
  // Moves the clock to t (>= now), completing what finishes by then.
  void AdvanceTo(double t);
  int in_flight() const { return int(ops_.size()); }
  // Operations completed so far: a reader that saw the same count saw every completion.
  uint64_t completed() const { return completed_; }
  // Whether some operation is in its link part now.
  bool link_active() const;
  // The fraction of the link's rate available from now on (1: all of it); the simulator lowers
  // it while the CPU that drives the transfers is busy computing.
  void set_link_rate(double fraction) { rate_ = fraction; }
  // Link busy time so far (s): how long at least one operation was in its link part.
  double link_busy() const { return link_busy_; }
  // Whether the background thread is doing some operation's CPU part now.
  bool cpu_active() const;
  // The fraction of the background thread's speed available from now on (1: all of it); the
  // simulator lowers it while compute shares its cores.
  void set_cpu_rate(double fraction) { cpu_rate_ = fraction; }

 private:
  struct Op {
    double cpu_left;     // s of CPU work at full speed; > 0: in its CPU part (latency_end not yet set)
    double latency;      // s, its latency part
    double latency_end;  // absolute, once the CPU part is done
    double link_left;    // s at the full link
    bool on_thread;      // the link part stops while the background thread does a CPU part
  };
  // Whether op is in its link part and moving now (thread_busy: some CPU part is running).
  bool Moving(const Op& op, bool thread_busy) const;
  // The next time something changes (a CPU part or a latency part ends, or a link part completes).
  double NextChange(int* sharing) const;
  // The operation whose CPU part runs now (the first started of those in one); end() if none.
  std::map<uint64_t, Op>::const_iterator CpuHead() const;
  SimFabric fabric_;
  double now_ = 0, link_busy_ = 0, rate_ = 1, cpu_rate_ = 1;
  uint64_t next_handle_ = 0, completed_ = 0;
  std::map<uint64_t, Op> ops_;
};

class SimCommunicator : public Communicator {
 public:
  explicit SimCommunicator(SimNetwork* net) : net_(net) {}
  int rank() const override { return 0; }
  int size() const override { return net_->fabric().ranks; }
  Topology topology() const override;
  std::unique_ptr<PendingOp> Allreduce(void* buf, int64_t count, DataType dtype, ReduceOp op,
                                       const void* send = nullptr, double scale = 1.0, bool native = false) override;
  std::unique_ptr<PendingOp> AllreduceWords(uint64_t* words, int64_t count, CombineFn combine) override;
  std::unique_ptr<PendingOp> Allgatherv(const void* send, void* recv, const std::vector<int64_t>& bytes) override;
  std::unique_ptr<PendingOp> Broadcast(void* buf, int64_t bytes, int root) override;
  std::unique_ptr<PendingOp> Alltoallv(const void* send, const std::vector<int64_t>& send_bytes, void* recv,
                                       const std::vector<int64_t>& recv_bytes) override;
  std::unique_ptr<PendingOp> ReduceScatter(const void* send, void* recv, const std::vector<int64_t>& counts,
                                           DataType dtype, ReduceOp op) override;
  std::unique_ptr<PendingOp> Barrier() override;
  // Every rank is a member (the simulated ranks are identical): a new communicator on the same network.
  Status Split(const std::vector<int>& ranks, std::unique_ptr<Communicator>* out) override;
  // A send costs MessageCost (nothing to itself). The ranks being identical, rank q sends this
  // rank what this rank sends rank -q mod p: a receive from q completes when this rank's send
  // to -q that it pairs with (in posting order, per tag) does. No bytes move: a receive leaves
  // its buffer as it was (the simulator needs only the timing).
  std::unique_ptr<PendingOp> Send(const void* buf, int64_t bytes, int peer, int tag) override;
  std::unique_ptr<PendingOp> Recv(void* buf, int64_t bytes, int peer, int tag) override;

  // The pairing of sends and receives (shared with the receives in flight).
  struct Receive {
    bool paired = false;
    uint64_t handle = 0;  // the paired send's
  };
  struct Mailbox {
    struct Queues {
      std::deque<uint64_t> sends;                     // not yet paired, oldest first
      std::deque<std::shared_ptr<Receive>> receives;  // not yet paired, oldest first
    };
    std::map<std::pair<int, int>, Queues> queues;     // by (rank sent to, tag)
  };

 private:
  std::unique_ptr<PendingOp> Start(SimCost c);
  SimNetwork* net_;
  std::shared_ptr<Mailbox> mailbox_ = std::make_shared<Mailbox>();
};

}  // namespace mlsl
