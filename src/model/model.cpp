#include "model/model.h"

#include <cmath>

#include "common/fp16.h"
#include "model/arch.h"

namespace kvzap {

std::vector<ArchSpec>& arch_registry() {
  static std::vector<ArchSpec> r;
  return r;
}

const ArchSpec* find_arch(const std::string& name) {
  for (const ArchSpec& a : arch_registry())
    if (a.name == name) return &a;
  return nullptr;
}

std::pair<const ArchSpec*, const HfClass*> find_hf_class(const std::string& hf_name) {
  for (const ArchSpec& a : arch_registry())
    for (const HfClass& c : a.hf_classes)
      if (c.name == hf_name) return {&a, &c};
  return {nullptr, nullptr};
}

namespace {

// Per-layer hyper-parameters may be arrays; we only support uniform layers.
int uniform_int(const gguf::File& f, const std::string& key, int n_layer, std::optional<int> dflt) {
  if (!f.has(key)) {
    if (dflt) return *dflt;
    throw Error(f.path() + ": missing metadata key '" + key + "'");
  }
  std::vector<int64_t> v = f.get_int_array(key);
  if (v.empty()) throw Error(f.path() + ": metadata key '" + key + "' is an empty array");
  for (int64_t x : v)
    if (x != v[0]) throw Error(f.path() + ": '" + key + "' differs between layers (not supported)");
  if ((int64_t)v.size() != 1 && (int64_t)v.size() != n_layer)
    throw Error(f.path() + ": '" + key + "' has " + std::to_string(v.size()) + " entries for " +
                std::to_string(n_layer) + " layers");
  if (v[0] <= 0 || v[0] > (1 << 24)) throw Error(f.path() + ": '" + key + "' = " + std::to_string(v[0]) + " is out of range");
  return (int)v[0];
}

WeightMatrix matrix(const gguf::File& f, const std::string& name, int64_t n_in, int64_t n_out) {
  const gguf::TensorInfo& t = f.tensor(name, {n_in, n_out});
  WeightMatrix w;
  w.type = t.type;
  w.data = t.data;
  w.n_in = n_in;
  w.n_out = n_out;
  w.row_stride = (size_t)row_bytes(t.type, n_in);
  return w;
}

// 1-D vectors (norms, biases) must be f32 for the kernels; f16/bf16 ones are converted once.
const float* vector_f32(const gguf::File& f, const std::string& name, int64_t n, ModelWeights& w) {
  const gguf::TensorInfo& t = f.tensor(name, {n});
  if (t.type == GgmlType::F32) return (const float*)t.data;
  std::vector<float> v((size_t)n);
  if (t.type == GgmlType::F16 || t.type == GgmlType::BF16) {
    const uint16_t* src = (const uint16_t*)t.data;
    for (int64_t i = 0; i < n; i++) v[i] = t.type == GgmlType::F16 ? fp16_to_fp32(src[i]) : bf16_to_fp32(src[i]);
  } else {
    throw Error(f.path() + ": tensor '" + name + "' must be F32, F16 or BF16, is " + type_name(t.type));
  }
  w.owned.push_back(std::move(v));
  return w.owned.back().data();
}

}  // namespace

std::unique_ptr<Model> Model::load(const std::string& path, const LoadOptions& opt) {
  if (hf::is_checkpoint_dir(path)) return load_hf(path, opt);
  if (opt.quantize != GgmlType::F32)
    throw Error(path + ": --quantize applies to Hugging Face checkpoint folders (a GGUF file is used as stored)");
  auto m = std::make_unique<Model>();
  m->file_ = gguf::File::open(path);
  m->weights_path_ = path;
  m->weights_file_bytes_ = m->file_->file_size();
  const gguf::File& f = *m->file_;
  ModelConfig& c = m->config_;
  c.arch = f.get_string("general.architecture");
  const ArchSpec* spec = find_arch(c.arch);
  if (!spec) {
    std::string known;
    for (const ArchSpec& a : arch_registry()) known += (known.empty() ? "" : ", ") + a.name;
    throw Error(path + ": unsupported architecture '" + c.arch + "' (supported: " + known + ")");
  }
  c.name = f.get_string_opt("general.name").value_or("");
  const std::string a = c.arch + ".";
  c.n_layer = (int)f.get_int(a + "block_count");
  if (c.n_layer <= 0 || c.n_layer > 1024) throw Error(path + ": block_count out of range");
  c.n_embd = uniform_int(f, a + "embedding_length", c.n_layer, std::nullopt);
  c.n_head = uniform_int(f, a + "attention.head_count", c.n_layer, std::nullopt);
  c.n_head_kv = uniform_int(f, a + "attention.head_count_kv", c.n_layer, c.n_head);
  c.n_ff = uniform_int(f, a + "feed_forward_length", c.n_layer, std::nullopt);
  if (c.n_head % c.n_head_kv != 0) throw Error(path + ": head_count is not a multiple of head_count_kv");
  c.head_dim = uniform_int(f, a + "attention.key_length", c.n_layer, c.n_embd / c.n_head);
  const int vdim = uniform_int(f, a + "attention.value_length", c.n_layer, c.head_dim);
  if (vdim != c.head_dim) throw Error(path + ": key_length != value_length is not supported");
  if (c.head_dim % 2 != 0) throw Error(path + ": head dimension must be even");
  c.n_rot = uniform_int(f, a + "rope.dimension_count", c.n_layer, c.head_dim);
  if (c.n_rot != c.head_dim) throw Error(path + ": partial RoPE (n_rot != head_dim) is not supported");
  c.n_ctx_train = (int)f.get_int_opt(a + "context_length").value_or(4096);
  c.rms_eps = (float)f.get_float(a + "attention.layer_norm_rms_epsilon");
  c.rope_base = (float)f.get_float_opt(a + "rope.freq_base").value_or(10000.0);
  const std::string scaling = f.get_string_opt(a + "rope.scaling.type").value_or("none");
  if (scaling == "linear") {
    const double factor = f.get_float_opt(a + "rope.scaling.factor").value_or(1.0);
    if (factor > 0) c.rope_freq_scale = (float)(1.0 / factor);
  } else if (scaling != "none") {
    throw Error(path + ": RoPE scaling '" + scaling + "' is not supported");
  }
  c.rope_mode = spec->rope_mode;
  c.has_qkv_bias = spec->qkv_bias;
  c.has_qk_norm = spec->qk_norm;
  c.layers.assign((size_t)c.n_layer, LayerConfig{0, c.rope_base, c.rope_freq_scale});
  if (spec->configure) spec->configure(f, c);
  if ((int)c.layers.size() != c.n_layer) throw Error("internal: " + c.arch + " left a wrong number of layer configs");

  const gguf::TensorInfo* emb = f.find_tensor("token_embd.weight");
  if (!emb) throw Error(path + ": missing tensor 'token_embd.weight'");
  if (emb->ne.size() != 2) throw Error(path + ": token_embd.weight must be 2-D");
  c.n_vocab = (int)emb->ne[1];

  ModelWeights& w = m->weights_;
  const int64_t E = c.n_embd, Dq = (int64_t)c.n_head * c.head_dim, Dkv = (int64_t)c.n_head_kv * c.head_dim;
  w.token_embd = matrix(f, "token_embd.weight", E, c.n_vocab);
  w.output_norm = vector_f32(f, "output_norm.weight", E, w);
  w.output = f.find_tensor("output.weight") ? matrix(f, "output.weight", E, c.n_vocab) : w.token_embd;
  w.layers.resize(c.n_layer);
  for (int l = 0; l < c.n_layer; l++) {
    const std::string p = "blk." + std::to_string(l) + ".";
    LayerWeights& L = w.layers[l];
    L.attn_norm = vector_f32(f, p + "attn_norm.weight", E, w);
    L.wq = matrix(f, p + "attn_q.weight", E, Dq);
    L.wk = matrix(f, p + "attn_k.weight", E, Dkv);
    L.wv = matrix(f, p + "attn_v.weight", E, Dkv);
    L.wo = matrix(f, p + "attn_output.weight", Dq, E);
    if (c.has_qkv_bias) {
      L.bq = vector_f32(f, p + "attn_q.bias", Dq, w);
      L.bk = vector_f32(f, p + "attn_k.bias", Dkv, w);
      L.bv = vector_f32(f, p + "attn_v.bias", Dkv, w);
    }
    if (c.has_qk_norm) {
      L.q_norm = vector_f32(f, p + "attn_q_norm.weight", c.head_dim, w);
      L.k_norm = vector_f32(f, p + "attn_k_norm.weight", c.head_dim, w);
    }
    if (spec->post_norms) {
      L.attn_post_norm = vector_f32(f, p + "post_attention_norm.weight", E, w);
      L.ffn_post_norm = vector_f32(f, p + "post_ffw_norm.weight", E, w);
    }
    L.ffn_norm = vector_f32(f, p + "ffn_norm.weight", E, w);
    L.gate = matrix(f, p + "ffn_gate.weight", E, c.n_ff);
    L.up = matrix(f, p + "ffn_up.weight", E, c.n_ff);
    L.down = matrix(f, p + "ffn_down.weight", c.n_ff, E);
  }
  // Llama 3.1's rope_scaling of type llama3: [n_rot/2] divisors of the RoPE frequencies, every layer.
  if (f.find_tensor("rope_freqs.weight")) {
    for (const LayerConfig& lc : c.layers)
      if (lc.rope_base != c.rope_base || lc.rope_freq_scale != c.rope_freq_scale)
        throw Error(path + ": rope_freqs.weight together with per-layer RoPE bases is not supported");
    const float* factors = vector_f32(f, "rope_freqs.weight", c.n_rot / 2, w);
    for (int i = 0; i < c.n_rot / 2; i++)
      if (!std::isfinite(factors[i]) || factors[i] <= 0.0f)
        throw Error(path + ": rope_freqs.weight[" + std::to_string(i) + "] is not a positive number");
    c.rope_freq_factors.assign(factors, factors + c.n_rot / 2);
  }
  auto bytes = [](const WeightMatrix& x) { return (int64_t)x.row_stride * x.n_out; };
  m->weight_bytes_ = bytes(w.output);
  for (const LayerWeights& L : w.layers)
    m->weight_bytes_ += bytes(L.wq) + bytes(L.wk) + bytes(L.wv) + bytes(L.wo) + bytes(L.gate) + bytes(L.up) + bytes(L.down);

  m->tokenizer_ = Tokenizer::from_gguf(f);
  if (m->tokenizer_->n_vocab() != c.n_vocab)
    throw Error(path + ": tokenizer has " + std::to_string(m->tokenizer_->n_vocab()) + " tokens but token_embd has " +
                std::to_string(c.n_vocab) + " rows");
  return m;
}

}  // namespace kvzap
