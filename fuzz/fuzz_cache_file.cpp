// Saved-cache file reader (src/cache/cache_file.*), against a tiny model (fuzz/data/tiny_llama.gguf).
// A fuzzer cannot forge SHA-256, so by default the harness repairs the fields a writer computes
// (model fingerprint, payload size, payload checksum, header checksum) before loading; that lets it
// reach every check after them. Input byte 0: bit 0 set = repair nothing (the checksum checks
// themselves), bit 1 = a pool with a 2-page budget (KvBudgetExceeded), bit 2 = an f32 cache (files of
// the other KV type are refused), rest = the file.
// A loaded cache must hold only valid entries, and save + load must give the same cache back.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "engine/cache_file.h"
#include "cache/page_pool.h"
#include "common/sha256.h"
#include "fuzz_common.h"
#include "kvzap/error.h"
#include "model/model.h"

namespace {

using namespace kvzap;

const Model& model() {
  static const std::unique_ptr<Model> m = Model::load(KVZAP_SOURCE_DIR "/fuzz/data/tiny_llama.gguf");
  return *m;
}

std::string raw(const std::string& hex) {
  std::string r(hex.size() / 2, '\0');
  for (size_t i = 0; i < r.size(); i++) r[i] = (char)std::stoi(hex.substr(2 * i, 2), nullptr, 16);
  return r;
}

constexpr size_t kHeader = 144;

void repair(std::string& f) {
  if (f.size() < kHeader) return;
  static const std::string fp = raw(model_fingerprint(model()));
  std::memcpy(&f[16], fp.data(), 32);
  // Version 2 has a 4-byte KV type after the logits flag; version 1 (and anything else) does not.
  uint32_t version = 0;
  std::memcpy(&version, &f[8], 4);
  const size_t at = version >= 2 ? 92 : 88;
  const uint64_t payload = f.size() - kHeader;
  std::memcpy(&f[at], &payload, 8);
  const std::string ps = raw(sha256_hex(f.data() + kHeader, payload));
  std::memcpy(&f[at + 8], ps.data(), 32);
  const std::string hs = raw(sha256_hex(f.data(), at + 40));
  std::memcpy(&f[at + 40], hs.data(), 8);
}

// KVZAP_FUZZ_WRITE_SEED=path: writes a valid input (a small pruned cache) and exits.
void maybe_write_seed() {
  const char* out = std::getenv("KVZAP_FUZZ_WRITE_SEED");
  if (!out) return;
  const ModelConfig& c = model().config();
  KvCache cache(c.n_layer, c.n_head_kv, c.head_dim);
  std::vector<float> k((size_t)c.head_dim), v((size_t)c.head_dim);
  const int n = 20;
  for (int l = 0; l < c.n_layer; l++)
    for (int h = 0; h < c.n_head_kv; h++)
      for (int i = 0; i < n; i++) {
        if ((i + l + h) % 3 == 0) continue;  // "evicted"
        for (int d = 0; d < c.head_dim; d++) k[d] = 0.01f * (i + d), v[d] = -0.02f * (i - d);
        cache.append(l, h, k.data(), v.data(), i);
      }
  cache.set_n_past(n);
  CacheFileMeta meta;
  meta.press = "kvzap-mlp threshold=-4 window=4";
  for (int i = 0; i < n; i++) meta.tokens.push_back(i % c.n_vocab);
  meta.logits.assign((size_t)c.n_vocab, 0.5f);
  const std::string tmp = std::string(out) + ".cache";
  save_cache_file(tmp, model(), cache, meta);
  std::string bytes = std::string(1, '\0') + fuzz::fuzz_read(tmp);
  std::remove(tmp.c_str());
  fuzz::write_file("seed", bytes);
  std::filesystem::copy_file(fuzz::scratch_dir() / "seed", out, std::filesystem::copy_options::overwrite_existing);
  std::exit(0);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  (void)model();
  maybe_write_seed();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t sel = data[0];
  std::string file(reinterpret_cast<const char*>(data + 1), size - 1);
  if (!(sel & 1)) repair(file);
  const std::string path = fuzz::write_file("input.kvzcache", file);
  const ModelConfig& c = model().config();
  const KvType type = sel & 4 ? KvType::F32 : KvType::F16;
  const int64_t page = KvCache::page_bytes_for(c.head_dim, type);
  PagePool pool(page, (sel & 2 ? 2 : 1 << 16) * page);
  KvCache cache(c.n_layer, c.n_head_kv, c.head_dim, &pool, type);
  CacheFileMeta meta;
  try {
    meta = load_cache_file(path, model(), cache);
  } catch (const Error&) {
    return 0;
  }
  if ((int64_t)meta.tokens.size() != cache.n_past()) __builtin_trap();
  for (int l = 0; l < c.n_layer; l++)
    for (int h = 0; h < c.n_head_kv; h++) {
      int32_t prev = -1;
      for (int64_t i = 0; i < cache.length(l, h); i++) {
        const int32_t p = cache.position_at(l, h, i);
        if (p <= prev || p >= cache.n_past()) __builtin_trap();
        prev = p;
      }
    }
  // Round trip.
  const std::string again = (fuzz::scratch_dir() / "again.kvzcache").string();
  save_cache_file(again, model(), cache, meta);
  KvCache cache2(c.n_layer, c.n_head_kv, c.head_dim, nullptr, type);
  const CacheFileMeta meta2 = load_cache_file(again, model(), cache2);
  if (meta2.tokens != meta.tokens || meta2.press != meta.press || meta2.logits.size() != meta.logits.size())
    __builtin_trap();
  for (int l = 0; l < c.n_layer; l++)
    for (int h = 0; h < c.n_head_kv; h++) {
      if (cache2.length(l, h) != cache.length(l, h)) __builtin_trap();
      for (int64_t i = 0; i < cache.length(l, h); i++)
        if (cache2.position_at(l, h, i) != cache.position_at(l, h, i) ||
            std::memcmp(cache2.page_keys_raw(l, h, (int)(i / KvCache::kPageTokens)),
                        cache.page_keys_raw(l, h, (int)(i / KvCache::kPageTokens)),
                        cache.row_bytes() * (size_t)(i % KvCache::kPageTokens + 1)) != 0)
          __builtin_trap();
    }
  return 0;
}
