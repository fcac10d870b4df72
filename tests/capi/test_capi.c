/* The C API end to end from a C11 program (ctest: capi_c11): load, tokenize, chat template, press, prefill,
 * fork, decode, KV statistics, save and load, the pipeline, and errors as codes plus messages.
 * Usage: kvzap_capi_test MODEL.gguf */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvzap/kvzap.h"

static int failures = 0;

#define CHECK(cond)                                                              \
  do {                                                                           \
    if (!(cond)) {                                                               \
      fprintf(stderr, "FAILED %s:%d: %s (last error: %s)\n", __FILE__, __LINE__, \
              #cond, kvzap_last_error());                                        \
      failures++;                                                                \
    }                                                                            \
  } while (0)
/* Evaluates cond once (it is often a call with effects); stops the program when it fails. */
#define REQUIRE(cond)                                                                      \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      fprintf(stderr, "FAILED %s:%d: %s (last error: %s)\n", __FILE__, __LINE__, #cond, \
              kvzap_last_error());                                                         \
      return 1;                                                                            \
    }                                                                                      \
  } while (0)

static int count_pieces(void* user, size_t question_index, const char* piece, size_t len) {
  size_t* counts = (size_t*)user;
  (void)piece;
  if (question_index < 2) counts[question_index] += len;
  return 1;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s MODEL.gguf\n", argv[0]);
    return 2;
  }
  CHECK(kvzap_api_version() == KVZAP_API_VERSION);

  /* Errors are codes plus the engine's one-line message. */
  kvzap_model* bad = NULL;
  CHECK(kvzap_model_load("/nonexistent/model.gguf", NULL, &bad) == KVZAP_ERR_ENGINE);
  CHECK(bad == NULL);
  CHECK(strstr(kvzap_last_error(), "/nonexistent/model.gguf") != NULL);
  CHECK(kvzap_model_load(argv[1], "{\"quantize\": 3}", &bad) == KVZAP_ERR_ENGINE);
  CHECK(kvzap_model_load(argv[1], "{not json", &bad) == KVZAP_ERR_INVALID_ARGUMENT);
  CHECK(kvzap_model_load(argv[1], NULL, NULL) == KVZAP_ERR_INVALID_ARGUMENT);

  kvzap_model* model = NULL;
  REQUIRE(kvzap_model_load(argv[1], NULL, &model) == KVZAP_OK && model != NULL);
  char* info = NULL;
  REQUIRE(kvzap_model_info(model, &info) == KVZAP_OK);
  CHECK(strstr(info, "\"n_layer\"") != NULL);
  kvzap_free(info);

  /* Tokenizer round trip. */
  const char* text = "The quick brown fox jumps over the lazy dog. ";
  int32_t* ids = NULL;
  size_t n_ids = 0;
  REQUIRE(kvzap_tokenize(model, text, strlen(text), 0, 1, &ids, &n_ids) == KVZAP_OK);
  CHECK(n_ids > 0);
  char* back = NULL;
  size_t back_len = 0;
  REQUIRE(kvzap_detokenize(model, ids, n_ids, 0, &back, &back_len) == KVZAP_OK);
  CHECK(back != NULL && back_len == strlen(back));
  /* The text of the ids is the text of each id in turn (the tiny test vocabulary cannot spell every byte). */
  char joined[1024] = "";
  for (size_t i = 0; i < n_ids; i++) {
    char* piece = NULL;
    REQUIRE(kvzap_detokenize(model, &ids[i], 1, 0, &piece, NULL) == KVZAP_OK);
    strcat(joined, piece);
    kvzap_free(piece);
  }
  CHECK(strcmp(joined, back) == 0);
  kvzap_free(back);
  kvzap_free(ids);
  int32_t bad_id = 1 << 30;
  CHECK(kvzap_detokenize(model, &bad_id, 1, 0, &back, &back_len) == KVZAP_ERR_INVALID_ARGUMENT);

  /* Chat template: the message appears in the rendered prompt. */
  char* chat = NULL;
  REQUIRE(kvzap_apply_chat_template(model, "[{\"role\": \"user\", \"content\": \"hello there\"}]", 1, &chat) == KVZAP_OK);
  CHECK(strstr(chat, "hello there") != NULL);
  kvzap_free(chat);
  CHECK(kvzap_apply_chat_template(model, "{\"role\": \"user\"}", 1, &chat) == KVZAP_ERR_INVALID_ARGUMENT);

  /* Presses: the registry lists them; specs are validated. */
  char* presses = NULL;
  REQUIRE(kvzap_presses(&presses) == KVZAP_OK);
  CHECK(strstr(presses, "\"knorm\"") != NULL && strstr(presses, "KVzapPress") != NULL);
  CHECK(strstr(presses, "\"families\"") != NULL && strstr(presses, "DMSPress") != NULL);
  CHECK(strstr(presses, "\"kvpress_gaps\"") != NULL && strstr(presses, "DuoAttentionPress") != NULL);
  kvzap_free(presses);
  kvzap_press* press = NULL;
  CHECK(kvzap_press_create(model, "{\"press\": \"no-such-press\", \"ratio\": 0.5}", &press) == KVZAP_ERR_ENGINE);
  CHECK(strstr(kvzap_last_error(), "no-such-press") != NULL);
  CHECK(kvzap_press_create(model, "{\"press\": \"knorm\", \"ratio\": 1.5}", &press) == KVZAP_ERR_ENGINE);
  CHECK(strstr(kvzap_last_error(), "ratio") != NULL);
  REQUIRE(kvzap_press_create(model, "{\"press\": \"knorm\", \"ratio\": 0.5}", &press) == KVZAP_OK && press != NULL);

  kvzap_engine* engine = NULL;
  CHECK(kvzap_engine_create(model, "{\"threads\": \"two\"}", &engine) == KVZAP_ERR_ENGINE);
  CHECK(kvzap_engine_create(model, "{\"thread\": 1}", &engine) == KVZAP_ERR_INVALID_ARGUMENT);
  REQUIRE(kvzap_engine_create(model, "{\"threads\": 1, \"n_ctx\": 512}", &engine) == KVZAP_OK);

  /* Prefill a context under the press: half the entries go. */
  char context[4096] = "";
  for (int i = 0; i < 6; i++) strcat(context, text);
  REQUIRE(kvzap_tokenize(model, context, strlen(context), 1, 1, &ids, &n_ids) == KVZAP_OK);
  kvzap_sequence* seq = NULL;
  REQUIRE(kvzap_sequence_create(engine, &seq) == KVZAP_OK);
  REQUIRE(kvzap_sequence_prefill(seq, ids, n_ids, press, NULL) == KVZAP_OK);
  kvzap_kv_stats st;
  int64_t kept[4096];
  REQUIRE(kvzap_sequence_kv_stats(seq, &st, kept, sizeof kept / sizeof kept[0]) == KVZAP_OK);
  CHECK(st.n_past == (int64_t)n_ids);
  CHECK(st.n_layer > 0 && st.n_head_kv > 0);
  CHECK(st.bytes_resident > 0 && st.bytes_resident < st.bytes_full);
  CHECK(fabs(st.evicted_fraction - 0.5) < 0.05);
  int64_t total = 0;
  for (int i = 0; i < st.n_layer * st.n_head_kv; i++) total += kept[i];
  CHECK(total > 0 && total < (int64_t)n_ids * st.n_layer * st.n_head_kv);
  const float* logits = NULL;
  size_t n_vocab = 0;
  REQUIRE(kvzap_sequence_logits(seq, &logits, &n_vocab) == KVZAP_OK);
  CHECK(logits != NULL && n_vocab > 0 && isfinite(logits[0]));

  /* The press's scores by position: none unless kept; kept, every context position of every stream is
   * scored and no evicted entry outscored a kept one of its stream. */
  kvzap_score_view sv;
  CHECK(kvzap_sequence_press_scores(seq, &sv) == KVZAP_ERR_INVALID_ARGUMENT);
  CHECK(strstr(kvzap_last_error(), "kvzap_sequence_keep_scores") != NULL);
  kvzap_sequence* scored = NULL;
  REQUIRE(kvzap_sequence_create(engine, &scored) == KVZAP_OK);
  REQUIRE(kvzap_sequence_keep_scores(scored, 1) == KVZAP_OK);
  REQUIRE(kvzap_sequence_prefill(scored, ids, n_ids, press, NULL) == KVZAP_OK);
  REQUIRE(kvzap_sequence_press_scores(scored, &sv) == KVZAP_OK);
  CHECK(sv.scores != NULL && sv.n_layer == st.n_layer && sv.n_head_kv == st.n_head_kv);
  CHECK(sv.n_pos == (int64_t)n_ids && sv.row_stride >= sv.n_pos);
  const size_t mask_len = (size_t)st.n_layer * (size_t)st.n_head_kv * n_ids;
  uint8_t* mask = malloc(mask_len);
  REQUIRE(mask != NULL && kvzap_sequence_kept_mask(scored, mask, mask_len) == KVZAP_OK);
  int all_finite = 1, ordered = 1, n_evicted = 0;
  for (int64_t r = 0; r < (int64_t)st.n_layer * st.n_head_kv; r++) {
    float min_kept = INFINITY, max_evicted = -INFINITY;
    for (size_t pos = 0; pos < n_ids; pos++) {
      const float v = sv.scores[r * sv.row_stride + (int64_t)pos];
      if (!isfinite(v)) all_finite = 0;
      if (mask[(size_t)r * n_ids + pos]) {
        min_kept = fminf(min_kept, v);
      } else {
        max_evicted = fmaxf(max_evicted, v);
        n_evicted++;
      }
    }
    if (max_evicted > min_kept) ordered = 0;
  }
  CHECK(all_finite && ordered && n_evicted > 0);
  free(mask);
  kvzap_sequence_free(scored);

  /* A fork decodes greedily to the same tokens as its parent. */
  kvzap_sequence* fork = NULL;
  REQUIRE(kvzap_sequence_fork(seq, &fork) == KVZAP_OK);
  const char* greedy = "{\"temperature\": 0, \"max_new_tokens\": 8, \"stop_at_eog\": false}";
  REQUIRE(kvzap_sequence_start_generation(seq, greedy) == KVZAP_OK);
  REQUIRE(kvzap_sequence_start_generation(fork, greedy) == KVZAP_OK);
  int32_t a[16], b[16];
  int na = 0, nb = 0;
  for (int step = 0; step < 16; step++) {
    kvzap_token_event ev;
    REQUIRE(kvzap_sequence_decode_step(seq, &ev) == KVZAP_OK);
    if (ev.finished) {
      CHECK(strcmp(ev.finish_reason, "length") == 0);
      break;
    }
    a[na++] = ev.token;
  }
  for (int step = 0; step < 16; step++) {
    kvzap_token_event ev;
    REQUIRE(kvzap_sequence_decode_step(fork, &ev) == KVZAP_OK);
    if (ev.finished) break;
    b[nb++] = ev.token;
  }
  CHECK(na == 8 && nb == 8 && memcmp(a, b, sizeof(int32_t) * 8) == 0);
  CHECK(kvzap_sequence_start_generation(seq, "{\"temperature\": -1}") == KVZAP_ERR_ENGINE);

  /* Save and load the compressed cache: same statistics, same logits. */
  const char* path = "kvzap_capi_test.kvzc";
  REQUIRE(kvzap_sequence_save(fork, path) == KVZAP_OK);
  kvzap_kv_stats st_fork, st_loaded;
  REQUIRE(kvzap_sequence_kv_stats(fork, &st_fork, NULL, 0) == KVZAP_OK);
  kvzap_sequence* loaded = NULL;
  REQUIRE(kvzap_sequence_create(engine, &loaded) == KVZAP_OK);
  REQUIRE(kvzap_sequence_load(loaded, path) == KVZAP_OK);
  REQUIRE(kvzap_sequence_kv_stats(loaded, &st_loaded, NULL, 0) == KVZAP_OK);
  CHECK(st_loaded.n_past == st_fork.n_past && st_loaded.bytes_resident == st_fork.bytes_resident);
  const float* l1 = NULL;
  const float* l2 = NULL;
  REQUIRE(kvzap_sequence_logits(fork, &l1, NULL) == KVZAP_OK);
  REQUIRE(kvzap_sequence_logits(loaded, &l2, NULL) == KVZAP_OK);
  CHECK(memcmp(l1, l2, n_vocab * sizeof(float)) == 0);
  CHECK(kvzap_sequence_load(loaded, "/nonexistent.kvzc") == KVZAP_ERR_ENGINE);
  remove(path);
  kvzap_sequence_free(loaded);
  kvzap_sequence_free(fork);
  kvzap_sequence_free(seq);
  kvzap_free(ids);

  /* The pipeline: context compressed once, each question answered on a fork, text streamed. */
  size_t streamed[2] = {0, 0};
  char request[8192];
  snprintf(request, sizeof request,
           "{\"context\": \"%s\", \"questions\": [\"What jumps?\", \"Who is lazy?\"], \"max_new_tokens\": 6, "
           "\"temperature\": 0, \"chat\": false}",
           context);
  char* result = NULL;
  REQUIRE(kvzap_pipeline_run(engine, request, press, count_pieces, streamed, &result) == KVZAP_OK);
  CHECK(strstr(result, "\"answers\"") != NULL && strstr(result, "\"kv_lengths\"") != NULL);
  CHECK(streamed[0] > 0 && streamed[1] > 0);
  kvzap_free(result);
  CHECK(kvzap_pipeline_run(engine, "{\"questions\": []}", press, NULL, NULL, &result) == KVZAP_ERR_INVALID_ARGUMENT);
  CHECK(strstr(kvzap_last_error(), "context") != NULL);

  kvzap_press_free(press);
  kvzap_engine_free(engine);
  kvzap_model_free(model);
  if (failures) {
    fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  printf("C API: all checks passed\n");
  return 0;
}
