// Float-weight matmul kernels (F32, F16, BF16; gemm_float_avx512.cpp, gemm_float_avx2.cpp) against the
// scalar reference: bit-exact on every ISA, on the decode (GEMV) and the prefill (tile) paths, for odd
// sizes (n_in not a multiple of 16 / 32, rows not a multiple of the tile, 1..7 tokens), padded row strides
// and thread counts; activations rounded to the weight type as ggml's vec_dot_type; vdpbf16ps's order.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/fp16.h"
#include "kernels/matmul.h"
#include "kernels/quant_blocks.h"
#include "kernels/quant_ref.h"
#include "test_support.h"

using namespace kvzap;
namespace kk = kvzap::kernels;

namespace {

using kvzap::test::available_isas;
using kvzap::test::IsaGuard;

const GgmlType kFloatTypes[] = {GgmlType::F32, GgmlType::F16, GgmlType::BF16};

size_t elem_bytes(GgmlType t) { return t == GgmlType::F32 ? 4 : 2; }

// n_out rows of n_in values of type t, row_stride bytes apart (>= the row's bytes; the gap is filled with
// garbage the kernels must not read), from N(0, sigma) with some exact zeros and negative zeros.
std::vector<uint8_t> float_rows(GgmlType t, int64_t n_out, int64_t n_in, size_t row_stride, std::mt19937& rng,
                                float sigma) {
  std::normal_distribution<float> nd(0.f, sigma);
  std::vector<uint8_t> data(row_stride * (size_t)n_out + 64, 0xA5);  // 0xA5A5: a NaN-free finite pattern
  std::vector<float> row((size_t)n_in);
  for (int64_t o = 0; o < n_out; ++o) {
    for (int64_t i = 0; i < n_in; ++i) row[(size_t)i] = (i * 7 + o) % 23 == 0 ? ((i & 1) ? -0.f : 0.f) : nd(rng);
    quantize_row(t, row.data(), data.data() + (size_t)o * row_stride, n_in);
  }
  return data;
}

// The reference: activations prepared as quantize_activation_ref does, then vec_dot_ref per output.
std::vector<float> reference(const WeightMatrix& w, const std::vector<float>& x, int64_t n_tok) {
  std::vector<float> act((size_t)w.n_in), y((size_t)(n_tok * w.n_out));
  for (int64_t t = 0; t < n_tok; ++t) {
    kk::quantize_activation_ref(w.type, x.data() + t * w.n_in, act.data(), w.n_in);
    for (int64_t o = 0; o < w.n_out; ++o)
      y[(size_t)(t * w.n_out + o)] = kk::vec_dot_ref(w.type, w.data + (size_t)o * w.row_stride, act.data(), w.n_in);
  }
  return y;
}

std::string bits_where(const std::vector<float>& y, const std::vector<float>& ref) {
  for (size_t i = 0; i < y.size(); ++i) {
    if (std::memcmp(&y[i], &ref[i], 4) != 0)
      return "first difference at " + std::to_string(i) + ": " + std::to_string(y[i]) + " vs " + std::to_string(ref[i]);
  }
  return "";
}

class MatmulFloat : public ::testing::TestWithParam<GgmlType> {};

TEST_P(MatmulFloat, BitExactWithTheReferenceOnEveryIsaAndPath) {
  const GgmlType t = GetParam();
  std::mt19937 rng(300 + (int)t);
  struct Shape { int64_t n_in, n_out; size_t extra_stride; };
  // n_in around the 16 / 32-element steps and tails; n_out around the 2- and 4-row tiles.
  const Shape shapes[] = {{1, 3, 0},   {7, 5, 0},   {15, 4, 0},  {16, 9, 0},  {17, 7, 2},  {31, 2, 0},
                          {32, 13, 0}, {33, 6, 4},  {47, 1, 0},  {100, 11, 0}, {257, 5, 6}, {896, 37, 0}};
  const int64_t kToks[] = {1, 2, 3, 4, 5, 6, 7, 64};
  IsaGuard guard;
  for (const Shape& s : shapes) {
    const size_t stride = (size_t)s.n_in * elem_bytes(t) + s.extra_stride * elem_bytes(t);
    const auto data = float_rows(t, s.n_out, s.n_in, stride, rng, 0.05f);
    const WeightMatrix w{t, data.data(), s.n_in, s.n_out, stride};
    std::vector<float> x = [&] {
      std::normal_distribution<float> nd(0.f, 1.f);
      std::vector<float> v((size_t)(64 * s.n_in));
      for (size_t i = 0; i < v.size(); ++i) v[i] = nd(rng) * (i % 5 == 0 ? 30.f : 1.f);
      return v;
    }();
    const auto ref = reference(w, x, 64);
    for (Isa isa : available_isas()) {
      set_active_isa(isa);
      for (int64_t n_tok : kToks) {
        for (int nth : {1, 2}) {
          ThreadPool pool(nth);
          MatmulScratch scratch;
          scratch.reserve(n_tok, s.n_in, nth);
          std::vector<float> y((size_t)(n_tok * s.n_out), NAN);
          matmul(w, x.data(), n_tok, y.data(), pool, scratch);
          const std::vector<float> want(ref.begin(), ref.begin() + n_tok * s.n_out);
          ASSERT_EQ(0, std::memcmp(y.data(), want.data(), y.size() * sizeof(float)))
              << type_name(t) << " " << isa_name(isa) << " n_in=" << s.n_in << " n_out=" << s.n_out
              << " stride+" << s.extra_stride << " n_tok=" << n_tok << " threads=" << nth << ": " << bits_where(y, want);
        }
      }
      // Decode: each token alone (the GEMV path) gives the bits of the batched tiles.
      ThreadPool pool(1);
      MatmulScratch scratch;
      std::vector<float> y1((size_t)(64 * s.n_out));
      for (int64_t tok = 0; tok < 64; ++tok) matmul(w, x.data() + tok * s.n_in, 1, y1.data() + tok * s.n_out, pool, scratch);
      ASSERT_EQ(0, std::memcmp(y1.data(), ref.data(), y1.size() * sizeof(float)))
          << type_name(t) << " " << isa_name(isa) << " n_in=" << s.n_in << " decode: " << bits_where(y1, ref);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, MatmulFloat, ::testing::ValuesIn(kFloatTypes),
                         [](const auto& info) { return std::string(type_name(info.param)); });

// y = x W^T with W the identity (weights exactly 1): y[t][j] is the prepared activation j itself, so every
// ISA must round the activations exactly as ggml's vec_dot_type does (F16: fp32_to_fp16, BF16:
// fp32_to_bf16, F32: not at all), ties to even included, on both paths.
TEST(MatmulFloatActivations, RoundedToTheWeightTypeAsGgml) {
  const int64_t n = 40;  // two 16-lane steps and a tail; one 32-element step and a tail
  std::mt19937 rng(21);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x((size_t)(2 * n));
  for (auto& v : x) v = nd(rng);
  const float specials[] = {1.f + 0x1p-11f, 1.f + 3 * 0x1p-11f, -(1.f + 0x1p-11f),  // f16 ties -> even
                            1.f + 0x1p-8f,  1.f + 3 * 0x1p-8f,  -(1.f + 0x1p-8f),   // bf16 ties -> even
                            65519.f,        1e-6f,              -7e-8f,             // f16: rounds to max; subnormals
                            12345.678f,     1.f + 0x1p-23f,     0.f};
  // (No value that rounds to inf: 0 * inf in the other rows would make them NaN.)
  for (size_t i = 0; i < sizeof(specials) / sizeof(specials[0]); ++i) {
    x[3 + i] = specials[i];
    x[(size_t)n + 20 + i] = specials[i];
  }
  for (GgmlType t : kFloatTypes) {
    const size_t eb = elem_bytes(t);
    std::vector<uint8_t> data(eb * (size_t)(n * n), 0);
    std::vector<float> one_hot((size_t)n);
    for (int64_t j = 0; j < n; ++j) {
      std::fill(one_hot.begin(), one_hot.end(), 0.f);
      one_hot[(size_t)j] = 1.f;
      quantize_row(t, one_hot.data(), data.data() + (size_t)j * n * eb, n);
    }
    const WeightMatrix w{t, data.data(), n, n, (size_t)n * eb};
    IsaGuard guard;
    for (Isa isa : available_isas()) {
      set_active_isa(isa);
      ThreadPool pool(1);
      MatmulScratch scratch;
      std::vector<float> y((size_t)(2 * n)), y1((size_t)n);
      matmul(w, x.data(), 2, y.data(), pool, scratch);       // prefill path
      matmul(w, x.data() + n, 1, y1.data(), pool, scratch);  // decode path
      for (int64_t tok = 0; tok < 2; ++tok) {
        for (int64_t j = 0; j < n; ++j) {
          const float v = x[(size_t)(tok * n + j)];
          const float want = t == GgmlType::F16 ? fp16_to_fp32(fp32_to_fp16(v))
                             : t == GgmlType::BF16 ? bf16_to_fp32(fp32_to_bf16(v)) : v;
          const float got = y[(size_t)(tok * n + j)];
          ASSERT_EQ(std::memcmp(&got, &want, 4), 0)
              << type_name(t) << " " << isa_name(isa) << " token " << tok << " j " << j << ": x " << v << " gave " << got
              << ", want " << want;
          if (tok == 1) {
            ASSERT_EQ(std::memcmp(&y1[(size_t)j], &want, 4), 0) << type_name(t) << " " << isa_name(isa) << " decode j " << j;
          }
        }
      }
    }
  }
}

// vdpbf16ps adds the odd element's product before the even one's. Lane 0 sees elements 0, 1 (step 1) and
// 32, 33 (step 2): with products 1, 2^24, 1, -2^24 the odd-first order gives 2^24, 2^24 (tie to even), 0,
// 1; even-first would give 1, 2^24, 2^24, 0. Every ISA and path must give 1.
TEST(MatmulFloatActivations, Bf16AddsOddThenEvenProducts) {
  const int64_t n = 64;
  std::vector<float> x((size_t)n, 0.f);
  x[0] = 1.f;
  x[1] = 0x1p24f;
  x[32] = 1.f;
  x[33] = -0x1p24f;
  std::vector<float> ones((size_t)n, 1.f);
  std::vector<uint8_t> data((size_t)n * 2 * 2);
  quantize_row(GgmlType::BF16, ones.data(), data.data(), n);
  quantize_row(GgmlType::BF16, ones.data(), data.data() + n * 2, n);
  const WeightMatrix w{GgmlType::BF16, data.data(), n, 2, (size_t)n * 2};
  std::vector<float> act((size_t)n);
  kk::quantize_activation_ref(GgmlType::BF16, x.data(), act.data(), n);
  EXPECT_EQ(kk::vec_dot_ref(GgmlType::BF16, data.data(), act.data(), n), 1.f);
  std::vector<float> x2 = x;
  x2.insert(x2.end(), x.begin(), x.end());
  IsaGuard guard;
  for (Isa isa : available_isas()) {
    set_active_isa(isa);
    ThreadPool pool(1);
    MatmulScratch scratch;
    std::vector<float> y(4), y1(2);
    matmul(w, x2.data(), 2, y.data(), pool, scratch);
    matmul(w, x.data(), 1, y1.data(), pool, scratch);
    for (float v : y) EXPECT_EQ(v, 1.f) << isa_name(isa) << " prefill";
    for (float v : y1) EXPECT_EQ(v, 1.f) << isa_name(isa) << " decode";
  }
}

}  // namespace
