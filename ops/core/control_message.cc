#include "control_message.h"

#include <algorithm>

#include "eager.h"

namespace mlsl {
namespace {

// Flags word bits, inverted ("nobody ...") so the AND works as an OR; bit 5 is kLayoutAgrees.
constexpr uint64_t kNobodyAnnounces = 1;
constexpr uint64_t kNobodyBusy = 2;
constexpr uint64_t kNobodyStalled = 4;
constexpr uint64_t kNobodyPastLimit = 8;
constexpr uint64_t kNobodyWaits = 16;
constexpr uint64_t kNobodyFailed = 64;

int64_t Words(int64_t bits) { return (bits + 63) / 64; }

}  // namespace

void ControlMessage::Encode(std::vector<uint64_t>* out) const {
  const int64_t ranks = int64_t(joined.size()), rank_words = Words(ranks);
  const int64_t k = 1 + 2 * rank_words + int64_t(ready.size());
  const int64_t m = int64_t(units_done.size()) + 3 + kTuneWords;
  out->assign(size_t(1 + k + m + int64_t(eager.size())), ~uint64_t(0));
  uint64_t* w = out->data();
  w[0] = uint64_t(k) | (uint64_t(m) << 32);
  if (announces) w[1] &= ~kNobodyAnnounces;
  if (busy) w[1] &= ~kNobodyBusy;
  if (stalled) w[1] &= ~kNobodyStalled;
  if (past_limit) w[1] &= ~kNobodyPastLimit;
  if (waits) w[1] &= ~kNobodyWaits;
  if (failed) w[1] &= ~kNobodyFailed;
  for (int64_t r = 0; r < ranks; ++r) {
    if (joined[r]) w[2 + r / 64] &= ~(uint64_t(1) << (r % 64));
    if (r < int64_t(shut_down.size()) && shut_down[r]) w[2 + rank_words + r / 64] &= ~(uint64_t(1) << (r % 64));
  }
  std::copy(ready.begin(), ready.end(), w + 2 + 2 * rank_words);
  uint64_t* mins = w + 1 + k;
  std::copy(units_done.begin(), units_done.end(), mins);
  const size_t g = units_done.size();
  mins[g] = ~uint64_t(wanted_eager);
  mins[g + 1] = fingerprint;
  mins[g + 2] = ~fingerprint;
  std::copy(tune.begin(), tune.begin() + std::min<int64_t>(int64_t(tune.size()), kTuneWords), mins + g + 3);
  std::copy(eager.begin(), eager.end(), mins + m);
}

void ControlMessage::Decode(const uint64_t* w, int64_t count, int ranks) {
  const int64_t rank_words = Words(ranks);
  const int64_t k = count > 0 ? int64_t(w[0] & 0xffffffff) : 0, m = count > 0 ? int64_t(w[0] >> 32) : 0;
  agrees = count >= 2 && (w[1] & kLayoutAgrees) && k >= 1 + 2 * rank_words && m >= 3 + kTuneWords && 1 + k + m <= count;
  if (!agrees) return;
  announces = !(w[1] & kNobodyAnnounces);
  busy = !(w[1] & kNobodyBusy);
  stalled = !(w[1] & kNobodyStalled);
  past_limit = !(w[1] & kNobodyPastLimit);
  waits = !(w[1] & kNobodyWaits);
  failed = !(w[1] & kNobodyFailed);
  joined.assign(size_t(ranks), false);
  shut_down.assign(size_t(ranks), false);
  for (int r = 0; r < ranks; ++r) {
    joined[r] = !((w[2 + r / 64] >> (r % 64)) & 1);
    shut_down[r] = !((w[2 + rank_words + r / 64] >> (r % 64)) & 1);
  }
  ready.assign(w + 2 + 2 * rank_words, w + 1 + k);
  const uint64_t* mins = w + 1 + k;
  const int64_t g = m - 3 - kTuneWords;
  units_done.assign(mins, mins + g);
  wanted_eager = int64_t(~mins[g]);
  fingerprint = mins[g + 1];
  agrees = mins[g + 1] == ~mins[g + 2];  // the least fingerprint is also the largest: all equal
  tune.assign(mins + g + 3, mins + g + 3 + kTuneWords);
  eager.assign(mins + m, w + count);
}

void ControlMessage::Combine(const uint64_t* in, uint64_t* inout, int64_t count) {
  if (count == 0) return;
  if (in[0] != inout[0]) {  // the layouts differ: nothing past the flags word means the same
    if (count > 1) inout[1] &= ~kLayoutAgrees;
    return;
  }
  const int64_t k = int64_t(inout[0] & 0xffffffff), m = int64_t(inout[0] >> 32);
  const int64_t min_end = m ? std::min(count, k + 1 + m) : count;
  for (int64_t i = 1; i <= k && i < count; ++i) inout[i] &= in[i];
  for (int64_t i = k + 1; i < min_end; ++i) inout[i] = std::min(inout[i], in[i]);
  if (min_end < count) CombineEager(in + min_end, inout + min_end, count - min_end);
}

}  // namespace mlsl
