// GGUF reader: header, metadata, tensor table; then the tokenizer and the model loader (typed weight
// views) on the same file. Every byte of every tensor view and weight view is touched, so a view that
// points outside the mapping is an ASan finding.
#include <cstdint>
#include <string>

#include "chat/chat_template.h"
#include "format/gguf.h"
#include "fuzz_common.h"
#include "kvzap/error.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace {

volatile uint8_t g_sink;

void touch(const uint8_t* p, size_t n) {
  uint8_t acc = 0;
  for (size_t i = 0; i < n; i += 61) acc ^= p[i];
  if (n) acc ^= p[n - 1];
  g_sink = acc;
}

void touch(const kvzap::WeightMatrix& w) {
  if (w.data) touch(w.data, w.row_stride * (size_t)w.n_out);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvzap;
  const std::string path = fuzz::write_file("input.gguf", data, size);
  std::unique_ptr<gguf::File> f;
  try {
    f = gguf::File::open(path);
  } catch (const Error&) {
    return 0;
  }
  for (const auto& [key, v] : f->metadata()) {
    (void)f->value_to_string(v);
    try { (void)f->get_int_array(key); } catch (const Error&) {}
    try { (void)f->get_float_array(key); } catch (const Error&) {}
    try { (void)f->get_string_array(key); } catch (const Error&) {}
    try { (void)f->get_string(key); } catch (const Error&) {}
    try { (void)f->get_float(key); } catch (const Error&) {}
    try { (void)f->get_bool_opt(key, false); } catch (const Error&) {}
  }
  for (const gguf::TensorInfo& t : f->tensors()) {
    touch(t.data, t.n_bytes);
    (void)t.n_elements();
    try { (void)f->tensor(t.name, t.ne); } catch (const Error&) {}
  }
  try {
    const auto tok = Tokenizer::from_gguf(*f);
    const std::vector<int32_t> ids = tok->encode("Hello, world! 123 <|im_start|>user\n  ab", true, true);
    (void)tok->decode(ids);
    (void)tok->decode(ids, true);
    for (int32_t id = 0; id < tok->n_vocab() && id < 512; ++id) (void)tok->token_bytes(id);
    (void)detect_chat_format(tok->vocab());
  } catch (const Error&) {
  }
  try {
    const auto m = Model::load(path);
    const ModelWeights& w = m->weights();
    touch(w.token_embd);
    touch(w.output);
    for (const LayerWeights& L : w.layers) {
      for (const WeightMatrix* x : {&L.wq, &L.wk, &L.wv, &L.wo, &L.gate, &L.up, &L.down}) touch(*x);
      const size_t norm_bytes = sizeof(float) * (size_t)m->config().n_embd;
      touch(reinterpret_cast<const uint8_t*>(L.attn_norm), norm_bytes);
      touch(reinterpret_cast<const uint8_t*>(L.ffn_norm), norm_bytes);
    }
  } catch (const Error&) {
  }
  return 0;
}
