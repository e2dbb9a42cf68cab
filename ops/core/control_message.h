// ControlMessage: the one message every rank allreduces each background cycle -- its fields,
// their layout as uint64 words (Encode), the rule that combines two ranks' words (Combine,
// handed to Communicator::AllreduceWords) and reading the combined words back (Decode).
//
// Layout: [k | m << 32] [flags] [joined ranks] [shut-down ranks] [ready ids]   -- k words, AND
//         [units done per group] [wanted eager region] [fingerprint] [~fingerprint]
//         [tune: kTuneWords]                                                   -- m words, MIN
//         [eager region (eager.h)]                                             -- CombineEager
// Flags and per-rank bits travel inverted, so the AND works as an OR for them ("some rank");
// the wanted region travels complemented, so the MIN is a MAX; the tuner's words are all ones
// on every rank but rank 0 (tuner.h), so the MIN is rank 0's. Word 0 is the layout: when two
// ranks' layouts differ nothing past the flags means the same, so Combine clears the flag
// kLayoutAgrees instead and Decode reports agrees = false.
#pragma once

#include <cstdint>
#include <vector>

namespace mlsl {

struct ControlMessage {
  // On this rank's message: it holds here. Decoded: it holds on some rank.
  bool announces = false;   // a request to announce (its name not agreed, or its metadata changed)
  bool busy = false;        // transfers queued or in flight
  bool stalled = false;     // a request due for a stall warning
  bool past_limit = false;  // a request waiting past the stall shutdown time
  bool waits = false;       // a request or a join pending
  bool failed = false;      // a transfer failed on this rank alone (Scheduler::failure)
  std::vector<bool> joined;     // per world rank (a rank sets its own): it has joined
  std::vector<bool> shut_down;  // per world rank: it is shutting down
  // Bit per collective id, 64 a word: this rank is ready for it. Decoded: every rank is.
  std::vector<uint64_t> ready;
  // Per group: units completed here (a non-member: UINT64_MAX). Decoded: the least of all ranks.
  std::vector<uint64_t> units_done;
  int64_t wanted_eager = 0;     // words of eager region wanted next cycle. Decoded: the most.
  uint64_t fingerprint = 0;     // of the id table
  std::vector<uint64_t> eager;  // this cycle's eager region (eager.h); its size is agreed
  // kTuneWords words: rank 0's autotune proposal, all ones elsewhere (tuner.h). Decoded: rank 0's.
  std::vector<uint64_t> tune;
  // Decoded only: every rank sent the same layout and the same fingerprint.
  bool agrees = true;

  bool Ready(int32_t id) const { return id / 64 < int32_t(ready.size()) && (ready[id / 64] >> (id % 64)) & 1; }
  void SetReady(int32_t id) { ready[id / 64] |= uint64_t(1) << (id % 64); }

  // This rank's message as words (resized to fit).
  void Encode(std::vector<uint64_t>* words) const;
  // Reads combined words of a world of `ranks` ranks (the rest of the layout comes from word 0).
  void Decode(const uint64_t* words, int64_t count, int ranks);
  // inout = inout (combined with) in, over `count` words: Communicator::AllreduceWords's rule.
  static void Combine(const uint64_t* in, uint64_t* inout, int64_t count);
};

// Words of the autotune proposal (tuner.h: its kind, then one value per tuned knob); a shorter
// `tune` is sent padded with all ones (no proposal).
constexpr int64_t kTuneWords = 3;

// Bit of the flags word (word 1) that Combine clears when two messages' layouts (word 0)
// differ; the rest of such a message is left as it was.
constexpr uint64_t kLayoutAgrees = 32;

}  // namespace mlsl
