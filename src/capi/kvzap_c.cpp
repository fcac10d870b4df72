// The C API (include/kvzap/kvzap.h) over the engine: handles own C++ objects, every entry point catches
// every exception and turns it into a status plus a thread-local message. No product logic lives here:
// presses go through PressSpec (press_spec_from_json, make_press), the pipeline through answer_questions,
// generation through Sequence::start_generation / sample_next, exactly as the CLI runs them.
#include "kvzap/kvzap.h"

#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/cache_file.h"
#include "cache/page_pool.h"
#include "chat/chat_prompt.h"
#include "common/data_dir.h"
#include "common/json_fields.h"
#include "engine/context_recording.h"
#include "fetch/model_store.h"
#include "engine/pipeline.h"
#include "engine/session.h"
#include "eval/ruler.h"
#include "eval/runner.h"
#include "kvzap/error.h"
#include "press/catalogue.h"
#include "press/press.h"
#include "press/press_spec.h"
#include "press/surrogate.h"
#include "train/mlp.h"
#include "train/ridge.h"
#include "train/targets.h"

using nlohmann::json;
using namespace kvzap;

struct kvzap_model {
  std::unique_ptr<Model> model;
};

struct kvzap_press {
  PressSpec spec;
  std::unique_ptr<Press> proto;  // validated against the model; every use runs a clone
};

struct kvzap_sequence {
  kvzap_engine* engine = nullptr;
  Sequence* seq = nullptr;
  std::unique_ptr<Sequence> owned;  // null for the engine's own sequence
  std::vector<int32_t> tokens;      // every token fed since the last prefill / load (the saved context)
  std::string press_key = "none";
  std::string ev_text, ev_reason;   // the last decode step's strings
  bool keep_scores = false;         // presses of later prefills keep their scores (kvzap_sequence_keep_scores)
};

struct kvzap_recording {
  std::unique_ptr<ContextRecording> rec;
  kvzap::ModelConfig cfg;
};

struct kvzap_targets {
  kvzap::WindowTargets t;
  std::vector<int32_t> ids;  // the repeat prompt
  int64_t start_prompt = 0;
};

struct kvzap_engine {
  const kvzap_model* model = nullptr;
  std::unique_ptr<Session> session;
  kvzap_sequence own;
};

namespace {

thread_local std::string g_error;

kvzap_status fail(kvzap_status st, const std::string& msg) {
  g_error = msg;
  return st;
}

// Runs f, mapping exceptions to statuses: the one place exceptions stop.
template <class F>
kvzap_status guarded(F&& f) {
  try {
    f();
    return KVZAP_OK;
  } catch (const KvBudgetExceeded& e) {
    return fail(KVZAP_ERR_OUT_OF_KV_MEMORY, e.what());
  } catch (const Error& e) {
    return fail(KVZAP_ERR_ENGINE, e.what());
  } catch (const json::exception& e) {
    return fail(KVZAP_ERR_INVALID_ARGUMENT, std::string("invalid JSON: ") + e.what());
  } catch (const std::bad_alloc&) {
    return fail(KVZAP_ERR_INTERNAL, "out of memory");
  } catch (const std::exception& e) {
    return fail(KVZAP_ERR_INTERNAL, e.what());
  } catch (...) {
    return fail(KVZAP_ERR_INTERNAL, "unknown error");
  }
}

struct BadArgument : Error {
  using Error::Error;
};

template <class F>
kvzap_status guarded_args(F&& f) {
  try {
    f();
    return KVZAP_OK;
  } catch (const BadArgument& e) {
    return fail(KVZAP_ERR_INVALID_ARGUMENT, e.what());
  } catch (...) {
    return guarded([] { throw; });
  }
}

// Detaches a press the caller owns from a sequence when leaving scope, exception or not: the sequence must
// never keep a pointer to a press that dies with the call.
struct DetachPress {
  Sequence& seq;
  ~DetachPress() { seq.attach_press(nullptr); }
};

void need(const void* p, const char* what) {
  if (!p) throw BadArgument(std::string(what) + " must not be NULL");
}

json parse_json(const char* text, const char* what) {
  if (!text || !*text) return json::object();
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    throw BadArgument(std::string(what) + ": invalid JSON (" + e.what() + ")");
  }
}

void check_object(const json& j, const std::string& what, std::initializer_list<const char*> keys) {
  if (!j.is_object()) throw BadArgument(what + " must be a JSON object");
  for (auto& [k, v] : j.items()) {
    bool ok = false;
    for (const char* key : keys) ok = ok || k == key;
    if (!ok) {
      std::string list;
      for (const char* key : keys) list += (list.empty() ? "" : ", ") + std::string(key);
      throw BadArgument("unknown field '" + what + "." + k + "' (expected " + list + ")");
    }
  }
}

char* dup_string(const std::string& s) {
  char* p = static_cast<char*>(std::malloc(s.size() + 1));
  if (!p) throw std::bad_alloc();
  std::memcpy(p, s.data(), s.size());
  p[s.size()] = 0;
  return p;
}

void out_json(char** out, const json& j) {
  need(out, "json_out");
  *out = dup_string(j.dump(-1, ' ', false, json::error_handler_t::replace));
}

void out_ids(const std::vector<int32_t>& ids, int32_t** ids_out, size_t* n_out) {
  need(ids_out, "ids_out");
  need(n_out, "n_out");
  int32_t* p = static_cast<int32_t*>(std::malloc(std::max<size_t>(1, ids.size()) * sizeof(int32_t)));
  if (!p) throw std::bad_alloc();
  if (!ids.empty()) std::memcpy(p, ids.data(), ids.size() * sizeof(int32_t));
  *ids_out = p;
  *n_out = ids.size();
}

std::string text_arg(const char* s, size_t len) { return s ? std::string(s, len) : std::string(); }

std::vector<ChatMessage> parse_messages(const char* messages_json) {
  need(messages_json, "messages_json");
  const json j = parse_json(messages_json, "messages_json");
  if (!j.is_array()) throw BadArgument("messages_json must be a JSON array of {\"role\", \"content\"}");
  std::vector<ChatMessage> msgs;
  for (size_t i = 0; i < j.size(); i++) {
    const std::string where = "messages[" + std::to_string(i) + "]";
    check_object(j[i], where, {"role", "content"});
    msgs.push_back({json_fields::get_string(j[i].at("role"), where + ".role"),
                    json_fields::get_string(j[i].at("content"), where + ".content")});
  }
  return msgs;
}

// Generation options from JSON onto `g` (whose defaults are GenerateOptions', the CLI's).
void apply_generation_json(const json& j, const std::string& where, GenerateOptions& g, bool* stop_at_eog) {
  using namespace json_fields;
  for (auto& [k, v] : j.items()) {
    const std::string f = where + "." + k;
    if (k == "max_new_tokens") g.max_new_tokens = (int)get_integer(v, f, 0, 1 << 20);
    else if (k == "temperature") g.sampling.temperature = (float)get_number(v, f, 0, 100);
    else if (k == "top_k") g.sampling.top_k = (int)get_integer(v, f, 0, 1 << 30);
    else if (k == "top_p") g.sampling.top_p = (float)get_number(v, f, 0, 1);
    else if (k == "min_p") g.sampling.min_p = (float)get_number(v, f, 0, 1);
    else if (k == "seed") g.sampling.seed = (uint64_t)get_integer(v, f, 0, INT64_MAX);
    else if (k == "stop_at_eog" && stop_at_eog) *stop_at_eog = get_bool(v, f);
    else if (k == "stop") {
      if (!v.is_array()) throw BadArgument("'" + f + "' must be an array of strings");
      g.stop.clear();
      for (size_t i = 0; i < v.size(); i++) g.stop.push_back(get_string(v[i], f + "[" + std::to_string(i) + "]"));
    }
  }
}

json answer_json(const GenerateResult& r) {
  return {{"text", r.text}, {"tokens", r.tokens}, {"stop_reason", r.stop_reason}, {"n_prompt_tokens", r.n_prompt},
          {"n_generated", r.tokens.size()}, {"prefill_seconds", r.prefill_seconds}, {"decode_seconds", r.decode_seconds}};
}

}  // namespace

extern "C" {

const char* kvzap_last_error(void) { return g_error.c_str(); }
const char* kvzap_version(void) { return "0.1.0"; }
int kvzap_api_version(void) { return KVZAP_API_VERSION; }
void kvzap_free(void* p) { std::free(p); }

void kvzap_set_data_dir(const char* dir) { set_data_dir(dir ? dir : ""); }
kvzap_status kvzap_get_data_dir(char** out) {
  return guarded_args([&] {
    need(out, "out");
    *out = dup_string(data_dir());
  });
}

// ---- model ----

kvzap_status kvzap_model_load(const char* path, const char* options_json, kvzap_model** out) {
  return guarded_args([&] {
    need(out, "out");
    *out = nullptr;
    const json o = parse_json(options_json, "options_json");
    check_object(o, "options", {"quantize"});
    LoadOptions lo;
    if (o.contains("quantize")) {
      const std::string q = json_fields::get_string(o["quantize"], "options.quantize");
      if (q == "q8_0") lo.quantize = GgmlType::Q8_0;
      else if (q == "q4_k") lo.quantize = GgmlType::Q4_K;
      else throw BadArgument("'options.quantize' must be q8_0 or q4_k, got \"" + q + "\"");
    }
    auto m = std::make_unique<kvzap_model>();
    m->model = Model::load(resolve_model(path ? path : ""), lo);
    *out = m.release();
  });
}

void kvzap_model_free(kvzap_model* model) { delete model; }

kvzap_status kvzap_model_info(const kvzap_model* model, char** json_out) {
  return guarded_args([&] {
    need(model, "model");
    const ModelConfig& c = model->model->config();
    out_json(json_out, {{"name", c.name}, {"arch", c.arch}, {"n_layer", c.n_layer}, {"n_head", c.n_head},
                        {"n_head_kv", c.n_head_kv}, {"head_dim", c.head_dim}, {"n_embd", c.n_embd},
                        {"n_vocab", c.n_vocab}, {"n_ctx_train", c.n_ctx_train},
                        {"has_chat_template", !model->model->tokenizer().vocab().chat_template.empty()}});
  });
}

kvzap_status kvzap_resolve_model(const char* name, char** path_out) {
  return guarded_args([&] {
    need(path_out, "path_out");
    *path_out = dup_string(resolve_model(name ? name : ""));
  });
}

// ---- tokenizer ----

kvzap_status kvzap_tokenize(const kvzap_model* model, const char* text, size_t text_len, int add_bos, int parse_special,
                            int32_t** ids_out, size_t* n_out) {
  return guarded_args([&] {
    need(model, "model");
    if (!text && text_len) throw BadArgument("text must not be NULL");
    out_ids(model->model->tokenizer().encode(text_arg(text, text_len), add_bos != 0, parse_special != 0), ids_out, n_out);
  });
}

kvzap_status kvzap_detokenize(const kvzap_model* model, const int32_t* ids, size_t n, int skip_special, char** text_out,
                              size_t* len_out) {
  return guarded_args([&] {
    need(model, "model");
    need(text_out, "text_out");
    if (!ids && n) throw BadArgument("ids must not be NULL");
    const int n_vocab = model->model->config().n_vocab;
    for (size_t i = 0; i < n; i++)
      if (ids[i] < 0 || ids[i] >= n_vocab)
        throw BadArgument("token id " + std::to_string(ids[i]) + " out of range [0, " + std::to_string(n_vocab) + ")");
    const std::string s = model->model->tokenizer().decode(std::vector<int32_t>(ids, ids + n), skip_special != 0);
    *text_out = dup_string(s);
    if (len_out) *len_out = s.size();
  });
}

kvzap_status kvzap_apply_chat_template(const kvzap_model* model, const char* messages_json, int add_generation_prompt,
                                       char** text_out) {
  return guarded_args([&] {
    need(model, "model");
    need(text_out, "text_out");
    ChatOptions co;
    co.add_generation_prompt = add_generation_prompt != 0;
    *text_out = dup_string(ChatPrompt(model->model->tokenizer()).render(parse_messages(messages_json), co));
  });
}

kvzap_status kvzap_chat_tokens(const kvzap_model* model, const char* messages_json, int add_generation_prompt,
                               int32_t** ids_out, size_t* n_out) {
  return guarded_args([&] {
    need(model, "model");
    ChatOptions co;
    co.add_generation_prompt = add_generation_prompt != 0;
    out_ids(ChatPrompt(model->model->tokenizer()).encode(parse_messages(messages_json), co), ids_out, n_out);
  });
}

// ---- presses ----

kvzap_status kvzap_presses(char** json_out) {
  return guarded_args([&] { out_json(json_out, press_catalogue_json()); });
}

kvzap_status kvzap_press_spec_normalize(const char* spec_json, char** json_out) {
  return guarded_args([&] {
    need(spec_json, "spec_json");
    const PressSpec s = press_spec_from_json(parse_json(spec_json, "spec_json"));
    if (s.name != "none" && !find_press_entry(s.name)) {
      std::string names;
      for (const ScorerEntry& e : scorer_registry()) names += (names.empty() ? "" : ", ") + e.name;
      throw Error("unknown press '" + s.name + "' (known: " + names + ")");
    }
    out_json(json_out, press_spec_to_json(s));
  });
}

kvzap_status kvzap_press_create(const kvzap_model* model, const char* spec_json, kvzap_press** out) {
  return guarded_args([&] {
    need(model, "model");
    need(spec_json, "spec_json");
    need(out, "out");
    *out = nullptr;
    PressSpec s = press_spec_from_json(parse_json(spec_json, "spec_json"));
    if (s.name == "none") return;
    auto p = std::make_unique<kvzap_press>();
    p->proto = make_press(s, *model->model);
    p->spec = std::move(s);
    *out = p.release();
  });
}

void kvzap_press_free(kvzap_press* press) { delete press; }

kvzap_status kvzap_press_spec(const kvzap_press* press, char** json_out) {
  return guarded_args([&] {
    json j = press ? press_spec_to_json(press->spec) : json{{"press", "none"}};
    j["key"] = press_spec_key(press ? &press->spec : nullptr);
    out_json(json_out, j);
  });
}

// ---- engine ----

kvzap_status kvzap_engine_create(const kvzap_model* model, const char* options_json, kvzap_engine** out) {
  return guarded_args([&] {
    need(model, "model");
    need(out, "out");
    *out = nullptr;
    const json o = parse_json(options_json, "options_json");
    check_object(o, "options", {"threads", "n_ctx", "n_batch", "kv_type", "kv_budget"});
    SessionOptions so;
    using namespace json_fields;
    if (o.contains("threads")) so.n_threads = (int)get_integer(o["threads"], "options.threads", 0, 1024);
    if (o.contains("n_ctx")) so.n_ctx = get_integer(o["n_ctx"], "options.n_ctx", 0, (int64_t)1 << 22);
    if (o.contains("n_batch")) so.n_batch = get_integer(o["n_batch"], "options.n_batch", 0, (int64_t)1 << 22);
    if (o.contains("kv_type")) so.kv_type = parse_kv_type(get_string(o["kv_type"], "options.kv_type"));
    if (o.contains("kv_budget")) so.kv_budget_bytes = get_integer(o["kv_budget"], "options.kv_budget", -1, INT64_MAX);
    auto e = std::make_unique<kvzap_engine>();
    e->model = model;
    e->session = std::make_unique<Session>(*model->model, so);
    e->own.engine = e.get();
    e->own.seq = &e->session->sequence();
    *out = e.release();
  });
}

void kvzap_engine_free(kvzap_engine* engine) { delete engine; }

kvzap_status kvzap_engine_info(const kvzap_engine* engine, char** json_out) {
  return guarded_args([&] {
    need(engine, "engine");
    Engine& e = engine->session->engine();
    out_json(json_out, {{"n_ctx", e.n_ctx()}, {"n_threads", e.n_threads()}, {"kv_type", kv_type_name(e.kv_type())},
                        {"kv_bytes_in_use", e.pages().bytes_in_use()}, {"kv_bytes_peak", e.pages().peak_bytes()}});
  });
}

kvzap_status kvzap_pipeline_run(kvzap_engine* engine, const char* request_json, const kvzap_press* press,
                                kvzap_text_callback on_text, void* user, char** result_json) {
  return guarded_args([&] {
    need(engine, "engine");
    need(request_json, "request_json");
    need(result_json, "result_json");
    *result_json = nullptr;
    const json req = parse_json(request_json, "request_json");
    check_object(req, "request", {"context", "questions", "chat", "answer_prefix", "max_new_tokens", "temperature",
                                  "top_k", "top_p", "min_p", "seed", "stop"});
    using namespace json_fields;
    if (!req.contains("context")) throw BadArgument("'request.context' is required");
    const std::string context = get_string(req["context"], "request.context");
    std::vector<std::string> questions;
    if (req.contains("questions")) {
      if (!req["questions"].is_array()) throw BadArgument("'request.questions' must be an array of strings");
      for (size_t i = 0; i < req["questions"].size(); i++)
        questions.push_back(get_string(req["questions"][i], "request.questions[" + std::to_string(i) + "]"));
    }
    const bool chat = req.contains("chat") ? get_bool(req["chat"], "request.chat") : true;
    const std::string prefix = req.contains("answer_prefix") ? get_string(req["answer_prefix"], "request.answer_prefix") : "";
    GenerateOptions g;
    apply_generation_json(req, "request", g, nullptr);

    Session& s = *engine->session;
    const Tokenizer& tok = s.model().tokenizer();
    ContextPrompt cp = build_context_prompt(tok, context, questions, chat, prefix);
    if (questions.empty()) cp.question_ids.push_back({});  // generate straight after the context
    if (cp.context_ids.empty()) throw Error("the context is empty");
    int64_t longest_q = 0;
    for (const auto& q : cp.question_ids) longest_q = std::max<int64_t>(longest_q, (int64_t)q.size());
    if ((int64_t)cp.context_ids.size() + longest_q >= s.n_ctx())
      throw Error("prompt is " + std::to_string(cp.context_ids.size() + longest_q) +
                  " tokens, longer than the context of " + std::to_string(s.n_ctx()) + " tokens (raise n_ctx)");
    // Each call runs its own clone: a press handle is a configuration, never shared state.
    std::unique_ptr<Press> run_press = press ? press->proto->clone() : nullptr;
    std::function<bool(size_t, const std::string&)> cb;
    if (on_text) cb = [&](size_t qi, const std::string& piece) { return on_text(user, qi, piece.data(), piece.size()) != 0; };
    engine->own.tokens.clear();
    QaResult r;
    {
      // The engine's sequence holds the compressed context afterwards; the press dies with this call.
      const DetachPress detach{s.sequence()};
      r = answer_questions(s, run_press.get(), cp, g, cb);
    }
    engine->own.tokens = cp.context_ids;
    engine->own.press_key = press_spec_key(press ? &press->spec : nullptr);

    json j;
    j["answers"] = json::array();
    for (const GenerateResult& a : r.answers) j["answers"].push_back(answer_json(a));
    j["context_tokens"] = cp.context_ids;
    j["n_context_tokens"] = r.n_context;
    j["context_seconds"] = r.context_seconds;
    j["press"] = press ? press->proto->name() : "none";
    j["press_spec"] = press ? press_spec_to_json(press->spec) : json{{"press", "none"}};
    j["evicted_fraction"] = r.evicted_fraction;
    j["kv_bytes"] = r.kv_bytes;
    j["kv_bytes_full"] = r.kv_bytes_full;
    j["kv_lengths"] = r.kv_lengths;
    j["evicted_fraction_end"] = r.evicted_fraction_end;
    j["kv_bytes_end"] = r.kv_bytes_end;
    j["kv_bytes_full_end"] = r.kv_bytes_full_end;
    out_json(result_json, j);
  });
}

kvzap_status kvzap_eval_ruler(kvzap_engine* engine, const kvzap_press* press, const char* options_json, char** result_json) {
  return guarded_args([&] {
    need(engine, "engine");
    need(result_json, "result_json");
    *result_json = nullptr;
    const json o = parse_json(options_json, "options_json");
    check_object(o, "options", {"length", "samples", "tasks", "seed", "first_index"});
    using namespace json_fields;
    Session& s = *engine->session;
    const eval::PromptBuilder prompts(s.model().tokenizer());
    eval::SuiteOptions so;
    so.count_tokens = prompts.counter();
    if (o.contains("length")) so.length = get_integer(o["length"], "options.length", 64, (int64_t)1 << 20);
    if (o.contains("samples")) so.samples_per_task = get_integer(o["samples"], "options.samples", 1, (int64_t)1 << 20);
    if (o.contains("first_index")) so.first_index = get_integer(o["first_index"], "options.first_index", 0, (int64_t)1 << 40);
    if (o.contains("seed")) so.seed = (uint64_t)get_integer(o["seed"], "options.seed", 0, INT64_MAX);
    if (o.contains("tasks")) {
      if (!o["tasks"].is_array()) throw BadArgument("'options.tasks' must be an array of task names");
      for (size_t i = 0; i < o["tasks"].size(); i++) {
        const std::string t = get_string(o["tasks"][i], "options.tasks[" + std::to_string(i) + "]");
        if (!eval::is_ruler_task(t)) throw Error("unknown RULER task '" + t + "'");
        so.tasks.push_back(t);
      }
    }
    if (so.length > s.n_ctx())
      throw Error("RULER length " + std::to_string(so.length) + " does not fit the engine's context of " +
                  std::to_string(s.n_ctx()) + " tokens (create the engine with a larger n_ctx)");
    const std::vector<eval::Sample> samples = eval::generate_suite(so);
    std::unique_ptr<Press> run_press = press ? press->proto->clone() : nullptr;
    eval::RunOptions ro;
    ro.quiet = true;
    engine->own.tokens.clear();
    std::vector<eval::SampleOutcome> out;
    {
      const DetachPress detach{s.sequence()};
      out = eval::run_samples(s, run_press.get(), prompts, samples, ro);
    }
    json arr = json::array();
    for (const eval::SampleOutcome& r : out) arr.push_back(eval::outcome_to_json(r));
    out_json(result_json, arr);
  });
}

kvzap_status kvzap_sequence_kept_mask(const kvzap_sequence* seq, uint8_t* mask, size_t len) {
  return guarded_args([&] {
    need(seq, "seq");
    need(mask, "mask");
    const KvCache& c = seq->seq->cache();
    const size_t n_past = (size_t)c.n_past();
    const size_t want = (size_t)c.n_layer() * (size_t)c.n_head_kv() * n_past;
    if (len < want) throw BadArgument("mask holds " + std::to_string(len) + " bytes, needs " + std::to_string(want));
    std::memset(mask, 0, want);
    for (int l = 0; l < c.n_layer(); l++)
      for (int h = 0; h < c.n_head_kv(); h++) {
        uint8_t* row = mask + ((size_t)l * c.n_head_kv() + h) * n_past;
        for (int64_t i = 0; i < c.length(l, h); i++) {
          const int32_t p = c.position_at(l, h, i);
          if (p >= 0 && (size_t)p < n_past) row[p] = 1;
        }
      }
  });
}

kvzap_status kvzap_sequence_keep_scores(kvzap_sequence* seq, int on) {
  return guarded_args([&] {
    need(seq, "seq");
    seq->keep_scores = on != 0;
  });
}

kvzap_status kvzap_sequence_press_scores(const kvzap_sequence* seq, kvzap_score_view* view_out) {
  return guarded_args([&] {
    need(seq, "seq");
    need(view_out, "view_out");
    *view_out = kvzap_score_view{};
    const Press* p = seq->seq->press();
    if (!p) throw BadArgument("the sequence has no press (prefill it under one)");
    const ScoreLog* log = p->score_log();
    if (!log)
      throw BadArgument("the sequence's press did not keep its scores: call kvzap_sequence_keep_scores(seq, 1) before "
                        "kvzap_sequence_prefill");
    const KvCache& c = seq->seq->cache();
    view_out->n_layer = c.n_layer();
    view_out->n_head_kv = c.n_head_kv();
    view_out->n_pos = std::min<int64_t>(log->n_pos(), c.n_past());
    view_out->row_stride = log->capacity();
    view_out->scores = log->n_pos() > 0 ? log->data() : nullptr;
  });
}

kvzap_status kvzap_record_context(kvzap_engine* engine, const int32_t* ids, size_t n, kvzap_recording** out) {
  return guarded_args([&] {
    need(engine, "engine");
    need(out, "out");
    *out = nullptr;
    if (!ids || n == 0) throw BadArgument("ids must hold at least one token");
    Engine& e = engine->session->engine();
    const int n_vocab = e.model().config().n_vocab;
    for (size_t i = 0; i < n; i++)
      if (ids[i] < 0 || ids[i] >= n_vocab) throw BadArgument("token id " + std::to_string(ids[i]) + " out of range");
    if ((int64_t)n > e.n_ctx())
      throw Error("context of " + std::to_string(n) + " tokens does not fit the context size of " + std::to_string(e.n_ctx()) + " tokens");
    auto r = std::make_unique<kvzap_recording>();
    r->cfg = e.model().config();
    r->rec = std::make_unique<ContextRecording>(r->cfg);
    std::unique_ptr<Sequence> scratch = e.new_sequence();
    e.prefill_recorded(*scratch, std::vector<int32_t>(ids, ids + n), *r->rec);
    *out = r.release();
  });
}

void kvzap_recording_free(kvzap_recording* rec) { delete rec; }

kvzap_status kvzap_recording_steps(const kvzap_recording* rec, size_t* n_steps_out) {
  return guarded_args([&] {
    need(rec, "rec");
    need(n_steps_out, "n_steps_out");
    *n_steps_out = rec->rec->steps().size();
  });
}

kvzap_status kvzap_recording_tensor(const kvzap_recording* rec, size_t step, int layer, const char* which,
                                    const float** data_out, int64_t* n_tok_out, int64_t* n_heads_out, int64_t* width_out) {
  return guarded_args([&] {
    need(rec, "rec");
    need(which, "which");
    need(data_out, "data_out");
    const auto& steps = rec->rec->steps();
    if (step >= steps.size()) throw BadArgument("step " + std::to_string(step) + " out of range (" + std::to_string(steps.size()) + " steps)");
    if (layer < 0 || layer >= rec->cfg.n_layer) throw BadArgument("layer " + std::to_string(layer) + " out of range");
    const RecordedStep& st = steps[step];
    const RecordedStep::Layer& L = st.layers[(size_t)layer];
    const std::string w = which;
    int64_t heads = 1, width = 0;
    const std::vector<float>* v = nullptr;
    if (w == "h") v = &L.h, width = rec->cfg.n_embd;
    else if (w == "q") v = &L.q, heads = rec->cfg.n_head, width = rec->cfg.head_dim;
    else if (w == "k") v = &L.k, heads = rec->cfg.n_head_kv, width = rec->cfg.head_dim;
    else if (w == "v") v = &L.v, heads = rec->cfg.n_head_kv, width = rec->cfg.head_dim;
    else throw BadArgument("which must be \"h\", \"q\", \"k\" or \"v\", got \"" + w + "\"");
    if ((int64_t)v->size() != st.n_tok * heads * width) throw Error("internal: recorded tensor has an unexpected size");
    *data_out = v->data();
    if (n_tok_out) *n_tok_out = st.n_tok;
    if (n_heads_out) *n_heads_out = heads;
    if (width_out) *width_out = width;
  });
}

kvzap_status kvzap_kvzip_targets(kvzap_engine* engine, const char* text, size_t text_len, size_t n_sample, uint64_t seed,
                                 kvzap_targets** out) {
  return guarded_args([&] {
    need(engine, "engine");
    need(out, "out");
    *out = nullptr;
    if (!text) throw BadArgument("text must not be NULL");
    Session& s = *engine->session;
    const RepeatPrompt p = build_repeat_prompt(s.model().tokenizer(), std::string(text, text_len));
    const std::vector<int64_t> sample = sample_positions(p.n_text(), std::min<int64_t>((int64_t)n_sample, p.n_text()), seed);
    TargetComputer tc(s.model());
    auto r = std::make_unique<kvzap_targets>();
    try {
      r->t = tc.compute(s, p, sample);
    } catch (...) {
      s.reset();
      throw;
    }
    s.reset();  // the repeat pass leaves its cache (and its observer) behind
    engine->own.tokens.clear();
    r->ids = p.ids;
    r->start_prompt = p.start_prompt;
    *out = r.release();
  });
}

void kvzap_targets_free(kvzap_targets* t) { delete t; }

kvzap_status kvzap_targets_get(const kvzap_targets* t, kvzap_targets_view* out) {
  return guarded_args([&] {
    need(t, "targets");
    need(out, "out");
    out->n_text = t->t.n_text;
    out->n_layer = t->t.n_layer;
    out->n_head_kv = t->t.n_head_kv;
    out->n_embd = t->t.n_embd;
    out->log_scores = t->t.log_scores.data();
    out->n_sample = (int64_t)t->t.sample.size();
    out->sample = t->t.sample.data();
    out->x = t->t.x.data();
    out->text_start = t->start_prompt;
  });
}

kvzap_status kvzap_train_linear_surrogate(const float* x, const float* y, int64_t n, int32_t n_layer, int32_t n_embd,
                                          int32_t n_head_kv, double alpha, const char* out_dir) {
  return guarded_args([&] {
    need(x, "x");
    need(y, "y");
    need(out_dir, "out_dir");
    if (n < 2 || n_layer < 1 || n_embd < 1 || n_head_kv < 1)
      throw BadArgument("train: need n >= 2 samples and positive n_layer, n_embd, n_head_kv");
    if (!(alpha >= 0)) throw BadArgument("train: alpha must be >= 0");
    std::vector<SurrogateLayerWeights> layers((size_t)n_layer);
    std::vector<float> xl((size_t)n * n_embd), yl((size_t)n * n_head_kv);
    for (int l = 0; l < n_layer; l++) {
      for (int64_t i = 0; i < n; i++) {
        std::copy_n(x + ((size_t)i * n_layer + l) * n_embd, n_embd, xl.data() + (size_t)i * n_embd);
        std::copy_n(y + ((size_t)i * n_layer + l) * n_head_kv, n_head_kv, yl.data() + (size_t)i * n_head_kv);
      }
      RidgeResult r = fit_ridge(xl.data(), yl.data(), n, n_embd, n_head_kv, alpha);
      layers[(size_t)l].w1 = std::move(r.weight);
      layers[(size_t)l].b1 = std::move(r.bias);
    }
    Surrogate(n_embd, n_head_kv, 0, std::move(layers)).save(out_dir);
  });
}

kvzap_status kvzap_train_mlp_surrogate(const float* x, const float* y, int64_t n, int32_t n_layer, int32_t n_embd,
                                       int32_t n_head_kv, const char* options_json, const char* out_dir) {
  return guarded_args([&] {
    need(x, "x");
    need(y, "y");
    need(out_dir, "out_dir");
    if (n < 2 || n_layer < 1 || n_embd < 1 || n_head_kv < 1)
      throw BadArgument("train: need n >= 2 samples and positive n_layer, n_embd, n_head_kv");
    const json o = parse_json(options_json, "options_json");
    check_object(o, "options", {"hidden_dim", "epochs", "batch_size", "lr", "weight_decay", "valid_fraction", "seed"});
    using namespace json_fields;
    MlpOptions mo;
    if (o.contains("hidden_dim")) mo.hidden_dim = (int)get_integer(o["hidden_dim"], "options.hidden_dim", 0, 1 << 16);
    if (o.contains("epochs")) mo.epochs = (int)get_integer(o["epochs"], "options.epochs", 1, 10000);
    if (o.contains("batch_size")) mo.batch_size = (int)get_integer(o["batch_size"], "options.batch_size", 1, 1 << 20);
    if (o.contains("lr")) mo.lr = get_number(o["lr"], "options.lr", 0, 10);
    if (o.contains("weight_decay")) mo.weight_decay = get_number(o["weight_decay"], "options.weight_decay", 0, 10);
    if (o.contains("valid_fraction")) mo.valid_fraction = get_number(o["valid_fraction"], "options.valid_fraction", 0, 0.5);
    if (o.contains("seed")) mo.seed = (uint64_t)get_integer(o["seed"], "options.seed", 0, INT64_MAX);
    DatasetShape shape;
    shape.n_layers = n_layer;
    shape.d_model = n_embd;
    shape.n_heads = n_head_kv;
    shape.x_dtype = DatasetDtype::F32;
    Dataset ds(shape);
    for (int64_t i = 0; i < n; i++)
      ds.append(0, (uint32_t)i, x + (size_t)i * n_layer * n_embd, y + (size_t)i * n_layer * n_head_kv);
    train_mlp(ds, mo).save(out_dir);
  });
}

kvzap_status kvzap_kvzap_scores(const kvzap_model* model, const char* spec_json, const kvzap_recording* rec, size_t step,
                                int layer, float* out, size_t out_len) {
  return guarded_args([&] {
    need(model, "model");
    need(spec_json, "spec_json");
    need(rec, "rec");
    need(out, "out");
    const PressSpec spec = press_spec_from_json(parse_json(spec_json, "spec_json"));
    std::string kind;
    if (spec.name == "kvzap-linear") kind = "linear";
    else if (spec.name == "kvzap-mlp") kind = "mlp";
    else throw BadArgument("kvzap scores need a kvzap-linear or kvzap-mlp press spec, got '" + spec.name + "'");
    const auto& steps = rec->rec->steps();
    if (step >= steps.size()) throw BadArgument("step " + std::to_string(step) + " out of range");
    if (layer < 0 || layer >= rec->cfg.n_layer) throw BadArgument("layer " + std::to_string(layer) + " out of range");
    const std::unique_ptr<Surrogate> sur = Surrogate::load(kvzap_surrogate_dir(spec, *model->model, kind));
    if (sur->n_layers() != rec->cfg.n_layer || sur->input_dim() != rec->cfg.n_embd || sur->output_dim() != rec->cfg.n_head_kv)
      throw Error("the surrogate does not fit the recorded model");
    const RecordedStep& st = steps[step];
    if (out_len < (size_t)st.n_tok * (size_t)sur->output_dim())
      throw BadArgument("out holds " + std::to_string(out_len) + " floats, needs n_tok * n_head_kv");
    std::vector<float> scratch((size_t)std::max<int64_t>(1, sur->scratch_floats(st.n_tok)));
    sur->predict(layer, st.layers[(size_t)layer].h.data(), st.n_tok, out, scratch.data());
  });
}

// ---- sequences ----

kvzap_status kvzap_sequence_create(kvzap_engine* engine, kvzap_sequence** out) {
  return guarded_args([&] {
    need(engine, "engine");
    need(out, "out");
    auto s = std::make_unique<kvzap_sequence>();
    s->engine = engine;
    s->owned = engine->session->engine().new_sequence();
    s->seq = s->owned.get();
    *out = s.release();
  });
}

kvzap_status kvzap_engine_sequence(kvzap_engine* engine, kvzap_sequence** out) {
  return guarded_args([&] {
    need(engine, "engine");
    need(out, "out");
    *out = &engine->own;
  });
}

void kvzap_sequence_free(kvzap_sequence* seq) {
  if (seq && seq->owned) delete seq;  // the engine's own sequence belongs to the engine
}

kvzap_status kvzap_sequence_prefill(kvzap_sequence* seq, const int32_t* ids, size_t n, const kvzap_press* press,
                                    const char* question) {
  return guarded_args([&] {
    need(seq, "seq");
    if (!ids && n) throw BadArgument("ids must not be NULL");
    Sequence& s = *seq->seq;
    Engine& e = s.engine();
    const std::vector<int32_t> v(ids, ids + n);
    const int n_vocab = e.model().config().n_vocab;
    for (int32_t id : v)
      if (id < 0 || id >= n_vocab) throw BadArgument("token id " + std::to_string(id) + " out of range");
    if ((int64_t)n > e.n_ctx())
      throw Error("context of " + std::to_string(n) + " tokens does not fit the context size of " + std::to_string(e.n_ctx()) + " tokens");
    s.reset();
    seq->tokens.clear();
    std::unique_ptr<Press> run = press ? press->proto->clone() : nullptr;
    if (run) run->keep_scores(seq->keep_scores);
    s.set_press(std::move(run));
    s.begin_context();
    if (!v.empty()) e.feed(s, v.data(), (int64_t)v.size(), LogitsMode::Last);
    s.end_context(v, question ? question : "");
    if (press) s.cache().release_pool();
    seq->tokens = v;
    seq->press_key = press_spec_key(press ? &press->spec : nullptr);
  });
}

kvzap_status kvzap_sequence_feed(kvzap_sequence* seq, const int32_t* ids, size_t n) {
  return guarded_args([&] {
    need(seq, "seq");
    if (!ids && n) throw BadArgument("ids must not be NULL");
    Sequence& s = *seq->seq;
    const int n_vocab = s.engine().model().config().n_vocab;
    for (size_t i = 0; i < n; i++)
      if (ids[i] < 0 || ids[i] >= n_vocab) throw BadArgument("token id " + std::to_string(ids[i]) + " out of range");
    if (s.n_past() + (int64_t)n > s.engine().n_ctx())
      throw Error(std::to_string(n) + " tokens do not fit the context of " + std::to_string(s.engine().n_ctx()) + " tokens (" +
                  std::to_string(s.n_past()) + " already used)");
    if (n) s.engine().feed(s, ids, (int64_t)n, LogitsMode::Last);
    seq->tokens.insert(seq->tokens.end(), ids, ids + n);
  });
}

kvzap_status kvzap_sequence_logits(const kvzap_sequence* seq, const float** logits_out, size_t* n_vocab_out) {
  return guarded_args([&] {
    need(seq, "seq");
    need(logits_out, "logits_out");
    *logits_out = seq->seq->logits();
    if (n_vocab_out) *n_vocab_out = (size_t)seq->seq->engine().model().config().n_vocab;
  });
}

kvzap_status kvzap_sequence_fork(const kvzap_sequence* seq, kvzap_sequence** out) {
  return guarded_args([&] {
    need(seq, "seq");
    need(out, "out");
    auto f = std::make_unique<kvzap_sequence>();
    f->engine = seq->engine;
    f->owned = seq->seq->fork();
    f->seq = f->owned.get();
    f->tokens = seq->tokens;
    f->press_key = seq->press_key;
    *out = f.release();
  });
}

kvzap_status kvzap_sequence_rewind(kvzap_sequence* seq, int64_t pos) {
  return guarded_args([&] {
    need(seq, "seq");
    if (pos < 0 || pos > seq->seq->n_past()) throw BadArgument("rewind position " + std::to_string(pos) + " out of range");
    seq->seq->rewind(pos);
    if ((size_t)pos < seq->tokens.size()) seq->tokens.resize((size_t)pos);
  });
}

kvzap_status kvzap_sequence_start_generation(kvzap_sequence* seq, const char* options_json) {
  return guarded_args([&] {
    need(seq, "seq");
    const json o = parse_json(options_json, "options_json");
    check_object(o, "options", {"max_new_tokens", "temperature", "top_k", "top_p", "min_p", "seed", "stop", "stop_at_eog"});
    GenerateOptions g;
    bool eog = g.stop_at_eog;
    apply_generation_json(o, "options", g, &eog);
    GenerationOptions go;
    go.max_new_tokens = g.max_new_tokens;
    go.sampling = g.sampling;
    go.stop = g.stop;
    go.stop_at_eog = eog;
    seq->seq->start_generation(go);
  });
}

kvzap_status kvzap_sequence_decode_step(kvzap_sequence* seq, kvzap_token_event* event_out) {
  return guarded_args([&] {
    need(seq, "seq");
    need(event_out, "event_out");
    Sequence& s = *seq->seq;
    TokenEvent ev = s.sample_next();
    if (!ev.finished) {
      s.engine().feed(s, &ev.id, 1, LogitsMode::Last);
      seq->tokens.push_back(ev.id);
    }
    seq->ev_text = std::move(ev.text);
    seq->ev_reason = std::move(ev.finish_reason);
    event_out->token = ev.id;
    event_out->finished = ev.finished ? 1 : 0;
    event_out->text = seq->ev_text.c_str();
    event_out->text_len = seq->ev_text.size();
    event_out->finish_reason = seq->ev_reason.c_str();
  });
}

kvzap_status kvzap_sequence_kv_stats(const kvzap_sequence* seq, kvzap_kv_stats* stats_out, int64_t* kept, size_t kept_len) {
  return guarded_args([&] {
    need(seq, "seq");
    need(stats_out, "stats_out");
    const KvCache& c = seq->seq->cache();
    stats_out->n_layer = c.n_layer();
    stats_out->n_head_kv = c.n_head_kv();
    stats_out->n_past = c.n_past();
    stats_out->bytes_resident = c.bytes_resident();
    stats_out->bytes_full = c.bytes_full();
    stats_out->evicted_fraction = c.evicted_fraction();
    stats_out->window_dropped = c.entries_window_dropped();
    if (kept && kept_len >= (size_t)c.n_layer() * (size_t)c.n_head_kv())
      for (int l = 0; l < c.n_layer(); l++)
        for (int h = 0; h < c.n_head_kv(); h++) kept[(size_t)l * c.n_head_kv() + h] = c.length(l, h);
  });
}

kvzap_status kvzap_sequence_save(const kvzap_sequence* seq, const char* path) {
  return guarded_args([&] {
    need(seq, "seq");
    need(path, "path");
    const Model& m = seq->seq->engine().model();
    CacheFileMeta meta;
    meta.press = seq->press_key;
    meta.tokens = seq->tokens;
    meta.logits.assign(seq->seq->logits(), seq->seq->logits() + m.config().n_vocab);
    save_cache_file(path, m, seq->seq->cache(), meta);
  });
}

kvzap_status kvzap_sequence_load(kvzap_sequence* seq, const char* path) {
  return guarded_args([&] {
    need(seq, "seq");
    need(path, "path");
    Sequence& s = *seq->seq;
    s.reset();
    s.set_press(nullptr);
    seq->tokens.clear();
    try {
      const CacheFileMeta meta = load_cache_file(path, s.engine().model(), s.cache());
      if ((int64_t)meta.tokens.size() >= s.engine().n_ctx())
        throw Error(std::string(path) + ": the saved context (" + std::to_string(meta.tokens.size()) +
                    " tokens) does not fit the context of " + std::to_string(s.engine().n_ctx()) + " tokens");
      if (!meta.logits.empty()) std::copy(meta.logits.begin(), meta.logits.end(), s.mutable_logits());
      seq->tokens = meta.tokens;
      seq->press_key = meta.press;
    } catch (...) {
      s.reset();  // never leave half a cache behind
      throw;
    }
  });
}

}  // extern "C"
