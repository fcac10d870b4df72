// RULER scoring, as RULER's scripts/eval/synthetic/constants.py and kvpress's
// evaluation/benchmarks/ruler/calculate_metrics.py define it:
//   string_match_all  = 100 * (fraction of references contained in the prediction)
//   string_match_part = 100 * (1 if any reference is contained, else 0)
// Containment is case-insensitive; the prediction is first stripped and cleaned of control
// characters. Task score = mean over samples; suite score = unweighted mean of task scores.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvzap::eval {

enum class Metric { StringMatchAll, StringMatchPart };

const char* metric_name(Metric m);               // "string_match_all" | "string_match_part"
Metric metric_from_name(const std::string& name);  // throws kvzap::Error for anything else

// qa_* -> StringMatchPart; every other RULER task -> StringMatchAll (throws for unknown names).
Metric metric_for_task(const std::string& task);
// RULER/kvpress token budgets: niah 128, vt 30, cwe 120, fwe 50, qa 32 (throws for unknown names).
int32_t max_new_tokens_for_task(const std::string& task);

// How control characters \x00-\x1f are treated before matching. kvpress deletes them (our
// protocol, the default); RULER's own evaluator replaces them by '\n'.
enum class ControlChars { Delete, ReplaceWithNewline };

// Strips ASCII whitespace at both ends, then applies the control-character rule, then strips again.
std::string clean_prediction(std::string_view prediction, ControlChars cc = ControlChars::Delete);

// Lower-cases ASCII and, through utf8proc, other code points (simple case mapping). Invalid UTF-8
// bytes are kept as they are.
std::string to_lower(std::string_view text);

// Per-sample scores in [0, 100]. The prediction is cleaned here (callers pass raw model output).
// Throws kvzap::Error when `references` is empty. An empty reference string is contained in every
// prediction (Python `"" in s` semantics).
double string_match_all(std::string_view prediction, const std::vector<std::string>& references,
                        ControlChars cc = ControlChars::Delete);
double string_match_part(std::string_view prediction, const std::vector<std::string>& references,
                         ControlChars cc = ControlChars::Delete);
double score_sample(Metric m, std::string_view prediction, const std::vector<std::string>& references,
                    ControlChars cc = ControlChars::Delete);

// One evaluated sample, as the evaluator collects it.
struct SampleResult {
  std::string task;
  double score = 0;             // 0..100 from score_sample
  double evicted_fraction = 0;  // fraction of context KV entries the press removed (0..1)
};

struct TaskScore {
  std::string task;
  int64_t n = 0;                // samples
  double score = 0;             // mean sample score, 0..100 (unrounded; RULER prints 2 decimals)
  double stderr_score = 0;      // standard error of that mean (sample sd / sqrt(n)); 0 when n < 2
  double evicted_fraction = 0;  // mean over samples
};

// Groups by task, in first-appearance order.
std::vector<TaskScore> aggregate_by_task(const std::vector<SampleResult>& results);
// Unweighted mean of task scores (the RULER/kvpress "average over the 13 tasks"); 0 if empty.
double suite_average(const std::vector<TaskScore>& tasks);

}  // namespace kvzap::eval
