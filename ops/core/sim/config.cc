// ParseConfig and ResultJson (training.h): the simulator's input and output formats.
#include <sstream>

#include "../meta.h"
#include "training.h"

namespace mlsl {
namespace {

std::string Num(double x) {
  std::ostringstream os;
  os.precision(9);
  os << x;
  return os.str();
}

// Reads one fabric key's value into f: false when the key is not a fabric key; *ok false when
// its value cannot be read or is out of range.
bool ReadFabric(const std::string& key, std::istream& ls, SimFabric& f, bool* ok) {
  int flag = 0;
  if (key == "ranks") *ok = bool(ls >> f.ranks) && f.ranks >= 1;
  else if (key == "ranks_per_host") *ok = bool(ls >> f.ranks_per_host) && f.ranks_per_host >= 1;
  else if (key == "alpha") *ok = bool(ls >> f.alpha);
  else if (key == "beta") *ok = bool(ls >> f.beta);
  else if (key == "alpha_shm") *ok = bool(ls >> f.alpha_shm);
  else if (key == "beta_shm") *ok = bool(ls >> f.beta_shm);
  else if (key == "gamma") *ok = bool(ls >> f.gamma);
  else if (key == "codec") *ok = bool(ls >> f.codec);
  else if (key == "shared_cores") *ok = bool(ls >> f.shared_cores) && f.shared_cores >= 0;
  else if (key == "cpu_beta") *ok = bool(ls >> f.cpu_beta) && f.cpu_beta >= 0;
  else if (key == "thread_progress") { *ok = bool(ls >> flag); f.thread_progress = flag; }
  else if (key == "hierarchical") { *ok = bool(ls >> flag); f.hierarchical = flag; }
  else if (key == "allreduce") *ok = bool(ls >> f.allreduce) &&
           (f.allreduce == "auto" || f.allreduce == "rd" || f.allreduce == "rabenseifner" || f.allreduce == "ring");
  else return false;
  return true;
}

// Reads one line's key and value into c (the fabric's keys, the runtime's and the run's).
bool ReadKey(const std::string& key, std::istream& ls, SimConfig* c) {
  bool ok = true;
  if (ReadFabric(key, ls, c->fabric, &ok)) return ok;
  SchedulerOptions& s = c->runtime.engine.scheduler;
  int64_t ms = 0;
  int flag = 0;
  if (key == "layer") {
    SimLayer l;
    ok = bool(ls >> l.name >> l.fwd >> l.bwd);
    int64_t b;
    while (ok && ls >> b) l.grads.push_back(b);
    c->layers.push_back(l);
  } else if (key == "request") {
    SimRequest r;
    ok = bool(ls >> r.name >> r.bytes >> r.priority) && r.bytes >= 0;
    if (ok && !(ls >> r.at_s)) r.at_s = 0;
    ok = ok && r.at_s >= 0;
    c->requests.push_back(r);
  } else if (key == "rounds") {
    ok = bool(ls >> c->rounds) && c->rounds >= 1;
  } else if (key == "chunk_bytes") ok = bool(ls >> s.chunk_bytes) && s.chunk_bytes > 0;
  else if (key == "inflight") ok = bool(ls >> s.inflight) && s.inflight >= 1;
  else if (key == "fusion_threshold") ok = bool(ls >> s.fusion_threshold);
  else if (key == "fifo") { ok = bool(ls >> flag); s.fifo = flag; }
  else if (key == "eager_bytes") ok = bool(ls >> c->runtime.engine.eager_bytes) && c->runtime.engine.eager_bytes >= 0;
  else if (key == "heartbeat_ms") {
    ok = bool(ls >> ms) && ms >= 1;
    c->runtime.heartbeat = std::chrono::milliseconds(ms);
  } else if (key == "cross_iteration") { ok = bool(ls >> flag); c->cross_iteration = flag; }
  else if (key == "bf16") { ok = bool(ls >> flag); c->bf16 = flag; }
  else if (key == "cycle_s") ok = bool(ls >> c->cycle_s);
  else if (key == "interference") ok = bool(ls >> c->interference) && c->interference >= 0;
  else if (key == "contention") ok = bool(ls >> c->contention) && c->contention >= 0;
  else if (key == "codec_interference") ok = bool(ls >> c->codec_interference) && c->codec_interference >= 0;
  else if (key == "codec_contention") ok = bool(ls >> c->codec_contention) && c->codec_contention >= 0;
  else if (key == "variance") ok = bool(ls >> c->variance) && c->variance >= 0;
  else if (key == "seed") ok = bool(ls >> c->seed);
  else if (key == "steps") ok = bool(ls >> c->steps);
  else if (key == "warmup") ok = bool(ls >> c->warmup);
  else if (key == "timeline") ok = bool(ls >> c->timeline);
  else if (key == "label") ok = bool(ls >> c->label);
  else ok = false;
  return ok;
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
    if (!ReadKey(key, ls, c)) {
      *error = "line " + std::to_string(n) + ": cannot read '" + line + "'";
      return false;
    }
  }
  if (layers && c->layers.empty()) *error = "no layers";
  else if (c->warmup < 0 || c->steps < c->warmup + 2) *error = "need steps >= warmup + 2";
  return error->empty();
}

std::string ResultJson(const SimConfig& c, const SimResult& r) {
  const SimFabric& f = c.fabric;
  std::ostringstream os;
  os << "{\"label\": \"" << JsonEscape(c.label) << "\", \"nodes\": " << f.ranks
     << ", \"ranks_per_host\": " << f.ranks_per_host << ", \"alpha_s\": " << Num(f.alpha)
     << ", \"link_gbit\": " << Num(8 / f.beta / 1e9) << ", \"allreduce\": \"" << f.allreduce
     << "\", \"codec\": " << Num(f.codec) << ", \"shared_cores\": " << f.shared_cores
     << ", \"cpu_beta\": " << Num(f.cpu_beta) << ", \"thread_progress\": " << (f.thread_progress ? "true" : "false")
     << ", \"fifo\": " << (c.runtime.engine.scheduler.fifo ? "true" : "false")
     << ", \"cross_iteration\": " << (c.cross_iteration ? "true" : "false")
     << ", \"bf16\": " << (c.bf16 ? "true" : "false") << ", \"chunk_bytes\": " << c.runtime.engine.scheduler.chunk_bytes
     << ", \"inflight\": " << c.runtime.engine.scheduler.inflight << ", \"fusion_threshold\": " << c.runtime.engine.scheduler.fusion_threshold
     << ", \"eager_bytes\": " << c.runtime.engine.eager_bytes
     << ", \"heartbeat_ms\": " << c.runtime.heartbeat.count() << ", \"cycle_s\": " << Num(c.cycle_s) << ", \"interference\": " << Num(c.interference)
     << ", \"contention\": " << Num(c.contention) << ", \"codec_interference\": " << Num(c.codec_interference)
     << ", \"codec_contention\": " << Num(c.codec_contention) << ", \"variance\": " << Num(c.variance)
     << ", \"seed\": " << c.seed << ", \"hierarchical\": " << (f.hierarchical ? "true" : "false")
     << ", \"layers\": " << c.layers.size()
     << ", \"grad_bytes\": " << r.bytes << ", \"step_s\": " << Num(r.step) << ", \"compute_s\": " << Num(r.compute)
     << ", \"slowest_factor\": " << Num(r.slowest) << ", \"efficiency\": " << Num(r.efficiency) << ", \"exposed_s\": " << Num(r.exposed)
     << ", \"first_layer_exposed_s\": " << Num(r.first_exposed) << ", \"link_busy_s\": " << Num(r.link_busy)
     << ", \"cycles_per_step\": " << r.cycles << ", \"stats\": " << r.stats << "}";
  return os.str();
}

}  // namespace mlsl
