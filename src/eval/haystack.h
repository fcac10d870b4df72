// Text and word sources of the offline RULER-style suite (committed under data/eval/, see
// data/eval/SOURCES.md): two held-out Austen novels as prose haystack, WordNet/SCOWL word lists
// for needle keys and CWE. Loaded once per folder and shared (read-only).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace kvzap::eval {

struct EvalData {
  std::string dir;                               // folder the files were read from
  std::vector<std::string> paragraphs;           // Persuasion then Northanger Abbey, whitespace-normalised
  std::vector<std::string> sentences;            // every paragraph split into sentences, in order
  std::vector<uint32_t> paragraph_first_sentence;  // [paragraphs.size()] index into sentences
  std::vector<uint32_t> document_paragraphs;     // paragraphs of 20..200 words (QA filler documents)
  std::vector<std::string> adjectives;           // sorted, lowercase
  std::vector<std::string> nouns;                // sorted, lowercase
  std::vector<std::string> cwe_words;            // sorted, lowercase, no word is a substring of another
  std::string corpus_hash;                       // 16 hex digits, FNV-1a over all files (names + bytes)
};

// $KVZAP_EVAL_DATA if set, else <source tree>/data/eval.
std::string default_eval_data_dir();

// Reads and caches the data of `dir` ("" = default_eval_data_dir()). Throws kvzap::Error naming
// the missing or malformed file.
std::shared_ptr<const EvalData> load_eval_data(const std::string& dir = "");

// Collapses every run of ASCII whitespace to one space and trims both ends.
std::string normalize_whitespace(std::string_view text);

// Rule-based sentence splitter for English prose: breaks after . ! ? (plus closing quotes or
// brackets) when whitespace and an upper-case letter or opening quote follow; common
// abbreviations (Mr. Mrs. Dr. St. ...) and single-letter initials do not end a sentence.
std::vector<std::string> split_sentences(std::string_view paragraph);

}  // namespace kvzap::eval
