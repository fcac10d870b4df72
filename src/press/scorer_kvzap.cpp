// "kvzap-linear" / "kvzap-mlp" (docs/ALGORITHMS.md §4.1, §6): the layer's surrogate maps each new token's
// attention input h (post input-RMSNorm) to one predicted log KVzip+ score per KV head. Per-step, so it
// works in prefill and decoding; meant for the threshold policy (τ ≈ -4 Qwen3, -7 Llama-3.1 in the paper).
#include <filesystem>
#include <map>
#include <mutex>

#include "common/data_dir.h"
#include "kvzap/error.h"
#include "model/model.h"
#include "press/press.h"
#include "press/surrogate.h"

namespace kvzap {
namespace {

namespace fs = std::filesystem;

// general.name may hold spaces and slashes; the shipped folder uses a file-name-safe form of it.
std::string folder_name(const std::string& model_name) {
  std::string s;
  for (char c : model_name) {
    const bool safe = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                      c == '-' || c == '_';
    s += safe ? c : '_';
  }
  return s;
}

class KvzapScorer : public Scorer {
 public:
  explicit KvzapScorer(std::shared_ptr<const Surrogate> s) : surrogate_(std::move(s)) {}
  bool per_step() const override { return true; }
  // The linear surrogate is a read-out of h: the forward runs it next to the norm (on blocks of up to 8 rows;
  // the same bits as predict over a block, see Surrogate.LinearAndMlpPredictMatchReference).
  int h_readout_dim(int layer) const override { (void)layer; return surrogate_->is_mlp() ? 0 : surrogate_->output_dim(); }
  void h_readout(int layer, const float* h, int64_t n, float* out) const override {
    surrogate_->predict(layer, h, n, out, nullptr);  // linear: no scratch
  }
  void score_step(const LayerStep& step, const KvCache& cache, float* out) override {
    const int64_t n = step.n_tok;
    const int H = surrogate_->output_dim();
    if (step.h_readout && !surrogate_->is_mlp()) {
      for (int h = 0; h < H; h++)
        for (int64_t t = 0; t < n; t++) out[(size_t)h * n + t] = step.h_readout[(size_t)t * H + h];
      return;
    }
    if (pred_.size() < (size_t)(n * H)) pred_.resize((size_t)(n * H));
    if (step.pool) {
      surrogate_->predict_threaded(step.layer, step.h, n, pred_.data(), *step.pool, scratch_);  // [n][H]
    } else {
      if (scratch_.empty()) scratch_.resize(1);
      if (scratch_[0].size() < (size_t)surrogate_->scratch_floats(n)) scratch_[0].resize((size_t)surrogate_->scratch_floats(n));
      surrogate_->predict(step.layer, step.h, n, pred_.data(), scratch_[0].data());
    }
    for (int h = 0; h < H; h++)
      for (int64_t t = 0; t < n; t++) out[(size_t)h * n + t] = pred_[(size_t)t * H + h];
  }

 private:
  std::shared_ptr<const Surrogate> surrogate_;  // shared by every scorer of the same folder
  std::vector<float> pred_;     // [n_tok][H]
  std::vector<std::vector<float>> scratch_;  // per thread: [chunk][hidden]
};

// One loaded copy per folder while any scorer holds it (presses with different thresholds share it).
std::shared_ptr<const Surrogate> load_shared(const std::string& dir) {
  static std::mutex mu;
  static std::map<std::string, std::weak_ptr<const Surrogate>> loaded;
  std::lock_guard<std::mutex> lock(mu);
  if (auto s = loaded[dir].lock()) return s;
  std::erase_if(loaded, [](const auto& kv) { return kv.second.expired(); });
  std::shared_ptr<const Surrogate> s = Surrogate::load(dir);
  loaded[dir] = s;
  return s;
}

std::unique_ptr<Scorer> make_kvzap(const PressSpec& opt, const Model& model, bool mlp) {
  const std::string kind = mlp ? "mlp" : "linear";
  const std::string dir = kvzap_surrogate_dir(opt, model, kind);
  std::shared_ptr<const Surrogate> s = load_shared(dir);
  const ModelConfig& c = model.config();
  if (s->is_mlp() != mlp)
    throw Error("surrogate " + dir + " is " + (s->is_mlp() ? "an MLP" : "linear") + ", but press '" + opt.name +
                "' wants a " + kind + " one");
  if (s->n_layers() != c.n_layer || s->input_dim() != c.n_embd || s->output_dim() != c.n_head_kv)
    throw Error("surrogate " + dir + " (" + std::to_string(s->n_layers()) + " layers, " + std::to_string(s->input_dim()) +
                " -> " + std::to_string(s->output_dim()) + ") does not fit the model (" + std::to_string(c.n_layer) +
                " layers, " + std::to_string(c.n_embd) + " -> " + std::to_string(c.n_head_kv) + " KV heads)");
  return std::make_unique<KvzapScorer>(std::move(s));
}

// KVzap runs by threshold; without one, the threshold calibrated for its surrogate (kvzap.json beside it).
PressTraits kvzap_traits(const char* kind) {
  return {.threshold_by_default = true,
          .default_threshold = [kind](const PressSpec& o, const Model& m) {
            return default_kvzap_threshold(kvzap_surrogate_dir(o, m, kind));
          },
          .kvpress_parity = "not compared: kvpress KVzapPress loads its surrogate from the hub (same folder format)"};
}
RegisterScorer reg_linear({"kvzap-linear", "KVzap-Linear: a per-layer linear surrogate predicts log KVzip+ scores", true,
                           [](const PressSpec& o, const Model& m) { return make_kvzap(o, m, false); }, kvzap_traits("linear")});
RegisterScorer reg_mlp({"kvzap-mlp", "KVzap-MLP: a per-layer 2-layer MLP surrogate predicts log KVzip+ scores", true,
                        [](const PressSpec& o, const Model& m) { return make_kvzap(o, m, true); }, kvzap_traits("mlp")});

}  // namespace

// The surrogate folder: --surrogate DIR, else <data_dir()>/surrogates/<model name>/<kind> if shipped.
std::string kvzap_surrogate_dir(const PressSpec& opt, const Model& model, const std::string& kind) {
  if (!opt.surrogate_dir.empty()) return opt.surrogate_dir;
  const std::string& name = model.config().name;
  const fs::path root = fs::path(data_dir()) / "surrogates";
  for (const std::string& n : {name, folder_name(name)}) {
    if (n.empty()) continue;
    const fs::path dir = root / n / kind;
    std::error_code ec;
    if (fs::exists(dir / "config.json", ec)) return dir.string();
  }
  throw Error("press '" + opt.name + "' needs a " + kind + " surrogate for model '" + name +
              "': pass --surrogate DIR (no default in " + (root / folder_name(name) / kind).string() + ")");
}

}  // namespace kvzap
