#include "press/kvzip_math.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>

#include "kernels/thread_pool.h"
#include "kvzap/error.h"
#include "model/model.h"
#include "press/surrogate.h"
#include "kernels/isa_dispatch.h"

namespace kvzap {

// Hot loops: plain C++ bodies built for AVX-512, AVX2 and baseline by KVZAP_ISA_DISPATCH, chosen per call
// by active_isa() (kernels/isa_dispatch.h).

OutputNorms::OutputNorms(const Model& model) {
  const ModelConfig& c = model.config();
  D_ = c.head_dim;
  H_ = c.n_head;
  const int E = c.n_embd;
  gram_.assign((size_t)c.n_layer, std::vector<double>((size_t)H_ * D_ * D_, 0.0));
  std::vector<float> row((size_t)H_ * D_);
  for (int l = 0; l < c.n_layer; l++) {
    const WeightMatrix& wo = model.weights().layers[l].wo;  // [E rows][H*D]
    std::vector<double>& g = gram_[(size_t)l];
    for (int e = 0; e < E; e++) {
      dequantize_row(wo.type, wo.data + (size_t)e * wo.row_stride, row.data(), (int64_t)H_ * D_);
      for (int q = 0; q < H_; q++) {
        const float* r = &row[(size_t)q * D_];
        double* m = &g[(size_t)q * D_ * D_];
        for (int a = 0; a < D_; a++) {
          const double ra = r[a];
          for (int b = 0; b < D_; b++) m[a * D_ + b] += ra * r[b];
        }
      }
    }
  }
}

void OutputNorms::norms(int layer, int q_head, const float* v, int64_t stride, int64_t n, float* out) const {
  // R = V M (one small double GEMM), then ||W_O v_i||^2 = <v_i, R_i>.
  thread_local std::vector<double> vd, r;
  const int64_t D = D_;
  vd.resize((size_t)(n * D));
  r.resize((size_t)(n * D));
  for (int64_t i = 0; i < n; i++)
    for (int64_t a = 0; a < D; a++) vd[(size_t)(i * D + a)] = v[i * stride + a];
  dense::gemm_nn(n, D, D, vd.data(), D, gram(layer, q_head), D, r.data(), D, false);
  for (int64_t i = 0; i < n; i++) {
    double acc = 0;
    for (int64_t a = 0; a < D; a++) acc += vd[(size_t)(i * D + a)] * r[(size_t)(i * D + a)];
    out[i] = (float)std::sqrt(std::max(acc, 0.0));
  }
}

void inverse_row_norms(const float* x, int64_t n, int64_t d, float* out) {
  for (int64_t j = 0; j < n; j++) {
    double ss = 0;
    const float* h = x + j * d;
    for (int64_t e = 0; e < d; e++) ss += (double)h[e] * h[e];
    out[j] = (float)(1.0 / std::sqrt(std::max(ss, 1e-30)));
  }
}

KVZAP_INLINE_BODY void exp_nonpositive_inplace_body(float* x, int64_t n) {
  // Cephes expf: x = n ln2 + r, |r| <= ln2 / 2, exp(r) by a degree-7 polynomial, times 2^n.
  for (int64_t i = 0; i < n; i++) {
    const float in = x[i];
    const float v = in < -87.0f ? -87.0f : in;
    const float fn = (v * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round to nearest
    const float r = (v - fn * 0.693359375f) - fn * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const float y = p * r * r + r + 1.0f;
    const float scale = std::bit_cast<float>(((int32_t)fn + 127) << 23);
    x[i] = in < -87.0f ? 0.0f : y * scale;
  }
}
KVZAP_ISA_DISPATCH(void, exp_nonpositive_inplace, (float* x, int64_t n), (x, n))

namespace {

// Max of x[0..n) (n >= 1), in lanes so it vectorises.
KVZAP_INLINE_BODY float row_max_body(const float* x, int64_t n) {
  float m[16];
  for (int l = 0; l < 16; l++) m[l] = -INFINITY;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int l = 0; l < 16; l++) m[l] = m[l] > x[i + l] ? m[l] : x[i + l];
  float r = -INFINITY;
  for (int l = 0; l < 16; l++) r = std::max(r, m[l]);
  for (; i < n; i++) r = std::max(r, x[i]);
  return r;
}
KVZAP_ISA_DISPATCH(float, row_max, (const float* x, int64_t n), (x, n))

// x[i] -= m, then exp, and returns the sum (float lanes, merged in double).
KVZAP_INLINE_BODY double shift_exp_sum_body(float* x, int64_t n, float m) {
  for (int64_t i = 0; i < n; i++) x[i] -= m;
  exp_nonpositive_inplace_body(x, n);
  float s[16] = {0};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int l = 0; l < 16; l++) s[l] += x[i + l];
  double r = 0;
  for (int l = 0; l < 16; l++) r += s[l];
  for (; i < n; i++) r += x[i];
  return r;
}
KVZAP_ISA_DISPATCH(double, shift_exp_sum, (float* x, int64_t n, float m), (x, n, m))

// cm[c] = max(cm[c], e[c] * k * cs[c])
KVZAP_INLINE_BODY void scaled_max_body(float* cm, const float* e, const float* cs, float k, int64_t n) {
  if (cs) {
    for (int64_t c = 0; c < n; c++) {
      const float a = e[c] * k * cs[c];
      cm[c] = cm[c] > a ? cm[c] : a;
    }
  } else {
    for (int64_t c = 0; c < n; c++) {
      const float a = e[c] * k;
      cm[c] = cm[c] > a ? cm[c] : a;
    }
  }
}
KVZAP_ISA_DISPATCH(void, scaled_max, (float* cm, const float* e, const float* cs, float k, int64_t n), (cm, e, cs, k, n))

constexpr int64_t kRowBlock = 16;

}  // namespace

void attention_column_max(const ColumnMaxProblem& p, ThreadPool& pool, ColumnMaxWorkspace& ws, float* out) {
  const int64_t D = p.head_dim, nk = p.n_keys, n_cols = p.n_cols;
  const int nt = pool.size();
  if ((int)ws.logits.size() < nt) {
    ws.logits.resize((size_t)nt);
    ws.qs.resize((size_t)nt);
    ws.colmax.resize((size_t)nt);
  }
  for (int t = 0; t < nt; t++) {
    if (ws.logits[t].size() < (size_t)(kRowBlock * nk)) ws.logits[t].resize((size_t)(kRowBlock * nk));
    if (ws.qs[t].size() < (size_t)(kRowBlock * D)) ws.qs[t].resize((size_t)(kRowBlock * D));
    ws.colmax[t].assign((size_t)n_cols, 0.0f);
  }
  const float scale = p.logit_scale > 0 ? p.logit_scale : 1.0f / std::sqrt((float)D);
  const int64_t n_rb = (p.n_rows + kRowBlock - 1) / kRowBlock;
  pool.parallel_for(n_rb * p.n_group, [&](int64_t task, int tid) {
    const int64_t rb = task / p.n_group;
    const int g = (int)(task % p.n_group);
    const int64_t j0 = rb * kRowBlock, j1 = std::min(p.n_rows, j0 + kRowBlock), nr = j1 - j0;
    const int64_t vis_max = std::min(nk, p.visible0 + j1 - 1);
    if (vis_max <= 0) return;
    float* qs = ws.qs[tid].data();
    float* L = ws.logits[tid].data();  // [nr][vis_max]
    float* cm = ws.colmax[tid].data();
    for (int64_t r = 0; r < nr; r++) {
      const float* q = p.q + (j0 + r) * p.q_row_stride + g * p.q_head_stride;
      for (int64_t d = 0; d < D; d++) qs[r * D + d] = q[d] * scale;
    }
    dense::gemm_nn(nr, vis_max, D, qs, D, p.keys_t, nk, L, vis_max, false);
    const float* cs = p.col_scale ? p.col_scale + (size_t)g * n_cols : nullptr;
    for (int64_t r = 0; r < nr; r++) {
      const int64_t j = j0 + r;
      const int64_t vis = std::min(nk, p.visible0 + j);
      if (vis <= 0) continue;
      float* row = L + r * vis_max;
      const float m = row_max(row, vis);
      const double sum = shift_exp_sum(row, vis, m);
      const float k = (float)((p.row_scale ? p.row_scale[j] : 1.0f) / sum);
      const int64_t c_end = std::min(n_cols, vis - p.col0);
      if (c_end > 0) scaled_max(cm, row + p.col0, cs, k, c_end);
    }
  });
  for (int64_t c = 0; c < n_cols; c++) {
    float best = 0;
    for (int t = 0; t < nt; t++) best = std::max(best, ws.colmax[t][(size_t)c]);
    out[c] = best;
  }
}

void transpose_rows(const float* src, int64_t stride, int64_t n, int64_t d, float* dst) {
  constexpr int64_t B = 32;
  for (int64_t i0 = 0; i0 < n; i0 += B)
    for (int64_t a = 0; a < d; a++) {
      const int64_t i1 = std::min(n, i0 + B);
      for (int64_t i = i0; i < i1; i++) dst[a * n + i] = src[i * stride + a];
    }
}

}  // namespace kvzap

namespace kvzap {

void write_npy_f32(const std::string& path, const float* data, const std::vector<int64_t>& shape) {
  std::string dims;
  int64_t count = 1;
  for (int64_t s : shape) {
    dims += std::to_string(s) + ", ";
    count *= s;
  }
  if (shape.size() > 1) dims.resize(dims.size() - 2);  // "(n,)" keeps its comma for one dimension
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }";
  // magic(6) + version(2) + header length(2) + header, padded with spaces to a multiple of 64, '\n'-ended.
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) throw Error(path + ": cannot create file");
  const unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(header.size() & 0xff),
                                 (unsigned char)(header.size() >> 8)};
  bool ok = std::fwrite(pre, 1, 10, f) == 10 && std::fwrite(header.data(), 1, header.size(), f) == header.size() &&
            (count == 0 || std::fwrite(data, sizeof(float), (size_t)count, f) == (size_t)count);
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) throw Error(path + ": write failed");
}

}  // namespace kvzap
