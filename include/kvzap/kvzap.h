/* kvzap C API: a stable C interface to the engine (libkvzap.so). C11 and C++ callers alike.
 *
 * Handles are opaque: a model (weights + tokenizer), an engine (thread pool, forward state, KV page pool;
 * one default sequence for the pipeline call), sequences (one conversation's KV cache each; forks share
 * pages copy-on-write) and presses (a validated PressSpec, press/press_spec.h; each use clones it).
 *
 * Errors: every function that can fail returns a kvzap_status; KVZAP_OK (0) is success. The message of
 * the last failure on the calling thread is kvzap_last_error() (one line, the engine's own). No C++
 * exception ever crosses this boundary.
 *
 * Strings and arrays the library allocates (char ** / int32_t ** outputs) are freed with kvzap_free.
 * JSON is used where a C struct would be long-lived and brittle: options, press specs, results.
 *
 * Threads: a handle may be used by one thread at a time; distinct engines run concurrently. A model may
 * be shared by any number of engines (read-only). */
#ifndef KVZAP_KVZAP_H
#define KVZAP_KVZAP_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVZAP_API_VERSION 1

typedef enum kvzap_status {
  KVZAP_OK = 0,
  KVZAP_ERR_INVALID_ARGUMENT = 1, /* a null handle, bad JSON, an out-of-range option */
  KVZAP_ERR_ENGINE = 2,           /* the engine refused: bad file, unknown press, prompt too long, ... */
  KVZAP_ERR_OUT_OF_KV_MEMORY = 3, /* the KV page budget is exhausted */
  KVZAP_ERR_INTERNAL = 4          /* anything else (a bug): the message says what */
} kvzap_status;

typedef struct kvzap_model kvzap_model;
typedef struct kvzap_engine kvzap_engine;
typedef struct kvzap_sequence kvzap_sequence;
typedef struct kvzap_press kvzap_press;
typedef struct kvzap_recording kvzap_recording;
typedef struct kvzap_targets kvzap_targets;

/* The last error message of this thread ("" if none). Valid until the next failing call on this thread. */
const char* kvzap_last_error(void);
/* Library version ("0.1.0") and KVZAP_API_VERSION as built. */
const char* kvzap_version(void);
int kvzap_api_version(void);
/* Frees strings and arrays returned by this library. NULL is ignored. */
void kvzap_free(void* p);

/* The data folder (KVzap surrogates, evaluation haystacks): $KVZAP_DATA_DIR, else the one given here, else
 * a `data` folder beside libkvzap.so, else the source tree. NULL or "" restores the automatic choice. */
void kvzap_set_data_dir(const char* dir);
/* The folder in use; free with kvzap_free. */
kvzap_status kvzap_get_data_dir(char** out);

/* ---- model ---- */
/* path: a GGUF file, a Hugging Face checkpoint folder, a bare file name in the model store (`kvzap pull`),
 * or NULL / "" for the default pulled model. options_json: NULL or {"quantize": "q8_0" | "q4_k"}. */
kvzap_status kvzap_model_load(const char* path, const char* options_json, kvzap_model** out);
void kvzap_model_free(kvzap_model* model);
/* {"name", "arch", "n_layer", "n_head", "n_head_kv", "head_dim", "n_embd", "n_vocab", "n_ctx_train",
 *  "has_chat_template"} */
kvzap_status kvzap_model_info(const kvzap_model* model, char** json_out);
/* Resolves a model name as kvzap_model_load does, without loading it. */
kvzap_status kvzap_resolve_model(const char* name, char** path_out);

/* ---- tokenizer ---- */
kvzap_status kvzap_tokenize(const kvzap_model* model, const char* text, size_t text_len, int add_bos,
                            int parse_special, int32_t** ids_out, size_t* n_out);
kvzap_status kvzap_detokenize(const kvzap_model* model, const int32_t* ids, size_t n, int skip_special,
                              char** text_out, size_t* len_out);
/* messages_json: [{"role": "system"|"user"|"assistant", "content": "..."}, ...]. The model's own template
 * (or its built-in format). Returns the rendered text; tokenize it with add_bos = 0, parse_special = 1,
 * or use kvzap_chat_tokens, which applies the one-BOS rule and keeps message contents as text. */
kvzap_status kvzap_apply_chat_template(const kvzap_model* model, const char* messages_json, int add_generation_prompt,
                                       char** text_out);
kvzap_status kvzap_chat_tokens(const kvzap_model* model, const char* messages_json, int add_generation_prompt,
                               int32_t** ids_out, size_t* n_out);

/* ---- presses ---- */
/* The press catalogue, as `kvzap presses --json` prints it: {"presses": [{"name", "description", "policies",
 *  "supports_threshold", "own_budget", "kvpress_ratio_scope", "kvpress_parity", "python_class", "kvpress_class",
 *  "params", "demo_params"}, ...], "families": [{"pattern", "kvpress_class", "example", "description",
 *  "kvpress_parity"}, ...], "kvpress_gaps": [{"kvpress_class", "name", "reason"}, ...]}. python_class: the
 *  Python package's class, kvpress's name where kvpress has the press (kvpress_class true then); families:
 *  names built around any press (adakv_<press>, dms_<press>, ...); kvpress_gaps: kvpress's presses kvzap lacks
 *  and why. */
kvzap_status kvzap_presses(char** json_out);
/* A press spec JSON ({"press": name, "threshold" | "ratio", "ratio_scope", "window", "sink_tokens",
 * "prefill_evict_every", "decoding", "sliding_layers", "surrogate", "seed"}) checked field by field and
 * returned in canonical form (every field), without a model. */
kvzap_status kvzap_press_spec_normalize(const char* spec_json, char** json_out);
/* The spec validated against the registry and the model (a KVzap press finds its surrogate here).
 * {"press": "none"} gives *out = NULL: no press. */
kvzap_status kvzap_press_create(const kvzap_model* model, const char* spec_json, kvzap_press** out);
void kvzap_press_free(kvzap_press* press);
/* The canonical spec JSON and key of a press. */
kvzap_status kvzap_press_spec(const kvzap_press* press, char** json_out);

/* ---- engine ---- */
/* options_json: NULL or {"threads": 0 (physical cores), "n_ctx": 0 (model's, at most 8192), "n_batch": 0
 * (a whole prompt per step), "kv_type": "f16"|"f32"|"q8_0"|"q4_0", "kv_budget": bytes (-1 = unlimited,
 * the default; 0 = half the available memory)}. The model must outlive the engine. */
kvzap_status kvzap_engine_create(const kvzap_model* model, const char* options_json, kvzap_engine** out);
void kvzap_engine_free(kvzap_engine* engine);
/* {"n_ctx", "n_threads", "kv_type", "kv_bytes_in_use", "kv_bytes_peak"} */
kvzap_status kvzap_engine_info(const kvzap_engine* engine, char** json_out);

/* The kvpress pipeline (engine/pipeline.h), on the engine's own sequence: the context prefilled once under
 * the press (NULL = none), each question answered on its own copy-on-write fork of the compressed cache.
 * request_json: {"context": "...", "questions": ["...", ...] (may be empty: generate after the context),
 *   "chat": true (the model's chat template; false: raw text), "answer_prefix": "", "max_new_tokens": 256,
 *   "temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "seed": 0, "stop": [...]} (defaults as
 *   `kvzap generate`). on_text (may be NULL) receives each answer's text pieces as produced; returning 0
 *   stops that answer. result_json: {"answers": [{"text", "tokens", "stop_reason", "n_prompt_tokens",
 *   "prefill_seconds", "decode_seconds"}], "context_tokens", "n_context_tokens", "context_seconds",
 *   "press", "press_spec", "evicted_fraction", "kv_bytes", "kv_bytes_full", "kv_lengths" [layer][KV head],
 *   "evicted_fraction_end", "kv_bytes_end", "kv_bytes_full_end"}. Afterwards the engine's sequence
 *   (kvzap_engine_sequence) holds the compressed context. */
typedef int (*kvzap_text_callback)(void* user, size_t question_index, const char* piece, size_t len);
kvzap_status kvzap_pipeline_run(kvzap_engine* engine, const char* request_json, const kvzap_press* press,
                                kvzap_text_callback on_text, void* user, char** result_json);

/* The offline RULER-style suite (`kvzap eval --suite ruler`) on the engine's sequence under press (NULL =
 * none): options_json {"length": 4096 (prompt tokens, chat template included; must fit n_ctx), "samples": 100
 * (per task), "tasks": [...] (default: all 13), "seed": 42, "first_index": 0}. result_json: one object per
 * sample (task, index, prediction, answers, score 0..100, evicted_fraction, kv_bytes, context_tokens, ...). */
kvzap_status kvzap_eval_ruler(kvzap_engine* engine, const kvzap_press* press, const char* options_json, char** result_json);

/* Research access: the activations a press sees while a context is prefilled. Feeds ids into a scratch
 * sequence of the engine (no press) and records, per forward step and layer, the post-norm hidden states h
 * [n_tok][n_embd] (what KVzap scores), q [n_tok][n_head][head_dim] and k, v [n_tok][n_head_kv][head_dim]
 * (after RoPE). One step holds the whole context unless the engine's n_batch cuts it. */
kvzap_status kvzap_record_context(kvzap_engine* engine, const int32_t* ids, size_t n, kvzap_recording** out);
void kvzap_recording_free(kvzap_recording* rec);
kvzap_status kvzap_recording_steps(const kvzap_recording* rec, size_t* n_steps_out);
/* which: "h", "q", "k" or "v". data_out points into the recording (valid until it is freed): n_tok rows of
 * n_heads * width floats. */
kvzap_status kvzap_recording_tensor(const kvzap_recording* rec, size_t step, int layer, const char* which,
                                    const float** data_out, int64_t* n_tok_out, int64_t* n_heads_out, int64_t* width_out);

/* The scores a KVzap press (spec_json: kvzap-linear or kvzap-mlp, its surrogate folder or the shipped one)
 * gives the recorded tokens of one step and layer: out [n_tok][n_head_kv] predicted log KVzip+ scores (the
 * threshold policy evicts an entry scoring below the threshold once it leaves the window). */
kvzap_status kvzap_kvzap_scores(const kvzap_model* model, const char* spec_json, const kvzap_recording* rec, size_t step,
                                int layer, float* out, size_t out_len);

/* KVzip+ training targets (`kvzap collect`, docs/ALGORITHMS.md): the model reads text + "Repeat the previous
 * context exactly." + text in one pass (the engine's n_ctx and n_batch must hold it); log_scores
 * [n_layer][n_head_kv][n_text] are the log KVzip+ scores of every position of the first copy, x
 * [n_sample][n_layer][n_embd] the post-norm hidden states h at n_sample positions drawn from seed (sample,
 * text offsets): the surrogate's inputs. Pointers stay valid until kvzap_targets_free. */
typedef struct kvzap_targets_view {
  int64_t n_text, n_sample, text_start; /* text_start: the first copy's first token in the prompt */
  int32_t n_layer, n_head_kv, n_embd;
  const float* log_scores;
  const int64_t* sample;
  const float* x;
} kvzap_targets_view;
kvzap_status kvzap_kvzip_targets(kvzap_engine* engine, const char* text, size_t text_len, size_t n_sample, uint64_t seed,
                                 kvzap_targets** out);
kvzap_status kvzap_targets_get(const kvzap_targets* targets, kvzap_targets_view* out);
void kvzap_targets_free(kvzap_targets* targets);

/* Fits a KVzap-Linear surrogate (ridge regression per layer, `kvzap train`'s solver) on x [n][n_layer][n_embd]
 * (hidden states h) and y [n][n_layer][n_head_kv] (log KVzip+ targets), and writes it in kvpress's folder
 * format to out_dir (config.json + model.safetensors): {"press": "kvzap-linear", "surrogate": out_dir}. */
kvzap_status kvzap_train_linear_surrogate(const float* x, const float* y, int64_t n, int32_t n_layer, int32_t n_embd,
                                          int32_t n_head_kv, double alpha, const char* out_dir);

/* The same for KVzap-MLP (`kvzap train --mlp`'s AdamW trainer): options_json NULL or {"hidden_dim" (0 =
 * n_embd / 8), "epochs": 15, "batch_size": 512, "lr": 5e-3, "weight_decay": 0.01, "valid_fraction": 0.05,
 * "seed": 0}. Use it as {"press": "kvzap-mlp", "surrogate": out_dir}. */
kvzap_status kvzap_train_mlp_surrogate(const float* x, const float* y, int64_t n, int32_t n_layer, int32_t n_embd,
                                       int32_t n_head_kv, const char* options_json, const char* out_dir);

/* ---- sequences ---- */
/* A new empty sequence of the engine; free it before the engine. */
kvzap_status kvzap_sequence_create(kvzap_engine* engine, kvzap_sequence** out);
/* The engine's own sequence (the one kvzap_pipeline_run leaves the compressed context in); owned by the
 * engine: do not free. */
kvzap_status kvzap_engine_sequence(kvzap_engine* engine, kvzap_sequence** out);
void kvzap_sequence_free(kvzap_sequence* seq);
/* Clears the sequence and prefills ids as a context under a clone of press (NULL = none): a ratio press
 * evicts when the context is complete, a threshold press as it goes; question (NULL = none) goes to
 * query-aware scorers only. Logits afterwards are those after the last id. */
kvzap_status kvzap_sequence_prefill(kvzap_sequence* seq, const int32_t* ids, size_t n, const kvzap_press* press,
                                    const char* question);
/* Appends tokens (a question, a forced continuation); logits after the last one. */
kvzap_status kvzap_sequence_feed(kvzap_sequence* seq, const int32_t* ids, size_t n);
/* The distribution after the last token fed: [n_vocab] floats, valid until the sequence changes. */
kvzap_status kvzap_sequence_logits(const kvzap_sequence* seq, const float** logits_out, size_t* n_vocab_out);
/* Copy-on-write fork: shares every KV page, clones the press state and logits. */
kvzap_status kvzap_sequence_fork(const kvzap_sequence* seq, kvzap_sequence** out);
/* Forgets every position >= pos. */
kvzap_status kvzap_sequence_rewind(kvzap_sequence* seq, int64_t pos);

/* Generation: start with options_json (NULL or {"max_new_tokens", "temperature", "top_k", "top_p",
 * "min_p", "seed", "stop", "stop_at_eog"}; defaults as `kvzap generate`), then decode steps. A step samples
 * from the logits, and unless finished feeds the token. text points to UTF-8-complete text released by the
 * step (may be empty), finish_reason to "eos" | "stop" | "length" | "context" when finished; both valid
 * until the next call on the sequence. */
typedef struct kvzap_token_event {
  int32_t token;
  int finished;
  const char* text;
  size_t text_len;
  const char* finish_reason;
} kvzap_token_event;
kvzap_status kvzap_sequence_start_generation(kvzap_sequence* seq, const char* options_json);
kvzap_status kvzap_sequence_decode_step(kvzap_sequence* seq, kvzap_token_event* event_out);

/* KV statistics. kept (may be NULL): [n_layer * n_head_kv] kept entries, layer-major, written when
 * kept_len is at least n_layer * n_head_kv. */
typedef struct kvzap_kv_stats {
  int32_t n_layer, n_head_kv;
  int64_t n_past;          /* positions fed */
  int64_t bytes_resident;  /* KV bytes held (pages in use) */
  int64_t bytes_full;      /* what the unpruned cache would hold */
  double evicted_fraction; /* kvpress's definition, averaged over layers */
  int64_t window_dropped;  /* entries freed by sliding-window layers (not evictions) */
} kvzap_kv_stats;
kvzap_status kvzap_sequence_kv_stats(const kvzap_sequence* seq, kvzap_kv_stats* stats_out, int64_t* kept, size_t kept_len);

/* Which positions each stream keeps: mask [n_layer][n_head_kv][n_past] (1 = kept), written when len is at
 * least n_layer * n_head_kv * n_past bytes. */
kvzap_status kvzap_sequence_kept_mask(const kvzap_sequence* seq, uint8_t* mask, size_t len);

/* The scores the press gave, by position, for research. kvzap_sequence_keep_scores(seq, 1) before
 * kvzap_sequence_prefill makes the presses of later prefills keep them (n_layer x n_head_kv x positions
 * floats; off by default). kvzap_sequence_press_scores then describes them: scores[(layer * n_head_kv +
 * head) * row_stride + pos] for pos < n_pos; NaN where a position was not scored (a layer the press
 * leaves alone; a ratio press scores what its context kept when it judges it), +inf where a context
 * scorer always keeps it (sliding-window layers). A threshold press's scores are compared with its
 * threshold; a ratio press's are ranked. The pointer belongs to the sequence and is valid until it is
 * fed, decoded, prefilled, loaded or destroyed. KVZAP_BAD_ARGUMENT without a press or with scores not kept. */
typedef struct kvzap_score_view {
  const float* scores;
  int32_t n_layer, n_head_kv;
  int64_t n_pos, row_stride;
} kvzap_score_view;
kvzap_status kvzap_sequence_keep_scores(kvzap_sequence* seq, int on);
kvzap_status kvzap_sequence_press_scores(const kvzap_sequence* seq, kvzap_score_view* view_out);

/* Compressed caches on disk (the format of `kvzap generate --save-cache` and the server's /slots/save):
 * the kept entries, the context's tokens, the logits and the press it was compressed under. Loading
 * replaces the sequence's content (same model and KV type). */
kvzap_status kvzap_sequence_save(const kvzap_sequence* seq, const char* path);
kvzap_status kvzap_sequence_load(kvzap_sequence* seq, const char* path);

#ifdef __cplusplus
}
#endif

#endif /* KVZAP_KVZAP_H */
