// kvzap collect: KVzip+ training pairs (h, log s+) for the KVzap surrogates (docs/ALGORITHMS.md §5.1,
// §5.2) from a text corpus, appended to a .kvzd dataset. Resumable: the same command continues where
// it stopped, and a larger --windows extends a finished run.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli/cli_common.h"
#include "common/atomic_file.h"
#include "common/progress.h"
#include "fetch/model_store.h"
#include "train/targets.h"

namespace kvzap::cli {
namespace {

namespace fs = std::filesystem;

struct CollectArgs {
  ModelArgs m;
  std::string corpus, split = "train", files, out, x_dtype = "f16";
  int64_t windows = 200, tokens_per_window = 200, min_tokens = 750, max_tokens = 1250;
  uint64_t seed = 0;
};

std::string file_digest(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  uint64_t h = 1469598103934665603ull;
  char c;
  while (in.get(c)) h = (h ^ (unsigned char)c) * 1099511628211ull;
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016llx", (unsigned long long)h);
  return buf;
}

int run_collect(const CollectArgs& a) {
  if (a.corpus.empty() == a.files.empty()) throw Error("give exactly one of --corpus DIR or --files LIST");
  if (a.tokens_per_window > a.min_tokens)
    throw Error("--tokens-per-window must not exceed --min-tokens (every window must have that many tokens)");
  const std::string list = a.files.empty() ? (fs::path(a.corpus) / (a.split + ".txt")).string() : a.files;
  const std::vector<std::string> docs = read_file_list(list);
  for (const std::string& d : docs)
    if (d.find("/heldout/") != std::string::npos)
      throw Error(d + ": held-out evaluation texts must never be training data");

  auto model = a.m.load_model();
  const ModelConfig& c = model->config();
  WindowOptions wo;
  wo.min_tokens = a.min_tokens;
  wo.max_tokens = a.max_tokens;
  wo.seed = a.seed;
  std::fprintf(stderr, "collect: cutting %lld windows of %lld-%lld tokens from %zu documents (%s)\n",
               (long long)a.windows, (long long)a.min_tokens, (long long)a.max_tokens, docs.size(), list.c_str());
  const std::vector<TextWindow> windows = cut_windows(model->tokenizer(), docs, a.windows, wo);
  if ((int64_t)windows.size() < a.windows)
    std::fprintf(stderr, "collect: only %zu windows available\n", windows.size());

  // Which text each window is, next to the dataset (rewritten each run; deterministic).
  {
    std::ostringstream f;
    f << "id\tsource\tdoc\tfirst_line\tn_tokens\n";
    for (const TextWindow& w : windows)
      f << w.id << '\t' << w.source << '\t' << w.doc << '\t' << w.first_line << '\t' << w.n_tokens << '\n';
    write_file_atomic(a.out + ".windows.tsv", f.str());
  }

  CollectOptions co;
  co.tokens_per_window = a.tokens_per_window;
  co.seed = a.seed;
  co.x_dtype = parse_dataset_dtype(a.x_dtype);
  const nlohmann::json settings = {
      {"model", c.name}, {"model_file_size", model->weights_file_bytes()},
      {"n_layer", c.n_layer}, {"n_embd", c.n_embd}, {"n_head_kv", c.n_head_kv},
      {"file_list", fs::path(list).filename().string()}, {"file_list_digest", file_digest(list)},
      {"tokens_per_window", a.tokens_per_window}, {"min_tokens", a.min_tokens}, {"max_tokens", a.max_tokens},
      {"seed", a.seed}, {"x_dtype", a.x_dtype}, {"targets", "KVzip+ log, kvzap-spec.md 2.2"}};
  co.settings = settings.dump(2);

  SessionOptions so = a.m.session_options();
  so.n_ctx = std::max<int64_t>(so.n_ctx, 2 * a.max_tokens + 256);  // both copies + template
  so.n_batch = so.n_ctx;
  Session session(*model, so);
  std::fprintf(stderr, "collect: computing W_O Gram matrices\n");
  TargetComputer targets(*model);

  std::unique_ptr<Progress> bar;
  int64_t skipped = 0;
  const CollectReport rep = collect_targets(session, targets, windows, a.out, co, [&](const CollectEvent& ev) {
    if (!ev.window) {  // start
      bar = std::make_unique<Progress>("collect", ev.windows_total, "win", ev.windows_done);
      bar->update(ev.windows_done, std::to_string(ev.records) + " records");
      return true;
    }
    if (ev.skipped) {
      skipped++;
      std::fprintf(stderr, "%scollect: window %u (%s) skipped: %s\n", bar->is_tty() ? "\n" : "", ev.window->id,
                   ev.window->doc.c_str(), ev.note.c_str());
    }
    bar->update(ev.windows_done, std::to_string(ev.records) + " records");
    return true;
  });
  if (bar) bar->finish();
  if (rep.dropped_partial) std::fprintf(stderr, "collect: dropped an incomplete last window before resuming\n");
  std::fprintf(stderr, "collect: %s holds %lld records from %lld windows (%lld resumed, %lld skipped this run)\n",
               a.out.c_str(), (long long)rep.records, (long long)rep.windows_done, (long long)rep.windows_resumed,
               (long long)rep.windows_skipped);
  return 0;
}

RegisterCommand reg("collect", "collect KVzip+ training targets for KVzap surrogates from a text corpus (resumable)",
                    [](CLI::App& sub) {
  auto a = std::make_shared<CollectArgs>();
  a->m.add_to(sub);
  sub.add_option("--corpus", a->corpus, "corpus folder made by scripts/make_corpus.sh (reads <split>.txt)");
  sub.add_option("--split", a->split, "corpus split: train or test")->check(CLI::IsMember({"train", "test"}));
  sub.add_option("--files", a->files, "a file listing the documents, one path per line (instead of --corpus)");
  sub.add_option("--out", a->out, "the .kvzd dataset to create or continue")->required();
  sub.add_option("--windows", a->windows, "number of text windows")->check(CLI::Range((int64_t)1, (int64_t)1 << 30));
  sub.add_option("--tokens-per-window", a->tokens_per_window, "positions sampled per window")
      ->check(CLI::Range((int64_t)1, (int64_t)1 << 20));
  sub.add_option("--min-tokens", a->min_tokens, "shortest window (tokens)")->check(CLI::Range((int64_t)1, (int64_t)1 << 20));
  sub.add_option("--max-tokens", a->max_tokens, "longest window (tokens)")->check(CLI::Range((int64_t)1, (int64_t)1 << 20));
  sub.add_option("--seed", a->seed, "seed of the window cutting and position sampling");
  sub.add_option("--x-dtype", a->x_dtype, "storage type of the inputs h: f16, bf16 or f32")
      ->check(CLI::IsMember({"f16", "bf16", "f32"}));
  return [a]() { return run_collect(*a); };
});

}  // namespace
}  // namespace kvzap::cli
