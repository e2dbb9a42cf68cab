// Timeline: a Chrome-trace JSON file (chrome://tracing, Perfetto) of what the background
// thread did: each tensor's negotiation and queueing, every chunk with its bytes, preemptions
// and completion -- and beside them Horovod's activity names (NEGOTIATE_ALLREDUCE, ALLREDUCE,
// QUEUE, CYCLE_START) on one row per tensor. Written only by the background thread (or, once it
// has ended, by whoever holds the runtime's lock); disabled until Open.
//
// The file is readable while the job runs: events are buffered and written by Flush (the
// runtime calls MaybeFlush every cycle), each write one pwrite that replaces the closing "]"
// with the new events and a new "]", so between writes the file is a complete JSON array, and
// a reader that catches a write half done sees an array cut short, which Chrome's loader and
// mlsl_tf.timeline.load accept.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <unordered_map>

namespace mlsl {

class Timeline {
 public:
  using Clock = std::chrono::steady_clock;
  Timeline();  // closed; the times of every file it opens count from here
  // Opened on `path` at once ("" = disabled); an error opening it leaves it closed.
  Timeline(const std::string& path, int rank);
  ~Timeline();  // Close
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  // Whether `rank` writes the timeline at `path`: every rank when the path holds "{rank}"
  // (replaced by the rank), else rank 0 only, as Horovod.
  static bool Writes(const std::string& path, int rank);
  // Closes the file open (if any), then creates or truncates the file at `path` and writes
  // there. "" on success or when this rank does not write `path`; else the error, naming the
  // file (*os_error: errno).
  std::string Open(const std::string& path, int rank, int* os_error = nullptr);
  // Writes what is buffered and closes the file, a complete JSON array.
  void Close();
  bool enabled() const { return fd_ >= 0; }
  const std::string& path() const { return path_; }  // as given to Open; "" when closed

  // A span on lane `lane` ("negotiation", "queue", "chunk 0", ...).
  void Span(const std::string& name, const char* category, const std::string& lane, Clock::time_point start,
            Clock::time_point end, const std::string& args_json = "");
  void Instant(const std::string& name, const char* category, const std::string& lane, Clock::time_point at,
               const std::string& args_json = "");

  // Horovod's names, on the tensor's own row ("allreduce.grad_3"), category "horovod":
  // NEGOTIATE_<OP> from submission until every rank agreed it is ready;
  void HorovodNegotiation(const std::string& tensor, const char* op, Clock::time_point submitted,
                          Clock::time_point agreed);
  // <OP> from agreement to completion, with QUEUE inside it until the transfer started.
  void HorovodOp(const std::string& tensor, const char* op, Clock::time_point agreed, Clock::time_point started,
                 Clock::time_point done);
  // CYCLE_START: a background cycle began (HOROVOD_TIMELINE_MARK_CYCLES).
  void CycleStart(Clock::time_point at);

  // Writes the buffered events when the last write is kFlushInterval old (and whenever 1 MiB
  // is buffered).
  void MaybeFlush(Clock::time_point now);
  // Writes the buffered events; false (errno set, the file closed, a warning logged) when the
  // write failed.
  bool Flush();
  static constexpr std::chrono::milliseconds kFlushInterval{20};

 private:
  int LaneId(const std::string& lane);
  int64_t Micros(Clock::time_point t) const;
  void Write(const std::string& event);

  int fd_ = -1;
  std::string path_;
  int rank_ = 0;
  const Clock::time_point origin_;
  int64_t origin_epoch_us_;     // origin_ on the system clock
  std::string buffer_;          // events not yet in the file, each preceded by ",\n" but the first
  int64_t end_ = 0;             // file offset where the closing "\n]\n" starts
  bool first_ = true;           // no event written to this file yet
  Clock::time_point last_flush_;
  std::unordered_map<std::string, int> lanes_;
};

// Escapes a string for a JSON string literal.
std::string JsonEscape(const std::string& s);

}  // namespace mlsl
