// Kernels: block layouts (dequantize vs a per-element formula written from the format description),
// reference quantizers (round trip error), activation quantizers (formula), matmul on every available
// ISA against (a) a reference using the same Q8 activation quantization and (b) pure float, odd sizes,
// thread counts, bit-identical results across thread counts and batch sizes, vector helpers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/fp16.h"
#include "kernels/matmul.h"
#include "kernels/quant_blocks.h"
#include "kernels/kernel_table.h"
#include "kernels/quant_ref.h"
#include "kvzap/error.h"
#include "test_support.h"

using namespace kvzap;
namespace kk = kvzap::kernels;

namespace {

const GgmlType kAllTypes[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q4_0,
                              GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0,
                              GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};

bool is_k(GgmlType t) { return t == GgmlType::Q4_K || t == GgmlType::Q5_K || t == GgmlType::Q6_K; }
bool is_float(GgmlType t) { return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16; }

using kvzap::test::available_isas;
using kvzap::test::IsaGuard;

uint16_t u16_at(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
float h_at(const uint8_t* p) { return fp16_to_fp32(u16_at(p)); }
void put_h(uint8_t* p, float f) {
  const uint16_t h = fp32_to_fp16(f);
  std::memcpy(p, &h, 2);
}

std::vector<float> gaussian(std::mt19937& rng, size_t n, float sigma = 1.0f) {
  std::normal_distribution<float> nd(0.f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

// Random but valid rows: random payload bytes, sane fp16 scales (no inf/NaN).
std::vector<uint8_t> random_blocks(GgmlType t, int64_t n_rows, int64_t n_in, std::mt19937& rng) {
  const size_t rb = kk::kernel_row_bytes(t, n_in);
  std::vector<uint8_t> data(rb * (size_t)n_rows);
  if (is_float(t)) {
    const auto f = gaussian(rng, (size_t)(n_rows * n_in));
    for (int64_t r = 0; r < n_rows; ++r) quantize_row(t, f.data() + r * n_in, data.data() + r * rb, n_in);
    return data;
  }
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(0.002f, 0.05f), sign(-1.f, 1.f);
  for (auto& b : data) b = (uint8_t)byte(rng);
  const int bb = kk::geometry(t).block_bytes;
  for (size_t off = 0; off < data.size(); off += (size_t)bb) {
    uint8_t* blk = data.data() + off;
    switch (t) {
      case GgmlType::Q4_0: case GgmlType::Q5_0: case GgmlType::Q8_0:
        put_h(blk, sign(rng) < 0 ? -scale(rng) : scale(rng));
        break;
      case GgmlType::Q4_1: case GgmlType::Q5_1:
        put_h(blk, scale(rng));
        put_h(blk + 2, -0.3f * scale(rng) * 20);
        break;
      case GgmlType::Q4_K: case GgmlType::Q5_K:
        put_h(blk, scale(rng) * 0.1f);
        put_h(blk + 2, scale(rng) * 0.1f);
        break;
      case GgmlType::Q6_K:
        put_h(blk + 208, scale(rng) * 0.1f);
        break;
      default: break;
    }
  }
  return data;
}

// ---- per-element formulas, written from the block layouts (ggml-common.h), not from the kernels

void k4_scale_min(const uint8_t* s, int j, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

float element(GgmlType t, const uint8_t* row, int64_t i) {
  switch (t) {
    case GgmlType::F32: { float f; std::memcpy(&f, row + 4 * i, 4); return f; }
    case GgmlType::F16: return h_at(row + 2 * i);
    case GgmlType::BF16: return bf16_to_fp32(u16_at(row + 2 * i));
    default: break;
  }
  if (!is_k(t)) {
    const int64_t b = i / 32;
    const int j = (int)(i % 32);
    const int nib_shift = j < 16 ? 0 : 4;
    switch (t) {
      case GgmlType::Q4_0: {
        const uint8_t* blk = row + b * 18;
        return h_at(blk) * (float)(((blk[2 + j % 16] >> nib_shift) & 15) - 8);
      }
      case GgmlType::Q4_1: {
        const uint8_t* blk = row + b * 20;
        return h_at(blk) * (float)((blk[4 + j % 16] >> nib_shift) & 15) + h_at(blk + 2);
      }
      case GgmlType::Q5_0: {
        const uint8_t* blk = row + b * 22;
        uint32_t qh;
        std::memcpy(&qh, blk + 2, 4);
        const int q = ((blk[6 + j % 16] >> nib_shift) & 15) | (int)(((qh >> j) & 1) << 4);
        return h_at(blk) * (float)(q - 16);
      }
      case GgmlType::Q5_1: {
        const uint8_t* blk = row + b * 24;
        uint32_t qh;
        std::memcpy(&qh, blk + 4, 4);
        const int q = ((blk[8 + j % 16] >> nib_shift) & 15) | (int)(((qh >> j) & 1) << 4);
        return h_at(blk) * (float)q + h_at(blk + 2);
      }
      case GgmlType::Q8_0: {
        const uint8_t* blk = row + b * 34;
        return h_at(blk) * (float)(int8_t)blk[2 + j];
      }
      default: return NAN;
    }
  }
  const int64_t b = i / 256;
  const int j = (int)(i % 256);
  switch (t) {
    case GgmlType::Q4_K: case GgmlType::Q5_K: {
      const bool q5 = t == GgmlType::Q5_K;
      const uint8_t* blk = row + b * (q5 ? 176 : 144);
      const int g = j / 64, w = j % 64, l = w % 32, sub = j / 32;
      const uint8_t* qs = blk + (q5 ? 48 : 16);
      int q = (w < 32 ? qs[32 * g + l] : qs[32 * g + l] >> 4) & 15;
      if (q5) q += 16 * ((blk[16 + l] >> sub) & 1);
      int sc, m;
      k4_scale_min(blk + 4, sub, &sc, &m);
      return h_at(blk) * (float)sc * (float)q - h_at(blk + 2) * (float)m;
    }
    case GgmlType::Q6_K: {
      const uint8_t* blk = row + b * 210;
      const int h = j / 128, r = j % 128, quarter = r / 32, l = r % 32;
      const uint8_t* ql = blk + 64 * h;
      const uint8_t qh = blk[128 + 32 * h + l];
      const int lo = quarter == 0 ? ql[l] & 15 : quarter == 1 ? ql[l + 32] & 15 : quarter == 2 ? ql[l] >> 4 : ql[l + 32] >> 4;
      const int hi = (qh >> (2 * quarter)) & 3;
      const int sc = (int8_t)blk[192 + 8 * h + l / 16 + 2 * quarter];
      return h_at(blk + 208) * (float)sc * (float)((lo | (hi << 4)) - 32);
    }
    default: return NAN;
  }
}

WeightMatrix make_matrix(GgmlType t, const std::vector<uint8_t>& data, int64_t n_out, int64_t n_in) {
  WeightMatrix w;
  w.type = t;
  w.data = data.data();
  w.n_in = n_in;
  w.n_out = n_out;
  w.row_stride = kk::kernel_row_bytes(t, n_in);
  return w;
}

// Same Q8 activation quantization as the kernels, scalar block dots: the "exact-ish" reference.
std::vector<float> quantized_reference(const WeightMatrix& w, const std::vector<float>& x, int64_t n_tok) {
  const GgmlType p = kk::partner_type(w.type);
  const size_t ab = is_float(w.type) ? (size_t)w.n_in * 4 : kk::kernel_row_bytes(p, w.n_in);
  std::vector<uint8_t> act(ab);
  std::vector<float> y((size_t)(n_tok * w.n_out));
  for (int64_t t = 0; t < n_tok; ++t) {
    kk::quantize_activation_ref(w.type, x.data() + t * w.n_in, act.data(), w.n_in);
    for (int64_t o = 0; o < w.n_out; ++o)
      y[(size_t)(t * w.n_out + o)] = kk::vec_dot_ref(w.type, w.data + o * w.row_stride, act.data(), w.n_in);
  }
  return y;
}

// Per output: sum |w_i x_i| (scale for rounding tolerances) and a bound on the activation
// quantization error sum |w_i| * (d/2 + fp16 rounding of d), d = amax(block of x) / 127.
void error_scales(const WeightMatrix& w, const std::vector<float>& x, int64_t n_tok, std::vector<double>& mag,
                  std::vector<double>& qbound) {
  const int blk = is_float(w.type) ? 0 : (is_k(w.type) ? 256 : 32);
  std::vector<float> row((size_t)w.n_in);
  mag.assign((size_t)(n_tok * w.n_out), 0);
  qbound.assign((size_t)(n_tok * w.n_out), 0);
  for (int64_t o = 0; o < w.n_out; ++o) {
    dequantize_row(w.type, w.data + o * w.row_stride, row.data(), w.n_in);
    for (int64_t t = 0; t < n_tok; ++t) {
      const float* xt = x.data() + t * w.n_in;
      double m = 0, q = 0;
      for (int64_t b0 = 0; b0 < w.n_in; b0 += blk ? blk : w.n_in) {
        const int64_t b1 = blk ? b0 + blk : w.n_in;
        double amax = 0, wabs = 0, wmax = 0;
        for (int64_t i = b0; i < b1; ++i) {
          amax = std::max(amax, (double)std::fabs(xt[i]));
          m += std::fabs((double)row[(size_t)i] * xt[i]);
          wabs += std::fabs(row[(size_t)i]);
          wmax = std::max(wmax, (double)std::fabs(row[(size_t)i]));
        }
        // Q8_1's s = fp16(d * sum q) adds |m| * |s| * 2^-10 per block: covered by the 0.01 * n * max|w| term.
        if (blk) q += (wabs + (b1 - b0) * wmax * 0.01) * amax * (0.5 / 127 + 1.0 / 1024);
      }
      // F16 / BF16 weights round the activations to their type (ggml's vec_dot_type): relative error at
      // most 2^-11 / 2^-8, plus the f16 subnormal half-step 2^-25 absolute.
      if (w.type == GgmlType::F16 || w.type == GgmlType::BF16) {
        double wsum = 0;
        for (int64_t i = 0; i < w.n_in; ++i) wsum += std::fabs(row[(size_t)i]);
        q += m * (w.type == GgmlType::F16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8)) + wsum * std::ldexp(1.0, -25);
      }
      mag[(size_t)(t * w.n_out + o)] = m;
      qbound[(size_t)(t * w.n_out + o)] = q;
    }
  }
}

// ------------------------------------------------------------------------------------------------

TEST(KernelBlocks, DequantizeMatchesPerElementFormula) {
  std::mt19937 rng(1);
  for (GgmlType t : kAllTypes) {
    const int64_t n = is_k(t) ? 512 : 96;
    const auto data = random_blocks(t, 1, n, rng);
    std::vector<float> out((size_t)n);
    dequantize_row(t, data.data(), out.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      const float e = element(t, data.data(), i);
      ASSERT_NEAR(out[(size_t)i], e, 1e-6f * std::max(1.f, std::fabs(e))) << type_name(t) << " element " << i;
    }
  }
}

TEST(KernelBlocks, QuantizeRoundTripError) {
  std::mt19937 rng(2);
  struct Case { GgmlType t; double max_rel_rms; };
  const Case cases[] = {{GgmlType::F16, 1e-3},  {GgmlType::BF16, 5e-3}, {GgmlType::Q4_0, 0.15},
                        {GgmlType::Q4_1, 0.12}, {GgmlType::Q5_0, 0.07}, {GgmlType::Q5_1, 0.06},
                        {GgmlType::Q8_0, 0.01}, {GgmlType::Q4_K, 0.12}, {GgmlType::Q5_K, 0.06},
                        {GgmlType::Q6_K, 0.03}};
  const int64_t n = 1024;
  const auto x = gaussian(rng, n);
  for (const Case& c : cases) {
    std::vector<uint8_t> q(kk::kernel_row_bytes(c.t, n));
    std::vector<float> back((size_t)n);
    quantize_row(c.t, x.data(), q.data(), n);
    dequantize_row(c.t, q.data(), back.data(), n);
    double err = 0, ref = 0;
    for (int64_t i = 0; i < n; ++i) {
      err += (back[(size_t)i] - x[(size_t)i]) * (back[(size_t)i] - x[(size_t)i]);
      ref += x[(size_t)i] * x[(size_t)i];
    }
    const double rel = std::sqrt(err / ref);
    EXPECT_LT(rel, c.max_rel_rms) << type_name(c.t);
    EXPECT_GT(rel, 0.0) << type_name(c.t);  // a lossy format must not be the identity
  }
}

TEST(KernelBlocks, Q4_1QuantizerHitsMinAndMax) {
  // Block min maps to level 0 and the max to level 15 (values d*q + m).
  std::mt19937 rng(3);
  const auto x = gaussian(rng, 32);
  kk::BlockQ4_1 b;
  quantize_row(GgmlType::Q4_1, x.data(), &b, 32);
  const float mn = *std::min_element(x.begin(), x.end()), mx = *std::max_element(x.begin(), x.end());
  EXPECT_NEAR(fp16_to_fp32(b.m), mn, 1e-3f);
  EXPECT_NEAR(fp16_to_fp32(b.d) * 15 + fp16_to_fp32(b.m), mx, 1e-2f);
}

TEST(KernelBlocks, ActivationQuantizersFollowGgmlFormulas) {
  std::mt19937 rng(4);
  const auto x = gaussian(rng, 512, 3.f);
  std::vector<kk::BlockQ8_0> a0(16);
  std::vector<kk::BlockQ8_1> a1(16);
  std::vector<kk::BlockQ8_K> ak(2);
  kk::quantize_q8_0_ref(x.data(), a0.data(), 512);
  kk::quantize_q8_1_ref(x.data(), a1.data(), 512);
  kk::quantize_q8_K_ref(x.data(), ak.data(), 512);
  for (int b = 0; b < 16; ++b) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[(size_t)(32 * b + j)]));
    const float d = amax / 127;
    EXPECT_EQ(a0[(size_t)b].d, fp32_to_fp16(d));
    EXPECT_EQ(a1[(size_t)b].d, fp32_to_fp16(d));
    int sum = 0;
    for (int j = 0; j < 32; ++j) {
      // ggml's x86 quantizer: x * (127 / amax), round half to even
      const int q = (int)std::nearbyint(x[(size_t)(32 * b + j)] * (amax != 0.0f ? 127.0f / amax : 0.0f));
      EXPECT_EQ(a0[(size_t)b].qs[j], q);
      EXPECT_EQ(a1[(size_t)b].qs[j], q);
      sum += q;
    }
    EXPECT_EQ(a1[(size_t)b].s, fp32_to_fp16((float)sum * d));
  }
  for (int b = 0; b < 2; ++b) {
    float mx = 0;
    for (int j = 0; j < 256; ++j)
      if (std::fabs(x[(size_t)(256 * b + j)]) > std::fabs(mx)) mx = x[(size_t)(256 * b + j)];
    const float iscale = -127.f / mx;
    EXPECT_FLOAT_EQ(ak[(size_t)b].d, 1 / iscale);
    for (int j = 0; j < 256; ++j) {
      const int q = std::min(127, (int)std::nearbyint(iscale * x[(size_t)(256 * b + j)]));
      ASSERT_EQ(ak[(size_t)b].qs[j], q) << j;
    }
    for (int g = 0; g < 16; ++g) {
      int s = 0;
      for (int j = 0; j < 16; ++j) s += ak[(size_t)b].qs[16 * g + j];
      EXPECT_EQ(ak[(size_t)b].bsums[g], s);
    }
  }
}

TEST(KernelBlocks, RejectsBadLengths) {
  std::vector<float> x(100, 1.f);
  std::vector<uint8_t> buf(1000);
  EXPECT_THROW(quantize_row(GgmlType::Q4_0, x.data(), buf.data(), 33), Error);
  EXPECT_THROW(dequantize_row(GgmlType::Q4_K, buf.data(), x.data(), 64), Error);
  ThreadPool pool(1);
  MatmulScratch scratch;
  std::vector<uint8_t> w(2000);
  WeightMatrix m{GgmlType::Q4_1, w.data(), 40, 2, kk::kernel_row_bytes(GgmlType::Q4_1, 32)};
  EXPECT_THROW(matmul(m, x.data(), 1, x.data(), pool, scratch), Error);
}

TEST(KernelBlocks, Avx512Q8KActivationsAreBitExactWithTheReference) {
  if (detected_isa() < Isa::Avx512) GTEST_SKIP() << "SKIPPED: no AVX-512 on this CPU";
  const kk::MatmulKernel k = kk::avx512_kernel(GgmlType::Q4_K);
  ASSERT_TRUE(k && k.prepare_act);
  std::mt19937 rng(5);
  const int64_t n = 4 * 256;
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<float> x = gaussian(rng, (size_t)n, trial % 2 ? 3.0f : 0.01f);
    if (trial % 5 == 1) for (int i = 0; i < 256; ++i) x[(size_t)i] = 0.0f;  // an all-zero super-block
    if (trial % 5 == 2) { x[300] = 7.0f; x[301] = -7.0f; }               // +max before -max: sign of the first
    if (trial % 5 == 3) { x[600] = -7.0f; x[700] = 7.0f; }
    if (trial % 5 == 4) for (int i = 0; i < 64; ++i) x[(size_t)(768 + i)] = (float)(i - 32) * 0.5f;  // ties
    std::vector<uint8_t> act(k.act_row_bytes(n) + 64);
    k.prepare_act(x.data(), act.data(), n);
    std::vector<kk::BlockQ8_K> ref((size_t)n / 256);
    kk::quantize_q8_K_ref(x.data(), ref.data(), n);
    for (int64_t b = 0; b < n / 256; ++b) {
      const uint8_t* sb = act.data() + (size_t)b * 320;  // [qs 256][bsums 32][d]
      ASSERT_EQ(0, std::memcmp(sb, ref[(size_t)b].qs, 256)) << "trial " << trial << " block " << b;
      ASSERT_EQ(0, std::memcmp(sb + 256, ref[(size_t)b].bsums, 32)) << "trial " << trial << " block " << b;
      float d;
      std::memcpy(&d, sb + 288, 4);
      ASSERT_EQ(d, ref[(size_t)b].d) << "trial " << trial << " block " << b;
    }
  }
}

// ------------------------------------------------------------------------------------------------

struct MatmulCase {
  GgmlType type;
  int64_t n_in, n_out;
  bool quantized_from_floats;
};

void check_matmul_case(const MatmulCase& c, std::mt19937& rng) {
  const auto data = c.quantized_from_floats ? std::vector<uint8_t>() : random_blocks(c.type, c.n_out, c.n_in, rng);
  std::vector<uint8_t> qdata;
  if (c.quantized_from_floats) {
    const auto f = gaussian(rng, (size_t)(c.n_out * c.n_in), 0.05f);
    qdata.resize(kk::kernel_row_bytes(c.type, c.n_in) * (size_t)c.n_out);
    for (int64_t o = 0; o < c.n_out; ++o)
      quantize_row(c.type, f.data() + o * c.n_in, qdata.data() + o * kk::kernel_row_bytes(c.type, c.n_in), c.n_in);
  }
  const WeightMatrix w = make_matrix(c.type, c.quantized_from_floats ? qdata : data, c.n_out, c.n_in);
  const int64_t max_tok = 64;
  const auto x = gaussian(rng, (size_t)(max_tok * c.n_in));
  const auto yq = quantized_reference(w, x, max_tok);
  std::vector<float> yf((size_t)(max_tok * c.n_out));
  matmul_reference(w, x.data(), max_tok, yf.data());
  std::vector<double> mag, qbound;
  error_scales(w, x, max_tok, mag, qbound);

  IsaGuard guard;
  for (Isa isa : available_isas()) {
    set_active_isa(isa);
    ASSERT_EQ(active_isa(), isa);
    std::vector<float> y_single;  // n_tok = 1, one token at a time, 1 thread
    for (int64_t n_tok : {1, 3, 17, 64}) {
      std::vector<float> first;
      for (int nth : {1, 2, 3}) {
        ThreadPool pool(nth);
        MatmulScratch scratch;
        scratch.reserve(n_tok, c.n_in);
        std::vector<float> y((size_t)(n_tok * c.n_out), NAN);
        matmul(w, x.data(), n_tok, y.data(), pool, scratch);
        const std::string where = std::string(type_name(c.type)) + " " + isa_name(isa) + " n_in=" +
                                  std::to_string(c.n_in) + " n_out=" + std::to_string(c.n_out) +
                                  " n_tok=" + std::to_string(n_tok) + " threads=" + std::to_string(nth);
        for (size_t i = 0; i < y.size(); ++i) {
          const double exact_tol = 4e-6 * mag[i] + 1e-6;
          ASSERT_NEAR(y[i], yq[i], exact_tol) << where << " (vs same-quantization reference) at " << i;
          const double loose_tol = 1.05 * qbound[i] + 1e-5 * mag[i] + 1e-6;
          ASSERT_NEAR(y[i], yf[i], loose_tol) << where << " (vs float reference) at " << i;
        }
        if (first.empty()) {
          first = y;
        } else {
          ASSERT_EQ(0, std::memcmp(first.data(), y.data(), y.size() * sizeof(float)))
              << where << ": result differs from the 1-thread result";
        }
      }
      if (n_tok == 1) {
        // Decode-style: each token alone must give bit-identical rows to the batched result.
        ThreadPool pool(1);
        MatmulScratch scratch;
        y_single.resize((size_t)(max_tok * c.n_out));
        for (int64_t t = 0; t < max_tok; ++t)
          matmul(w, x.data() + t * c.n_in, 1, y_single.data() + t * c.n_out, pool, scratch);
      } else {
        ASSERT_EQ(0, std::memcmp(first.data(), y_single.data(), first.size() * sizeof(float)))
            << type_name(c.type) << " " << isa_name(isa) << " n_tok=" << n_tok
            << ": batched result differs from token-at-a-time result";
      }
    }
  }
}

class MatmulAllTypes : public ::testing::TestWithParam<GgmlType> {};

TEST_P(MatmulAllTypes, MatchesReferencesOnEveryIsa) {
  const GgmlType t = GetParam();
  std::mt19937 rng(100 + (int)t);
  if (is_k(t)) {
    check_matmul_case({t, 512, 37, false}, rng);
    check_matmul_case({t, 768, 20, true}, rng);
    check_matmul_case({t, 2304, 11, true}, rng);  // 9 super-blocks, odd row count (tile remainder rows)
  } else {
    check_matmul_case({t, 576, 37, false}, rng);  // SmolLM2 hidden size, n_out not a tile multiple
    check_matmul_case({t, 96, 70, true}, rng);    // odd number of 32-blocks
    check_matmul_case({t, 1536, 9, true}, rng);
  }
}

INSTANTIATE_TEST_SUITE_P(Types, MatmulAllTypes, ::testing::ValuesIn(kAllTypes),
                         [](const auto& info) { return std::string(type_name(info.param)); });

TEST(Matmul, LargeOutputSplitsAcrossThreads) {
  // Enough rows that every thread gets several chunks; deterministic across thread counts.
  std::mt19937 rng(7);
  const int64_t n_in = 576, n_out = 3000;
  for (GgmlType t : {GgmlType::Q4_1, GgmlType::Q8_0}) {
    const auto data = random_blocks(t, n_out, n_in, rng);
    const WeightMatrix w = make_matrix(t, data, n_out, n_in);
    const auto x = gaussian(rng, (size_t)(5 * n_in));
    const auto yq = quantized_reference(w, x, 5);
    std::vector<float> y1, y3;
    for (int nth : {1, 3}) {
      ThreadPool pool(nth);
      MatmulScratch scratch;
      std::vector<float> y((size_t)(5 * n_out));
      matmul(w, x.data(), 5, y.data(), pool, scratch);
      (nth == 1 ? y1 : y3) = y;
    }
    ASSERT_EQ(0, std::memcmp(y1.data(), y3.data(), y1.size() * sizeof(float)));
    for (size_t i = 0; i < y1.size(); ++i) ASSERT_NEAR(y1[i], yq[i], 1e-3 * (1 + std::fabs(yq[i])));
  }
}

TEST(Matmul, ActivationQuantizationIsBitExactWithGgml) {
  // Weight row j is the unit vector e_j (scale 1), so y[t][j] = d_a * q_a[j] with no rounding at all:
  // every ISA's activation quantizer must give ggml's exact quants, ties included (x86 ggml rounds half
  // to even: 2.5 -> 2, -3.5 -> -4).
  const int64_t n = 96;
  std::mt19937 rng(11);
  std::vector<float> x = gaussian(rng, (size_t)(2 * n));
  const float ties[] = {127.f, 2.5f, -2.5f, 0.5f, -0.5f, 1.5f, -3.5f, 126.5f, -126.5f, 0.f};
  for (size_t i = 0; i < sizeof(ties) / sizeof(ties[0]); ++i) x[32 + i] = ties[i];  // block 1: d = 1
  for (int i = 10; i < 32; ++i) x[(size_t)(32 + i)] = (float)(i - 16) + 0.5f;
  {
    std::vector<kk::BlockQ8_0> q(3);
    kk::quantize_q8_0_ref(x.data(), q.data(), n);
    const int want[] = {127, 2, -2, 0, 0, 2, -4, 126, -126, 0};
    for (int i = 0; i < 10; ++i) ASSERT_EQ(q[1].qs[i], want[i]) << "tie " << ties[i];
  }
  for (GgmlType t : {GgmlType::Q8_0, GgmlType::Q4_1, GgmlType::Q4_0, GgmlType::Q5_0}) {
    const size_t rb = kk::kernel_row_bytes(t, n);
    const int bb = kk::geometry(t).block_bytes;
    std::vector<uint8_t> w(rb * (size_t)n, 0);
    for (int64_t j = 0; j < n; ++j) {
      for (int b = 0; b < n / 32; ++b) {  // every block of row j: d = 1 and all-zero values
        uint8_t* blk = w.data() + (size_t)j * rb + (size_t)b * bb;
        put_h(blk, b == j / 32 ? 1.0f : 0.0f);
        if (t == GgmlType::Q4_0) std::memset(blk + 2, 0x88, 16);     // q = 8 -> value 0
        if (t == GgmlType::Q5_0) std::memset(blk + 2, 0xFF, 4);      // q = 16 -> value 0
      }
      uint8_t* blk = w.data() + (size_t)j * rb + (size_t)(j / 32) * bb;
      const int e = (int)(j % 32);
      const uint8_t one_nibble = (uint8_t)(e < 16 ? 0x01 : 0x10);
      switch (t) {
        case GgmlType::Q8_0: blk[2 + e] = 1; break;
        case GgmlType::Q4_1: blk[4 + e % 16] = one_nibble; break;  // m = 0
        case GgmlType::Q4_0: blk[2 + e % 16] = (uint8_t)(e < 16 ? 0x89 : 0x98); break;  // q = 9 -> 1
        default: blk[6 + e % 16] = one_nibble; break;  // Q5_0: q = 17 -> 1
      }
    }
    const WeightMatrix m = make_matrix(t, w, n, n);
    IsaGuard guard;
    for (Isa isa : available_isas()) {
      set_active_isa(isa);
      ThreadPool pool(1);
      MatmulScratch scratch;
      std::vector<float> y((size_t)(2 * n));
      matmul(m, x.data(), 2, y.data(), pool, scratch);  // 2 tokens: the prefill path
      std::vector<float> y1((size_t)n);
      matmul(m, x.data() + n, 1, y1.data(), pool, scratch);  // 1 token: the decode path
      for (int64_t tok = 0; tok < 2; ++tok) {
        std::vector<kk::BlockQ8_0> q((size_t)(n / 32));
        kk::quantize_q8_0_ref(x.data() + tok * n, q.data(), n);  // Q8_1 quants and d are the same
        for (int64_t j = 0; j < n; ++j) {
          const float expect = fp16_to_fp32(q[(size_t)(j / 32)].d) * (float)q[(size_t)(j / 32)].qs[j % 32];
          ASSERT_EQ(y[(size_t)(tok * n + j)], expect) << type_name(t) << " " << isa_name(isa) << " token " << tok << " j " << j;
          if (tok == 1) {
            ASSERT_EQ(y1[(size_t)j], expect) << type_name(t) << " " << isa_name(isa) << " decode j " << j;
          }
        }
      }
    }
  }
}

// ------------------------------------------------------------------------------------------------

TEST(VectorKernels, MatchScalarOnEveryIsa) {
  std::mt19937 rng(9);
  IsaGuard guard;
  for (Isa isa : available_isas()) {
    set_active_isa(isa);
    for (int64_t n : {1, 7, 16, 33, 100, 577}) {
      const auto a = gaussian(rng, (size_t)n), b = gaussian(rng, (size_t)n);
      std::vector<uint16_t> bh((size_t)n);
      for (int64_t i = 0; i < n; ++i) bh[(size_t)i] = fp32_to_fp16(b[(size_t)i]);
      double ref = 0, ref_h = 0, mag = 0;
      for (int64_t i = 0; i < n; ++i) {
        ref += (double)a[(size_t)i] * b[(size_t)i];
        ref_h += (double)a[(size_t)i] * fp16_to_fp32(bh[(size_t)i]);
        mag += std::fabs((double)a[(size_t)i] * b[(size_t)i]);
      }
      const std::string where = std::string(isa_name(isa)) + " n=" + std::to_string(n);
      EXPECT_NEAR(dot_f32(a.data(), b.data(), n), ref, 1e-5 * mag + 1e-6) << where;
      EXPECT_NEAR(dot_f32_f16(a.data(), bh.data(), n), ref_h, 1e-5 * mag + 1e-6) << where;

      std::vector<float> y = b;
      axpy_f16(0.75f, bh.data(), y.data(), n);
      for (int64_t i = 0; i < n; ++i)
        ASSERT_NEAR(y[(size_t)i], b[(size_t)i] + 0.75f * fp16_to_fp32(bh[(size_t)i]), 1e-6f * (1 + std::fabs(b[(size_t)i])))
            << where;

      // f32 -> f16 must round exactly like the scalar converter, including tiny and huge values.
      std::vector<float> src = a;
      if (n > 3) { src[0] = 1e-6f; src[1] = -7e-8f; src[2] = 70000.f; src[3] = 65519.f; }
      std::vector<uint16_t> h((size_t)n);
      f32_to_f16_row(src.data(), h.data(), n);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(h[(size_t)i], fp32_to_fp16(src[(size_t)i])) << where << " i=" << i;
    }
  }
}

TEST(Isa, SetActiveClampsToDetected) {
  IsaGuard guard;
  set_active_isa(Isa::Avx512);
  EXPECT_LE(active_isa(), detected_isa());
  set_active_isa(Isa::Scalar);
  EXPECT_EQ(active_isa(), Isa::Scalar);
  EXPECT_STREQ(isa_name(Isa::Avx2), "avx2");
}

}  // namespace
