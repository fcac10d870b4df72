#include "model/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/fp16.h"
#include "kernels/matmul.h"

namespace kvzap {

namespace {

// The hot loops are plain C++ written so the compiler vectorises them (lane-split accumulators, no
// cross-lane reduction in the inner loop); target_clones builds AVX-512, AVX2 and baseline versions and
// picks one at load time.
#define KVZAP_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))

KVZAP_CLONES
void page_to_f32(const uint16_t* src, float* dst, int64_t n) {
  const _Float16* h = reinterpret_cast<const _Float16*>(src);  // same bits; F16C converts in bulk
  for (int64_t i = 0; i < n; i++) dst[i] = (float)h[i];
}

KVZAP_CLONES
void scores_page(const float* q, int64_t q_stride, int rows, const int64_t* visible, const float* kf,
                 int64_t j0, int64_t nj, int d, float* scores, int64_t s_stride) {
  for (int r = 0; r < rows; r++) {
    const float* qr = q + r * q_stride;
    float* sr = scores + r * s_stride;
    const int64_t jmax = std::min<int64_t>(nj, visible[r] - j0);
    for (int64_t j = 0; j < jmax; j++) {
      const float* kj = kf + j * d;
      float acc[16] = {0};
      for (int i = 0; i < d; i += 16)
        for (int l = 0; l < 16; l++) acc[l] += qr[i + l] * kj[i + l];
      float s = 0;
      for (int l = 0; l < 16; l++) s += acc[l];
      sr[j0 + j] = s;
    }
  }
}

KVZAP_CLONES
void accumulate_page(const float* probs, int64_t s_stride, int rows, const int64_t* visible, const float* vf,
                     int64_t j0, int64_t nj, int d, float* out, int64_t out_stride) {
  for (int r = 0; r < rows; r++) {
    const float* pr = probs + r * s_stride;
    float* o = out + r * out_stride;
    const int64_t jmax = std::min<int64_t>(nj, visible[r] - j0);
    for (int64_t j = 0; j < jmax; j++) {
      const float p = pr[j0 + j];
      const float* vj = vf + j * d;
      for (int i = 0; i < d; i++) o[i] += p * vj[i];
    }
  }
}

KVZAP_CLONES
void softmax_row(float* x, int64_t n) {
  float mx = -INFINITY;
  for (int64_t i = 0; i < n; i++) mx = std::max(mx, x[i]);
  float sum = 0;
  for (int64_t i = 0; i < n; i++) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  const float inv = 1.0f / sum;
  for (int64_t i = 0; i < n; i++) x[i] *= inv;
}

}  // namespace

void attend(const AttentionBlock& b, const KvCache& cache, int layer, int head, float* scores, float* page_f32) {
  const int d = cache.head_dim();
  const int P = KvCache::kPageTokens;
  int64_t max_vis = 0;
  for (int r = 0; r < b.rows; r++) max_vis = std::max(max_vis, b.visible[r]);
  const int64_t s_stride = max_vis;
  const int n_pages = (int)((max_vis + P - 1) / P);
  float* kf = page_f32;
  for (int p = 0; p < n_pages; p++) {
    const int64_t j0 = (int64_t)p * P;
    const int64_t nj = std::min<int64_t>(P, max_vis - j0);
    page_to_f32(cache.page_keys(layer, head, p), kf, nj * d);
    scores_page(b.q, b.q_stride, b.rows, b.visible, kf, j0, nj, d, scores, s_stride);
  }
  for (int r = 0; r < b.rows; r++) {
    softmax_row(scores + r * s_stride, b.visible[r]);
    std::fill(b.out + r * b.out_stride, b.out + r * b.out_stride + d, 0.0f);
  }
  for (int p = 0; p < n_pages; p++) {
    const int64_t j0 = (int64_t)p * P;
    const int64_t nj = std::min<int64_t>(P, max_vis - j0);
    page_to_f32(cache.page_values(layer, head, p), kf, nj * d);
    accumulate_page(scores, s_stride, b.rows, b.visible, kf, j0, nj, d, b.out, b.out_stride);
  }
}

void attend_reference(const AttentionBlock& b, const KvCache& cache, int layer, int head) {
  const int d = cache.head_dim();
  for (int r = 0; r < b.rows; r++) {
    const int64_t n = b.visible[r];
    std::vector<double> s((size_t)n);
    double mx = -INFINITY;
    for (int64_t j = 0; j < n; j++) {
      const uint16_t* k = cache.key_at(layer, head, j);
      double acc = 0;
      for (int i = 0; i < d; i++) acc += (double)b.q[r * b.q_stride + i] * fp16_to_fp32(k[i]);
      s[j] = acc;
      mx = std::max(mx, acc);
    }
    double sum = 0;
    for (double& x : s) sum += (x = std::exp(x - mx));
    for (int i = 0; i < d; i++) {
      double o = 0;
      for (int64_t j = 0; j < n; j++) o += s[j] / sum * fp16_to_fp32(cache.value_at(layer, head, j)[i]);
      b.out[r * b.out_stride + i] = (float)o;
    }
  }
}

}  // namespace kvzap
