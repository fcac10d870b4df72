#include "server/scheduler.h"

#include <algorithm>
#include <cstdio>

namespace kvzap::server {
namespace {

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// The engine's reasons, in OpenAI's vocabulary.
std::string openai_finish_reason(const std::string& r) { return (r == "eos" || r == "stop") ? "stop" : "length"; }

}  // namespace

struct Scheduler::Active {
  std::unique_ptr<Job> job;
  std::unique_ptr<Sequence> seq;
  std::vector<int32_t> feed;  // still to prefill: the prompt after a reused prefix, then replayed generated tokens
  size_t fed = 0;
  size_t prompt_end = 0;      // index in feed where the prompt ends (the context boundary)
  bool fresh_context = false; // the prompt goes in as a context (press begin/end_context), not after a cached prefix
  int64_t evict_every = 0;    // the press frees prompt entries every this many positions (0 = only at the prompt's end)
  bool context_begun = false;
  bool decoding = false;      // next_token is fed in the next step
  bool prefill_blocked = false;
  bool done = false;          // finished or failed: removed after the current pass
  int32_t next_token = -1;
  int max_new_tokens = 0;     // this admission's token limit (the request's, less what came before a preemption)
  uint64_t order = 0;         // admission order: the youngest is preempted first
  std::unique_ptr<Sequence> prefix_snapshot;  // the compressed prompt, cached when the request succeeds
};

Scheduler::Scheduler(Engine& engine, const SchedulerOptions& opt, Metrics& metrics)
    : engine_(engine), opt_(opt), metrics_(metrics), prefix_(opt.prefix_cache_bytes) {
  segments_.reserve((size_t)opt_.parallel);
  segment_owner_.reserve((size_t)opt_.parallel);
  metrics_.kv_budget_bytes = engine_.pages().budget_bytes();
}

Scheduler::~Scheduler() = default;

void Scheduler::submit(std::unique_ptr<Job> job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (draining_ || stopping_) throw unavailable("the server is shutting down");
    if (queued_.load() >= opt_.max_queue)
      throw unavailable("the server is busy: " + std::to_string(queued_.load()) +
                        " requests are already waiting (--max-queue); retry later");
    queued_++;
    busy_++;
    inbox_.push_back(std::move(job));
  }
  cv_.notify_one();
}

void Scheduler::run_on_loop(std::function<void()> fn) {
  std::packaged_task<void()> task(std::move(fn));
  std::future<void> done = task.get_future();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) throw unavailable("the server is shutting down");
    tasks_.push_back(std::move(task));
  }
  cv_.notify_one();
  done.get();
}

void Scheduler::drain() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    draining_ = true;
  }
  cv_.notify_one();
}

void Scheduler::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    draining_ = stopping_ = true;
  }
  cv_.notify_one();
}

void Scheduler::take_inbox() {
  std::deque<std::packaged_task<void()>> tasks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& j : inbox_) waiting_.push_back(std::move(j));
    inbox_.clear();
    tasks.swap(tasks_);
  }
  for (auto& t : tasks) t();  // exceptions go to the waiting caller through the future
}

std::unique_ptr<Press> Scheduler::make_job_press(Job& job) {
  if (job.first_press) return std::move(job.first_press);
  return make_press(job.press_spec, engine_.model());
}

// Pages a request still feeding its prompt may take before it can free any: its next chunk when its
// press frees entries as the prompt goes in, else everything left to feed.
int64_t Scheduler::prefill_reservation(const Active& a) const {
  const int64_t left = (int64_t)(a.feed.size() - a.fed);
  if (a.evict_every > 0 && a.fed < a.prompt_end) {
    const int64_t to_boundary = a.evict_every - a.seq->n_past() % a.evict_every;
    return a.seq->cache().pages_needed(std::min(left, to_boundary));
  }
  return a.seq->cache().pages_needed(left);
}

int64_t Scheduler::reserved_prefill_pages() const {
  int64_t pages = 0;
  for (const auto& a : running_)
    if (!a->decoding && !a->done && a->fed < a->feed.size()) pages += prefill_reservation(*a);
  return pages;
}

int Scheduler::n_prefilling() const {
  int n = 0;
  for (const auto& a : running_) n += !a->done && !a->decoding && a->fed < a->feed.size();
  return n;
}

bool Scheduler::yield_prefix() {
  if (!prefix_.evict_lru()) return false;
  metrics_.prefix_cache_evictions_total++;
  return true;
}

void Scheduler::log_request(const Job& job, const std::string& outcome, const Usage& u) {
  if (!opt_.log_requests) return;
  const auto now = Clock::now();
  const bool started = job.first_token != Clock::time_point{};
  const double total = seconds(now - job.arrival);
  const double decode = started ? seconds(job.last_token - job.first_token) : 0;
  std::fprintf(stderr,
               "[serve] %s %s prompt=%lld cached=%lld completion=%lld press=%s evicted=%.3f kv=%.2fMB/%.2fMB "
               "queue=%.3fs ttft=%.3fs total=%.3fs decode=%.1ftok/s preempted=%d\n",
               job.id.c_str(), outcome.c_str(), (long long)u.prompt_tokens, (long long)u.cached_tokens,
               (long long)u.completion_tokens, u.kv.press.c_str(), u.kv.evicted_fraction, u.kv.kv_bytes / 1e6,
               u.kv.kv_bytes_full / 1e6, job.admitted_once ? seconds(job.admitted - job.arrival) : total,
               started ? seconds(job.first_token - job.arrival) : 0.0, total,
               decode > 0 ? (u.completion_tokens - 1) / decode : 0.0, job.preemptions);
}

void Scheduler::fail_waiting(std::unique_ptr<Job> job, const ApiError& err) {
  StreamEvent e;
  e.kind = StreamEvent::Kind::Error;
  e.error = err;
  job->channel->push(std::move(e));
  Usage u;
  u.prompt_tokens = (int64_t)job->prompt.size();
  log_request(*job, std::string("error=") + std::to_string(err.status()), u);
  busy_--;
}

void Scheduler::finish(Active& a, const std::string& finish_reason) {
  Job& job = *a.job;
  Usage u;
  u.prompt_tokens = (int64_t)job.prompt.size();
  u.completion_tokens = job.completion_tokens;
  u.cached_tokens = job.cached_tokens;
  u.kv.press = job.press_label;
  const KvCache& c = a.seq->cache();
  u.kv.evicted_fraction = c.evicted_fraction();
  u.kv.kv_bytes = c.bytes_resident();
  u.kv.kv_bytes_full = c.bytes_full();
  StreamEvent e;
  e.kind = StreamEvent::Kind::Finish;
  e.finish_reason = finish_reason;
  e.usage = u;
  job.channel->push(std::move(e));
  if (a.prefix_snapshot) prefix_.insert(job.press_key, job.prompt, std::move(a.prefix_snapshot), job.prefix_quota);
  log_request(job, "finish=" + finish_reason, u);
  metrics_.requests_finished_total++;
  a.done = true;
  busy_--;
}

void Scheduler::sample(Active& a) {
  Job& job = *a.job;
  TokenEvent ev = a.seq->sample_next();
  const auto now = Clock::now();
  if (ev.id >= 0) {  // a sampled token (an end-of-generation token or the token limit gives none)
    job.completion_tokens++;
    metrics_.generation_tokens_total++;
    if (job.first_token == Clock::time_point{}) {
      job.first_token = now;
      metrics_.time_to_first_token.observe(seconds(now - job.arrival));
    } else {
      metrics_.inter_token_latency.observe(seconds(now - job.last_token));
    }
    job.last_token = now;
  }
  if (!ev.text.empty()) {
    StreamEvent e;
    e.text = std::move(ev.text);
    job.channel->push(std::move(e));
  }
  if (ev.finished) {
    finish(a, openai_finish_reason(ev.finish_reason));
    return;
  }
  job.generated.push_back(ev.id);
  a.next_token = ev.id;
  a.decoding = true;
  if (a.seq->n_generated() >= a.max_new_tokens) sample(a);  // the limit's finish event: no step needed for it
}

// Admitted: true. Waiting (no room yet): false. A request that can never fit is failed (and consumed).
bool Scheduler::try_admit(std::unique_ptr<Job>& job) {
  PrefixCache::Entry* hit = opt_.prefix_cache_bytes > 0 ? prefix_.lookup(job->press_key, job->prompt) : nullptr;
  auto a = std::make_unique<Active>();
  const size_t reused = hit ? hit->tokens.size() : 0;
  a->seq = hit ? hit->seq->fork() : engine_.new_sequence();
  a->feed.assign(job->prompt.begin() + (long)reused, job->prompt.end());
  a->prompt_end = a->feed.size();
  a->feed.insert(a->feed.end(), job->generated.begin(), job->generated.end());
  a->fresh_context = !hit;
  a->evict_every = a->fresh_context && job->has_press ? job->press_spec.prefill_evict_every : 0;

  const ModelConfig& cfg = engine_.model().config();
  const int64_t headroom = (int64_t)cfg.n_layer * cfg.n_head_kv;  // one fresh page per stream for decoding
  PagePool& pool = engine_.pages();
  const int64_t reserve = a->feed.empty() ? 0 : prefill_reservation(*a);
  auto refuse = [&](const std::string& why) {
    a.reset();
    queued_--;
    fail_waiting(std::move(job), ApiError(400, "invalid_request_error", why));
    return true;
  };
  // Nothing is freed before the prompt's end: a prompt over the whole budget can never run.
  if (pool.budget_bytes() > 0 && a->evict_every == 0 && reserve + headroom > pool.budget_bytes() / pool.page_bytes())
    return refuse("the request needs " + std::to_string((reserve + headroom) * pool.page_bytes() / 1024) +
                  " KiB of KV cache, more than the server's whole KV budget of " + std::to_string(pool.budget_bytes() / 1024) +
                  " KiB (--kv-budget)");
  if (!a->feed.empty() && n_prefilling() >= opt_.max_prefills) return false;
  const int64_t need = std::max(reserve + headroom, job->pages_at_preemption);
  auto available = [&] { return pool.pages_available() - reserved_prefill_pages(); };
  while (need > available() && yield_prefix()) {}
  if (need > available()) {
    if (running_.empty())  // the whole pool is free and still too small for one chunk
      return refuse("the request needs " + std::to_string(need * pool.page_bytes() / 1024) +
                    " KiB of KV cache to start, more than the server's whole KV budget of " +
                    std::to_string(pool.budget_bytes() / 1024) + " KiB (--kv-budget)");
    return false;
  }
  // Made once admitted: a surrogate press is not cheap. A cached prefix carries its press (a fork clones
  // it), except one restored from a slot file: it gets a press that judges what comes next.
  if (job->has_press && (!hit || !a->seq->press())) {
    if (hit) a->seq->set_press_after_context(make_job_press(*job));
    else a->seq->set_press(make_job_press(*job));
  }

  GenerationOptions g = job->gen;
  g.max_new_tokens = std::max<int>(1, job->gen.max_new_tokens - (int)job->completion_tokens);
  a->seq->start_generation(g);
  a->max_new_tokens = g.max_new_tokens;
  if (!job->admitted_once) {
    job->admitted_once = true;
    job->admitted = Clock::now();
    job->cached_tokens = (int64_t)reused;
    metrics_.prompt_tokens_total += (int64_t)job->prompt.size();
    metrics_.prefix_cache_queries_total += (int64_t)job->prompt.size();
    metrics_.prefix_cache_hits_total += (int64_t)reused;
  }
  a->order = admit_counter_++;
  a->job = std::move(job);
  queued_--;
  Active& ref = *a;
  running_.push_back(std::move(a));
  if (ref.feed.empty()) sample(ref);  // the whole prompt is a cached prefix: its logits came with the fork
  return true;
}

void Scheduler::drop_cancelled() {
  const auto now = Clock::now();
  for (auto& a : running_) {
    if (a->done) continue;
    if (a->job->channel->cancelled()) {
      Usage u;
      u.prompt_tokens = (int64_t)a->job->prompt.size();
      u.completion_tokens = a->job->completion_tokens;
      log_request(*a->job, "cancelled", u);
      metrics_.requests_cancelled_total++;
      a->done = true;
      busy_--;
    } else if (now > a->job->deadline) {
      finish(*a, "length");  // the per-request time limit ends generation like the token limit (llama.cpp's t_max_predict_ms)
    }
  }
  running_.erase(std::remove_if(running_.begin(), running_.end(), [](const auto& a) { return a->done; }), running_.end());
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    Job& j = **it;
    if (j.channel->cancelled() || now > j.deadline) {
      queued_--;
      if (j.channel->cancelled()) {
        metrics_.requests_cancelled_total++;
        Usage u;
        u.prompt_tokens = (int64_t)j.prompt.size();
        log_request(j, "cancelled", u);
        busy_--;
      } else {
        fail_waiting(std::move(*it), unavailable("the request waited past the per-request time limit (--timeout)"));
      }
      it = waiting_.erase(it);
    } else {
      ++it;
    }
  }
}

void Scheduler::build_segments() {
  segments_.clear();
  segment_owner_.clear();
  int64_t budget = engine_.n_batch();
  for (auto& a : running_) {
    if (!a->decoding || budget <= 0) continue;
    segments_.push_back({a->seq.get(), &a->next_token, 1, LogitsMode::Last});
    segment_owner_.push_back(a.get());
    budget--;
  }
  // segments_ holds only decode tokens so far.
  if (!segments_.empty() && opt_.prefill_chunk_while_decoding > 0)
    budget = std::min(budget, opt_.prefill_chunk_while_decoding);
  for (auto& a : running_) {
    if (a->decoding || a->fed >= a->feed.size() || budget <= 0) continue;
    // Chunks never cross the prompt's end: the press closes the context there.
    const size_t end = a->fed < a->prompt_end ? a->prompt_end : a->feed.size();
    int64_t n = std::min<int64_t>(budget, (int64_t)(end - a->fed));
    // Generated tokens replayed after a preemption go one per step when the press prunes while decoding:
    // each is judged, and attends, exactly as when it was first decoded.
    if (a->fed >= a->prompt_end && a->seq->press() && a->seq->press()->prunes_decoding()) n = 1;
    if (a->fresh_context && !a->context_begun) {
      a->seq->begin_context();
      a->context_begun = true;
    }
    // The engine would cut the chunk at the press's next eviction boundary: cut it here, so the rest of
    // the step's token budget goes to other requests' chunks.
    if (const int64_t limit = a->seq->context_step_limit(); limit > 0) n = std::min(n, limit);
    // Logits at the prompt's end too, so a cached prefix can be sampled from directly.
    const bool last = a->fed + (size_t)n == a->feed.size() || a->fed + (size_t)n == a->prompt_end;
    segments_.push_back({a->seq.get(), a->feed.data() + a->fed, n, last ? LogitsMode::Last : LogitsMode::None});
    segment_owner_.push_back(a.get());
    budget -= n;
  }
}

void Scheduler::preempt(size_t index) {
  std::unique_ptr<Active> a = std::move(running_[index]);
  running_.erase(running_.begin() + (long)index);
  std::unique_ptr<Job> job = std::move(a->job);
  job->preemptions++;
  job->pages_at_preemption = a->seq->cache().bytes_resident() / engine_.pages().page_bytes();
  metrics_.num_preemptions_total++;
  if (opt_.log_requests)
    std::fprintf(stderr, "[serve] %s preempted (KV budget full): recomputed later from %zu prompt + %zu generated tokens\n",
                 job->id.c_str(), job->prompt.size(), job->generated.size());
  a.reset();  // pages back to the pool now
  queued_++;
  waiting_.push_front(std::move(job));
}

// Frees pages for the running requests: a cached prefix first, else the youngest request is preempted.
// False when neither is possible (one request alone holds the pool).
bool Scheduler::free_memory() {
  if (yield_prefix()) return true;
  if (running_.size() > 1) {
    size_t youngest = 0;
    for (size_t i = 1; i < running_.size(); i++)
      if (running_[i]->order > running_[youngest]->order) youngest = i;
    preempt(youngest);
    return true;
  }
  return false;
}

void Scheduler::after_step() {
  bool out_of_memory = false, progressed = false, any_blocked = false;
  for (size_t i = 0; i < segments_.size(); i++) {
    const Segment& s = segments_[i];
    Active& a = *segment_owner_[i];
    if (s.status == SegmentStatus::OutOfKvMemory) {
      any_blocked = true;
      if (a.decoding) out_of_memory = true;
      a.prefill_blocked = true;
      continue;
    }
    progressed = true;
    a.prefill_blocked = false;
    if (a.decoding) {
      a.decoding = false;
      sample(a);
      continue;
    }
    a.fed += (size_t)s.n;
    if (a.fed == a.prompt_end) {
      if (a.fresh_context) a.seq->end_context(a.job->prompt);
      const bool exact_cached = prefix_.find_exact(a.job->press_key, a.job->prompt) != nullptr;
      if (opt_.prefix_cache_bytes > 0 && a.job->store_prefix && !exact_cached) a.prefix_snapshot = a.seq->fork();
    }
    if (a.fed == a.feed.size()) sample(a);
  }
  if (out_of_memory || !progressed || engine_.pages().over_budget()) {
    if (!free_memory()) {
      // One request alone outgrew the whole budget: a prompt that does not fit even as its press prunes
      // it is refused; a generation ends as if it hit its token limit.
      for (auto& a : running_) {
        if (a->done || !(a->decoding || a->prefill_blocked)) continue;
        if (opt_.log_requests) std::fprintf(stderr, "[serve] %s: KV budget exhausted by this request alone\n", a->job->id.c_str());
        if (a->decoding) {
          finish(*a, "length");
          continue;
        }
        const PagePool& pool = engine_.pages();
        StreamEvent e;
        e.kind = StreamEvent::Kind::Error;
        e.error = ApiError(400, "invalid_request_error",
                           "the prompt does not fit the server's KV budget of " + std::to_string(pool.budget_bytes() / 1024) +
                               " KiB (--kv-budget) even as its press prunes it: " + std::to_string(a->seq->cache().bytes_resident() / 1024) +
                               " KiB held after " + std::to_string(a->fed) + " of its " + std::to_string(a->prompt_end) + " tokens");
        a->job->channel->push(std::move(e));
        Usage u;
        u.prompt_tokens = (int64_t)a->job->prompt.size();
        log_request(*a->job, "error=400", u);
        a->done = true;
        busy_--;
      }
    }
  } else if (any_blocked) {
    yield_prefix();  // a prompt is waiting for pages while others run: the cache goes first
  }
  running_.erase(std::remove_if(running_.begin(), running_.end(), [](const auto& a) { return a && a->done; }), running_.end());
}

void Scheduler::publish_metrics() {
  const PagePool& pool = engine_.pages();
  int64_t full = 0;
  for (const auto& a : running_) full += a->seq->cache().bytes_full();
  std::lock_guard<std::mutex> lock(metrics_.gauges_mu);
  metrics_.kv_bytes_resident = pool.bytes_in_use();
  metrics_.kv_bytes_full = full;
  metrics_.kv_evicted_entries_total = pool.entries_evicted_total();
  metrics_.prefix_cache_bytes = prefix_.bytes();
  metrics_.num_requests_running = (int64_t)running_.size();
  metrics_.num_requests_prefilling = n_prefilling();
  metrics_.num_requests_waiting = queued_.load();
}

void Scheduler::run() {
  for (;;) {
    bool stopping, draining;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (!stopping_ && inbox_.empty() && tasks_.empty() && running_.empty() && waiting_.empty())
        cv_.wait_for(lock, std::chrono::milliseconds(200));
      stopping = stopping_;
      draining = draining_;
    }
    take_inbox();
    if (stopping) break;
    if (draining)
      while (!waiting_.empty()) {
        queued_--;
        fail_waiting(std::move(waiting_.front()), unavailable("the server is shutting down"));
        waiting_.pop_front();
      }
    try {
      drop_cancelled();
      while (!waiting_.empty() && (int)running_.size() < opt_.parallel) {
        std::unique_ptr<Job>& front = waiting_.front();
        if (!try_admit(front)) break;
        waiting_.pop_front();
      }
      running_.erase(std::remove_if(running_.begin(), running_.end(), [](const auto& a) { return a->done; }), running_.end());
      build_segments();
      if (!segments_.empty()) {
        engine_.step(segments_);
        int64_t step_tokens = 0;
        for (const Segment& s : segments_) step_tokens += s.n;
        metrics_.iteration_tokens.observe((double)step_tokens);
        after_step();
      }
    } catch (const std::exception& e) {
      // An engine failure ends the requests of this step, never the server.
      std::fprintf(stderr, "[serve] step failed: %s\n", e.what());
      for (auto& a : running_) {
        if (a->done) continue;
        StreamEvent ev;
        ev.kind = StreamEvent::Kind::Error;
        ev.error = ApiError(500, "server_error", std::string("generation failed: ") + e.what());
        a->job->channel->push(std::move(ev));
        a->done = true;
        busy_--;
      }
      running_.clear();
    }
    publish_metrics();
  }
  // Stop: whatever is left gets an error event; its pages go back with the sequences.
  for (auto& a : running_) {
    StreamEvent ev;
    ev.kind = StreamEvent::Kind::Error;
    ev.error = unavailable("the server is shutting down");
    a->job->channel->push(std::move(ev));
    busy_--;
  }
  running_.clear();
  while (!waiting_.empty()) {
    queued_--;
    fail_waiting(std::move(waiting_.front()), unavailable("the server is shutting down"));
    waiting_.pop_front();
  }
  publish_metrics();
}

}  // namespace kvzap::server
