// The runtime's timeline controls: the timeline opened at init (collectively, so a file that
// cannot be written fails init on every rank) and Horovod's start_timeline / stop_timeline at
// run time, handed to the background thread, which alone writes the timeline while it runs.
#include <algorithm>

#include "logging.h"
#include "runtime.h"

namespace mlsl {

Status OpenTimelineAtInit(Communicator* comm, Timeline* timeline, const RuntimeOptions& options) {
  std::string path = options.timeline;
  if (path == "DYNAMIC") path.clear();  // Horovod's "no file yet, start_timeline later"
  std::string mine = timeline->Open(path, comm->rank());
  if (!mine.empty()) mine += " (" + options.timeline_variable + "=" + path + ")";
  // Every rank's error (most are empty), so every rank fails alike.
  std::vector<int64_t> lengths;
  std::string all;
  Status s = AllgatherStrings(comm, mine, &lengths, &all);
  if (!s.ok()) return s;
  if (all.empty()) return Status::Ok();
  timeline->Close();
  // The first failing rank's error, and how many failed.
  const int failed = int(std::count_if(lengths.begin(), lengths.end(), [](int64_t l) { return l > 0; }));
  int64_t at = 0;
  int r = 0;
  while (lengths[r] == 0) at += lengths[r++];
  std::string error = all.substr(size_t(at), size_t(lengths[r]));
  if (failed > 1) error += " (and " + std::to_string(failed - 1) + " other rank" + (failed > 2 ? "s" : "") + ")";
  return Status::InvalidArgument(error);
}

std::string Runtime::StartTimeline(const std::string& path, bool mark_cycles, int* os_error) {
  TimelineChange change;
  change.start = true;
  change.path = path;
  change.mark_cycles = mark_cycles;
  ChangeTimeline(&change);
  if (os_error) *os_error = change.os_error;
  return change.error;
}

void Runtime::StopTimeline() {
  TimelineChange change;
  ChangeTimeline(&change);
}

void Runtime::ChangeTimeline(TimelineChange* change) {
  std::unique_lock<std::mutex> lock(mu_);
  timeline_cv_.wait(lock, [this] { return timeline_change_ == nullptr || loop_ended_; });
  if (loop_ended_) {
    ApplyTimelineChange(change);  // nobody else writes it any more; the lock orders the callers
    return;
  }
  timeline_change_ = change;
  cv_.notify_one();
  timeline_cv_.wait(lock, [change] { return change->done; });
}

void Runtime::ServeTimelineChange(TimelineChange* change) {
  ApplyTimelineChange(change);  // the file work outside the lock: submitters never wait for it
  {
    std::lock_guard<std::mutex> lock(mu_);
    change->done = true;
    timeline_change_ = nullptr;
  }
  timeline_cv_.notify_all();
}

void Runtime::ApplyTimelineChange(TimelineChange* change) {
  if (!change->start) {
    if (!timeline_->enabled()) Log(LogLevel::kInfo, "stop_timeline: no timeline is being written");
    timeline_->Close();
  } else if (timeline_->enabled() && timeline_->path() == change->path) {
    Log(LogLevel::kInfo, "start_timeline: already writing " + change->path);
  } else {
    change->error = timeline_->Open(change->path, rank_, &change->os_error);
  }
  if (change->start) mark_cycles_ = change->mark_cycles;
  results_->Record(timeline_->enabled());
}

void Runtime::EndTimeline() {
  std::lock_guard<std::mutex> lock(mu_);
  if (timeline_change_) {
    ApplyTimelineChange(timeline_change_);
    timeline_change_->done = true;
    timeline_change_ = nullptr;
  }
  timeline_->Close();  // shutdown (or a closed runtime) ends the file, complete
  results_->Record(false);
  loop_ended_ = true;
  timeline_cv_.notify_all();
}

}  // namespace mlsl
