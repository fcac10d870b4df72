#include "eval/metrics.h"

#include <utf8proc.h>

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "kvzap/error.h"

namespace kvzap::eval {
namespace {

// Python's str.isspace() set, which is what str.strip() removes in the reference scorers.
bool is_python_space(int32_t cp) {
  if ((cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20)) return true;
  switch (cp) {
    case 0x85: case 0xa0: case 0x1680: case 0x2028: case 0x2029: case 0x202f: case 0x205f: case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200a;
  }
}

// Decodes the code point starting at s[i]; returns its byte length (1 for an invalid byte, cp = -1).
size_t decode_at(std::string_view s, size_t i, int32_t* cp) {
  utf8proc_int32_t c = -1;
  const auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + i),
                                  (utf8proc_ssize_t)(s.size() - i), &c);
  if (n <= 0) {
    *cp = -1;
    return 1;
  }
  *cp = c;
  return (size_t)n;
}

std::string_view python_strip(std::string_view s) {
  size_t begin = 0;
  while (begin < s.size()) {
    int32_t cp;
    const size_t n = decode_at(s, begin, &cp);
    if (!is_python_space(cp)) break;
    begin += n;
  }
  size_t end = s.size();
  while (end > begin) {
    // Step back to the start of the last code point (continuation bytes are 10xxxxxx).
    size_t start = end - 1;
    while (start > begin && ((unsigned char)s[start] & 0xC0) == 0x80 && end - start < 4) --start;
    int32_t cp;
    const size_t n = decode_at(s, start, &cp);
    if (start + n != end || !is_python_space(cp)) break;
    end = start;
  }
  return s.substr(begin, end - begin);
}

double fraction_contained(std::string_view prediction, const std::vector<std::string>& references,
                          ControlChars cc, bool any) {
  if (references.empty()) throw Error("cannot score a sample without reference answers");
  const std::string pred = to_lower(clean_prediction(prediction, cc));
  size_t hits = 0;
  for (const auto& ref : references) hits += pred.find(to_lower(ref)) != std::string::npos;
  if (any) return hits > 0 ? 100.0 : 0.0;
  return 100.0 * (double)hits / (double)references.size();
}

}  // namespace

const char* metric_name(Metric m) {
  return m == Metric::StringMatchPart ? "string_match_part" : "string_match_all";
}

Metric metric_from_name(const std::string& name) {
  if (name == "string_match_all") return Metric::StringMatchAll;
  if (name == "string_match_part") return Metric::StringMatchPart;
  throw Error("unknown metric '" + name + "' (expected string_match_all or string_match_part)");
}

Metric metric_for_task(const std::string& task) {
  max_new_tokens_for_task(task);  // validates the name
  return task.rfind("qa_", 0) == 0 ? Metric::StringMatchPart : Metric::StringMatchAll;
}

int32_t max_new_tokens_for_task(const std::string& task) {
  if (task.rfind("niah_", 0) == 0) {
    static const char* kNiah[] = {"niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1",
                                  "niah_multikey_2", "niah_multikey_3", "niah_multivalue", "niah_multiquery"};
    for (const char* t : kNiah)
      if (task == t) return 128;
  }
  if (task == "vt") return 30;
  if (task == "cwe") return 120;
  if (task == "fwe") return 50;
  if (task == "qa_1" || task == "qa_2") return 32;
  throw Error("unknown RULER task '" + task + "'");
}

std::string clean_prediction(std::string_view prediction, ControlChars cc) {
  std::string out;
  const std::string_view s = python_strip(prediction);
  out.reserve(s.size());
  for (char c : s) {
    if ((unsigned char)c < 0x20) {
      if (cc == ControlChars::ReplaceWithNewline) out.push_back('\n');
      continue;
    }
    out.push_back(c);
  }
  return std::string(python_strip(out));
}

std::string to_lower(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = (unsigned char)text[i];
    if (c < 0x80) {
      out.push_back(c >= 'A' && c <= 'Z' ? (char)(c + 32) : (char)c);
      ++i;
      continue;
    }
    int32_t cp;
    const size_t n = decode_at(text, i, &cp);
    if (cp < 0) {
      out.push_back((char)c);  // invalid byte: keep
    } else {
      utf8proc_uint8_t buf[4];
      const auto len = utf8proc_encode_char(utf8proc_tolower(cp), buf);
      out.append(reinterpret_cast<const char*>(buf), (size_t)len);
    }
    i += n;
  }
  return out;
}

double string_match_all(std::string_view prediction, const std::vector<std::string>& references, ControlChars cc) {
  return fraction_contained(prediction, references, cc, /*any=*/false);
}

double string_match_part(std::string_view prediction, const std::vector<std::string>& references, ControlChars cc) {
  return fraction_contained(prediction, references, cc, /*any=*/true);
}

double score_sample(Metric m, std::string_view prediction, const std::vector<std::string>& references,
                    ControlChars cc) {
  return m == Metric::StringMatchPart ? string_match_part(prediction, references, cc)
                                      : string_match_all(prediction, references, cc);
}

std::vector<TaskScore> aggregate_by_task(const std::vector<SampleResult>& results) {
  struct Acc {
    int64_t n = 0;
    double sum = 0, sum_sq = 0, evicted = 0;
  };
  std::vector<std::string> order;
  std::unordered_map<std::string, Acc> acc;
  for (const auto& r : results) {
    auto [it, inserted] = acc.try_emplace(r.task);
    if (inserted) order.push_back(r.task);
    Acc& a = it->second;
    ++a.n;
    a.sum += r.score;
    a.sum_sq += r.score * r.score;
    a.evicted += r.evicted_fraction;
  }
  std::vector<TaskScore> out;
  for (const auto& task : order) {
    const Acc& a = acc[task];
    TaskScore t;
    t.task = task;
    t.n = a.n;
    t.score = a.sum / (double)a.n;
    t.evicted_fraction = a.evicted / (double)a.n;
    if (a.n > 1) {
      const double var = std::max(0.0, (a.sum_sq - a.sum * a.sum / (double)a.n) / (double)(a.n - 1));
      t.stderr_score = std::sqrt(var / (double)a.n);
    }
    out.push_back(std::move(t));
  }
  return out;
}

double suite_average(const std::vector<TaskScore>& tasks) {
  if (tasks.empty()) return 0.0;
  double sum = 0;
  for (const auto& t : tasks) sum += t.score;
  return sum / (double)tasks.size();
}

}  // namespace kvzap::eval
