// kvzap sweep: the suite over a grid of presses and settings (plus the full cache), one folder per
// cell, resumable (a cell with a summary.json is done), then DIR/results.csv with every row.
#include <algorithm>
#include <cstdio>
#include <memory>

#include "cli/cli_common.h"
#include "cli/eval_common.h"
#include "eval/runner.h"

namespace kvzap::cli {
namespace {

struct SweepArgs {
  ModelArgs m;
  std::vector<std::string> presses, tasks;
  std::vector<double> ratios, thresholds;
  std::string out;
  int64_t length = 0, samples = 20, first_index = 0;
  uint64_t seed = 42;
  // Every cell's settings but its press and policy: the flags land in the PressSpec fields directly.
  PressSpec base = [] {
    PressSpec b;
    b.ratio_scope = "kvpress";  // each press split as kvpress splits it (eval::plan_sweep)
    return b;
  }();
  bool no_baseline = false, dry_run = false, quiet = false, prefill_per_cell = false;
  std::string shard;  // "i/n"
};

// "i/n" -> (i, n); throws kvzap::Error on anything else.
std::pair<int, int> parse_shard(const std::string& s) {
  int i = -1, n = -1;
  char tail = 0;
  if (std::sscanf(s.c_str(), "%d/%d%c", &i, &n, &tail) != 2 || n < 1 || i < 0 || i >= n)
    throw Error("invalid --shard '" + s + "' (expected i/n with 0 <= i < n, e.g. 0/3)");
  return {i, n};
}

int run_sweep(SweepArgs a) {
  const auto [shard_index, shard_count] = a.shard.empty() ? std::pair<int, int>{0, 1} : parse_shard(a.shard);
  const std::vector<PressSpec> cells = eval::plan_sweep(a.presses, a.ratios, a.thresholds, a.base, !a.no_baseline);

  int pending = 0;
  for (const PressSpec& c : cells) {
    const bool done = eval::cell_finished(a.out + "/" + eval::cell_dir_name(&c));
    pending += !done;
    if (a.dry_run) std::printf("%-40s %s\n", eval::cell_dir_name(&c).c_str(), done ? "done" : "to run");
  }
  if (a.dry_run) {
    std::printf("%zu cells, %d to run\n", cells.size(), pending);
    return 0;
  }

  auto model = a.m.load_model();
  for (const PressSpec& c : cells)  // fail on bad options (a missing surrogate...) before running anything
    if (!c.name.empty()) make_press(c, *model);
  if (a.m.ctx == 0) a.m.ctx = eval_context_size(a.length, *model);
  Session session(*model, a.m.session_options());
  const eval::PromptBuilder prompts(model->tokenizer());
  eval::SuiteOptions so;
  const std::vector<eval::Sample> samples = generate_eval_suite(a, prompts, so);
  const eval::EvalSetup setup{*model, session, prompts, samples,
                              eval::suite_description(so, samples, model->config().name)};
  if (!a.quiet)
    std::fprintf(stderr, "%zu cells (%d to run) x %zu samples, %d threads\n", cells.size(), pending, samples.size(),
                 session.n_threads());

  eval::RunOptions run;
  run.quiet = a.quiet;
  run.share_prefill = !a.prefill_per_cell;
  const eval::SweepResult r = eval::run_sweep(setup, cells, a.out, run, shard_index, shard_count);
  if (shard_count > 1)
    std::fprintf(stderr, "shard %d/%d done; merge the shard folders with `kvzap report SHARD_DIRS... --out DIR`\n",
                 shard_index, shard_count);
  std::printf("%s\n", eval::leaderboard_markdown(r.rows).c_str());
  std::fprintf(stderr, "[%d cells run, %d already done, %s; %s/results.csv]\n", r.cells_run, r.cells_skipped,
               format_duration(r.seconds).c_str(), a.out.c_str());
  return 0;
}

RegisterCommand reg("sweep", "run the suite over a grid of presses and settings (resumable)", [](CLI::App& sub) {
  auto a = std::make_shared<SweepArgs>();
  a->m.add_to(sub);
  sub.add_option("--presses", a->presses,
                 "comma-separated presses; kvzap* run by threshold, others by ratio; force with name:ratio or "
                 "name:threshold; name+decoding: that threshold press also prunes while decoding")
      ->required()
      ->delimiter(',');
  sub.add_option("--ratios", a->ratios, "comma-separated compression ratios")
      ->delimiter(',')
      ->check(CLI::Range(0.0, 0.999999));
  sub.add_option("--thresholds", a->thresholds, "comma-separated thresholds (threshold presses)")->delimiter(',');
  sub.add_option("--length", a->length, "target prompt length in model tokens")
      ->required()
      ->check(CLI::Range((int64_t)64, (int64_t)1 << 20));
  sub.add_option("--samples", a->samples, "samples per task")->check(CLI::Range((int64_t)1, (int64_t)1 << 20));
  sub.add_option("--first-index", a->first_index, "index of the first sample of each task")
      ->check(CLI::Range((int64_t)0, (int64_t)1 << 40));
  sub.add_option("--tasks", a->tasks, "comma-separated task names (default: all 13)")->delimiter(',');
  sub.add_option("--seed", a->seed, "suite seed");
  sub.add_option("--out", a->out, "output folder: one subfolder per cell and results.csv")->required();
  sub.add_option("--window", a->base.window, "threshold presses never judge the most recent W tokens")
      ->check(CLI::Range(0, 1 << 20));
  sub.add_option("--ratio-scope", a->base.ratio_scope,
                 "ratio budget: kvpress (each press as kvpress splits it: per head, KVzip global), global, layer, "
                 "head or adakv")
      ->check(CLI::IsMember({"kvpress", "global", "layer", "head", "adakv"}));
  sub.add_option("--sink-tokens", a->base.sink_tokens, "threshold presses never evict the first N positions")
      ->check(CLI::Range(0, 1 << 20));
  sub.add_option("--prefill-evict-every", a->base.prefill_evict_every,
                 "threshold presses judge a context every N positions while prefilling it (0 = once it is complete)")
      ->check(CLI::Range(0, 1 << 20));
  sub.add_flag("--decode-press", a->base.decoding, "threshold presses keep pruning question and answer tokens");
  sub.add_flag("--press-sliding-layers", a->base.sliding_layers, "also prune sliding-window layers");
  sub.add_option("--surrogate", a->base.surrogate_dir, "KVzap surrogate folder (for a sweep with one kvzap press)");
  sub.add_option("--press-seed", a->base.seed, "seed of the random press");
  sub.add_flag("--no-baseline", a->no_baseline, "skip the full-cache cell");
  sub.add_option("--shard", a->shard, "run a deterministic 1/n of the grid, every cell on 1/n of the contexts: i/n "
                                      "(0 <= i < n); `kvzap report` merges the shard folders");
  sub.add_flag("--prefill-per-cell", a->prefill_per_cell,
               "run the cells one after the other, each prefilling every context (default: each context is "
               "prefilled once and replayed under every cell's press; the same results, faster)");
  sub.add_flag("--dry-run", a->dry_run, "list the cells and whether they are done, run nothing");
  sub.add_flag("-q,--quiet", a->quiet, "no progress on stderr");
  return [a]() { return run_sweep(*a); };
});

}  // namespace
}  // namespace kvzap::cli
