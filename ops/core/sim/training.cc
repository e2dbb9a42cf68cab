// RunTraining (training.h): the layers' compute on the virtual clock of a SimNetwork, their
// gradients reduced by the real Engine over a SimCommunicator, stepped by SimBackgroundThread.
#include "training.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <sstream>

#include "../engine.h"
#include "../stats.h"
#include "../timeline.h"
#include "background_thread.h"

namespace mlsl {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kTwoPi = 6.283185307179586;

std::string Num(double x) {
  std::ostringstream os;
  os.precision(9);
  os << x;
  return os.str();
}

// Per step, the largest of `ranks` lognormal factors of mean 1 (sigma: of their log). Box-Muller
// over mt19937_64's integers: unlike std::normal_distribution's, its output is fixed by the
// standard, so a seed gives the same draws with any standard library.
std::vector<double> SlowestFactors(int steps, int ranks, double sigma, uint64_t seed) {
  std::vector<double> out(std::max(0, steps), 1.0);
  if (sigma <= 0) return out;
  std::mt19937_64 gen(seed);
  const auto uniform = [&gen] { return (double(gen() >> 11) + 0.5) * 0x1.0p-53; };  // (0, 1)
  for (double& f : out) {
    double z = -kInf;
    for (int r = 0; r < ranks; r += 2) {
      const double radius = std::sqrt(-2 * std::log(uniform())), angle = kTwoPi * uniform();
      z = std::max(z, radius * std::cos(angle));
      if (r + 1 < ranks) z = std::max(z, radius * std::sin(angle));
    }
    f = std::exp(sigma * z - sigma * sigma / 2);
  }
  return out;
}

// One simulated process standing for every rank: the compute of its layers, the gradients each
// backward pass submits, and the background thread that reduces them.
class Trainer {
 public:
  explicit Trainer(const SimConfig& cfg);
  bool Run(SimResult* out, std::string* error);

 private:
  void MakeRequests(SimResult* out);
  void Submit(int layer);  // a backward pass ended: its gradients go to the runtime
  bool Compute();          // ends or starts a compute task now; true when something changed
  bool AllReduced(int step) const;
  // Compute: task k of a step is forward k (k < L), else backward 2L-1-k.
  int L() const { return int(cfg_.layers.size()); }  // layers
  int S() const { return cfg_.steps; }               // steps
  bool Done() const { return step_ >= S() && thread_->Quiet(); }
  void Advance(double next);
  void Summarize(SimResult* out) const;

  const SimConfig& cfg_;
  SimNetwork net_;
  Timeline timeline_;
  Stats stats_;
  std::unique_ptr<SimBackgroundThread> thread_;
  std::vector<Request> requests_;             // each gradient's; a copy is submitted every step
  std::vector<int> layer_of_;                 // by request
  std::vector<std::vector<int>> of_layer_;    // requests by layer, in forward order
  std::vector<float> data_;                   // one buffer serves every tensor: only the timing matters
  int step_ = 0, task_ = 0;
  double compute_left_ = -1;                  // s at full speed left in the running task; < 0: none
  std::vector<int> outstanding_;              // gradients of the layer's latest step still reducing
  std::vector<int> reduced_;                  // the latest step whose gradients of this layer are all reduced
  std::vector<double> f0_start_, bwd_end_, busy_at_;
  std::vector<uint64_t> cycles_at_;
  std::vector<double> factor_;                // the slowest rank's compute factor, by step
  std::string error_;
};

Trainer::Trainer(const SimConfig& cfg)
    : cfg_(cfg), net_(cfg.fabric), timeline_(cfg.timeline, 0), of_layer_(cfg.layers.size()),
      outstanding_(L(), 0), reduced_(L(), -1),
      f0_start_(S(), 0), bwd_end_(S(), 0), busy_at_(S(), 0), cycles_at_(S(), 0),
      factor_(SlowestFactors(S(), cfg.fabric.ranks, cfg.variance, cfg.seed)) {
  thread_ = std::make_unique<SimBackgroundThread>(&net_, cfg.runtime, cfg.cycle_s, &timeline_, &stats_);
}

void Trainer::MakeRequests(SimResult* out) {
  // Gradients in forward order: priority = index (the optimizer's convention).
  int64_t largest = 0;
  for (int l = 0; l < L(); ++l) {
    for (int64_t b : cfg_.layers[l].grads) {
      of_layer_[l].push_back(int(requests_.size()));
      layer_of_.push_back(l);
      Request r;
      r.name = cfg_.layers[l].name + "/grad" + std::to_string(requests_.size());
      r.priority = int(requests_.size());
      r.inputs = {TensorInput{nullptr, {b / 4}}};
      if (cfg_.bf16) r.wire = int(DataType::kBfloat16);
      requests_.push_back(std::move(r));
      largest = std::max(largest, b);
      out->bytes += b;
    }
  }
  data_.assign(size_t(std::max<int64_t>(1, largest / 4)), 1.0f);
  float* buf = data_.data();
  for (Request& r : requests_) {
    r.inputs[0].data = buf;
    r.allocate_output = [buf](int, const Shape&, void** p) {
      *p = buf;
      return Status::Ok();
    };
  }
}

void Trainer::Submit(int l) {
  const int s = step_;
  outstanding_[l] = int(of_layer_[l].size());
  if (of_layer_[l].empty()) reduced_[l] = s;
  // Backprop produces a layer's gradients last to first.
  for (auto it = of_layer_[l].rbegin(); it != of_layer_[l].rend(); ++it) {
    auto r = std::make_unique<Request>(requests_[*it]);
    r->done = [this, l, s](const Status& st) {
      if (!st.ok() && error_.empty()) error_ = st.message();
      if (--outstanding_[l] == 0) reduced_[l] = s;
    };
    thread_->Submit(std::move(r));
  }
}

bool Trainer::AllReduced(int s) const {
  for (int l = 0; l < L(); ++l) if (reduced_[l] < s) return false;
  return true;
}

bool Trainer::Compute() {
  bool changed = false;
  const double now = net_.now();
  if (compute_left_ >= 0 && compute_left_ <= 1e-12) {
    compute_left_ = -1;
    if (task_ >= L()) {
      const int l = 2 * L() - 1 - task_;
      Submit(l);
      if (l == 0) bwd_end_[step_] = now;
    }
    if (++task_ == 2 * L()) {
      task_ = 0;
      ++step_;
    }
    changed = true;
  }
  if (compute_left_ < 0 && step_ < S()) {
    bool ready = true;
    if (task_ < L() && step_ > 0) ready = cfg_.cross_iteration ? reduced_[task_] >= step_ - 1 : AllReduced(step_ - 1);
    if (ready) {
      const SimLayer& layer = cfg_.layers[task_ < L() ? task_ : 2 * L() - 1 - task_];
      if (task_ == 0) {
        f0_start_[step_] = now;
        busy_at_[step_] = net_.link_busy();
        cycles_at_[step_] = thread_->engine().cycles();
      }
      compute_left_ = (task_ < L() ? layer.fwd : layer.bwd) * factor_[step_];
      changed = true;
    }
  }
  return changed;
}

void Trainer::Advance(double next) {
  // Compute slows by 1 + interference while the link carries data (the CPU drives the transfer)
  // and by codec_interference more while the background thread encodes or decodes; the
  // transfers slow by 1 + contention, the codec by 1 + codec_contention, while it computes.
  const double slow = 1 + (net_.link_active() ? cfg_.interference : 0) + (net_.cpu_active() ? cfg_.codec_interference : 0);
  const double before = net_.now();
  net_.AdvanceTo(next);
  if (compute_left_ >= 0) {
    compute_left_ = next >= before + compute_left_ * slow ? 0 : compute_left_ - (next - before) / slow;
  }
}

bool Trainer::Run(SimResult* out, std::string* error) {
  MakeRequests(out);
  while (error_.empty()) {
    // Everything due now, compute first (a gradient submitted now wakes the thread now).
    for (int acts = 0; error_.empty(); ++acts) {
      bool changed = Compute();
      if (thread_->NextAction() <= net_.now()) {
        thread_->Act();
        if (!thread_->error().empty()) error_ = thread_->error();
        changed = true;
      }
      if (!changed) break;
      if (acts > 10000000) error_ = "the background thread acts forever at t=" + Num(net_.now()) + " s";
    }
    if (!error_.empty() || Done()) break;
    const double slow = 1 + (net_.link_active() ? cfg_.interference : 0) + (net_.cpu_active() ? cfg_.codec_interference : 0);
    net_.set_link_rate(compute_left_ >= 0 ? 1 / (1 + cfg_.contention) : 1);
    net_.set_cpu_rate(compute_left_ >= 0 ? 1 / (1 + cfg_.codec_contention) : 1);
    const double next = std::min({compute_left_ >= 0 ? net_.now() + compute_left_ * slow : kInf, net_.NextEvent(),
                                  step_ < S() || !thread_->Quiet() ? thread_->NextAction() : kInf});
    if (!(next < kInf) || next < net_.now()) {
      error_ = "the simulation stalled at t=" + Num(net_.now()) + " s (step " + std::to_string(step_) + ")";
      break;
    }
    Advance(next);
  }
  if (!error_.empty()) {
    *error = error_;
    return false;
  }
  Summarize(out);
  return true;
}

void Trainer::Summarize(SimResult* out) const {
  const int w = cfg_.warmup, intervals = S() - 1 - w;
  out->step = (f0_start_[S() - 1] - f0_start_[w]) / intervals;
  for (const SimLayer& l : cfg_.layers) out->compute += l.fwd + l.bwd;
  out->slowest = 0;
  for (int s = w; s < S() - 1; ++s) out->slowest += factor_[s] / intervals;
  out->efficiency = out->compute / out->step;
  out->exposed = out->step - out->compute;
  for (int s = w; s < S() - 1; ++s) out->first_exposed += (f0_start_[s + 1] - bwd_end_[s]) / intervals;
  out->link_busy = (busy_at_[S() - 1] - busy_at_[w]) / intervals;
  out->cycles = int64_t(cycles_at_[S() - 1] - cycles_at_[w]) / intervals;
  out->stats = stats_.Json();
}

}  // namespace

bool RunTraining(const SimConfig& config, SimResult* result, std::string* error) {
  Trainer trainer(config);
  return trainer.Run(result, error);
}

}  // namespace mlsl
