// The suite runner (kvpress protocol on the real default model), cell output files, the resumable
// sweep, and the teacher-forced faithfulness measure.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>

#include "chat/chat_template.h"
#include "common/json_file.h"
#include "engine/session.h"
#include "eval/faithfulness.h"
#include "eval/runner.h"
#include "kvzap/error.h"
#include "model/model.h"
#include "test_support.h"

using namespace kvzap;
using namespace kvzap::eval;
namespace fs = std::filesystem;

namespace {

std::string find_model() {
  return kvzap::test::default_model_path();
}

// One model for the whole file: loading it per test would dominate the run time.
const Model& model() {
  static std::unique_ptr<Model> m = [] {
    const std::string path = find_model();
    if (!fs::exists(path)) return std::unique_ptr<Model>();
    return Model::load(path);
  }();
  if (!m)
    throw std::runtime_error("default model not found at " + find_model() + ": run `kvzap pull` (or set KVZAP_MODEL)");
  return *m;
}

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() /
            ("kvzap_eval_runner_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string str() const { return path_.string(); }
  fs::path path() const { return path_; }

 private:
  fs::path path_;
  static inline int counter_ = 0;
};

std::vector<std::string> lines_of(const fs::path& p) {
  std::ifstream in(p);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);)
    if (!l.empty()) lines.push_back(l);
  return lines;
}

SessionOptions small_session(int64_t n_ctx) {
  SessionOptions o;
  o.n_threads = 2;
  o.n_ctx = n_ctx;
  return o;
}

// A tiny suite: one sample per task, 300 tokens by default.
struct TinySuite {
  SuiteOptions opt;
  std::vector<Sample> samples;
  nlohmann::json suite;
  explicit TinySuite(const PromptBuilder& prompts, std::vector<std::string> tasks = {"niah_single_1", "niah_single_2"},
                     int64_t length = 300, int64_t samples_per_task = 1) {
    opt.tasks = std::move(tasks);
    opt.length = length;
    opt.samples_per_task = samples_per_task;
    opt.count_tokens = prompts.counter();
    samples = generate_suite(opt);
    suite = suite_description(opt, samples, model().config().name);
  }
};

PressSpec ratio_press(const std::string& name, double ratio) {
  PressSpec o;
  o.name = name;
  o.has_ratio = true;
  o.ratio = ratio;
  o.ratio_scope = kvpress_ratio_scope(name);
  return o;
}

}  // namespace

TEST(EvalRunner, PromptSplitMatchesTheSuiteCounter) {
  const Model& m = model();
  const Tokenizer& tok = m.tokenizer();
  const PromptBuilder prompts(tok);
  ChatOptions co;
  co.enable_thinking = false;
  const TokenCounter reference = chat_token_counter(tok, detect_chat_format(tok.vocab()), co);
  const TinySuite t(prompts, {"niah_single_1", "niah_multikey_3", "vt", "cwe", "qa_2"}, 800);
  for (const Sample& s : t.samples) {
    const int64_t fed_ctx = (int64_t)prompts.context_ids(s.context).size();
    // The counter the suite is generated with is the generator's own one, and it counts exactly
    // the tokens the runner feeds (empty answer prefix).
    EXPECT_EQ(prompts.counter()(s.context, s.question), reference(s.context, s.question)) << s.task;
    EXPECT_EQ(fed_ctx + (int64_t)prompts.question_ids(s.question, "").size(), reference(s.context, s.question))
        << s.task;
    // Everything fed plus the answer budget stays within the target length.
    const int64_t fed = fed_ctx + (int64_t)prompts.question_ids(s.question, s.answer_prefix).size();
    EXPECT_LE(fed + s.max_new_tokens, t.opt.length) << s.task;
    EXPECT_GT(fed + s.max_new_tokens, t.opt.length * 3 / 4) << s.task << ": the haystack should fill the budget";
  }
}

TEST(EvalRunner, FullCacheCellWritesItsFilesAndEvictsNothing) {
  const Model& m = model();
  const PromptBuilder prompts(m.tokenizer());
  const TinySuite t(prompts);
  Session session(m, small_session(600));
  const EvalSetup setup{m, session, prompts, t.samples, t.suite};
  TempDir dir;
  RunOptions quiet;
  quiet.quiet = true;
  const CellResult cell = run_cell(setup, nullptr, dir.str(), quiet);

  for (const char* f : {"samples.jsonl", "tasks.csv", "tasks.json", "summary.json"})
    EXPECT_TRUE(fs::exists(dir.path() / f)) << f;
  const auto lines = lines_of(dir.path() / "samples.jsonl");
  ASSERT_EQ(lines.size(), 2u);
  ASSERT_EQ(cell.outcomes.size(), 2u);
  for (size_t i = 0; i < lines.size(); i++) {
    const SampleOutcome o = outcome_from_json(nlohmann::json::parse(lines[i]));
    EXPECT_EQ(o.task, t.samples[i].task);
    EXPECT_GE(o.score, 0.0);
    EXPECT_LE(o.score, 100.0);
    EXPECT_EQ(o.score, score_sample(t.samples[i].metric, o.prediction, t.samples[i].answers));
    EXPECT_EQ(o.evicted_fraction, 0.0);
    EXPECT_EQ(o.kv_bytes, o.kv_bytes_full);
    EXPECT_GT(o.kv_bytes, 0);
    EXPECT_GT(o.context_tokens, 60);
    EXPECT_GT(o.generated_tokens, 0);
    EXPECT_LE(o.generated_tokens, t.samples[i].max_new_tokens);
  }
  const auto rows = read_results((dir.path() / "tasks.csv").string());
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].press, "no_press");
  EXPECT_EQ(rows[0].setting_kind, "none");
  EXPECT_EQ(rows[0].task, "niah_single_1");
  EXPECT_EQ(rows[1].task, "niah_single_2");
  std::ifstream in(dir.path() / "summary.json");
  const nlohmann::json summary = nlohmann::json::parse(in);
  EXPECT_EQ(summary["suite"], t.suite);
  EXPECT_DOUBLE_EQ(summary["average"].get<double>(), (rows[0].score + rows[1].score) / 2);
  EXPECT_EQ(summary["evicted_fraction"].get<double>(), 0.0);
}

TEST(EvalRunner, RatioPressEvictsItsShareAndShrinksTheCache) {
  const Model& m = model();
  const PromptBuilder prompts(m.tokenizer());
  const TinySuite t(prompts);
  Session session(m, small_session(600));
  const PressSpec knorm = ratio_press("knorm", 0.5);
  std::unique_ptr<Press> press = make_press(knorm, m);
  RunOptions quiet;
  quiet.quiet = true;
  const auto outcomes = run_samples(session, press.get(), prompts, t.samples, quiet);
  ASSERT_EQ(outcomes.size(), 2u);
  for (const SampleOutcome& o : outcomes) {
    EXPECT_NEAR(o.evicted_fraction, 0.5, 0.01) << o.task;
    EXPECT_LT(o.kv_bytes, o.kv_bytes_full) << o.task;
    EXPECT_GE(o.score, 0.0);
    EXPECT_LE(o.score, 100.0);
  }
  EXPECT_EQ(press_label(&knorm), "knorm");
  EXPECT_EQ(cell_dir_name(&knorm), "knorm__ratio_0.5");
}

TEST(EvalRunner, SamplesOnOneContextShareAPrefillAndAnswerAsIfAlone) {
  const Model& m = model();
  const PromptBuilder prompts(m.tokenizer());
  const TinySuite t(prompts, {"niah_single_1"});
  Session session(m, small_session(600));
  RunOptions quiet;
  quiet.quiet = true;
  // Without a press, and with KVzap-MLP pruning while decoding (a small window so the answer's own
  // tokens are judged): each question runs on its own fork of the compressed context.
  PressSpec po;
  po.name = "kvzap-mlp";
  po.has_threshold = true;
  po.threshold = -4;
  po.window = 8;
  po.decoding = true;
  std::unique_ptr<Press> decoding_press = make_press(po, m);
  for (Press* press : {(Press*)nullptr, decoding_press.get()}) {
    const auto alone = run_samples(session, press, prompts, t.samples, quiet);
    // The same question twice on one context: the second reuses the compressed context, so it must
    // produce exactly the same answer.
    std::vector<Sample> twice = {t.samples[0], t.samples[0]};
    twice[1].meta.index = 1;
    const auto shared = run_samples(session, press, prompts, twice, quiet);
    ASSERT_EQ(shared.size(), 2u);
    EXPECT_FALSE(shared[0].context_reused);
    EXPECT_TRUE(shared[1].context_reused);
    EXPECT_EQ(shared[1].context_seconds, 0.0);
    EXPECT_EQ(shared[0].prediction, alone[0].prediction);
    EXPECT_EQ(shared[1].prediction, alone[0].prediction);
    EXPECT_EQ(shared[1].index, 1);
    if (press) EXPECT_GT(shared[1].evicted_fraction_end, shared[1].evicted_fraction);
  }
}

TEST(EvalRunner, TooSmallContextIsAUserError) {
  const Model& m = model();
  const PromptBuilder prompts(m.tokenizer());
  const TinySuite t(prompts, {"niah_single_1"});
  Session session(m, small_session(200));
  RunOptions quiet;
  quiet.quiet = true;
  EXPECT_THROW(run_samples(session, nullptr, prompts, t.samples, quiet), Error);
}

TEST(EvalSweep, PlanPicksPoliciesPerPress) {
  PressSpec base;
  base.window = 64;
  base.ratio_scope = "kvpress";
  const auto cells = plan_sweep({"knorm", "kvzap-mlp", "kvzip", "random:threshold"}, {0.25, 0.5}, {-4, -6}, base);
  std::vector<std::string> names;
  for (const PressSpec& c : cells) names.push_back(cell_dir_name(&c));
  const std::vector<std::string> want = {"no_press",
                                         "knorm__ratio_0.25",
                                         "knorm__ratio_0.5",
                                         "kvzap-mlp__threshold_-4",
                                         "kvzap-mlp__threshold_-6",
                                         "kvzip__ratio_0.25",
                                         "kvzip__ratio_0.5",
                                         "random__threshold_-4",
                                         "random__threshold_-6"};
  EXPECT_EQ(names, want);
  EXPECT_EQ(cells[3].window, 64);
  EXPECT_TRUE(cells[3].has_threshold);
  EXPECT_FALSE(cells[3].has_ratio);
  EXPECT_TRUE(cells[1].has_ratio);
  EXPECT_EQ(cells[1].ratio_scope, "head");    // kvpress's per-head top-k
  EXPECT_EQ(cells[5].ratio_scope, "global");  // KVzip's global bottom-k
  const auto forced = plan_sweep({"knorm@global", "snapkv:ratio@layer"}, {0.5}, {}, base, false);
  ASSERT_EQ(forced.size(), 2u);
  EXPECT_EQ(cell_dir_name(&forced[0]), "knorm@global__ratio_0.5");
  EXPECT_EQ(cell_dir_name(&forced[1]), "snapkv@layer__ratio_0.5");
  // "+decoding": that press prunes while decoding, next to the same press without it.
  const auto both = plan_sweep({"kvzap-mlp", "kvzap-mlp+decoding", "knorm+decoding:threshold"}, {}, {-4}, base, false);
  ASSERT_EQ(both.size(), 3u);
  EXPECT_EQ(cell_dir_name(&both[0]), "kvzap-mlp__threshold_-4");
  EXPECT_FALSE(both[0].decoding);
  EXPECT_EQ(cell_dir_name(&both[1]), "kvzap-mlp+decoding__threshold_-4");
  EXPECT_TRUE(both[1].decoding);
  EXPECT_EQ(cell_dir_name(&both[2]), "knorm+decoding__threshold_-4");
  EXPECT_THROW(plan_sweep({"kvzip+decoding"}, {0.5}, {-4}, base), Error);  // a ratio press cannot
  EXPECT_THROW(plan_sweep({"knorm@everywhere"}, {0.5}, {}, base), Error);
  EXPECT_THROW(plan_sweep({"kvzip:threshold"}, {0.5}, {-4}, base), Error);
  EXPECT_THROW(plan_sweep({"no-such-press"}, {0.5}, {}, base), Error);
  EXPECT_THROW(plan_sweep({"kvzap-linear"}, {0.5}, {}, base), Error);  // a threshold press without thresholds
  EXPECT_EQ(plan_sweep({"knorm"}, {0.5}, {}, base, false).size(), 1u);
  // dms_<press> (kvpress DMSPress) runs by threshold, whatever the press; a whole-context one never evicts
  // while prefilling.
  PressSpec every = base;
  every.prefill_evict_every = 256;
  const auto dms = plan_sweep({"dms_knorm", "dms_snapkv"}, {0.5}, {-4}, every, false);
  ASSERT_EQ(dms.size(), 2u);
  EXPECT_EQ(cell_dir_name(&dms[0]), "dms_knorm__threshold_-4");
  EXPECT_EQ(dms[0].prefill_evict_every, 256);
  EXPECT_EQ(cell_dir_name(&dms[1]), "dms_snapkv__threshold_-4");
  EXPECT_EQ(dms[1].prefill_evict_every, 0);
  EXPECT_THROW(plan_sweep({"dms_nope"}, {0.5}, {-4}, base), Error);
}

TEST(EvalSweep, SecondRunSkipsFinishedCellsAndSuiteMismatchThrows) {
  const Model& m = model();
  const PromptBuilder prompts(m.tokenizer());
  const TinySuite t(prompts, {"niah_single_1"});
  Session session(m, small_session(600));
  const EvalSetup setup{m, session, prompts, t.samples, t.suite};
  TempDir dir;
  PressSpec base;
  base.ratio_scope = "kvpress";
  const auto cells = plan_sweep({"knorm"}, {0.5}, {}, base);
  ASSERT_EQ(cells.size(), 2u);
  RunOptions quiet;
  quiet.quiet = true;

  const SweepResult first = run_sweep(setup, cells, dir.str(), quiet);
  EXPECT_EQ(first.cells_run, 2);
  EXPECT_EQ(first.cells_skipped, 0);
  ASSERT_TRUE(fs::exists(dir.path() / "results.csv"));
  const auto rows = read_results((dir.path() / "results.csv").string());
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].press, "no_press");
  EXPECT_EQ(rows[1].press, "knorm");
  EXPECT_NEAR(rows[1].evicted_fraction, 0.5, 0.01);

  const auto stamp = fs::last_write_time(dir.path() / "knorm__ratio_0.5" / "samples.jsonl");
  const SweepResult second = run_sweep(setup, cells, dir.str(), quiet);
  EXPECT_EQ(second.cells_run, 0);
  EXPECT_EQ(second.cells_skipped, 2);
  EXPECT_EQ(fs::last_write_time(dir.path() / "knorm__ratio_0.5" / "samples.jsonl"), stamp);
  ASSERT_EQ(second.rows.size(), rows.size());
  for (size_t i = 0; i < rows.size(); i++) {
    EXPECT_EQ(second.rows[i].press, rows[i].press);
    EXPECT_EQ(second.rows[i].score, rows[i].score);
  }

  // An unfinished cell (no summary.json) is run again.
  fs::remove(dir.path() / "knorm__ratio_0.5" / "summary.json");
  EXPECT_EQ(run_sweep(setup, cells, dir.str(), quiet).cells_run, 1);

  // Finished cells of another suite must not be mixed in.
  nlohmann::json other = t.suite;
  other["length"] = 301;
  const EvalSetup mismatched{m, session, prompts, t.samples, other};
  EXPECT_THROW(run_sweep(mismatched, cells, dir.str(), quiet), Error);
}

TEST(Faithfulness, CompareLogitsMatchesClosedForm) {
  // p = softmax(0, ln 2) = (1/3, 2/3); q = softmax(0, 0) = (1/2, 1/2).
  const float full[2] = {0.0f, (float)std::log(2.0)};
  const float pressed[2] = {0.0f, 0.0f};
  const PositionComparison c = compare_logits(full, pressed, 2, 0);
  const double p0 = 1.0 / 3, p1 = 2.0 / 3;
  EXPECT_NEAR(c.kl, p0 * std::log(p0 / 0.5) + p1 * std::log(p1 / 0.5), 1e-7);
  EXPECT_NEAR(c.nll_full, std::log(3.0), 1e-7);
  EXPECT_NEAR(c.nll_pressed, std::log(2.0), 1e-7);
  EXPECT_FALSE(c.same_top1);  // full's argmax is 1; pressed ties, and a tie resolves to the lowest id
  const PositionComparison self = compare_logits(full, full, 2, 1);
  EXPECT_EQ(self.kl, 0.0);
  EXPECT_TRUE(self.same_top1);
  EXPECT_EQ(self.nll_full, self.nll_pressed);
}

TEST(Faithfulness, NoOpPressAgreesExactlyAndRealPruningDoesNot) {
  const Model& m = model();
  std::ifstream in(std::string(KVZAP_SOURCE_DIR) + "/data/eval/haystack/persuasion.txt");
  ASSERT_TRUE(in) << "data/eval/haystack/persuasion.txt is missing";
  std::string text(6000, '\0');
  in.read(text.data(), (std::streamsize)text.size());
  text.resize((size_t)in.gcount());
  const std::vector<int32_t> ids = m.tokenizer().encode(text, m.tokenizer().vocab().add_bos, false);

  FaithfulnessOptions opt;
  opt.context_tokens = 300;
  opt.window_tokens = 24;
  opt.windows = 1;
  Session full(m, small_session(400)), pressed(m, small_session(400));

  std::unique_ptr<Press> noop = make_press(ratio_press("knorm", 0.0), m);
  const FaithfulnessResult same = measure_faithfulness(full, pressed, noop.get(), ids, opt);
  EXPECT_EQ(same.positions, 24);
  EXPECT_EQ(same.evicted_fraction, 0.0);
  EXPECT_EQ(same.mean_kl, 0.0);
  EXPECT_EQ(same.max_kl, 0.0);
  EXPECT_EQ(same.top1_agreement, 100.0);
  EXPECT_EQ(same.nll_diff, 0.0);

  std::unique_ptr<Press> heavy = make_press(ratio_press("streaming_llm", 0.9), m);
  const FaithfulnessResult diff = measure_faithfulness(full, pressed, heavy.get(), ids, opt);
  EXPECT_NEAR(diff.evicted_fraction, 0.9, 0.02);
  EXPECT_GT(diff.mean_kl, 1e-3);
  EXPECT_LE(diff.top1_agreement, 100.0);
  EXPECT_NEAR(diff.nll_full, same.nll_full, 1e-12);  // the full-cache side does not depend on the press

  opt.context_tokens = 5000;  // longer than the text
  EXPECT_THROW(measure_faithfulness(full, pressed, noop.get(), ids, opt), Error);
}

namespace {
TEST(EvalSweep, ShardsTogetherEqualTheUnshardedSweep) {
  // A tiny grid: 2 tasks x 2 samples, no press + knorm at 0.5; three shards split the 4 contexts (2, 1
  // and 1, each under both cells); merged, they give the unsharded rows exactly.
  const Model& m = model();
  const PromptBuilder prompts(m.tokenizer());
  const TinySuite t(prompts, {"niah_single_1", "niah_single_2"}, 300, 2);
  Session session(m, small_session(600));
  const EvalSetup setup{m, session, prompts, t.samples, t.suite};
  PressSpec base;
  base.ratio_scope = "kvpress";
  const auto cells = plan_sweep({"knorm"}, {0.5}, {}, base);
  RunOptions quiet;
  quiet.quiet = true;
  TempDir whole, s0, s1, s2;
  const SweepResult full = run_sweep(setup, cells, whole.str(), quiet);
  int64_t shard_samples = 0;
  const std::string dirs[3] = {s0.str(), s1.str(), s2.str()};
  for (int i = 0; i < 3; i++) {
    const SweepResult r = run_sweep(setup, cells, dirs[i], quiet, i, 3);
    for (const auto& row : r.rows) shard_samples += row.n;
    EXPECT_TRUE(is_shard_folder(dirs[i]));
  }
  EXPECT_EQ(shard_samples, 8);  // every unit ran exactly once
  std::vector<ResultRow> merged = merge_shard_folders({dirs[2], dirs[0], dirs[1]});
  ASSERT_EQ(merged.size(), full.rows.size());
  auto key = [](const ResultRow& r) { return r.press + "/" + r.task; };
  std::map<std::string, ResultRow> by_key;
  for (const ResultRow& r : merged) by_key[key(r)] = r;
  for (const ResultRow& r : full.rows) {
    ASSERT_TRUE(by_key.count(key(r))) << key(r);
    const ResultRow& g = by_key[key(r)];
    EXPECT_EQ(g.n, r.n) << key(r);
    EXPECT_DOUBLE_EQ(g.score, r.score) << key(r);
    EXPECT_NEAR(g.evicted_fraction, r.evicted_fraction, 1e-12) << key(r);
  }
  // A missing shard is an error, so is a shard given twice; an unsharded run refuses a shard folder.
  EXPECT_THROW(merge_shard_folders({dirs[0], dirs[1]}), Error);
  EXPECT_THROW(merge_shard_folders({dirs[0], dirs[0], dirs[1]}), Error);
  EXPECT_THROW(run_sweep(setup, cells, dirs[0], quiet), Error);
  EXPECT_THROW(run_sweep(setup, cells, dirs[0], quiet, 3, 3), Error);
}
}  // namespace

TEST(EvalSweep, SharedPrefillGivesTheCellByCellOutcomesAndResumesAPartialCell) {
  // Every cell of a small grid on one prefill per context gives, sample by sample, what running the cells
  // one after the other gives (answers, scores, evicted fractions, KV bytes); an interrupted shared sweep
  // keeps a partial cell's finished samples (dropping a torn last line) and ends with the same files.
  const Model& m = model();
  const PromptBuilder prompts(m.tokenizer());
  const TinySuite t(prompts, {"niah_single_1", "niah_single_2"}, 300, 2);
  const std::vector<Sample>& samples = t.samples;
  Session session(m, small_session(600));
  const EvalSetup setup{m, session, prompts, samples, t.suite};
  PressSpec base;
  base.ratio_scope = "kvpress";
  base.decoding = true;  // the KVzap cell keeps pruning while answering: its press is cloned per question
  base.window = 16;
  const auto cells = plan_sweep({"knorm", "kvzap-mlp", "snapkv"}, {0.5}, {-4}, base);
  ASSERT_EQ(cells.size(), 4u);
  RunOptions per_cell, shared;
  per_cell.quiet = shared.quiet = true;
  per_cell.share_prefill = false;
  TempDir a, b;
  const SweepResult ra = run_sweep(setup, cells, a.str(), per_cell);
  const SweepResult rb = run_sweep(setup, cells, b.str(), shared);
  EXPECT_EQ(rb.cells_run, 4);
  auto outcomes = [](const fs::path& dir) {
    std::map<std::string, nlohmann::json> by_sample;
    for (const std::string& line : lines_of(dir / "samples.jsonl")) {
      nlohmann::json j = nlohmann::json::parse(line);
      j.erase("timings");
      j.erase("context_reused");
      by_sample[j["task"].get<std::string>() + "#" + std::to_string(j["index"].get<int64_t>())] = j;
    }
    return by_sample;
  };
  for (const PressSpec& c : cells) {
    SCOPED_TRACE(cell_dir_name(&c));
    const auto oa = outcomes(a.path() / cell_dir_name(&c)), ob = outcomes(b.path() / cell_dir_name(&c));
    ASSERT_EQ(oa.size(), samples.size());
    EXPECT_EQ(oa, ob);
    const nlohmann::json sb = read_json_file((b.path() / cell_dir_name(&c) / "summary.json").string());
    EXPECT_EQ(sb["prefill"], "shared");
    EXPECT_EQ(sb["average"], read_json_file((a.path() / cell_dir_name(&c) / "summary.json").string())["average"]);
  }
  ASSERT_EQ(ra.rows.size(), rb.rows.size());
  for (size_t i = 0; i < ra.rows.size(); i++) {
    EXPECT_EQ(ra.rows[i].press, rb.rows[i].press);
    EXPECT_EQ(ra.rows[i].score, rb.rows[i].score);
  }

  // Interrupt: the KVzap cell lost its summary, kept one sample and half of the next line.
  const fs::path kv = b.path() / cell_dir_name(&cells[2]);
  const std::vector<std::string> kept = lines_of(kv / "samples.jsonl");
  ASSERT_EQ(kept.size(), samples.size());
  fs::remove(kv / "summary.json");
  {
    std::ofstream out(kv / "samples.jsonl", std::ios::binary | std::ios::trunc);
    out << kept[0] << '\n' << kept[1].substr(0, kept[1].size() / 2);
  }
  int64_t ran = 0;
  RunOptions counting = shared;
  counting.on_sample = [&](const SampleOutcome&) { ran++; };
  const SweepResult again = run_sweep(setup, cells, b.str(), counting);
  EXPECT_EQ(again.cells_run, 1);
  EXPECT_EQ(again.cells_skipped, 3);
  EXPECT_EQ(ran, (int64_t)samples.size() - 1);  // only the missing samples ran
  EXPECT_EQ(outcomes(kv), outcomes(a.path() / cell_dir_name(&cells[2])));
  EXPECT_TRUE(cell_finished(kv.string()));

  // A grid whose recorded context would not fit the memory limit runs cell by cell: the same outcomes.
  TempDir c;
  RunOptions tight = shared;
  tight.recording_limit_bytes = 1;
  run_sweep(setup, {cells[1]}, c.str(), tight);
  EXPECT_EQ(outcomes(c.path() / cell_dir_name(&cells[1])), outcomes(a.path() / cell_dir_name(&cells[1])));
  EXPECT_EQ(read_json_file((c.path() / cell_dir_name(&cells[1]) / "summary.json").string())["prefill"], "per_cell");

  // A partial cell of another suite is not mixed in.
  fs::remove(kv / "summary.json");
  nlohmann::json other = setup.suite;
  other["seed"] = 43;
  const EvalSetup mismatched{m, session, prompts, samples, other};
  std::vector<PressSpec> only_kvzap = {cells[2]};
  EXPECT_THROW(run_sweep(mismatched, only_kvzap, b.str(), shared), Error);
}
