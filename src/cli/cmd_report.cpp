// kvzap report: leaderboard markdown and SVG plots from the results of `kvzap eval` / `kvzap sweep`.
// Each input is a results file (.csv/.json/.jsonl) or a folder: its results.csv (a sweep), else its
// tasks.csv (one eval), else the tasks.csv of each subfolder.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <set>
#include <tuple>

#include "cli/cli_common.h"
#include "eval/report.h"
#include "eval/runner.h"

namespace kvzap::cli {
namespace {

namespace fs = std::filesystem;

struct ReportArgs {
  std::vector<std::string> inputs;
  std::string out, title;
};

std::vector<std::string> result_files(const std::string& input) {
  std::error_code ec;
  if (!fs::is_directory(input, ec)) {
    if (!fs::exists(input, ec)) throw Error(input + ": no such file or folder");
    return {input};
  }
  const fs::path dir(input);
  for (const char* name : {"results.csv", "tasks.csv"})
    if (fs::exists(dir / name, ec)) return {(dir / name).string()};
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_directory() && fs::exists(e.path() / "tasks.csv", ec)) files.push_back((e.path() / "tasks.csv").string());
  std::sort(files.begin(), files.end());
  if (files.empty()) throw Error(input + ": no results.csv, tasks.csv or cell folders in it");
  return files;
}

int run_report(const ReportArgs& a) {
  std::vector<eval::ResultRow> rows;
  std::set<std::tuple<std::string, std::string, double, std::string>> seen;
  int dropped = 0;
  // Shard folders of one sweep (`kvzap sweep --shard i/n`) are merged cell by cell first.
  std::vector<std::string> shards, plain;
  for (const std::string& input : a.inputs) (eval::is_shard_folder(input) ? shards : plain).push_back(input);
  std::vector<eval::ResultRow> merged;
  if (!shards.empty()) merged = eval::merge_shard_folders(shards);
  auto add = [&](const eval::ResultRow& r) {
    // The same cell reached through two inputs (e.g. no_press in two sweeps): keep the first.
    if (!seen.insert({r.press, r.setting_kind, r.setting, r.task}).second) {
      dropped++;
      return;
    }
    rows.push_back(r);
  };
  for (const eval::ResultRow& r : merged) add(r);
  for (const std::string& input : plain)
    for (const std::string& file : result_files(input))
      for (const eval::ResultRow& r : eval::read_results(file)) {
        add(r);
      }
  if (rows.empty()) throw Error("no result rows in the inputs");
  if (dropped > 0)
    std::fprintf(stderr, "note: %d duplicate rows (same press, setting and task) kept only once\n", dropped);
  std::error_code ec;
  fs::create_directories(a.out, ec);
  if (ec) throw Error(a.out + ": cannot create folder: " + ec.message());
  eval::write_results((fs::path(a.out) / "results.csv").string(), rows);
  const std::vector<std::string> written = eval::write_report(rows, a.out, a.title);
  std::printf("%s\n", eval::leaderboard_markdown(rows, eval::LeaderboardOrder::ByAverage, a.title).c_str());
  std::fprintf(stderr, "[%zu rows; wrote %s/results.csv and %zu report files in %s]\n", rows.size(), a.out.c_str(),
               written.size(), a.out.c_str());
  return 0;
}

RegisterCommand reg(
    "report", "leaderboard markdown and score-vs-eviction SVG plots from eval/sweep results", [](CLI::App& sub) {
      auto a = std::make_shared<ReportArgs>();
      sub.add_option("inputs", a->inputs, "result folders or files (.csv, .json, .jsonl)")->required();
      sub.add_option("--out", a->out, "output folder (leaderboard.md, results.csv, plots/*.svg)")->required();
      sub.add_option("--title", a->title, "title of the leaderboard and plots");
      return [a]() { return run_report(*a); };
    });

}  // namespace
}  // namespace kvzap::cli
