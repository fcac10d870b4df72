#include "engine/cache_file.h"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/atomic_file.h"
#include "common/sha256.h"
#include "kvzap/error.h"

namespace kvzap {
namespace {

constexpr char kMagic[8] = {'K', 'V', 'Z', 'C', 'A', 'C', 'H', 'E'};
constexpr size_t kHeaderBytes = 144;  // 140 used (version 1: 136), zero padded

// Appends little-endian scalars and raw bytes.
struct Writer {
  std::string out;
  template <class T> void put(T v) { out.append((const char*)&v, sizeof v); }
  void bytes(const void* p, size_t n) { out.append((const char*)p, n); }
};

// Reads with bounds checks; every failure names the file and what was cut short.
struct Reader {
  const std::string& data;
  size_t pos;
  const std::string& path;
  void need(size_t n, const char* what) const {
    if (n > data.size() - pos) throw Error(path + ": truncated cache file (" + what + " runs past the end)");
  }
  template <class T> T get(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, data.data() + pos, sizeof v);
    pos += sizeof v;
    return v;
  }
  const char* take(size_t n, const char* what) {
    need(n, what);
    const char* p = data.data() + pos;
    pos += n;
    return p;
  }
};

std::string raw_sha256(const void* p, size_t n) {
  const std::string hex = sha256_hex(p, n);
  std::string raw(32, '\0');
  for (size_t i = 0; i < 32; i++) raw[i] = (char)std::stoi(hex.substr(2 * i, 2), nullptr, 16);
  return raw;
}

std::string fingerprint_raw(const Model& model) {
  const std::string hex = model_fingerprint(model);
  std::string raw(32, '\0');
  for (size_t i = 0; i < 32; i++) raw[i] = (char)std::stoi(hex.substr(2 * i, 2), nullptr, 16);
  return raw;
}

}  // namespace

std::string model_fingerprint(const Model& model) {
  const ModelConfig& c = model.config();
  Sha256 h;
  std::ostringstream shape;
  shape << c.arch << '|' << c.n_layer << '|' << c.n_embd << '|' << c.n_head << '|' << c.n_head_kv << '|' << c.head_dim
        << '|' << c.n_ff << '|' << c.n_vocab << '|' << model.weights_file_bytes();
  const std::string s = shape.str();
  h.update(s.data(), s.size());
  std::ifstream in(model.weights_path(), std::ios::binary);
  const size_t size = (size_t)std::filesystem::file_size(model.weights_path()), mib = 1 << 20;
  std::string buf(std::min(size, mib), '\0');
  if (in.read(buf.data(), (std::streamsize)buf.size())) h.update(buf.data(), buf.size());
  if (size > mib && in.seekg((std::streamoff)(size - buf.size())) && in.read(buf.data(), (std::streamsize)buf.size()))
    h.update(buf.data(), buf.size());
  return h.hex_digest();
}

void save_cache_file(const std::string& path, const Model& model, const KvCache& cache, const CacheFileMeta& meta) {
  const int L = cache.n_layer(), H = cache.n_head_kv();
  const size_t row = cache.row_bytes();
  Writer p;
  p.bytes(meta.press.data(), meta.press.size());
  p.bytes(meta.tokens.data(), meta.tokens.size() * sizeof(int32_t));
  p.bytes(meta.logits.data(), meta.logits.size() * sizeof(float));
  for (int l = 0; l < L; l++)
    for (int h = 0; h < H; h++) {
      const int64_t len = cache.length(l, h);
      p.put<uint32_t>((uint32_t)len);
      // Pages hold [kPageTokens] positions, then keys and values [kPageTokens][D]: write each part whole.
      for (int part = 0; part < 3; part++)
        for (int pg = 0; pg < cache.n_pages(l, h); pg++) {
          const int64_t n = std::min<int64_t>(KvCache::kPageTokens, len - (int64_t)pg * KvCache::kPageTokens);
          if (part == 0) p.bytes(cache.page_positions(l, h, pg), (size_t)n * sizeof(int32_t));
          if (part == 1) p.bytes(cache.page_keys_raw(l, h, pg), (size_t)n * row);
          if (part == 2) p.bytes(cache.page_values_raw(l, h, pg), (size_t)n * row);
        }
    }
  Writer hd;
  hd.bytes(kMagic, sizeof kMagic);
  hd.put<uint32_t>(kCacheFileVersion);
  hd.put<uint32_t>((uint32_t)kHeaderBytes);
  hd.bytes(fingerprint_raw(model).data(), 32);
  hd.put<uint32_t>((uint32_t)L);
  hd.put<uint32_t>((uint32_t)H);
  hd.put<uint32_t>((uint32_t)cache.head_dim());
  hd.put<uint32_t>((uint32_t)model.config().n_vocab);
  hd.put<int64_t>(cache.n_past());
  hd.put<uint64_t>(meta.tokens.size());
  hd.put<uint32_t>((uint32_t)meta.press.size());
  hd.put<uint32_t>(meta.logits.empty() ? 0u : 1u);
  hd.put<uint32_t>((uint32_t)cache.kv_type());
  hd.put<uint64_t>(p.out.size());
  hd.bytes(raw_sha256(p.out.data(), p.out.size()).data(), 32);
  hd.bytes(raw_sha256(hd.out.data(), hd.out.size()).data(), 8);
  hd.out.resize(kHeaderBytes, '\0');

  write_file_atomic(path, {hd.out, p.out});
}

CacheFileMeta load_cache_file(const std::string& path, const Model& model, KvCache& cache) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot open the cache file");
  std::ostringstream ss;
  ss << in.rdbuf();
  const std::string data = ss.str();
  if (data.size() < kHeaderBytes) throw Error(path + ": truncated cache file (" + std::to_string(data.size()) + " bytes, shorter than its header)");
  if (std::memcmp(data.data(), kMagic, sizeof kMagic) != 0) throw Error(path + ": not a kvzap cache file (bad magic)");
  Reader r{data, sizeof kMagic, path};
  const uint32_t version = r.get<uint32_t>("version");
  if (version != 1 && version != kCacheFileVersion)
    throw Error(path + ": unsupported cache file version " + std::to_string(version) + " (this kvzap reads versions 1 to " +
                std::to_string(kCacheFileVersion) + ")");
  if (r.get<uint32_t>("header size") != kHeaderBytes) throw Error(path + ": corrupt cache file (bad header size)");
  const std::string fp(r.take(32, "fingerprint"), 32);
  const uint32_t L = r.get<uint32_t>("n_layer"), H = r.get<uint32_t>("n_head_kv"), D = r.get<uint32_t>("head_dim");
  const uint32_t V = r.get<uint32_t>("n_vocab");
  const int64_t n_past = r.get<int64_t>("n_past");
  const uint64_t n_tokens = r.get<uint64_t>("n_tokens");
  const uint32_t press_bytes = r.get<uint32_t>("press"), has_logits = r.get<uint32_t>("logits flag");
  const uint32_t kv_type = version >= 2 ? r.get<uint32_t>("kv type") : (uint32_t)KvType::F16;  // version 1: f16
  const uint64_t payload_bytes = r.get<uint64_t>("payload size");
  const std::string payload_sha(r.take(32, "payload checksum"), 32);
  const size_t header_used = r.pos;
  const std::string header_sha(r.take(8, "header checksum"), 8);
  if (raw_sha256(data.data(), header_used).compare(0, 8, header_sha) != 0) throw Error(path + ": corrupt cache file (header checksum mismatch)");
  if (fp != fingerprint_raw(model)) throw Error(path + ": the cache file was saved for another model");
  if ((int)L != cache.n_layer() || (int)H != cache.n_head_kv() || (int)D != cache.head_dim() || (int)V != model.config().n_vocab)
    throw Error(path + ": the cache file's shape does not match the model");
  if (kv_type > (uint32_t)kKvTypeLast) throw Error(path + ": corrupt cache file (unknown KV type " + std::to_string(kv_type) + ")");
  if ((KvType)kv_type != cache.kv_type())
    throw Error(path + ": the cache file holds " + kv_type_name((KvType)kv_type) + " keys and values, but this run uses " +
                kv_type_name(cache.kv_type()) + " (rerun with --kv-type " + kv_type_name((KvType)kv_type) + ")");
  const size_t row = cache.row_bytes();
  if (payload_bytes != data.size() - kHeaderBytes)
    throw Error(path + ": truncated or padded cache file (payload is " + std::to_string(data.size() - kHeaderBytes) +
                " bytes, the header says " + std::to_string(payload_bytes) + ")");
  if (raw_sha256(data.data() + kHeaderBytes, payload_bytes) != payload_sha) throw Error(path + ": corrupt cache file (payload checksum mismatch)");
  if (n_past < 0 || (uint64_t)n_past != n_tokens) throw Error(path + ": corrupt cache file (token count differs from the cache length)");
  if (has_logits > 1) throw Error(path + ": corrupt cache file (bad logits flag)");

  Reader p{data, kHeaderBytes, path};
  CacheFileMeta meta;
  meta.press.assign(p.take(press_bytes, "press settings"), press_bytes);
  if (n_tokens > data.size() / sizeof(int32_t)) throw Error(path + ": truncated cache file (tokens run past the end)");
  meta.tokens.resize(n_tokens);
  const char* token_bytes = p.take(n_tokens * sizeof(int32_t), "tokens");
  if (n_tokens) std::memcpy(meta.tokens.data(), token_bytes, n_tokens * sizeof(int32_t));  // data() may be null
  for (int32_t t : meta.tokens)
    if (t < 0 || t >= (int32_t)V) throw Error(path + ": corrupt cache file (token id " + std::to_string(t) + " out of range)");
  if (has_logits) {
    meta.logits.resize(V);
    std::memcpy(meta.logits.data(), p.take((size_t)V * sizeof(float), "logits"), (size_t)V * sizeof(float));
  }
  // First pass: every stream's length and positions are checked before anything is appended.
  struct StreamAt { uint32_t len; const int32_t* pos; const char* keys; const char* values; };  // rows of `row` bytes
  std::vector<StreamAt> streams;
  streams.reserve((size_t)L * H);
  int64_t pages = 0;
  for (uint32_t i = 0; i < L * H; i++) {
    const uint32_t len = p.get<uint32_t>("stream length");
    if ((int64_t)len > n_past) throw Error(path + ": corrupt cache file (a stream is longer than the context)");
    StreamAt s{len, nullptr, nullptr, nullptr};
    s.pos = (const int32_t*)p.take((size_t)len * sizeof(int32_t), "positions");
    s.keys = p.take((size_t)len * row, "keys");
    s.values = p.take((size_t)len * row, "values");
    for (uint32_t j = 0; j < len; j++) {
      int32_t pos_j;
      std::memcpy(&pos_j, s.pos + j, sizeof pos_j);
      int32_t prev = 0;
      if (j > 0) std::memcpy(&prev, s.pos + j - 1, sizeof prev);
      if (pos_j < 0 || pos_j >= n_past || (j > 0 && pos_j <= prev))
        throw Error(path + ": corrupt cache file (positions out of order or out of range)");
    }
    pages += (len + KvCache::kPageTokens - 1) / KvCache::kPageTokens;
    streams.push_back(s);
  }
  if (p.pos != data.size()) throw Error(path + ": corrupt cache file (trailing bytes)");
  if (cache.n_past() != 0) throw Error("load_cache_file: the cache must be empty");
  if (pages > cache.pool().pages_available())
    throw KvBudgetExceeded(path + ": the saved cache needs " + std::to_string(pages * cache.page_bytes() / 1024) +
                           " KiB of KV pages, more than the budget has free");
  for (uint32_t i = 0; i < L * H; i++) {
    const StreamAt& s = streams[i];
    for (uint32_t j = 0; j < s.len; j++) {
      int32_t pos_j;
      std::memcpy(&pos_j, s.pos + j, sizeof pos_j);
      // Rows are copied bytewise (the file's rows need not be aligned).
      cache.append_stored((int)(i / H), (int)(i % H), s.keys + (size_t)j * row, s.values + (size_t)j * row, pos_j);
    }
  }
  cache.set_n_past(n_past);
  return meta;
}

}  // namespace kvzap
