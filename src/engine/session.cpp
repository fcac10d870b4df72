#include "engine/session.h"

#include <chrono>
#include <limits>

namespace kvzap {

namespace {
double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

EngineOptions engine_options(const SessionOptions& opt) {
  EngineOptions e;
  e.n_threads = opt.n_threads;
  e.n_ctx = opt.n_ctx;
  e.n_batch = opt.n_batch;
  e.kv_budget_bytes = opt.kv_budget_bytes;
  e.kv_type = opt.kv_type;
  return e;
}
}  // namespace

Session::Session(const Model& model, const SessionOptions& opt) {
  engine_ = std::make_unique<Engine>(model, engine_options(opt));
  // n_batch defaults to n_ctx here (a whole prompt is one step), capped by the context.
  if (opt.kv_budget_bytes < 0) engine_->pages().set_budget_bytes(0);  // one sequence: no budget
  seq_ = engine_->new_sequence();
}

Session::~Session() = default;

void Session::prefill_context(const std::vector<int32_t>& ids, Press* press, const std::string& question) {
  seq_->reset();
  if ((int64_t)ids.size() > n_ctx())
    throw Error("context of " + std::to_string(ids.size()) + " tokens does not fit the context size of " +
                std::to_string(n_ctx()) + " tokens");
  seq_->attach_press(press);
  seq_->begin_context();
  feed(ids);
  seq_->end_context(ids, question);
  if (press) cache().release_pool();  // a large eviction: give the freed pages back to the system
}

void Session::feed(const std::vector<int32_t>& ids) {
  if (ids.empty()) return;
  engine_->feed(*seq_, ids.data(), (int64_t)ids.size(), LogitsMode::Last);
}

GenerateResult Session::generate(const std::vector<int32_t>& prompt, const GenerateOptions& opt,
                                 const std::function<bool(const std::string&)>& on_text) {
  return generate_on(*seq_, prompt, opt, on_text);
}

GenerateResult Session::generate_on(Sequence& seq, const std::vector<int32_t>& prompt, const GenerateOptions& opt,
                                    const std::function<bool(const std::string&)>& on_text) {
  Engine& engine = seq.engine();
  GenerateResult r;
  r.n_prompt = (int64_t)prompt.size();
  if (seq.n_past() + (int64_t)prompt.size() > engine.n_ctx())
    throw Error("prompt of " + std::to_string(prompt.size()) + " tokens does not fit the context of " +
                std::to_string(engine.n_ctx()) + " tokens (" + std::to_string(seq.n_past()) + " already used)");
  double t0 = now_seconds();
  if (!prompt.empty()) engine.feed(seq, prompt.data(), (int64_t)prompt.size(), LogitsMode::Last);
  r.prefill_seconds = now_seconds() - t0;

  GenerationOptions g;
  g.max_new_tokens = opt.max_new_tokens;
  g.sampling = opt.sampling;
  g.stop = opt.stop;
  g.stop_at_eog = opt.stop_at_eog;
  seq.start_generation(g);
  t0 = now_seconds();
  for (int step = 1;; step++) {
    TokenEvent ev = seq.sample_next();
    r.text += ev.text;
    bool keep_going = true;
    if (!ev.text.empty() && on_text) keep_going = on_text(ev.text);
    if (ev.finished) {
      r.stop_reason = ev.finish_reason;
      break;
    }
    if (!keep_going) {
      r.stop_reason = "stop";
      break;
    }
    engine.feed(seq, &ev.id, 1, LogitsMode::Last);
    if (opt.on_token) opt.on_token(step);
  }
  r.tokens = seq.generated();
  r.decode_seconds = now_seconds() - t0;
  return r;
}

}  // namespace kvzap
