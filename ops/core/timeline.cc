#include "timeline.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "logging.h"

namespace mlsl {

std::string JsonEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') { out += '\\'; out += c; }
    else if (static_cast<unsigned char>(c) < 0x20) { char b[8]; std::snprintf(b, sizeof b, "\\u%04x", c); out += b; }
    else out += c;
  }
  return out;
}

namespace {

constexpr char kClosing[] = "\n]\n";
constexpr size_t kFlushBytes = size_t(1) << 20;

std::string Upper(const char* s) {
  std::string out(s);
  for (char& c : out) if (c >= 'a' && c <= 'z') c = char(c - 'a' + 'A');
  return out;
}

// Writes all of `data` at `offset`; false (errno set) on an error.
bool WriteAt(int fd, const std::string& data, int64_t offset) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::pwrite(fd, data.data() + done, data.size() - done, off_t(offset + int64_t(done)));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += size_t(n);
  }
  return true;
}

}  // namespace

Timeline::Timeline() : origin_(Clock::now()) {
  origin_epoch_us_ = std::chrono::duration_cast<std::chrono::microseconds>(
                         std::chrono::system_clock::now().time_since_epoch()).count();
}

Timeline::Timeline(const std::string& path, int rank) : Timeline() {
  if (path.empty()) return;
  std::string error = Open(path, rank);
  if (!error.empty()) Log(LogLevel::kWarning, error);
}

Timeline::~Timeline() { Close(); }

bool Timeline::Writes(const std::string& path, int rank) {
  return !path.empty() && (rank == 0 || path.find("{rank}") != std::string::npos);
}

std::string Timeline::Open(const std::string& path, int rank, int* os_error) {
  Close();
  if (os_error) *os_error = 0;
  if (!Writes(path, rank)) return "";
  std::string p = path;
  size_t at = p.find("{rank}");
  if (at != std::string::npos) p.replace(at, 6, std::to_string(rank));
  int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int e = errno;
    if (os_error) *os_error = e;
    return "mlsl_tf: rank " + std::to_string(rank) + " cannot write the timeline file '" + p + "': " +
           std::strerror(e);
  }
  fd_ = fd;
  path_ = path;
  rank_ = rank;
  lanes_.clear();
  first_ = true;
  end_ = 0;  // the buffer holds the file from its start
  buffer_ = "[\n";
  Write("{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": " + std::to_string(rank_) +
        ", \"args\": {\"name\": \"mlsl_tf rank " + std::to_string(rank_) +
        "\", \"start_time_since_epoch_in_micros\": " + std::to_string(origin_epoch_us_) + "}}");
  if (!Flush()) {  // the file is a valid (empty) trace at once, or this path cannot be written
    const int e = errno;
    if (os_error) *os_error = e;
    return "mlsl_tf: rank " + std::to_string(rank) + " cannot write the timeline file '" + p + "': " +
           std::strerror(e);
  }
  return "";
}

void Timeline::Close() {
  if (fd_ < 0) return;
  Flush();
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  path_.clear();
  buffer_.clear();
}

bool Timeline::Flush() {
  if (fd_ < 0 || buffer_.empty()) return true;
  last_flush_ = Clock::now();
  if (!WriteAt(fd_, buffer_ + kClosing, end_)) {
    const int e = errno;
    Log(LogLevel::kWarning, "mlsl_tf: writing the timeline '" + path_ + "' failed (" + std::strerror(e) +
                                "); the timeline stops here");
    ::close(fd_);
    fd_ = -1;
    path_.clear();
    buffer_.clear();
    errno = e;
    return false;
  }
  end_ += int64_t(buffer_.size());
  buffer_.clear();
  return true;
}

void Timeline::MaybeFlush(Clock::time_point now) {
  if (!buffer_.empty() && now - last_flush_ >= kFlushInterval) Flush();
}

int Timeline::LaneId(const std::string& lane) {
  auto it = lanes_.find(lane);
  if (it != lanes_.end()) return it->second;
  const int id = int(lanes_.size());
  lanes_.emplace(lane, id);
  // Named when first used, so the file names its lanes at any moment.
  Write("{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": " + std::to_string(rank_) + ", \"tid\": " +
        std::to_string(id) + ", \"args\": {\"name\": \"" + JsonEscape(lane) + "\"}}");
  return id;
}

int64_t Timeline::Micros(Clock::time_point t) const {
  return std::chrono::duration_cast<std::chrono::microseconds>(t - origin_).count();
}

void Timeline::Write(const std::string& event) {
  if (!first_) buffer_ += ",\n";
  first_ = false;
  buffer_ += event;
  if (buffer_.size() >= kFlushBytes) Flush();  // bounded memory where nobody calls MaybeFlush
}

void Timeline::Span(const std::string& name, const char* category, const std::string& lane, Clock::time_point start,
                    Clock::time_point end, const std::string& args_json) {
  if (fd_ < 0) return;
  const int tid = LaneId(lane);
  int64_t ts = Micros(start), dur = Micros(end) - ts;
  Write("{\"name\": \"" + JsonEscape(name) + "\", \"cat\": \"" + category + "\", \"ph\": \"X\", \"pid\": " +
        std::to_string(rank_) + ", \"tid\": " + std::to_string(tid) + ", \"ts\": " + std::to_string(ts) +
        ", \"dur\": " + std::to_string(dur < 0 ? 0 : dur) + (args_json.empty() ? "" : ", \"args\": " + args_json) +
        "}");
}

void Timeline::Instant(const std::string& name, const char* category, const std::string& lane, Clock::time_point at,
                       const std::string& args_json) {
  if (fd_ < 0) return;
  const int tid = LaneId(lane);
  Write("{\"name\": \"" + JsonEscape(name) + "\", \"cat\": \"" + category + "\", \"ph\": \"i\", \"s\": \"t\", "
        "\"pid\": " + std::to_string(rank_) + ", \"tid\": " + std::to_string(tid) + ", \"ts\": " +
        std::to_string(Micros(at)) + (args_json.empty() ? "" : ", \"args\": " + args_json) + "}");
}

void Timeline::HorovodNegotiation(const std::string& tensor, const char* op, Clock::time_point submitted,
                                  Clock::time_point agreed) {
  if (fd_ < 0) return;
  const std::string args = "{\"tensor\": \"" + JsonEscape(tensor) + "\"}";
  Span("NEGOTIATE_" + Upper(op), "horovod", std::string(op) + "." + tensor, submitted, agreed, args);
}

void Timeline::HorovodOp(const std::string& tensor, const char* op, Clock::time_point agreed,
                         Clock::time_point started, Clock::time_point done) {
  if (fd_ < 0) return;
  const std::string args = "{\"tensor\": \"" + JsonEscape(tensor) + "\"}";
  const std::string row = std::string(op) + "." + tensor;
  // The enclosing span first: viewers nest spans of one row by start time, then length.
  Span(Upper(op), "horovod", row, agreed, done, args);
  if (started > agreed) Span("QUEUE", "horovod", row, agreed, started, args);
}

void Timeline::CycleStart(Clock::time_point at) {
  if (fd_ < 0) return;
  Write("{\"name\": \"CYCLE_START\", \"cat\": \"horovod\", \"ph\": \"i\", \"s\": \"p\", \"pid\": " +
        std::to_string(rank_) + ", \"ts\": " + std::to_string(Micros(at)) + "}");
}

}  // namespace mlsl
