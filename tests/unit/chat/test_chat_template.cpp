// Chat formatter tests. Expected renderings come from jinja2 running the models' real templates
// (tests/python/peer_chat_template.py); the SmolLM2 one is the template stored in the model file.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "chat/chat_template.h"
#include "format/gguf.h"
#include "kvzap/error.h"
#include "test_support.h"
#include "tokenizer/tokenizer.h"

using namespace kvzap;

namespace {

nlohmann::json load_golden(const std::string& name) {
  const std::string path = std::string(KVZAP_SOURCE_DIR) + "/tests/golden/" + name;
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path);
  return nlohmann::json::parse(in);
}

std::string find_model() {
  return kvzap::test::default_model_path();
}

std::vector<ChatMessage> messages_of(const nlohmann::json& j) {
  std::vector<ChatMessage> msgs;
  for (const auto& m : j) msgs.push_back({m["role"], m["content"]});
  return msgs;
}

TokenizerVocab vocab_with_template(const std::string& tmpl, std::vector<std::string> tokens = {"a"}) {
  TokenizerVocab v;
  v.tokens = std::move(tokens);
  v.chat_template = tmpl;
  return v;
}

}  // namespace

TEST(ChatTemplate, MatchesJinjaRenderingsOfTheRealTemplates) {
  const nlohmann::json cases = load_golden("tokenize_chat_templates.json");
  size_t per_format[3] = {0, 0, 0};
  for (const auto& c : cases) {
    const std::string name = c["format"];
    const ChatFormat fmt = chat_format_from_name(name);
    per_format[name == "smollm2" ? 0 : name == "qwen3" ? 1 : 2]++;
    ChatOptions opt;
    opt.add_generation_prompt = c["add_generation_prompt"];
    opt.enable_thinking = c["enable_thinking"];
    opt.date = c["date"];
    const std::string want = c["expected"];
    EXPECT_EQ(apply_chat_template(fmt, messages_of(c["messages"]), opt), want)
        << name << " rendering of " << c["messages"].dump();
  }
  EXPECT_GE(per_format[0], 10u);
  EXPECT_GE(per_format[1], 10u);
  EXPECT_GE(per_format[2], 10u);
}

TEST(ChatTemplate, DetectsTheModelFileTemplate) {
  const std::string path = find_model();
  ASSERT_TRUE(std::filesystem::exists(path))
      << "default model not found at " << path << ": run `kvzap pull` (or set KVZAP_MODEL)";
  const auto tok = Tokenizer::from_gguf(*gguf::File::open(path));
  ASSERT_FALSE(tok->vocab().chat_template.empty());
  EXPECT_EQ(detect_chat_format(tok->vocab()), ChatFormat::ChatML_SmolLM2);
  // The rendered prompt tokenizes to what llama.cpp produced for the same text (golden case).
  const std::string prompt = apply_chat_template(ChatFormat::ChatML_SmolLM2, {{"user", "What is 2+2?"}});
  bool found = false;
  for (const auto& c : load_golden("tokenize_cases.json")) {
    if (c["text"] != prompt) continue;
    found = true;
    EXPECT_EQ(tok->encode(prompt, false, true), c["ids"].get<std::vector<int32_t>>());
  }
  EXPECT_TRUE(found) << "the golden tokenizer cases should include this prompt";
}

TEST(ChatTemplate, DetectionFromTemplateText) {
  EXPECT_EQ(detect_chat_format(vocab_with_template("{{ '<|start_header_id|>' }}")), ChatFormat::Llama31);
  EXPECT_EQ(detect_chat_format(vocab_with_template("<|im_start|>{% if x %}<think>{% endif %}")), ChatFormat::Qwen3);
  EXPECT_EQ(detect_chat_format(vocab_with_template("<|im_start|>system\nYou are SmolLM")), ChatFormat::ChatML_SmolLM2);
  EXPECT_EQ(detect_chat_format(vocab_with_template("{{'<|im_start|>' + role}}")), ChatFormat::ChatML);
  // No template text: fall back on the turn-marker tokens, else fail clearly.
  EXPECT_EQ(detect_chat_format(vocab_with_template("", {"x", "<|im_start|>"})), ChatFormat::ChatML);
  EXPECT_EQ(detect_chat_format(vocab_with_template("", {"<|start_header_id|>"})), ChatFormat::Llama31);
  EXPECT_THROW(detect_chat_format(vocab_with_template("[INST] {{ x }} [/INST]")), Error);
}

TEST(ChatTemplate, FormatNames) {
  EXPECT_EQ(chat_format_from_name("smollm2"), ChatFormat::ChatML_SmolLM2);
  EXPECT_EQ(chat_format_from_name("chatml"), ChatFormat::ChatML);
  EXPECT_EQ(chat_format_from_name("qwen3"), ChatFormat::Qwen3);
  EXPECT_EQ(chat_format_from_name("llama3.1"), ChatFormat::Llama31);
  try {
    chat_format_from_name("vicuna");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'vicuna'"), std::string::npos) << e.what();
  }
}

TEST(ChatTemplate, PlainChatMLHasNoDefaultSystemTurn) {
  // SmolLM2's template with the default-system branch removed is plain ChatML: compare the two.
  const std::vector<ChatMessage> msgs = {{"user", "hi"}};
  const std::string smol = apply_chat_template(ChatFormat::ChatML_SmolLM2, msgs);
  const std::string plain = apply_chat_template(ChatFormat::ChatML, msgs);
  const std::string system_turn = smol.substr(0, smol.find("<|im_start|>user"));
  EXPECT_NE(system_turn, "");
  EXPECT_EQ(system_turn + plain, smol);
  EXPECT_EQ(apply_chat_template(ChatFormat::ChatML, msgs, ChatOptions{false}), "<|im_start|>user\nhi<|im_end|>\n");
}
