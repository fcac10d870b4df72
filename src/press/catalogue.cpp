// The press catalogue (press/catalogue.h): the registry, the name families and the kvpress gaps as one
// JSON document, and the Python class names of the presses.
#include "press/catalogue.h"

#include <algorithm>
#include <cctype>

#include "press/press.h"
#include "press/press_spec.h"

namespace kvzap {

std::vector<PressFamily> press_families() {
  return {
      {"adakv_<press>", "AdaKVPress", "adakv_keydiff",
       "any press under AdaKV's budget: the ratio shared per layer by the heads, each keeping a share, with the "
       "press's parameters and alpha_safeguard=0.2",
       "see docs/PARITY.md (adakv_<press> rows)"},
      {"dms_<press>", "DMSPress", "dms_knorm",
       "any press's scores under a threshold, the window (128) most recent tokens kept; a per-token press also "
       "with --decode-press, a whole-context press judged once the context is prefilled",
       "exact for dms_knorm, dms_keydiff, dms_snapkv and dms_tova (docs/PARITY.md)"},
      {"per_layer_<press>", "PerLayerCompressionPress", "per_layer_knorm",
       "a per-head ratio press with one ratio per layer, --press-ratios R0:R1:... (JSON \"ratios\")",
       press_traits("per_layer_knorm").kvpress_parity},
      {"composed_<a>+<b>[+...]", "ComposedPress", "composed_snapkv+knorm",
       "presses applied in turn, each on what the previous kept, one ratio per stage, --press-ratios Ra:Rb; later "
       "stages score each entry alone (per-token presses such as knorm)",
       press_traits("composed_snapkv+knorm").kvpress_parity},
      {"decoding_<press>", "DecodingPress", "decoding_knorm",
       "the context prefilled whole; while decoding, every compression_interval (512) steps each head keeps its "
       "target_size (2048) best entries by a per-token press's scores, the rest freed",
       press_traits("decoding_knorm").kvpress_parity},
      {"compression_ratio_decoding_<press>", "CompressionRatioDecodingPress", "compression_ratio_decoding_knorm",
       "as decoding_<press>, each head cut to max(1, int(P (1 - target_compression_ratio))) of the P tokens seen",
       press_traits("compression_ratio_decoding_knorm").kvpress_parity},
      {"key_rerotation_<press>", "KeyRerotationPress", "key_rerotation_snapkv",
       "any press taking a ratio, then each head's kept keys re-rotated to contiguous positions 0..n_kept-1 "
       "(queries keep theirs)",
       press_traits("key_rerotation_snapkv").kvpress_parity},
      {"prefill_decoding_<a>+<b>", "PrefillDecodingPress", "prefill_decoding_snapkv+decoding_knorm",
       "press <a> on the context (the spec's ratio or threshold), then the decoding press <b> (decoding_<press> or "
       "compression_ratio_decoding_<press>) on the question and generated tokens, over what <a> kept",
       press_traits("prefill_decoding_snapkv+decoding_knorm").kvpress_parity},
  };
}

std::string press_python_class(const std::string& name) {
  static const std::pair<const char*, const char*> kvpress[] = {
      {"knorm", "KnormPress"},          {"random", "RandomPress"},
      {"streaming_llm", "StreamingLLMPress"}, {"snapkv", "SnapKVPress"},
      {"tova", "TOVAPress"},            {"observed_attention", "ObservedAttentionPress"},
      {"expected_attention", "ExpectedAttentionPress"}, {"pyramidkv", "PyramidKVPress"},
      {"keydiff", "KeyDiffPress"},      {"lagkv", "LagKVPress"},
      {"chunkkv", "ChunkKVPress"},      {"cur", "CURPress"},
      {"compactor", "CompactorPress"},  {"kvzip", "KVzipPress"},
      {"kvzip+", "KVzipPlusPress"},     {"kvzap-linear", "KVzapPress"},
      {"kvzap-mlp", "KVzapPress"},      {"simlayerkv", "SimLayerKVPress"},
      {"non_causal_attn", "NonCausalAttnPress"}, {"leverage_score", "LeverageScorePress"},
      {"cap", "CapPress"},              {"entropy_gated_chunkkv", "EntropyGatedChunkKVPress"},
      {"qfilter", "QFilterPress"},      {"expected_attention_stats", "ExpectedAttentionStatsPress"}};
  for (const auto& [n, c] : kvpress)
    if (name == n) return c;
  std::string out;
  bool up = true;
  for (char ch : name) {
    if (ch == '_' || ch == '-' || ch == '+') {
      up = true;
      continue;
    }
    out += up ? (char)std::toupper((unsigned char)ch) : ch;
    up = false;
  }
  return out + "Press";
}

bool press_is_kvpress_class(const std::string& name) {
  for (const char* wrapped : {"adakv_", "chunk_", "block_", "critical_"})
    if (name.rfind(wrapped, 0) == 0) return false;
  return name != "kvzip+" && name != "expected_attention_uniform";
}

nlohmann::json press_catalogue_json() {
  using nlohmann::json;
  std::vector<const ScorerEntry*> entries;
  for (const ScorerEntry& e : scorer_registry()) entries.push_back(&e);
  std::sort(entries.begin(), entries.end(), [](const ScorerEntry* a, const ScorerEntry* b) { return a->name < b->name; });
  json presses = json::array();
  for (const ScorerEntry* e : entries) {
    json pol = json::array();
    if (e->traits.own_budget) {
      pol.push_back("own_budget");
    } else {
      if (e->supports_threshold) pol.push_back("threshold");
      pol.push_back("ratio");
    }
    presses.push_back({{"name", e->name},
                       {"description", e->description},
                       {"policies", pol},
                       {"supports_threshold", e->supports_threshold},
                       {"own_budget", e->traits.own_budget},
                       {"needs_query_stats", e->traits.needs_query_stats},
                       {"kvpress_ratio_scope", e->traits.kvpress_ratio_scope},
                       {"kvpress_parity", e->traits.kvpress_parity.empty() ? "not compared" : e->traits.kvpress_parity},
                       {"python_class", press_python_class(e->name)},
                       {"kvpress_class", press_is_kvpress_class(e->name)},
                       {"params", press_params_json(e->traits)},
                       {"demo_params", e->traits.demo_params}});
  }
  json families = json::array();
  for (const PressFamily& f : press_families())
    families.push_back({{"pattern", f.pattern}, {"kvpress_class", f.kvpress_class}, {"example", f.example},
                        {"description", f.description}, {"kvpress_parity", f.kvpress_parity}});
  json gaps = json::array();
  for (const KvpressGap& g : kvpress_gaps())
    gaps.push_back({{"kvpress_class", g.kvpress_class}, {"name", g.name}, {"reason", g.reason}});
  return {{"presses", presses}, {"families", families}, {"kvpress_gaps", gaps}};
}

}  // namespace kvzap
