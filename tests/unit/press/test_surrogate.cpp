// Surrogate inference (linear and MLP) against a naive double-precision reference, the shared dense
// kernels, and the kvpress folder format: save/load round trips and every kind of corrupt input.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "common/fp16.h"
#include "format/safetensors.h"
#include "kvzap/error.h"
#include "kernels/matmul.h"
#include "press/surrogate.h"
#include "test_support.h"

namespace fs = std::filesystem;
using kvzap::Surrogate;
using kvzap::Isa;
using kvzap::isa_name;
using kvzap::set_active_isa;
using kvzap::SurrogateLayerWeights;

namespace {

std::vector<float> random_vec(std::mt19937& rng, size_t n, float scale) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

Surrogate make_surrogate(int L, int D, int Hd, int H, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<SurrogateLayerWeights> layers(static_cast<size_t>(L));
  for (auto& w : layers) {
    // Fan-in scaled like trained layers (pre-activations of order 1), plus large intercepts like log-scores.
    const float s_in = 1.5f / std::sqrt(float(D));
    if (Hd == 0) {
      w.w1 = random_vec(rng, size_t(H) * D, s_in);
      w.b1 = random_vec(rng, size_t(H), 4.0f);
    } else {
      w.w1 = random_vec(rng, size_t(Hd) * D, s_in);
      w.b1 = random_vec(rng, size_t(Hd), 0.5f);
      w.w2 = random_vec(rng, size_t(H) * Hd, 1.5f / std::sqrt(float(Hd)));
      w.b2 = random_vec(rng, size_t(H), 4.0f);
    }
  }
  return Surrogate(D, H, Hd, std::move(layers));
}

// Straight from the definition, in double.
std::vector<double> reference_predict(const Surrogate& s, int layer, const float* h, int64_t n) {
  const SurrogateLayerWeights& w = s.layer(layer);
  const int D = s.input_dim(), H = s.output_dim(), Hd = s.hidden_dim();
  std::vector<double> out(size_t(n) * H);
  for (int64_t t = 0; t < n; ++t) {
    const float* x = h + t * D;
    if (Hd == 0) {
      for (int o = 0; o < H; ++o) {
        double acc = w.b1[size_t(o)];
        for (int i = 0; i < D; ++i) acc += double(w.w1[size_t(o) * D + i]) * x[i];
        out[size_t(t) * H + o] = acc;
      }
    } else {
      std::vector<double> a(static_cast<size_t>(Hd));
      for (int j = 0; j < Hd; ++j) {
        double z = w.b1[size_t(j)];
        for (int i = 0; i < D; ++i) z += double(w.w1[size_t(j) * D + i]) * x[i];
        a[size_t(j)] = 0.5 * z * (1.0 + std::erf(z / std::sqrt(2.0)));
      }
      for (int o = 0; o < H; ++o) {
        double acc = w.b2[size_t(o)];
        for (int j = 0; j < Hd; ++j) acc += double(w.w2[size_t(o) * Hd + j]) * a[size_t(j)];
        out[size_t(t) * H + o] = acc;
      }
    }
  }
  return out;
}

fs::path fresh_dir(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("kvzap_test_surrogate_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

void write_text(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << text;
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Expects load(dir) to throw a kvzap::Error whose message names the folder and contains `needle`.
void expect_load_error(const fs::path& dir, const std::string& needle) {
  try {
    Surrogate::load(dir.string());
    FAIL() << "expected an error containing '" << needle << "'";
  } catch (const kvzap::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(dir.string()), std::string::npos) << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
  }
}

// A hand-built safetensors file (independent of the project's writer): one I32 tensor.
void write_i32_safetensors(const fs::path& p, const std::string& name, int64_t rows, int64_t cols) {
  const std::string header = "{\"" + name + "\":{\"dtype\":\"I32\",\"shape\":[" + std::to_string(rows) + "," +
                             std::to_string(cols) + "],\"data_offsets\":[0," + std::to_string(rows * cols * 4) + "]}}";
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  const uint64_t n = header.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << header;
  const std::vector<int32_t> zeros(size_t(rows * cols), 0);
  out.write(reinterpret_cast<const char*>(zeros.data()), std::streamsize(zeros.size() * 4));
}

}  // namespace

TEST(DenseKernels, GemmMatchesNaiveForOddShapes) {
  std::mt19937 rng(1);
  for (const auto& [M, N, K] : std::vector<std::tuple<int, int, int>>{{1, 1, 1}, {7, 19, 13}, {4, 16, 33},
                                                                      {9, 40, 5}, {1, 72, 576}, {12, 3, 70}}) {
    const std::vector<float> A = random_vec(rng, size_t(M) * K, 1.0f);
    const std::vector<float> B = random_vec(rng, size_t(K) * N, 1.0f);
    std::vector<float> Bt(size_t(N) * K);
    for (int k = 0; k < K; ++k)
      for (int j = 0; j < N; ++j) Bt[size_t(j) * K + k] = B[size_t(k) * N + j];
    const std::vector<float> C0 = random_vec(rng, size_t(M) * N, 1.0f);
    std::vector<float> c_nn = C0, c_nt = C0, c_set(size_t(M) * N, 7.0f);
    std::vector<double> Ad(A.begin(), A.end()), Bd(B.begin(), B.end()), cd(C0.begin(), C0.end());
    kvzap::dense::gemm_nn(M, N, K, A.data(), K, B.data(), N, c_nn.data(), N, true);
    kvzap::dense::gemm_nt(M, N, K, A.data(), K, Bt.data(), K, c_nt.data(), N, true);
    kvzap::dense::gemm_nn(M, N, K, A.data(), K, B.data(), N, c_set.data(), N, false);
    kvzap::dense::gemm_nn(M, N, K, Ad.data(), K, Bd.data(), N, cd.data(), N, true);
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j) {
        double ref = 0.0;
        for (int k = 0; k < K; ++k) ref += double(A[size_t(i) * K + k]) * B[size_t(k) * N + j];
        const size_t ij = size_t(i) * N + j;
        const double tol = 1e-5 * (1.0 + std::sqrt(double(K)));
        EXPECT_NEAR(c_nn[ij], C0[ij] + ref, tol);
        EXPECT_NEAR(c_nt[ij], C0[ij] + ref, tol);
        EXPECT_NEAR(c_set[ij], ref, tol);
        EXPECT_NEAR(cd[ij], C0[ij] + ref, 1e-12 * (1.0 + K));
      }
  }
}

TEST(DenseKernels, GeluIsExactErfForm) {
  for (double x : {-6.0, -1.5, -0.1, 0.0, 0.3, 2.0, 7.0}) {
    const double ref = 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
    EXPECT_NEAR(kvzap::dense::gelu(x), ref, 1e-15);
    EXPECT_NEAR(kvzap::dense::gelu(float(x)), ref, 1e-6);
    const double h = 1e-6;
    const double fd = (kvzap::dense::gelu(x + h) - kvzap::dense::gelu(x - h)) / (2 * h);
    EXPECT_NEAR(kvzap::dense::gelu_grad(x), fd, 1e-8);
  }
  // tanh approximation differs by ~1e-3 near |x| = 2: make sure we are not using it.
  const double x = 2.0, tanh_form = 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
  EXPECT_GT(std::abs(kvzap::dense::gelu(x) - tanh_form), 1e-5);
}

TEST(DenseKernels, VectorisedGeluStaysWithin3e7OfErf) {
  std::vector<float> x;
  for (int i = -4000; i <= 4000; ++i) x.push_back(float(i) * 0.0025f);  // [-10, 10]
  for (float big : {-90.f, -30.f, 30.f, 1e4f}) x.push_back(big);
  std::vector<float> y = x;
  kvzap::dense::gelu_inplace(y.data(), int64_t(y.size()));
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double ref = 0.5 * double(x[i]) * (1.0 + std::erf(double(x[i]) / std::sqrt(2.0)));
    worst = std::max(worst, std::abs(double(y[i]) - ref) / std::max(1.0, std::abs(ref)));
  }
  EXPECT_LT(worst, 3e-7);
}

TEST(Surrogate, LinearAndMlpPredictMatchReference) {
  // Every ISA path (AVX-512 kernels, AVX2 / baseline clones) against the double reference, and the
  // paths against each other (hidden 72 and 112 are the real models' widths: masked AVX-512 tails).
  kvzap::test::IsaGuard guard;
  const std::vector<Isa> isas = kvzap::test::available_isas();
  std::mt19937 rng(7);
  for (int Hd : {0, 72, 112, 5}) {
    const Surrogate s = make_surrogate(3, 576, Hd, 3, 11u + uint32_t(Hd));
    EXPECT_EQ(s.is_mlp(), Hd > 0);
    for (int64_t n : {1, 5, 37}) {
      const std::vector<float> h = random_vec(rng, size_t(n) * 576, 1.0f);
      std::vector<float> first;
      for (Isa isa : isas) {
        set_active_isa(isa);
        std::vector<float> out(size_t(n) * 3 * s.n_layers(), -99.0f), scratch(size_t(s.scratch_floats(n)) + 1);
        for (int l = 0; l < s.n_layers(); ++l) {
          s.predict(l, h.data(), n, out.data() + l * n * 3, scratch.data());
          const std::vector<double> ref = reference_predict(s, l, h.data(), n);
          for (size_t i = 0; i < ref.size(); ++i)
            ASSERT_NEAR(out[l * n * 3 + i], ref[i], 1e-4 * (1 + std::abs(ref[i]))) << isa_name(isa) << " Hd " << Hd;
        }
        // Tokens are independent: one at a time gives the same bits as all in one call (the AVX-512 kernels
        // tile 4 tokens together; predict_threaded relies on this).
        std::vector<float> one(3);
        for (int l = 0; l < s.n_layers(); ++l)
          for (int64_t t = 0; t < n; ++t) {
            s.predict(l, h.data() + t * 576, 1, one.data(), scratch.data());
            for (int j = 0; j < 3; ++j) ASSERT_EQ(one[j], out[(l * n + t) * 3 + j]) << isa_name(isa) << " token " << t;
          }
        if (first.empty()) first = out;
        for (size_t i = 0; i < out.size(); ++i)
          ASSERT_NEAR(out[i], first[i], 1e-5 * (1 + std::abs(first[i]))) << isa_name(isa) << " vs " << isa_name(isas[0]);
      }
    }
  }
}

TEST(Surrogate, ConstructorRejectsWrongSizes) {
  std::vector<SurrogateLayerWeights> layers(1);
  layers[0].w1.assign(3 * 8, 0.0f);
  layers[0].b1.assign(2, 0.0f);  // should be 3
  EXPECT_THROW(Surrogate(8, 3, 0, layers), kvzap::Error);
  layers[0].b1.assign(3, 0.0f);
  EXPECT_NO_THROW(Surrogate(8, 3, 0, layers));
  EXPECT_THROW(Surrogate(8, 3, 4, layers), kvzap::Error);  // MLP needs w2/b2
  EXPECT_THROW(Surrogate(8, 3, 0, {}), kvzap::Error);
}

TEST(Surrogate, SaveLoadRoundTripIsExact) {
  std::mt19937 rng(3);
  for (int Hd : {0, 9}) {
    const Surrogate s = make_surrogate(4, 24, Hd, 2, 5);
    const fs::path dir = fresh_dir("rt" + std::to_string(Hd));
    s.save(dir.string());
    // kvpress config fields.
    const std::string cfg = read_text(dir / "config.json");
    EXPECT_NE(cfg.find("\"model_type\": \"kvzap\""), std::string::npos) << cfg;
    EXPECT_NE(cfg.find("\"n_modules\": 4"), std::string::npos) << cfg;
    EXPECT_NE(cfg.find(Hd ? "\"hidden_dim\": 9" : "\"hidden_dim\": null"), std::string::npos) << cfg;
    EXPECT_NE(cfg.find("KVzapModel"), std::string::npos) << cfg;
    const auto st = kvzap::SafetensorsFile::open((dir / "model.safetensors").string());
    EXPECT_EQ(st->metadata().value("format", ""), "pt");
    EXPECT_EQ(st->tensors().size(), size_t(Hd ? 16 : 8));
    const auto* w = st->find(Hd ? "layers.3.2.weight" : "layers.3.weight");
    ASSERT_NE(w, nullptr);
    EXPECT_EQ(w->shape, (std::vector<int64_t>{2, Hd ? 9 : 24}));
    EXPECT_EQ(w->dtype, "F32");

    const auto back = Surrogate::load(dir.string());
    ASSERT_EQ(back->n_layers(), 4);
    EXPECT_EQ(back->input_dim(), 24);
    EXPECT_EQ(back->output_dim(), 2);
    EXPECT_EQ(back->hidden_dim(), Hd);
    for (int l = 0; l < 4; ++l) {
      EXPECT_EQ(back->layer(l).w1, s.layer(l).w1);
      EXPECT_EQ(back->layer(l).b1, s.layer(l).b1);
      EXPECT_EQ(back->layer(l).w2, s.layer(l).w2);
      EXPECT_EQ(back->layer(l).b2, s.layer(l).b2);
    }
    fs::remove_all(dir);
  }
}

TEST(Surrogate, LoadsBf16Weights) {
  const Surrogate s = make_surrogate(2, 16, 4, 3, 9);
  const fs::path dir = fresh_dir("bf16");
  s.save(dir.string());
  // Rewrite the weights in BF16 with the same names and shapes.
  std::vector<kvzap::TensorToWrite> t;
  for (int l = 0; l < 2; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    t.push_back({p + "0.weight", "BF16", {4, 16}, s.layer(l).w1});
    t.push_back({p + "0.bias", "BF16", {4}, s.layer(l).b1});
    t.push_back({p + "2.weight", "BF16", {3, 4}, s.layer(l).w2});
    t.push_back({p + "2.bias", "BF16", {3}, s.layer(l).b2});
  }
  kvzap::write_safetensors((dir / "model.safetensors").string(), t, {{"format", "pt"}});
  const auto back = Surrogate::load(dir.string());
  for (int l = 0; l < 2; ++l)
    for (size_t i = 0; i < s.layer(l).w1.size(); ++i)
      EXPECT_EQ(back->layer(l).w1[i], kvzap::bf16_to_fp32(kvzap::fp32_to_bf16(s.layer(l).w1[i])));
  fs::remove_all(dir);
}

TEST(Surrogate, CorruptFoldersGiveClearErrors) {
  const Surrogate lin = make_surrogate(3, 8, 0, 2, 1);
  const Surrogate mlp = make_surrogate(3, 8, 4, 2, 2);
  const fs::path dir = fresh_dir("corrupt");
  const std::string good_cfg_lin = [&] {
    lin.save(dir.string());
    return read_text(dir / "config.json");
  }();
  auto reset = [&](const Surrogate& s) {
    fs::remove_all(dir);
    s.save(dir.string());
  };
  auto patch_cfg = [&](const std::string& from, const std::string& to) {
    std::string c = read_text(dir / "config.json");
    const size_t at = c.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    c.replace(at, from.size(), to);
    write_text(dir / "config.json", c);
  };

  expect_load_error(dir / "nonexistent", "not a directory");

  reset(lin);
  fs::remove(dir / "config.json");
  expect_load_error(dir, "missing config.json");

  reset(lin);
  fs::remove(dir / "model.safetensors");
  expect_load_error(dir, "missing model.safetensors");

  reset(lin);
  write_text(dir / "config.json", "{ not json");
  expect_load_error(dir, "not a JSON object");

  reset(lin);
  patch_cfg("\"kvzap\"", "\"llama\"");
  expect_load_error(dir, "model_type is \"llama\"");

  reset(lin);
  patch_cfg("\"input_dim\": 8,", "");
  expect_load_error(dir, "lacks \"input_dim\"");

  reset(lin);
  patch_cfg("\"output_dim\": 2", "\"output_dim\": -2");
  expect_load_error(dir, "\"output_dim\" must be a positive integer");

  reset(lin);
  patch_cfg("\"input_dim\": 8", "\"input_dim\": 9");
  expect_load_error(dir, "tensor 'layers.0.weight' has shape [2, 8], expected [2, 9]");

  reset(lin);
  patch_cfg("\"n_modules\": 3", "\"n_modules\": 4");
  expect_load_error(dir, "lacks tensor 'layers.3.weight'");

  reset(lin);
  patch_cfg("\"n_modules\": 3", "\"n_modules\": 2");
  expect_load_error(dir, "n_modules=2 but model.safetensors has tensor 'layers.2.");

  reset(mlp);  // MLP weights, config claims linear
  patch_cfg("\"hidden_dim\": 4", "\"hidden_dim\": null");
  expect_load_error(dir, "lacks tensor 'layers.0.weight'");

  reset(lin);  // linear weights, config claims MLP
  patch_cfg("\"hidden_dim\": null", "\"hidden_dim\": 4");
  expect_load_error(dir, "lacks tensor 'layers.0.0.weight'");

  reset(lin);  // an extra tensor that belongs to nothing
  {
    std::vector<kvzap::TensorToWrite> t;
    for (int l = 0; l < 3; ++l) {
      t.push_back({"layers." + std::to_string(l) + ".weight", "F32", {2, 8}, lin.layer(l).w1});
      t.push_back({"layers." + std::to_string(l) + ".bias", "F32", {2}, lin.layer(l).b1});
    }
    t.push_back({"scale", "F32", {1}, {1.0f}});
    kvzap::write_safetensors((dir / "model.safetensors").string(), t);
  }
  expect_load_error(dir, "unexpected tensor 'scale'");

  reset(lin);  // integer tensor
  write_text(dir / "config.json", good_cfg_lin);
  patch_cfg("\"n_modules\": 3", "\"n_modules\": 1");
  write_i32_safetensors(dir / "model.safetensors", "layers.0.weight", 2, 8);
  expect_load_error(dir, "dtype I32");

  reset(lin);  // non-finite weight
  {
    std::vector<kvzap::TensorToWrite> t;
    for (int l = 0; l < 3; ++l) {
      std::vector<float> w = lin.layer(l).w1;
      if (l == 1) w[3] = std::nanf("");
      t.push_back({"layers." + std::to_string(l) + ".weight", "F32", {2, 8}, w});
      t.push_back({"layers." + std::to_string(l) + ".bias", "F32", {2}, lin.layer(l).b1});
    }
    kvzap::write_safetensors((dir / "model.safetensors").string(), t);
  }
  expect_load_error(dir, "non-finite");

  reset(lin);  // truncated safetensors: the format reader's error names the file inside the folder
  {
    const std::string bytes = read_text(dir / "model.safetensors");
    write_text(dir / "model.safetensors", bytes.substr(0, bytes.size() / 2));
  }
  EXPECT_THROW(Surrogate::load(dir.string()), kvzap::Error);
  fs::remove_all(dir);
}

// Writes an exported folder, inputs and engine predictions for tests/python/check_surrogate_roundtrip.py
// into $KVZAP_ROUNDTRIP_DIR (a temp dir when unset, where the files are only re-read here).
TEST(Surrogate, ExportForPythonRoundTrip) {
  const char* env = std::getenv("KVZAP_ROUNDTRIP_DIR");
  const fs::path root = env && *env ? fs::path(env) : fresh_dir("py_roundtrip");
  fs::create_directories(root);
  std::mt19937 rng(21);
  const int64_t n = 33;
  const int L = 3, D = 576, H = 3;
  const std::vector<float> h = random_vec(rng, size_t(n) * L * D, 1.0f);  // [L][n][D]
  for (const auto& [name, Hd] : std::vector<std::pair<std::string, int>>{{"linear", 0}, {"mlp", 72}}) {
    const Surrogate s = make_surrogate(L, D, Hd, H, Hd ? 100u : 200u);
    s.save((root / name).string());
    const auto back = Surrogate::load((root / name).string());
    std::vector<float> pred(size_t(L) * n * H), scratch(size_t(back->scratch_floats(n)) + 1);
    for (int l = 0; l < L; ++l) back->predict(l, h.data() + size_t(l) * n * D, n, pred.data() + size_t(l) * n * H, scratch.data());
    std::ofstream(root / (name + "_pred.f32"), std::ios::binary)
        .write(reinterpret_cast<const char*>(pred.data()), std::streamsize(pred.size() * 4));
    for (int l = 0; l < L; ++l) {
      const std::vector<double> ref = reference_predict(s, l, h.data() + size_t(l) * n * D, n);
      for (size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(pred[size_t(l) * n * H + i], ref[i], 1e-4 * (1 + std::abs(ref[i])));
    }
  }
  std::ofstream(root / "inputs.f32", std::ios::binary)
      .write(reinterpret_cast<const char*>(h.data()), std::streamsize(h.size() * 4));
  write_text(root / "meta.json", "{\"n_tok\": " + std::to_string(n) + ", \"n_layers\": " + std::to_string(L) +
                                     ", \"input_dim\": " + std::to_string(D) + ", \"output_dim\": " + std::to_string(H) + "}\n");
  EXPECT_EQ(fs::file_size(root / "inputs.f32"), size_t(n) * L * D * 4);
  if (!(env && *env)) fs::remove_all(root);
}
