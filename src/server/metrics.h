// Prometheus text exposition with vLLM-style names (kvzap:...). The scheduler thread publishes gauges
// after every step (under gauges_mu) and counts events; HTTP threads render under the same lock.
#pragma once
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace kvzap::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double x);
  // "# HELP", "# TYPE histogram", cumulative _bucket lines, _sum, _count.
  std::string render(const std::string& name, const std::string& help) const;

 private:
  std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::vector<uint64_t> counts_;  // [bounds_.size() + 1], the last one is +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

struct Metrics {
  // Gauges (published by the scheduler).
  std::atomic<int64_t> kv_budget_bytes{0}, kv_bytes_resident{0}, kv_bytes_full{0}, prefix_cache_bytes{0};
  std::atomic<int64_t> num_requests_running{0}, num_requests_waiting{0};
  std::atomic<int64_t> kv_evicted_entries_total{0};
  // Counters.
  std::atomic<int64_t> num_preemptions_total{0}, prompt_tokens_total{0}, generation_tokens_total{0};
  std::atomic<int64_t> prefix_cache_queries_total{0}, prefix_cache_hits_total{0};  // in prompt tokens, as vLLM
  std::atomic<int64_t> requests_finished_total{0}, requests_cancelled_total{0}, requests_rejected_total{0};
  std::atomic<int64_t> prefix_cache_evictions_total{0};  // entries dropped (LRU, or yielding to requests)
  std::atomic<int64_t> num_requests_prefilling{0};        // gauge: running requests still feeding their prompt
  // Connections (the HTTP layer's gate): open now; closed for a missed deadline; refused over the
  // per-address cap.
  std::atomic<int64_t> http_connections_open{0}, http_connections_timed_out_total{0}, http_connections_refused_total{0};
  Histogram time_to_first_token{{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}};
  // Tokens per forward step (decode tokens + prefill chunks), vLLM's buckets.
  Histogram iteration_tokens{{1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384}};
  Histogram inter_token_latency{{0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 2.5, 5}};

  // publish_metrics stores the gauges and render reads them under this lock, so a scrape never mixes
  // two steps (a freed request's pages with the next step's running count).
  mutable std::mutex gauges_mu;

  std::string render() const;
};

}  // namespace kvzap::server
