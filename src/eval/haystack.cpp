#include "eval/haystack.h"

#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include "common/data_dir.h"
#include "common/rng.h"
#include "kvzap/error.h"

namespace kvzap::eval {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
bool is_upper(char c) { return c >= 'A' && c <= 'Z'; }
bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || is_upper(c); }

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("eval data file not found: " + path + " (set KVZAP_EVAL_DATA to the data/eval folder)");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> nonempty_lines(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string line = normalize_whitespace(std::string_view(text).substr(start, end - start));
    if (!line.empty()) out.push_back(std::move(line));
    start = end + 1;
  }
  return out;
}

std::vector<std::string> word_list(const std::string& path, const std::string& text) {
  std::vector<std::string> words = nonempty_lines(text);
  for (const auto& w : words)
    for (char c : w)
      if (c < 'a' || c > 'z') throw Error("malformed word list " + path + ": '" + w + "' is not a lowercase word");
  if (words.empty()) throw Error("empty word list: " + path);
  return words;
}

// Abbreviations whose trailing period does not end a sentence (case-sensitive, as in Austen).
bool is_abbreviation(std::string_view word) {
  static const std::array<std::string_view, 20> kAbbrev = {
      "Mr", "Mrs", "Ms", "Dr", "St", "Esq", "Capt", "Col", "Gen", "Lieut", "Rev", "Messrs",
      "Sr", "Jr", "viz", "etc", "vs", "No", "Mt", "Adm"};
  for (auto a : kAbbrev)
    if (word == a) return true;
  return word.size() == 1 && is_upper(word[0]);  // an initial such as "W."
}

}  // namespace

std::string normalize_whitespace(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  bool pending_space = false;
  for (char c : text) {
    if (is_space(c)) {
      pending_space = !out.empty();
      continue;
    }
    if (pending_space) out.push_back(' ');
    pending_space = false;
    out.push_back(c);
  }
  return out;
}

std::vector<std::string> split_sentences(std::string_view p) {
  std::vector<std::string> out;
  size_t start = 0;
  const size_t n = p.size();
  for (size_t i = 0; i < n; ++i) {
    const char c = p[i];
    if (c != '.' && c != '!' && c != '?') continue;
    size_t end = i + 1;  // one past the sentence's last character
    while (end < n && (p[end] == '"' || p[end] == '\'' || p[end] == ')' || p[end] == ']')) ++end;
    if (end >= n || !is_space(p[end])) continue;
    size_t next = end;
    while (next < n && is_space(p[next])) ++next;
    if (next >= n) break;
    if (!is_upper(p[next]) && p[next] != '"' && p[next] != '\'' && p[next] != '(') continue;
    if (c == '.') {
      size_t w = i;
      while (w > start && is_alpha(p[w - 1])) --w;
      if (is_abbreviation(p.substr(w, i - w))) continue;
    }
    std::string s = normalize_whitespace(p.substr(start, end - start));
    if (!s.empty()) out.push_back(std::move(s));
    start = next;
    i = next - 1;
  }
  std::string tail = normalize_whitespace(p.substr(start));
  if (!tail.empty()) out.push_back(std::move(tail));
  return out;
}

std::string default_eval_data_dir() {
  if (const char* env = std::getenv("KVZAP_EVAL_DATA"); env && *env) return env;
  return data_dir() + "/eval";
}

std::shared_ptr<const EvalData> load_eval_data(const std::string& dir_in) {
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<const EvalData>> cache;
  const std::string dir = dir_in.empty() ? default_eval_data_dir() : dir_in;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache.find(dir); it != cache.end()) return it->second;

  auto data = std::make_shared<EvalData>();
  data->dir = dir;
  uint64_t hash = 0xcbf29ce484222325ull;
  auto read_hashed = [&](const std::string& rel) {
    std::string text = read_file(dir + "/" + rel);
    hash = fnv1a64(text, fnv1a64(rel, hash));
    return text;
  };

  for (const char* novel : {"haystack/persuasion.txt", "haystack/northanger_abbey.txt"}) {
    for (auto& para : nonempty_lines(read_hashed(novel))) data->paragraphs.push_back(std::move(para));
  }
  if (data->paragraphs.empty()) throw Error("eval haystack text is empty in " + dir);
  for (uint32_t i = 0; i < data->paragraphs.size(); ++i) {
    const std::string& para = data->paragraphs[i];
    data->paragraph_first_sentence.push_back((uint32_t)data->sentences.size());
    for (auto& s : split_sentences(para)) data->sentences.push_back(std::move(s));
    size_t words = 1;
    for (char c : para) words += c == ' ';
    if (words >= 20 && words <= 200) data->document_paragraphs.push_back(i);  // SQuAD-like sizes
  }
  data->adjectives = word_list("words/adjectives.txt", read_hashed("words/adjectives.txt"));
  data->nouns = word_list("words/nouns.txt", read_hashed("words/nouns.txt"));
  data->cwe_words = word_list("words/cwe_words.txt", read_hashed("words/cwe_words.txt"));

  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", (unsigned long long)hash);
  data->corpus_hash = hex;
  cache[dir] = data;
  return data;
}

}  // namespace kvzap::eval
