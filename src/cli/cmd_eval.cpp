// kvzap eval: the offline RULER-style suite under one press at one setting, with the kvpress
// protocol (context prefilled and compressed once, then question + answer prefix, greedy answer),
// scored with the task metrics; per-sample, per-task and summary files into --out.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>

#include "cli/cli_common.h"
#include "cli/eval_common.h"
#include "eval/runner.h"

namespace kvzap::cli {
namespace {

struct EvalArgs {
  ModelArgs m;
  PressArgs press;
  std::string suite = "ruler", out;
  int64_t length = 0, samples = 20, first_index = 0;
  std::vector<std::string> tasks;
  uint64_t seed = 42;
  bool quiet = false, scope_given = false;
};

// --press none (or no --press) = the full cache.
std::optional<PressSpec> press_spec(const PressArgs& a, bool scope_given) {
  const std::string& name = a.flags.name;
  if (name.empty() || name == "none" || name == "no_press") {
    if (a.given_threshold() || a.given_ratio() || a.flags.decoding || !a.flags.surrogate_dir.empty())
      throw Error("--threshold/--ratio/--decode-press/--surrogate need a --press other than none");
    return std::nullopt;
  }
  PressSpec o = a.spec();  // every flag, sinks and sliding layers included
  // Without --ratio-scope, split the budget as kvpress does for this press.
  if (!scope_given) o.ratio_scope = eval::kvpress_ratio_scope(name);
  return o;
}

void print_table(const eval::CellResult& cell) {
  std::printf("%-16s %5s %8s %7s %8s\n", "task", "n", "score", "+-se", "evicted");
  for (const eval::TaskScore& t : cell.tasks)
    std::printf("%-16s %5lld %8.2f %7.2f %8.3f\n", t.task.c_str(), (long long)t.n, t.score, t.stderr_score,
                t.evicted_fraction);
  std::printf("%-16s %5lld %8.2f %7s %8.3f\n", "average", (long long)cell.outcomes.size(),
              cell.summary["average"].get<double>(), "", cell.summary["evicted_fraction"].get<double>());
}

int run_eval(EvalArgs a) {
  if (a.suite != "ruler") throw Error("unknown suite '" + a.suite + "' (available: ruler)");
  const std::optional<PressSpec> press = press_spec(a.press, a.scope_given);
  auto model = a.m.load_model();
  if (press) make_press(*press, *model);  // fail on bad press options before generating the suite
  if (a.m.ctx == 0) a.m.ctx = eval_context_size(a.length, *model);
  Session session(*model, a.m.session_options());
  const eval::PromptBuilder prompts(model->tokenizer());
  eval::SuiteOptions so;
  const std::vector<eval::Sample> samples = generate_eval_suite(a, prompts, so);

  const eval::EvalSetup setup{*model, session, prompts, samples,
                              eval::suite_description(so, samples, model->config().name)};
  eval::RunOptions run;
  run.label = "eval " + eval::cell_dir_name(press ? &*press : nullptr);
  run.quiet = a.quiet;
  const eval::CellResult cell = eval::run_cell(setup, press ? &*press : nullptr, a.out, run);
  print_table(cell);
  if (!a.quiet) {
    std::fprintf(stderr, "[%zu samples, %s, %d threads; results in %s]\n", cell.outcomes.size(),
                 format_duration(cell.summary["timings"]["wall_s"].get<double>()).c_str(), session.n_threads(),
                 a.out.c_str());
  }
  return 0;
}

RegisterCommand reg("eval", "run the offline RULER-style suite under a press and score it", [](CLI::App& sub) {
  auto a = std::make_shared<EvalArgs>();
  a->m.add_to(sub);
  a->press.add_to(sub);
  sub.add_option("--suite", a->suite, "benchmark suite (ruler)");
  sub.add_option("--length", a->length, "target prompt length in model tokens, chat template and answer included")
      ->required()
      ->check(CLI::Range((int64_t)64, (int64_t)1 << 20));
  sub.add_option("--samples", a->samples, "samples per task")->check(CLI::Range((int64_t)1, (int64_t)1 << 20));
  sub.add_option("--first-index", a->first_index, "index of the first sample of each task")
      ->check(CLI::Range((int64_t)0, (int64_t)1 << 40));
  sub.add_option("--tasks", a->tasks, "comma-separated task names (default: all 13)")->delimiter(',');
  sub.add_option("--seed", a->seed, "suite seed");
  sub.add_option("--out", a->out, "output folder (samples.jsonl, tasks.csv, tasks.json, summary.json)")->required();
  sub.add_flag("-q,--quiet", a->quiet, "no progress on stderr");
  return [a, &sub]() {
    a->scope_given = sub.get_option("--ratio-scope")->count() > 0;
    return run_eval(*a);
  };
});

}  // namespace
}  // namespace kvzap::cli
