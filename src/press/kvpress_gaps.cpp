// The presses kvpress 0.5.5 ships that kvzap does not have, each with the reason (issue 38: "where a press
// cannot be matched, say so in `kvzap presses` and docs"). `kvzap presses` prints this list and an
// unknown press name that is one of these says why it is missing. Remove an entry when its press lands.
#include <algorithm>
#include <cctype>

#include "press/press.h"

namespace kvzap {

std::span<const KvpressGap> kvpress_gaps() {
  static const KvpressGap gaps[] = {
      {"DuoAttentionPress", "duo_attention",
       "needs per-head retrieval/streaming patterns downloaded from the hub (or optimised on the model); "
       "estimating them natively is not done yet"},
      {"FastKVzipPress", "fastkvzip",
       "needs gates trained by its authors (hub); training them natively, as kvzap trains KVzap's "
       "surrogates, is not done yet"},
      {"LUKVPress", "lukv",
       "needs a per-(layer, head) budget curve from the LU-KV repository, published only for "
       "Llama-3.1-8B with ExpectedAttention; no curve exists for the models kvzap runs"},
      {"RestoreKVPress", "restorekv",
       "needs LoRA adapters and restore embeddings trained by its authors (hub), only for 8B models"},
      {"KVgradPress", "kvgrad",
       "scores by input x gradient attribution: needs a backward pass through the model, which kvzap's "
       "inference engine does not have"},
      {"ThinKPress", "think",
       "prunes key channels, not tokens: freeing that memory needs keys with fewer channels per head in "
       "the paged cache and attention kernels; not done yet (kvpress only zeroes the channels)"},
      {"CAMPress", "cam",
       "merges evicted values into their neighbours while decoding; value merging is not done yet"},
      {"MergingPress", "merging",
       "folds each evicted value into its most similar kept one; value merging is not done yet"},
      {"KVComposePress", "kvcompose",
       "composite tokens aligned across heads from attention weights; not done yet"},
      {"FinchPress", "finch",
       "question-aware chunked SnapKV that needs a delimiter token between context and question and "
       "re-rotates keys; not done yet"},
  };
  return gaps;
}

const KvpressGap* find_kvpress_gap(const std::string& press_name) {
  auto lower = [](std::string s) {
    std::string out;
    for (char c : s)
      if (std::isalnum((unsigned char)c)) out += (char)std::tolower((unsigned char)c);
    return out;
  };
  const std::string want = lower(press_name);
  for (const KvpressGap& g : kvpress_gaps()) {
    std::string cls = lower(g.kvpress_class);
    if (want == lower(g.name) || want == cls || want + "press" == cls) return &g;
  }
  return nullptr;
}

}  // namespace kvzap
