#include "cache/kv_cache.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

#include "common/fp16.h"
#include "kernels/matmul.h"
#include "kernels/quant_blocks.h"
#include "kernels/quant_ref.h"
#include "kvzap/error.h"

namespace kvzap {

KvType parse_kv_type(const std::string& name) {
  if (name == "f16") return KvType::F16;
  if (name == "f32") return KvType::F32;
  if (name == "q8_0") return KvType::Q8_0;
  if (name == "q4_0") return KvType::Q4_0;
  throw Error("unknown KV cache type '" + name + "' (expected f16, f32, q8_0 or q4_0)");
}

// ggml's reference quantisers (kernels/quant_ref.cpp): q8_0 d = amax / 127, q = round(x * 127 / amax);
// q4_0 d = m / -8 (m the element of largest magnitude), q = min(15, trunc(x / d + 8.5)), stored q + 8.
void kv_quantize_row(KvType type, const float* x, void* dst, int head_dim) {
  kernels::quantize_row_ref(type == KvType::Q8_0 ? GgmlType::Q8_0 : GgmlType::Q4_0, x, dst, head_dim);
}

void kv_dequantize_row(KvType type, const void* src, float* out, int head_dim) {
  kernels::dequantize_row_ref(type == KvType::Q8_0 ? GgmlType::Q8_0 : GgmlType::Q4_0, src, out, head_dim);
}

int64_t KvCache::page_bytes_for(int head_dim, KvType type) {
  if (kv_type_quantized(type) && head_dim % kernels::kQK != 0)
    throw Error(std::string("--kv-type ") + kv_type_name(type) + " needs a head size that is a multiple of 32 (this model's is " +
                std::to_string(head_dim) + "); use f16 or f32");
  return (int64_t)(2 * (size_t)kPageTokens * kv_row_bytes(type, head_dim) + kPageTokens * sizeof(int32_t));
}

KvCache::KvCache(int n_layer, int n_head_kv, int head_dim, PagePool* pool, KvType type)
    : n_layer_(n_layer), n_head_kv_(n_head_kv), head_dim_(head_dim), type_(type), pool_(pool) {
  page_bytes_ = page_bytes_for(head_dim, type);  // checks a quantised type's head size first
  row_bytes_ = kv_row_bytes(type, head_dim);
  kv_page_half_ = (size_t)kPageTokens * row_bytes_;
  if (!pool_) {
    own_pool_ = std::make_unique<PagePool>(page_bytes_, 0);
    pool_ = own_pool_.get();
  }
  if (pool_->page_bytes() != page_bytes_) throw Error("internal: the page pool's page size does not match the cache");
  streams_.resize((size_t)n_layer * n_head_kv);
}

KvCache::~KvCache() { clear(); }

uint8_t* KvCache::take_page(bool forced) {
  uint8_t* p = forced ? pool_->take_forced() : pool_->take();
  if (!p)
    throw KvBudgetExceeded("KV memory budget exhausted (" + std::to_string(pool_->bytes_in_use()) + " of " +
                           std::to_string(pool_->budget_bytes()) + " bytes in use)");
  pages_live_++;
  return p;
}

void KvCache::give_page(uint8_t* page) {
  pool_->unref(page);
  pages_live_--;
}

void KvCache::release_pool() { pool_->trim(); }

void KvCache::make_exclusive(Stream& s, size_t p, bool forced) {
  uint8_t* page = s.pages[p];
  if (pool_->refcount(page) == 1) return;
  uint8_t* copy = take_page(forced);
  std::memcpy(copy, page, (size_t)page_bytes_);
  give_page(page);
  s.pages[p] = copy;
}

void KvCache::require(KvType t) const {
  if (type_ != t)
    throw Error(std::string("internal: ") + kv_type_name(t) + " view of an " + kv_type_name(type_) + " KV cache");
}

void KvCache::share_from(const KvCache& src) {
  if (src.n_layer_ != n_layer_ || src.n_head_kv_ != n_head_kv_ || src.head_dim_ != head_dim_ || src.pool_ != pool_ ||
      src.type_ != type_)
    throw Error("internal: share_from needs a cache of the same shape, element type and pool");
  if (&src == this) return;
  clear();
  windows_ = src.windows_;
  window_floor_ = src.window_floor_;
  for (size_t i = 0; i < streams_.size(); i++) {
    streams_[i].pages = src.streams_[i].pages;
    streams_[i].length = src.streams_[i].length;
    streams_[i].window_dropped = src.streams_[i].window_dropped;
    for (uint8_t* p : streams_[i].pages) pool_->ref(p);
    pages_live_ += (int64_t)streams_[i].pages.size();
  }
  n_past_ = src.n_past_;
}

int64_t KvCache::pages_needed(int64_t n_new) const {
  if (n_new <= 0) return 0;
  int64_t pages = 0;
  for (const Stream& s : streams_) {
    const int64_t slot = s.length % kPageTokens;
    const int64_t room = slot == 0 ? 0 : kPageTokens - slot;  // free slots in the last page
    if (room > 0 && pool_->refcount(s.pages.back()) > 1) pages++;  // copy-on-write of the shared last page
    if (n_new > room) pages += (n_new - room + kPageTokens - 1) / kPageTokens;
  }
  return pages;
}

uint8_t* KvCache::page_for_append(Stream& s, int64_t slot) {
  if (slot == 0) s.pages.push_back(take_page(false));
  else make_exclusive(s, s.pages.size() - 1, false);  // a page shared with a fork is copied first
  return s.pages.back();
}

void KvCache::append(int layer, int head, const float* k, const float* v, int32_t pos) {
  Stream& s = stream(layer, head);
  const int64_t slot = s.length % kPageTokens;
  uint8_t* page = page_for_append(s, slot);
  uint8_t* kd = keys_of(page) + slot * row_bytes_;
  uint8_t* vd = values_of(page) + slot * row_bytes_;
  store_row(k, kd);
  store_row(v, vd);
  positions_of(page)[slot] = pos;
  s.length++;
}

void KvCache::append_stored(int layer, int head, const void* k, const void* v, int32_t pos) {
  Stream& s = stream(layer, head);
  const int64_t slot = s.length % kPageTokens;
  uint8_t* page = page_for_append(s, slot);
  std::memcpy(keys_of(page) + slot * row_bytes_, k, row_bytes_);
  std::memcpy(values_of(page) + slot * row_bytes_, v, row_bytes_);
  positions_of(page)[slot] = pos;
  s.length++;
}

void KvCache::append_layer(int layer, int64_t n, const float* k, const float* v, const int32_t* pos) {
  const int64_t stride = (int64_t)n_head_kv_ * head_dim_;
  for (int h = 0; h < n_head_kv_; h++)
    for (int64_t t = 0; t < n; t++)
      append(layer, h, k + t * stride + (int64_t)h * head_dim_, v + t * stride + (int64_t)h * head_dim_, pos[t]);
}

const uint16_t* KvCache::page_keys(int layer, int head, int p) const {
  require(KvType::F16);
  return (const uint16_t*)page_keys_raw(layer, head, p);
}
const uint16_t* KvCache::page_values(int layer, int head, int p) const {
  require(KvType::F16);
  return (const uint16_t*)page_values_raw(layer, head, p);
}
const float* KvCache::page_keys_f32(int layer, int head, int p) const {
  require(KvType::F32);
  return (const float*)page_keys_raw(layer, head, p);
}
const float* KvCache::page_values_f32(int layer, int head, int p) const {
  require(KvType::F32);
  return (const float*)page_values_raw(layer, head, p);
}
const int32_t* KvCache::page_positions(int layer, int head, int p) const {
  return positions_of(stream(layer, head).pages[p]);
}
const uint16_t* KvCache::key_at(int layer, int head, int64_t i) const {
  return page_keys(layer, head, (int)(i / kPageTokens)) + (i % kPageTokens) * head_dim_;
}
const uint16_t* KvCache::value_at(int layer, int head, int64_t i) const {
  return page_values(layer, head, (int)(i / kPageTokens)) + (i % kPageTokens) * head_dim_;
}
const float* KvCache::key_at_f32(int layer, int head, int64_t i) const {
  return page_keys_f32(layer, head, (int)(i / kPageTokens)) + (i % kPageTokens) * head_dim_;
}
const float* KvCache::value_at_f32(int layer, int head, int64_t i) const {
  return page_values_f32(layer, head, (int)(i / kPageTokens)) + (i % kPageTokens) * head_dim_;
}
void KvCache::store_row(const float* x, uint8_t* dst) const {
  switch (type_) {
    case KvType::F16: f32_to_f16_row(x, (uint16_t*)dst, head_dim_); return;
    case KvType::F32: std::memcpy(dst, x, row_bytes_); return;
    case KvType::Q8_0:
    case KvType::Q4_0: kv_quantize_row(type_, x, dst, head_dim_); return;
  }
}

void KvCache::row_to_f32(const uint8_t* src, float* out) const {
  if (type_ == KvType::F32) {
    std::memcpy(out, src, row_bytes_);
    return;
  }
  if (kv_type_quantized(type_)) return kv_dequantize_row(type_, src, out, head_dim_);
  uint16_t h;
  for (int d = 0; d < head_dim_; d++) {
    std::memcpy(&h, src + 2 * (size_t)d, sizeof h);
    out[d] = fp16_to_fp32(h);
  }
}
void KvCache::key_row(int layer, int head, int64_t i, float* out) const {
  row_to_f32((const uint8_t*)page_keys_raw(layer, head, (int)(i / kPageTokens)) + (i % kPageTokens) * row_bytes_, out);
}
void KvCache::value_row(int layer, int head, int64_t i, float* out) const {
  row_to_f32((const uint8_t*)page_values_raw(layer, head, (int)(i / kPageTokens)) + (i % kPageTokens) * row_bytes_, out);
}
int32_t KvCache::position_at(int layer, int head, int64_t i) const {
  return page_positions(layer, head, (int)(i / kPageTokens))[i % kPageTokens];
}

void KvCache::set_key_row(int layer, int head, int64_t i, const float* k) {
  Stream& s = stream(layer, head);
  if (i < 0 || i >= s.length) throw Error("internal: set_key_row past the end of the stream");
  const size_t p = (size_t)(i / kPageTokens);
  make_exclusive(s, p, true);  // forced, as evict: the caller frees more than a copy takes
  store_row(k, keys_of(s.pages[p]) + (size_t)(i % kPageTokens) * row_bytes_);
}

int64_t KvCache::evict(int layer, int head, const std::vector<uint8_t>& drop) {
  Stream& s = stream(layer, head);
  if ((int64_t)drop.size() < s.length) throw Error("internal: eviction mask shorter than the stream");
  // Pages before the first dropped slot are not written; the ones after it are compacted into, so a
  // page shared with a fork is copied first (forced: eviction must not fail halfway).
  int64_t first = 0;
  while (first < s.length && !drop[first]) first++;
  if (first == s.length) return 0;
  // Only pages that keep entries after compaction are written; the tail is unreferenced below.
  const int64_t kept = first + (int64_t)std::count(drop.begin() + first, drop.begin() + s.length, (uint8_t)0);
  for (size_t p = (size_t)(first / kPageTokens); p < s.pages.size() && (int64_t)p * kPageTokens < kept; p++)
    make_exclusive(s, p, true);
  int64_t w = first;
  const size_t row = row_bytes_;
  for (int64_t r = first; r < s.length; r++) {
    if (drop[r]) continue;
    if (w != r) {
      uint8_t* src = s.pages[r / kPageTokens];
      uint8_t* dst = s.pages[w / kPageTokens];
      const int64_t rs = r % kPageTokens, ws = w % kPageTokens;
      std::memcpy(keys_of(dst) + ws * row, keys_of(src) + rs * row, row);
      std::memcpy(values_of(dst) + ws * row, values_of(src) + rs * row, row);
      positions_of(dst)[ws] = positions_of(src)[rs];
    }
    w++;
  }
  const int64_t removed = s.length - w;
  s.length = w;
  const size_t pages_needed = (size_t)((w + kPageTokens - 1) / kPageTokens);
  while (s.pages.size() > pages_needed) {
    give_page(s.pages.back());
    s.pages.pop_back();
  }
  return removed;
}

bool KvCache::can_truncate(int32_t pos) const {
  for (int l = 0; l < (int)window_floor_.size(); l++)
    if (window_floor_[(size_t)l] > 0 && pos < n_past_ && window_start(l, pos) < window_floor_[(size_t)l]) return false;
  return true;
}

void KvCache::set_layer_windows(const std::vector<int32_t>& windows) {
  if (!windows.empty() && windows.size() != (size_t)n_layer_)
    throw Error("internal: " + std::to_string(windows.size()) + " layer windows for a cache of " +
                std::to_string(n_layer_) + " layers");
  windows_ = windows;
  window_floor_.assign(windows.size(), 0);
}

int64_t KvCache::drop_outside_window(int layer, int64_t next_pos) {
  const int64_t start = window_start(layer, next_pos);
  if (start <= 0) return 0;
  int64_t freed = 0;
  for (int h = 0; h < n_head_kv_; h++) {
    Stream& s = stream(layer, h);
    size_t n_drop = 0;  // leading full pages whose last (newest) entry is before the window
    while (n_drop < s.pages.size() && s.length - (int64_t)n_drop * kPageTokens >= kPageTokens &&
           positions_of(s.pages[n_drop])[kPageTokens - 1] < start)
      n_drop++;
    if (n_drop == 0) continue;
    const int32_t newest = positions_of(s.pages[n_drop - 1])[kPageTokens - 1];
    for (size_t p = 0; p < n_drop; p++) give_page(s.pages[p]);
    s.pages.erase(s.pages.begin(), s.pages.begin() + (std::ptrdiff_t)n_drop);
    const int64_t n = (int64_t)n_drop * kPageTokens;
    s.length -= n;
    s.window_dropped += n;
    freed += n;
    window_floor_[(size_t)layer] = std::max(window_floor_[(size_t)layer], newest + 1);
  }
  return freed;
}

int64_t KvCache::entries_window_dropped(int layer) const {
  int64_t n = 0;
  for (int h = 0; h < n_head_kv_; h++) n += stream(layer, h).window_dropped;
  return n;
}

int64_t KvCache::entries_window_dropped() const {
  int64_t n = 0;
  for (const Stream& s : streams_) n += s.window_dropped;
  return n;
}

void KvCache::truncate(int32_t pos) {
  if (!can_truncate(pos))
    throw Error("cannot rewind the cache to position " + std::to_string(pos) +
                ": a sliding-window layer already freed positions a query there would see");
  std::vector<uint8_t> drop;
  for (int l = 0; l < n_layer_; l++)
    for (int h = 0; h < n_head_kv_; h++) {
      Stream& s = stream(l, h);
      // Entries are sorted by position: find the first one at or after pos.
      int64_t keep = s.length;
      while (keep > 0 && position_at(l, h, keep - 1) >= pos) keep--;
      if (keep == s.length) continue;
      drop.assign((size_t)s.length, 0);
      for (int64_t i = keep; i < s.length; i++) drop[i] = 1;
      evict(l, h, drop);
    }
  if (n_past_ > pos) n_past_ = pos;
}

void KvCache::clear() {
  for (Stream& s : streams_) {
    for (uint8_t* p : s.pages) give_page(p);
    s.pages.clear();
    s.length = 0;
    s.window_dropped = 0;
  }
  std::fill(window_floor_.begin(), window_floor_.end(), 0);
  n_past_ = 0;
}

int64_t KvCache::bytes_resident() const { return pages_live_ * page_bytes_; }

int64_t KvCache::bytes_exclusive() const {
  int64_t n = 0;
  for (const Stream& s : streams_)
    for (const uint8_t* p : s.pages) n += pool_->refcount(p) == 1;
  return n * page_bytes_;
}

int64_t KvCache::bytes_allocated() const {
  return (own_pool_ ? pages_live_ : pool_->pages_in_use()) * page_bytes_ + pool_->pages_free_listed() * page_bytes_;
}

int64_t KvCache::bytes_full() const {
  // An unpruned cache holds every position in every stream: n_past entries, rounded up to pages.
  // Sliding-window streams: the positions their windows did not free.
  int64_t pages = 0;
  for (const Stream& s : streams_) {
    const int64_t n = std::max<int64_t>(0, n_past_ - s.window_dropped);
    pages += (n + kPageTokens - 1) / kPageTokens;
  }
  return pages * page_bytes_;
}

int64_t KvCache::entries_kept() const {
  int64_t n = 0;
  for (const Stream& s : streams_) n += s.length;
  return n;
}

int64_t KvCache::entries_kept(int layer) const {
  int64_t n = 0;
  for (int h = 0; h < n_head_kv_; h++) n += stream(layer, h).length;
  return n;
}

double KvCache::evicted_fraction() const {
  if (n_past_ == 0) return 0.0;
  // Entry-weighted over layers: with every layer global (all hold n_head_kv * n_past unpruned) this is
  // exactly the mean over layers.
  double full = 0, evicted = 0;
  for (int l = 0; l < n_layer_; l++) {
    const double total = (double)n_head_kv_ * (double)n_past_ - (double)entries_window_dropped(l);
    full += total;
    evicted += total - (double)entries_kept(l);
  }
  return full > 0 ? evicted / full : 0.0;
}

}  // namespace kvzap
