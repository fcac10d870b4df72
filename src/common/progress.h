// Progress reporting for long commands (collect, train, calibrate, score): a one-line bar on stderr
// with count, rate and ETA, redrawn in place on a terminal; when stderr is not a terminal (logs, CI)
// a plain line every few seconds instead, so logs stay short but show that work goes on.
#pragma once
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace kvzap {

// "12s", "6m18s", "1h02m"; "?" for a negative or non-finite value.
std::string format_duration(double seconds);

// One progress line (no newline), e.g.
//   "collect [########............]  45/200  22.5%  0.41 win/s  ETA 6m18s  l=3.1"
// done counts items finished so far; `rate` (items per second, <= 0 = unknown) gives the ETA;
// bar_width 0 leaves the bar out; `unit` names the items in the rate; `extra` is appended as is.
std::string format_progress_line(const std::string& label, int64_t done, int64_t total, double rate,
                                 int bar_width, const std::string& unit, const std::string& extra);

class Progress {
 public:
  // total <= 0: unknown (no bar, no ETA). already_done: items finished before this run (a resumed
  // job); they count toward the bar but not toward the rate.
  Progress(std::string label, int64_t total, std::string unit = "it", int64_t already_done = 0,
           std::FILE* out = stderr);
  ~Progress();  // finishes the line if finish() was not called
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // Sets the count of finished items (absolute) and an optional status text; redraws at most every
  // 0.2 s on a terminal, every `log_interval` seconds otherwise.
  void update(int64_t done, const std::string& extra = "");
  void add(int64_t n = 1, const std::string& extra = "") { update(done_ + n, extra); }
  // Counts n items found already finished after construction (a resumed job that learns what is done
  // as it goes): they move the bar but, like already_done, not the rate.
  void resumed(int64_t n) {
    done_ += n;
    start_done_ += n;
  }
  // Draws the final state and ends the line; prints the elapsed time.
  void finish(const std::string& extra = "");

  double elapsed_seconds() const;
  double rate() const;  // items of this run per second (0 before any)
  int64_t done() const { return done_; }
  bool is_tty() const { return tty_; }

 private:
  void draw(bool final_line);

  std::string label_, unit_, extra_;
  int64_t total_, start_done_, done_;
  std::FILE* out_;
  bool tty_;
  bool finished_ = false;
  double log_interval_ = 5.0;
  std::chrono::steady_clock::time_point t0_, last_draw_;
  bool drawn_ = false;
};

}  // namespace kvzap
