// kvzap score: the KVzip / KVzip+ oracle scores of a text, per (layer, KV head, token), as natural
// logs in JSON — what the KVzap surrogates imitate and what the kvzip/kvzip+ presses rank by. With
// --dump-layer it also writes the raw tensors one layer used, for tests/python/check_kvzip_numpy.py.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>

#include "cli/cli_common.h"
#include "engine/pipeline.h"
#include "press/kvzip.h"

namespace kvzap::cli {
namespace {

struct ScoreArgs {
  ModelArgs m;
  std::string prompt, file, out, method = "kvzip+", dump_dir;
  bool chat = false;
  int dump_layer = -1;
};

int run_score(const ScoreArgs& a) {
  auto model = a.m.load_model();
  const ModelConfig& c = model->config();
  const Tokenizer& tok = model->tokenizer();
  const std::string text = prompt_from(a.prompt, a.file);
  std::vector<int32_t> ids;
  if (a.chat)  // the context as the kvpress pipeline prefills it: template prefix + text (question later)
    ids = build_context_prompt(tok, text, {}, true).context_ids;
  else
    ids = tok.encode(text, tok.vocab().add_bos, true);
  if (ids.empty()) throw Error("the text is empty");
  if (a.dump_layer >= c.n_layer) throw Error("--dump-layer must be below " + std::to_string(c.n_layer));
  if ((a.dump_layer >= 0) != !a.dump_dir.empty()) throw Error("--dump-layer and --dump-dir go together");

  // The repeat pass needs room for the context plus one chunk's repeat input.
  SessionOptions so = a.m.session_options();
  const int64_t need = (int64_t)ids.size() + std::min<int64_t>((int64_t)ids.size(), 2048) + 64;
  if (so.n_ctx == 0 || so.n_ctx < need) so.n_ctx = std::max<int64_t>(need, std::min<int64_t>(c.n_ctx_train, 8192));
  Session session(*model, so);
  KvzipScorer scorer(*model, a.method == "kvzip+");
  if (a.dump_layer >= 0) {
    std::filesystem::create_directories(a.dump_dir);
    scorer.set_dump(a.dump_layer, a.dump_dir);
  }
  const auto t0 = std::chrono::steady_clock::now();
  session.feed(ids);
  const auto t1 = std::chrono::steady_clock::now();
  CacheScores scores;
  const std::string no_question;
  ContextView view{session.cache(), session.engine(), ids, no_question};
  scorer.score_context(view, scores);
  const auto t2 = std::chrono::steady_clock::now();

  // [layer][head][token]: log score, null for protected entries (template prefix, sinks) and for every entry
  // of a sliding-window layer (not judged: its stream holds only its window).
  nlohmann::json log_scores = nlohmann::json::array();
  for (int l = 0; l < c.n_layer; l++) {
    nlohmann::json heads = nlohmann::json::array();
    for (int h = 0; h < c.n_head_kv; h++) {
      nlohmann::json row = nlohmann::json::array();
      for (float s : scores[l][h]) {
        if (std::isinf(s))
          row.push_back(nullptr);
        else
          row.push_back(std::log(std::max(s, 1e-30f)));
      }
      heads.push_back(std::move(row));
    }
    log_scores.push_back(std::move(heads));
  }
  std::vector<std::string> pieces;
  for (int32_t id : ids) pieces.push_back(tok.token_bytes(id));
  const double prefill_s = std::chrono::duration<double>(t1 - t0).count();
  const double score_s = std::chrono::duration<double>(t2 - t1).count();
  nlohmann::json j = {{"method", a.method}, {"model", c.name}, {"n_layer", c.n_layer}, {"n_head_kv", c.n_head_kv},
                      {"n_tokens", ids.size()}, {"tokens", ids}, {"token_text", pieces},
                      {"protected", scorer.protected_prefix()}, {"prefill_seconds", prefill_s},
                      {"score_seconds", score_s}, {"log_scores", std::move(log_scores)}};
  // Say why whole layers are null, so a reader does not take them for lost scores.
  nlohmann::json sliding = nlohmann::json::array();
  for (int l = 0; l < c.n_layer; l++)
    if (c.layers[(size_t)l].is_sliding()) sliding.push_back(l);
  j["unscored_sliding_layers"] = sliding;
  if (!sliding.empty()) {
    j["note"] = "layers in unscored_sliding_layers are sliding-window layers: their streams hold only the last " +
                std::to_string(c.layers[(size_t)sliding[0].get<int>()].sliding_window) +
                " positions, so KVzip does not judge them and their rows are null";
    std::fprintf(stderr, "note: %zu of %d layers slide over a window; their rows are null (unscored_sliding_layers)\n",
                 sliding.size(), c.n_layer);
  }
  std::ofstream f(a.out);
  f << json_dump(j) << "\n";
  if (!f) throw Error(a.out + ": write failed");
  std::fprintf(stderr, "[%s scores of %zu tokens x %d layers x %d heads -> %s | prefill %.2f s, scoring %.2f s]\n",
               a.method.c_str(), ids.size(), c.n_layer, c.n_head_kv, a.out.c_str(), prefill_s, score_s);
  return 0;
}

RegisterCommand reg("score", "KVzip / KVzip+ log-scores of a text per (layer, KV head, token), as JSON", [](CLI::App& sub) {
  auto a = std::make_shared<ScoreArgs>();
  a->m.add_to(sub);
  sub.add_option("-p,--prompt", a->prompt, "the text");
  sub.add_option("-f,--file", a->file, "read the text from a file");
  sub.add_option("--out", a->out, "output JSON file")->required();
  sub.add_option("--method", a->method, "kvzip+ (default) or kvzip")->check(CLI::IsMember({"kvzip+", "kvzip"}));
  sub.add_flag("--chat", a->chat, "put the chat-template prefix (system turn, user header) before the text, as the kvpress pipeline does");
  sub.add_option("--dump-layer", a->dump_layer, "write the tensors this layer used for the first chunk (with --dump-dir)")
      ->check(CLI::Range(0, 1 << 16));
  sub.add_option("--dump-dir", a->dump_dir, "folder for the --dump-layer .npy files and meta.json");
  return [a]() { return run_score(*a); };
});

}  // namespace
}  // namespace kvzap::cli
