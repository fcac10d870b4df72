#include "server/metrics.h"

#include <cstdio>

namespace kvzap::server {
namespace {

std::string number(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", x);
  return buf;
}

void metric(std::string& out, const char* type, const std::string& name, const std::string& help, double value) {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n" + name + " " + number(value) + "\n";
}

}  // namespace

Histogram::Histogram(std::vector<double> upper_bounds) : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double x) {
  std::lock_guard<std::mutex> lock(mu_);
  size_t i = 0;
  while (i < bounds_.size() && x > bounds_[i]) i++;
  counts_[i]++;
  sum_ += x;
  count_++;
}

std::string Histogram::render(const std::string& name, const std::string& help) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out = "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); i++) {
    cumulative += counts_[i];
    out += name + "_bucket{le=\"" + number(bounds_[i]) + "\"} " + std::to_string(cumulative) + "\n";
  }
  cumulative += counts_.back();
  out += name + "_bucket{le=\"+Inf\"} " + std::to_string(cumulative) + "\n";
  out += name + "_sum " + number(sum_) + "\n" + name + "_count " + std::to_string(count_) + "\n";
  return out;
}

std::string Metrics::render() const {
  std::lock_guard<std::mutex> lock(gauges_mu);
  std::string out;
  const double budget = (double)kv_budget_bytes.load();
  const double resident = (double)kv_bytes_resident.load();
  metric(out, "gauge", "kvzap:kv_cache_usage_perc", "KV page pool usage, 0-1 of the KV budget (1 = full)",
         budget > 0 ? resident / budget : 0);
  metric(out, "gauge", "kvzap:kv_bytes_resident", "bytes of KV pages in use (running requests and cached prefixes; shared pages once)", resident);
  metric(out, "gauge", "kvzap:kv_bytes_full", "bytes unpruned f16 caches of the running requests would hold", (double)kv_bytes_full.load());
  metric(out, "gauge", "kvzap:kv_budget_bytes", "the KV page budget (--kv-budget)", budget);
  metric(out, "gauge", "kvzap:prefix_cache_bytes", "bytes held by cached compressed prefixes (shared pages counted per entry)", (double)prefix_cache_bytes.load());
  metric(out, "counter", "kvzap:kv_evicted_entries_total", "KV entries freed by presses", (double)kv_evicted_entries_total.load());
  metric(out, "gauge", "kvzap:num_requests_running", "requests in the running batch", (double)num_requests_running.load());
  metric(out, "gauge", "kvzap:num_requests_waiting", "requests waiting for admission", (double)num_requests_waiting.load());
  metric(out, "counter", "kvzap:num_preemptions_total", "running requests preempted for KV memory (recomputed later)", (double)num_preemptions_total.load());
  metric(out, "counter", "kvzap:prompt_tokens_total", "prompt tokens of admitted requests", (double)prompt_tokens_total.load());
  metric(out, "counter", "kvzap:generation_tokens_total", "generated tokens", (double)generation_tokens_total.load());
  metric(out, "counter", "kvzap:prefix_cache_queries_total", "prompt tokens looked up in the compressed-prefix cache", (double)prefix_cache_queries_total.load());
  metric(out, "counter", "kvzap:prefix_cache_hits_total", "prompt tokens served from the compressed-prefix cache", (double)prefix_cache_hits_total.load());
  const double queries = (double)prefix_cache_queries_total.load();
  metric(out, "gauge", "kvzap:prefix_cache_hit_rate", "share of looked-up prompt tokens served from the prefix cache (0 before any lookup)",
         queries > 0 ? (double)prefix_cache_hits_total.load() / queries : 0);
  metric(out, "counter", "kvzap:prefix_cache_evictions_total", "cached prefixes dropped (LRU, or yielding pages to running requests)",
         (double)prefix_cache_evictions_total.load());
  metric(out, "gauge", "kvzap:num_requests_prefilling", "running requests still feeding their prompt (at most --max-prefills)",
         (double)num_requests_prefilling.load());
  metric(out, "counter", "kvzap:request_success_total", "requests finished normally", (double)requests_finished_total.load());
  metric(out, "counter", "kvzap:request_cancelled_total", "requests cancelled (client gone, shutdown)", (double)requests_cancelled_total.load());
  metric(out, "counter", "kvzap:request_rejected_total", "requests refused before running (4xx, queue full)", (double)requests_rejected_total.load());
  metric(out, "gauge", "kvzap:http_connections_open", "open HTTP connections", (double)http_connections_open.load());
  metric(out, "counter", "kvzap:http_connections_timed_out_total", "connections closed for missing the header or idle deadline", (double)http_connections_timed_out_total.load());
  metric(out, "counter", "kvzap:http_connections_refused_total", "connections refused over --max-conns-per-client", (double)http_connections_refused_total.load());
  out += time_to_first_token.render("kvzap:time_to_first_token_seconds", "time from arrival to the first generated token");
  out += iteration_tokens.render("kvzap:iteration_tokens_total", "tokens per forward step (decode tokens and prompt chunks)");
  out += inter_token_latency.render("kvzap:inter_token_latency_seconds", "time between consecutive generated tokens");
  return out;
}

}  // namespace kvzap::server
