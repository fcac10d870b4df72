// Causal attention of a block of query rows over one KV head's kept entries (paged f16 or f32 storage,
// KvCache::kv_type()).
#pragma once
#include <cstdint>

#include "cache/kv_cache.h"

namespace kvzap {

struct AttentionBlock {
  const float* q;          // [rows][head_dim], already multiplied by 1/sqrt(head_dim)
  int64_t q_stride;        // floats between consecutive rows
  int rows;
  const int64_t* visible;  // [rows] number of leading stream entries row r may attend to
  float* out;              // [rows][head_dim] (stride out_stride)
  int64_t out_stride;
  // Round attention probabilities to f16 before weighting the f16 values, as llama.cpp's default
  // (non-flash) CPU path does; keeps greedy outputs token-identical to it on near-ties. The forward
  // pass sets it for f16 caches only (with f32 values llama.cpp keeps f32 probabilities too).
  bool f16_probs = false;
  // Sliding window: [rows] the first stream entry row r may attend to (entries before it get probability
  // 0); null = 0 for every row.
  const int64_t* first = nullptr;
};

// dst[i] = f16(src[i]) * scale: queries rounded to f16 as llama.cpp does before its f16 K dot products.
void round_rows_f16(const float* src, float* dst, int64_t n, float scale);

// Exact two-pass softmax per row. scores: scratch [rows][max visible]; page_f32: scratch [page][head_dim].
void attend(const AttentionBlock& b, const KvCache& cache, int layer, int head, float* scores,
            float* page_f32);
// Scalar reference (double accumulation) for tests.
void attend_reference(const AttentionBlock& b, const KvCache& cache, int layer, int head);

}  // namespace kvzap
