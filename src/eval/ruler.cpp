// Offline RULER-style suite: task plans (everything random drawn up front) and the length fitter.
// Template wording and formats follow RULER's scripts/data/synthetic/constants.py and the task
// scripts (docs/ALGORITHMS.md §9.2).
#include "eval/ruler.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <numbers>
#include <unordered_set>

#include "chat/chat_prompt.h"
#include "common/rng.h"
#include "eval/haystack.h"
#include "kvzap/error.h"

namespace kvzap::eval {
namespace {

// ----------------------------------------------------------------------------------------------
// Constants that must match RULER byte for byte.

constexpr const char* kNoiseBlock =
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";
constexpr const char* kVtInstruction =
    "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n";
constexpr const char* kCweInstruction =
    "Below is a numbered list of words. In these words, some appear more often than others. "
    "Memorize the ones that appear most often.\n";
constexpr const char* kCweQuestion = "Question: What are the 10 most common words in the above list? ";
constexpr const char* kCweAnswerPrefix = "Answer: The top 10 words that appear most often in the list are:";
constexpr const char* kFweInstruction =
    "Read the following coded text and track the frequency of each coded word. "
    "Find the three most frequently appeared coded words. ";
constexpr const char* kFweQuestion =
    "Question: Do not provide any explanation. Please ignore the dots '....'. "
    "What are the three most frequently appeared words in the above coded text? ";
constexpr const char* kFweAnswerPrefix =
    "Answer: According to the coded text above, the three most frequently appeared words are:";
constexpr const char* kQaInstruction =
    "Answer the question based on the given documents. Only give me the answer and do not output any other words.";

constexpr int64_t kMaxUnits = int64_t(1) << 22;

std::string vt_question(int64_t value) {
  return "Question: Find all variables that are assigned the value " + std::to_string(value) + " in the text above. ";
}
// RULER's 2024 generator spelled "assgined"; the current one (and this suite) spells it right.
std::string vt_answer_prefix(int64_t value, size_t n_vars) {
  return "Answer: According to the chain(s) of variable assignment in the text above, " + std::to_string(n_vars) +
         " variables are assigned the value " + std::to_string(value) + ", they are: ";
}

// The 40 evenly spaced needle depths 0..100 % (numpy.linspace(0, 100, 40)).
double grid_depth(size_t i) { return 100.0 * (double)i / 39.0; }

std::vector<double> draw_grid_depths(Rng& rng, size_t k) {
  std::vector<double> depths;
  for (size_t i : rng.sample_indices(40, k)) depths.push_back(grid_depth(i));
  return depths;
}

// Insertion point of something at `depth` percent of n units (RULER: int(n * depth / 100)).
int64_t position_at(double depth, int64_t n) {
  return std::clamp<int64_t>((int64_t)std::floor((double)n * depth / 100.0), 0, n);
}

// ----------------------------------------------------------------------------------------------
// A plan: everything random is drawn; only the amount of haystack (units) is left open.

struct TaskPlan {
  std::function<std::string(int64_t units)> context;
  std::string question;
  std::string answer_prefix;
  std::vector<std::string> answers;
  std::vector<double> depths;
  int64_t min_units = 0;
  int64_t max_units = kMaxUnits;
};

struct Insert {
  double depth;
  std::string text;
};

// The n haystack units with `inserts` (sorted by depth) placed at their depths, in text order.
std::vector<const std::string*> weave_order(int64_t n, const std::function<const std::string&(int64_t)>& unit,
                                            const std::vector<Insert>& inserts) {
  std::vector<const std::string*> out;
  out.reserve((size_t)n + inserts.size());
  size_t next = 0;
  for (int64_t i = 0; i <= n; ++i) {
    while (next < inserts.size() && position_at(inserts[next].depth, n) == i) out.push_back(&inserts[next++].text);
    if (i < n) out.push_back(&unit(i));
  }
  return out;
}

std::string weave(int64_t n, const std::function<const std::string&(int64_t)>& unit,
                  const std::vector<Insert>& inserts, const char* sep) {
  std::string out;
  bool first = true;
  for (const std::string* piece : weave_order(n, unit, inserts)) {
    if (!first) out += sep;
    out += *piece;
    first = false;
  }
  return out;
}

void sort_by_depth(std::vector<Insert>& v) {
  std::stable_sort(v.begin(), v.end(), [](const Insert& a, const Insert& b) { return a.depth < b.depth; });
}

// ----------------------------------------------------------------------------------------------
// Random values.

std::string random_number7(Rng& rng) { return std::to_string(rng.range(1000000, 9999999)); }

std::string random_uuid4(Rng& rng) {
  uint8_t b[16];
  for (int i = 0; i < 16; i += 8) {
    const uint64_t r = rng.next();
    for (int j = 0; j < 8; ++j) b[i + j] = (uint8_t)(r >> (8 * j));
  }
  b[6] = (uint8_t)((b[6] & 0x0f) | 0x40);  // version 4
  b[8] = (uint8_t)((b[8] & 0x3f) | 0x80);  // RFC 4122 variant
  char out[37];
  std::snprintf(out, sizeof out, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
                b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
  return out;
}

std::string random_word_key(Rng& rng, const EvalData& d) {
  const auto& adj = d.adjectives[rng.below(d.adjectives.size())];
  return adj + "-" + d.nouns[rng.below(d.nouns.size())];
}

std::string random_letters(Rng& rng, int n, char base) {
  std::string s;
  for (int i = 0; i < n; ++i) s.push_back((char)(base + rng.below(26)));
  return s;
}

// n distinct values from `draw`, none in `taken` (which receives them).
std::vector<std::string> distinct(Rng& rng, size_t n, std::unordered_set<std::string>& taken,
                                  const std::function<std::string(Rng&)>& draw) {
  std::vector<std::string> out;
  while (out.size() < n) {
    std::string v = draw(rng);
    if (taken.insert(v).second) out.push_back(std::move(v));
  }
  return out;
}

// ----------------------------------------------------------------------------------------------
// NIAH family.

enum class Haystack { Noise, Essay, Needles };
enum class Kind { Word, Number, Uuid };

struct NiahSpec {
  Haystack haystack;
  Kind key;
  Kind value;
  int keys, values, queries;
};

NiahSpec niah_spec(const std::string& task) {
  if (task == "niah_single_1") return {Haystack::Noise, Kind::Word, Kind::Number, 1, 1, 1};
  if (task == "niah_single_2") return {Haystack::Essay, Kind::Word, Kind::Number, 1, 1, 1};
  if (task == "niah_single_3") return {Haystack::Essay, Kind::Word, Kind::Uuid, 1, 1, 1};
  if (task == "niah_multikey_1") return {Haystack::Essay, Kind::Word, Kind::Number, 4, 1, 1};
  if (task == "niah_multikey_2") return {Haystack::Needles, Kind::Word, Kind::Number, 1, 1, 1};
  if (task == "niah_multikey_3") return {Haystack::Needles, Kind::Uuid, Kind::Uuid, 1, 1, 1};
  if (task == "niah_multivalue") return {Haystack::Essay, Kind::Word, Kind::Number, 1, 4, 1};
  return {Haystack::Essay, Kind::Word, Kind::Number, 4, 1, 4};  // niah_multiquery
}

std::string draw_kind(Rng& rng, Kind k, const EvalData& d) {
  switch (k) {
    case Kind::Word: return random_word_key(rng, d);
    case Kind::Number: return random_number7(rng);
    default: return random_uuid4(rng);
  }
}

std::string needle_text(const std::string& type_plural, const std::string& key, const std::string& value) {
  return "One of the special magic " + type_plural + " for " + key + " is: " + value + ".";
}

TaskPlan plan_niah(const std::string& task, Rng& rng, uint64_t seed, const std::shared_ptr<const EvalData>& data) {
  const NiahSpec spec = niah_spec(task);
  const EvalData& d = *data;
  const std::string type = spec.value == Kind::Uuid ? "uuids" : "numbers";
  TaskPlan plan;

  std::unordered_set<std::string> taken;
  const auto keys = distinct(rng, (size_t)spec.keys, taken, [&](Rng& r) { return draw_kind(r, spec.key, d); });
  std::vector<std::vector<std::string>> values(keys.size());
  std::vector<Insert> needles;
  for (size_t i = 0; i < keys.size(); ++i) {
    values[i] = distinct(rng, (size_t)spec.values, taken, [&](Rng& r) { return draw_kind(r, spec.value, d); });
    for (const auto& v : values[i]) needles.push_back({0.0, needle_text(type, keys[i], v)});
  }
  std::vector<size_t> queried = rng.sample_indices(keys.size(), (size_t)spec.queries);
  rng.shuffle(needles);
  std::vector<double> depths = draw_grid_depths(rng, needles.size());
  std::sort(depths.begin(), depths.end());
  for (size_t i = 0; i < needles.size(); ++i) needles[i].depth = depths[i];
  plan.depths = depths;

  // RULER joins several queried keys as "a, b, c, and d".
  std::string query;
  for (size_t i = 0; i < queried.size(); ++i) {
    if (i > 0) query += i + 1 == queried.size() ? ", and " : ", ";
    query += keys[queried[i]];
    for (const auto& v : values[queried[i]]) plan.answers.push_back(v);
  }

  std::string instruction;
  if (spec.queries * spec.values == 1) {  // RULER rewrites the template to the singular
    const std::string t = type.substr(0, type.size() - 1);
    instruction = "A special magic " + t + " is hidden within the following text. Make sure to memorize it. " +
                  "I will quiz you about the " + t + " afterwards.\n";
    plan.question = "What is the special magic " + t + " for " + query + " mentioned in the provided text? ";
    plan.answer_prefix = "The special magic " + t + " for " + query + " mentioned in the provided text is";
  } else {
    instruction = "Some special magic " + type + " are hidden within the following text. Make sure to memorize it. " +
                  "I will quiz you about the " + type + " afterwards.\n";
    plan.question = "What are all the special magic " + type + " for " + query + " mentioned in the provided text? ";
    plan.answer_prefix = "The special magic " + type + " for " + query + " mentioned in the provided text are";
  }

  if (spec.haystack == Haystack::Noise) {
    static const std::string noise = kNoiseBlock;
    plan.context = [instruction, needles](int64_t n) {
      return instruction + weave(n, [](int64_t) -> const std::string& { return noise; }, needles, "\n") + "\n";
    };
  } else if (spec.haystack == Haystack::Essay) {
    const uint32_t start = d.paragraph_first_sentence[rng.below(d.paragraphs.size())];
    plan.context = [instruction, needles, data, start](int64_t n) {
      const auto& s = data->sentences;
      auto unit = [&](int64_t i) -> const std::string& { return s[(start + (uint64_t)i) % s.size()]; };
      return instruction + weave(n, unit, needles, " ") + "\n";
    };
  } else {
    // Every haystack line is a distractor needle with a fresh key; line i comes from its own
    // seed so that the first n lines do not depend on n.
    auto lines = std::make_shared<std::vector<std::string>>();
    auto real = std::make_shared<std::unordered_set<std::string>>(taken);
    const NiahSpec sp = spec;
    plan.context = [instruction, needles, data, lines, real, sp, type, seed](int64_t n) {
      while ((int64_t)lines->size() < n) {
        Rng r(hash_combine(seed, 0x6e6565646c65ull + lines->size()));
        std::string key;
        do key = draw_kind(r, sp.key, *data);
        while (real->count(key));
        lines->push_back(needle_text(type, key, draw_kind(r, sp.value, *data)));
      }
      auto unit = [&](int64_t i) -> const std::string& { return (*lines)[(size_t)i]; };
      return instruction + weave(n, unit, needles, "\n") + "\n";
    };
  }
  return plan;
}

// ----------------------------------------------------------------------------------------------
// Variable tracking: one chain of 5 variables (4 hops) hidden in noise blocks, plus a solved
// one-shot example with 3-letter names.

std::vector<std::string> vt_chain_lines(const std::vector<std::string>& names, int64_t value) {
  std::vector<std::string> lines{"VAR " + names[0] + " = " + std::to_string(value)};
  for (size_t i = 1; i < names.size(); ++i) lines.push_back("VAR " + names[i] + " = VAR " + names[i - 1]);
  return lines;
}

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) out += sep;
    out += v[i];
  }
  return out;
}

TaskPlan plan_vt(Rng& rng, int64_t length) {
  TaskPlan plan;
  std::unordered_set<std::string> taken;
  const auto names = distinct(rng, 5, taken, [](Rng& r) { return random_letters(r, 5, 'A'); });
  const int64_t value = rng.range(10000, 99998);
  std::vector<Insert> chain;
  for (auto& line : vt_chain_lines(names, value)) chain.push_back({0.0, line});
  std::vector<double> depths = draw_grid_depths(rng, chain.size());
  std::sort(depths.begin(), depths.end());  // chain order is kept in the text
  for (size_t i = 0; i < chain.size(); ++i) chain[i].depth = depths[i];
  plan.depths = depths;

  // One-shot example: RULER uses ~500 tokens; scaled down below 4k so short budgets keep room.
  const int64_t ex_blocks = length >= 4096 ? 20 : length >= 2048 ? 10 : 5;
  const auto ex_names = distinct(rng, 5, taken, [](Rng& r) { return random_letters(r, 3, 'A'); });
  int64_t ex_value;
  do ex_value = rng.range(10000, 99998);
  while (ex_value == value);
  std::vector<Insert> ex_chain;
  std::vector<double> ex_depths = draw_grid_depths(rng, ex_names.size());
  std::sort(ex_depths.begin(), ex_depths.end());
  const auto ex_lines = vt_chain_lines(ex_names, ex_value);
  for (size_t i = 0; i < ex_lines.size(); ++i) ex_chain.push_back({ex_depths[i], ex_lines[i]});
  static const std::string noise = kNoiseBlock;
  auto noise_unit = [](int64_t) -> const std::string& { return noise; };
  const std::string example = std::string(kVtInstruction) + weave(ex_blocks, noise_unit, ex_chain, "\n") + "\n" +
                              vt_question(ex_value) + vt_answer_prefix(ex_value, ex_names.size()) +
                              join(ex_names, " ") + "\n\n";

  plan.context = [example, chain, noise_unit](int64_t n) {
    return example + kVtInstruction + weave(n, noise_unit, chain, "\n") + "\n";
  };
  plan.question = vt_question(value);
  plan.answer_prefix = vt_answer_prefix(value, names.size());
  plan.answers = names;
  return plan;
}

// ----------------------------------------------------------------------------------------------
// Common words extraction: 10 words repeated often, the rest rarely, in a numbered list.

std::string numbered(const std::vector<std::string>& words) {
  std::string out;
  for (size_t i = 0; i < words.size(); ++i) {
    if (i) out += ' ';
    out += std::to_string(i + 1) + ". " + words[i];
  }
  return out;
}

TaskPlan plan_cwe(Rng& rng, uint64_t seed, int64_t length, const EvalData& d) {
  // RULER: >= 4k tokens the list repeats common words 30x and others 3x and the example uses
  // 40 words (10x / 3x); below 4k: 6x / 1x, example 20 words (3x / 1x). Below 1k (not a RULER
  // length) the example would not fit at all: 4x / 1x and no example.
  const bool long_ctx = length >= 4096, tiny_ctx = length < 1024;
  const int common_rep = long_ctx ? 30 : tiny_ctx ? 4 : 6, rare_rep = long_ctx ? 3 : 1;
  const size_t ex_words = long_ctx ? 40 : tiny_ctx ? 0 : 20;
  const int ex_common_rep = long_ctx ? 10 : 3, ex_rare_rep = long_ctx ? 3 : 1;

  const size_t vocab = d.cwe_words.size();
  if (vocab < 20 + ex_words) throw Error("CWE word list is too small");
  std::vector<size_t> perm = rng.sample_indices(vocab, vocab);
  auto word = [&](size_t i) { return d.cwe_words[perm[i]]; };

  std::vector<std::string> ex_list, ex_common;
  for (size_t i = 0; i < ex_words; ++i) {
    const std::string w = word(vocab - 1 - i);
    if (i < 10) ex_common.push_back(w);
    for (int r = 0; r < (i < 10 ? ex_common_rep : ex_rare_rep); ++r) ex_list.push_back(w);
  }
  rng.shuffle(ex_list);
  const std::string example = ex_words == 0 ? std::string()
                                            : std::string(kCweInstruction) + numbered(ex_list) + "\n" + kCweQuestion +
                                                  kCweAnswerPrefix + " " + numbered(ex_common) + "\n\n";

  auto common = std::make_shared<std::vector<std::string>>();
  auto rare = std::make_shared<std::vector<std::string>>();
  for (size_t i = 0; i < 10; ++i) common->push_back(word(i));
  for (size_t i = 10; i < vocab - ex_words; ++i) rare->push_back(word(i));

  TaskPlan plan;
  plan.max_units = (int64_t)rare->size();
  plan.context = [example, common, rare, common_rep, rare_rep, seed](int64_t n) {
    std::vector<std::string> list;
    for (const auto& w : *common)
      for (int r = 0; r < common_rep; ++r) list.push_back(w);
    for (int64_t i = 0; i < n; ++i)
      for (int r = 0; r < rare_rep; ++r) list.push_back((*rare)[(size_t)i]);
    Rng order(hash_combine(seed, 0x637765ull + (uint64_t)n));
    order.shuffle(list);
    return example + kCweInstruction + numbered(list) + "\n";
  };
  plan.question = kCweQuestion;
  plan.answer_prefix = kCweAnswerPrefix;
  plan.answers = *common;
  return plan;
}

// ----------------------------------------------------------------------------------------------
// Frequent words extraction: Zipf(2) counts over random 6-letter "coded" words; rank 1 is "...".

TaskPlan plan_fwe(Rng& rng, uint64_t seed, int64_t length) {
  const size_t vocab_size = (size_t)std::max<int64_t>(16, length / 50);
  std::unordered_set<std::string> taken;
  auto vocab = std::make_shared<std::vector<std::string>>(
      distinct(rng, vocab_size, taken, [](Rng& r) { return random_letters(r, 6, 'a'); }));
  (*vocab)[0] = "...";
  const double zeta2 = std::numbers::pi * std::numbers::pi / 6.0;
  auto count_of = [zeta2](int64_t n, size_t rank0) {
    const double k = (double)(rank0 + 1);
    return (int64_t)std::floor((double)n / (k * k) / zeta2);
  };

  TaskPlan plan;
  // Smallest total for which ranks 2 > 3 > 4 > 5 strictly, so the answer is well defined.
  int64_t n0 = 1;
  while (!(count_of(n0, 1) > count_of(n0, 2) && count_of(n0, 2) > count_of(n0, 3) && count_of(n0, 3) > count_of(n0, 4)))
    ++n0;
  plan.min_units = n0;
  plan.context = [vocab, count_of, seed](int64_t n) {
    std::vector<const std::string*> words;
    for (size_t r = 0; r < vocab->size(); ++r)
      for (int64_t c = count_of(n, r); c > 0; --c) words.push_back(&(*vocab)[r]);
    Rng order(hash_combine(seed, 0x667765ull + (uint64_t)n));
    order.shuffle(words);
    std::string text = kFweInstruction;
    for (size_t i = 0; i < words.size(); ++i) {
      if (i) text += ' ';
      text += *words[i];
    }
    return text + "\n";
  };
  plan.question = kFweQuestion;
  plan.answer_prefix = kFweAnswerPrefix;
  plan.answers = {(*vocab)[1], (*vocab)[2], (*vocab)[3]};
  return plan;
}

// ----------------------------------------------------------------------------------------------
// QA over generated facts (replaces SQuAD / HotpotQA). Organisations and people with attributes,
// written as short documents; Austen paragraphs are the unrelated filler documents.

const char* pick(Rng& rng, std::initializer_list<const char*> options) {
  return options.begin()[rng.below(options.size())];
}

// Pronounceable invented words, so that no fact can be known from pre-training.
std::string invented_stem(Rng& rng, int syllables) {
  static const char* onsets[] = {"b", "br", "c", "d", "f", "g", "h", "k", "l", "m",
                                 "n", "p", "r", "s", "t", "v", "w", "th", "st"};
  static const char* vowels[] = {"a", "e", "i", "o", "u", "a", "e", "o"};
  static const char* codas[] = {"", "", "", "n", "r", "l", "s", "m"};
  std::string s;
  for (int i = 0; i < syllables; ++i) {
    s += onsets[rng.below(std::size(onsets))];
    s += vowels[rng.below(std::size(vowels))];
    s += codas[rng.below(std::size(codas))];
  }
  s[0] = (char)(s[0] - 'a' + 'A');
  return s;
}

std::string lower_ascii(std::string s) {
  for (auto& c : s)
    if (c >= 'A' && c <= 'Z') c = (char)(c + 32);
  return s;
}

// Hands out names that are unique in the sample and never substrings of one another, so a
// reference answer can only be credited by the right entity.
class NameBook {
 public:
  std::string take(Rng& rng, const std::function<std::string(Rng&)>& draw) {
    for (;;) {
      std::string name = draw(rng);
      const std::string low = lower_ascii(name);
      bool clash = false;
      for (const auto& u : used_)
        if (u.find(low) != std::string::npos || low.find(u) != std::string::npos) clash = true;
      if (clash) continue;
      used_.push_back(low);
      return name;
    }
  }

 private:
  std::vector<std::string> used_;
};

struct Person {
  std::string name, town, occupation;
  int64_t year = 0;
};
struct Org {
  std::string name, town, product, colour;
  int64_t year = 0;
  std::string founder;
};

const char* kGivenNames[] = {"Ada", "Albert", "Alice", "Arthur", "Beatrice", "Cecil", "Clara", "Edgar", "Edith",
                             "Edwin", "Eleanor", "Ernest", "Flora", "Frederick", "Harriet", "Ida", "Isaac",
                             "Josephine", "Julian", "Leonard", "Lydia", "Martha", "Matthew", "Miriam", "Oliver",
                             "Philip", "Rosa", "Samuel", "Sophia", "Vera", "Winifred", "Hugo"};
const char* kTownSuffixes[] = {"ford", "wick", "bury", "ham", "stead", "mouth", "field", "moor", "dale", "combe"};
const char* kOrgKinds[] = {"Company", "Society", "Guild", "Trust", "Works", "Foundry", "Press", "Academy"};
const char* kProducts[] = {"lanterns", "violins", "clocks", "barometers", "saddles", "telescopes", "candles",
                           "ropes", "bells", "maps", "compasses", "kites", "teapots", "umbrellas", "chessboards",
                           "bicycles", "hats", "mirrors", "pianos", "globes", "anchors", "spoons", "blankets",
                           "buttons", "ladders", "baskets", "whistles", "quilts", "inkwells", "sundials"};
const char* kColours[] = {"crimson", "ochre", "teal", "violet", "amber", "indigo", "scarlet", "olive",
                          "silver", "maroon", "turquoise", "ivory", "lavender", "copper", "emerald", "saffron"};
const char* kOccupations[] = {"shipwright", "botanist", "cartographer", "glassblower", "watchmaker", "beekeeper",
                              "stonemason", "bookbinder", "astronomer", "weaver", "blacksmith", "apothecary",
                              "surveyor", "locksmith", "potter", "engraver", "harpist", "tailor", "miller",
                              "falconer"};

template <size_t N>
const char* any_of(Rng& rng, const char* (&arr)[N]) {
  return arr[rng.below(N)];
}

class FactWorld {
 public:
  explicit FactWorld(Rng& rng) : rng_(rng) {}

  Person person() {
    Person p;
    const std::string given = any_of(rng_, kGivenNames);
    p.name = given + " " + names_.take(rng_, [](Rng& r) { return invented_stem(r, 2); });
    p.town = town();
    p.occupation = any_of(rng_, kOccupations);
    p.year = rng_.range(1650, 1880);
    return p;
  }

  // founder_birth: the founder's birth year when the founder has a document (keeps dates plausible).
  Org org(const std::string& founder, int64_t founder_birth = 0) {
    Org o;
    o.name = "the " + names_.take(rng_, [](Rng& r) { return invented_stem(r, 2); }) + " " +
             any_of(rng_, kOrgKinds);
    o.town = town();
    o.product = any_of(rng_, kProducts);
    o.colour = any_of(rng_, kColours);
    o.year = founder_birth > 0 ? founder_birth + rng_.range(25, 60) : rng_.range(1700, 1950);
    o.founder = founder;
    return o;
  }

  std::string founder_name() { return person().name; }

  std::string document(const Org& o) {
    const std::string O = capitalised(o.name);
    std::vector<std::string> rest = {
        fmt(pick(rng_, {"It is based in {}.", "Its workshops stand in the town of {}.", "Its home is the town of {}."}),
            o.town),
        fmt(pick(rng_, {"It is best known for making {}.", "Its main trade is the making of {}.",
                        "Most of its income comes from {}."}),
            o.product),
        fmt(pick(rng_, {"Its emblem is {}.", "The colour of its emblem is {}.", "Its banner is painted {}."}),
            o.colour),
        fmt(pick(rng_, {"It was founded by {}.", "Its founder was {}.", "{} started it."}), o.founder),
    };
    rng_.shuffle(rest);
    return fmt(pick(rng_, {"{} was founded in {}.", "{} was established in the year {}.", "{} opened its doors in {}."}),
               O, std::to_string(o.year)) +
           " " + join(rest, " ");
  }

  std::string document(const Person& p) {
    const std::string article = std::string("aeiou").find(p.occupation[0]) != std::string::npos ? "an " : "a ";
    std::vector<std::string> rest = {
        fmt(pick(rng_, {"{} was born in the town of {}.", "The birthplace of {} was {}."}), p.name, p.town),
        fmt(pick(rng_, {"{} worked as {}.", "By trade, {} was {}.", "{} earned a living as {}."}), p.name,
            article + p.occupation),
    };
    rng_.shuffle(rest);
    return fmt(pick(rng_, {"{} was born in {}.", "{} came into the world in {}."}), p.name, std::to_string(p.year)) +
           " " + join(rest, " ");
  }

  static std::string capitalised(std::string s) {
    if (!s.empty() && s[0] >= 'a' && s[0] <= 'z') s[0] = (char)(s[0] - 32);
    return s;
  }

 private:
  std::string town() {
    return names_.take(rng_, [](Rng& r) { return invented_stem(r, 1 + (int)r.below(2)) + any_of(r, kTownSuffixes); });
  }

  // Replaces each "{}" in order.
  static std::string fmt(const char* pattern, const std::string& a, const std::string& b = "") {
    std::string out = pattern;
    size_t p = out.find("{}");
    out.replace(p, 2, a);
    p = out.find("{}");
    if (p != std::string::npos) out.replace(p, 2, b);
    return out;
  }

  Rng& rng_;
  NameBook names_;
};

struct QaItem {
  std::string question, answer;
  std::vector<Insert> docs;  // gold first, depths set
};

QaItem draw_qa1(Rng& rng, int64_t length, FactWorld& world) {
  QaItem item;
  const bool about_org = rng.below(2) == 0;
  const int64_t distractors = std::clamp<int64_t>(length / 512, 3, 15);
  if (about_org) {
    const Org o = world.org(world.founder_name());
    switch (rng.below(4)) {
      case 0: item.question = "In which year was " + o.name + " founded?"; item.answer = std::to_string(o.year); break;
      case 1: item.question = "In which town is " + o.name + " based?"; item.answer = o.town; break;
      case 2: item.question = "What does " + o.name + " make?"; item.answer = o.product; break;
      default: item.question = "What colour is the emblem of " + o.name + "?"; item.answer = o.colour; break;
    }
    item.docs.push_back({0, world.document(o)});
  } else {
    const Person p = world.person();
    switch (rng.below(3)) {
      case 0: item.question = "In which year was " + p.name + " born?"; item.answer = std::to_string(p.year); break;
      case 1: item.question = "In which town was " + p.name + " born?"; item.answer = p.town; break;
      default: item.question = "What was the occupation of " + p.name + "?"; item.answer = p.occupation; break;
    }
    item.docs.push_back({0, world.document(p)});
  }
  for (int64_t i = 0; i < distractors; ++i) {
    if (rng.below(2) == 0)
      item.docs.push_back({0, world.document(world.org(world.founder_name()))});
    else
      item.docs.push_back({0, world.document(world.person())});
  }
  return item;
}

QaItem draw_qa2(Rng& rng, int64_t length, FactWorld& world) {
  QaItem item;
  const int attribute = (int)rng.below(3);
  auto value = [&](const Person& p) {
    return attribute == 0 ? std::to_string(p.year) : attribute == 1 ? p.town : p.occupation;
  };
  const Person founder = world.person();
  const Org org = world.org(founder.name, founder.year);
  item.answer = value(founder);
  switch (attribute) {
    case 0: item.question = "In which year was the founder of " + org.name + " born?"; break;
    case 1: item.question = "In which town was the founder of " + org.name + " born?"; break;
    default: item.question = "What was the occupation of the founder of " + org.name + "?"; break;
  }
  item.docs.push_back({0, world.document(org)});
  item.docs.push_back({0, world.document(founder)});
  // Decoy chains with the same relation; their answers differ from the gold one, so following
  // the wrong chain is never credited.
  const int64_t decoys = std::clamp<int64_t>(length / 1024, 2, 8);
  for (int64_t i = 0; i < decoys; ++i) {
    Person p;
    do p = world.person();
    while (value(p) == item.answer);
    item.docs.push_back({0, world.document(world.org(p.name, p.year))});
    item.docs.push_back({0, world.document(p)});
  }
  return item;
}

TaskPlan plan_qa(bool two_hop, Rng& rng, int64_t length, const std::shared_ptr<const EvalData>& data) {
  FactWorld world(rng);
  QaItem item = two_hop ? draw_qa2(rng, length, world) : draw_qa1(rng, length, world);
  TaskPlan plan;
  // Gold documents at grid depths (two-hop: at least 30 points apart), the rest anywhere.
  const size_t n_gold = two_hop ? 2 : 1;
  std::vector<double> gold;
  do gold = draw_grid_depths(rng, n_gold);
  while (n_gold == 2 && std::fabs(gold[0] - gold[1]) < 30.0);
  for (size_t i = 0; i < item.docs.size(); ++i)
    item.docs[i].depth = i < n_gold ? gold[i] : 100.0 * rng.uniform01();
  plan.depths = gold;
  sort_by_depth(item.docs);

  const EvalData& d = *data;
  const uint64_t start = rng.below(d.document_paragraphs.size());
  const std::vector<Insert> docs = item.docs;
  plan.context = [docs, data, start](int64_t n) {
    const auto& pick_list = data->document_paragraphs;
    auto unit = [&](int64_t i) -> const std::string& {
      return data->paragraphs[pick_list[(start + (uint64_t)i) % pick_list.size()]];
    };
    std::string out = std::string(kQaInstruction) + "\n\nThe following are given documents.\n\n";
    size_t doc = 0;
    for (const std::string* text : weave_order(n, unit, docs)) {
      if (doc > 0) out += "\n\n";
      out += "Document " + std::to_string(++doc) + ":\n" + *text;
    }
    return out + "\n\n";
  };
  plan.question = std::string(kQaInstruction) + "\n\nQuestion: " + item.question + " ";
  plan.answer_prefix = "Answer:";
  plan.answers = {item.answer};
  return plan;
}

// ----------------------------------------------------------------------------------------------
// Length fitting.

struct Fit {
  int64_t units = 0, tokens = 0, calls = 0;
};

// Largest unit count in [min_units, max_units] whose prompt fits `budget`. Token counts are
// close to linear in the unit count, so the search extrapolates from measured points (secant
// steps, slightly overshooting to bracket quickly) and falls back to bisection whenever a step
// fails to halve the bracket: a handful of counter calls typically, O(log n) at worst. Only a
// count measured to fit is returned, so the budget holds even where BPE merges make the count
// slightly non-monotone.
Fit fit_units(const TaskPlan& plan, const TokenCounter& counter, int64_t budget, const std::string& task,
              int64_t length) {
  Fit fit;
  auto count = [&](int64_t n) {
    ++fit.calls;
    return counter(plan.context(n), plan.question);
  };
  const int64_t max_units = plan.max_units;
  int64_t lo = plan.min_units;
  int64_t c_lo = count(lo);
  if (c_lo > budget) {
    throw Error("target length " + std::to_string(length) + " is too small for task " + task + ": its prompt needs " +
                std::to_string(c_lo) + " tokens before any haystack and the budget is " + std::to_string(budget));
  }
  int64_t prev = lo, c_prev = c_lo;  // an earlier fitting point, for the slope
  int64_t hi = max_units + 1, c_hi = 0;  // smallest count known not to fit (max_units + 1: none yet)
  bool bisect = false;
  while (hi - lo > 1 && lo < max_units) {
    int64_t cand;
    if (bisect) {
      cand = lo + (hi - lo) / 2;
    } else if (hi > max_units) {
      // Extrapolate; the first step is a fixed probe that measures the slope.
      const double per_unit = lo == prev ? 0.0 : std::max(0.05, (double)(c_lo - c_prev) / (double)(lo - prev));
      const int64_t step = per_unit == 0.0 ? 16 : (int64_t)std::ceil(1.05 * (double)(budget - c_lo) / per_unit);
      cand = std::min(max_units, lo + std::max<int64_t>(1, step));
    } else {
      const double slope = (double)(hi - lo) / (double)std::max<int64_t>(1, c_hi - c_lo);
      cand = std::clamp<int64_t>(lo + (int64_t)std::floor((double)(budget - c_lo) * slope), lo + 1, hi - 1);
    }
    const int64_t width = hi > max_units ? INT64_MAX : hi - lo;
    const int64_t c = count(cand);
    if (c <= budget) {
      prev = lo;
      c_prev = c_lo;
      lo = cand;
      c_lo = c;
    } else {
      hi = cand;
      c_hi = c;
    }
    bisect = hi <= max_units && width != INT64_MAX && 2 * (hi - lo) > width;
  }
  fit.units = lo;
  fit.tokens = c_lo;
  return fit;
}

TaskPlan make_plan(const std::string& task, Rng& rng, uint64_t seed, int64_t length,
                   const std::shared_ptr<const EvalData>& data) {
  if (task.rfind("niah_", 0) == 0) return plan_niah(task, rng, seed, data);
  if (task == "vt") return plan_vt(rng, length);
  if (task == "cwe") return plan_cwe(rng, seed, length, *data);
  if (task == "fwe") return plan_fwe(rng, seed, length);
  return plan_qa(task == "qa_2", rng, length, data);
}

Sample generate_one(const std::string& task, int64_t index, const SuiteOptions& opt,
                    const std::shared_ptr<const EvalData>& data, int64_t empty_prompt_tokens) {
  const uint64_t seed = hash_combine(hash_combine(hash_combine(opt.seed, fnv1a64(task)), (uint64_t)opt.length),
                                     (uint64_t)index);
  Rng rng(seed);
  TaskPlan plan = make_plan(task, rng, seed, opt.length, data);

  Sample s;
  s.task = task;
  s.max_new_tokens = max_new_tokens_for_task(task);
  s.metric = metric_for_task(task);
  const int64_t prefix_tokens = std::max<int64_t>(0, opt.count_tokens("", plan.answer_prefix) - empty_prompt_tokens);
  const int64_t budget = opt.length - (opt.reserve_generation ? s.max_new_tokens : 0) - prefix_tokens;
  const Fit fit = fit_units(plan, opt.count_tokens, budget, task, opt.length);

  s.context = plan.context(fit.units);
  s.question = std::move(plan.question);
  s.answer_prefix = std::move(plan.answer_prefix);
  s.answers = std::move(plan.answers);
  s.meta.index = index;
  s.meta.target_length = opt.length;
  s.meta.prompt_tokens = fit.tokens + prefix_tokens;
  s.meta.haystack_units = fit.units;
  s.meta.counter_calls = fit.calls + 1;
  s.meta.seed = seed;
  s.meta.depths = std::move(plan.depths);
  s.meta.corpus_hash = data->corpus_hash;
  return s;
}

void check_options(const SuiteOptions& opt) {
  if (!opt.count_tokens) throw Error("suite generation needs a token counter");
  if (opt.length <= 0) throw Error("target length must be positive");
  if (opt.samples_per_task < 0 || opt.first_index < 0) throw Error("sample counts must not be negative");
}

std::string seed_hex(uint64_t seed) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", (unsigned long long)seed);
  return buf;
}

}  // namespace

const std::vector<std::string>& ruler_tasks() {
  static const std::vector<std::string> tasks = {
      "niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2",
      "niah_multikey_3", "niah_multivalue", "niah_multiquery", "vt", "cwe", "fwe", "qa_1", "qa_2"};
  return tasks;
}

bool is_ruler_task(const std::string& name) {
  const auto& t = ruler_tasks();
  return std::find(t.begin(), t.end(), name) != t.end();
}

Sample generate_sample(const std::string& task, int64_t index, const SuiteOptions& opt) {
  check_options(opt);
  if (!is_ruler_task(task)) throw Error("unknown RULER task '" + task + "'");
  const auto data = load_eval_data(opt.data_dir);
  return generate_one(task, index, opt, data, opt.count_tokens("", ""));
}

std::vector<Sample> generate_suite(const SuiteOptions& opt) {
  check_options(opt);
  const std::vector<std::string>& tasks = opt.tasks.empty() ? ruler_tasks() : opt.tasks;
  for (const auto& t : tasks)
    if (!is_ruler_task(t)) throw Error("unknown RULER task '" + t + "'");
  const auto data = load_eval_data(opt.data_dir);
  const int64_t empty_prompt = opt.count_tokens("", "");
  std::vector<Sample> out;
  out.reserve(tasks.size() * (size_t)opt.samples_per_task);
  for (const auto& t : tasks)
    for (int64_t i = 0; i < opt.samples_per_task; ++i)
      out.push_back(generate_one(t, opt.first_index + i, opt, data, empty_prompt));
  return out;
}

std::string sample_to_json(const Sample& s) {
  nlohmann::ordered_json j;
  j["task"] = s.task;
  j["context"] = s.context;
  j["question"] = s.question;
  j["answer_prefix"] = s.answer_prefix;
  j["answers"] = s.answers;
  j["max_new_tokens"] = s.max_new_tokens;
  j["metric"] = metric_name(s.metric);
  nlohmann::ordered_json m;
  m["index"] = s.meta.index;
  m["target_length"] = s.meta.target_length;
  m["prompt_tokens"] = s.meta.prompt_tokens;
  m["haystack_units"] = s.meta.haystack_units;
  m["counter_calls"] = s.meta.counter_calls;
  m["seed"] = seed_hex(s.meta.seed);
  m["depths"] = s.meta.depths;
  m["generator"] = s.meta.generator;
  m["corpus_hash"] = s.meta.corpus_hash;
  j["meta"] = m;
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

Sample sample_from_json(const std::string& line) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {
    throw Error(std::string("malformed sample JSON: ") + e.what());
  }
  try {
    Sample s;
    s.task = j.at("task").get<std::string>();
    s.context = j.at("context").get<std::string>();
    s.question = j.value("question", std::string());
    s.answer_prefix = j.value("answer_prefix", std::string());
    const auto& answers = j.contains("answers") ? j.at("answers") : j.at("answer");
    s.answers = answers.is_string() ? std::vector<std::string>{answers.get<std::string>()}
                                    : answers.get<std::vector<std::string>>();
    if (s.answers.empty()) throw Error("sample of task " + s.task + " has no reference answers");
    s.metric = j.contains("metric") ? metric_from_name(j.at("metric").get<std::string>()) : metric_for_task(s.task);
    s.max_new_tokens = j.contains("max_new_tokens") ? j.at("max_new_tokens").get<int32_t>()
                                                    : max_new_tokens_for_task(s.task);
    if (j.contains("meta")) {
      const auto& m = j.at("meta");
      s.meta.index = m.value("index", int64_t(0));
      s.meta.target_length = m.value("target_length", int64_t(0));
      s.meta.prompt_tokens = m.value("prompt_tokens", int64_t(0));
      s.meta.haystack_units = m.value("haystack_units", int64_t(0));
      s.meta.counter_calls = m.value("counter_calls", int64_t(0));
      s.meta.seed = std::stoull(m.value("seed", std::string("0")), nullptr, 16);
      s.meta.depths = m.value("depths", std::vector<double>());
      s.meta.generator = m.value("generator", std::string());
      s.meta.corpus_hash = m.value("corpus_hash", std::string());
    } else {
      s.meta.generator.clear();
    }
    return s;
  } catch (const nlohmann::json::exception& e) {
    throw Error(std::string("malformed sample: ") + e.what());
  } catch (const std::logic_error&) {  // std::stoull: invalid_argument / out_of_range
    throw Error("malformed sample: meta.seed is not hexadecimal");
  }
}

void write_samples_jsonl(const std::string& path, const std::vector<Sample>& samples) {
  std::ofstream out(path, std::ios::binary);
  if (!out) throw Error("cannot write " + path);
  for (const auto& s : samples) out << sample_to_json(s) << '\n';
  if (!out) throw Error("write failed: " + path);
}

std::vector<Sample> read_samples_jsonl(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot read " + path);
  std::vector<Sample> out;
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      out.push_back(sample_from_json(line));
    } catch (const Error& e) {
      throw Error(path + ":" + std::to_string(line_no) + ": " + e.what());
    }
  }
  return out;
}

namespace {

TokenCounter user_turn_counter(const ChatPrompt& p, const ChatOptions& opt) {
  ChatOptions o = opt;
  o.add_generation_prompt = true;
  const ChatPrompt::UserTurn turn = p.user_turn(o);
  const auto prompt = std::make_shared<const ChatPrompt>(p);
  const Tokenizer* t = &p.tokenizer();
  return [t, prompt, turn](const std::string& context, const std::string& question) {
    return (int64_t)(prompt->encode(turn.prefix + context).size() + t->encode(question + turn.suffix, false).size());
  };
}

}  // namespace

TokenCounter chat_token_counter(const Tokenizer& tok, ChatFormat fmt, const ChatOptions& opt) {
  return user_turn_counter(ChatPrompt(tok, fmt), opt);
}

TokenCounter chat_token_counter(const Tokenizer& tok, const ChatOptions& opt) {
  return user_turn_counter(ChatPrompt(tok), opt);
}

TokenCounter approximate_token_counter() {
  return [](const std::string& context, const std::string& question) {
    return (int64_t)((context.size() + question.size() + 3) / 4);
  };
}

}  // namespace kvzap::eval
