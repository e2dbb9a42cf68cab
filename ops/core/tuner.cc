// Tuner and StepTimer (tuner.h): rank 0's step clock and search, every rank's application.
#include "tuner.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "logging.h"

namespace mlsl {
namespace {

constexpr uint64_t kNone = ~uint64_t(0);
constexpr uint64_t kTrial = 0, kFinal = 1;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

const char* const kNames[kTuneKnobs] = {"MLSL_TF_INFLIGHT", "MLSL_TF_SPIN_US"};

}  // namespace

bool StepTimer::Submitted(const std::string& name, Clock::time_point now, double* seconds) {
  if (marker_.empty()) {
    if (!seen_.count(name)) {
      if (seen_.size() < kMostNames) seen_.insert(name);
      return false;
    }
    marker_ = name;  // its second submission: the first step starts
    seen_.clear();
    last_ = now;
    timing_ = true;
    return false;
  }
  if (name != marker_) return false;
  ++count_;  // a step ended; timed when it began under the values in force
  const bool timed = timing_;
  if (timed) *seconds = std::chrono::duration<double>(now - last_).count();
  last_ = now;
  timing_ = true;
  return timed;
}

Tuner::Tuner(const TuneOptions& options, int rank)
    : options_(options), rank_(rank), values_(options.initial), frozen_(!options.enabled) {
  if (options_.steps_per_sample < 1) options_.steps_per_sample = 1;
  search_.skip = int64_t(options_.warmup_samples) * options_.steps_per_sample;
  search_.best = search_.start = values_;
}

const char* Tuner::Name(int knob) { return kNames[knob]; }

const std::vector<int64_t>& Tuner::Candidates(int knob) {
  // In-flight units: 1 (one at a time) to 16; spin: none to 1 ms. Both change when and how
  // often the thread tests and starts transfers, never what a transfer carries.
  static const std::vector<int64_t> inflight{1, 2, 4, 8, 16}, spin{0, 50, 200, 1000};
  return knob == kTuneInflight ? inflight : spin;
}

int64_t Tuner::MostInflight() {
  const std::vector<int64_t>& c = Candidates(kTuneInflight);
  return *std::max_element(c.begin(), c.end());
}

void Tuner::Submitted(const std::string& name, Clock::time_point now) {
  if (frozen_ || rank_ != 0) return;
  double seconds = 0;
  if (steps_.Submitted(name, now, &seconds)) OnStep(seconds);
}

void Tuner::OnStep(double seconds) {
  if (search_.pending) return;  // the values are about to change: this step counts for neither
  if (search_.skip > 0) {
    --search_.skip;
    return;
  }
  search_.times.push_back(seconds);
  if (int64_t(search_.times.size()) < options_.steps_per_sample) return;
  const double score = Median(search_.times);
  search_.times.clear();
  if (search_.confirm_left > 0) {
    Confirm(score);
  } else {
    EndSample(score);
  }
}

void Tuner::EndSample(double seconds_per_step) {
  ++search_.samples;
  if (search_.samples == 1) search_.start_scores.push_back(seconds_per_step);
  const bool better = search_.best_score == 0 || seconds_per_step < search_.best_score;
  if (better) {
    search_.best = values_;
    search_.best_score = seconds_per_step;
  }
  LogRow("sample", values_, seconds_per_step, better);
  Values next{};
  if (NextTrial(&next)) {
    Propose(next, false);
  } else if (search_.best == search_.start) {
    Propose(search_.best, true);
  } else {  // confirm the winner against the start: start, winner, start, winner, ...
    search_.best_scores = {search_.best_score};
    search_.confirm_left = 2 * kConfirmPairs;
    Propose(search_.start, false);
  }
}

void Tuner::Confirm(double seconds_per_step) {
  ++search_.samples;
  const bool at_start = values_ == search_.start;
  (at_start ? search_.start_scores : search_.best_scores).push_back(seconds_per_step);
  LogRow("confirm", values_, seconds_per_step, false);
  if (--search_.confirm_left > 0) {
    Propose(at_start ? search_.best : search_.start, false);
    return;
  }
  const double start = Median(search_.start_scores), best = Median(search_.best_scores);
  if (!(best < start)) search_.best = search_.start;
  search_.best_score = std::min(start, best);
  Propose(search_.best, true);
}

bool Tuner::NextTrial(Values* out) {
  while (search_.knob < kTuneKnobs) {
    if (search_.knob >= 0 && search_.next < int(Candidates(search_.knob).size())) {
      const int64_t v = Candidates(search_.knob)[search_.next++];
      if (v == search_.pass_start) continue;  // measured: the best when this knob's pass began
      *out = search_.best;
      (*out)[search_.knob] = v;
      return true;
    }
    do {
      ++search_.knob;
    } while (search_.knob < kTuneKnobs && options_.fixed[search_.knob]);
    if (search_.knob < kTuneKnobs) {
      search_.next = 0;
      search_.pass_start = search_.best[search_.knob];
    }
  }
  return false;
}

void Tuner::Propose(const Values& values, bool final) {
  search_.pending = true;
  search_.final = final;
  search_.proposal = values;
}

void Tuner::Fill(std::vector<uint64_t>* words) const {
  words->assign(size_t(kTuneWords), kNone);
  if (rank_ != 0 || !search_.pending) return;
  (*words)[0] = search_.final ? kFinal : kTrial;
  for (int k = 0; k < kTuneKnobs; ++k) (*words)[1 + k] = uint64_t(search_.proposal[k]);
}

bool Tuner::Apply(const std::vector<uint64_t>& words, uint64_t cycle) {
  if (int64_t(words.size()) < kTuneWords || words[0] == kNone || frozen_) return false;
  const bool final = words[0] == kFinal;
  std::array<uint64_t, 2 + kTuneKnobs> row{cycle, final ? 1u : 0u};
  for (int k = 0; k < kTuneKnobs; ++k) {
    if (words[1 + k] != kNone) values_[k] = int64_t(words[1 + k]);
    row[2 + k] = uint64_t(values_[k]);
  }
  applied_.push_back(row);
  frozen_ = final;
  if (rank_ != 0) return true;
  search_.pending = false;
  search_.times.clear();
  steps_.Restart();  // the step under way ran partly under the old values
  search_.cycle = cycle;
  search_.step = uint64_t(steps_.count());
  if (final) LogRow("final", values_, search_.best_score, true);
  return true;
}

std::string Tuner::LogHeader() {
  std::string h = "kind,sample,cycle,step";
  for (int k = 0; k < kTuneKnobs; ++k) h += std::string(",") + kNames[k];
  return h + ",seconds_per_step,best\n";
}

void Tuner::LogRow(const char* kind, const Values& values, double score, bool best) const {
  if (options_.log.empty() || rank_ != 0) return;
  std::ostringstream row;
  row << kind << "," << search_.samples << "," << search_.cycle << "," << search_.step;
  for (int k = 0; k < kTuneKnobs; ++k) row << "," << values[k];
  char text[32];
  std::snprintf(text, sizeof(text), "%.9g", score);
  row << "," << text << "," << (best ? 1 : 0) << "\n";
  // Opened per row (a row per sample): the file is complete after each, readable while the job runs.
  std::FILE* f = std::fopen(options_.log.c_str(), "a");
  const std::string line = row.str();
  if (!f || std::fwrite(line.data(), 1, line.size(), f) != line.size()) {
    Log(LogLevel::kWarning, "could not append to the autotune log " + options_.log);
  }
  if (f) std::fclose(f);
}

std::string Tuner::Json() const {
  std::ostringstream os;
  os << "{\"enabled\": " << (options_.enabled ? "true" : "false") << ", \"frozen\": " << (frozen_ ? "true" : "false")
     << ", \"values\": {";
  for (int k = 0; k < kTuneKnobs; ++k) os << (k ? ", " : "") << "\"" << kNames[k] << "\": " << values_[k];
  os << "}, \"tuned\": [";
  bool first = true;
  for (int k = 0; k < kTuneKnobs; ++k) {
    if (!options_.enabled || options_.fixed[k]) continue;
    os << (first ? "" : ", ") << "\"" << kNames[k] << "\"";
    first = false;
  }
  os << "], \"candidates\": {";
  for (int k = 0; k < kTuneKnobs; ++k) {
    os << (k ? ", " : "") << "\"" << kNames[k] << "\": [";
    for (size_t i = 0; i < Candidates(k).size(); ++i) os << (i ? ", " : "") << Candidates(k)[i];
    os << "]";
  }
  os << "}, \"applied\": [";
  for (size_t i = 0; i < applied_.size(); ++i) {
    os << (i ? ", " : "") << "[";
    for (size_t j = 0; j < applied_[i].size(); ++j) os << (j ? ", " : "") << applied_[i][j];
    os << "]";
  }
  os << "]}";
  return os.str();
}

}  // namespace mlsl
