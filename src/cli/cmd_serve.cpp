// kvzap serve: an OpenAI-compatible HTTP server with continuous batching over one shared KV page pool,
// where pruned requests leave room for more (src/server/).
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <thread>

#include "cli/cli_common.h"
#include "engine/engine.h"
#include "fetch/model_store.h"
#include "server/http_server.h"
#include "server/scheduler.h"

namespace kvzap::cli {
namespace {

struct ServeArgs {
  ModelArgs m;
  PressArgs press;
  std::string host = "127.0.0.1", kv_budget, prefix_cache, max_body = "8MiB", alias, slot_save_path;
  int64_t slot_max_files = 64;
  int header_timeout = 10, max_conns_per_client = 1024;
  std::string slot_max_bytes = "1GiB";
  std::string api_key, api_key_file;
  int port = 8080, parallel = 4, max_queue = 64, max_tokens = 4096, http_threads = 0;
  int64_t prefill_chunk = 64;
  int max_prefills = 16;
  double timeout = 600, shutdown_grace = 5;
};

// Sends SIGINT/SIGTERM to one waiting thread: the first drains (running requests may finish within the
// grace period), a second one stops at once. The thread touches the scheduler only under mu_, and
// set_scheduler(nullptr) (before the scheduler is destroyed) waits for it, so a signal that arrives while
// main is shutting down never reaches a destroyed scheduler; the destructor wakes and joins the thread.
class ShutdownWatcher {
 public:
  explicit ShutdownWatcher(double grace_s) : grace_s_(grace_s) {
    sigemptyset(&set_);
    sigaddset(&set_, SIGINT);
    sigaddset(&set_, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set_, nullptr);  // before any other thread starts: they inherit the mask
  }
  ~ShutdownWatcher() {
    if (!thread_.joinable()) return;
    closing_ = true;
    pthread_kill(thread_.native_handle(), SIGTERM);  // ends its sigwait / sigtimedwait
    thread_.join();
  }
  void start() { thread_ = std::thread([this] { watch(); }); }
  void set_scheduler(server::Scheduler* s) {
    std::lock_guard<std::mutex> lock(mu_);
    scheduler_ = s;
  }
  bool requested() const { return requested_.load(); }

 private:
  // Runs f on the scheduler while holding mu_; false when there is none (still loading, or shut down).
  template <class F>
  bool with_scheduler(F&& f) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!scheduler_) return false;
    f(*scheduler_);
    return true;
  }
  void watch() {
    int sig = 0;
    sigwait(&set_, &sig);
    if (closing_) return;
    requested_ = true;
    std::fprintf(stderr, "[serve] %s: finishing running requests (at most %.0f s), then exiting\n", sig == SIGINT ? "SIGINT" : "SIGTERM", grace_s_);
    // Still loading: main sees requested() once the model is in.
    if (!with_scheduler([](server::Scheduler& s) { s.drain(); })) return;
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace_s_);
    timespec tick{0, 100 * 1000 * 1000};
    bool idle = false;
    while (!closing_ && std::chrono::steady_clock::now() < until) {
      if (!with_scheduler([&](server::Scheduler& s) { idle = s.idle(); }) || idle) break;
      if (sigtimedwait(&set_, nullptr, &tick) > 0) break;  // a second signal: stop now
    }
    with_scheduler([](server::Scheduler& s) { s.stop(); });
  }
  double grace_s_;
  sigset_t set_;
  std::mutex mu_;
  server::Scheduler* scheduler_ = nullptr;
  std::atomic<bool> requested_{false}, closing_{false};
  std::thread thread_;
};

int run_serve(const ServeArgs& a) {
  ShutdownWatcher watcher(a.shutdown_grace);
  ::signal(SIGPIPE, SIG_IGN);  // a client gone mid-write is a failed write, not a dead server

  server::HttpOptions h;
  h.host = a.host;
  h.port = a.port;
  std::vector<std::string> keys;
  if (!a.api_key.empty() && !a.api_key_file.empty()) throw Error("give --api-key or --api-key-file, not both");
  for (size_t b = 0; !a.api_key.empty() && b <= a.api_key.size();) {
    const size_t e = std::min(a.api_key.find(',', b), a.api_key.size());
    if (e > b) keys.push_back(a.api_key.substr(b, e - b));
    b = e + 1;
  }
  if (!a.api_key_file.empty()) keys = server::ApiKeys::read_file(a.api_key_file);
  h.keys = server::ApiKeys(keys);
  h.max_body_bytes = (size_t)parse_byte_size(a.max_body);
  h.header_timeout_s = a.header_timeout;
  h.max_conns_per_client = a.max_conns_per_client;
  h.slot_quota.max_files = a.slot_max_files;
  h.slot_quota.max_bytes = parse_byte_size(a.slot_max_bytes);
  h.slot_save_path = a.slot_save_path;
  if (!h.slot_save_path.empty() && !std::filesystem::is_directory(h.slot_save_path))
    throw Error("--slot-save-path " + h.slot_save_path + ": not a directory");
  h.threads = a.http_threads > 0 ? a.http_threads : std::min(256, a.parallel + a.max_queue + 8);
  const std::string model_path = resolve_model(a.m.model);
  h.model_id = a.alias.empty() ? std::filesystem::path(model_path).filename().string() : a.alias;

  server::Metrics metrics;
  server::HttpServer http(h, metrics);
  if (!http.bind()) throw Error("cannot listen on " + a.host + ":" + std::to_string(a.port) + " (port in use or not allowed)");
  watcher.start();
  std::thread http_thread([&] { http.listen(); });
  std::fprintf(stderr, "[serve] listening on http://%s:%d, loading %s\n", a.host.c_str(), a.port, model_path.c_str());

  auto stop_http = [&] {  // idempotent: the normal path, an exception and the guard below may all call it
    if (!http_thread.joinable()) return;
    http.stop();
    http_thread.join();
  };
  try {
    auto model = Model::load(model_path, a.m.load_options());
    server::ServerDefaults d;
    d.has_press = !a.press.flags.name.empty();
    if (!d.has_press && (a.press.given_threshold() || a.press.given_ratio() || a.press.flags.decoding))
      throw Error("--threshold/--ratio/--decode-press need --press NAME");
    d.press = a.press.spec();
    d.prefill_evict_every = a.press.flags.prefill_evict_every;
    if (judges_whole_contexts(d.press)) d.press.prefill_evict_every = 0;  // a ratio press judges whole contexts
    if (d.has_press) make_press(d.press, *model);  // a bad default fails at start, not per request
    d.limits.n_vocab = model->config().n_vocab;
    d.limits.max_tokens = a.max_tokens;
    d.limits.default_max_tokens = std::min(256, a.max_tokens);
    d.request_timeout_s = a.timeout;

    EngineOptions eo;
    eo.n_threads = a.m.threads;
    eo.n_ctx = a.m.ctx;
    eo.n_batch = a.m.batch > 0 ? a.m.batch : 512;
    eo.kv_budget_bytes = a.kv_budget.empty() ? 0 : parse_byte_size(a.kv_budget);
    eo.kv_type = a.m.cache_type();
    Engine engine(*model, eo);
    server::SchedulerOptions so;
    so.parallel = a.parallel;
    so.max_queue = a.max_queue;
    so.prefill_chunk_while_decoding = a.prefill_chunk;
    so.max_prefills = a.max_prefills;
    if (a.prefix_cache.empty()) so.prefix_cache_bytes = engine.pages().budget_bytes() / 4;
    else if (a.prefix_cache == "0" || a.prefix_cache == "off") so.prefix_cache_bytes = 0;
    else so.prefix_cache_bytes = parse_byte_size(a.prefix_cache);
    server::Scheduler scheduler(engine, so, metrics);
    http.attach(*model, engine, scheduler, d);
    watcher.set_scheduler(&scheduler);
    // Destroyed before the scheduler (and the engine and model the handlers use), also when run()
    // throws: first the HTTP threads stop, then the watcher lets go of the scheduler.
    struct Unwatch {
      ShutdownWatcher& w;
      ~Unwatch() { w.set_scheduler(nullptr); }
    } unwatch{watcher};
    struct StopHttp {
      decltype(stop_http)& stop;
      ~StopHttp() { stop(); }
    } stop_http_first{stop_http};
    if (watcher.requested()) scheduler.stop();
    // The token count makes the f32 cost visible: the same budget holds half as many f32 tokens.
    std::fprintf(stderr, "[serve] ready: %s, %d threads, context %lld, %d parallel, KV budget %.1f MiB of %s K/V "
                 "(%lld unpruned tokens; prefix cache %.1f MiB), press %s%s\n",
                 h.model_id.c_str(), engine.n_threads(), (long long)engine.n_ctx(), a.parallel,
                 engine.pages().budget_bytes() / 1048576.0, kv_type_name(engine.kv_type()),
                 (long long)engine.kv_budget_tokens(), so.prefix_cache_bytes / 1048576.0,
                 d.has_press ? server::press_settings_key(true, d.press).c_str() : "none",
                 h.keys.enabled() ? ", API key required" : "");
    scheduler.run();
    stop_http();
    std::fprintf(stderr, "[serve] stopped\n");
  } catch (...) {
    stop_http();
    throw;
  }
  return 0;
}

RegisterCommand reg("serve", "OpenAI-compatible HTTP server (continuous batching, KV pruning as capacity)", [](CLI::App& sub) {
  auto a = std::make_shared<ServeArgs>();
  a->m.add_to(sub);
  a->press.flags.prefill_evict_every = 128;  // the server's default: memory freed as prompts go in (capacity)
  a->press.add_to(sub);
  sub.add_option("--host", a->host, "address to bind (default 127.0.0.1: loopback only)");
  sub.add_option("--port", a->port, "port (default 8080)")->check(CLI::Range(0, 65535));
  sub.add_option("--parallel,--np", a->parallel, "most requests running at once (default 4)")->check(CLI::Range(1, 1024));
  sub.add_option("--kv-budget", a->kv_budget, "KV page budget shared by all requests, e.g. 512MiB (default: half the available memory; "
                                             "with --kv-type f32 it holds half as many tokens, with q8_0 / q4_0 ~1.9x / ~3.4x as many)");
  sub.add_option("--prefix-cache", a->prefix_cache, "bytes of compressed prefixes kept for reuse (default: a quarter of the KV budget; 0 = off)");
  sub.add_option("--prefill-chunk", a->prefill_chunk, "most prompt tokens a step takes while other requests are decoding: bounds their inter-token latency, at the cost of a new request's time to first token (default 64; 0 = up to --batch)")->check(CLI::Range(0, 1 << 24));
  sub.add_option("--max-prefills", a->max_prefills, "most requests prefilling their prompts at once: more split the prefill compute among "
                 "half-finished requests and hold their partial caches (default 16: docs/BENCHMARKS.md, issue 33 sweep)")->check(CLI::Range(1, 1024));
  sub.add_option("--max-queue", a->max_queue, "most requests waiting for admission; beyond: 503 (default 64)")->check(CLI::Range(0, 1 << 20));
  sub.add_option("--max-tokens-limit", a->max_tokens, "largest max_tokens a request may ask for (default 4096)")->check(CLI::Range(1, 1 << 24));
  sub.add_option("--timeout", a->timeout, "per-request time limit in seconds; generation stops with finish_reason length (default 600, 0 = none)")->check(CLI::Range(0.0, 1e7));
  sub.add_option("--max-body", a->max_body, "largest request body (default 8MiB)");
  sub.add_option("--api-key", a->api_key, "require this API key (comma-separated list allowed)");
  sub.add_option("--api-key-file", a->api_key_file, "require one of the API keys in this file (one per line)");
  sub.add_option("--slot-save-path", a->slot_save_path, "folder for /slots/save and /slots/restore files (default: disabled)");
  sub.add_option("--header-timeout", a->header_timeout, "seconds a connection gets to send a whole request header block, and each request 60 s for headers and body (default 10)")->check(CLI::Range(1, 3600));
  sub.add_option("--max-conns-per-client", a->max_conns_per_client, "open connections per client address; beyond: 503 and close (default 1024)")->check(CLI::Range(1, 1 << 20));
  sub.add_option("--slot-max-files", a->slot_max_files, "slot files per API key (default 64)")->check(CLI::Range((int64_t)1, (int64_t)1 << 30));
  sub.add_option("--slot-max-bytes", a->slot_max_bytes, "bytes of slot files per API key (default 1GiB)");
  sub.add_option("--alias", a->alias, "model name in responses (default: the model's file name)");
  sub.add_option("--threads-http", a->http_threads, "HTTP worker threads (default: parallel + max-queue + 8)")->check(CLI::Range(0, 4096));
  sub.add_option("--shutdown-grace", a->shutdown_grace, "seconds running requests get to finish after SIGINT/SIGTERM (default 5)")->check(CLI::Range(0.0, 3600.0));
  return [a]() { return run_serve(*a); };
});

}  // namespace
}  // namespace kvzap::cli
