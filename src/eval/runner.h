// Running the offline RULER-style suite with the kvpress protocol: each context is prefilled (and
// compressed) once, then every question on it is fed with its answer prefix and answered greedily.
// Also the output files of one evaluation cell (one press at one setting) and the resumable sweep
// over many cells that `kvzap eval` and `kvzap sweep` are thin wrappers around.
#pragma once
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "chat/chat_prompt.h"
#include "common/progress.h"
#include "engine/session.h"
#include "eval/report.h"
#include "eval/ruler.h"
#include "press/press.h"
#include "tokenizer/tokenizer.h"

namespace kvzap::eval {

// Tokens of a sample, split exactly as chat_token_counter() measures them when the suite is
// generated (so a sample built for length N is fed as at most N - max_new_tokens tokens):
//   context  = ChatPrompt::encode(template prefix + context)  (one BOS: the template's or the vocabulary's)
//   question = tokens(question + template suffix + answer_prefix)
// This is kvpress's split: the question follows the context directly (RULER contexts end in "\n"),
// unlike engine/pipeline.h's build_context_prompt, which puts "\n\n" in between.
class PromptBuilder {
 public:
  // Renders one user turn with the generation prompt on; enable_thinking off (kvpress default).
  PromptBuilder(const Tokenizer& tok, ChatFormat fmt);  // a built-in format
  explicit PromptBuilder(const Tokenizer& tok);  // the model's own chat template (built-in format without one)

  std::vector<int32_t> context_ids(const std::string& context) const;
  std::vector<int32_t> question_ids(const std::string& question, const std::string& answer_prefix) const;
  // The counter the suite must be generated with for these prompts.
  TokenCounter counter() const;

 private:
  explicit PromptBuilder(ChatPrompt prompt);
  const Tokenizer& tok_;
  ChatPrompt prompt_;
  std::string prefix_, suffix_;
};

// One answered sample.
struct SampleOutcome {
  std::string task;
  int64_t index = 0;
  std::string prediction;
  std::vector<std::string> answers;
  double score = 0;  // 0..100, the task's metric
  // Cache after the context was compressed (kvpress's compression_ratio) and after the answer.
  double evicted_fraction = 0, evicted_fraction_end = 0;
  int64_t kv_bytes = 0, kv_bytes_full = 0, kv_bytes_end = 0, kv_bytes_full_end = 0;
  int64_t context_tokens = 0, question_tokens = 0, generated_tokens = 0;
  std::string stop_reason;
  // context_seconds: prefill + compression of the context; 0 when an earlier sample on the same
  // context already paid for it (context_reused = true).
  double context_seconds = 0, question_seconds = 0, decode_seconds = 0;
  bool context_reused = false;
  // A sweep that prefilled the context once for all its cells (run_sweep, share_prefill): that prefill's
  // time, and context_seconds holds only this press's replay and compression of it. 0 otherwise.
  double shared_prefill_seconds = 0;
  std::vector<double> depths;  // needle depths from the sample's metadata
};

nlohmann::json outcome_to_json(const SampleOutcome& o);
SampleOutcome outcome_from_json(const nlohmann::json& j);

struct RunOptions {
  // Called after every sample, in the order samples are answered.
  std::function<void(const SampleOutcome&)> on_sample;
  // Advanced by one per sample with a short status; nullptr = a bar of run_samples' own on stderr
  // (unless quiet).
  Progress* progress = nullptr;
  std::string label = "eval";
  bool quiet = false;
  // run_sweep only: prefill each context once, recorded, and replay it under every cell's press
  // (engine/context_recording.h; the outcomes are the same bits as cell by cell), instead of running
  // the cells one after the other, each prefilling every context again.
  bool share_prefill = true;
  // The most memory a recorded context may take (ContextRecording::bytes_for its longest context); a grid
  // whose contexts need more runs cell by cell instead, with a note. -1 = half of MemAvailable.
  int64_t recording_limit_bytes = -1;
};

// Answers every sample. Samples with the same context share one prefill (and one compression);
// contexts are taken in order of first appearance. Returns outcomes in the order of `samples`.
// Throws kvzap::Error when a sample does not fit the session's context size.
std::vector<SampleOutcome> run_samples(Session& session, Press* press, const PromptBuilder& prompts,
                                       const std::vector<Sample>& samples, const RunOptions& opt = {});

// The budget split kvpress uses for a press at a fixed ratio: one global bottom-k over all layers
// and heads for KVzip/KVzip+ (KVzipPress.compress_post), the same count per KV head for every other
// ScorerPress (its default top-k). Presses with their own split (AdaKV wrappers, PyramidKV, ChunkKV)
// ignore the scope.
std::string kvpress_ratio_scope(const std::string& press);

// What a cell's results are labelled with in ResultRows: "no_press" without a press, else the press
// name, with "+decoding" for decoding-time pruning and "@<scope>" when a ratio press uses another
// budget split than kvpress_ratio_scope().
std::string press_label(const PressSpec* press);
std::string setting_kind(const PressSpec* press);  // "none" | "ratio" | "threshold"
double setting_value(const PressSpec* press);
// Folder name of a cell: "no_press", "knorm__ratio_0.5", "kvzap-mlp__threshold_-4".
std::string cell_dir_name(const PressSpec* press);

// Everything a cell needs besides its press.
struct EvalSetup {
  const Model& model;
  Session& session;
  const PromptBuilder& prompts;
  const std::vector<Sample>& samples;
  // Describes the suite (length, samples, seed, tasks, generator, corpus hash); stored in every
  // summary.json and compared by the sweep before it trusts a finished cell.
  nlohmann::json suite;
};

struct CellResult {
  std::vector<SampleOutcome> outcomes;
  std::vector<TaskScore> tasks;
  std::vector<ResultRow> rows;
  nlohmann::json summary;
};

// Runs the samples under `press` (nullptr = full cache) and writes into out_dir:
//   samples.jsonl  one outcome per line, written as samples finish
//   tasks.csv, tasks.json  ResultRows per task (report.h format)
//   summary.json   written last (its presence marks the cell finished): press, setting, suite,
//                  average, evicted fraction, KV bytes, timings, per-task scores
CellResult run_cell(const EvalSetup& setup, const PressSpec* press, const std::string& out_dir,
                    const RunOptions& opt = {});

// A cell counts as finished when its summary.json exists.
bool cell_finished(const std::string& cell_dir);

// The sweep grid: the full-cache cell first, then for each press its settings. Presses that only
// support a ratio always get `ratios`; per-step presses get `thresholds` when their name starts
// with "kvzap" (the leaderboard runs KVzap by threshold) and `ratios` otherwise. A name may force
// the policy and the ratio scope: "knorm:threshold", "kvzap-mlp:ratio", "knorm@global",
// "snapkv:ratio@adakv"; "+decoding" after a threshold press's name makes it prune while decoding
// ("kvzap-mlp+decoding"), so one grid can hold both variants. `base` supplies window, decoding, seed, surrogate folder and the scope
// ("kvpress" = kvpress_ratio_scope() of each press). Throws kvzap::Error for an unknown press or a press left
// without settings.
std::vector<PressSpec> plan_sweep(const std::vector<std::string>& presses, const std::vector<double>& ratios,
                                     const std::vector<double>& thresholds, const PressSpec& base,
                                     bool include_full_cache = true);

struct SweepResult {
  int cells_run = 0, cells_skipped = 0;
  std::vector<ResultRow> rows;  // every cell's rows, grid order
  double seconds = 0;
};

// Runs the grid into out_dir/<cell_dir_name>/, skipping finished cells (after checking that their
// suite matches setup.suite; a mismatch throws, so results of different suites never mix), and
// writes out_dir/results.csv with all rows. An overall progress line (samples of all cells, ETA)
// goes to stderr unless opt.quiet. With opt.share_prefill (the default) the grid runs context by
// context: each context is prefilled once and every unfinished cell answers its questions on a replay
// of that prefill under its press; an unfinished cell's samples.jsonl is kept and only its missing
// samples run (a torn last line is dropped). Cell by cell, an unfinished cell reruns from its start.
// shard_index / shard_count: run only the samples of the contexts g (in order of first appearance) with
// g % count == index, under every cell — a deterministic 1/count of the grid's (cell, sample) units in
// which each context is prefilled on one shard only, so machines can split a sweep; OUT/shard.json
// records the shard and `kvzap report` merges the shard folders (merge_shard_folders).
SweepResult run_sweep(const EvalSetup& setup, const std::vector<PressSpec>& cells, const std::string& out_dir,
                      const RunOptions& opt = {}, int shard_index = 0, int shard_count = 1);
// True if `dir` is the output folder of a sharded sweep (it holds shard.json).
bool is_shard_folder(const std::string& dir);
// Result rows of the cells of several shard folders of one sweep, each cell's samples pooled over the
// shards (every shard 0..n-1 must be present, with the same suite). Throws kvzap::Error otherwise.
std::vector<ResultRow> merge_shard_folders(const std::vector<std::string>& dirs);

// Suite description for EvalSetup::suite.
nlohmann::json suite_description(const SuiteOptions& opt, const std::vector<Sample>& samples,
                                 const std::string& model_name);

}  // namespace kvzap::eval
