// Result rows of `kvzap eval` / `kvzap sweep`, their CSV/JSON files, and the report built from
// them: a markdown leaderboard and hand-written SVG plots of score vs evicted fraction.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "eval/metrics.h"

namespace kvzap::eval {

// One (press, setting, task) result. CSV columns, in this order:
//   press,setting_kind,setting,task,n,score,evicted_fraction
struct ResultRow {
  std::string press;         // e.g. "no_press", "kvzap_mlp", "snapkv"
  std::string setting_kind;  // "ratio" (fixed compression ratio), "threshold" (KVzap/DMS), "none"
  double setting = 0;        // the ratio or threshold value (0 for "none")
  std::string task;          // RULER task name
  int64_t n = 0;             // samples
  double score = 0;          // mean sample score, 0..100
  double evicted_fraction = 0;  // mean fraction of context KV entries removed, 0..1
};

// Rows for one press setting from per-task aggregates (metrics.h).
std::vector<ResultRow> rows_from_task_scores(const std::string& press, const std::string& setting_kind,
                                             double setting, const std::vector<TaskScore>& scores);

// CSV via libcsv (RFC 4180 quoting; numbers written in shortest round-trip form, so write -> read is
// exact). Reading matches columns by header name (any order, extra columns ignored), skips blank
// lines, and throws kvzap::Error with the line number for a missing column, a wrong field count, a
// malformed value, or malformed quoting (strict: a stray quote, text after a closing quote, an
// unterminated quoted field).
std::string results_to_csv(const std::vector<ResultRow>& rows);
std::vector<ResultRow> results_from_csv(std::string_view text);
// JSON: an array of objects with the CSV column names as keys, or JSON Lines of such objects.
std::string results_to_json(const std::vector<ResultRow>& rows);
std::vector<ResultRow> results_from_json(std::string_view text);
// By extension: .csv, .json, .jsonl. Throws kvzap::Error for anything else or an unreadable file.
std::vector<ResultRow> read_results(const std::string& path);
void write_results(const std::string& path, const std::vector<ResultRow>& rows);

// One leaderboard line: a press at one setting, all its tasks.
struct LeaderboardEntry {
  std::string press, setting_kind;
  double setting = 0;
  double average = 0;           // unweighted mean of the task scores present
  double evicted_fraction = 0;  // sample-weighted mean over tasks
  int64_t n = 0;                // samples over all tasks
  std::vector<std::string> tasks;   // tasks present, in column order
  std::vector<double> task_scores;  // parallel to `tasks`
};

enum class LeaderboardOrder {
  ByAverage,  // average descending; ties: lower evicted fraction first, then press, then setting
  ByPress,    // press name, then setting ascending
};

// Groups rows by (press, setting_kind, setting). Column order: RULER's task order, then any
// other tasks alphabetically. Throws kvzap::Error if a (press, setting, task) appears twice.
std::vector<LeaderboardEntry> leaderboard(const std::vector<ResultRow>& rows,
                                          LeaderboardOrder order = LeaderboardOrder::ByAverage);

// Markdown table: Press | Setting | Evicted | Average | one column per task. Scores with 2
// decimals, evicted fraction with 3; a task missing for an entry shows "-" and its average is
// marked with "*" (average over fewer tasks).
std::string leaderboard_markdown(const std::vector<ResultRow>& rows,
                                 LeaderboardOrder order = LeaderboardOrder::ByAverage,
                                 const std::string& title = "");

struct PlotOptions {
  std::string title;                     // default: "<task>: score vs evicted fraction"
  std::string baseline_press = "no_press";  // drawn as a dashed horizontal line, not a curve
  int width = 760, height = 480;
};

// SVG of score (y) against evicted fraction (x, 0..1), one polyline per press (points ordered by
// evicted fraction), markers, axes with ticks, grid, legend, title. `task` = a task name, or
// "average" for the leaderboard average of each setting.
std::string score_plot_svg(const std::vector<ResultRow>& rows, const std::string& task,
                           const PlotOptions& opt = {});

// Writes <out_dir>/leaderboard.md, <out_dir>/plots/average.svg and <out_dir>/plots/<task>.svg for
// every task; creates folders as needed; returns the written paths.
std::vector<std::string> write_report(const std::vector<ResultRow>& rows, const std::string& out_dir,
                                      const std::string& title = "");

}  // namespace kvzap::eval
