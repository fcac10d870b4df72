// Query statistics computed natively from a model's own queries on calibration text (issue 38), for the
// presses that kvpress feeds with statistics downloaded from the hub:
//   * expected_attention_stats (kvpress ExpectedAttentionStatsPress): the mean and covariance of the
//     pre-RoPE queries of each (layer, query head), as kvpress's collect_queries computes them (covariance
//     with Bessel's correction, the first n_sink tokens of every text left out);
//   * qfilter (kvpress QFilterPress, Q-Filters, arXiv 2503.02812): one filter per (layer, KV head) from the
//     post-RoPE queries of the head's group (the G query heads sharing it), see QueryStats::q_filters.
//
// `kvzap query-stats` (cli/cmd_query_stats.cpp) runs a prefill over calibration windows with a
// QueryStatsCollector watching and writes one safetensors file:
//   query_mean [n_layer][n_head][head_dim]            F32
//   query_cov  [n_layer][n_head][head_dim][head_dim]  F32
//   q_filters  [n_layer][n_head_kv][head_dim]         F32
// with metadata (format "kvzap-query-stats", model, n_sink, n_queries, texts). Default place:
// default_query_stats_path(model), beside the model's weights file; a press takes another path from
// PressSpec::surrogate_dir (--surrogate PATH: the file, or a folder holding query_stats.safetensors).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/forward.h"
#include "press/baseline_math.h"

namespace kvzap {

class Model;
struct PressSpec;

struct QueryStats {
  int n_layer = 0, n_head = 0, n_head_kv = 0, head_dim = 0;
  int64_t n_queries = 0;          // query rows per (layer, head) the statistics were computed from
  int64_t n_sink = 4;             // first tokens of each text left out
  std::vector<float> mean;        // [n_layer][n_head][head_dim]: pre-RoPE query mean
  std::vector<float> cov;         // [n_layer][n_head][head_dim][head_dim]: pre-RoPE covariance (/(N-1))
  // [n_layer][n_head_kv][head_dim]: kvpress's convention, score = -(filter . k). Convention (kvzap): u is
  // the unit principal right singular vector of the group's post-RoPE queries Q [N][head_dim] (top
  // eigenvector of Q^T Q), its sign chosen so that the queries' mean projection sum_q (q . u) is > 0; the
  // filter is -u, so the score -(filter . k) = u . k grows with the logit q . k that a typical query (one
  // along +u) gives the key: kept keys are those the queries attend to more.
  std::vector<float> q_filters;

  const float* mean_of(int l, int h) const { return &mean[((size_t)l * n_head + h) * head_dim]; }
  const float* cov_of(int l, int h) const { return &cov[((size_t)l * n_head + h) * head_dim * head_dim]; }
  const float* filter_of(int l, int hk) const { return &q_filters[((size_t)l * n_head_kv + hk) * head_dim]; }

  // Writes the safetensors file (its folder is created); extra metadata is stored beside kvzap's own.
  void save(const std::string& path, const std::map<std::string, std::string>& metadata = {}) const;
  // Reads a file written by save; throws kvzap::Error("<path>: ...") when it is not one.
  static QueryStats load(const std::string& path);
  // Throws kvzap::Error naming `press` and the command to run when the shapes do not fit the model.
  void check_fits(const ModelConfig& c, const std::string& path, const std::string& press) const;
};

// Where `kvzap query-stats` writes by default and the presses look by default: beside the weights file,
// "<weights file without its extension>.query_stats.safetensors" (a GGUF file or a checkpoint's first shard).
std::string default_query_stats_path(const Model& model);
// The file a press reads: spec.surrogate_dir when given (a file, or a folder holding
// query_stats.safetensors), else default_query_stats_path.
std::string query_stats_path(const PressSpec& spec, const Model& model);
// Loads and checks the statistics for `press` (one copy per file while any press holds it). Throws
// kvzap::Error with the `kvzap query-stats` command to run when the file is missing or does not fit.
std::shared_ptr<const QueryStats> load_query_stats(const PressSpec& spec, const Model& model, const std::string& press);

// Watches prefills (a LayerObserver) and accumulates, per layer, the sums the statistics come from. Every
// step's positions are those of one text starting at 0: rows at positions < n_sink are skipped.
class QueryStatsCollector : public LayerObserver {
 public:
  explicit QueryStatsCollector(const ModelConfig& c, int64_t n_sink = 4);
  void after_attention(const LayerStep& step, KvCache& cache) override;
  int64_t n_queries(int layer) const { return n_[(size_t)layer]; }
  // The statistics of everything seen (throws kvzap::Error unless every layer saw at least 2 queries).
  QueryStats finish() const;

 private:
  ModelConfig cfg_;
  int64_t n_sink_;
  RopeTable rope_;
  std::vector<std::vector<double>> s1_;    // [layer][n_head][D]: sum of pre-RoPE queries
  std::vector<std::vector<double>> s2_;    // [layer][n_head][D][D]: sum of their outer products
  std::vector<std::vector<double>> p1_;    // [layer][n_head_kv][D]: sum of the group's post-RoPE queries
  std::vector<std::vector<double>> gram_;  // [layer][n_head_kv][D][D]: sum of their outer products (Q^T Q)
  std::vector<int64_t> n_;                 // [layer]: rows counted per query head
  std::vector<float> q_;                   // [D] scratch: one query being unrotated
};

// Unit top eigenvector of the symmetric positive semi-definite g [D][D] (power iteration from `start`,
// or e_0 when start is zero), sign such that dot(u, start) >= 0. out: [D].
void top_eigenvector(const double* g, const double* start, int D, double* out);

}  // namespace kvzap
