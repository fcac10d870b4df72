#include "cli/generate_cache.h"

#include <cstdio>

#include "engine/cache_file.h"

namespace kvzap::cli {

void save_context_cache(const std::string& path, Session& s, const std::vector<int32_t>& context_ids, const PressArgs& press) {
  CacheFileMeta meta;
  const PressSpec spec = press.spec();
  meta.press = press_spec_key(spec.name.empty() ? nullptr : &spec);
  meta.tokens = context_ids;
  meta.logits.assign(s.logits(), s.logits() + s.model().config().n_vocab);
  save_cache_file(path, s.model(), s.cache(), meta);
  std::fprintf(stderr, "[saved the compressed context (%zu tokens, %.2f MB of KV) to %s]\n", context_ids.size(),
               s.cache().bytes_resident() / 1e6, path.c_str());
}

int generate_from_saved_cache(const std::string& path, Session& s, const CachedGenerateOptions& o) {
  s.reset();
  const CacheFileMeta meta = load_cache_file(path, s.model(), s.cache());
  if ((int64_t)meta.tokens.size() >= s.n_ctx())
    throw Error(path + ": the saved context (" + std::to_string(meta.tokens.size()) + " tokens) does not fit the context of " +
                std::to_string(s.n_ctx()) + " tokens (raise -c)");
  if (meta.logits.empty() && o.continuation.empty()) throw Error(path + ": the file has no logits: give -p TEXT to continue from");
  if (!meta.logits.empty()) std::copy(meta.logits.begin(), meta.logits.end(), s.sequence().mutable_logits());
  const Tokenizer& tok = s.model().tokenizer();
  const std::vector<int32_t> more = o.continuation.empty() ? std::vector<int32_t>{} : tok.encode(o.continuation, false, true);
  if ((int64_t)(meta.tokens.size() + more.size()) >= s.n_ctx()) throw Error("the saved context and -p together are longer than the context");
  const double evicted = s.cache().evicted_fraction();
  const int64_t kv_bytes = s.cache().bytes_resident(), kv_full = s.cache().bytes_full();
  GenerateResult r = s.generate(more, o.gen, [&](const std::string& piece) {
    if (o.stream && !o.json) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    }
    return true;
  });
  if (o.json) {
    nlohmann::json j = {{"text", r.text}, {"tokens", r.tokens}, {"n_cached_tokens", meta.tokens.size()},
                        {"n_prompt_tokens", meta.tokens.size() + more.size()}, {"n_generated", r.tokens.size()},
                        {"stop_reason", r.stop_reason}, {"press", meta.press}, {"evicted_fraction", evicted},
                        {"kv_bytes", kv_bytes}, {"kv_bytes_full", kv_full}};
    std::printf("%s\n", json_dump(j).c_str());
    return 0;
  }
  if (!o.stream) std::fwrite(r.text.data(), 1, r.text.size(), stdout);
  std::printf("\n");
  std::fprintf(stderr, "[loaded %zu context tokens from %s (KV %.2f MB of %.2f MB, evicted %.1f%%, press %s) | generated %zu tokens, stop: %s]\n",
               meta.tokens.size(), path.c_str(), kv_bytes / 1e6, kv_full / 1e6, 100 * evicted, meta.press.c_str(),
               r.tokens.size(), r.stop_reason.c_str());
  return 0;
}

}  // namespace kvzap::cli
