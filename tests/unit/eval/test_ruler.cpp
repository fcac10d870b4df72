// Offline RULER-style generator: RNG, text sources, per-task structure, length fitting,
// determinism and serialisation. Most tests use the rough byte counter (fast); one uses the
// default model's tokenizer with its chat template.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "chat/chat_template.h"
#include "common/rng.h"
#include "eval/haystack.h"
#include "eval/ruler.h"
#include "format/gguf.h"
#include "kvzap/error.h"
#include "test_support.h"

using namespace kvzap;
using namespace kvzap::eval;

namespace {

SuiteOptions rough_options(int64_t length, int64_t samples) {
  SuiteOptions o;
  o.length = length;
  o.samples_per_task = samples;
  o.count_tokens = approximate_token_counter();
  return o;
}

// One suite shared by the structural tests (4k, 4 samples per task).
const std::vector<Sample>& suite4k() {
  static const std::vector<Sample> s = generate_suite(rough_options(4096, 4));
  return s;
}

std::vector<const Sample*> of_task(const std::string& task) {
  std::vector<const Sample*> out;
  for (const auto& s : suite4k())
    if (s.task == task) out.push_back(&s);
  return out;
}

size_t occurrences(const std::string& hay, const std::string& needle) {
  size_t n = 0;
  for (size_t p = hay.find(needle); p != std::string::npos; p = hay.find(needle, p + 1)) ++n;
  return n;
}

std::vector<std::string> split_ws(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// RNG

TEST(EvalRng, SplitMixFirstOutputMatchesPublishedValue) {
  // SplitMix64 seeded with 0 first returns 0xe220a8397b1dcdaf (Vigna's reference splitmix64.c).
  EXPECT_EQ(mix64(0), 0xe220a8397b1dcdafull);
}

TEST(EvalRng, XoshiroMatchesIndependentImplementation) {
  // Produced by a separate Python transcription of SplitMix64 seeding + xoshiro256** (Blackman &
  // Vigna) and of the rejection rule, so platform-dependent behaviour in rng.h shows up here.
  Rng r(42);
  const uint64_t expected[] = {0x15780b2e0c2ec716ull, 0x6104d9866d113a7eull, 0xae17533239e499a1ull,
                               0xecb8ad4703b360a1ull, 0xfde6dc7fe2ec5e64ull};
  for (uint64_t e : expected) EXPECT_EQ(r.next(), e);
  Rng b(123);
  const uint64_t below1000[] = {497, 998, 367, 30, 94, 554, 755, 5};
  for (uint64_t e : below1000) EXPECT_EQ(b.below(1000), e);
  Rng c(42), d(43);
  EXPECT_NE(c.next(), d.next());
}

TEST(EvalRng, BelowIsInRangeAndRoughlyUniform) {
  Rng r(7);
  std::vector<int> counts(10, 0);
  for (int i = 0; i < 100000; ++i) {
    const uint64_t v = r.below(10);
    ASSERT_LT(v, 10u);
    ++counts[v];
  }
  for (int c : counts) EXPECT_NEAR(c, 10000, 500);  // ~5 sigma
  for (int i = 0; i < 1000; ++i) {
    const int64_t v = r.range(-3, 3);
    ASSERT_GE(v, -3);
    ASSERT_LE(v, 3);
  }
  EXPECT_EQ(r.range(5, 5), 5);
}

TEST(EvalRng, ShuffleAndSampleArePermutations) {
  Rng r(1);
  std::vector<int> v(50);
  for (int i = 0; i < 50; ++i) v[i] = i;
  auto w = v;
  r.shuffle(w);
  EXPECT_NE(w, v);
  std::sort(w.begin(), w.end());
  EXPECT_EQ(w, v);
  const auto idx = r.sample_indices(40, 7);
  ASSERT_EQ(idx.size(), 7u);
  std::set<size_t> uniq(idx.begin(), idx.end());
  EXPECT_EQ(uniq.size(), 7u);
  for (size_t i : idx) EXPECT_LT(i, 40u);
}

// ---------------------------------------------------------------------------------------------
// Text sources

TEST(EvalHaystack, SentenceSplitterKeepsAbbreviationsAndQuotes) {
  const auto s = split_sentences(
      "Mr. Elliot came in. \"Is it you?\" cried she. W. Smith answered! Then all was quiet... and late. End");
  ASSERT_EQ(s.size(), 5u) << ::testing::PrintToString(s);
  EXPECT_EQ(s[0], "Mr. Elliot came in.");
  EXPECT_EQ(s[1], "\"Is it you?\" cried she.");
  EXPECT_EQ(s[2], "W. Smith answered!");
  EXPECT_EQ(s[3], "Then all was quiet... and late.");
  EXPECT_EQ(s[4], "End");
  EXPECT_EQ(normalize_whitespace("  a \n\t b  "), "a b");
}

TEST(EvalHaystack, CommittedDataLoadsWithExpectedProperties) {
  const auto d = load_eval_data();
  EXPECT_GT(d->paragraphs.size(), 300u);
  EXPECT_GT(d->sentences.size(), d->paragraphs.size());
  EXPECT_EQ(d->paragraph_first_sentence.size(), d->paragraphs.size());
  EXPECT_GT(d->adjectives.size(), 500u);
  EXPECT_GT(d->nouns.size(), 1000u);
  EXPECT_EQ(d->corpus_hash.size(), 16u);
  // The CWE vocabulary must be substring-free (checked on a deterministic slice: O(n^2)).
  for (size_t i = 0; i < d->cwe_words.size(); i += 7)
    for (size_t j = 0; j < d->cwe_words.size(); ++j)
      if (i != j) ASSERT_EQ(d->cwe_words[j].find(d->cwe_words[i]), std::string::npos)
                      << d->cwe_words[i] << " in " << d->cwe_words[j];
  // Held-out novels only: Persuasion opens the haystack.
  EXPECT_EQ(d->paragraphs[0].rfind("Sir Walter Elliot, of Kellynch Hall", 0), 0u);
  EXPECT_THROW(load_eval_data("/nonexistent/eval-data"), Error);
}

// ---------------------------------------------------------------------------------------------
// Suite-level properties

TEST(EvalRuler, SuiteHasEveryTaskWithKvpressFields) {
  const auto& suite = suite4k();
  ASSERT_EQ(suite.size(), 13u * 4u);
  std::map<std::string, int> per_task;
  for (const auto& s : suite) {
    ++per_task[s.task];
    EXPECT_FALSE(s.context.empty());
    EXPECT_FALSE(s.question.empty());
    EXPECT_FALSE(s.answer_prefix.empty());
    EXPECT_FALSE(s.answers.empty());
    EXPECT_EQ(s.question.back(), ' ') << "kvpress keeps the space before the answer prefix in the question";
    EXPECT_NE(s.answer_prefix.front(), ' ');
    EXPECT_EQ(s.max_new_tokens, max_new_tokens_for_task(s.task));
    EXPECT_EQ(s.metric, s.task.rfind("qa_", 0) == 0 ? Metric::StringMatchPart : Metric::StringMatchAll);
    EXPECT_EQ(s.meta.generator, kGeneratorVersion);
    EXPECT_EQ(s.meta.corpus_hash, load_eval_data()->corpus_hash);
    for (const auto& a : s.answers) EXPECT_NE(s.context.find(a), std::string::npos) << s.task << ": " << a;
  }
  EXPECT_EQ(per_task.size(), 13u);
  for (const auto& t : ruler_tasks()) EXPECT_EQ(per_task[t], 4) << t;
  EXPECT_EQ(max_new_tokens_for_task("niah_multiquery"), 128);
  EXPECT_EQ(max_new_tokens_for_task("vt"), 30);
  EXPECT_EQ(max_new_tokens_for_task("cwe"), 120);
  EXPECT_EQ(max_new_tokens_for_task("fwe"), 50);
  EXPECT_EQ(max_new_tokens_for_task("qa_2"), 32);
}

TEST(EvalRuler, PromptFitsTheBudgetAndFillsIt) {
  const TokenCounter count = approximate_token_counter();
  const int64_t empty = count("", "");
  for (const auto& s : suite4k()) {
    const int64_t prefix = count("", s.answer_prefix) - empty;
    const int64_t total = count(s.context, s.question) + prefix;
    EXPECT_EQ(total, s.meta.prompt_tokens) << s.task;
    EXPECT_LE(total + s.max_new_tokens, 4096) << s.task;
    // Units are at most a few hundred tokens (a QA filler paragraph), so the fit is close.
    EXPECT_GT(total + s.max_new_tokens, 4096 - 400) << s.task;
    EXPECT_GT(s.meta.haystack_units, 0) << s.task;
    // O(log n) counter calls.
    EXPECT_LE(s.meta.counter_calls, 2 * (int64_t)std::log2((double)s.meta.haystack_units + 2) + 8) << s.task;
  }
}

TEST(EvalRuler, WithoutGenerationReserveThePromptAloneFits) {
  SuiteOptions o = rough_options(2048, 1);
  o.tasks = {"niah_single_1"};
  o.reserve_generation = false;
  const auto s = generate_suite(o);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_LE(s[0].meta.prompt_tokens, 2048);
  EXPECT_GT(s[0].meta.prompt_tokens, 2048 - 128);  // the 128 reserved tokens now hold haystack
}

TEST(EvalRuler, DeterministicAndIndexAddressable) {
  SuiteOptions o = rough_options(1024, 3);
  o.tasks = {"niah_multikey_2", "cwe", "qa_2"};
  const auto a = generate_suite(o);
  const auto b = generate_suite(o);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(sample_to_json(a[i]), sample_to_json(b[i]));
  // Sample i does not depend on how many samples were asked for (sharding / extending).
  for (const auto& task : o.tasks) {
    const Sample one = generate_sample(task, 2, o);
    const auto it = std::find_if(a.begin(), a.end(), [&](const Sample& s) { return s.task == task && s.meta.index == 2; });
    ASSERT_NE(it, a.end());
    EXPECT_EQ(sample_to_json(one), sample_to_json(*it));
  }
  SuiteOptions shifted = o;
  shifted.first_index = 2;
  shifted.samples_per_task = 1;
  EXPECT_EQ(sample_to_json(generate_suite(shifted)[0]), sample_to_json(a[2]));
  // Samples differ across indices, seeds and lengths.
  EXPECT_NE(a[0].context, a[1].context);
  SuiteOptions other = o;
  other.seed = 43;
  EXPECT_NE(generate_suite(other)[0].context, a[0].context);
  SuiteOptions longer = o;
  longer.length = 1100;
  EXPECT_NE(generate_suite(longer)[0].answers, a[0].answers);
}

TEST(EvalRuler, RejectsBadOptions) {
  SuiteOptions o = rough_options(4096, 1);
  o.tasks = {"niah_single_4"};
  EXPECT_THROW(generate_suite(o), Error);
  o.tasks = {"vt"};
  o.count_tokens = nullptr;
  EXPECT_THROW(generate_suite(o), Error);
  o = rough_options(100, 1);  // the fixed parts alone need more
  o.tasks = {"cwe"};
  EXPECT_THROW(generate_suite(o), Error);
  EXPECT_THROW(generate_sample("nope", 0, rough_options(4096, 1)), Error);
}

TEST(EvalRuler, FourKSuiteGeneratesEveryTask) {
  // (Speed is a benchmark's business, not a test's: no timing assertion on a shared machine.)
  const auto s = generate_suite(rough_options(4096, 10));
  EXPECT_EQ(s.size(), 130u);
  std::map<std::string, int> per_task;
  for (const auto& x : s) per_task[x.task]++;
  EXPECT_EQ(per_task.size(), 13u);
  for (const auto& [task, n] : per_task) EXPECT_EQ(n, 10) << task;
}

// ---------------------------------------------------------------------------------------------
// Per-task structure

TEST(EvalRuler, NiahNeedlesQueriesAndTemplates) {
  const std::map<std::string, size_t> needles = {{"niah_single_1", 1}, {"niah_single_2", 1}, {"niah_single_3", 1},
                                                 {"niah_multikey_1", 4}, {"niah_multivalue", 4},
                                                 {"niah_multiquery", 4}};
  const std::regex uuid("[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}");
  const std::regex number("[1-9][0-9]{6}");
  for (const auto& [task, n] : needles) {
    for (const Sample* s : of_task(task)) {
      EXPECT_EQ(occurrences(s->context, "One of the special magic"), n) << task;
      EXPECT_EQ(s->meta.depths.size(), n);
      for (double d : s->meta.depths) {
        const double grid = d * 39.0 / 100.0;
        EXPECT_NEAR(grid, std::round(grid), 1e-9) << "depth not on the 40-point grid";
      }
      const bool singular = task != "niah_multivalue" && task != "niah_multiquery";
      const std::string type = task == "niah_single_3" ? "uuid" : "number";
      if (singular) {
        EXPECT_EQ(s->context.rfind("A special magic " + type + " is hidden within the following text.", 0), 0u);
        EXPECT_EQ(s->question.rfind("What is the special magic " + type + " for ", 0), 0u) << s->question;
        EXPECT_EQ(s->answer_prefix.substr(s->answer_prefix.size() - 3), " is");
      } else {
        EXPECT_EQ(s->context.rfind("Some special magic numbers are hidden within the following text.", 0), 0u);
        EXPECT_EQ(s->question.rfind("What are all the special magic numbers for ", 0), 0u);
        EXPECT_EQ(s->answer_prefix.substr(s->answer_prefix.size() - 4), " are");
      }
      EXPECT_EQ(s->answers.size(), task == "niah_multivalue" || task == "niah_multiquery" ? 4u : 1u);
      for (const auto& a : s->answers) EXPECT_TRUE(std::regex_match(a, type == "uuid" ? uuid : number)) << a;
      // Every answer sits in a needle whose key is queried.
      for (const auto& a : s->answers) {
        const size_t at = s->context.find(" is: " + a + ".");
        ASSERT_NE(at, std::string::npos);
        const size_t key_start = s->context.rfind(" for ", at) + 5;
        const std::string key = s->context.substr(key_start, at - key_start);
        EXPECT_NE(s->question.find(key), std::string::npos) << key;
      }
    }
  }
  for (const Sample* s : of_task("niah_multiquery"))
    EXPECT_NE(s->question.find(", and "), std::string::npos) << "RULER joins keys as 'a, b, c, and d'";
  for (const Sample* s : of_task("niah_single_1"))
    EXPECT_GT(occurrences(s->context, "The grass is green. The sky is blue."), 50u);
}

TEST(EvalRuler, NiahMultikeyHaystacksAreDistractorNeedles) {
  for (const std::string task : {"niah_multikey_2", "niah_multikey_3"}) {
    for (const Sample* s : of_task(task)) {
      const size_t lines = occurrences(s->context, "One of the special magic");
      EXPECT_EQ((int64_t)lines, s->meta.haystack_units + 1) << task;
      // The queried key appears exactly once in the context.
      const std::string q = s->question;
      const size_t from = q.find(" for ") + 5, to = q.find(" mentioned in");
      const std::string key = q.substr(from, to - from);
      EXPECT_EQ(occurrences(s->context, " for " + key + " is: "), 1u) << task << " key " << key;
      if (task == "niah_multikey_3") EXPECT_EQ(key.size(), 36u);
    }
  }
}

TEST(EvalRuler, VariableTrackingChain) {
  for (const Sample* s : of_task("vt")) {
    ASSERT_EQ(s->answers.size(), 5u);
    const std::string value = split_ws(s->question)[9];  // "Question: Find ... assigned the value V in ..."
    EXPECT_NE(s->answer_prefix.find("5 variables are assigned the value " + value + ", they are: "), std::string::npos);
    // Skip the one-shot example: the real task starts at the last instruction.
    const size_t main = s->context.rfind("Memorize and track the chain(s)");
    ASSERT_NE(main, std::string::npos);
    ASSERT_NE(main, s->context.find("Memorize and track the chain(s)")) << "one-shot example missing";
    const std::string body = s->context.substr(main);
    size_t pos = body.find("VAR " + s->answers[0] + " = " + value + "\n");
    ASSERT_NE(pos, std::string::npos);
    for (size_t i = 1; i < 5; ++i) {
      const size_t next = body.find("VAR " + s->answers[i] + " = VAR " + s->answers[i - 1] + "\n");
      ASSERT_NE(next, std::string::npos);
      EXPECT_GT(next, pos) << "chain order must be kept";
      pos = next;
    }
    for (const auto& a : s->answers) EXPECT_TRUE(std::regex_match(a, std::regex("[A-Z]{5}")));
  }
}

TEST(EvalRuler, CommonWordsCounts) {
  for (const Sample* s : of_task("cwe")) {
    ASSERT_EQ(s->answers.size(), 10u);
    const size_t main = s->context.rfind("Below is a numbered list of words.");
    ASSERT_NE(main, s->context.find("Below is a numbered list of words.")) << "one-shot example missing";
    const std::string list = s->context.substr(s->context.find('\n', main) + 1);
    std::map<std::string, int> count;
    int expected_number = 1;
    const auto tokens = split_ws(list);
    for (size_t i = 0; i + 1 < tokens.size(); i += 2) {
      ASSERT_EQ(tokens[i], std::to_string(expected_number++) + ".");
      ++count[tokens[i + 1]];
    }
    for (const auto& a : s->answers) EXPECT_EQ(count[a], 30) << a;  // >= 4k: 30x
    for (const auto& [w, c] : count) {
      if (std::find(s->answers.begin(), s->answers.end(), w) == s->answers.end()) EXPECT_EQ(c, 3) << w;
      for (const auto& a : s->answers)
        if (w != a) EXPECT_EQ(w.find(a), std::string::npos) << a << " is a substring of " << w;
    }
  }
  SuiteOptions o = rough_options(1024, 1);
  o.tasks = {"cwe"};
  const Sample s = generate_suite(o)[0];
  const std::string list = s.context.substr(s.context.rfind("Below is a numbered list"));
  for (const auto& a : s.answers) EXPECT_EQ(occurrences(list, ". " + a + " "), 6u) << "below 4k: 6x";
}

TEST(EvalRuler, FrequentWordsAreRanksTwoToFour) {
  for (const Sample* s : of_task("fwe")) {
    const std::string instr = "Find the three most frequently appeared coded words. ";
    const size_t at = s->context.find(instr);
    ASSERT_NE(at, std::string::npos);
    std::map<std::string, int> count;
    for (const auto& w : split_ws(s->context.substr(at + instr.size()))) ++count[w];
    std::vector<std::pair<int, std::string>> ranked;
    for (const auto& [w, c] : count) ranked.push_back({c, w});
    std::sort(ranked.rbegin(), ranked.rend());
    ASSERT_GE(ranked.size(), 5u);
    EXPECT_EQ(ranked[0].second, "...");
    ASSERT_EQ(s->answers.size(), 3u);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(ranked[i + 1].second, s->answers[i]);
    EXPECT_GT(ranked[3].first, ranked[4].first) << "the third answer must be strictly more frequent";
  }
}

TEST(EvalRuler, QaDocumentsAndHops) {
  for (const std::string task : {"qa_1", "qa_2"}) {
    for (const Sample* s : of_task(task)) {
      ASSERT_EQ(s->answers.size(), 1u);
      EXPECT_EQ(s->answer_prefix, "Answer:");
      EXPECT_EQ(s->context.rfind("Answer the question based on the given documents.", 0), 0u);
      EXPECT_EQ(s->question.rfind("Answer the question based on the given documents.", 0), 0u);
      EXPECT_NE(s->question.find("\n\nQuestion: "), std::string::npos);
      // Documents are numbered 1..k consecutively.
      size_t k = 0;
      while (s->context.find("Document " + std::to_string(k + 1) + ":\n") != std::string::npos) ++k;
      EXPECT_GT(k, 5u);
      EXPECT_EQ(s->context.find("Document " + std::to_string(k + 1) + ":"), std::string::npos);
      EXPECT_EQ(s->meta.depths.size(), task == "qa_1" ? 1u : 2u);
    }
  }
  for (const Sample* s : of_task("qa_2")) {
    // "... of the founder of the X Kind?" -> the org document names the founder, whose own
    // document holds the answer.
    const std::string q = s->question;
    const size_t of = q.find("the founder of ");
    ASSERT_NE(of, std::string::npos);
    std::string org = q.substr(of + 15, q.rfind('?') - of - 15);
    if (org.size() > 5 && org.substr(org.size() - 5) == " born") org.resize(org.size() - 5);
    org[0] = (char)toupper(org[0]);
    const size_t org_doc = s->context.find(org + " ");
    ASSERT_NE(org_doc, std::string::npos) << org;
    const size_t doc_end = s->context.find("\n\n", org_doc);
    const std::string doc = s->context.substr(org_doc, doc_end - org_doc);
    EXPECT_EQ(doc.find(s->answers[0]), std::string::npos) << "the answer must need the second hop";
    EXPECT_GE(std::fabs(s->meta.depths[0] - s->meta.depths[1]), 30.0);
  }
}

// ---------------------------------------------------------------------------------------------
// Serialisation

TEST(EvalRuler, JsonlRoundTrip) {
  const auto& suite = suite4k();
  const std::string path = testing::TempDir() + "/kvzap_ruler_suite.jsonl";
  write_samples_jsonl(path, suite);
  const auto back = read_samples_jsonl(path);
  ASSERT_EQ(back.size(), suite.size());
  for (size_t i = 0; i < suite.size(); ++i) {
    EXPECT_EQ(sample_to_json(back[i]), sample_to_json(suite[i]));
    EXPECT_EQ(back[i].meta.seed, suite[i].meta.seed);
  }
  // kvpress-style rows: "answer" instead of "answers", no metric or meta.
  const Sample k = sample_from_json(
      R"({"context":"c","question":"q ","answer_prefix":"Answer:","answer":["x","y"],"task":"qa_1"})");
  EXPECT_EQ(k.answers, (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(k.metric, Metric::StringMatchPart);
  EXPECT_EQ(k.max_new_tokens, 32);
  EXPECT_THROW(sample_from_json(R"({"task":"qa_1","context":"c","answers":[]})"), Error);
  EXPECT_THROW(sample_from_json("{not json"), Error);
  std::filesystem::remove(path);
}

// ---------------------------------------------------------------------------------------------
// The real thing: the default model's tokenizer and chat template.

namespace {
std::string find_default_model() {
  return kvzap::test::default_model_path();
}
}  // namespace

TEST(EvalRuler, FitsWithTheModelTokenizerAndChatTemplate) {
  const std::string path = find_default_model();
  ASSERT_TRUE(std::filesystem::exists(path)) << "default model not found at " << path
                                             << ": run `kvzap pull` (or set KVZAP_MODEL)";
  const auto tok = Tokenizer::from_gguf(*gguf::File::open(path));
  const ChatFormat fmt = detect_chat_format(tok->vocab());
  SuiteOptions o;
  o.samples_per_task = 1;
  o.count_tokens = chat_token_counter(*tok, fmt);
  for (const int64_t length : {512, 1024}) {
    o.length = length;
    for (const auto& s : generate_suite(o)) {
      // Count the whole prompt the way an evaluator feeds it, independently of the counter.
      const std::string prompt = apply_chat_template(fmt, {{"user", s.context + s.question}}) + s.answer_prefix;
      const int64_t n = (int64_t)tok->encode(prompt, tok->vocab().add_bos).size();
      EXPECT_NEAR((double)n, (double)s.meta.prompt_tokens, 3.0) << s.task << " at " << length;
      EXPECT_LE(s.meta.prompt_tokens + s.max_new_tokens, length) << s.task;
      EXPECT_GT(s.meta.prompt_tokens + s.max_new_tokens, length - 200) << s.task;
      if (s.task == "cwe")
        EXPECT_EQ(length < 1024, s.context.find("Question:") == std::string::npos)
            << "below 1k the CWE one-shot example is dropped, otherwise kept";
    }
  }
}
