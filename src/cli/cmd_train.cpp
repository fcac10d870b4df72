// kvzap train: fits KVzap-Linear (ridge, alpha 1; docs/ALGORITHMS.md §5.3) and/or KVzap-MLP (§5.4) on
// a .kvzd dataset from `kvzap collect`, scores them on a held-out one (squared Pearson per layer and KV
// head, §5.5) and writes kvpress-format folders DIR/linear, DIR/mlp plus DIR/report.json and
// DIR/report.md.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <unistd.h>

#include "cli/cli_common.h"
#include "common/atomic_file.h"
#include "common/progress.h"
#include "kernels/thread_pool.h"
#include "press/kvzip_math.h"
#include "train/dataset.h"
#include "train/metrics.h"
#include "train/mlp.h"
#include "train/ridge.h"

namespace kvzap::cli {
namespace {

namespace fs = std::filesystem;

struct TrainArgs {
  std::string data, test, out, kind = "both";
  int epochs = 15, batch = 512, hidden = 0, threads = 0;
  int64_t max_pairs = 0;  // 0 = all
  double lr = 5e-3, alpha = 1.0, valid_fraction = 0.05;
  uint64_t seed = 0;
};

struct Trained {
  std::string kind;
  R2Table r2;
  double seconds = 0;
  int64_t n_params = 0;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Saves the surrogate, its test predictions (kvpress writes true.npy / pred.npy next to each model)
// and returns its R² table.
Trained finish_model(const std::string& kind, const Surrogate& s, const Dataset& test, ThreadPool& pool,
                     const fs::path& out, double seconds) {
  Trained t;
  t.kind = kind;
  t.seconds = seconds;
  t.n_params = s.n_params();
  std::vector<float> pred;
  t.r2 = evaluate(s, test, &pool, &pred);
  // Everything of one model goes to a staging folder first, swapped in whole (crash-safe: a kill never
  // leaves a config.json that belongs to other weights).
  const fs::path final_dir = out / kind;
  const fs::path dir = out / (kind + ".partial-" + std::to_string(::getpid()));
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(out, ec)) {  // leftovers of killed runs
    const std::string name = e.path().filename().string();
    if (name.rfind(kind + ".partial-", 0) == 0 || name.rfind(kind + ".old-", 0) == 0) fs::remove_all(e.path(), ec);
  }
  s.save(dir.string());
  const int64_t n = test.size(), L = test.n_layers(), H = test.n_heads();
  std::vector<float> truth((size_t)(n * L * H));
  for (int64_t i = 0; i < n; i++) std::copy(test.y_record(i), test.y_record(i) + L * H, &truth[(size_t)(i * L * H)]);
  write_npy_f32((dir / "true.npy").string(), truth.data(), {n, L, H});
  write_npy_f32((dir / "pred.npy").string(), pred.data(), {n, L, H});
  replace_dir(dir.string(), final_dir.string());
  std::fprintf(stderr, "train: %s: mean R² %.4f on %lld test pairs (%.1f s) -> %s\n", kind.c_str(), t.r2.mean(),
               (long long)n, seconds, final_dir.c_str());
  return t;
}

int run_train(const TrainArgs& a) {
  Dataset train = Dataset::open(a.data);
  // collect writes whole windows in window order, so a prefix is the dataset of a shorter collection
  // (rounded down to whole windows here).
  if (a.max_pairs > 0 && a.max_pairs < train.size()) {
    int64_t n = a.max_pairs;
    while (n > 0 && n < train.size() && train.group(n) == train.group(n - 1)) n--;
    if (n == 0) throw Error("--max-pairs " + std::to_string(a.max_pairs) + " is less than the first window of " + a.data);
    train.limit(n);
  }
  const Dataset test = Dataset::open(a.test);
  if (!(train.shape().n_layers == test.shape().n_layers && train.shape().d_model == test.shape().d_model &&
        train.shape().n_heads == test.shape().n_heads))
    throw Error(a.data + " and " + a.test + " have different shapes (layers, D_h, heads)");
  if (train.size() == 0 || test.size() < 2) throw Error("need a non-empty training set and at least 2 test pairs");
  ThreadPool pool(a.threads > 0 ? a.threads : ThreadPool::default_threads());
  const fs::path out(a.out);
  fs::create_directories(out);
  std::fprintf(stderr, "train: %lld training pairs, %lld test pairs, %d layers x %d KV heads, D_h %d, %d threads\n",
               (long long)train.size(), (long long)test.size(), train.n_layers(), train.n_heads(), train.d_model(),
               pool.size());

  std::vector<Trained> done;
  nlohmann::json options = {{"data", a.data}, {"test", a.test}, {"n_train", train.size()}, {"n_test", test.size()}};
  if (a.max_pairs > 0) options["max_pairs"] = a.max_pairs;
  if (a.kind == "linear" || a.kind == "both") {
    const auto t0 = std::chrono::steady_clock::now();
    Progress bar("train linear (ridge)", train.size(), "rec");
    const Surrogate s = fit_linear_surrogate(train, a.alpha, &pool, [&](int64_t d, int64_t) { bar.update(d); });
    bar.finish();
    done.push_back(finish_model("linear", s, test, pool, out, seconds_since(t0)));
    options["linear"] = {{"alpha", a.alpha}};
  }
  if (a.kind == "mlp" || a.kind == "both") {
    MlpOptions mo;
    mo.hidden_dim = a.hidden;
    mo.epochs = a.epochs;
    mo.batch_size = a.batch;
    mo.lr = a.lr;
    mo.valid_fraction = a.valid_fraction;
    mo.seed = a.seed;
    const auto t0 = std::chrono::steady_clock::now();
    Progress bar("train mlp", a.epochs, "epoch");
    const Surrogate s = train_mlp(train, mo, [&](const MlpEpochReport& r) {
      char buf[128];
      std::snprintf(buf, sizeof buf, "loss %.4f  valid %.4f  lr %.2g", r.train_loss, r.valid_loss, r.lr);
      bar.update(r.epoch + 1, buf);
    }, &pool);
    bar.finish();
    done.push_back(finish_model("mlp", s, test, pool, out, seconds_since(t0)));
    options["mlp"] = {{"hidden_dim", s.hidden_dim()}, {"epochs", a.epochs}, {"lr", a.lr}, {"batch", a.batch},
                      {"seed", a.seed}, {"valid_fraction", a.valid_fraction}, {"optimizer", "AdamW wd 0.01, cosine, clip 1"}};
  }

  // Per-layer table (mean over heads) on stdout and in report.md; everything in report.json.
  const int L = train.n_layers(), H = train.n_heads();
  std::string md = "| layer |";
  for (const Trained& t : done) md += " " + t.kind + " R² |";
  md += "\n|---|";
  for (size_t i = 0; i < done.size(); i++) md += "---|";
  md += "\n";
  for (int l = 0; l < L; l++) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "| %d |", l);
    md += buf;
    for (const Trained& t : done) {
      std::snprintf(buf, sizeof buf, " %.3f |", t.r2.layer_mean(l));
      md += buf;
    }
    md += "\n";
  }
  md += "| **mean** |";
  for (const Trained& t : done) {
    char buf[32];
    std::snprintf(buf, sizeof buf, " **%.3f** |", t.r2.mean());
    md += buf;
  }
  md += "\n";
  std::printf("%s", md.c_str());

  nlohmann::json report = {{"metric", "squared Pearson correlation per (layer, KV head) on the test set"},
                           {"options", options}, {"models", nlohmann::json::object()}};
  for (const Trained& t : done) {
    nlohmann::json per_layer = nlohmann::json::array(), per_head = nlohmann::json::array();
    for (int l = 0; l < L; l++) {
      per_layer.push_back(t.r2.layer_mean(l));
      nlohmann::json row = nlohmann::json::array();
      for (int h = 0; h < H; h++) row.push_back(t.r2.at(l, h));
      per_head.push_back(row);
    }
    report["models"][t.kind] = {{"mean_r2", t.r2.mean()}, {"per_layer", per_layer}, {"per_head", per_head},
                                {"train_seconds", t.seconds}, {"n_params", t.n_params}};
  }
  write_file_atomic((out / "report.json").string(), report.dump(2) + "\n");
  write_file_atomic((out / "report.md").string(),
                    "Held-out squared Pearson correlation (mean over the " + std::to_string(H) +
                        " KV heads of each layer); " + std::to_string(train.size()) + " training pairs, " +
                        std::to_string(test.size()) + " test pairs.\n\n" + md);
  return 0;
}

RegisterCommand reg("train", "train KVzap surrogates (linear ridge and/or MLP) on collected KVzip+ targets",
                    [](CLI::App& sub) {
  auto a = std::make_shared<TrainArgs>();
  sub.add_option("--data", a->data, "training dataset (.kvzd from kvzap collect)")->required();
  sub.add_option("--test", a->test, "held-out dataset (.kvzd) for the R² report")->required();
  sub.add_option("--out", a->out, "output folder (gets linear/, mlp/, report.json, report.md)")->required();
  sub.add_option("--max-pairs", a->max_pairs,
                 "train on the first N pairs of --data only (whole windows: rounded down to a window boundary)")
      ->check(CLI::Range((int64_t)1, (int64_t)1 << 40));
  sub.add_option("--kind", a->kind, "linear, mlp or both")->check(CLI::IsMember({"linear", "mlp", "both"}));
  sub.add_option("--alpha", a->alpha, "ridge regularisation (sklearn Ridge alpha)")->check(CLI::Range(0.0, 1e12));
  sub.add_option("--epochs", a->epochs, "MLP epochs")->check(CLI::Range(1, 100000));
  sub.add_option("--lr", a->lr, "MLP peak learning rate (AdamW, cosine schedule)")->check(CLI::Range(0.0, 10.0));
  sub.add_option("--batch", a->batch, "MLP batch size")->check(CLI::Range(1, 1 << 24));
  sub.add_option("--hidden", a->hidden, "MLP hidden width (0 = D_h / 8)")->check(CLI::Range(0, 1 << 20));
  sub.add_option("--valid-fraction", a->valid_fraction, "MLP monitoring split, not trained on")->check(CLI::Range(0.0, 0.5));
  sub.add_option("--seed", a->seed, "MLP initialisation and shuffling seed");
  sub.add_option("-t,--threads", a->threads, "worker threads (default: physical cores)")->check(CLI::Range(0, 1024));
  return [a]() { return run_train(*a); };
});

}  // namespace
}  // namespace kvzap::cli
