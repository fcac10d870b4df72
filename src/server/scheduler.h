// Continuous batching over one Engine. The scheduler thread (run()) owns the engine, every Sequence and
// the prefix cache; HTTP threads only submit Jobs, post tasks and read metrics.
//
// Every iteration: drop cancelled or timed-out requests (their pages go back to the pool at once),
// admit waiting requests while KV pages allow (FIFO; --parallel at most, --max-prefills of them still
// feeding their prompts), then run one forward step with one decode token per decoding request and
// prefill chunks of admitted ones in the remaining token budget.
//
// Admission is by what a request really holds. A request whose press frees entries while prefilling
// (Press::context_eviction_interval > 0: KVzap and the other per-token threshold presses) reserves only
// its next chunk: its pages are taken as they are written and freed as its prompt is judged, so it holds
// about kept + window + one interval. Any other request (no press, or a press that judges the whole
// context, e.g. KVzip, SnapKV, ratio budgets) reserves its whole remaining prompt, which it will hold
// until the context ends; one that exceeds the whole budget is refused at once. Under pressure, cached
// prefixes go first (a cache yields to running requests), then the youngest running request is
// preempted and recomputed later (prompt + its generated tokens, fed so that the press judges them
// exactly as before), never killed; it is admitted again only once as many pages are free as it held. A
// request that runs alone and still cannot get a page ends with a clear error (prefill) or with
// finish_reason "length" (decoding).
#pragma once
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "server/job.h"
#include "server/metrics.h"
#include "server/prefix_cache.h"

namespace kvzap::server {

struct SchedulerOptions {
  int parallel = 4;                 // most running requests
  int max_queue = 64;               // most waiting requests; beyond: 503
  // Most prompt tokens a step takes while other requests are decoding (0 = up to the engine's batch).
  // A step costs about its token count, so a long prefill chunk would stall every decoding stream for
  // that step: the inter-token latency of running requests is bounded by this cap instead.
  int64_t prefill_chunk_while_decoding = 64;
  // Most running requests still feeding their prompts: prefill compute goes to a few requests at a time
  // instead of being split among many half-finished ones, each holding its partial cache. 16: the issue-33
  // sweep (docs/BENCHMARKS.md) found no cost in rate or TTFT up to 16 on 2 cores, and a pruning press needs
  // that many in flight to fill the pool; a request without one reserves its whole prompt at admission, so
  // the bound does not change how many of those run.
  int max_prefills = 16;
  int64_t prefix_cache_bytes = 0;   // 0 = no prefix reuse
  bool log_requests = true;         // one line per request on stderr
};

class Scheduler {
 public:
  Scheduler(Engine& engine, const SchedulerOptions& opt, Metrics& metrics);
  ~Scheduler();

  // Queues a job (any thread). Throws ApiError 503 when the wait queue is full or the server stops.
  void submit(std::unique_ptr<Job> job);
  // Runs `fn` on the scheduler thread between steps and waits for it; its exception is rethrown here.
  void run_on_loop(std::function<void()> fn);
  // The loop; returns after stop().
  void run();
  // Stops admitting (new submissions get 503) and cancels waiting requests; running ones go on.
  void drain();
  // Cancels everything still running and makes run() return.
  void stop();
  bool idle() const { return busy_.load() == 0; }

  // Scheduler thread only (inside run_on_loop tasks).
  PrefixCache& prefix_cache() { return prefix_; }
  Engine& engine() { return engine_; }

 private:
  struct Active;
  void take_inbox();
  void drop_cancelled();
  bool try_admit(std::unique_ptr<Job>& job);
  void build_segments();
  void after_step();
  void sample(Active& a);
  void finish(Active& a, const std::string& finish_reason);
  void fail_waiting(std::unique_ptr<Job> job, const ApiError& err);
  bool free_memory();
  bool yield_prefix();
  void preempt(size_t index);
  void publish_metrics();
  int64_t prefill_reservation(const Active& a) const;
  int64_t reserved_prefill_pages() const;
  int n_prefilling() const;
  void log_request(const Job& job, const std::string& outcome, const Usage& u);
  std::unique_ptr<Press> make_job_press(Job& job);

  Engine& engine_;
  SchedulerOptions opt_;
  Metrics& metrics_;
  PrefixCache prefix_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Job>> inbox_;
  std::deque<std::packaged_task<void()>> tasks_;
  bool draining_ = false, stopping_ = false;
  std::atomic<int> queued_{0};  // inbox + waiting (bounded by max_queue)
  std::atomic<int> busy_{0};    // queued + running

  // Scheduler thread only.
  std::deque<std::unique_ptr<Job>> waiting_;
  std::vector<std::unique_ptr<Active>> running_;
  std::vector<Segment> segments_;
  std::vector<Active*> segment_owner_;
  uint64_t admit_counter_ = 0;
};

}  // namespace kvzap::server
