// KVzip+ training targets for the KVzap surrogates (docs/ALGORITHMS.md §5.1, §5.2) and the resumable
// collection loop behind `kvzap collect`.
//
// For a text t (whitespace-stripped), the model reads the two-turn conversation
//   user: t + "\n\nRepeat the previous context exactly."   assistant: t
// in one forward pass. At every layer, for each query head q, the attention a_ji of each row j of the
// assistant's copy (softmax over all keys 0..j, no chunking) onto each column i of the user's copy is
// scaled by ||W_O^(q) v_i|| / ||h_j|| (h = post-norm attention input); the target of (i, layer, KV head)
// is the natural log of the max over j and over the G query heads of that KV head, clamped at 1e-30.
// The surrogate input X is h_i of the same layer at the original position i. Arithmetic is f32 (softmax
// sums in double), keys and values are the step's f32 tensors.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/session.h"
#include "model/model.h"
#include "press/kvzip_math.h"
#include "train/dataset.h"

namespace kvzap {

// Python str.strip() for the whitespace that occurs in text files (ASCII whitespace incl. \x1c-\x1f).
std::string strip_text(const std::string& s);

// The rendered repeat conversation and where the two copies of the text are, in tokens.
struct RepeatPrompt {
  std::vector<int32_t> ids;
  int64_t start_prompt = 0, end_prompt = 0;  // the user's copy: [start_prompt, end_prompt)
  int64_t start_rep = 0, end_rep = 0;        // the assistant's copy: [start_rep, end_rep)
  int64_t n_text() const { return end_prompt - start_prompt; }
};

// Renders the model's chat template (default system turn included, no generation prompt), tokenises the
// whole rendered string and finds each copy's span from character offsets: the first token starting at
// or after each boundary. The copies usually have the same tokens; a token merged across a boundary can
// make their last tokens differ (kvzap::Error for an empty text or a span without tokens).
RepeatPrompt build_repeat_prompt(const Tokenizer& tok, const std::string& text);

// k distinct offsets in [0, n), drawn uniformly without replacement from `seed`, sorted ascending.
std::vector<int64_t> sample_positions(int64_t n, int64_t k, uint64_t seed);

struct WindowTargets {
  int64_t n_text = 0;
  int n_layer = 0, n_head_kv = 0, n_embd = 0;
  std::vector<float> log_scores;  // [L][H][n_text]: log KVzip+ of every position of the user's copy
  std::vector<int64_t> sample;    // text offsets whose attention inputs were kept
  std::vector<float> x;           // [n_sample][L][n_embd]: h at those positions
  float log_score(int layer, int head, int64_t i) const {
    return log_scores[((size_t)layer * n_head_kv + head) * n_text + i];
  }
};

class TargetComputer {
 public:
  explicit TargetComputer(const Model& model);
  // One forward over p.ids[0, end_rep) in `session` (whose cache is cleared first; it must take the
  // whole prompt in one step: context and batch >= end_rep, else kvzap::Error).
  WindowTargets compute(Session& session, const RepeatPrompt& p, const std::vector<int64_t>& sample);

 private:
  struct Observer;
  const Model& model_;
  OutputNorms norms_;
  ColumnMaxWorkspace ws_;
};

// ---- Windows of corpus text ----

struct TextWindow {
  uint32_t id = 0;         // index in the deterministic window order
  std::string doc;         // the document it was cut from
  std::string source;      // the document's folder name (corpus subset)
  int64_t first_line = 0;  // 0-based line of the document where the window starts
  std::string text;        // already stripped
  int64_t n_tokens = 0;    // tokens of `text` (no BOS)
};

struct WindowOptions {
  int64_t min_tokens = 750;
  int64_t max_tokens = 1250;
  uint64_t seed = 0;
};

// Document paths listed one per line in `list_file` (blank lines and '#' comments skipped); relative
// paths are resolved against the list file's folder.
std::vector<std::string> read_file_list(const std::string& list_file);

// Cuts up to `count` windows of min..max tokens (inclusive) at line boundaries, one per document,
// visiting the sources (parent folder names) round-robin and each source's documents in a seeded
// order; the start line (a paragraph start) and the target length are drawn from the seed too.
// Deterministic, and the first k windows do not depend on `count` (a longer run extends a shorter
// one). Documents that give no window in range are passed over.
std::vector<TextWindow> cut_windows(const Tokenizer& tok, const std::vector<std::string>& docs, int64_t count,
                                    const WindowOptions& opt);

// ---- Resumable collection ----

struct CollectOptions {
  int64_t tokens_per_window = 200;  // sampled positions per window (all if the window is shorter)
  uint64_t seed = 0;                // position sampling: window w uses a seed derived from (seed, w)
  DatasetDtype x_dtype = DatasetDtype::F16;
  // Opaque description of everything that determines the records (model, corpus, options). Stored
  // next to the dataset in <out>.json; a resumed run with different settings is refused.
  std::string settings;
};

struct CollectEvent {
  int64_t windows_done = 0;   // windows finished (incl. those of earlier runs)
  int64_t windows_total = 0;
  int64_t records = 0;        // records in the file
  const TextWindow* window = nullptr;  // the window just finished (or skipped); null at the start
  bool skipped = false;
  std::string note;           // why a window was skipped
};
// Called once before the first window (window == nullptr, windows_done = windows already complete)
// and after each window; returning false stops the collection (the file stays consistent).
using CollectCallback = std::function<bool(const CollectEvent&)>;

struct CollectReport {
  int64_t windows_total = 0;
  int64_t windows_resumed = 0;  // already complete in the file when the run started
  int64_t windows_done = 0;     // complete at the end (incl. resumed and skipped)
  int64_t windows_skipped = 0;  // this run
  int64_t records = 0;
  bool dropped_partial = false; // an incomplete last window was removed before resuming
  bool stopped = false;         // the callback stopped the run early
};

// Appends the targets of `windows` to the .kvzd file at out_path, one group per window id, each
// window's records written and flushed at once. An existing file is resumed: an incomplete last
// window is dropped, complete windows are skipped.
CollectReport collect_targets(Session& session, TargetComputer& targets, const std::vector<TextWindow>& windows,
                              const std::string& out_path, const CollectOptions& opt,
                              const CollectCallback& callback = {});

}  // namespace kvzap
