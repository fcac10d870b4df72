// One sequence's KV cache: a variable-length stream per (layer, KV head).
//
// Each stream stores its kept entries in fixed-size pages taken from a PagePool (shared by every
// sequence of an engine, or private to this cache): keys after RoPE and values in the cache's element
// type (KvType: f16 by default; f32, q8_0 or q4_0 on request), plus each entry's original position. Entries stay sorted by position. Evicting entries compacts the stream and
// returns emptied pages to the pool, so evicted entries really stop costing memory and attention time —
// nothing is masked. Keys are never re-rotated.
//
// Copy-on-write: share_from() makes this cache hold the same pages as another (reference counts); a
// shared page is copied only when this cache writes into it (an append into a partly filled page, or
// the compaction of an eviction), so the other cache never sees the change.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cache/page_pool.h"

namespace kvzap {

// Element type of cached keys and values. F16 (the default) halves the memory per token and matches
// llama.cpp's default cache; F32 stores K and V exactly as computed (twice the bytes per token, so a
// budget holds half as many tokens) and makes attention skip the f16 rounding of queries and
// probabilities, so results can match an f32 reference. Q8_0 and Q4_0 quantise each row (one token of
// one KV head, head_dim elements, head_dim a multiple of 32) in ggml's block layout: blocks of 32
// elements with an f16 scale (Q8_0: 34 bytes per 32, int8 quants; Q4_0: 18 bytes per 32, 4-bit quants
// with an offset of 8), so a row's scales live with it in its page and eviction still moves whole rows.
enum class KvType : uint8_t { F16 = 0, F32 = 1, Q8_0 = 2, Q4_0 = 3 };
inline bool kv_type_quantized(KvType t) { return t == KvType::Q8_0 || t == KvType::Q4_0; }
// Bytes of one stored row of head_dim elements (quantised types: head_dim / 32 blocks).
inline size_t kv_row_bytes(KvType t, int head_dim) {
  switch (t) {
    case KvType::F32: return (size_t)head_dim * 4;
    case KvType::Q8_0: return (size_t)head_dim / 32 * 34;
    case KvType::Q4_0: return (size_t)head_dim / 32 * 18;
    default: return (size_t)head_dim * 2;
  }
}
inline const char* kv_type_name(KvType t) {
  switch (t) {
    case KvType::F32: return "f32";
    case KvType::Q8_0: return "q8_0";
    case KvType::Q4_0: return "q4_0";
    default: return "f16";
  }
}
// The last valid KvType value (cache files check the recorded type against it).
constexpr KvType kKvTypeLast = KvType::Q4_0;
// "f16", "f32", "q8_0" or "q4_0"; throws kvzap::Error on anything else.
KvType parse_kv_type(const std::string& name);
// One row of a quantised type (Q8_0 or Q4_0; head_dim a multiple of 32): x [head_dim] f32 to
// head_dim / 32 ggml blocks in dst (kv_row_bytes(type, head_dim) bytes), and back (q * scale in f32:
// the reference every attention kernel dequantises like, bit for bit).
void kv_quantize_row(KvType type, const float* x, void* dst, int head_dim);
void kv_dequantize_row(KvType type, const void* src, float* out, int head_dim);

class KvCache {
 public:
  // Small pages keep the rounding waste per stream low (<= 15 entries), so resident bytes track kept entries.
  static constexpr int kPageTokens = 16;

  // pool: the shared page pool (must outlive the cache; its pages sized by page_bytes_for(head_dim,
  // type)); null = a private pool without a budget.
  KvCache(int n_layer, int n_head_kv, int head_dim, PagePool* pool = nullptr, KvType type = KvType::F16);
  ~KvCache();
  // Bytes of one page: keys [P][row] | values [P][row] | positions [P] i32, row = kv_row_bytes(type, D)
  // (f16/f32: D elements; q8_0/q4_0: D/32 ggml blocks). Throws kvzap::Error for a quantised type when
  // D is not a multiple of 32.
  static int64_t page_bytes_for(int head_dim, KvType type = KvType::F16);
  PagePool& pool() { return *pool_; }
  const PagePool& pool() const { return *pool_; }

  // Drops this cache's entries and shares every page of `src` (same shape and pool), copy-on-write.
  void share_from(const KvCache& src);
  // Pages the pool must hand out to append n_new entries to every stream (new pages, plus copies of
  // shared partly filled last pages).
  int64_t pages_needed(int64_t n_new) const;
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  int n_layer() const { return n_layer_; }
  int n_head_kv() const { return n_head_kv_; }
  int head_dim() const { return head_dim_; }
  KvType kv_type() const { return type_; }
  // Bytes of one stored key (= value) row: kv_row_bytes(kv_type(), head_dim).
  size_t row_bytes() const { return row_bytes_; }

  // Appends one entry to stream (layer, head); k and v are [head_dim] f32, stored in kv_type()
  // (rounded to f16, or quantised row by row for q8_0/q4_0).
  // Throws KvBudgetExceeded if the pool's budget has no page left.
  void append(int layer, int head, const float* k, const float* v, int32_t pos);
  // The same with keys and values already in the cache's element type, row_bytes() each (restoring a
  // saved cache).
  void append_stored(int layer, int head, const void* k, const void* v, int32_t pos);
  // Appends n entries of every KV head of a layer: k, v are [n][n_head_kv][head_dim], positions [n].
  void append_layer(int layer, int64_t n, const float* k, const float* v, const int32_t* pos);

  int64_t length(int layer, int head) const { return stream(layer, head).length; }
  // Page p of a stream: keys/values [kPageTokens][head_dim] in kv_type(), positions [kPageTokens];
  // only the first min(kPageTokens, length - p*kPageTokens) entries are valid. The typed views check
  // the type (an f16 view of an f32 cache is a caller bug: kvzap::Error "internal: ...").
  int n_pages(int layer, int head) const { return (int)stream(layer, head).pages.size(); }
  const void* page_keys_raw(int layer, int head, int p) const { return keys_of(stream(layer, head).pages[(size_t)p]); }
  const void* page_values_raw(int layer, int head, int p) const { return values_of(stream(layer, head).pages[(size_t)p]); }
  const uint16_t* page_keys(int layer, int head, int p) const;      // F16 caches
  const uint16_t* page_values(int layer, int head, int p) const;    // F16 caches
  const float* page_keys_f32(int layer, int head, int p) const;     // F32 caches
  const float* page_values_f32(int layer, int head, int p) const;   // F32 caches
  const int32_t* page_positions(int layer, int head, int p) const;
  // Entry i of a stream (slow path for scorers and tests): typed views as above, and key_row/value_row,
  // which convert entry i of any type to f32 out[head_dim] (exact: f16 -> f32 loses nothing; q8_0/q4_0
  // rows are dequantised, q * scale in f32, as attention reads them).
  const uint16_t* key_at(int layer, int head, int64_t i) const;    // F16 caches
  const uint16_t* value_at(int layer, int head, int64_t i) const;  // F16 caches
  const float* key_at_f32(int layer, int head, int64_t i) const;   // F32 caches
  const float* value_at_f32(int layer, int head, int64_t i) const; // F32 caches
  void key_row(int layer, int head, int64_t i, float* out) const;
  void value_row(int layer, int head, int64_t i, float* out) const;
  int32_t position_at(int layer, int head, int64_t i) const;
  // Overwrites the key of entry i (k [head_dim] f32, stored in kv_type()): a page shared with a fork or the
  // prefix cache is copied first, so only this cache sees the change (key_rerotation_<press>).
  void set_key_row(int layer, int head, int64_t i, const float* k);

  // Removes the entries whose slot index (0..length-1) has drop[slot] != 0; keeps order.
  // Returns the number removed. Emptied pages go back to the pool.
  int64_t evict(int layer, int head, const std::vector<uint8_t>& drop);
  // Removes every entry with position >= pos in all streams (e.g. a question and its answer), and
  // rewinds the sequence length to pos. Throws kvzap::Error when a sliding-window layer already freed
  // positions a query at pos would see (see can_truncate).
  void truncate(int32_t pos);
  bool can_truncate(int32_t pos) const;

  // Sliding-window layers (the forward pass sets them from the model's LayerConfig): window[layer],
  // 0 = global. A query at position p of a layer with window W sees positions > p - W only.
  void set_layer_windows(const std::vector<int32_t>& windows);
  const std::vector<int32_t>& layer_windows() const { return windows_; }
  int32_t layer_window(int layer) const { return windows_.empty() ? 0 : windows_[(size_t)layer]; }
  // The first position a query at `pos` sees in `layer` (0 for a global layer).
  int64_t window_start(int layer, int64_t pos) const {
    const int32_t w = layer_window(layer);
    return w > 0 && pos - w + 1 > 0 ? pos - w + 1 : 0;
  }
  // Frees, in every stream of `layer`, the leading pages whose entries are all before
  // window_start(layer, next_pos): what no query at next_pos or later can see. Whole pages only, so
  // nothing is copied; the few older entries left in a partly kept first page are masked by attention.
  // Not a press eviction (evicted_fraction() and the pool's eviction count ignore it). Returns the
  // entries freed.
  int64_t drop_outside_window(int layer, int64_t next_pos);
  // Entries freed by sliding windows, all streams (or one layer's).
  int64_t entries_window_dropped() const;
  int64_t entries_window_dropped(int layer) const;
  void clear();

  // Sequence length: positions seen so far (kept or evicted). Set by the engine after each step.
  int64_t n_past() const { return n_past_; }
  void set_n_past(int64_t n) { n_past_ = n; }

  // Accounting. Resident bytes count the pages this cache's streams hold (a page shared with a fork is
  // counted by both; the pool counts it once); exclusive bytes only the pages no other cache holds.
  // Full bytes are what a cache of this element type unpruned by presses would hold for n_past tokens
  // (sliding-window layers: what their windows keep).
  int64_t bytes_resident() const;
  int64_t bytes_exclusive() const;
  int64_t bytes_allocated() const;   // the pool's pages in use + free-listed (a private pool: this cache's)
  int64_t bytes_full() const;
  int64_t entries_kept() const;
  int64_t entries_kept(int layer) const;
  // kvpress's definition: entries evicted by presses / entries an unpruned cache would hold, i.e. the
  // mean over layers of evicted / (n_head_kv * n_past) when every layer is global; entries freed by
  // sliding windows count in neither (they are in entries_window_dropped()).
  double evicted_fraction() const;
  int64_t page_bytes() const { return page_bytes_; }
  // Returns the pool's free-listed pages to the system (called after large evictions).
  void release_pool();

 private:
  struct Stream {
    std::vector<uint8_t*> pages;  // each: keys [P][D] | values [P][D] (kv_type()) | positions [P] i32
    int64_t length = 0;
    int64_t window_dropped = 0;   // entries freed by the layer's sliding window
  };
  const Stream& stream(int layer, int head) const { return streams_[(size_t)layer * n_head_kv_ + head]; }
  Stream& stream(int layer, int head) { return streams_[(size_t)layer * n_head_kv_ + head]; }
  uint8_t* take_page(bool forced);
  void give_page(uint8_t* page);
  // The page that slot `slot` (= length % kPageTokens) of s goes into: a new one, or the last one made
  // exclusive to this cache.
  uint8_t* page_for_append(Stream& s, int64_t slot);
  // Makes page p of stream s exclusive to this cache (copies it if shared).
  void make_exclusive(Stream& s, size_t p, bool forced);
  uint8_t* keys_of(uint8_t* page) const { return page; }
  uint8_t* values_of(uint8_t* page) const { return page + kv_page_half_; }
  int32_t* positions_of(uint8_t* page) const { return (int32_t*)(page + 2 * kv_page_half_); }
  void require(KvType t) const;  // throws "internal: ..." when the cache holds the other type
  void row_to_f32(const uint8_t* src, float* out) const;
  void store_row(const float* x, uint8_t* dst) const;  // x [head_dim] f32 to one row of kv_type()

  int n_layer_, n_head_kv_, head_dim_;
  KvType type_;
  size_t row_bytes_;     // bytes of one key (= value) row
  size_t kv_page_half_;  // bytes of the keys (= values) part of a page
  int64_t page_bytes_;
  std::vector<Stream> streams_;  // [n_layer][n_head_kv]
  std::unique_ptr<PagePool> own_pool_;  // when no shared pool was given
  PagePool* pool_;
  std::vector<int32_t> windows_;       // [n_layer] or empty (all global)
  std::vector<int32_t> window_floor_;  // [n_layer] positions below it may have been freed by the window
  int64_t pages_live_ = 0;  // page references held by this cache's streams
  int64_t n_past_ = 0;
};

}  // namespace kvzap
