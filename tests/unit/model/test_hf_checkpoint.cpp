// Hugging Face checkpoint folders (config.json + safetensors + tokenizer.json) written by the test:
// a valid tiny Llama loads (F32 and BF16 views in place, RoPE half-split, tokenizer padded to
// vocab_size), and every validation error is one line naming the file and the problem.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "format/hf_checkpoint.h"
#include "format/safetensors.h"
#include "kvzap/error.h"
#include "model/model.h"
#include "test_support.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer_json.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr int kLayers = 1, kEmbd = 32, kHeads = 2, kKvHeads = 1, kFf = 64, kVocab = 260;

void write_text(const fs::path& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary);
  out << s;
}

json tiny_config() {
  return json{{"architectures", {"LlamaForCausalLM"}}, {"hidden_size", kEmbd},     {"num_hidden_layers", kLayers},
              {"num_attention_heads", kHeads},        {"num_key_value_heads", kKvHeads}, {"intermediate_size", kFf},
              {"vocab_size", kVocab},                 {"rms_norm_eps", 1e-5},      {"rope_theta", 10000.0},
              {"tie_word_embeddings", true},          {"hidden_act", "silu"}};
}

std::vector<kvzap::TensorToWrite> tiny_tensors(const std::string& dtype = "F32") {
  const int64_t D = kEmbd / kHeads;
  std::vector<kvzap::TensorToWrite> t;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, float fill) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> v((size_t)n);
    for (int64_t i = 0; i < n; i++) v[(size_t)i] = fill + 0.001f * (float)(i % 17);
    t.push_back({name, shape.size() == 2 ? dtype : "F32", shape, v});
  };
  add("model.embed_tokens.weight", {kVocab, kEmbd}, 0.01f);
  add("model.norm.weight", {kEmbd}, 1.0f);
  const std::string p = "model.layers.0.";
  add(p + "input_layernorm.weight", {kEmbd}, 1.0f);
  add(p + "post_attention_layernorm.weight", {kEmbd}, 1.0f);
  add(p + "self_attn.q_proj.weight", {kHeads * D, kEmbd}, 0.02f);
  add(p + "self_attn.k_proj.weight", {kKvHeads * D, kEmbd}, 0.02f);
  add(p + "self_attn.v_proj.weight", {kKvHeads * D, kEmbd}, 0.02f);
  add(p + "self_attn.o_proj.weight", {kEmbd, kHeads * D}, 0.02f);
  add(p + "mlp.gate_proj.weight", {kFf, kEmbd}, 0.02f);
  add(p + "mlp.up_proj.weight", {kFf, kEmbd}, 0.02f);
  add(p + "mlp.down_proj.weight", {kEmbd, kFf}, 0.02f);
  return t;
}

// Byte-level BPE over the 256 byte symbols plus one merge ("h" "i") and an end-of-text special token.
json tiny_tokenizer_json() {
  json vocab = json::object();
  for (int b = 0; b < 256; b++) {
    std::string s;
    kvzap::tok::append_byte_level(s, (uint8_t)b);
    vocab[s] = vocab.size();
  }
  vocab["hi"] = 256;
  vocab["<|endoftext|>"] = 257;
  return json{{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"h i"}}, {"ignore_merges", false}}},
              {"added_tokens", {{{"id", 257}, {"content", "<|endoftext|>"}, {"special", true}}}},
              {"normalizer", nullptr},
              {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
              {"post_processor", {{"type", "ByteLevel"}}}};
}

class HfCheckpoint : public ::testing::Test {
 protected:
  fs::path dir;
  void SetUp() override {
    dir = fs::temp_directory_path() / ("kvzap_hf_" + std::to_string(::getpid()) + "_" +
                                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir);
    fs::create_directories(dir);
    write_text(dir / "config.json", tiny_config().dump());
    kvzap::write_safetensors((dir / "model.safetensors").string(), tiny_tensors());
    write_text(dir / "tokenizer.json", tiny_tokenizer_json().dump());
    write_text(dir / "tokenizer_config.json",
               json{{"eos_token", "<|endoftext|>"}, {"chat_template", "{{ messages[0]['content'] }}"}}.dump());
  }
  void TearDown() override { fs::remove_all(dir); }

  // The message of the error Model::load throws.
  std::string load_error() {
    try {
      kvzap::Model::load(dir.string());
    } catch (const kvzap::Error& e) {
      return e.what();
    }
    return "(no error)";
  }
  void edit_config(const std::function<void(json&)>& f) {
    json c = tiny_config();
    f(c);
    write_text(dir / "config.json", c.dump());
  }
};

TEST_F(HfCheckpoint, LoadsTinyLlama) {
  ASSERT_TRUE(kvzap::hf::is_checkpoint_dir(dir.string()));
  const auto m = kvzap::Model::load(dir.string());
  const kvzap::ModelConfig& c = m->config();
  EXPECT_EQ(c.arch, "llama");
  EXPECT_EQ(c.n_embd, kEmbd);
  EXPECT_EQ(c.n_head_kv, kKvHeads);
  EXPECT_EQ(c.head_dim, kEmbd / kHeads);
  EXPECT_EQ(c.n_vocab, kVocab);
  EXPECT_EQ(c.rope_mode, kvzap::RopeMode::HalfSplit);  // HF layout: no permuted copy
  EXPECT_TRUE(m->is_hf());
  // F32 matrices are views into the mapping; the tied LM head is the embedding.
  EXPECT_EQ(m->weights().layers[0].wq.type, kvzap::GgmlType::F32);
  EXPECT_TRUE(m->weights().owned_bytes.empty());
  EXPECT_EQ(m->weights().output.data, m->weights().token_embd.data);
  // Tokenizer: padded to vocab_size, merges and the special token apply, chat template read.
  const kvzap::Tokenizer& tok = m->tokenizer();
  EXPECT_EQ(tok.n_vocab(), kVocab);
  EXPECT_EQ(tok.encode("hi<|endoftext|>", false), (std::vector<int32_t>{256, 257}));
  EXPECT_EQ(tok.vocab().eos_id, 257);
  EXPECT_TRUE(tok.is_eog(257));
  EXPECT_EQ(tok.vocab().chat_template, "{{ messages[0]['content'] }}");
}

// `kvzap inspect DIR`: config.json as stored, the tokenizer kvzap reads, every tensor with its shard; a
// broken tokenizer is reported in the output (inspecting is how one finds out why a folder fails).
TEST_F(HfCheckpoint, InspectShowsConfigTokenizerAndTensors) {
  const auto r = kvzap::test::run_kvzap("inspect '" + dir.string() + "' --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["format"], "huggingface");
  EXPECT_EQ(j["config"], tiny_config());
  EXPECT_EQ(j["tokenizer"]["n_vocab"], 258);
  EXPECT_EQ(j["tokenizer"]["kind"], "byte-level BPE");
  EXPECT_EQ(j["tokenizer"]["chat_template"], "{{ messages[0]['content'] }}");
  const auto tensors = tiny_tensors();
  ASSERT_EQ(j["tensors"].size(), tensors.size());
  size_t bytes = 0;
  for (const auto& t : tensors) bytes += t.values.size() * 4;
  EXPECT_EQ(j["totals"]["n_bytes"].get<size_t>(), bytes);
  EXPECT_EQ(j["tensors"][0]["shard"], "model.safetensors");
  EXPECT_EQ(j["tensors"][0]["name"], "model.embed_tokens.weight");  // sorted by name
  EXPECT_EQ(j["tensors"][0]["shape"], json({kVocab, kEmbd}));

  const auto text = kvzap::test::run_kvzap("inspect '" + dir.string() + "'");
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("Hugging Face checkpoint"), std::string::npos);
  EXPECT_NE(text.out.find("model.layers.0.mlp.down_proj.weight"), std::string::npos);

  write_text(dir / "tokenizer.json", "{");
  const auto broken = kvzap::test::run_kvzap("inspect '" + dir.string() + "' --json");
  ASSERT_EQ(broken.exit_code, 0) << broken.err;
  const std::string err = json::parse(broken.out)["tokenizer"]["error"];
  EXPECT_NE(err.find("tokenizer.json"), std::string::npos) << err;
}

TEST_F(HfCheckpoint, Bf16AndQuantisedMatrices) {
  kvzap::write_safetensors((dir / "model.safetensors").string(), tiny_tensors("BF16"));
  {
    const auto m = kvzap::Model::load(dir.string());
    EXPECT_EQ(m->weights().layers[0].wq.type, kvzap::GgmlType::BF16);
  }
  kvzap::LoadOptions o;
  o.quantize = kvzap::GgmlType::Q8_0;
  const auto q = kvzap::Model::load(dir.string(), o);
  EXPECT_EQ(q->weights().layers[0].wq.type, kvzap::GgmlType::Q8_0);
  o.quantize = kvzap::GgmlType::Q4_K;  // rows of 32 cannot hold Q4_K's 256: Q8_0 instead
  EXPECT_EQ(kvzap::Model::load(dir.string(), o)->weights().layers[0].wq.type, kvzap::GgmlType::Q8_0);
}

TEST_F(HfCheckpoint, MissingShard) {
  fs::remove(dir / "model.safetensors");
  auto t = tiny_tensors();
  std::vector<kvzap::TensorToWrite> a(t.begin(), t.begin() + 5), b(t.begin() + 5, t.end());
  kvzap::write_safetensors((dir / "model-00001-of-00002.safetensors").string(), a);
  json map = json::object();
  for (const auto& x : a) map[x.name] = "model-00001-of-00002.safetensors";
  for (const auto& x : b) map[x.name] = "model-00002-of-00002.safetensors";
  write_text(dir / "model.safetensors.index.json", json{{"metadata", json::object()}, {"weight_map", map}}.dump());
  const std::string e = load_error();
  EXPECT_NE(e.find("model-00002-of-00002.safetensors: no such file"), std::string::npos) << e;
  // With the shard present the sharded folder loads.
  kvzap::write_safetensors((dir / "model-00002-of-00002.safetensors").string(), b);
  EXPECT_NO_THROW(kvzap::Model::load(dir.string()));
}

TEST_F(HfCheckpoint, WrongShape) {
  auto t = tiny_tensors();
  for (auto& x : t)
    if (x.name == "model.layers.0.self_attn.k_proj.weight") {
      x.shape = {kEmbd, kEmbd};
      x.values.resize((size_t)kEmbd * kEmbd);
    }
  kvzap::write_safetensors((dir / "model.safetensors").string(), t);
  const std::string e = load_error();
  EXPECT_NE(e.find("model.safetensors: tensor 'model.layers.0.self_attn.k_proj.weight' has shape [32, 32], expected [16, 32]"),
            std::string::npos)
      << e;
}

// Gemma3ForConditionalGeneration: the text model's fields come from text_config (errors name them so), its
// tensors from under language_model.model., and the vision tower is left unread; any other leftover
// tensor is still refused.
TEST_F(HfCheckpoint, Gemma3ImageTextModelLoadsItsTextModel) {
  const int64_t D = kEmbd / kHeads;
  json text = tiny_config();
  text.erase("architectures");
  text["head_dim"] = D;
  text["hidden_activation"] = "gelu_pytorch_tanh";
  text["layer_types"] = {"full_attention"};
  text["query_pre_attn_scalar"] = D;
  json top = {{"architectures", {"Gemma3ForConditionalGeneration"}}, {"model_type", "gemma3"}, {"text_config", text},
              {"vision_config", {{"hidden_size", 8}}}, {"tie_word_embeddings", true}};
  write_text(dir / "config.json", top.dump());
  std::vector<kvzap::TensorToWrite> t;
  for (kvzap::TensorToWrite x : tiny_tensors()) {
    x.name = "language_model." + x.name;
    if (x.name.find("post_attention_layernorm") != std::string::npos) {  // Gemma: four norms per layer
      for (const char* n : {"pre_feedforward_layernorm", "post_feedforward_layernorm"}) {
        kvzap::TensorToWrite y = x;
        y.name = "language_model.model.layers.0." + std::string(n) + ".weight";
        t.push_back(y);
      }
    }
    t.push_back(x);
  }
  for (const char* n : {"q_norm", "k_norm"})
    t.push_back({"language_model.model.layers.0.self_attn." + std::string(n) + ".weight", "F32", {D}, std::vector<float>((size_t)D, 0.0f)});
  t.push_back({"vision_tower.vision_model.embeddings.patch_embedding.weight", "F32", {8, 3}, std::vector<float>(24, 0.5f)});
  t.push_back({"multi_modal_projector.mm_input_projection_weight", "F32", {8, kEmbd}, std::vector<float>(8 * kEmbd, 0.5f)});
  kvzap::write_safetensors((dir / "model.safetensors").string(), t);
  const auto m = kvzap::Model::load(dir.string());
  EXPECT_EQ(m->config().arch, "gemma3");
  EXPECT_EQ(m->config().n_embd, kEmbd);
  EXPECT_EQ(m->config().head_dim, D);
  EXPECT_EQ(m->weights().output.data, m->weights().token_embd.data);  // tied
  ASSERT_NE(m->weights().layers[0].ffn_post_norm, nullptr);
  EXPECT_FLOAT_EQ(m->weights().layers[0].q_norm[0], 1.0f);  // (1 + w) with w = 0
  EXPECT_TRUE(m->config().ffn_act == kvzap::FfnActivation::GeluTanh);  // f32 GELU, as transformers

  t.push_back({"language_model.model.layers.0.self_attn.o_proj.bias", "F32", {kEmbd}, std::vector<float>(kEmbd, 0.0f)});
  kvzap::write_safetensors((dir / "model.safetensors").string(), t);
  std::string e = load_error();
  EXPECT_NE(e.find("unexpected tensor 'language_model.model.layers.0.self_attn.o_proj.bias'"), std::string::npos) << e;

  top["text_config"].erase("hidden_size");
  write_text(dir / "config.json", top.dump());
  e = load_error();
  EXPECT_NE(e.find("config.json: missing field 'text_config.hidden_size'"), std::string::npos) << e;
  top.erase("text_config");
  write_text(dir / "config.json", top.dump());
  e = load_error();
  EXPECT_NE(e.find("config.json: missing object 'text_config'"), std::string::npos) << e;
}

TEST_F(HfCheckpoint, UnknownArchitecture) {
  edit_config([](json& c) { c["architectures"] = {"MambaForCausalLM"}; });
  const std::string e = load_error();
  EXPECT_NE(e.find("config.json: unsupported architecture 'MambaForCausalLM'"), std::string::npos) << e;
}

TEST_F(HfCheckpoint, MissingConfigField) {
  for (const char* key : {"hidden_size", "num_attention_heads", "rms_norm_eps", "vocab_size", "architectures"}) {
    edit_config([&](json& c) { c.erase(key); });
    const std::string e = load_error();
    EXPECT_NE(e.find("config.json: missing field '" + std::string(key) + "'"), std::string::npos) << e;
    EXPECT_EQ(e.find('\n'), std::string::npos);
  }
  edit_config([](json& c) { c["hidden_size"] = "big"; });
  EXPECT_NE(load_error().find("config.json: field 'hidden_size' must be an integer"), std::string::npos);
}

TEST_F(HfCheckpoint, RefusesWhatItCannotRun) {
  edit_config([](json& c) { c["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}}; });
  EXPECT_NE(load_error().find("RoPE scaling type 'yarn' is not supported"), std::string::npos);
  edit_config([](json& c) { c["attention_bias"] = true; });
  EXPECT_NE(load_error().find("'attention_bias': true is not supported"), std::string::npos);
  edit_config([](json&) {});
  auto t = tiny_tensors();
  t.push_back({"model.layers.0.self_attn.o_proj.bias", "F32", {kEmbd}, std::vector<float>(kEmbd)});
  kvzap::write_safetensors((dir / "model.safetensors").string(), t);
  EXPECT_NE(load_error().find("unexpected tensor 'model.layers.0.self_attn.o_proj.bias'"), std::string::npos);
}

TEST_F(HfCheckpoint, Llama3RopeScalingFactors) {
  edit_config([](json& c) {
    c["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                         {"original_max_position_embeddings", 64}};
  });
  const auto m = kvzap::Model::load(dir.string());
  const std::vector<float>& f = m->config().rope_freq_factors;
  ASSERT_EQ(f.size(), (size_t)(kEmbd / kHeads / 2));
  EXPECT_FLOAT_EQ(f.front(), 1.0f);  // the highest frequency is kept
  EXPECT_FLOAT_EQ(f.back(), 8.0f);   // the lowest is divided by the factor
}

TEST_F(HfCheckpoint, TokenizerJsonErrorsNameTheFile) {
  json tj = tiny_tokenizer_json();
  tj["pre_tokenizer"] = {{"type", "Whitespace"}};
  write_text(dir / "tokenizer.json", tj.dump());
  std::string e = load_error();
  EXPECT_NE(e.find("tokenizer.json: pre-tokenizer 'Whitespace' is not supported"), std::string::npos) << e;
  tj = tiny_tokenizer_json();
  tj["model"]["type"] = "Unigram";
  write_text(dir / "tokenizer.json", tj.dump());
  e = load_error();
  EXPECT_NE(e.find("tokenizer.json: tokenizer model 'Unigram' is not supported"), std::string::npos) << e;
  fs::remove(dir / "tokenizer.json");
  e = load_error();
  EXPECT_NE(e.find("tokenizer.json: no such file"), std::string::npos) << e;
}

// SentencePiece-style BPE (byte fallback, merges by rank): a character outside the vocabulary becomes its
// <0xXX> tokens, and merges follow rank, not the vocabulary's order.
TEST_F(HfCheckpoint, ByteFallbackBpeByRank) {
  json vocab = {{"<unk>", 0}, {"<bos>", 1}, {"\xE2\x96\x81", 2}, {"a", 3}, {"b", 4}, {"ab", 5}, {"\xE2\x96\x81" "a", 6},
                {"\xE2\x96\x81" "ab", 7}};
  for (int b = 0; b < 256; b++) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "<0x%02X>", b);
    vocab[hex] = 8 + b;
  }
  json tj{{"model", {{"type", "BPE"}, {"vocab", vocab}, {"byte_fallback", true}, {"unk_token", "<unk>"},
                     {"merges", {"\xE2\x96\x81 a", "a b", "\xE2\x96\x81" "a b"}}}},
          {"added_tokens", {{{"id", 0}, {"content", "<unk>"}, {"special", true}}, {{"id", 1}, {"content", "<bos>"}, {"special", true}}}},
          {"normalizer", {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\xE2\x96\x81"}}},
          {"pre_tokenizer", nullptr},
          {"post_processor", {{"type", "TemplateProcessing"},
                              {"single", {{{"SpecialToken", {{"id", "<bos>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}}}}};
  write_text(dir / "tokenizer.json", tj.dump());
  write_text(dir / "tokenizer_config.json", json{{"bos_token", {{"content", "<bos>"}}}, {"unk_token", "<unk>"}}.dump());
  const auto tok = kvzap::tokenizer_from_hf_dir(dir.string());
  EXPECT_EQ(tok->vocab().unk_id, 0);
  EXPECT_TRUE(tok->vocab().add_bos);
  EXPECT_EQ(tok->vocab().bos_id, 1);
  // " ab": "▁ a" (rank 0) first, then "▁a b" -> "▁ab"; "ab" alone -> "ab"; "é" -> <0xC3> <0xA9>.
  EXPECT_EQ(tok->encode(" ab", true), (std::vector<int32_t>{1, 7}));
  EXPECT_EQ(tok->encode("ab\xC3\xA9", false), (std::vector<int32_t>{5, 8 + 0xC3, 8 + 0xA9}));
  EXPECT_EQ(tok->decode({7, 8 + 0xC3, 8 + 0xA9}), " ab\xC3\xA9");
}

}  // namespace
