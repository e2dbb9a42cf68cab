#include "training.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <sstream>

#include "../control_message.h"
#include "../meta.h"
#include "../stats.h"
#include "../timeline.h"

namespace mlsl {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Tensor {
  int layer;
  int32_t id;  // agreement order: first submitted, first numbered (backprop order)
  Request request;
  RequestMeta meta;
};

int64_t Words(int64_t bits) { return (bits + 63) / 64; }

std::string Num(double x) {
  std::ostringstream os;
  os.precision(9);
  os << x;
  return os.str();
}

}  // namespace

bool ParseConfig(std::istream& in, SimConfig* c, std::string* error, bool layers) {
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    line = line.substr(0, line.find('#'));
    std::istringstream ls(line);
    std::string key;
    if (!(ls >> key)) continue;
    bool ok = true;
    SimFabric& f = c->fabric;
    SchedulerOptions& s = c->scheduler;
    int flag = 0;
    if (key == "layer") {
      SimLayer l;
      ok = bool(ls >> l.name >> l.fwd >> l.bwd);
      int64_t b;
      while (ok && ls >> b) l.grads.push_back(b);
      c->layers.push_back(l);
    } else if (key == "ranks") ok = bool(ls >> f.ranks) && f.ranks >= 1;
    else if (key == "ranks_per_host") ok = bool(ls >> f.ranks_per_host) && f.ranks_per_host >= 1;
    else if (key == "alpha") ok = bool(ls >> f.alpha);
    else if (key == "beta") ok = bool(ls >> f.beta);
    else if (key == "alpha_shm") ok = bool(ls >> f.alpha_shm);
    else if (key == "beta_shm") ok = bool(ls >> f.beta_shm);
    else if (key == "gamma") ok = bool(ls >> f.gamma);
    else if (key == "codec") ok = bool(ls >> f.codec);
    else if (key == "shared_cores") ok = bool(ls >> f.shared_cores) && f.shared_cores >= 0;
    else if (key == "cpu_beta") ok = bool(ls >> f.cpu_beta) && f.cpu_beta >= 0;
    else if (key == "thread_progress") { ok = bool(ls >> flag); f.thread_progress = flag; }
    else if (key == "allreduce") ok = bool(ls >> f.allreduce) &&
             (f.allreduce == "auto" || f.allreduce == "rd" || f.allreduce == "rabenseifner" || f.allreduce == "ring");
    else if (key == "chunk_bytes") ok = bool(ls >> s.chunk_bytes) && s.chunk_bytes > 0;
    else if (key == "inflight") ok = bool(ls >> s.inflight) && s.inflight >= 1;
    else if (key == "fusion_threshold") ok = bool(ls >> s.fusion_threshold);
    else if (key == "fifo") { ok = bool(ls >> flag); s.fifo = flag; }
    else if (key == "cross_iteration") { ok = bool(ls >> flag); c->cross_iteration = flag; }
    else if (key == "bf16") { ok = bool(ls >> flag); c->bf16 = flag; }
    else if (key == "cycle_s") ok = bool(ls >> c->cycle_s);
    else if (key == "interference") ok = bool(ls >> c->interference) && c->interference >= 0;
    else if (key == "contention") ok = bool(ls >> c->contention) && c->contention >= 0;
    else if (key == "codec_interference") ok = bool(ls >> c->codec_interference) && c->codec_interference >= 0;
    else if (key == "codec_contention") ok = bool(ls >> c->codec_contention) && c->codec_contention >= 0;
    else if (key == "steps") ok = bool(ls >> c->steps);
    else if (key == "warmup") ok = bool(ls >> c->warmup);
    else if (key == "timeline") ok = bool(ls >> c->timeline);
    else if (key == "label") ok = bool(ls >> c->label);
    else ok = false;
    if (!ok) {
      *error = "line " + std::to_string(n) + ": cannot read '" + line + "'";
      return false;
    }
  }
  if (layers && c->layers.empty()) *error = "no layers";
  else if (c->warmup < 0 || c->steps < c->warmup + 2) *error = "need steps >= warmup + 2";
  return error->empty();
}

bool RunTraining(const SimConfig& cfg, SimResult* out, std::string* error) {
  SimNetwork net(cfg.fabric);
  SimCommunicator comm(&net);
  const int ranks = cfg.fabric.ranks;
  std::vector<int> everyone(ranks);
  for (int r = 0; r < ranks; ++r) everyone[r] = r;
  std::unique_ptr<Communicator> control;  // the Runtime's own communicator for control messages
  comm.Split(everyone, &control);
  Timeline timeline(cfg.timeline, 0);
  Stats stats;
  SchedulerOptions options = cfg.scheduler;
  options.clock = &net;
  Scheduler sched(&comm, &timeline, &stats, options);

  // Gradients in forward order: priority = index (the optimizer's convention); ids in the
  // order backprop first submits them.
  const int L = int(cfg.layers.size());
  std::vector<Tensor> tensors;
  std::vector<std::vector<int>> of_layer(L);
  int64_t largest = 0;
  for (int l = 0; l < L; ++l) {
    for (int64_t b : cfg.layers[l].grads) {
      of_layer[l].push_back(int(tensors.size()));
      tensors.push_back(Tensor{l, 0, {}, {}});
      largest = std::max(largest, b);
      out->bytes += b;
    }
  }
  // One buffer serves every tensor: the simulation needs the timing, not the values.
  std::vector<float> data(size_t(std::max<int64_t>(1, largest / 4)), 1.0f);
  int32_t next_id = 0;
  for (int l = L - 1; l >= 0; --l) {
    for (auto it = of_layer[l].rbegin(); it != of_layer[l].rend(); ++it) tensors[*it].id = next_id++;
  }
  for (size_t j = 0; j < tensors.size(); ++j) {
    Tensor& t = tensors[j];
    Request& r = t.request;
    r.name = cfg.layers[t.layer].name + "/grad" + std::to_string(j);
    r.priority = int(j);
    const int64_t bytes = cfg.layers[t.layer].grads[j - of_layer[t.layer][0]];
    r.inputs = {TensorInput{data.data(), {bytes / 4}}};
    float* buf = data.data();
    r.allocate_output = [buf](int, const Shape&, void** p) { *p = buf; return Status::Ok(); };
    t.meta = RequestMeta::From(r);
    t.meta.wire = cfg.bf16 ? DataType::kBfloat16 : DataType::kFloat32;
  }
  std::vector<int32_t> by_id(tensors.size());
  for (size_t j = 0; j < tensors.size(); ++j) by_id[tensors[j].id] = int32_t(j);

  // Compute: task k of a step is forward k (k < L), else backward 2L-1-k.
  const int S = cfg.steps;
  int step = 0, task = 0;
  double compute_left = -1;  // s of compute at full speed left in the running task; < 0: none
  std::vector<int> outstanding(L, 0);   // gradients of the layer's latest step still reducing
  std::vector<int> reduced(L, -1);      // the latest step whose gradients of this layer are all reduced
  std::vector<double> f0_start(S, 0), bwd_end(S, 0), busy_at(S, 0);
  std::vector<int64_t> cycles_at(S, 0);
  auto all_reduced = [&](int s) {
    for (int l = 0; l < L; ++l) if (reduced[l] < s) return false;
    return true;
  };

  // The background cycle (Runtime::Cycle).
  std::vector<int> incoming;            // submitted since the current cycle began
  std::vector<int> carried;             // the current cycle's ready ids
  std::unique_ptr<PendingOp> cycle;
  uint64_t done_at_start = 0;
  double cycle_bound = 0, poll_until = 0;
  int64_t cycles = 0;
  // The control message's cost: the 6 words of the layout this model was calibrated with
  // (flags, joined and shut-down ranks, ready ids), not the runtime's ControlMessage (4 words
  // more): with those, benchmarks/calibrate_sim.py's round trip (tests/unit/test_calibrate_sim.py)
  // fits the 3-host link at 7.15e-9 s/B instead of 8e-9 and the CPU factor at 0.35 instead of 0.3.
  const int rank_words = int(Words(ranks));
  std::vector<uint64_t> words(2 + 2 * rank_words + Words(int64_t(tensors.size())) + 1, 0);

  // A gradient's step: the step whose backward submitted it; kept per layer.
  std::vector<int> submitted_step(L, -1);

  while (true) {
    bool changed = true;
    while (changed) {
      changed = false;
      const double now = net.now();
      sched.Progress();
      if (compute_left >= 0 && compute_left <= 1e-12) {
        compute_left = -1;
        if (task >= L) {  // a backward pass ended: its gradients go to the runtime
          const int l = 2 * L - 1 - task;
          submitted_step[l] = step;
          outstanding[l] = int(of_layer[l].size());
          if (of_layer[l].empty()) reduced[l] = step;
          for (auto it = of_layer[l].rbegin(); it != of_layer[l].rend(); ++it) incoming.push_back(*it);
          if (l == 0) bwd_end[step] = now;
        }
        if (++task == 2 * L) {
          task = 0;
          ++step;
        }
        changed = true;
      }
      if (compute_left < 0 && step < S) {
        bool ready = true;
        if (task < L && step > 0) ready = cfg.cross_iteration ? reduced[task] >= step - 1 : all_reduced(step - 1);
        if (ready) {
          const SimLayer& layer = cfg.layers[task < L ? task : 2 * L - 1 - task];
          if (task == 0) {
            f0_start[step] = now;
            busy_at[step] = net.link_busy();
            cycles_at[step] = cycles;
          }
          compute_left = task < L ? layer.fwd : layer.bwd;
          changed = true;
        }
      }
      if (cycle) {
        bool done = false;
        cycle->Test(&done);
        if (done) {
          cycle.reset();
          ++cycles;
          std::sort(carried.begin(), carried.end(), [&](int a, int b) { return tensors[a].id < tensors[b].id; });
          for (int j : carried) {
            Tensor& t = tensors[j];
            const int l = t.layer, s = submitted_step[l];
            sched.Add(t.id, t.meta, &t.request,
                      [&, l, s](const Status&) { if (--outstanding[l] == 0) reduced[l] = s; }, net.Now());
          }
          carried.clear();
          sched.StartUpTo(done_at_start + uint64_t(options.inflight), {});
          sched.Progress();
          poll_until = incoming.empty() && !sched.idle()
                           ? net.now() + std::chrono::duration<double>(sched.PollInterval()).count()
                           : 0;
          changed = true;
        }
      }
      const bool work = !incoming.empty() || !sched.idle();
      if (!cycle && work && now >= cycle_bound && (now >= poll_until || !incoming.empty())) {
        carried.swap(incoming);
        done_at_start = sched.completed_prefix();
        cycle = control->AllreduceWords(words.data(), int64_t(words.size()), &ControlMessage::Combine);
        cycle_bound = now + cfg.cycle_s;
        changed = true;
      }
    }
    const bool work = !incoming.empty() || !sched.idle() || cycle;
    if (step >= S && !work) break;
    // Compute slows by 1 + interference while the link carries data (the CPU drives the transfer)
    // and by codec_interference more while the background thread encodes or decodes;
    const double slow = 1 + (net.link_active() ? cfg.interference : 0) + (net.cpu_active() ? cfg.codec_interference : 0);
    // the transfers slow by 1 + contention, the codec by 1 + codec_contention, while it computes.
    net.set_link_rate(compute_left >= 0 ? 1 / (1 + cfg.contention) : 1);
    net.set_cpu_rate(compute_left >= 0 ? 1 / (1 + cfg.codec_contention) : 1);
    double next = std::min(compute_left >= 0 ? net.now() + compute_left * slow : kInf, net.NextEvent());
    if (!cycle && work) next = std::min(next, std::max(cycle_bound, incoming.empty() ? poll_until : 0.0));
    if (!(next < kInf) || next < net.now()) {
      *error = "the simulation stalled at t=" + Num(net.now()) + " s (step " + std::to_string(step) + ")";
      return false;
    }
    const double before = net.now();
    net.AdvanceTo(next);
    if (compute_left >= 0) compute_left = next >= before + compute_left * slow ? 0 : compute_left - (next - before) / slow;
  }

  const int w = cfg.warmup, intervals = S - 1 - w;
  out->step = (f0_start[S - 1] - f0_start[w]) / intervals;
  for (const SimLayer& l : cfg.layers) out->compute += l.fwd + l.bwd;
  out->efficiency = out->compute / out->step;
  out->exposed = out->step - out->compute;
  for (int s = w; s < S - 1; ++s) out->first_exposed += (f0_start[s + 1] - bwd_end[s]) / intervals;
  out->link_busy = (busy_at[S - 1] - busy_at[w]) / intervals;
  out->cycles = (cycles_at[S - 1] - cycles_at[w]) / intervals;
  out->stats = stats.Json();
  return true;
}

std::string ResultJson(const SimConfig& c, const SimResult& r) {
  const SimFabric& f = c.fabric;
  std::ostringstream os;
  os << "{\"label\": \"" << JsonEscape(c.label) << "\", \"nodes\": " << f.ranks
     << ", \"ranks_per_host\": " << f.ranks_per_host << ", \"alpha_s\": " << Num(f.alpha)
     << ", \"link_gbit\": " << Num(8 / f.beta / 1e9) << ", \"allreduce\": \"" << f.allreduce
     << "\", \"codec\": " << Num(f.codec) << ", \"shared_cores\": " << f.shared_cores
     << ", \"cpu_beta\": " << Num(f.cpu_beta) << ", \"thread_progress\": " << (f.thread_progress ? "true" : "false")
     << ", \"fifo\": " << (c.scheduler.fifo ? "true" : "false")
     << ", \"cross_iteration\": " << (c.cross_iteration ? "true" : "false")
     << ", \"bf16\": " << (c.bf16 ? "true" : "false") << ", \"chunk_bytes\": " << c.scheduler.chunk_bytes
     << ", \"inflight\": " << c.scheduler.inflight << ", \"fusion_threshold\": " << c.scheduler.fusion_threshold
     << ", \"cycle_s\": " << Num(c.cycle_s) << ", \"interference\": " << Num(c.interference)
     << ", \"contention\": " << Num(c.contention) << ", \"codec_interference\": " << Num(c.codec_interference)
     << ", \"codec_contention\": " << Num(c.codec_contention) << ", \"layers\": " << c.layers.size()
     << ", \"grad_bytes\": " << r.bytes << ", \"step_s\": " << Num(r.step) << ", \"compute_s\": " << Num(r.compute)
     << ", \"efficiency\": " << Num(r.efficiency) << ", \"exposed_s\": " << Num(r.exposed)
     << ", \"first_layer_exposed_s\": " << Num(r.first_exposed) << ", \"link_busy_s\": " << Num(r.link_busy)
     << ", \"cycles_per_step\": " << r.cycles << ", \"stats\": " << r.stats << "}";
  return os.str();
}

}  // namespace mlsl
