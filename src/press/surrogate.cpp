#include "press/surrogate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>

#include "format/safetensors.h"
#include "kernels/matmul.h"
#include "kernels/fast_exp.h"
#include "kernels/isa_dispatch.h"
#include "kvzap/error.h"

// Hot kernels: bodies built for AVX-512, AVX2 and baseline by KVZAP_ISA_DISPATCH and chosen per call by
// active_isa() (kernels/isa_dispatch.h); the 32-byte vectors below are one AVX register in the AVX2 and
// AVX-512 builds, two SSE registers in the baseline one.
#define KVZ_INLINE inline __attribute__((always_inline))
// The 32-byte vector helpers are always inlined, so the "AVX vector return changes the ABI" note
// about them in the baseline clone is moot.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

namespace kvzap {
namespace dense {
namespace avx512 {  // surrogate_avx512.cpp
void gemm_nn_acc(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C,
                 int64_t ldc);
void gemm_nt_acc(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* Bt, int64_t ldb, float* C,
                 int64_t ldc);
}
namespace {

// 32-byte vectors through GCC/Clang vector extensions: one AVX register in the x86-64-v3 clone, two
// SSE registers in the baseline clone. Loads and stores go through memcpy (no alignment needed).
template <class T>
struct Vec {
  typedef T type __attribute__((vector_size(32)));
  static constexpr int width = int(32 / sizeof(T));
};

template <class T>
KVZ_INLINE typename Vec<T>::type load(const T* p) {
  typename Vec<T>::type v;
  __builtin_memcpy(&v, p, sizeof(v));
  return v;
}

template <class T>
KVZ_INLINE void store(T* p, typename Vec<T>::type v) {
  __builtin_memcpy(p, &v, sizeof(v));
}

// Register tile C[MR][NV * width] (+)= A[MR][K] · B[K][NV * width]; k runs in order for every
// element, so the result does not depend on which tile shape covered it.
template <class T, int MR, int NV>
KVZ_INLINE void tile_nn(int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb, T* C, int64_t ldc,
                        bool accumulate) {
  using V = typename Vec<T>::type;
  constexpr int W = Vec<T>::width;
  V c[MR][NV];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NV; ++j) c[i][j] = V{};
  for (int64_t k = 0; k < K; ++k) {
    V b[NV];
    for (int j = 0; j < NV; ++j) b[j] = load(B + k * ldb + j * W);
    for (int i = 0; i < MR; ++i) {
      const V a = V{} + A[i * lda + k];
      for (int j = 0; j < NV; ++j) c[i][j] += a * b[j];
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NV; ++j) {
      T* dst = C + i * ldc + j * W;
      store(dst, accumulate ? load(dst) + c[i][j] : c[i][j]);
    }
}

// Scalar tile for the last columns (fewer than one vector).
template <class T>
KVZ_INLINE void tile_nn_scalar(int mr, int nr, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb, T* C,
                               int64_t ldc, bool accumulate) {
  constexpr int W = Vec<T>::width;
  T c[4][W] = {};
  for (int64_t k = 0; k < K; ++k)
    for (int i = 0; i < mr; ++i) {
      const T a = A[i * lda + k];
      for (int j = 0; j < nr; ++j) c[i][j] += a * B[k * ldb + j];
    }
  for (int i = 0; i < mr; ++i)
    for (int j = 0; j < nr; ++j) C[i * ldc + j] = accumulate ? C[i * ldc + j] + c[i][j] : c[i][j];
}

template <class T, int MR>
KVZ_INLINE void row_block_nn(int64_t N, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb, T* C,
                             int64_t ldc, bool accumulate) {
  constexpr int W = Vec<T>::width;
  int64_t j = 0;
  for (; j + 3 * W <= N; j += 3 * W) tile_nn<T, MR, 3>(K, A, lda, B + j, ldb, C + j, ldc, accumulate);
  if (j + 2 * W <= N) {
    tile_nn<T, MR, 2>(K, A, lda, B + j, ldb, C + j, ldc, accumulate);
    j += 2 * W;
  } else if (j + W <= N) {
    tile_nn<T, MR, 1>(K, A, lda, B + j, ldb, C + j, ldc, accumulate);
    j += W;
  }
  if (j < N) tile_nn_scalar<T>(MR, int(N - j), K, A, lda, B + j, ldb, C + j, ldc, accumulate);
}

template <class T>
KVZ_INLINE void gemm_nn_impl(int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B,
                             int64_t ldb, T* C, int64_t ldc, bool accumulate) {
  int64_t i = 0;
  for (; i + 4 <= M; i += 4) row_block_nn<T, 4>(N, K, A + i * lda, lda, B, ldb, C + i * ldc, ldc, accumulate);
  switch (M - i) {
    case 3: row_block_nn<T, 3>(N, K, A + i * lda, lda, B, ldb, C + i * ldc, ldc, accumulate); break;
    case 2: row_block_nn<T, 2>(N, K, A + i * lda, lda, B, ldb, C + i * ldc, ldc, accumulate); break;
    case 1: row_block_nn<T, 1>(N, K, A + i * lda, lda, B, ldb, C + i * ldc, ldc, accumulate); break;
    default: break;
  }
}

// NB dots of one row of A with rows of Bt, each with two vector accumulators reduced in a fixed order;
// every vector of A is loaded once for all NB of them: the linear scorer and the MLP's output layer have
// 2-8 outputs, so sharing the row's loads is most of the work saved.
template <class T, int NB>
KVZ_INLINE void dots_impl(const T* a, const T* const* b, int64_t n, T* out) {
  using V = typename Vec<T>::type;
  constexpr int W = Vec<T>::width;
  V s0[NB], s1[NB];
  for (int j = 0; j < NB; ++j) s0[j] = s1[j] = V{};
  int64_t k = 0;
  for (; k + 2 * W <= n; k += 2 * W) {
    const V a0 = load(a + k), a1 = load(a + k + W);
    for (int j = 0; j < NB; ++j) {
      s0[j] += a0 * load(b[j] + k);
      s1[j] += a1 * load(b[j] + k + W);
    }
  }
  const bool one_more = k + W <= n;
  if (one_more) {
    const V a0 = load(a + k);
    for (int j = 0; j < NB; ++j) s0[j] += a0 * load(b[j] + k);
  }
  const int64_t tail = one_more ? k + W : k;
  for (int j = 0; j < NB; ++j) {
    const V sv = s0[j] + s1[j];
    T r = 0;
    for (int i = 0; i < W; ++i) r += sv[i];
    for (int64_t t = tail; t < n; ++t) r += a[t] * b[j][t];
    out[j] = r;
  }
}

template <class T>
KVZ_INLINE void gemm_nt_impl(int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* Bt,
                             int64_t ldb, T* C, int64_t ldc, bool accumulate) {
  constexpr int NB = 4;
  for (int64_t i = 0; i < M; ++i) {
    const T* a = A + i * lda;
    int64_t j = 0;
    for (; j + NB <= N; j += NB) {
      const T* b[NB];
      T d[NB];
      for (int q = 0; q < NB; ++q) b[q] = Bt + (j + q) * ldb;
      dots_impl<T, NB>(a, b, K, d);
      for (int q = 0; q < NB; ++q) C[i * ldc + j + q] = accumulate ? C[i * ldc + j + q] + d[q] : d[q];
    }
    const T* b[NB];
    T d[NB];
    const int rest = int(N - j);
    if (rest == 0) continue;
    for (int q = 0; q < NB; ++q) b[q] = Bt + (j + std::min(q, rest - 1)) * ldb;
    switch (rest) {
      case 3: dots_impl<T, 3>(a, b, K, d); break;
      case 2: dots_impl<T, 2>(a, b, K, d); break;
      default: dots_impl<T, 1>(a, b, K, d); break;
    }
    for (int q = 0; q < rest; ++q) C[i * ldc + j + q] = accumulate ? C[i * ldc + j + q] + d[q] : d[q];
  }
}


// erf by Abramowitz & Stegun 7.1.26 (absolute error <= 1.5e-7, plus ~1e-7 from fast_exp): the exact-GELU
// inference path stays within ~3e-7 of PyTorch's erf GELU.
KVZ_INLINE float gelu_fast(float x) {
  const float z = std::fabs(x) * 0.70710678118654752f;
  const float t = 1.0f / (1.0f + 0.3275911f * z);
  const float poly = t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f + t * 1.061405429f))));
  const float erf_abs = 1.0f - poly * fast_exp(-z * z);
  const float erf = x < 0 ? -erf_abs : erf_abs;
  return 0.5f * x * (1.0f + erf);
}

}  // namespace

KVZAP_INLINE_BODY void gemm_nn_body(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
                        int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  gemm_nn_impl(M, N, K, A, lda, B, ldb, C, ldc, accumulate);
}
KVZAP_ISA_DISPATCH(void, gemm_nn, (int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc, bool accumulate), (M, N, K, A, lda, B, ldb, C, ldc, accumulate))
KVZAP_INLINE_BODY void gemm_nn_body(int64_t M, int64_t N, int64_t K, const double* A, int64_t lda, const double* B,
                        int64_t ldb, double* C, int64_t ldc, bool accumulate) {
  gemm_nn_impl(M, N, K, A, lda, B, ldb, C, ldc, accumulate);
}
KVZAP_ISA_DISPATCH(void, gemm_nn, (int64_t M, int64_t N, int64_t K, const double* A, int64_t lda, const double* B, int64_t ldb, double* C, int64_t ldc, bool accumulate), (M, N, K, A, lda, B, ldb, C, ldc, accumulate))
KVZAP_INLINE_BODY void gemm_nt_body(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* Bt,
                        int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  gemm_nt_impl(M, N, K, A, lda, Bt, ldb, C, ldc, accumulate);
}
KVZAP_ISA_DISPATCH(void, gemm_nt, (int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* Bt, int64_t ldb, float* C, int64_t ldc, bool accumulate), (M, N, K, A, lda, Bt, ldb, C, ldc, accumulate))
KVZAP_INLINE_BODY void gemm_nt_body(int64_t M, int64_t N, int64_t K, const double* A, int64_t lda, const double* Bt,
                        int64_t ldb, double* C, int64_t ldc, bool accumulate) {
  gemm_nt_impl(M, N, K, A, lda, Bt, ldb, C, ldc, accumulate);
}
KVZAP_ISA_DISPATCH(void, gemm_nt, (int64_t M, int64_t N, int64_t K, const double* A, int64_t lda, const double* Bt, int64_t ldb, double* C, int64_t ldc, bool accumulate), (M, N, K, A, lda, Bt, ldb, C, ldc, accumulate))

KVZAP_INLINE_BODY void gelu_inplace_body(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = gelu_fast(x[i]);
}
KVZAP_ISA_DISPATCH(void, gelu_inplace, (float* x, int64_t n), (x, n))

float gelu(float x) { return 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f)); }
double gelu(double x) { return 0.5 * x * (1.0 + std::erf(x * 0.70710678118654752)); }
double gelu_grad(double x) {
  const double cdf = 0.5 * (1.0 + std::erf(x * 0.70710678118654752));
  const double pdf = 0.39894228040143268 * std::exp(-0.5 * x * x);
  return cdf + x * pdf;
}

}  // namespace dense

// ---------------------------------------------------------------- Surrogate

Surrogate::Surrogate(int input_dim, int output_dim, int hidden_dim, std::vector<SurrogateLayerWeights> layers)
    : input_dim_(input_dim), output_dim_(output_dim), hidden_dim_(hidden_dim), layers_(std::move(layers)) {
  if (input_dim <= 0 || output_dim <= 0 || hidden_dim < 0)
    throw Error("surrogate: invalid dimensions input_dim=" + std::to_string(input_dim) +
                " output_dim=" + std::to_string(output_dim) + " hidden_dim=" + std::to_string(hidden_dim));
  if (layers_.empty()) throw Error("surrogate: no layers");
  const size_t D = size_t(input_dim), H = size_t(output_dim), Hd = size_t(hidden_dim);
  auto check = [](const std::vector<float>& v, size_t n, size_t l, const char* what) {
    if (v.size() != n)
      throw Error("surrogate: layer " + std::to_string(l) + " " + what + " has " + std::to_string(v.size()) +
                  " values, expected " + std::to_string(n));
  };
  for (size_t l = 0; l < layers_.size(); ++l) {
    const SurrogateLayerWeights& w = layers_[l];
    if (hidden_dim == 0) {
      check(w.w1, H * D, l, "weight");
      check(w.b1, H, l, "bias");
      check(w.w2, 0, l, "second weight (linear model)");
      check(w.b2, 0, l, "second bias (linear model)");
    } else {
      check(w.w1, Hd * D, l, "0.weight");
      check(w.b1, Hd, l, "0.bias");
      check(w.w2, H * Hd, l, "2.weight");
      check(w.b2, H, l, "2.bias");
    }
  }
  if (hidden_dim > 0) {
    w1t_.resize(layers_.size());
    for (size_t l = 0; l < layers_.size(); ++l) {
      std::vector<float>& t = w1t_[l];
      t.resize(D * Hd);
      for (size_t o = 0; o < Hd; ++o)
        for (size_t i = 0; i < D; ++i) t[i * Hd + o] = layers_[l].w1[o * D + i];
    }
  }
}

int64_t Surrogate::n_params() const {
  int64_t n = 0;
  for (const auto& w : layers_) n += int64_t(w.w1.size() + w.b1.size() + w.w2.size() + w.b2.size());
  return n;
}

void Surrogate::predict(int layer, const float* h, int64_t n_tok, float* out, float* scratch) const {
  const SurrogateLayerWeights& w = layers_[size_t(layer)];
  const int64_t D = input_dim_, H = output_dim_, Hd = hidden_dim_;
  if (n_tok <= 0) return;
  // One ISA dispatch (KVZAP_ISA / set_active_isa): the AVX-512 kernels in surrogate_avx512.cpp, else the
  // AVX2 / baseline clones of the dense kernels.
  const bool avx512 = active_isa() >= Isa::Avx512;
  if (Hd == 0) {
    for (int64_t t = 0; t < n_tok; ++t) std::copy(w.b1.begin(), w.b1.end(), out + t * H);
    if (avx512)
      dense::avx512::gemm_nt_acc(n_tok, H, D, h, D, w.w1.data(), D, out, H);
    else
      dense::gemm_nt(n_tok, H, D, h, D, w.w1.data(), D, out, H, true);
    return;
  }
  for (int64_t t = 0; t < n_tok; ++t) std::copy(w.b1.begin(), w.b1.end(), scratch + t * Hd);
  if (avx512)
    dense::avx512::gemm_nn_acc(n_tok, Hd, D, h, D, w1t_[size_t(layer)].data(), Hd, scratch, Hd);
  else
    dense::gemm_nn(n_tok, Hd, D, h, D, w1t_[size_t(layer)].data(), Hd, scratch, Hd, true);
  dense::gelu_inplace(scratch, n_tok * Hd);
  for (int64_t t = 0; t < n_tok; ++t) std::copy(w.b2.begin(), w.b2.end(), out + t * H);
  if (avx512)
    dense::avx512::gemm_nt_acc(n_tok, H, Hd, scratch, Hd, w.w2.data(), Hd, out, H);
  else
    dense::gemm_nt(n_tok, H, Hd, scratch, Hd, w.w2.data(), Hd, out, H, true);
}

// ---------------------------------------------------------------- kvpress folder I/O

namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// A positive integer config field (required).
int config_dim(const nlohmann::json& cfg, const char* key, const std::string& where) {
  const auto it = cfg.find(key);
  if (it == cfg.end()) throw Error(where + "config.json lacks \"" + key + "\"");
  if (!it->is_number_integer() || it->get<int64_t>() <= 0 || it->get<int64_t>() > (1 << 24))
    throw Error(where + "config.json \"" + key + "\" must be a positive integer, got " + it->dump());
  return int(it->get<int64_t>());
}

}  // namespace

std::unique_ptr<Surrogate> Surrogate::load(const std::string& dir) {
  namespace fs = std::filesystem;
  const std::string where = "surrogate " + dir + ": ";
  if (!fs::is_directory(dir)) throw Error(where + "not a directory");
  const fs::path cfg_path = fs::path(dir) / "config.json";
  const fs::path st_path = fs::path(dir) / "model.safetensors";
  if (!fs::exists(cfg_path)) throw Error(where + "missing config.json");
  if (!fs::exists(st_path)) throw Error(where + "missing model.safetensors");

  nlohmann::json cfg;
  {
    std::ifstream in(cfg_path);
    if (!in) throw Error(where + "cannot read config.json");
    std::stringstream ss;
    ss << in.rdbuf();
    cfg = nlohmann::json::parse(ss.str(), nullptr, false);
  }
  if (cfg.is_discarded() || !cfg.is_object()) throw Error(where + "config.json is not a JSON object");
  const auto mt = cfg.find("model_type");
  if (mt == cfg.end() || !mt->is_string())
    throw Error(where + "config.json lacks a \"model_type\" string (expected \"kvzap\")");
  if (mt->get<std::string>() != "kvzap")
    throw Error(where + "config.json model_type is \"" + mt->get<std::string>() + "\", expected \"kvzap\"");
  const int D = config_dim(cfg, "input_dim", where);
  const int H = config_dim(cfg, "output_dim", where);
  const int L = config_dim(cfg, "n_modules", where);
  int Hd = 0;
  if (const auto hd = cfg.find("hidden_dim"); hd != cfg.end() && !hd->is_null()) Hd = config_dim(cfg, "hidden_dim", where);

  const std::unique_ptr<SafetensorsFile> st = SafetensorsFile::open(st_path.string());
  std::set<std::string> expected;
  auto take = [&](const std::string& name, std::vector<int64_t> shape) {
    expected.insert(name);
    const SafetensorsFile::Tensor* t = st->find(name);
    if (!t) throw Error(where + "model.safetensors lacks tensor '" + name + "' (config: n_modules=" + std::to_string(L) +
                        (Hd ? ", MLP" : ", linear") + ")");
    if (t->shape != shape)
      throw Error(where + "tensor '" + name + "' has shape " + shape_str(t->shape) + ", expected " + shape_str(shape) +
                  " from config.json");
    if (t->dtype != "F32" && t->dtype != "BF16" && t->dtype != "F16")
      throw Error(where + "tensor '" + name + "' has dtype " + t->dtype + " (expected F32, BF16 or F16)");
    std::vector<float> v = st->to_f32(*t);
    for (float x : v)
      if (!std::isfinite(x)) throw Error(where + "tensor '" + name + "' holds a non-finite value");
    return v;
  };
  std::vector<SurrogateLayerWeights> layers(static_cast<size_t>(L));
  for (int l = 0; l < L; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    SurrogateLayerWeights& w = layers[size_t(l)];
    if (Hd == 0) {
      w.w1 = take(p + "weight", {H, D});
      w.b1 = take(p + "bias", {H});
    } else {
      w.w1 = take(p + "0.weight", {Hd, D});
      w.b1 = take(p + "0.bias", {Hd});
      w.w2 = take(p + "2.weight", {H, Hd});
      w.b2 = take(p + "2.bias", {H});
    }
  }
  for (const auto& t : st->tensors()) {
    if (expected.count(t.name)) continue;
    int layer = -1;
    if (std::sscanf(t.name.c_str(), "layers.%d.", &layer) == 1 && layer >= L)
      throw Error(where + "config.json says n_modules=" + std::to_string(L) + " but model.safetensors has tensor '" +
                  t.name + "'");
    throw Error(where + "unexpected tensor '" + t.name + "' in model.safetensors (config.json describes a " +
                (Hd ? "MLP with hidden_dim=" + std::to_string(Hd) : std::string("linear model")) + ")");
  }
  return std::make_unique<Surrogate>(D, H, Hd, std::move(layers));
}

void Surrogate::save(const std::string& dir) const {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!fs::is_directory(dir)) throw Error("surrogate " + dir + ": cannot create directory");
  nlohmann::ordered_json cfg;
  cfg["architectures"] = {"KVzapModel"};
  cfg["hidden_dim"] = is_mlp() ? nlohmann::ordered_json(hidden_dim_) : nlohmann::ordered_json(nullptr);
  cfg["input_dim"] = input_dim_;
  cfg["model_type"] = "kvzap";
  cfg["n_modules"] = n_layers();
  cfg["output_dim"] = output_dim_;
  cfg["torch_dtype"] = "float32";
  std::vector<TensorToWrite> tensors;
  const int64_t D = input_dim_, H = output_dim_, Hd = hidden_dim_;
  for (int l = 0; l < n_layers(); ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    const SurrogateLayerWeights& w = layers_[size_t(l)];
    if (!is_mlp()) {
      tensors.push_back({p + "weight", "F32", {H, D}, w.w1});
      tensors.push_back({p + "bias", "F32", {H}, w.b1});
    } else {
      tensors.push_back({p + "0.weight", "F32", {Hd, D}, w.w1});
      tensors.push_back({p + "0.bias", "F32", {Hd}, w.b1});
      tensors.push_back({p + "2.weight", "F32", {H, Hd}, w.w2});
      tensors.push_back({p + "2.bias", "F32", {H}, w.b2});
    }
  }
  write_safetensors((fs::path(dir) / "model.safetensors").string(), tensors, {{"format", "pt"}});
  const std::string cfg_path = (fs::path(dir) / "config.json").string();
  std::ofstream out(cfg_path, std::ios::trunc);
  out << cfg.dump(2) << "\n";
  out.close();
  if (!out) throw Error("surrogate " + dir + ": cannot write config.json");
}

void Surrogate::predict_threaded(int layer, const float* h, int64_t n_tok, float* out, ThreadPool& pool,
                                 std::vector<std::vector<float>>& scratch) const {
  constexpr int64_t kChunk = 32;
  if ((int)scratch.size() < pool.size()) scratch.resize((size_t)pool.size());
  for (auto& s : scratch)
    if ((int64_t)s.size() < std::max<int64_t>(1, scratch_floats(kChunk))) s.resize((size_t)std::max<int64_t>(1, scratch_floats(kChunk)));
  const int64_t n_chunks = (n_tok + kChunk - 1) / kChunk;
  if (n_chunks <= 1) {
    predict(layer, h, n_tok, out, scratch[0].data());
    return;
  }
  pool.parallel_for(n_chunks, [&](int64_t c, int tid) {
    const int64_t t0 = c * kChunk, n = std::min(kChunk, n_tok - t0);
    predict(layer, h + t0 * input_dim_, n, out + t0 * output_dim_, scratch[(size_t)tid].data());
  });
}

std::optional<double> default_kvzap_threshold(const std::string& surrogate_dir) {
  namespace fs = std::filesystem;
  const fs::path p = fs::path(surrogate_dir) / "kvzap.json";
  std::error_code ec;
  if (!fs::exists(p, ec)) return std::nullopt;
  std::ifstream in(p);
  nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object()) throw Error(p.string() + ": not a JSON object");
  const auto it = j.find("default_threshold");
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_number() || !std::isfinite(it->get<double>()))
    throw Error(p.string() + ": \"default_threshold\" must be a finite number");
  return it->get<double>();
}

}  // namespace kvzap
