// Saved compressed caches: one sequence's KV streams (kept entries only, in the cache's element type,
// with their positions), the context's token ids, the logits after its last token, and the press
// settings it was compressed under. Restoring gives back exactly the pruned cache, so a context is
// compressed once and reused.
//
// Layout (little-endian), version 2:
//   header [144 bytes]: magic "KVZCACHE" | version u32 | header bytes u32 | model fingerprint [32] |
//     n_layer u32 | n_head_kv u32 | head_dim u32 | n_vocab u32 | n_past i64 | n_tokens u64 |
//     press bytes u32 | has logits u32 | kv type u32 (0 = f16, 1 = f32, 2 = q8_0, 3 = q4_0: KvType) | payload bytes u64 |
//     payload sha256 [32] | header sha256 [8, truncated]
//   payload: press settings [press bytes] | tokens i32 [n_tokens] | logits f32 [n_vocab] (if has logits) |
//     per stream (layer-major, then KV head): length u32 | positions i32 [length] | keys [length][head_dim] |
//     values [length][row] (row = kv_row_bytes(kv type, head_dim): f16, f32, or q8_0/q4_0 blocks)
// Version 1 (still read) is the same without the kv type field: f16 keys and values.
// A truncated, corrupt, foreign-model or other-version file throws kvzap::Error with a one-line message;
// so does a file whose KV type differs from the cache it is loaded into (no silent conversion: the
// saved logits and pruning decisions were made with that type, and f32 -> f16 would lose precision).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "cache/kv_cache.h"
#include "model/model.h"

namespace kvzap {

inline constexpr uint32_t kCacheFileVersion = 2;  // writes 2, reads 1 and 2

struct CacheFileMeta {
  std::string press;            // the press settings the context was compressed under ("none" = uncompressed)
  std::vector<int32_t> tokens;  // the context's token ids (positions 0..n-1); n_past == tokens.size()
  std::vector<float> logits;    // [n_vocab] after the last token, or empty
};

// SHA-256 (hex) of the model's shape, vocabulary size, file size and first and last MiB of the file:
// cheap, and different for any other model file in practice.
std::string model_fingerprint(const Model& model);

// Writes atomically (common/atomic_file.h: a temporary, fsync, rename), so a crash never leaves a half
// file under `path`, and a failed write (disk full) leaves the previous file in place.
void save_cache_file(const std::string& path, const Model& model, const KvCache& cache, const CacheFileMeta& meta);

// Validates the whole file first (header, version, model, KV type, checksums, every length and
// position), then appends its entries to `cache` (empty, same shape and KV type) and sets n_past. Throws KvBudgetExceeded when the
// pool cannot hold the entries (the cache may then hold part of them: drop it).
CacheFileMeta load_cache_file(const std::string& path, const Model& model, KvCache& cache);

}  // namespace kvzap
