#include "engine/engine.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <sstream>

#include "engine/context_recording.h"

namespace kvzap {

int64_t parse_byte_size(const std::string& text) {
  std::string t;
  for (char c : text)
    if (!std::isspace((unsigned char)c)) t += c;
  size_t i = 0;
  while (i < t.size() && (std::isdigit((unsigned char)t[i]) || t[i] == '.')) i++;
  const std::string num = t.substr(0, i), unit = t.substr(i);
  double v = 0;
  try {
    size_t used = 0;
    v = std::stod(num, &used);
    if (used != num.size()) throw std::invalid_argument("");
  } catch (...) {
    throw Error("invalid size '" + text + "' (expected e.g. 512MiB, 2GiB, 1.5G or a byte count)");
  }
  std::string u;
  for (char c : unit) u += (char)std::tolower((unsigned char)c);
  double mult;
  if (u.empty() || u == "b") mult = 1;
  else if (u == "k" || u == "kb" || u == "kib") mult = 1024.0;
  else if (u == "m" || u == "mb" || u == "mib") mult = 1024.0 * 1024;
  else if (u == "g" || u == "gb" || u == "gib") mult = 1024.0 * 1024 * 1024;
  else if (u == "t" || u == "tb" || u == "tib") mult = 1024.0 * 1024 * 1024 * 1024;
  else throw Error("invalid size unit in '" + text + "' (use B, KiB, MiB, GiB or TiB)");
  const double bytes = v * mult;
  if (!(bytes >= 1) || bytes > 9e18) throw Error("size '" + text + "' is out of range");
  return (int64_t)bytes;
}

int64_t memory_available_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  int64_t kb = 0, avail_kb = 0;
  std::string unit;
  while (f >> key >> kb >> unit)
    if (key == "MemAvailable:") avail_kb = kb;
  return avail_kb * 1024;
}

int64_t default_kv_budget(const Model& model) {
  (void)model;  // the model is already mapped (and counted by MemAvailable as page cache)
  return std::max<int64_t>(memory_available_bytes() / 2, (int64_t)64 << 20);
}

// ---------------------------------------------------------------------------------------------------
// Engine

Engine::Engine(const Model& model, const EngineOptions& opt) : model_(model), kv_type_(opt.kv_type) {
  const ModelConfig& c = model.config();
  n_ctx_ = opt.n_ctx > 0 ? opt.n_ctx : std::min<int64_t>(c.n_ctx_train, 8192);
  if (n_ctx_ > (int64_t)c.n_ctx_train * 4)
    throw Error("context size " + std::to_string(n_ctx_) + " is far beyond the model's training context");
  n_batch_ = opt.n_batch > 0 ? opt.n_batch : n_ctx_;
  threads_ = std::make_unique<ThreadPool>(opt.n_threads > 0 ? opt.n_threads : ThreadPool::default_threads());
  const int64_t budget = opt.kv_budget_bytes > 0 ? opt.kv_budget_bytes : default_kv_budget(model);
  pages_ = std::make_unique<PagePool>(KvCache::page_bytes_for(c.head_dim, kv_type_), budget);
  forward_ = std::make_unique<Forward>(model, n_batch_, n_ctx_, *threads_);
}

Engine::~Engine() = default;

int Engine::n_threads() const { return threads_->size(); }

int64_t Engine::kv_bytes_per_token() const {
  const ModelConfig& c = model_.config();
  return (int64_t)c.n_layer * c.n_head_kv * 2 * (int64_t)kv_row_bytes(kv_type_, c.head_dim);
}

int64_t Engine::kv_budget_tokens() const {
  const PagePool& p = *pages_;
  if (p.budget_bytes() <= 0) return 0;
  // Whole pages per stream: the budget's pages shared out over every (layer, KV head) stream.
  const ModelConfig& c = model_.config();
  return p.budget_bytes() / p.page_bytes() / ((int64_t)c.n_layer * c.n_head_kv) * KvCache::kPageTokens;
}

std::unique_ptr<Sequence> Engine::new_sequence() { return std::unique_ptr<Sequence>(new Sequence(*this)); }

void Engine::step(std::span<Segment> segments) {
  int64_t total = 0;
  for (size_t i = 0; i < segments.size(); i++) {
    const Segment& s = segments[i];
    if (!s.seq || &s.seq->engine_ != this) throw Error("internal: a segment without a sequence of this engine");
    if (s.n <= 0 || !s.tokens) throw Error("internal: an empty segment");
    for (size_t j = 0; j < i; j++)
      if (segments[j].seq == s.seq) throw Error("internal: two segments of one sequence in a step");
    if (s.seq->n_past() + s.n > n_ctx_)
      throw Error("context overflow: " + std::to_string(s.seq->n_past() + s.n) + " tokens exceed the context size of " +
                  std::to_string(n_ctx_));
    if (s.logits == LogitsMode::All && !s.all_logits) throw Error("internal: LogitsMode::All without a buffer");
    total += s.n;
  }
  if (total > n_batch_)
    throw Error("internal: a step of " + std::to_string(total) + " tokens exceeds the batch size of " +
                std::to_string(n_batch_));
  // Admission by KV pages, in the caller's order.
  int64_t available = pages_->pages_available();
  fwd_segments_.clear();
  for (Segment& s : segments) {
    if (const int64_t limit = s.seq->context_step_limit(); limit > 0 && s.n > limit) {
      s.n = limit;
      if (s.logits == LogitsMode::Last) s.logits = LogitsMode::None;  // its last token is not this step's
    }
    const int64_t need = s.seq->cache_.pages_needed(s.n);
    if (need > available) {
      s.status = SegmentStatus::OutOfKvMemory;
      continue;
    }
    available -= need;
    s.status = SegmentStatus::Ok;
    ForwardSegment f;
    f.cache = &s.seq->cache_;
    f.tokens = s.tokens;
    f.n = s.n;
    f.observer = s.seq->observer_;
    f.mode = s.logits;
    f.logits = s.logits == LogitsMode::All ? s.all_logits : s.seq->logits_.data();
    fwd_segments_.push_back(f);
  }
  if (fwd_segments_.empty()) return;
  forward_->step_batch(fwd_segments_.data(), (int)fwd_segments_.size());
}

void Engine::feed(Sequence& seq, const int32_t* tokens, int64_t n, LogitsMode mode, float* all_logits) {
  const int64_t V = model_.config().n_vocab;
  for (int64_t done = 0; done < n;) {
    const int64_t m = std::min(n_batch_, n - done);
    Segment s;
    s.seq = &seq;
    s.tokens = tokens + done;
    s.n = m;
    s.logits = mode == LogitsMode::All ? LogitsMode::All : (done + m == n ? mode : LogitsMode::None);
    s.all_logits = mode == LogitsMode::All ? all_logits + done * V : nullptr;
    step(std::span<Segment>(&s, 1));
    if (s.status == SegmentStatus::OutOfKvMemory)
      throw KvBudgetExceeded("KV memory budget exhausted: " + std::to_string(pages_->bytes_in_use()) + " of " +
                             std::to_string(pages_->budget_bytes()) + " bytes in use, " +
                             std::to_string(seq.cache_.pages_needed(m) * pages_->page_bytes()) +
                             " more needed (raise --kv-budget)");
    done += s.n;  // step() may have cut it at an eviction boundary
  }
}

void Engine::prefill_recorded(Sequence& seq, const std::vector<int32_t>& ids, ContextRecording& rec) {
  if (seq.press_ || seq.n_past() != 0) throw Error("internal: a recorded prefill needs an empty sequence without a press");
  rec.clear();
  seq.begin_context();
  seq.observer_ = &rec;
  feed(seq, ids.data(), (int64_t)ids.size(), LogitsMode::Last);
  seq.end_context(ids);
  rec.logits() = seq.logits_;
}

void Engine::replay(Sequence& seq, const ContextRecording& rec) {
  if (!seq.in_context_ || seq.n_past() != 0) throw Error("internal: replay into a sequence that has not begun a context");
  // The recording holds a context prefilled without evictions; a press that evicts inside the context
  // changes what later tokens attend to, so it must be fed, not replayed.
  if (seq.context_step_limit() > 0) throw Error("internal: replay under a press that evicts while prefilling");
  for (const RecordedStep& st : rec.steps()) {
    if (seq.cache_.pages_needed(st.n_tok) > pages_->pages_available())
      throw KvBudgetExceeded("KV memory budget exhausted: " + std::to_string(pages_->bytes_in_use()) + " of " +
                             std::to_string(pages_->budget_bytes()) + " bytes in use (raise --kv-budget)");
    forward_->replay_step(st, seq.cache_, seq.observer_);
  }
  seq.logits_ = rec.logits();
}

void Engine::run_on_scratch_fork(const KvCache& cache, const int32_t* tokens, int64_t n, LayerObserver& obs) {
  KvCache scratch(cache.n_layer(), cache.n_head_kv(), cache.head_dim(), &const_cast<KvCache&>(cache).pool(),
                  cache.kv_type());
  scratch.share_from(cache);
  forward_->run(tokens, n, scratch, LogitsMode::None, nullptr, &obs);
}

// ---------------------------------------------------------------------------------------------------
// Sequence

Sequence::Sequence(Engine& engine)
    : engine_(engine),
      cache_(engine.model().config().n_layer, engine.model().config().n_head_kv, engine.model().config().head_dim,
             &engine.pages(), engine.kv_type()),
      logits_((size_t)engine.model().config().n_vocab, 0.0f) {}

Sequence::~Sequence() = default;

void Sequence::set_press(std::unique_ptr<Press> press) {
  owned_press_ = std::move(press);
  press_ = owned_press_.get();
  observer_ = nullptr;
  in_context_ = false;
}

void Sequence::set_press_after_context(std::unique_ptr<Press> press) {
  set_press(std::move(press));
  observer_ = press_ && press_->prunes_decoding() ? press_ : nullptr;
}

void Sequence::attach_press(Press* press) {
  owned_press_.reset();
  press_ = press;
  observer_ = nullptr;
  in_context_ = false;
}

void Sequence::begin_context() {
  if (cache_.n_past() != 0) throw Error("internal: begin_context on a sequence that already holds tokens");
  in_context_ = true;
  observer_ = nullptr;
  if (!press_) return;
  press_->begin_context(engine_);
  observer_ = press_;
}

void Sequence::end_context(const std::vector<int32_t>& context_ids, const std::string& question) {
  in_context_ = false;
  if (!press_) {
    observer_ = nullptr;
    return;
  }
  ContextView view{cache_, engine_, context_ids, question};
  const int64_t before = cache_.entries_kept();
  press_->end_context(view);
  engine_.pages().count_evicted(before - cache_.entries_kept());
  observer_ = press_->prunes_decoding() ? press_ : nullptr;
}

int64_t Sequence::context_step_limit() const {
  if (!in_context_ || !press_) return 0;
  const int64_t every = press_->context_eviction_interval();
  return every > 0 ? every - cache_.n_past() % every : 0;
}

std::unique_ptr<Sequence> Sequence::fork() const {
  std::unique_ptr<Sequence> f = engine_.new_sequence();
  f->cache_.share_from(cache_);
  f->logits_ = logits_;
  f->in_context_ = in_context_;
  if (press_) {  // clone never returns null: a press that cannot be copied now throws
    std::unique_ptr<Press> copy = press_->clone();
    f->observer_ = observer_ == press_ ? copy.get() : nullptr;
    f->owned_press_ = std::move(copy);
    f->press_ = f->owned_press_.get();
  }
  return f;
}

void Sequence::rewind(int64_t pos) { cache_.truncate((int32_t)pos); }

void Sequence::reset() {
  cache_.clear();
  in_context_ = false;
  observer_ = nullptr;
}

void Sequence::start_generation(const GenerationOptions& opt) {
  gen_ = opt;
  sampler_ = std::make_unique<Sampler>(opt.sampling, engine_.model().config().n_vocab);
  stops_ = StopMatcher(gen_.stop);
  n_generated_ = 0;
  generated_.clear();
}

TokenEvent Sequence::sample_next() {
  if (!sampler_) throw Error("internal: sample_next before start_generation");
  TokenEvent ev;
  auto finish = [&](const char* reason) {
    ev.text += stops_.flush();
    ev.finished = true;
    ev.finish_reason = reason;
    return ev;
  };
  if (n_generated_ >= gen_.max_new_tokens) return finish("length");
  const Tokenizer& tok = engine_.model().tokenizer();
  const int32_t id = sampler_->sample(logits_.data());
  if (gen_.stop_at_eog && tok.is_eog(id)) return finish("eos");
  ev.id = id;
  generated_.push_back(id);
  n_generated_++;
  StopMatcher::Piece piece = stops_.push(tok.token_bytes(id, /*skip_special=*/false));
  ev.text = std::move(piece.text);
  if (piece.stopped) return finish("stop");
  if (cache_.n_past() + 1 > engine_.n_ctx()) return finish("context");
  return ev;
}

}  // namespace kvzap
