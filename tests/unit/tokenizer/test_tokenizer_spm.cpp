// SentencePiece-style tokenizer (tokenizer.ggml.model = "llama") on a small hand-made vocabulary: the
// merge order by score (ties to the leftmost pair), "▁" for spaces, byte fallback, special and
// user-defined tokens matched in the text, BOS/EOS flags, the space prefix, decoding.
// Gemma-3's real vocabulary is checked against llama.cpp by tests/python/check_gemma3.py.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "format/gguf.h"
#include "kvzap/error.h"
#include "tokenizer/spm.h"
#include "tokenizer/tokenizer.h"
#include "test_support.h"

namespace {

using namespace kvzap;

const std::string kU = "\xE2\x96\x81";  // ▁

TokenizerVocab vocab() {
  TokenizerVocab v;
  v.kind = TokenizerKind::SentencePiece;
  auto add = [&](const std::string& t, int type, float score) {
    v.tokens.push_back(t);
    v.token_types.push_back(type);
    v.scores.push_back(score);
  };
  add("<pad>", 3, 0);             // 0
  add("<eos>", 3, 0);             // 1
  add("<bos>", 3, 0);             // 2
  add("<unk>", 2, 0);             // 3
  add("<start_of_turn>", 3, 0);   // 4
  add("\n", 4, 0);                // 5 user-defined
  for (int b = 0; b < 256; b++) {  // 6 .. 261
    char hex[8];
    std::snprintf(hex, sizeof hex, "<0x%02X>", b);
    add(hex, 6, 0);
  }
  add(kU, 1, -1.0f);          // 262
  add(kU + "t", 1, -3.0f);    // 263
  add("th", 1, -2.5f);        // 264
  add("he", 1, -2.6f);        // 265
  add(kU + "th", 1, -2.0f);   // 266
  add(kU + "the", 1, -1.0f);  // 267
  add("aa", 1, -1.0f);        // 268
  add("a", 1, -5.0f);         // 269
  add("e", 1, -5.0f);         // 270
  add("h", 1, -5.0f);         // 271
  add("t", 1, -5.0f);         // 272
  add("b", 1, -5.0f);         // 273
  add("\xC3\xA9t", 1, -4.0f);  // 274 "ét" (é itself is no token)
  v.bos_id = 2;
  v.eos_id = 1;
  v.unk_id = 3;
  v.pad_id = 0;
  v.add_bos = true;
  return v;
}

using Ids = std::vector<int32_t>;

TEST(TokenizerSpm, MergesByScore) {
  Tokenizer tok(vocab());
  // t h e: "th" (-2.5) beats "he" (-2.6); "the" is no token.
  EXPECT_EQ(tok.encode("the", false), (Ids{264, 270}));
  // ▁ t h e: "th" first, then "▁th" (-2.0), then "▁the" (-1.0).
  EXPECT_EQ(tok.encode(" the", false), (Ids{267}));
  // Equal scores: the leftmost pair merges first.
  EXPECT_EQ(tok.encode("aaa", false), (Ids{268, 269}));
  EXPECT_EQ(tok.encode("aaaa", false), (Ids{268, 268}));
  // Two spaces: two ▁ (no "▁▁" token).
  EXPECT_EQ(tok.encode("  the", false), (Ids{262, 267}));
}

TEST(TokenizerSpm, ByteFallbackForCharactersOutsideTheVocabulary) {
  Tokenizer tok(vocab());
  // "é" alone is no token: its two bytes; "ét" is one.
  EXPECT_EQ(tok.encode("\xC3\xA9", false), (Ids{6 + 0xC3, 6 + 0xA9}));
  EXPECT_EQ(tok.encode("\xC3\xA9t", false), (Ids{274}));
  EXPECT_EQ(tok.encode("x", false), (Ids{6 + 'x'}));
  EXPECT_EQ(tok.decode(tok.encode("x\xC3\xA9 the", false)), "x\xC3\xA9 the");
}

TEST(TokenizerSpm, SpecialAndUserDefinedTokens) {
  Tokenizer tok(vocab());
  EXPECT_EQ(tok.encode("<start_of_turn>the", false, true), (Ids{4, 264, 270}));
  // Control tokens only with parse_special; user-defined ones ("\n") always.
  const Ids plain = tok.encode("<start_of_turn>", false, false);
  EXPECT_EQ(plain.front(), 6 + '<');
  EXPECT_EQ(tok.encode("t\nt", false, false), (Ids{272, 5, 272}));
  EXPECT_EQ(tok.decode({4, 267, 5}), "<start_of_turn> the\n");
  EXPECT_EQ(tok.decode({4, 267}, /*skip_special=*/true), " the");
  EXPECT_TRUE(tok.is_eog(1));
}

TEST(TokenizerSpm, BosEosAndSpacePrefix) {
  TokenizerVocab v = vocab();
  {
    Tokenizer tok(v);
    EXPECT_EQ(tok.encode("the", true), (Ids{2, 264, 270}));
    EXPECT_EQ(tok.encode("", true), (Ids{2}));
    EXPECT_EQ(tok.encode("", false), (Ids{}));
  }
  v.add_space_prefix = true;  // llama.cpp's default for SentencePiece files (Gemma's converter turns it off)
  v.add_eos = true;
  Tokenizer tok(v);
  EXPECT_EQ(tok.encode("the", true), (Ids{2, 267, 1}));
  EXPECT_EQ(tok.encode("the", false), (Ids{267}));
  // after a special token the text gets the prefix again; after user-defined "\n" too (it is special-cased
  // like any partitioned token)
  EXPECT_EQ(tok.encode("<start_of_turn>the", false, true), (Ids{4, 267}));
}

TEST(TokenizerSpm, EscapeRoundTrip) {
  EXPECT_EQ(tok::spm_escape_whitespace(" a b "), kU + "a" + kU + "b" + kU);
  EXPECT_EQ(tok::spm_unescape_whitespace(kU + "a" + kU), " a ");
}

TEST(TokenizerSpm, RejectsBadVocabularies) {
  TokenizerVocab v = vocab();
  v.scores.pop_back();
  EXPECT_THROW(Tokenizer{v}, Error);
  v = vocab();
  v.tokens[6] = "<0xZZ>";
  EXPECT_THROW(Tokenizer{v}, Error);
}

// Gemma-3-270M's real vocabulary (262144 tokens, scores, 6249 control and 165 user-defined tokens)
// against llama.cpp's ids stored by tests/python/check_gemma3.py --make-golden. Skipped without the file.
std::string gemma3_path() {
  if (const char* m = std::getenv("KVZAP_GEMMA3_MODEL"); m && *m) return m;
  return kvzap::test::pulled_model_path("gemma-3-270m-Q4_K_M.gguf");
}

TEST(TokenizerSpm, MatchesLlamaCppGemma3) {
  const std::string path = gemma3_path();
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "SKIPPED: " << path << " not found (kvzap pull gemma-3-270m)";
  const auto tok = Tokenizer::from_gguf(*gguf::File::open(path));
  EXPECT_EQ(tok->vocab().kind, TokenizerKind::SentencePiece);
  EXPECT_TRUE(tok->vocab().add_bos);
  EXPECT_FALSE(tok->vocab().add_space_prefix);
  std::ifstream in(std::string(KVZAP_SOURCE_DIR) + "/tests/golden/gemma3_peer.json");
  ASSERT_TRUE(in) << "tests/golden/gemma3_peer.json is missing";
  const nlohmann::json golden = nlohmann::json::parse(in);
  const nlohmann::json& cases = golden["tokenize"];
  ASSERT_GE(cases.size(), 500u);
  size_t same = 0;
  for (const auto& c : cases) {
    const std::string text = c["text"];
    const bool ok = tok->encode(text, false, true) == c["ids"].get<Ids>() &&
                    tok->encode(text, false, false) == c["ids_no_special"].get<Ids>();
    same += ok;
    if (!ok) ADD_FAILURE() << "ids differ from llama.cpp for " << nlohmann::json(text).dump();
    // SentencePiece decoding gives the text back (every byte has a <0xXX> token), except a literal "▁",
    // which reads back as a space (as in llama.cpp).
    if (text.find(kU) == std::string::npos)
      EXPECT_EQ(tok->decode(tok->encode(text, false, true)), text) << nlohmann::json(text).dump();
  }
  EXPECT_EQ(same, cases.size());
}

}  // namespace
