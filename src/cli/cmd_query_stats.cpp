// kvzap query-stats: the query statistics the expected_attention_stats and qfilter presses read (issue 38,
// press/query_stats.h), computed from the model's own queries: one prefill per calibration window (cut
// from a corpus like `collect` does) with a QueryStatsCollector watching every layer, the first --n-sink
// tokens of each window left out. Writes one safetensors file (query_mean, query_cov, q_filters), by
// default beside the model where the presses look for it.
#include <cstdio>
#include <filesystem>

#include "cli/cli_common.h"
#include "common/progress.h"
#include "press/query_stats.h"
#include "train/targets.h"

namespace kvzap::cli {
namespace {

namespace fs = std::filesystem;

struct QueryStatsArgs {
  ModelArgs m;
  std::string corpus, split = "train", files, out;
  int64_t windows = 100, min_tokens = 500, max_tokens = 1000, n_sink = 4;
  uint64_t seed = 0;
};

int run_query_stats(const QueryStatsArgs& a) {
  if (a.corpus.empty() == a.files.empty()) throw Error("give exactly one of --corpus DIR or --files LIST");
  if (a.min_tokens > a.max_tokens) throw Error("--min-tokens must not exceed --max-tokens");
  const std::string list = a.files.empty() ? (fs::path(a.corpus) / (a.split + ".txt")).string() : a.files;
  const std::vector<std::string> docs = read_file_list(list);
  for (const std::string& d : docs)
    if (d.find("/heldout/") != std::string::npos)
      throw Error(d + ": held-out evaluation texts must never be calibration data");

  auto model = a.m.load_model();
  const ModelConfig& c = model->config();
  const std::string out = a.out.empty() ? default_query_stats_path(*model) : a.out;
  WindowOptions wo;
  wo.min_tokens = a.min_tokens;
  wo.max_tokens = a.max_tokens;
  wo.seed = a.seed;
  const std::vector<TextWindow> windows = cut_windows(model->tokenizer(), docs, a.windows, wo);
  if (windows.empty()) throw Error(list + ": no window of " + std::to_string(a.min_tokens) + "-" +
                                   std::to_string(a.max_tokens) + " tokens in these documents");
  std::fprintf(stderr, "query-stats: %zu windows of %lld-%lld tokens from %zu documents (%s)\n", windows.size(),
               (long long)a.min_tokens, (long long)a.max_tokens, docs.size(), list.c_str());

  SessionOptions so = a.m.session_options();
  so.n_ctx = std::max<int64_t>(so.n_ctx, a.max_tokens + 16);  // one window (and its BOS) per prefill
  Session session(*model, so);
  QueryStatsCollector collector(c, a.n_sink);
  Progress bar("query-stats", (int64_t)windows.size(), "win");
  int64_t done = 0, tokens = 0;
  for (const TextWindow& w : windows) {
    const std::vector<int32_t> ids = model->tokenizer().encode(w.text, true);
    session.reset();
    session.set_observer(&collector);
    session.feed(ids);  // positions 0..n-1: the collector skips the first n_sink of this window
    session.set_observer(nullptr);
    tokens += (int64_t)ids.size();
    bar.update(++done, std::to_string(tokens) + " tokens");
  }
  bar.finish();
  session.reset();
  const QueryStats stats = collector.finish();
  stats.save(out, {{"model", c.name},
                   {"model_file_size", std::to_string(model->weights_file_bytes())},
                   {"file_list", fs::path(list).filename().string()},
                   {"windows", std::to_string(windows.size())},
                   {"min_tokens", std::to_string(a.min_tokens)},
                   {"max_tokens", std::to_string(a.max_tokens)},
                   {"seed", std::to_string(a.seed)}});
  std::fprintf(stderr, "query-stats: %lld queries per head from %zu windows -> %s\n", (long long)stats.n_queries,
               windows.size(), out.c_str());
  std::printf("%s\n", out.c_str());
  return 0;
}

RegisterCommand reg("query-stats",
                    "compute the query statistics of expected_attention_stats and qfilter from calibration text",
                    [](CLI::App& sub) {
  auto a = std::make_shared<QueryStatsArgs>();
  a->m.add_to(sub);
  sub.add_option("--corpus", a->corpus, "corpus folder made by scripts/make_corpus.sh (reads <split>.txt)");
  sub.add_option("--split", a->split, "corpus split: train or test")->check(CLI::IsMember({"train", "test"}));
  sub.add_option("--files", a->files, "a file listing the documents, one path per line (instead of --corpus)");
  sub.add_option("--out", a->out,
                 "the safetensors file to write (default: beside the model, <model>.query_stats.safetensors, "
                 "where the presses look without --surrogate)");
  sub.add_option("--windows", a->windows, "number of text windows")->check(CLI::Range((int64_t)1, (int64_t)1 << 30));
  sub.add_option("--min-tokens", a->min_tokens, "shortest window (tokens)")->check(CLI::Range((int64_t)8, (int64_t)1 << 20));
  sub.add_option("--max-tokens", a->max_tokens, "longest window (tokens)")->check(CLI::Range((int64_t)8, (int64_t)1 << 20));
  sub.add_option("--n-sink", a->n_sink, "first tokens of each window left out of the statistics (kvpress n_sink)")
      ->check(CLI::Range((int64_t)0, (int64_t)1 << 20));
  sub.add_option("--seed", a->seed, "seed of the window cutting");
  return [a]() { return run_query_stats(*a); };
});

}  // namespace
}  // namespace kvzap::cli
