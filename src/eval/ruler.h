// Offline RULER-style suite generator (13 tasks, kvpress row schema).
//
// Prompt layout, exactly as kvpress evaluates RULER:
//   [chat template: system + user header] context [question] [end of user + assistant header]
//   answer_prefix  -> greedy generation of up to max_new_tokens.
// `context` is what gets prefilled and compressed (instruction, one-shot example, haystack);
// `question` is fed after compression; `answer_prefix` opens the assistant turn. The strings
// are byte-for-byte what kvpress's regex split of a RULER prompt gives: the question keeps its
// trailing space, the answer prefix has none in front.
//
// Length: a sample for target length N satisfies
//   count_tokens(context, question) + tokens(answer_prefix) + max_new_tokens <= N
// (RULER's budget rule, with the chat template counted). The haystack size is found by a binary
// search over haystack units with all random choices drawn beforehand, so the counter is called
// O(log N) times per sample and the result is the largest unit count that fits.
//
// Determinism: every sample is a pure function of (seed, task, N, sample index, data files,
// token counter). Randomness comes from common/rng.h only.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "chat/chat_template.h"
#include "eval/metrics.h"
#include "tokenizer/tokenizer.h"

namespace kvzap::eval {

inline constexpr const char* kGeneratorVersion = "kvzap-ruler/1";

// Number of tokens the evaluator will feed for (context, question) with an EMPTY answer prefix:
// template prefix (BOS, system prompt, user header) + context + question + template suffix
// (end of user turn + assistant header). The generator derives the answer prefix's tokens as
// count("", answer_prefix) - count("", "").
using TokenCounter = std::function<int64_t(const std::string& context, const std::string& question)>;

struct SampleMeta {
  int64_t index = 0;            // sample index within its task
  int64_t target_length = 0;    // N
  int64_t prompt_tokens = 0;    // count_tokens(context, question) + answer-prefix tokens
  int64_t haystack_units = 0;   // sentences / noise blocks / lines / list words / documents chosen
  int64_t counter_calls = 0;    // token-counter calls spent on this sample
  uint64_t seed = 0;            // per-sample seed (serialised as 16 hex digits)
  std::vector<double> depths;   // percent (0..100) of each needle / chain line / gold document
  std::string generator = kGeneratorVersion;
  std::string corpus_hash;      // EvalData::corpus_hash of the data files used
};

struct Sample {
  std::string task;
  std::string context;
  std::string question;
  std::string answer_prefix;
  std::vector<std::string> answers;  // references for the metric
  int32_t max_new_tokens = 0;
  Metric metric = Metric::StringMatchAll;
  SampleMeta meta;
};

struct SuiteOptions {
  std::vector<std::string> tasks;   // empty = all of ruler_tasks(), in that order
  int64_t length = 4096;            // target N in model tokens, chat template included
  int64_t samples_per_task = 100;
  int64_t first_index = 0;          // sample indices [first_index, first_index + samples_per_task)
  uint64_t seed = 42;
  TokenCounter count_tokens;        // required
  bool reserve_generation = true;   // false: ignore max_new_tokens in the budget (prompt <= N)
  std::string data_dir;             // "" = default_eval_data_dir() (eval/haystack.h)
};

// The 13 RULER task names in the leaderboard's order.
const std::vector<std::string>& ruler_tasks();
bool is_ruler_task(const std::string& name);

// One sample (throws kvzap::Error for an unknown task, a missing counter, or an N too small for
// the task's fixed parts).
Sample generate_sample(const std::string& task, int64_t index, const SuiteOptions& opt);
// Tasks in order, samples_per_task each.
std::vector<Sample> generate_suite(const SuiteOptions& opt);

// JSON Lines: one object per sample with keys task, context, question, answer_prefix, answers,
// max_new_tokens, metric, meta{index, target_length, prompt_tokens, haystack_units,
// counter_calls, seed, depths, generator, corpus_hash}. Reading also accepts kvpress's "answer"
// for "answers" and rows without "meta"/"metric" (metric then follows the task name).
std::string sample_to_json(const Sample& s);  // one line, no trailing newline
Sample sample_from_json(const std::string& line);
void write_samples_jsonl(const std::string& path, const std::vector<Sample>& samples);
std::vector<Sample> read_samples_jsonl(const std::string& path);

// The exact counter for a model: renders a user turn around a sentinel with `fmt` (generation
// prompt on), splits it into template prefix and suffix as kvpress does, and returns
// ChatPrompt::encode(prefix + context) (one BOS: the template's or the vocabulary's) +
// tokens(question + suffix).
// Pass opt.enable_thinking = false for kvpress parity on Qwen3. The tokenizer must outlive the
// counter.
TokenCounter chat_token_counter(const Tokenizer& tok, ChatFormat fmt, const ChatOptions& opt = {});
// The same with the model's own chat template (tokenizer/chat_prompt.h; built-in format without one).
TokenCounter chat_token_counter(const Tokenizer& tok, const ChatOptions& opt = {});

// Rough counter (template ignored, ~4 bytes per token) for tests and dry runs; never for a real
// suite, whose lengths must come from the model's tokenizer.
TokenCounter approximate_token_counter();

}  // namespace kvzap::eval
