// The simulated communicator: each algorithm's alpha-beta cost against its formula, MPICH's
// choice of algorithm, link sharing on the virtual clock, and the real Scheduler on that clock.
#include <cmath>
#include <vector>

#include "../scheduler.h"
#include "../sim_communicator.h"
#include "check.h"

using namespace mlsl;

namespace {

bool Near(double a, double b) { return std::fabs(a - b) <= 1e-12 + 1e-9 * std::fabs(b); }

#define CHECK_NEAR(a, b)                                                                   \
  do {                                                                                     \
    double a_ = (a), b_ = (b);                                                             \
    if (!Near(a_, b_)) {                                                                   \
      ::mlsl_test::RecordFailure(__FILE__, __LINE__, "CHECK_NEAR(" #a ", " #b "): " +      \
                                                         std::to_string(a_) + " vs " + std::to_string(b_)); \
    }                                                                                      \
  } while (0)

SimFabric Fabric(int ranks, int per_host = 1) {
  SimFabric f;
  f.ranks = ranks;
  f.ranks_per_host = per_host;
  f.alpha = 2e-6;
  f.beta = 1e-9;  // 1 GB/s
  f.alpha_shm = 0.5e-6;
  f.beta_shm = 1e-10;
  return f;
}

}  // namespace

TEST(sim_allreduce_short_is_recursive_doubling) {
  SimFabric f = Fabric(8);
  const double n = 1024;
  CHECK_EQ(AllreduceAlgorithm(f, 1024), std::string("rd"));
  CHECK_NEAR(AllreduceCost(f, 1024).total(), 3 * (f.alpha + n * f.beta));
  f.gamma = 1e-10;
  CHECK_NEAR(AllreduceCost(f, 1024).total(), 3 * (f.alpha + n * f.beta + n * f.gamma));
}

TEST(sim_allreduce_long_is_rabenseifner) {
  SimFabric f = Fabric(8);
  const double n = 1 << 20;
  CHECK_EQ(AllreduceAlgorithm(f, 1 << 20), std::string("rabenseifner"));
  SimCost c = AllreduceCost(f, 1 << 20);
  CHECK_NEAR(c.latency, 2 * 3 * f.alpha);
  CHECK_NEAR(c.link, 2.0 * 7 / 8 * n * f.beta);
  // 6 ranks: fold 2 into 4, then send them the result: alone, the phases add up; only the
  // pof2 part and the result sent back load the busiest link (shared with other collectives).
  f.ranks = 6;
  c = AllreduceCost(f, 1 << 20);
  CHECK_NEAR(c.total(), 2 * 2 * f.alpha + 2.0 * 3 / 4 * n * f.beta + 2 * (f.alpha + n * f.beta));
  CHECK_NEAR(c.link, 2.0 * 3 / 4 * n * f.beta + n * f.beta);
}

TEST(sim_allreduce_ring_and_one_rank) {
  SimFabric f = Fabric(8);
  f.allreduce = "ring";
  const double n = 1 << 20;
  CHECK_NEAR(AllreduceCost(f, 1 << 20).total(), 2 * 7 * f.alpha + 2.0 * 7 / 8 * n * f.beta);
  CHECK_NEAR(AllreduceCost(Fabric(1), 1 << 20).total(), 0.0);
}

TEST(sim_allreduce_hierarchical) {
  // 16 ranks, 4 per host: reduce in the host, Rabenseifner over 4 hosts, bcast in the host.
  SimFabric f = Fabric(16, 4);
  const double n = 1 << 20;
  SimCost c = AllreduceCost(f, 1 << 20);
  CHECK_NEAR(c.link, 2.0 * 3 / 4 * n * f.beta);
  CHECK_NEAR(c.latency, 2 * 2 * f.alpha + 2 * 2 * (f.alpha_shm + n * f.beta_shm));
}

TEST(sim_allreduce_flat_shares_the_hosts_link) {
  // 16 ranks, 4 per host, one algorithm over all 16 (hierarchical false).
  SimFabric f = Fabric(16, 4);
  f.hierarchical = false;
  const double n = 1 << 20;
  // Rabenseifner, nearest partner first: 2 halving steps inside the host (n/2 + n/4, twice),
  // 2 across hosts with the host's 4 ranks sending at once: as much on the link as one per host.
  SimCost c = AllreduceCost(f, 1 << 20);
  CHECK_NEAR(c.link, 2.0 * 3 / 4 * n * f.beta);
  CHECK_NEAR(c.latency, 2 * 2 * f.alpha + 2 * 2 * f.alpha_shm + 2 * 0.75 * n * f.beta_shm);
  // Recursive doubling: the 2 steps across hosts carry n from each of the host's 4 ranks.
  f.allreduce = "rd";
  c = AllreduceCost(f, 1 << 20);
  CHECK_NEAR(c.link, 2 * 4 * n * f.beta);
  CHECK_NEAR(c.latency, 2 * f.alpha + 2 * (f.alpha_shm + n * f.beta_shm));
  // Ring over all 16 ranks (NCCL's over several GPUs a server): each host's link crossed once
  // each way; of its 2 (p-1) = 30 steps, 2 (4-1) through the network, 24 inside a host.
  f.allreduce = "ring";
  f.alpha_shm = 0.25 * f.alpha;
  c = AllreduceCost(f, 1 << 20);
  CHECK_NEAR(c.link, 2.0 * 15 / 16 * n * f.beta);
  CHECK_NEAR(c.latency, 2 * 3 * f.alpha + 2 * 12 * f.alpha_shm);
  // One rank per host: the same as the hierarchical form.
  SimFabric one = Fabric(16), flat = Fabric(16);
  flat.hierarchical = false;
  CHECK_NEAR(AllreduceCost(flat, 1 << 20).total(), AllreduceCost(one, 1 << 20).total());
}

TEST(sim_other_collectives) {
  SimFabric f = Fabric(8);
  const double big = 1 << 20, small = 4096;
  CHECK_NEAR(AllgatherCost(f, 1 << 20).total(), 7 * f.alpha + 7.0 / 8 * big * f.beta);
  CHECK_NEAR(AllgatherCost(f, 4096).total(), 3 * f.alpha + 7.0 / 8 * small * f.beta);
  CHECK_NEAR(AlltoallCost(f, 1 << 20).total(), 7 * f.alpha + 7.0 / 8 * big * f.beta);
  CHECK_NEAR(AlltoallCost(Fabric(8, 2), 1 << 20).link, 6.0 / 8 * big * 2 * f.beta);
  CHECK_NEAR(BroadcastCost(f, 4096).total(), 3 * (f.alpha + small * f.beta));
  CHECK_NEAR(BroadcastCost(f, 1 << 20).total(), (3 + 7) * f.alpha + 2.0 * 7 / 8 * big * f.beta);
  CHECK_NEAR(ReduceScatterCost(f, 1 << 20).total(), 7 * f.alpha + 7.0 / 8 * big * f.beta);
  CHECK_NEAR(BarrierCost(f).total(), 3 * f.alpha);
  f.codec = 1e-9;  // the compressed path's CPU work, a part of its own
  CHECK_NEAR(AlltoallCost(f, 1 << 20).latency, 7 * f.alpha);
  CHECK_NEAR(AlltoallCost(f, 1 << 20).cpu, big * f.codec);
  CHECK_NEAR(AllgatherCost(f, 1 << 20).latency, 7 * f.alpha);
  CHECK_NEAR(AllgatherCost(f, 1 << 20).cpu, big * f.codec);
  CHECK_NEAR(AllreduceCost(f, 1 << 20).latency, 6 * f.alpha);
  CHECK_NEAR(AllreduceCost(f, 1 << 20).cpu, 0.0);
}

TEST(sim_shared_cores_bound_the_senders) {
  // 4 ranks emulated on 2 cores, each byte sent costs 0.6 ns of CPU: with 4 senders a byte takes
  // 0.6 x 4 / 2 = 1.2 ns, more than the 1 ns link; with 2 senders the link (1 ns) binds.
  SimFabric f = Fabric(4);
  f.shared_cores = 2;
  f.cpu_beta = 0.6e-9;
  const double n = 1 << 20;
  CHECK_NEAR(SendBeta(f, 4), 1.2e-9);
  CHECK_NEAR(SendBeta(f, 2), f.beta);
  CHECK_NEAR(SendBeta(f, 1), f.beta);
  // Rabenseifner among 4: all 4 send; all-to-all and allgather: all 4 send.
  CHECK_NEAR(AllreduceCost(f, 1 << 20).link, 2.0 * 3 / 4 * n * 1.2e-9);
  CHECK_NEAR(AlltoallCost(f, 1 << 20).link, 3.0 / 4 * n * 1.2e-9);
  CHECK_NEAR(AllgatherCost(f, 1 << 20).link, 3.0 / 4 * n * 1.2e-9);
  CHECK_NEAR(ReduceScatterCost(f, 1 << 20).link, 3.0 / 4 * n * 1.2e-9);
  // 3 ranks: Rabenseifner's main part among 2 senders and the fold's 1 are link-bound, while
  // the all-to-all's 3 senders make 0.6 x 1.5 = 0.9 ns: the link (1 ns) still binds ...
  f.ranks = 3;
  CHECK_NEAR(AllreduceCost(f, 1 << 20).link, 2.0 * 1 / 2 * n * f.beta + n * f.beta);
  CHECK_NEAR(AlltoallCost(f, 1 << 20).link, 2.0 / 3 * n * f.beta);
  // ... and at 0.8 ns the CPU binds the all-to-all (1.2 ns) but not the allreduce's parts.
  f.cpu_beta = 0.8e-9;
  CHECK_NEAR(AlltoallCost(f, 1 << 20).link, 2.0 / 3 * n * 1.2e-9);
  CHECK_NEAR(AllreduceCost(f, 1 << 20).link, 2.0 * 1 / 2 * n * f.beta + n * f.beta);
  // No shared cores: the link alone, whatever cpu_beta says.
  f.shared_cores = 0;
  CHECK_NEAR(AlltoallCost(f, 1 << 20).link, 2.0 / 3 * n * f.beta);
}

TEST(sim_network_shares_the_link) {
  SimNetwork net(Fabric(8));
  SimCost c{1e-6, 1e-3};
  uint64_t a = net.Start(c), b = net.Start(c);
  net.AdvanceTo(1.5e-3);
  CHECK(!net.Done(a) && !net.Done(b));
  // Both share the link from t = 1 us: each gets half, so both finish at 1 us + 2 ms.
  CHECK_NEAR(net.NextEvent(), 1e-6 + 2e-3);
  net.AdvanceTo(net.NextEvent());
  CHECK(net.Done(a) && net.Done(b));
  CHECK_NEAR(net.link_busy(), 2e-3);
  // A second op joining halfway: the first has 0.5 ms left at full rate, then shares.
  uint64_t x = net.Start(SimCost{0, 1e-3});
  net.AdvanceTo(net.now() + 0.5e-3);
  uint64_t y = net.Start(SimCost{0, 1e-3});
  const double t0 = net.now();
  while (!net.Done(x)) net.AdvanceTo(net.NextEvent());
  CHECK_NEAR(net.now() - t0, 1e-3);  // 0.5 ms of work at half rate
  while (!net.Done(y)) net.AdvanceTo(net.NextEvent());
  CHECK_NEAR(net.now() - t0, 1.5e-3);
  // At half the link's rate a 1 ms transfer takes 2 ms.
  net.set_link_rate(0.5);
  uint64_t z = net.Start(SimCost{0, 1e-3});
  const double t1 = net.now();
  while (!net.Done(z)) net.AdvanceTo(net.NextEvent());
  CHECK_NEAR(net.now() - t1, 2e-3);
}

TEST(sim_network_runs_cpu_parts_one_at_a_time) {
  SimNetwork net(Fabric(8));
  // Two operations of 1 ms CPU, 10 us latency, 1 ms link each, started together: the first's
  // CPU part ends at 1 ms, the second's waits for it (one background thread) and ends at 2 ms.
  SimCost c;
  c.cpu = 1e-3;
  c.latency = 10e-6;
  c.link = 1e-3;
  uint64_t a = net.Start(c), b = net.Start(c);
  CHECK(net.cpu_active() && !net.link_active());
  CHECK_NEAR(net.NextEvent(), 1e-3);
  net.AdvanceTo(1e-3 + 10e-6);  // a's latency over: a alone on the link, b computing
  CHECK(net.cpu_active() && net.link_active());
  CHECK_NEAR(net.NextEvent(), 2e-3);  // b's CPU part ends before a's link part (at 2.01 ms)
  while (!net.Done(a)) net.AdvanceTo(net.NextEvent());
  CHECK_NEAR(net.now(), 2.01e-3);
  CHECK(!net.cpu_active());
  while (!net.Done(b)) net.AdvanceTo(net.NextEvent());
  CHECK_NEAR(net.now(), 2e-3 + 10e-6 + 1e-3);
  // At half the thread's speed a 1 ms CPU part takes 2 ms; the link's rate does not change it.
  net.set_cpu_rate(0.5);
  net.set_link_rate(0.25);
  SimCost d;
  d.cpu = 1e-3;
  const double t0 = net.now();
  uint64_t e = net.Start(d);
  while (!net.Done(e)) net.AdvanceTo(net.NextEvent());
  CHECK_NEAR(net.now() - t0, 2e-3);
}

TEST(sim_network_thread_driven_transfers_wait_for_cpu_parts) {
  SimNetwork net(Fabric(8));
  // Two 1 ms transfers, one driven by the background thread (CPU-bound TCP), one not, share the
  // link; at 0.5 ms an operation with 0.4 ms of CPU work starts. While it runs, the driven
  // transfer stops and the other has the link to itself.
  SimCost driven{0, 1e-3};
  driven.on_thread = true;
  uint64_t a = net.Start(driven), b = net.Start(SimCost{0, 1e-3});
  net.AdvanceTo(0.5e-3);  // each 0.25 ms done
  SimCost codec;
  codec.cpu = 0.4e-3;
  uint64_t c = net.Start(codec);
  CHECK(net.link_active());
  net.AdvanceTo(0.9e-3);  // codec done; b had the link alone: 0.25 + 0.4 = 0.65 ms done
  CHECK(net.Done(c) && !net.Done(a) && !net.Done(b));
  // Now both share again: b has 0.35 ms left (done at 0.9 + 0.7 = 1.6 ms), a 0.75 ms.
  while (!net.Done(b)) net.AdvanceTo(net.NextEvent());
  CHECK_NEAR(net.now(), 1.6e-3);
  while (!net.Done(a)) net.AdvanceTo(net.NextEvent());
  CHECK_NEAR(net.now(), 1.6e-3 + 0.4e-3);
  // The cost functions mark a transfer as driven when the shared cores, not the link, bind.
  SimFabric f = Fabric(4);
  f.shared_cores = 2;
  f.cpu_beta = 0.6e-9;
  CHECK(AlltoallCost(f, 1 << 20).on_thread && AllreduceCost(f, 1 << 20).on_thread);
  CHECK(AllgatherCost(f, 1 << 20).on_thread && BroadcastCost(f, 1 << 20).on_thread);
  CHECK(ReduceScatterCost(f, 1 << 20).on_thread);
  f.allreduce = "ring";
  CHECK(AllreduceCost(f, 1 << 20).on_thread);
  f.cpu_beta = 0.4e-9;
  CHECK(!AlltoallCost(f, 1 << 20).on_thread && !AllreduceCost(f, 1 << 20).on_thread);
  CHECK(!AllgatherCost(f, 1 << 20).on_thread && !BroadcastCost(f, 1 << 20).on_thread);
  // thread_progress: every transfer is the thread's (MPICH over TCP), link-bound or not; the
  // costs themselves do not change.
  const double link = AlltoallCost(f, 1 << 20).link;
  f.thread_progress = true;
  CHECK(AlltoallCost(f, 1 << 20).on_thread && AllreduceCost(f, 1 << 20).on_thread);
  CHECK(AllgatherCost(f, 1 << 20).on_thread && BroadcastCost(f, 1 << 20).on_thread);
  CHECK(ReduceScatterCost(f, 1 << 20).on_thread);
  CHECK_NEAR(AlltoallCost(f, 1 << 20).link, link);
  f.shared_cores = 0;  // hosts with CPUs of their own: still the thread's
  CHECK(AllgatherCost(f, 1 << 20).on_thread);
}

TEST(sim_communicator_completes_on_virtual_time) {
  SimNetwork net(Fabric(8));
  SimCommunicator comm(&net);
  std::vector<float> buf(1 << 18, 1.0f);
  auto op = comm.Allreduce(buf.data(), int64_t(buf.size()), DataType::kFloat32, ReduceOp::kSum);
  const double cost = AllreduceCost(net.fabric(), 1 << 20).total();
  bool done = false;
  CHECK(op->Test(&done).ok());
  CHECK(!done);
  net.AdvanceTo(cost * 0.99);
  op->Test(&done);
  CHECK(!done);
  net.AdvanceTo(cost);
  op->Test(&done);
  CHECK(done);
  CHECK_EQ(buf[0], 1.0f);
  std::unique_ptr<Communicator> other;
  CHECK(comm.Split({0, 1, 2, 3, 4, 5, 6, 7}, &other).ok());
  CHECK_EQ(other->size(), 8);
}

// One allreduce of `floats` floats through the real Scheduler on the simulated network, in 1 MiB
// chunks with one in flight: the virtual time it finished and the longest sleep the scheduler
// asked for between tests.
struct SimRun {
  double finished = -1;
  int64_t longest_sleep_us = 0;
};

static SimRun OneAllreduce(SimNetwork* net, size_t floats, bool one_host = false) {
  SimCommunicator comm(net);
  Timeline timeline("", 0);
  Stats stats;
  SchedulerOptions o{1 << 20, 1, 0, false};
  o.one_host = one_host;
  Scheduler sched(&comm, &timeline, &stats, o);
  std::vector<float> data(floats, 1.0f);
  Request r;
  r.name = "g";
  r.inputs = {TensorInput{data.data(), {int64_t(data.size())}}};
  r.allocate_output = [&](int, const Shape&, void** out) { *out = data.data(); return Status::Ok(); };
  SimRun run;
  sched.Add(0, RequestMeta::From(r), &r, [&](const Status&) { run.finished = net->now(); }, net->Now(), net->Now());
  while (run.finished < 0) {
    sched.StartUpTo(net->Now(), sched.completed_prefix() + 1, {false});
    if (run.finished >= 0) break;
    run.longest_sleep_us = std::max<int64_t>(run.longest_sleep_us, sched.PollInterval().count());
    net->AdvanceTo(net->NextEvent());
    sched.Progress(net->Now());
  }
  return run;
}

TEST(sim_drives_the_real_scheduler_on_virtual_time) {
  // 4 MiB: four chunk costs back to back, measured by the scheduler's own clock (its
  // timeline/pacer read the virtual time).
  SimNetwork net(Fabric(8));
  CHECK_NEAR(OneAllreduce(&net, 1 << 20).finished, 4 * AllreduceCost(net.fabric(), 1 << 20).total());
}

TEST(scheduler_paces_only_across_hosts) {
  // Across hosts the kernel moves the bytes and a slow measured rate lets the thread sleep;
  // on one host MPI moves them only inside Test, so it must poll whatever the rate reads.
  // 64 MiB over a 1 GB/s fabric.
  SimNetwork across(Fabric(8)), one(Fabric(8));
  CHECK(OneAllreduce(&across, 16 << 20).longest_sleep_us > 0);
  CHECK_EQ(OneAllreduce(&one, 16 << 20, true).longest_sleep_us, 0);
}

// Small allreduces queued together are fused, except those with error feedback: their output
// residuals stay with the rank that reduced each element, which must not depend on what else
// happened to be ready in the same step.
static int64_t FusedBuffers(bool error_feedback) {
  SimNetwork net(Fabric(8));
  SimCommunicator comm(&net);
  Timeline timeline("", 0);
  Stats stats;
  SchedulerOptions o{1 << 20, 1, 1 << 20, false};
  Scheduler sched(&comm, &timeline, &stats, o);
  std::vector<std::vector<float>> data(3, std::vector<float>(256, 1.0f));
  std::vector<Request> requests(3);
  int finished = 0;
  for (int i = 0; i < 3; ++i) {
    Request& r = requests[i];
    r.name = "g" + std::to_string(i);
    r.inputs = {TensorInput{data[i].data(), {int64_t(data[i].size())}}};
    r.allocate_output = [&data, i](int, const Shape&, void** out) { *out = data[i].data(); return Status::Ok(); };
    RequestMeta meta = RequestMeta::From(r);
    meta.error_feedback = error_feedback;
    sched.Add(i, meta, &r, [&](const Status& s) { CHECK(s.ok()); ++finished; }, net.Now(), net.Now());
  }
  while (finished < 3) {
    sched.StartUpTo(net.Now(), sched.completed_prefix() + 1, {false});
    if (finished == 3) break;
    net.AdvanceTo(net.NextEvent());
    sched.Progress(net.Now());
  }
  const std::string json = stats.Json();
  const size_t at = json.find("\"fused_buffers\": ");
  CHECK(at != std::string::npos);
  return std::atoll(json.c_str() + at + 17);
}

TEST(error_feedback_allreduces_are_never_fused) {
  CHECK_EQ(FusedBuffers(false), 1);
  CHECK_EQ(FusedBuffers(true), 0);
}
