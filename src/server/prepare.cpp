#include "server/prepare.h"

#include <algorithm>
#include <cstdio>
#include <random>

#include "chat/chat_prompt.h"

namespace kvzap::server {

std::unique_ptr<Press> PressFactory::make(const PressSpec& o, const std::string& key, bool* repeated) {
  std::lock_guard<std::mutex> lock(mu_);
  const bool seen = seen_.get(key) != nullptr;
  if (!seen) seen_.put(key, 1);
  if (repeated) *repeated = seen;
  if (std::unique_ptr<Press>* proto = prototypes_.get(key)) {
    if (auto p = (*proto)->clone()) return p;
  }
  std::unique_ptr<Press> p;
  try {
    p = make_press(o, model_);
  } catch (const Error& e) {
    throw invalid_request(std::string("kv_compression: ") + e.what());
  }
  if (auto proto = p->clone()) prototypes_.put(key, std::move(proto));
  return p;
}

bool resolve_press(const std::optional<KvCompressionSpec>& spec, const ServerDefaults& d, PressSpec& out) {
  if (!spec) {
    out = d.press;
    out.prefill_evict_every = judges_whole_contexts(out) ? 0 : d.prefill_evict_every;
    return d.has_press;
  }
  if (spec->press && *spec->press == "none") {
    if (spec->threshold || spec->ratio || spec->ratio_scope || spec->window || spec->sink_tokens || spec->decoding ||
        spec->sliding_layers || spec->prefill_evict_every || spec->seed || spec->ratios)
      throw invalid_request(
          "kv_compression: press \"none\" takes no threshold, ratio, ratios, ratio_scope, window, sink_tokens, "
          "prefill_evict_every, decoding, sliding_layers or seed");
    return false;
  }
  if (!spec->press && !d.has_press)
    throw invalid_request("kv_compression.press is required: this server has no default press (--press)");
  // Another press than the server's starts from PressSpec{}: only the request's settings apply.
  try {
    out = press_spec_apply(d.has_press ? d.press : PressSpec{}, *spec);
  } catch (const Error& e) {  // a value the press refuses (a ratio for an own-budget press, a range): the client's
    throw invalid_request(std::string("kv_compression: ") + e.what());
  }
  if (!spec->prefill_evict_every) out.prefill_evict_every = judges_whole_contexts(out) ? 0 : d.prefill_evict_every;
  return true;
}

std::string press_settings_key(bool has_press, const PressSpec& o) { return press_spec_key(has_press ? &o : nullptr); }

void check_prompt_fits_press(const PressSpec& o, int64_t n_prompt, int64_t n_ctx) {
  // What the press needs of a context comes from the registry: checked here, a failure would otherwise
  // happen inside a batch step and end every request in it.
  const PressTraits& t = press_traits(o.name);
  const int64_t min_context = press_min_context(o);
  if ((o.has_ratio || !o.ratios.empty()) && n_prompt <= min_context)
    throw invalid_request("kv_compression: press '" + o.name + "' needs a prompt longer than " +
                          std::to_string(min_context) + " tokens, got " + std::to_string(n_prompt));
  // A repeat pass (KVzip) runs the context plus a chat-wrapped copy of up to 2048 of its tokens
  // (press/scorer_kvzip.cpp) on top of it; 64 tokens cover the template around the copy.
  if (t.repeats_context) {
    const int64_t need = n_prompt + std::min<int64_t>(n_prompt, 2048) + 64;
    if (need > n_ctx)
      throw invalid_request("kv_compression: press '" + o.name + "' needs about " + std::to_string(need) +
                            " tokens of context for its repeat pass (prompt of " + std::to_string(n_prompt) +
                            "), the server has " + std::to_string(n_ctx) + " (-c)");
  }
}

std::string press_label(bool has_press, const PressSpec& o) { return has_press ? o.name : "none"; }

std::vector<int32_t> prompt_tokens(const CompletionRequest& r, const Tokenizer& tok) {
  try {
    if (r.endpoint == Endpoint::Chat)
      return ChatPrompt(tok).encode(r.messages);
    if (r.prompt_text) return tok.encode(*r.prompt_text, tok.vocab().add_bos, true);
  } catch (const Error& e) {
    throw invalid_request(e.what());
  }
  return r.prompt_ids;
}

std::unique_ptr<Job> prepare_job(const CompletionRequest& r, const Model& model, int64_t n_ctx, const ServerDefaults& d,
                                 PressFactory& presses, int tenant, const std::string& id) {
  auto job = std::make_unique<Job>();
  job->id = id;
  job->prompt = prompt_tokens(r, model.tokenizer());
  const int64_t n = (int64_t)job->prompt.size();
  if (n == 0) throw invalid_request("the prompt is empty");
  if (n >= n_ctx)
    throw ApiError(400, "exceed_context_size_error",
                   "request (" + std::to_string(n) + " tokens) exceeds the available context size (" + std::to_string(n_ctx) +
                       " tokens), try increasing it (-c)",
                   {{"n_prompt_tokens", n}, {"n_ctx", n_ctx}});
  job->gen.max_new_tokens = r.max_tokens;
  job->gen.sampling = r.sampling;
  if (!r.has_seed) job->gen.sampling.seed = std::random_device{}() * 0x100000001ull + std::random_device{}();
  job->gen.stop = r.stop;
  job->gen.stop_at_eog = !r.ignore_eos;
  job->has_press = resolve_press(r.kv_compression, d, job->press_spec);
  if (job->has_press) check_prompt_fits_press(job->press_spec, n, n_ctx);
  const std::string settings = press_settings_key(job->has_press, job->press_spec);
  bool repeated = false;
  if (job->has_press) job->first_press = presses.make(job->press_spec, settings, &repeated);
  // A request's own press settings earn prefix-cache space once they repeat: one-off settings (a client
  // trying a thousand thresholds) would fill the cache with entries no later request can use. The
  // server's own press, and no press, always may.
  job->store_prefix = !r.kv_compression || repeated;
  job->press_label = press_label(job->has_press, job->press_spec);
  job->press_key = settings + "|tenant=" + std::to_string(tenant);
  // Settings a request brought are charged to its tenant: they hold at most a share of the cache.
  if (r.kv_compression) job->prefix_quota = "tenant=" + std::to_string(tenant);
  job->channel = std::make_shared<RequestChannel>();
  if (d.request_timeout_s > 0)
    job->deadline = job->arrival + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(d.request_timeout_s));
  return job;
}

}  // namespace kvzap::server
