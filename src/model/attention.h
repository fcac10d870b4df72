// Causal attention of a block of query rows over one KV head's kept entries (paged f16, f32, q8_0 or q4_0 storage,
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

// Values are weighted in chunks of kAttentionChunkPages pages: each chunk's weighted sum starts from zero
// and the chunks' sums are added in order. A row's output is then the same whether one task walks every
// page (attend) or several threads each take a range of pages and chunks (the attend_* pieces below),
// which is what keeps a sequence's results independent of how a step is split over threads.
constexpr int kAttentionChunkPages = 16;

// The pages a block reads: [p0, n_pages) (sliding windows skip whole pages before every row's first
// entry), chunks [c0, c1), and the row stride of its scores (= the longest row).
struct AttentionExtent {
  int64_t s_stride;
  int p0, n_pages, c0, c1;
};
AttentionExtent attention_extent(const AttentionBlock& b);

// dst[i] = f16(src[i]) * scale: queries rounded to f16 as llama.cpp does before its f16 K dot products.
void round_rows_f16(const float* src, float* dst, int64_t n, float scale);

// Exact two-pass softmax per row. scores: scratch [rows][max visible]; page_f32: scratch [page][head_dim];
// partial: scratch [rows][head_dim] (one chunk's weighted values).
void attend(const AttentionBlock& b, const KvCache& cache, int layer, int head, float* scores,
            float* page_f32, float* partial);

// attend() in pieces, for spreading one block over threads. In order:
// 1. attend_scores for pages [page_begin, page_end) (any split of [e.p0, e.n_pages));
// 2. attend_softmax for every row, once all its pages have scores;
// 3. attend_values for chunks [chunk_begin, chunk_end) (any split of [e.c0, e.c1)) into
//    partials[c - e.c0] = [rows][head_dim] each;
// 4. attend_merge: out = the chunks' partials added in order.
void attend_scores(const AttentionBlock& b, const KvCache& cache, int layer, int head, const AttentionExtent& e,
                   int page_begin, int page_end, float* scores, float* page_f32);
void attend_softmax(const AttentionBlock& b, const AttentionExtent& e, int row, float* scores);
void attend_values(const AttentionBlock& b, const KvCache& cache, int layer, int head, const AttentionExtent& e,
                   int chunk_begin, int chunk_end, const float* probs, float* partials, float* page_f32);
void attend_merge(const AttentionBlock& b, const AttentionExtent& e, int head_dim, const float* partials);
// Scalar reference (double accumulation) for tests.
void attend_reference(const AttentionBlock& b, const KvCache& cache, int layer, int head);

}  // namespace kvzap
