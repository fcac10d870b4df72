#include "server/prepare.h"

#include <algorithm>
#include <cstdio>
#include <random>

#include "tokenizer/chat_prompt.h"

namespace kvzap::server {

std::unique_ptr<Press> PressFactory::make(const PressOptions& o, const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
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

bool resolve_press(const std::optional<KvCompressionSpec>& spec, const ServerDefaults& d, PressOptions& out) {
  if (!spec) {
    out = d.press;
    out.prefill_evict_every = out.has_ratio ? 0 : d.prefill_evict_every;
    return d.has_press;
  }
  if (spec->press && *spec->press == "none") {
    if (spec->threshold || spec->ratio || spec->window || spec->sink_tokens || spec->decoding || spec->sliding_layers ||
        spec->prefill_evict_every)
      throw invalid_request(
          "kv_compression: press \"none\" takes no threshold, ratio, window, sink_tokens, prefill_evict_every, decoding "
          "or sliding_layers");
    return false;
  }
  if (spec->press && (!d.has_press || *spec->press != d.press.name)) {
    out = PressOptions{};  // another press than the server's: only the request's settings apply
    out.name = *spec->press;
  } else if (d.has_press) {
    out = d.press;
  } else {
    throw invalid_request("kv_compression.press is required: this server has no default press (--press)");
  }
  if (spec->threshold) {
    out.has_threshold = true, out.threshold = *spec->threshold;
    out.has_ratio = false;
  }
  if (spec->ratio) {
    out.has_ratio = true, out.ratio = *spec->ratio;
    out.has_threshold = false;
  }
  if (spec->window) out.window = *spec->window;
  if (spec->sink_tokens) out.sink_tokens = *spec->sink_tokens;
  if (spec->decoding) out.decoding = *spec->decoding;
  if (spec->sliding_layers) out.sliding_layers = *spec->sliding_layers;
  out.prefill_evict_every = spec->prefill_evict_every ? *spec->prefill_evict_every : out.has_ratio ? 0 : d.prefill_evict_every;
  return true;
}

std::string press_settings_key(bool has_press, const PressOptions& o) {
  if (!has_press) return "none";
  char buf[512];
  std::snprintf(buf, sizeof buf, "%s|t=%d:%.17g|r=%d:%.17g|scope=%s|w=%d|sink=%d|every=%d|dec=%d|slide=%d|sur=%s|seed=%llu",
                o.name.c_str(), (int)o.has_threshold, o.threshold, (int)o.has_ratio, o.ratio, o.ratio_scope.c_str(),
                o.window, o.sink_tokens, o.prefill_evict_every, (int)o.decoding, (int)o.sliding_layers, o.surrogate_dir.c_str(), (unsigned long long)o.seed);
  return buf;
}

void check_prompt_fits_press(const PressOptions& o, int64_t n_prompt, int64_t n_ctx) {
  // SnapKV and the presses built on its scores (press/baselines.h) vote with the context's last 64
  // queries and fail on a shorter context; in a batch step that failure would end every request in it.
  constexpr int64_t kSnapKvWindow = 64;
  std::string base = o.name;
  if (base.rfind("adakv_", 0) == 0) base = base.substr(6);
  if (o.has_ratio && (base == "snapkv" || base == "chunkkv" || base == "pyramidkv") && n_prompt <= kSnapKvWindow)
    throw invalid_request("kv_compression: press '" + o.name + "' (SnapKV scores) needs a prompt longer than " +
                          std::to_string(kSnapKvWindow) + " tokens, got " + std::to_string(n_prompt));
  // KVzip scores by a repeat pass: the context plus a chat-wrapped copy of up to 2048 of its tokens
  // (press/scorer_kvzip.cpp) must fit the context; 64 tokens cover the template around the copy.
  if (base == "kvzip" || base == "kvzip+") {
    const int64_t need = n_prompt + std::min<int64_t>(n_prompt, 2048) + 64;
    if (need > n_ctx)
      throw invalid_request("kv_compression: press '" + o.name + "' needs about " + std::to_string(need) +
                            " tokens of context for its repeat pass (prompt of " + std::to_string(n_prompt) +
                            "), the server has " + std::to_string(n_ctx) + " (-c)");
  }
}

std::string press_label(bool has_press, const PressOptions& o) { return has_press ? o.name : "none"; }

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
  job->has_press = resolve_press(r.kv_compression, d, job->press_options);
  if (job->has_press) check_prompt_fits_press(job->press_options, n, n_ctx);
  const std::string settings = press_settings_key(job->has_press, job->press_options);
  if (job->has_press) job->first_press = presses.make(job->press_options, settings);
  job->press_label = press_label(job->has_press, job->press_options);
  job->press_key = settings + "|tenant=" + std::to_string(tenant);
  job->channel = std::make_shared<RequestChannel>();
  if (d.request_timeout_s > 0)
    job->deadline = job->arrival + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(d.request_timeout_s));
  return job;
}

}  // namespace kvzap::server
