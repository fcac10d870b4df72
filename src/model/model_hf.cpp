// Hugging Face checkpoints: config.json + safetensors (format/hf_checkpoint.h) + tokenizer.json
// (tokenizer/tokenizer_json.h), for LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM and
// Gemma3ForCausalLM, and the text model of Gemma3ForConditionalGeneration (its vision tower is left
// unread). The result is the same Model a GGUF file gives, so the forward pass does
// not know where the weights came from. What differs from GGUF:
//   - HF's [out, in] row-major matrices are GGUF's ne = {in, out}: F32/F16/BF16 ones are used in place
//     (zero-copy from the mapping) unless --quantize re-encodes them at load;
//   - RoPE pairs are HF's rotate_half layout (x[i], x[i + D/2]) for every family, so RopeMode::HalfSplit
//     is used as is (the GGUF converter permutes Llama's Q/K to adjacent pairs; nothing is permuted here);
//   - Gemma's RMSNorm gains are stored as w and applied as (1 + w): 1 is added once at load.
// Both config layouts are read: transformers 4's rope_theta / rope_scaling / sliding_window_pattern and
// transformers 5's rope_parameters (per layer type for Gemma 3) / layer_types.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>
#include <thread>

#include "common/fp16.h"
#include "kvzap/error.h"
#include "model/arch.h"
#include "model/model.h"
#include "tokenizer/tokenizer_json.h"

namespace kvzap {
namespace {

// Tensors of a multimodal checkpoint that belong to the image side.
bool is_vision_tensor(const std::string& name) {
  for (const char* p : {"vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector."})
    if (name.rfind(p, 0) == 0) return true;
  return false;
}

// RoPE of one kind of layer: base and scaling (an object with rope_type/type, or null).
struct RopeParams {
  double theta = 10000.0;
  nlohmann::json scaling;
};

// Reads rope_parameters (transformers 5: {rope_theta, rope_type, ...}, or one such object per layer type)
// or rope_theta + rope_scaling (transformers 4).
RopeParams rope_params(const hf::Checkpoint& ck, const char* layer_type, double theta_default, double legacy_theta) {
  const nlohmann::json& cfg = ck.fields();
  RopeParams r;
  if (auto it = cfg.find("rope_parameters"); it != cfg.end() && !it->is_null()) {
    const nlohmann::json* p = &*it;
    if (!p->is_object()) ck.config_error("'rope_parameters' must be an object");
    if (layer_type && p->contains(layer_type)) p = &(*p)[layer_type];
    if (!p->is_object() || !p->contains("rope_theta") || !(*p)["rope_theta"].is_number())
      ck.config_error(std::string("'rope_parameters") + (layer_type ? std::string(".") + layer_type : "") +
                      "' needs a number 'rope_theta'");
    r.theta = (*p)["rope_theta"].get<double>();
    r.scaling = *p;
    return r;
  }
  r.theta = legacy_theta > 0 ? legacy_theta : ck.get_float_opt("rope_theta").value_or(theta_default);
  if (auto it = cfg.find("rope_scaling"); it != cfg.end()) r.scaling = *it;
  return r;
}

// rope_scaling of type linear (positions / factor) or llama3 (per-frequency divisors, as HF's
// _compute_llama3_parameters); anything else would silently change the model, so it is refused.
void apply_rope_scaling(const hf::Checkpoint& ck, const RopeParams& p, int head_dim, float& freq_scale,
                        std::vector<float>* factors) {
  const nlohmann::json& s = p.scaling;
  if (s.is_null()) return;
  if (!s.is_object()) ck.config_error("'rope_scaling' must be an object");
  const std::string type = s.value("rope_type", s.value("type", std::string("default")));
  auto num = [&](const char* key) {
    if (!s.contains(key) || !s[key].is_number())
      ck.config_error("RoPE scaling of type '" + type + "' needs a number '" + key + "'");
    return s[key].get<double>();
  };
  if (type == "default") return;
  if (type == "linear") {
    const double f = num("factor");
    if (!(f > 0)) ck.config_error("RoPE scaling factor must be positive");
    freq_scale = (float)(1.0 / f);
    return;
  }
  if (type == "llama3") {
    if (!factors) ck.config_error("RoPE scaling of type 'llama3' is not supported for this architecture");
    const double factor = num("factor"), lo = num("low_freq_factor"), hi = num("high_freq_factor"),
                 orig = num("original_max_position_embeddings");
    if (!(factor > 0) || !(lo > 0) || !(hi > lo) || !(orig > 0)) ck.config_error("RoPE scaling (llama3) has out-of-range values");
    const double lo_wavelen = orig / lo, hi_wavelen = orig / hi, kPi = 3.14159265358979323846;
    factors->assign((size_t)head_dim / 2, 1.0f);
    for (int i = 0; i < head_dim / 2; i++) {
      const double inv = 1.0 / std::pow(p.theta, 2.0 * i / head_dim), wavelen = 2 * kPi / inv;
      double scaled = inv;
      if (wavelen > lo_wavelen) {
        scaled = inv / factor;
      } else if (wavelen >= hi_wavelen) {  // between the bands: blend
        const double smooth = (orig / wavelen - lo) / (hi - lo);
        scaled = (1 - smooth) * inv / factor + smooth * inv;
      }
      (*factors)[(size_t)i] = (float)(inv / scaled);
    }
    return;
  }
  ck.config_error("RoPE scaling type '" + type + "' is not supported (supported: linear, llama3)");
}

GgmlType dtype_type(const std::string& dtype) {
  if (dtype == "F32") return GgmlType::F32;
  if (dtype == "F16") return GgmlType::F16;
  if (dtype == "BF16") return GgmlType::BF16;
  return GgmlType::Q8_1;  // not a weight type here: the caller refuses it
}

// Typed views of the checkpoint's tensors; remembers which were used so leftovers can be refused.
struct Loader {
  const hf::Checkpoint& ck;
  ModelWeights& w;
  GgmlType quantize;
  std::set<std::string> used;
  int n_quantized = 0, n_fallback = 0, n_kept = 0;  // n_fallback: Q8_0 instead of Q4_K (row length)
  int64_t bytes_quantized = 0;

  const hf::Checkpoint::Entry& get(const std::string& name, const std::vector<int64_t>& shape) {
    const hf::Checkpoint::Entry& e = ck.tensor(name, shape);
    if (dtype_type(e.tensor->dtype) == GgmlType::Q8_1)
      throw Error(e.file->path() + ": tensor '" + name + "' is " + e.tensor->dtype + " (expected F32, F16 or BF16)");
    used.insert(name);
    return e;
  }

  // [n_out][n_in] -> a weight matrix: in place, or quantised when asked and the rows allow.
  WeightMatrix matrix(const std::string& name, int64_t n_out, int64_t n_in) {
    const hf::Checkpoint::Entry& e = get(name, {n_out, n_in});
    const GgmlType src = dtype_type(e.tensor->dtype);
    WeightMatrix m;
    m.n_in = n_in;
    m.n_out = n_out;
    GgmlType dst = src;
    if (quantize != GgmlType::F32) {
      // Q4_K needs rows of 256: narrower matrices fall back to Q8_0 (32), else stay as stored.
      if (n_in % type_block_size(quantize) == 0) dst = quantize;
      else if (n_in % 32 == 0) dst = GgmlType::Q8_0;
    }
    const size_t elem = src == GgmlType::F32 ? 4 : 2;
    if (dst == src && (uintptr_t)e.tensor->data % elem == 0) {
      m.type = src;
      m.data = e.tensor->data;
      m.row_stride = (size_t)row_bytes(src, n_in);
      n_kept++;
      return m;
    }
    m.type = dst;
    m.row_stride = (size_t)row_bytes(dst, n_in);
    std::vector<uint8_t> out((size_t)m.row_stride * n_out);
    if (dst == src) {
      std::memcpy(out.data(), e.tensor->data, out.size());  // unaligned in the file: copied once
    } else {
      const unsigned n_threads = std::max(1u, std::thread::hardware_concurrency());
      const uint8_t* in = e.tensor->data;
      const size_t in_stride = (size_t)n_in * elem;
      std::vector<std::thread> pool;
      for (unsigned t = 0; t < n_threads; t++)
        pool.emplace_back([&, t] {
          std::vector<float> row((size_t)n_in);     // [n_in] one dequantised row
          std::vector<uint8_t> src_row(in_stride);  // aligned copy of the stored row
          for (int64_t r = t; r < n_out; r += n_threads) {
            std::memcpy(src_row.data(), in + (size_t)r * in_stride, in_stride);
            dequantize_row(src, src_row.data(), row.data(), n_in);
            quantize_row(dst, row.data(), out.data() + (size_t)r * m.row_stride, n_in);
          }
        });
      for (std::thread& th : pool) th.join();
      n_quantized++;
      n_fallback += dst != quantize;
      bytes_quantized += (int64_t)out.size();
    }
    w.owned_bytes.push_back(std::move(out));
    m.data = w.owned_bytes.back().data();
    return m;
  }

  // [n] -> f32 (in place when the file holds aligned f32 and nothing is added).
  const float* vec(const std::string& name, int64_t n, float add = 0.0f) {
    const hf::Checkpoint::Entry& e = get(name, {n});
    if (e.tensor->dtype == "F32" && add == 0.0f && (uintptr_t)e.tensor->data % 4 == 0) return (const float*)e.tensor->data;
    std::vector<float> v = e.file->to_f32(*e.tensor);
    for (float& x : v) x += add;
    w.owned.push_back(std::move(v));
    return w.owned.back().data();
  }
};

int positive(const hf::Checkpoint& ck, const std::string& key, int64_t v) {
  if (v <= 0 || v > (1 << 24)) ck.config_error("field '" + key + "' = " + std::to_string(v) + " is out of range");
  return (int)v;
}

}  // namespace

std::unique_ptr<Model> Model::load_hf(const std::string& dir, const LoadOptions& opt) {
  if (opt.quantize != GgmlType::F32 && opt.quantize != GgmlType::Q8_0 && opt.quantize != GgmlType::Q4_K)
    throw Error(std::string("--quantize ") + type_name(opt.quantize) + " is not supported (q8_0 or q4_k)");
  auto m = std::make_unique<Model>();
  m->hf_ = hf::Checkpoint::open(dir);
  const hf::Checkpoint& ck = *m->hf_;
  m->weights_path_ = ck.first_shard();
  m->weights_file_bytes_ = ck.weights_bytes();

  auto archs = ck.config().find("architectures");
  if (archs == ck.config().end() || !archs->is_array() || archs->empty() || !(*archs)[0].is_string())
    ck.config_error("missing field 'architectures'");
  const std::string hf_name = (*archs)[0].get<std::string>();
  const auto [spec, cls] = find_hf_class(hf_name);
  if (!spec) {
    std::string known;
    for (const ArchSpec& a : arch_registry())
      for (const HfClass& k : a.hf_classes) known += (known.empty() ? "" : ", ") + k.name;
    ck.config_error("unsupported architecture '" + hf_name + "' (supported: " + known + ")");
  }
  if (cls->multimodal) m->hf_->descend("text_config");
  const nlohmann::json& cfg = ck.fields();

  ModelConfig& c = m->config_;
  c.arch = spec->name;
  c.name = ck.get_string_opt("_name_or_path").value_or(std::filesystem::path(dir).filename().string());
  if (c.name.empty()) c.name = hf_name;
  c.n_layer = positive(ck, "num_hidden_layers", ck.get_int("num_hidden_layers"));
  if (c.n_layer > 1024) ck.config_error("field 'num_hidden_layers' is out of range");
  c.n_embd = positive(ck, "hidden_size", ck.get_int("hidden_size"));
  c.n_head = positive(ck, "num_attention_heads", ck.get_int("num_attention_heads"));
  c.n_head_kv = positive(ck, "num_key_value_heads", ck.get_int_opt("num_key_value_heads").value_or(c.n_head));
  c.n_ff = positive(ck, "intermediate_size", ck.get_int("intermediate_size"));
  c.n_vocab = positive(ck, "vocab_size", ck.get_int("vocab_size"));
  if (c.n_head % c.n_head_kv != 0) ck.config_error("num_attention_heads is not a multiple of num_key_value_heads");
  c.head_dim = positive(ck, "head_dim", ck.get_int_opt("head_dim").value_or(spec->hf_head_dim_default > 0 ? spec->hf_head_dim_default : c.n_embd / c.n_head));
  if (c.head_dim % 2 != 0) ck.config_error("head dimension must be even");
  c.n_rot = c.head_dim;
  if (auto f = ck.get_float_opt("partial_rotary_factor"); f && *f != 1.0)
    ck.config_error("partial RoPE ('partial_rotary_factor') is not supported");
  c.n_ctx_train = positive(ck, "max_position_embeddings", ck.get_int_opt("max_position_embeddings").value_or(4096));
  c.rms_eps = (float)ck.get_float("rms_norm_eps");
  if (!(c.rms_eps > 0)) ck.config_error("field 'rms_norm_eps' must be positive");
  c.rope_mode = RopeMode::HalfSplit;
  c.has_qkv_bias = spec->qkv_bias;
  c.has_qk_norm = spec->qk_norm;

  const std::string act_key = spec->hf_gemma_config ? "hidden_activation" : "hidden_act";
  const std::string act = ck.get_string_opt(act_key).value_or(spec->hf_gemma_config ? "gelu_pytorch_tanh" : "silu");
  if (spec->hf_gemma_config ? act != "gelu_pytorch_tanh" && act != "gelu_tanh" : act != "silu")
    ck.config_error("'" + act_key + "' = '" + act + "' is not supported");
  if (ck.get_bool_opt("attention_bias").value_or(false))
    ck.config_error("'attention_bias': true is not supported (output projection bias)");
  if (ck.get_bool_opt("mlp_bias").value_or(false)) ck.config_error("'mlp_bias': true is not supported");
  if (ck.get_bool_opt("use_sliding_window").value_or(false))
    ck.config_error("'use_sliding_window': true is not supported for " + hf_name);
  if (ck.get_bool_opt("use_bidirectional_attention").value_or(false))
    ck.config_error("'use_bidirectional_attention': true is not supported");

  // Per-layer attention kind: layer_types (transformers 5), else Gemma's sliding_window_pattern.
  std::vector<bool> sliding((size_t)c.n_layer, false);
  if (auto it = cfg.find("layer_types"); it != cfg.end() && !it->is_null()) {
    if (!it->is_array() || (int)it->size() != c.n_layer)
      ck.config_error("'layer_types' must list one entry per layer (" + std::to_string(c.n_layer) + ")");
    for (int l = 0; l < c.n_layer; l++) {
      const nlohmann::json& t = (*it)[(size_t)l];
      if (t == "sliding_attention") sliding[(size_t)l] = true;
      else if (t != "full_attention") ck.config_error("'layer_types' entry " + std::to_string(l) + " is not supported");
    }
  } else if (spec->hf_gemma_config) {
    int64_t n = ck.get_int_opt("sliding_window_pattern").value_or(ck.get_int_opt("_sliding_window_pattern").value_or(6));
    if (n < 0 || n > 1024) ck.config_error("'sliding_window_pattern' is out of range");
    for (int l = 0; l < c.n_layer; l++) sliding[(size_t)l] = n == 0 || (l + 1) % n != 0;
  }
  const bool any_sliding = std::find(sliding.begin(), sliding.end(), true) != sliding.end();
  if (any_sliding && !spec->hf_gemma_config) ck.config_error("sliding-window layers are not supported for " + hf_name);

  const RopeParams global = rope_params(ck, "full_attention", spec->hf_rope_theta_default, 0);
  if (!(global.theta > 0)) ck.config_error("RoPE base must be positive");
  c.rope_base = (float)global.theta;
  apply_rope_scaling(ck, global, c.head_dim, c.rope_freq_scale, spec->hf_gemma_config ? nullptr : &c.rope_freq_factors);
  c.layers.assign((size_t)c.n_layer, LayerConfig{0, c.rope_base, c.rope_freq_scale});

  if (spec->hf_gemma_config) {
    c.ffn_act = FfnActivation::GeluTanh;
    c.embd_scale = std::sqrt((float)c.n_embd);
    const double q = ck.get_float_opt("query_pre_attn_scalar").value_or(256.0);
    if (!(q > 0)) ck.config_error("field 'query_pre_attn_scalar' must be positive");
    c.attn_scale = 1.0f / std::sqrt((float)q);
    if (auto cap = ck.get_float_opt("final_logit_softcapping")) {
      if (*cap < 0) ck.config_error("field 'final_logit_softcapping' must not be negative");
      // transformers' Gemma3ForConditionalGeneration never applies it (only Gemma3ForCausalLM does);
      // released Gemma 3 configs have it null, so this only matters for hand-made ones.
      if (cls->multimodal)
        std::fprintf(stderr, "kvzap: %s: text_config.final_logit_softcapping is ignored, as transformers does\n",
                     hf_name.c_str());
      else
        c.final_logit_softcap = (float)*cap;
    }
    if (auto cap = ck.get_float_opt("attn_logit_softcapping"); cap && *cap > 0)
      ck.config_error("attention logit soft-capping ('attn_logit_softcapping') is not supported");
    if (any_sliding) {
      const int64_t window = ck.get_int_opt("sliding_window").value_or(4096);
      if (window <= 0 || window > (1 << 24)) ck.config_error("field 'sliding_window' is out of range");
      const RopeParams local = rope_params(ck, "sliding_attention", 10000.0, ck.get_float_opt("rope_local_base_freq").value_or(10000.0));
      if (!(local.theta > 0)) ck.config_error("local RoPE base must be positive");
      float local_scale = 1.0f;  // transformers 4 scales the global layers only
      if (cfg.contains("rope_parameters")) apply_rope_scaling(ck, local, c.head_dim, local_scale, nullptr);
      for (int l = 0; l < c.n_layer; l++)
        if (sliding[(size_t)l]) c.layers[(size_t)l] = LayerConfig{(int32_t)window, (float)local.theta, local_scale};
    }
  }

  // Weights.
  ModelWeights& w = m->weights_;
  Loader ld{ck, w, opt.quantize, {}, 0, 0, 0, 0};
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t E = c.n_embd, Dq = (int64_t)c.n_head * c.head_dim, Dkv = (int64_t)c.n_head_kv * c.head_dim;
  const float norm_add = spec->hf_gemma_config ? 1.0f : 0.0f;
  // Where the text model's tensors are: "model." or, for an image-text model, under its language model.
  std::string tp = "model.", lm_head = "lm_head.weight";
  if (cls->multimodal) {
    tp = ck.find("language_model.model.embed_tokens.weight") ? "language_model.model." : "model.language_model.";
    if (tp == "language_model.model." && ck.find("language_model.lm_head.weight")) lm_head = "language_model.lm_head.weight";
  }
  w.token_embd = ld.matrix(tp + "embed_tokens.weight", c.n_vocab, E);
  w.output_norm = ld.vec(tp + "norm.weight", E, norm_add);
  const bool tied = ck.get_bool_opt("tie_word_embeddings").value_or(spec->hf_tied_default);
  if (ck.find(lm_head)) w.output = ld.matrix(lm_head, c.n_vocab, E);
  else if (tied) w.output = w.token_embd;
  else ld.get(lm_head, {c.n_vocab, E});  // throws: missing tensor
  w.layers.resize(c.n_layer);
  for (int l = 0; l < c.n_layer; l++) {
    const std::string p = tp + "layers." + std::to_string(l) + ".";
    LayerWeights& L = w.layers[l];
    L.attn_norm = ld.vec(p + "input_layernorm.weight", E, norm_add);
    L.wq = ld.matrix(p + "self_attn.q_proj.weight", Dq, E);
    L.wk = ld.matrix(p + "self_attn.k_proj.weight", Dkv, E);
    L.wv = ld.matrix(p + "self_attn.v_proj.weight", Dkv, E);
    L.wo = ld.matrix(p + "self_attn.o_proj.weight", E, Dq);
    if (c.has_qkv_bias) {
      L.bq = ld.vec(p + "self_attn.q_proj.bias", Dq);
      L.bk = ld.vec(p + "self_attn.k_proj.bias", Dkv);
      L.bv = ld.vec(p + "self_attn.v_proj.bias", Dkv);
    }
    if (c.has_qk_norm) {
      L.q_norm = ld.vec(p + "self_attn.q_norm.weight", c.head_dim, norm_add);
      L.k_norm = ld.vec(p + "self_attn.k_norm.weight", c.head_dim, norm_add);
    }
    if (spec->hf_gemma_config) {
      L.attn_post_norm = ld.vec(p + "post_attention_layernorm.weight", E, norm_add);
      L.ffn_norm = ld.vec(p + "pre_feedforward_layernorm.weight", E, norm_add);
      L.ffn_post_norm = ld.vec(p + "post_feedforward_layernorm.weight", E, norm_add);
    } else {
      L.ffn_norm = ld.vec(p + "post_attention_layernorm.weight", E);
    }
    L.gate = ld.matrix(p + "mlp.gate_proj.weight", c.n_ff, E);
    L.up = ld.matrix(p + "mlp.up_proj.weight", c.n_ff, E);
    L.down = ld.matrix(p + "mlp.down_proj.weight", E, c.n_ff);
  }
  // A tensor nobody reads means a variant this loader does not know (e.g. an o_proj bias): refuse it.
  int n_vision = 0;
  for (const std::string& name : ck.tensor_names()) {
    if (ld.used.count(name)) continue;
    if (cls->multimodal && is_vision_tensor(name)) {
      n_vision++;
      continue;
    }
    if (name.size() >= 19 && name.compare(name.size() - 19, 19, "rotary_emb.inv_freq") == 0) continue;  // old buffers
    throw Error(ck.find(name)->file->path() + ": unexpected tensor '" + name + "' (not part of a " + hf_name + ")");
  }
  if (n_vision)
    std::fprintf(stderr, "kvzap: %s: text model only; the vision tower and projector (%d tensors) are not loaded\n",
                 hf_name.c_str(), n_vision);
  if (opt.quantize != GgmlType::F32) {
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const std::string fallback =
        ld.n_fallback ? "; " + std::to_string(ld.n_fallback) + " of them as Q8_0 (rows not a multiple of 256)" : "";
    std::fprintf(stderr, "kvzap: quantised %d matrices to %s at load in %.2f s (%.1f MiB in memory%s; %d kept as stored)\n",
                 ld.n_quantized, type_name(opt.quantize), secs, ld.bytes_quantized / 1048576.0, fallback.c_str(), ld.n_kept);
  }
  auto bytes = [](const WeightMatrix& x) { return (int64_t)x.row_stride * x.n_out; };
  m->weight_bytes_ = bytes(w.output);
  for (const LayerWeights& L : w.layers)
    m->weight_bytes_ += bytes(L.wq) + bytes(L.wk) + bytes(L.wv) + bytes(L.wo) + bytes(L.gate) + bytes(L.up) + bytes(L.down);

  m->tokenizer_ = tokenizer_from_hf_dir(dir, c.n_vocab);
  return m;
}

}  // namespace kvzap
