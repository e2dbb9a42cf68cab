// Tuner: autotune (MLSL_TF_AUTOTUNE) -- rank 0 times training steps under candidate values of the settings that change no result bit, every rank applies each choice in the cycle whose control message carries it, and the best is frozen.
//
// What is tuned: the knobs below, pure pacing (when and how many transfers run, how long the
// thread polls), never which element is reduced with which, in what order or on what wire
// (docs/autotune.md says which settings are excluded and why; tests/mpi/test_autotune.py shows
// the bits). A knob the user set in the environment keeps its value.
//
// A step: the interval between two submissions, on rank 0, of the first collective name that
// rank 0 ever saw submitted twice (in training, one of every step's gradients). A sample: the
// mean step time over `steps_per_sample` whole steps under one set of values; the first
// `warmup_samples` samples' worth of steps are discarded, and so is the step under way when new
// values are applied; a sample's score is the median of its step times (one slow step -- a
// callback, a collection -- does not move it). The search is a coordinate descent: the starting
// values are sampled, then each knob in turn takes each of its candidates (the others at the best
// so far), the best kept. One short sample per candidate on a noisy machine can crown a lucky
// one, so a winner other than the start is confirmed: the start and the winner alternate for
// kConfirmPairs more samples each, and the winner stays only when the median of its samples beats
// the start's. Then the values are proposed as final and every rank freezes them.
//
// Agreement: only rank 0 proposes. Its proposal rides in the control message's MIN section
// (kTuneWords words; every other rank sends all ones, so the combined words are rank 0's); every
// rank decodes the same combined message in the same cycle and applies it there (Apply), before
// that cycle starts any unit.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <string>
#include <unordered_set>
#include <vector>

#include "control_message.h"

namespace mlsl {

// The tuned knobs, in search order.
enum TuneKnob { kTuneInflight = 0, kTuneSpinUs = 1, kTuneKnobs = 2 };
// A proposal in the control message (kTuneWords words): [kind: 0 a trial, 1 final] [value per knob].
static_assert(kTuneWords == 1 + kTuneKnobs, "control_message.h's kTuneWords: a kind word and one per knob");

struct TuneOptions {
  bool enabled = false;             // MLSL_TF_AUTOTUNE
  int warmup_samples = 3;           // MLSL_TF_AUTOTUNE_WARMUP_SAMPLES
  int steps_per_sample = 10;        // MLSL_TF_AUTOTUNE_STEPS_PER_SAMPLE
  std::string log;                  // MLSL_TF_AUTOTUNE_LOG: rank 0 appends its rows ("": none)
  std::array<int64_t, kTuneKnobs> initial{4, 200};  // the settings' values (the Engine and the
                                                    // Runtime fill in MLSL_TF_INFLIGHT, MLSL_TF_SPIN_US)
  std::array<bool, kTuneKnobs> fixed{};  // set by the user in the environment: never tuned
};

// Rank 0's step clock: the step's marker is the first collective name submitted a second time;
// each later submission of it ends a step.
class StepTimer {
 public:
  using Clock = std::chrono::steady_clock;
  // A submission of `name` at `now`: true, with the step's length in *seconds, when it ended one.
  bool Submitted(const std::string& name, Clock::time_point now, double* seconds);
  // The step under way is not a whole step of the values now in force: the next starts afresh.
  void Restart() { timing_ = false; }
  int64_t count() const { return count_; }  // steps ended since the marker's second submission, timed or not
  const std::string& marker() const { return marker_; }

 private:
  static constexpr size_t kMostNames = 1 << 16;  // names remembered while looking for a marker
  std::unordered_set<std::string> seen_;
  std::string marker_;
  Clock::time_point last_{};
  bool timing_ = false;  // last_ is a step's start
  int64_t count_ = 0;
};

class Tuner {
 public:
  using Clock = std::chrono::steady_clock;
  using Values = std::array<int64_t, kTuneKnobs>;

  Tuner() = default;  // off: the initial values for good
  Tuner(const TuneOptions& options, int rank);

  // The knob's name (its setting) and the values the search tries.
  static const char* Name(int knob);
  static const std::vector<int64_t>& Candidates(int knob);
  // The most in-flight units autotune may choose: a scheduler has that many slots.
  static int64_t MostInflight();
  // Samples each of the start and the descent's winner takes again before the choice is final.
  static constexpr int kConfirmPairs = 2;

  // A collective named `name` entered this rank's engine at `now` (rank 0 times steps by them).
  void Submitted(const std::string& name, Clock::time_point now);
  // This rank's words for this cycle's control message: rank 0's proposal, else all ones.
  void Fill(std::vector<uint64_t>* words) const;
  // The combined words arrived in `cycle`: applies the values they carry, if any (every rank,
  // the same cycle). True when it applied something.
  bool Apply(const std::vector<uint64_t>& words, uint64_t cycle);

  int64_t value(int knob) const { return values_[knob]; }
  bool enabled() const { return options_.enabled; }
  bool frozen() const { return frozen_; }
  // {"enabled", "frozen", "values": {name: value}, "tuned": [names], "candidates": {name: [values]},
  // "applied": [[cycle, final, value...], ...]} for mlsl_tf.stats(): the same on every rank.
  std::string Json() const;
  // The log's first line (CSV).
  static std::string LogHeader();

 private:
  void OnStep(double seconds);
  void EndSample(double seconds_per_step);
  // A sample of the confirmation: the next one, or the final choice after the last.
  void Confirm(double seconds_per_step);
  // The values of the next trial of the search; false when every candidate was tried.
  bool NextTrial(Values* out);
  void Propose(const Values& values, bool final);
  void LogRow(const char* kind, const Values& values, double score, bool best) const;

  TuneOptions options_;
  int rank_ = 0;
  Values values_ = TuneOptions().initial;  // in force on this rank
  bool frozen_ = true;   // the search is over (or autotune is off)
  std::vector<std::array<uint64_t, 2 + kTuneKnobs>> applied_;  // [cycle, final, values...]
  StepTimer steps_;      // rank 0
  // Rank 0's search:
  struct Search {
    int64_t skip = 0;            // steps still to discard
    std::vector<double> times;   // this sample's step times, seconds
    Values best{};
    double best_score = 0;       // seconds per step of `best` (0: not measured yet)
    int knob = -1, next = 0;     // the knob being searched and the index of its next candidate
    int64_t pass_start = 0;      // that knob's value when its pass began (measured already)
    bool pending = false;        // a proposal waits for its cycle
    bool final = false;          // ... the last one
    Values proposal{};
    int samples = 0;
    Values start{};                  // the values sampled first (the settings')
    std::vector<double> start_scores, best_scores;  // every sample of each, for the confirmation
    int confirm_left = 0;            // confirmation samples still to take (0: not confirming)
    uint64_t cycle = 0, step = 0;  // when the values in force were applied
  } search_;
};

}  // namespace mlsl
