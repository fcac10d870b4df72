#include "common/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>

namespace kvzap {

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  char buf[48];
  const int64_t t = (int64_t)std::llround(s);
  if (t < 60)
    std::snprintf(buf, sizeof buf, "%llds", (long long)t);
  else if (t < 3600)
    std::snprintf(buf, sizeof buf, "%lldm%02llds", (long long)(t / 60), (long long)(t % 60));
  else
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", (long long)(t / 3600), (long long)((t % 3600) / 60));
  return buf;
}

std::string format_progress_line(const std::string& label, int64_t done, int64_t total, double rate,
                                 int bar_width, const std::string& unit, const std::string& extra) {
  std::string s = label;
  char buf[160];
  if (total > 0) {
    const double frac = std::clamp((double)done / (double)total, 0.0, 1.0);
    if (bar_width > 0) {
      const int filled = (int)std::floor(frac * bar_width);
      s += " [" + std::string((size_t)filled, '#') + std::string((size_t)(bar_width - filled), '.') + "]";
    }
    const int digits = (int)std::to_string(total).size();
    std::snprintf(buf, sizeof buf, " %*lld/%lld %5.1f%%", digits, (long long)done, (long long)total, 100.0 * frac);
    s += buf;
  } else {
    std::snprintf(buf, sizeof buf, " %lld", (long long)done);
    s += buf;
  }
  if (rate > 0) {
    if (rate >= 100)
      std::snprintf(buf, sizeof buf, "  %.0f %s/s", rate, unit.c_str());
    else if (rate >= 1)
      std::snprintf(buf, sizeof buf, "  %.2f %s/s", rate, unit.c_str());
    else
      std::snprintf(buf, sizeof buf, "  %.1f s/%s", 1.0 / rate, unit.c_str());
    s += buf;
    if (total > 0 && done < total) s += "  ETA " + format_duration((double)(total - done) / rate);
  }
  if (!extra.empty()) s += "  " + extra;
  return s;
}

Progress::Progress(std::string label, int64_t total, std::string unit, int64_t already_done, std::FILE* out)
    : label_(std::move(label)),
      unit_(std::move(unit)),
      total_(total),
      start_done_(already_done),
      done_(already_done),
      out_(out),
      tty_(out && isatty(fileno(out))),
      t0_(std::chrono::steady_clock::now()),
      last_draw_(t0_) {}

Progress::~Progress() {
  if (!finished_ && drawn_ && tty_) std::fputc('\n', out_);
}

double Progress::elapsed_seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
}

double Progress::rate() const {
  const double e = elapsed_seconds();
  return e > 0 && done_ > start_done_ ? (double)(done_ - start_done_) / e : 0.0;
}

void Progress::update(int64_t done, const std::string& extra) {
  done_ = done;
  extra_ = extra;
  if (!out_) return;
  const auto now = std::chrono::steady_clock::now();
  const double since = std::chrono::duration<double>(now - last_draw_).count();
  if (since < (tty_ ? 0.2 : log_interval_) && drawn_) return;
  if (!tty_ && drawn_ && total_ > 0 && done_ >= total_) return;  // finish() prints the last line
  draw(false);
}

void Progress::finish(const std::string& extra) {
  if (finished_) return;
  if (!extra.empty()) extra_ = extra;
  finished_ = true;
  if (out_) draw(true);
}

void Progress::draw(bool final_line) {
  last_draw_ = std::chrono::steady_clock::now();
  drawn_ = true;
  std::string line = format_progress_line(label_, done_, total_, rate(), tty_ ? 24 : 0, unit_, extra_);
  if (final_line) line += "  (" + format_duration(elapsed_seconds()) + ")";
  if (tty_) {
    std::fprintf(out_, "\r%s\033[K%s", line.c_str(), final_line ? "\n" : "");
  } else {
    std::fprintf(out_, "%s\n", line.c_str());
  }
  std::fflush(out_);
}

}  // namespace kvzap
