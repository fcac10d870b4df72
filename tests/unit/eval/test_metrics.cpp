// RULER string_match_all / string_match_part, cleaning, and aggregation. Expected values follow
// from the definitions in RULER's scripts/eval/synthetic/constants.py and kvpress's
// calculate_metrics.py (Python: r.lower() in pred.lower() after strip + control-char removal).
#include <gtest/gtest.h>

#include <cmath>

#include "eval/metrics.h"
#include "kvzap/error.h"

using namespace kvzap;
using namespace kvzap::eval;

TEST(EvalMetrics, EmptyOutputScoresZero) {
  EXPECT_EQ(string_match_all("", {"1234567"}), 0.0);
  EXPECT_EQ(string_match_part("", {"Paris", "paris city"}), 0.0);
  EXPECT_EQ(string_match_all("   \n\t ", {"x"}), 0.0);
}

TEST(EvalMetrics, SeveralAnswersAllVersusPart) {
  const std::vector<std::string> refs = {"1111111", "2222222", "3333333", "4444444"};
  EXPECT_DOUBLE_EQ(string_match_all("1111111, 3333333 and 4444444", refs), 75.0);
  EXPECT_DOUBLE_EQ(string_match_all("2222222", refs), 25.0);
  EXPECT_DOUBLE_EQ(string_match_all("1111111 2222222 3333333 4444444", refs), 100.0);
  EXPECT_DOUBLE_EQ(string_match_part("2222222", refs), 100.0);
  EXPECT_DOUBLE_EQ(string_match_part("5555555", refs), 0.0);
  // A repeated reference counts once per reference entry.
  EXPECT_DOUBLE_EQ(string_match_all("abc", {"abc", "abc", "zzz"}), 100.0 * 2.0 / 3.0);
}

TEST(EvalMetrics, CaseInsensitive) {
  EXPECT_DOUBLE_EQ(string_match_all("The words are APPLE and Pear.", {"apple", "PEAR"}), 100.0);
  EXPECT_DOUBLE_EQ(string_match_part("ZÜRICH", {"zürich"}), 100.0);  // non-ASCII lower-casing
  EXPECT_EQ(to_lower("ÀÉÎ Abc"), "àéî abc");
}

TEST(EvalMetrics, WhitespaceAndControlCharacters) {
  // kvpress deletes \x00-\x1f: a value broken by a newline is joined back together.
  EXPECT_DOUBLE_EQ(string_match_all("  123\n4567  ", {"1234567"}), 100.0);
  EXPECT_EQ(clean_prediction("\n\t 12\x01" "34 \r\n"), "1234");
  // RULER's own evaluator replaces them with '\n' instead, which keeps the pieces apart.
  EXPECT_DOUBLE_EQ(string_match_all("123\n4567", {"1234567"}, ControlChars::ReplaceWithNewline), 0.0);
  EXPECT_EQ(clean_prediction(" a\tb ", ControlChars::ReplaceWithNewline), "a\nb");
  // Inner spaces are not removed: "123 4567" does not contain "1234567".
  EXPECT_DOUBLE_EQ(string_match_all("123 4567", {"1234567"}), 0.0);
  // Python's strip also removes Unicode spaces such as NO-BREAK SPACE at the ends.
  EXPECT_EQ(clean_prediction("\xc2\xa0" "abc" "\xc2\xa0"), "abc");
}

TEST(EvalMetrics, PartialMatchesAreSubstrings) {
  // Substring semantics: a longer output containing the value counts (verbose outputs are not
  // penalised), a truncated value does not.
  EXPECT_DOUBLE_EQ(string_match_all("the number is 12345678", {"1234567"}), 100.0);
  EXPECT_DOUBLE_EQ(string_match_all("the number is 123456", {"1234567"}), 0.0);
  EXPECT_DOUBLE_EQ(string_match_part("Answer: party", {"art"}), 100.0);  // RULER's known quirk
  // Empty reference string is contained in everything (Python: "" in s is True).
  EXPECT_DOUBLE_EQ(string_match_all("", {""}), 100.0);
}

TEST(EvalMetrics, NoReferencesIsAnError) {
  EXPECT_THROW(string_match_all("x", {}), Error);
  EXPECT_THROW(string_match_part("x", {}), Error);
}

TEST(EvalMetrics, TaskMapping) {
  EXPECT_EQ(metric_for_task("qa_1"), Metric::StringMatchPart);
  EXPECT_EQ(metric_for_task("qa_2"), Metric::StringMatchPart);
  EXPECT_EQ(metric_for_task("niah_single_1"), Metric::StringMatchAll);
  EXPECT_EQ(metric_for_task("cwe"), Metric::StringMatchAll);
  EXPECT_THROW(metric_for_task("qa_3"), Error);
  EXPECT_EQ(metric_from_name(metric_name(Metric::StringMatchPart)), Metric::StringMatchPart);
  EXPECT_EQ(metric_from_name(metric_name(Metric::StringMatchAll)), Metric::StringMatchAll);
  EXPECT_THROW(metric_from_name("exact"), Error);
  EXPECT_DOUBLE_EQ(score_sample(Metric::StringMatchPart, "b", {"a", "b"}), 100.0);
  EXPECT_DOUBLE_EQ(score_sample(Metric::StringMatchAll, "b", {"a", "b"}), 50.0);
}

TEST(EvalMetrics, AggregationPerTaskAndSuite) {
  const std::vector<SampleResult> results = {
      {"vt", 100, 0.5}, {"qa_1", 0, 0.25}, {"vt", 50, 0.7}, {"vt", 0, 0.3}, {"qa_1", 100, 0.75},
  };
  const auto tasks = aggregate_by_task(results);
  ASSERT_EQ(tasks.size(), 2u);
  EXPECT_EQ(tasks[0].task, "vt");  // first-appearance order
  EXPECT_EQ(tasks[0].n, 3);
  EXPECT_DOUBLE_EQ(tasks[0].score, 50.0);
  EXPECT_DOUBLE_EQ(tasks[0].evicted_fraction, 0.5);
  // Sample sd of {100, 50, 0} is 50, so the standard error is 50 / sqrt(3).
  EXPECT_NEAR(tasks[0].stderr_score, 50.0 / std::sqrt(3.0), 1e-9);
  EXPECT_EQ(tasks[1].task, "qa_1");
  EXPECT_DOUBLE_EQ(tasks[1].score, 50.0);
  EXPECT_DOUBLE_EQ(tasks[1].evicted_fraction, 0.5);
  // Suite average is the unweighted mean of task scores, not of samples.
  const std::vector<TaskScore> t2 = {{"a", 1, 100.0, 0, 0}, {"b", 9, 0.0, 0, 0}};
  EXPECT_DOUBLE_EQ(suite_average(t2), 50.0);
  EXPECT_EQ(suite_average({}), 0.0);
  EXPECT_EQ(aggregate_by_task({{"x", 80, 0}})[0].stderr_score, 0.0);
}
