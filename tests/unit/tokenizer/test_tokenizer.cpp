// Tokenizer tests. The token ids come from llama.cpp and the pre-tokenizer pieces from the `regex`
// module running the Hugging Face patterns (tests/python/peer_tokenize.py wrote both golden files).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unistd.h>
#include <string>
#include <vector>

#include "format/gguf.h"
#include "kvzap/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/tokenizer.h"
#include "test_support.h"

using namespace kvzap;

namespace {

std::string find_model() {
  return kvzap::test::default_model_path();
}

// The default model's tokenizer, loaded once for all tests; a missing model is a failure, not a skip.
const Tokenizer* smollm2() {
  static std::unique_ptr<Tokenizer> tok = [] {
    const std::string path = find_model();
    if (!std::filesystem::exists(path)) return std::unique_ptr<Tokenizer>();
    return Tokenizer::from_gguf(*gguf::File::open(path));
  }();
  return tok.get();
}

#define REQUIRE_MODEL()                                                                              \
  ASSERT_NE(smollm2(), nullptr) << "default model not found at " << find_model()                     \
                                << ": run `kvzap pull` (or set KVZAP_MODEL)"

// The same vocabulary and merges under another pre-tokenizer.
Tokenizer with_pre(PreTokenizer pre) {
  TokenizerVocab v = smollm2()->vocab();
  v.pre = pre;
  return Tokenizer(std::move(v));
}

nlohmann::json load_golden(const std::string& name) {
  const std::string path = std::string(KVZAP_SOURCE_DIR) + "/tests/golden/" + name;
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path);
  return nlohmann::json::parse(in);
}

std::string show(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c < 0x20 || c == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += (char)c;
    }
  }
  return out;
}

// The text minus the bytes the vocabulary has no token for: SmolLM2's lacks 0x04, 0x06, 0x13, 0x14,
// 0x16 and 0x1D, which llama.cpp (and so kvzap) silently drops.
std::string representable(const Tokenizer& tok, const std::string& text) {
  std::string out;
  for (char c : text)
    if (tok.token_id(std::string(1, c)) >= 0) out += c;
  return out;
}

void expect_golden_ids(const Tokenizer& tok, const std::string& golden, bool round_trip_is_identity) {
  const nlohmann::json cases = load_golden(golden);
  ASSERT_GE(cases.size(), 300u);
  size_t mismatches = 0;
  for (const auto& c : cases) {
    const std::string text = c["text"];
    const std::vector<int32_t> want = c["ids"];
    const std::vector<int32_t> got = tok.encode(text, false, true);
    if (got != want) {
      ++mismatches;
      ADD_FAILURE() << golden << ": ids differ for '" << show(text) << "'";
    }
    if (c.contains("ids_no_special")) {
      const std::vector<int32_t> want_plain = c["ids_no_special"];
      if (tok.encode(text, false, false) != want_plain) {
        ++mismatches;
        ADD_FAILURE() << golden << ": ids without parse_special differ for '" << show(text) << "'";
      }
    }
    // Decoding gives the text back (after NFC for Qwen2, which the reference ids already encode).
    const std::string expected_text = round_trip_is_identity ? representable(tok, text) : tok.decode(want);
    EXPECT_EQ(tok.decode(got), expected_text) << golden << ": round trip of '" << show(text) << "'";
  }
  EXPECT_EQ(mismatches, 0u) << "of " << cases.size() << " cases in " << golden;
}

}  // namespace

TEST(Tokenizer, MatchesLlamaCppSmolLM2) {
  REQUIRE_MODEL();
  EXPECT_EQ(smollm2()->vocab().pre, PreTokenizer::Smollm);
  EXPECT_TRUE(load_golden("tokenize_cases.json")[0].contains("ids_no_special"));
  expect_golden_ids(*smollm2(), "tokenize_cases.json", true);
}

TEST(Tokenizer, MatchesLlamaCppWithLlama3PreTokenizer) {
  REQUIRE_MODEL();
  expect_golden_ids(with_pre(PreTokenizer::Llama3), "tokenize_cases_llama3.json", true);
}

TEST(Tokenizer, MatchesLlamaCppWithQwen2PreTokenizerAfterNfc) {
  REQUIRE_MODEL();
  expect_golden_ids(with_pre(PreTokenizer::Qwen2), "tokenize_cases_qwen2.json", false);
}

TEST(PreTokenizer, MatchesRegexEngineOnAllCases) {
  const nlohmann::json cases = load_golden("tokenize_splits.json");
  ASSERT_GE(cases.size(), 300u);
  const std::pair<const char*, PreTokenizer> kinds[] = {{"smollm", PreTokenizer::Smollm},
                                                         {"llama3", PreTokenizer::Llama3},
                                                         {"qwen2", PreTokenizer::Qwen2},
                                                         {"gpt2", PreTokenizer::Gpt2}};
  for (const auto& c : cases) {
    const std::string text = c["text"];
    for (const auto& [name, pre] : kinds) {
      const std::vector<std::string> want = c[name];
      EXPECT_EQ(tok::pre_tokenize(pre, text), want) << name << " pieces of '" << show(text) << "'";
    }
  }
}

// Hand-derived from the pre-tokenizer regexes of the models' tokenizer.json.
TEST(PreTokenizer, SmolLMIsolatesEveryDigit) {
  using V = std::vector<std::string>;
  EXPECT_EQ(tok::pre_tokenize(PreTokenizer::Smollm, " 12345  x"), (V{" ", "1", "2", "3", "4", "5", " ", " x"}));
  EXPECT_EQ(tok::pre_tokenize(PreTokenizer::Smollm, "abc123"), (V{"abc", "1", "2", "3"}));
  EXPECT_EQ(tok::pre_tokenize(PreTokenizer::Gpt2, "abc 123"), (V{"abc", " 123"}));
}

TEST(PreTokenizer, Gpt2WhitespaceLookahead) {
  using V = std::vector<std::string>;
  EXPECT_EQ(tok::pre_tokenize(PreTokenizer::Gpt2, "hello   world"), (V{"hello", "  ", " world"}));
  EXPECT_EQ(tok::pre_tokenize(PreTokenizer::Gpt2, "a\n\nb"), (V{"a", "\n", "\n", "b"}));
  EXPECT_EQ(tok::pre_tokenize(PreTokenizer::Gpt2, "end  "), (V{"end", "  "}));
  EXPECT_EQ(tok::pre_tokenize(PreTokenizer::Gpt2, "don't STOP'S"), (V{"don", "'t", " STOP", "'", "S"}));
  EXPECT_EQ(tok::pre_tokenize(PreTokenizer::Gpt2, "x ..."), (V{"x", " ..."}));
  EXPECT_EQ(tok::pre_tokenize(PreTokenizer::Gpt2, ""), V{});
}

TEST(PreTokenizer, Llama3AndQwen2) {
  using V = std::vector<std::string>;
  EXPECT_EQ(tok::pre_tokenize(PreTokenizer::Llama3, "1234567"), (V{"123", "456", "7"}));
  EXPECT_EQ(tok::pre_tokenize(PreTokenizer::Qwen2, "1234"), (V{"1", "2", "3", "4"}));
  EXPECT_EQ(tok::pre_tokenize(PreTokenizer::Llama3, "I'M here"), (V{"I", "'M", " here"}));
  EXPECT_EQ(tok::pre_tokenize(PreTokenizer::Llama3, "(word\tx"), (V{"(word", "\tx"}));
  EXPECT_EQ(tok::pre_tokenize(PreTokenizer::Llama3, "a...\n\nb"), (V{"a", "...\n\n", "b"}));
  EXPECT_EQ(tok::pre_tokenize(PreTokenizer::Llama3, "  \n  x"), (V{"  \n", " ", " x"}));
  EXPECT_EQ(tok::pre_tokenize(PreTokenizer::Llama3, "Hello\n\nworld"), (V{"Hello", "\n\n", "world"}));
}

TEST(PreTokenizer, NamesFromGguf) {
  EXPECT_EQ(tok::pre_tokenizer_from_name("smollm"), PreTokenizer::Smollm);
  EXPECT_EQ(tok::pre_tokenizer_from_name("llama-bpe"), PreTokenizer::Llama3);
  EXPECT_EQ(tok::pre_tokenizer_from_name("llama3"), PreTokenizer::Llama3);
  EXPECT_EQ(tok::pre_tokenizer_from_name("qwen2"), PreTokenizer::Qwen2);
  EXPECT_EQ(tok::pre_tokenizer_from_name("gpt-2"), PreTokenizer::Gpt2);
  EXPECT_EQ(tok::pre_tokenizer_from_name("default"), PreTokenizer::Gpt2);
  try {
    tok::pre_tokenizer_from_name("deepseek-llm");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'deepseek-llm'"), std::string::npos) << e.what();
  }
}

TEST(ByteLevel, MapIsABijectionWithGpt2StandIns) {
  EXPECT_EQ(tok::byte_to_codepoint(' '), 0x120u);
  EXPECT_EQ(tok::byte_to_codepoint('\n'), 0x10Au);
  EXPECT_EQ(tok::byte_to_codepoint('\t'), 0x109u);
  EXPECT_EQ(tok::byte_to_codepoint(0xAD), 0x143u);
  EXPECT_EQ(tok::byte_to_codepoint('A'), (uint32_t)'A');
  for (int b = 0; b < 256; ++b) EXPECT_EQ(tok::codepoint_to_byte(tok::byte_to_codepoint((uint8_t)b)), b);
  std::string all;
  for (int b = 0; b < 256; ++b) all += (char)b;
  EXPECT_EQ(tok::byte_level_to_bytes(tok::bytes_to_byte_level(all)), all);
}

TEST(Tokenizer, InvalidUtf8IsAnErrorNamingTheByte) {
  REQUIRE_MODEL();
  const std::pair<std::string, size_t> bad[] = {
      {"\xff", 0},                 // never valid
      {"ab\xc3", 2},               // cut off
      {"ok \xc0\x80", 3},          // overlong NUL
      {"\xed\xa0\x80", 0},         // surrogate
      {"x\xf4\x90\x80\x80", 1},    // above U+10FFFF
      {"caf\xc3\xa9\x80", 5},      // stray continuation byte
  };
  for (const auto& [text, at] : bad) {
    size_t off = 99;
    EXPECT_FALSE(is_valid_utf8(text, &off));
    EXPECT_EQ(off, at);
    try {
      smollm2()->encode(text, false);
      ADD_FAILURE() << "no error for '" << show(text) << "'";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), "invalid UTF-8 at byte " + std::to_string(at));
    }
  }
  EXPECT_TRUE(is_valid_utf8("caf\xc3\xa9 \xf0\x9f\x99\x82"));
}

TEST(Tokenizer, SpecialTokens) {
  REQUIRE_MODEL();
  const Tokenizer& t = *smollm2();
  // Ids from the model file's tokenizer.ggml.tokens.
  EXPECT_EQ(t.token_id("<|endoftext|>"), 0);
  EXPECT_EQ(t.token_id("<|im_start|>"), 1);
  EXPECT_EQ(t.token_id("<|im_end|>"), 2);
  EXPECT_EQ(t.token_id("no such token at all"), -1);
  EXPECT_EQ(t.token_id("\x1d"), -1);  // see representable()
  // Pieces "a", "\x1d", "b"; the middle one has no token and is dropped, as llama.cpp does.
  EXPECT_EQ(t.encode("a\x1d" "b", false), (std::vector<int32_t>{t.token_id("a"), t.token_id("b")}));
  EXPECT_EQ(t.vocab().bos_id, 1);
  EXPECT_EQ(t.vocab().eos_id, 2);
  EXPECT_FALSE(t.vocab().add_bos);
  EXPECT_TRUE(t.is_eog(2));
  EXPECT_TRUE(t.is_eog(0));
  EXPECT_FALSE(t.is_eog(1));
  EXPECT_FALSE(t.is_eog(905));
  const std::vector<int32_t> with_bos = t.encode("Hello world", true);
  ASSERT_FALSE(with_bos.empty());
  EXPECT_EQ(with_bos[0], 1);
  EXPECT_EQ(std::vector<int32_t>(with_bos.begin() + 1, with_bos.end()), t.encode("Hello world", false));
  // Without parse_special the markup is ordinary text: no control ids, and it decodes back.
  const std::string chat = "<|im_start|>user\nhi<|im_end|>";
  const std::vector<int32_t> plain = t.encode(chat, false, false);
  for (int32_t id : plain) EXPECT_GT(id, 16) << "control token in plain-text encoding";
  EXPECT_EQ(t.decode(plain), chat);
  EXPECT_EQ(t.encode(chat, false, true).front(), 1);
  // decode(skip_special) drops control tokens.
  EXPECT_EQ(t.decode(t.encode(chat, false, true), true), "user\nhi");
  EXPECT_EQ(t.token_bytes(2), "<|im_end|>");
  EXPECT_THROW(t.token_bytes(t.n_vocab()), Error);
  EXPECT_THROW(t.token_bytes(-1), Error);
}

TEST(Tokenizer, LongInputIsFast) {
  REQUIRE_MODEL();
  const nlohmann::json cases = load_golden("tokenize_cases.json");
  std::string text;
  while (text.size() < (1u << 20))
    for (const auto& c : cases) text += c["text"].get<std::string>() + "\n";
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<int32_t> ids = smollm2()->encode(text, false);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // (EXPECT_TRUE: on a mismatch, gtest's line diff of two 1 MiB strings would need gigabytes.)
  EXPECT_TRUE(smollm2()->decode(ids) == representable(*smollm2(), text));
  // A ~1 MiB text should take well under a second even on a slow shared CI core.
  EXPECT_LT(s, 2.0) << ids.size() << " tokens in " << s << " s";
}

TEST(Tokenizer, RandomTextRoundTripsAndStreams) {
  REQUIRE_MODEL();
  // Deterministic random code points from many blocks: ASCII, Latin-1, combining marks, Cyrillic,
  // CJK, Hangul, emoji, ZWJ/variation selectors, blanks, digits of other scripts, supplementary planes.
  const std::pair<uint32_t, uint32_t> ranges[] = {
      {0x20, 0x7E}, {0x09, 0x0D}, {0xA0, 0xFF}, {0x300, 0x36F}, {0x400, 0x4FF}, {0x660, 0x669},
      {0x2000, 0x206F}, {0x3000, 0x30FF}, {0x4E00, 0x4FFF}, {0xAC00, 0xACFF}, {0x1F300, 0x1F64F},
      {0xFE00, 0xFE0F}, {0x10000, 0x1007F}, {0xE000, 0xE0FF}};
  uint64_t state = 0x9E3779B97F4A7C15ull;
  auto next = [&](uint32_t n) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)((state >> 33) % n);
  };
  const Tokenizer llama3 = with_pre(PreTokenizer::Llama3), gpt2 = with_pre(PreTokenizer::Gpt2);
  for (int iter = 0; iter < 300; ++iter) {
    std::string text;
    const uint32_t len = 1 + next(40);
    for (uint32_t i = 0; i < len; ++i) {
      const auto [lo, hi] = ranges[next(std::size(ranges))];
      const uint32_t cp = lo + next(hi - lo + 1);
      if (cp < 0x80) {
        text += (char)cp;
      } else if (cp < 0x800) {
        text += (char)(0xC0 | (cp >> 6));
        text += (char)(0x80 | (cp & 0x3F));
      } else if (cp < 0x10000) {
        text += (char)(0xE0 | (cp >> 12));
        text += (char)(0x80 | ((cp >> 6) & 0x3F));
        text += (char)(0x80 | (cp & 0x3F));
      } else {
        text += (char)(0xF0 | (cp >> 18));
        text += (char)(0x80 | ((cp >> 12) & 0x3F));
        text += (char)(0x80 | ((cp >> 6) & 0x3F));
        text += (char)(0x80 | (cp & 0x3F));
      }
    }
    ASSERT_TRUE(is_valid_utf8(text));
    const std::string want = representable(*smollm2(), text);
    for (const Tokenizer* t : {smollm2(), &llama3, &gpt2}) {
      const std::vector<int32_t> ids = t->encode(text, false);
      EXPECT_EQ(t->decode(ids), want) << "'" << show(text) << "'";
      Utf8Stream st;
      std::string streamed;
      for (int32_t id : ids) streamed += st.push(t->token_bytes(id));
      streamed += st.flush();
      EXPECT_EQ(streamed, want);
    }
  }
}

TEST(Utf8Stream, HoldsBackSplitCharacters) {
  Utf8Stream st;
  const std::string euro = "\xe2\x82\xac";          // U+20AC, 3 bytes
  const std::string emoji = "\xf0\x9f\x99\x82";      // U+1F642, 4 bytes
  EXPECT_EQ(st.push("a" + euro.substr(0, 1)), "a");
  EXPECT_EQ(st.push(euro.substr(1, 1)), "");
  EXPECT_EQ(st.push(euro.substr(2) + emoji.substr(0, 2)), euro);
  EXPECT_EQ(st.push(emoji.substr(2, 1)), "");
  EXPECT_EQ(st.push(emoji.substr(3) + "b"), emoji + "b");
  EXPECT_EQ(st.flush(), "");
  // A tail that never completes becomes one U+FFFD at flush.
  EXPECT_EQ(st.push("x" + emoji.substr(0, 3)), "x");
  EXPECT_EQ(st.flush(), "\xef\xbf\xbd");
  // Bytes that can never start a character are replaced at once.
  EXPECT_EQ(st.push("\xff" "c"), "\xef\xbf\xbd" "c");
  // An interrupted sequence is replaced, and what interrupted it survives.
  EXPECT_EQ(st.push(euro.substr(0, 2) + "d"), "\xef\xbf\xbd" "d");
  EXPECT_EQ(st.flush(), "");
}

TEST(Utf8Stream, DecodesTokenByTokenToTheWholeText) {
  REQUIRE_MODEL();
  const std::string text = "h\xc3\xa9llo \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9";
  const std::vector<int32_t> ids = smollm2()->encode(text, false);
  Utf8Stream st;
  std::string out;
  bool saw_partial = false;
  for (int32_t id : ids) {
    const std::string piece = smollm2()->token_bytes(id);
    const std::string chunk = st.push(piece);
    if (chunk != piece) saw_partial = true;
    EXPECT_TRUE(is_valid_utf8(chunk));
    out += chunk;
  }
  out += st.flush();
  EXPECT_EQ(out, text);
  EXPECT_TRUE(saw_partial) << "the text was meant to split characters across tokens";
}

// ---- from_gguf on small hand-written files --------------------------------------------------

namespace {

// Minimal GGUF v3 writer: string, u32 and string-array keys, no tensors.
struct GgufWriter {
  std::string buf;
  uint64_t n_kv = 0;
  void u32(uint32_t v) { buf.append((const char*)&v, 4); }
  void u64(uint64_t v) { buf.append((const char*)&v, 8); }
  void str(const std::string& s) {
    u64(s.size());
    buf += s;
  }
  void kv_string(const std::string& k, const std::string& v) {
    str(k);
    u32(8);
    str(v);
    ++n_kv;
  }
  void kv_strings(const std::string& k, const std::vector<std::string>& v) {
    str(k);
    u32(9);
    u32(8);
    u64(v.size());
    for (const auto& s : v) str(s);
    ++n_kv;
  }
  std::string save(const std::string& name) const {
    std::string out = "GGUF";
    uint32_t version = 3;
    uint64_t n_tensors = 0;
    out.append((const char*)&version, 4);
    out.append((const char*)&n_tensors, 8);
    out.append((const char*)&n_kv, 8);
    out += buf;
    out.append((32 - out.size() % 32) % 32, '\0');
    const std::string path = (std::filesystem::temp_directory_path() / name).string();
    std::ofstream(path, std::ios::binary) << out;
    return path;
  }
};

std::string tiny_vocab_file(const std::string& name, const std::string& model, const std::string& pre) {
  GgufWriter w;
  w.kv_string("general.architecture", "llama");
  w.kv_string("tokenizer.ggml.model", model);
  if (!pre.empty()) w.kv_string("tokenizer.ggml.pre", pre);
  w.kv_strings("tokenizer.ggml.tokens", {"a", "b", "ab", "\xc4\xa0", "\xc4\xa0" "ab"});
  w.kv_strings("tokenizer.ggml.merges", {"a b", "\xc4\xa0 ab"});
  return w.save(name + "-" + std::to_string(::getpid()) + ".gguf");
}

std::string error_of(const std::string& path) {
  try {
    Tokenizer::from_gguf(*gguf::File::open(path));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(TokenizerFromGguf, RejectsOtherModelsAndUnknownPreTokenizers) {
  const std::string bert = tiny_vocab_file("kvzap-tok-bert", "bert", "default");
  EXPECT_NE(error_of(bert).find("'bert'"), std::string::npos) << error_of(bert);
  // SentencePiece ("llama") is supported, but needs its scores (this tiny vocabulary has none).
  const std::string spm = tiny_vocab_file("kvzap-tok-spm", "llama", "default");
  EXPECT_NE(error_of(spm).find("tokenizer.ggml.scores"), std::string::npos) << error_of(spm);
  const std::string odd = tiny_vocab_file("kvzap-tok-odd", "gpt2", "chameleon");
  EXPECT_NE(error_of(odd).find("'chameleon'"), std::string::npos) << error_of(odd);
  std::filesystem::remove(bert);
  std::filesystem::remove(spm);
  std::filesystem::remove(odd);
}

TEST(TokenizerFromGguf, TinyVocabMergesByRank) {
  // No pre key -> "default" -> GPT-2 splitting; no token types -> all normal.
  const std::string path = tiny_vocab_file("kvzap-tok-tiny", "gpt2", "");
  const auto tok = Tokenizer::from_gguf(*gguf::File::open(path));
  std::filesystem::remove(path);
  EXPECT_EQ(tok->vocab().pre, PreTokenizer::Gpt2);
  EXPECT_EQ(tok->encode("ab", false), (std::vector<int32_t>{2}));
  EXPECT_EQ(tok->encode("ab ab", false), (std::vector<int32_t>{2, 4}));
  EXPECT_EQ(tok->encode("ba", false), (std::vector<int32_t>{1, 0}));
  EXPECT_EQ(tok->decode({2, 4}), "ab ab");
  EXPECT_EQ(tok->token_id(" ab"), 4);
}
