// Chat-template engine (src/tokenizer/jinja.*): parse an arbitrary template and render it with
// arbitrary messages. Input: the template, the separator line "--8<--", then a JSON value whose
// members become the variables (a JSON array is taken as `messages`); unparsable JSON falls back to
// one user message holding the text. bos_token, eos_token and add_generation_prompt are always set.
// Only kvzap::Error may come out (syntax errors, unsupported constructs, raise_exception()).
#include <cstdint>
#include <string>
#include <string_view>

#include "chat/jinja.h"
#include "fuzz_common.h"
#include "kvzap/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvzap;
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  const std::string source(fuzz::next_part(rest));
  jinja::Object vars;
  vars.set("bos_token", jinja::Value("<|begin_of_text|>"));
  vars.set("eos_token", jinja::Value("<|im_end|>"));
  vars.set("add_generation_prompt", jinja::Value(true));
  const nlohmann::ordered_json j = nlohmann::ordered_json::parse(rest.begin(), rest.end(), nullptr, false);
  if (j.is_object()) {
    for (auto& [k, v] : j.items()) vars.set(k, jinja::from_json(v));
  } else if (j.is_array()) {
    vars.set("messages", jinja::from_json(j));
  } else {
    nlohmann::ordered_json msgs = nlohmann::ordered_json::array();
    msgs.push_back({{"role", "user"}, {"content", std::string(rest)}});
    vars.set("messages", jinja::from_json(msgs));
  }
  try {
    const jinja::Template t(source);
    (void)t.render(vars);
  } catch (const Error&) {
  }
  return 0;
}
