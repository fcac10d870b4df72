// kvzap calibrate: how much of the KV cache a KVzap surrogate evicts at each threshold
// (docs/ALGORITHMS.md §6.5, docs/TRAINING.md §5), on held-out texts, so a user can pick a threshold.
// One prefill per text scores every token with every given surrogate; the evicted fraction of the
// threshold policy (entries outside the last `window` tokens with score < T, kvpress accounting: mean
// over layers of evicted / (H x length)) is then counted for the whole grid at once. That count is
// exact for a context prefilled in one step (scores do not depend on evictions made after the step's
// attention), and one threshold is re-run through the real press as a cross-check. Only global-attention
// layers count: sliding-window ones are not pruned by default. Writes a table, calibration.json and an SVG plot;
// --write-default records the threshold closest to --target in <surrogate>/kvzap.json.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli/cli_common.h"
#include "common/progress.h"
#include "engine/pipeline.h"
#include "press/kvzip.h"
#include "press/surrogate.h"
#include "train/targets.h"

namespace kvzap::cli {
namespace {

namespace fs = std::filesystem;

struct CalibrateArgs {
  ModelArgs m;
  std::vector<std::string> surrogates;
  std::string corpus, split = "test", files, thresholds = "-10:0:0.5", out_dir;
  int window = 128, max_files = 12;
  int64_t max_tokens = 2048;
  double target = 0.55;
  bool write_default = false;
};

// Paths under the source tree are recorded relative to it (the files are committed).
std::string display_path(const std::string& p) {
  const fs::path abs = fs::absolute(p).lexically_normal(), root = fs::path(KVZAP_SOURCE_DIR).lexically_normal();
  const fs::path rel = abs.lexically_relative(root);
  return !rel.empty() && *rel.begin() != ".." ? rel.string() : p;
}

std::vector<double> parse_thresholds(const std::string& s) {
  std::vector<double> out;
  try {
    if (s.find(':') != std::string::npos) {
      double a, b, step;
      char c1, c2;
      std::istringstream in(s);
      if (!(in >> a >> c1 >> b >> c2 >> step) || c1 != ':' || c2 != ':' || !(step > 0) || b < a) throw 0;
      for (int64_t i = 0; a + i * step <= b + 1e-9 && i < 100000; i++) out.push_back(a + i * step);
    } else {
      std::istringstream in(s);
      std::string item;
      while (std::getline(in, item, ',')) out.push_back(std::stod(item));
    }
  } catch (...) {
    out.clear();
  }
  if (out.empty()) throw Error("--thresholds: expected START:STOP:STEP or a comma list, got '" + s + "'");
  std::sort(out.begin(), out.end());
  return out;
}

struct Curve {
  std::string label, dir;
  std::unique_ptr<Surrogate> model;
  std::vector<std::vector<double>> frac;  // [file][threshold] evicted fraction
  std::vector<double> mean, lo, hi;       // over files
  size_t best = 0;                        // grid index closest to the target
};

// Scores every token of a one-step prefill with each surrogate: pred[s][l] = [n][H].
struct ScoreObserver : LayerObserver {
  std::vector<Curve>* curves = nullptr;
  std::vector<std::vector<std::vector<float>>> pred;
  std::vector<float> scratch;
  void after_attention(const LayerStep& st, KvCache& cache) override {
    if (st.pos[0] != 0) throw Error("internal: calibration needs the text in one step");
    for (size_t s = 0; s < curves->size(); s++) {
      const Surrogate& m = *(*curves)[s].model;
      auto& out = pred[s][(size_t)st.layer];
      out.resize((size_t)(st.n_tok * m.output_dim()));
      scratch.resize((size_t)m.scratch_floats(st.n_tok));
      m.predict(st.layer, st.h, st.n_tok, out.data(), scratch.data());
    }
  }
};

std::string svg_plot(const std::vector<Curve>& curves, const std::vector<double>& thr, double target, int window,
                     size_t n_files) {
  const double W = 720, Hh = 440, left = 70, right = 20, top = 40, bottom = 60;
  const double pw = W - left - right, ph = Hh - top - bottom;
  const double x0 = thr.front(), x1 = thr.back() > thr.front() ? thr.back() : thr.front() + 1;
  auto X = [&](double t) { return left + (t - x0) / (x1 - x0) * pw; };
  auto Y = [&](double f) { return top + (1.0 - f) * ph; };
  const char* colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"};
  std::ostringstream o;
  o.precision(5);
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << Hh
    << "\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  o << "<text x=\"" << W / 2 << "\" y=\"22\" text-anchor=\"middle\" font-size=\"14\">KVzap evicted fraction vs threshold ("
    << n_files << " held-out texts, window " << window << ")</text>\n";
  for (int i = 0; i <= 10; i++) {  // horizontal grid every 10 %
    const double y = Y(i / 10.0);
    o << "<line x1=\"" << left << "\" y1=\"" << y << "\" x2=\"" << left + pw << "\" y2=\"" << y
      << "\" stroke=\"#ddd\"/>\n<text x=\"" << left - 8 << "\" y=\"" << y + 4 << "\" text-anchor=\"end\">" << i * 10
      << "%</text>\n";
  }
  const double span = x1 - x0, tick = span > 12 ? 2 : span > 5 ? 1 : span > 2 ? 0.5 : 0.1;
  for (double t = std::ceil(x0 / tick) * tick; t <= x1 + 1e-9; t += tick) {
    const double x = X(t);
    o << "<line x1=\"" << x << "\" y1=\"" << top << "\" x2=\"" << x << "\" y2=\"" << top + ph
      << "\" stroke=\"#eee\"/>\n<text x=\"" << x << "\" y=\"" << top + ph + 18 << "\" text-anchor=\"middle\">" << t
      << "</text>\n";
  }
  o << "<rect x=\"" << left << "\" y=\"" << top << "\" width=\"" << pw << "\" height=\"" << ph
    << "\" fill=\"none\" stroke=\"black\"/>\n";
  o << "<text x=\"" << left + pw / 2 << "\" y=\"" << Hh - 18 << "\" text-anchor=\"middle\">threshold T (evict when predicted log KVzip+ score &lt; T)</text>\n";
  o << "<text transform=\"translate(18," << top + ph / 2 << ") rotate(-90)\" text-anchor=\"middle\">evicted fraction of the KV cache</text>\n";
  o << "<line x1=\"" << left << "\" y1=\"" << Y(target) << "\" x2=\"" << left + pw << "\" y2=\"" << Y(target)
    << "\" stroke=\"#888\" stroke-dasharray=\"6,4\"/>\n";
  for (size_t c = 0; c < curves.size(); c++) {
    const Curve& cv = curves[c];
    const char* col = colors[c % 5];
    std::ostringstream band, line;
    band.precision(5);
    line.precision(5);
    for (size_t i = 0; i < thr.size(); i++) band << X(thr[i]) << "," << Y(cv.hi[i]) << " ";
    for (size_t i = thr.size(); i-- > 0;) band << X(thr[i]) << "," << Y(cv.lo[i]) << " ";
    for (size_t i = 0; i < thr.size(); i++) line << X(thr[i]) << "," << Y(cv.mean[i]) << " ";
    o << "<polygon points=\"" << band.str() << "\" fill=\"" << col << "\" fill-opacity=\"0.12\" stroke=\"none\"/>\n";
    const char* dash = c % 2 ? " stroke-dasharray=\"7,4\"" : "";  // overlapping curves stay visible
    o << "<polyline points=\"" << line.str() << "\" fill=\"none\" stroke=\"" << col << "\" stroke-width=\"2\"" << dash
      << "/>\n";
    for (size_t i = 0; i < thr.size(); i++)
      o << "<circle cx=\"" << X(thr[i]) << "\" cy=\"" << Y(cv.mean[i]) << "\" r=\"2.5\" fill=\"" << col << "\"/>\n";
    o << "<circle cx=\"" << X(thr[cv.best]) << "\" cy=\"" << Y(cv.mean[cv.best]) << "\" r=\"6\" fill=\"none\" stroke=\""
      << col << "\" stroke-width=\"2\"/>\n";
    const double ly = top + 18 + 18 * (double)c;
    o << "<line x1=\"" << left + 12 << "\" y1=\"" << ly - 4 << "\" x2=\"" << left + 36 << "\" y2=\"" << ly - 4
      << "\" stroke=\"" << col << "\" stroke-width=\"2\"" << dash << "/>\n<text x=\"" << left + 42 << "\" y=\"" << ly << "\">"
      << cv.label << " (circled: T = " << thr[cv.best] << ", " << std::lround(100 * cv.mean[cv.best])
      << "% evicted; band = min..max over texts)</text>\n";
  }
  o << "</svg>\n";
  return o.str();
}

int run_calibrate(const CalibrateArgs& a) {
  if (a.surrogates.empty()) throw Error("give at least one --surrogate DIR");
  if (a.corpus.empty() == a.files.empty()) throw Error("give exactly one of --corpus DIR or --files LIST");
  const std::vector<double> thr = parse_thresholds(a.thresholds);
  const std::string list = a.files.empty() ? (fs::path(a.corpus) / (a.split + ".txt")).string() : a.files;
  std::vector<std::string> docs = read_file_list(list);
  for (const std::string& d : docs)
    if (d.find("/heldout/") != std::string::npos)
      throw Error(d + ": the held-out evaluation novels are not for calibration; use the corpus test split");
  // An even spread over the list (it is ordered by source).
  if ((int)docs.size() > a.max_files) {
    std::vector<std::string> pick;
    for (int i = 0; i < a.max_files; i++) pick.push_back(docs[(size_t)i * docs.size() / (size_t)a.max_files]);
    docs = pick;
  }

  auto model = a.m.load_model();
  const ModelConfig& c = model->config();
  const Tokenizer& tok = model->tokenizer();
  std::vector<Curve> curves;
  for (const std::string& dir : a.surrogates) {
    Curve cv;
    cv.dir = dir;
    cv.model = Surrogate::load(dir);
    if (cv.model->n_layers() != c.n_layer || cv.model->input_dim() != c.n_embd || cv.model->output_dim() != c.n_head_kv)
      throw Error("surrogate " + dir + " does not fit the model");
    cv.label = cv.model->is_mlp() ? "kvzap-mlp" : "kvzap-linear";
    for (const Curve& o : curves)
      if (o.label == cv.label) cv.label += " (" + fs::path(dir).parent_path().filename().string() + ")";
    curves.push_back(std::move(cv));
  }

  // The layers a threshold press judges: every global-attention one. Sliding-window layers (Gemma 3's
  // local layers) keep only their window and presses leave them alone by default (PressSpec::
  // sliding_layers), so they are not counted: the fractions below are of the judged layers' entries.
  std::vector<int> judged_layers;
  for (int l = 0; l < c.n_layer; l++)
    if (!c.layers[(size_t)l].is_sliding()) judged_layers.push_back(l);
  if (judged_layers.empty()) throw Error("the model has no global-attention layer for a threshold press to judge");
  if ((int)judged_layers.size() < c.n_layer)
    std::fprintf(stderr, "calibrate: %zu of %d layers are global; evicted fractions are of those layers' entries "
                 "(sliding-window layers are not pruned by default)\n", judged_layers.size(), c.n_layer);

  SessionOptions so = a.m.session_options();
  so.n_ctx = std::max<int64_t>(so.n_ctx, a.max_tokens + 16);
  so.n_batch = so.n_ctx;
  Session session(*model, so);
  ScoreObserver obs;
  obs.curves = &curves;
  obs.pred.assign(curves.size(), std::vector<std::vector<float>>((size_t)c.n_layer));
  const int64_t H = c.n_head_kv;
  std::vector<int64_t> lengths;
  std::vector<std::vector<int32_t>> contexts;
  Progress bar("calibrate", (int64_t)docs.size(), "text");
  for (const std::string& doc : docs) {
    std::vector<int32_t> ids = build_context_prompt(tok, strip_text(read_text_file(doc)), {}, true).context_ids;
    if ((int64_t)ids.size() > a.max_tokens) ids.resize((size_t)a.max_tokens);
    const int64_t n = (int64_t)ids.size();
    session.reset();
    session.forward().run(ids.data(), n, session.cache(), LogitsMode::None, nullptr, &obs);
    const int64_t judged = std::max<int64_t>(0, n - a.window);  // the last `window` tokens are never judged
    for (Curve& cv : curves) {
      const size_t s = (size_t)(&cv - curves.data());
      std::vector<double> f(thr.size(), 0.0);
      for (int l : judged_layers) {
        std::vector<float> sc(obs.pred[s][(size_t)l].begin(), obs.pred[s][(size_t)l].begin() + judged * H);
        std::sort(sc.begin(), sc.end());
        for (size_t t = 0; t < thr.size(); t++) {
          const int64_t below = std::lower_bound(sc.begin(), sc.end(), (float)thr[t]) - sc.begin();  // strict <
          f[t] += (double)below / (double)(H * n) / (double)judged_layers.size();
        }
      }
      cv.frac.push_back(f);
    }
    lengths.push_back(n);
    contexts.push_back(std::move(ids));
    bar.add(1, std::to_string(n) + " tokens");
  }
  bar.finish();

  for (Curve& cv : curves) {
    cv.mean.assign(thr.size(), 0.0);
    cv.lo.assign(thr.size(), 1.0);
    cv.hi.assign(thr.size(), 0.0);
    for (const auto& f : cv.frac)
      for (size_t t = 0; t < thr.size(); t++) {
        cv.mean[t] += f[t] / (double)cv.frac.size();
        cv.lo[t] = std::min(cv.lo[t], f[t]);
        cv.hi[t] = std::max(cv.hi[t], f[t]);
      }
    for (size_t t = 1; t < thr.size(); t++)
      if (std::abs(cv.mean[t] - a.target) < std::abs(cv.mean[cv.best] - a.target)) cv.best = t;
  }

  // Cross-check the offline count with the real threshold press on the first text.
  for (Curve& cv : curves) {
    PressSpec po;
    po.name = cv.label.substr(0, cv.label.find(' '));
    po.has_threshold = true;
    po.threshold = thr[cv.best];
    po.window = a.window;
    po.surrogate_dir = cv.dir;
    std::unique_ptr<Press> press = make_press(po, *model);
    session.prefill_context(contexts[0], press.get());
    const KvCache& cache = session.cache();
    double real = 0;  // press evictions over the judged layers' entries, as counted offline
    for (int l : judged_layers)
      real += (double)(H * cache.n_past() - cache.entries_kept(l)) / (double)(H * cache.n_past()) / (double)judged_layers.size();
    if ((int)judged_layers.size() < c.n_layer)
      std::fprintf(stderr, "calibrate: %s T=%g evicts %.4f of the whole cache's entries (sliding windows included)\n",
                   cv.label.c_str(), thr[cv.best], cache.evicted_fraction());
    const double offline = cv.frac[0][cv.best];
    std::fprintf(stderr, "calibrate: cross-check %s T=%g on %s: press evicted %.6f, offline count %.6f\n", cv.label.c_str(),
                 thr[cv.best], fs::path(docs[0]).filename().c_str(), real, offline);
    if (std::abs(real - offline) > 1e-6)
      throw Error("calibration cross-check failed: the threshold press evicted " + std::to_string(real) +
                  " but the offline count says " + std::to_string(offline));
  }

  // Table.
  std::printf("| threshold |");
  for (const Curve& cv : curves) std::printf(" %s evicted (min..max) |", cv.label.c_str());
  std::printf("\n|---|");
  for (size_t i = 0; i < curves.size(); i++) std::printf("---|");
  std::printf("\n");
  for (size_t t = 0; t < thr.size(); t++) {
    std::printf("| %g |", thr[t]);
    for (const Curve& cv : curves)
      std::printf(" %5.1f%% (%.1f..%.1f)%s |", 100 * cv.mean[t], 100 * cv.lo[t], 100 * cv.hi[t], t == cv.best ? " *" : "");
    std::printf("\n");
  }
  int64_t total_tokens = 0;
  for (int64_t n : lengths) total_tokens += n;
  std::fprintf(stderr, "calibrate: %zu texts, %lld tokens (mean %.0f); * = closest to the %.0f%% target\n", docs.size(),
               (long long)total_tokens, (double)total_tokens / (double)docs.size(), 100 * a.target);

  std::vector<std::string> shown_docs;
  for (const std::string& d : docs) shown_docs.push_back(display_path(d));
  if (!a.out_dir.empty()) {
    fs::create_directories(a.out_dir);
    nlohmann::json j = {{"model", c.name}, {"window", a.window}, {"judged_layers", judged_layers}, {"thresholds", thr}, {"target", a.target},
                        {"files", shown_docs}, {"tokens", lengths}, {"surrogates", nlohmann::json::array()}};
    for (const Curve& cv : curves)
      j["surrogates"].push_back({{"label", cv.label}, {"dir", display_path(cv.dir)}, {"mean", cv.mean}, {"min", cv.lo}, {"max", cv.hi},
                                 {"per_file", cv.frac}, {"closest_to_target", thr[cv.best]}});
    std::ofstream(fs::path(a.out_dir) / "calibration.json") << j.dump(2) << "\n";
    std::ofstream svg(fs::path(a.out_dir) / "calibration.svg");
    svg << svg_plot(curves, thr, a.target, a.window, docs.size());
    if (!svg) throw Error(a.out_dir + "/calibration.svg: write failed");
    std::fprintf(stderr, "calibrate: wrote %s/calibration.json and calibration.svg\n", a.out_dir.c_str());
  }
  if (a.write_default)
    for (const Curve& cv : curves) {
      const fs::path p = fs::path(cv.dir) / "kvzap.json";
      nlohmann::json j = {{"default_threshold", thr[cv.best]},
                          {"evicted_fraction_at_default", cv.mean[cv.best]},
                          {"target_evicted_fraction", a.target},
                          {"window", a.window},
                          {"calibration", {{"texts", docs.size()}, {"tokens", total_tokens}, {"file_list", display_path(list)},
                                           {"max_tokens", a.max_tokens}}}};
      std::ofstream f(p);
      f << j.dump(2) << "\n";
      if (!f) throw Error(p.string() + ": write failed");
      std::fprintf(stderr, "calibrate: %s default threshold %g (%.1f%% evicted) -> %s\n", cv.label.c_str(), thr[cv.best],
                   100 * cv.mean[cv.best], p.c_str());
    }
  return 0;
}

RegisterCommand reg("calibrate", "evicted fraction of KVzap surrogates per threshold on held-out texts (pick a threshold)",
                    [](CLI::App& sub) {
  auto a = std::make_shared<CalibrateArgs>();
  a->m.add_to(sub);
  sub.add_option("--surrogate", a->surrogates, "surrogate folder (kvpress format; repeatable)")->required();
  sub.add_option("--corpus", a->corpus, "corpus folder made by scripts/make_corpus.sh (reads <split>.txt)");
  sub.add_option("--split", a->split, "corpus split (default test: never trained on)")->check(CLI::IsMember({"train", "test"}));
  sub.add_option("--files", a->files, "a file listing the texts, one path per line (instead of --corpus)");
  sub.add_option("--max-files", a->max_files, "use at most this many texts, spread over the list")->check(CLI::Range(1, 1 << 20));
  sub.add_option("--max-tokens", a->max_tokens, "truncate each context to this many tokens")
      ->check(CLI::Range((int64_t)16, (int64_t)1 << 20));
  sub.add_option("--window", a->window, "the most recent W tokens are never evicted")->check(CLI::Range(0, 1 << 20));
  sub.add_option("--thresholds", a->thresholds, "START:STOP:STEP or a comma list");
  sub.add_option("--target", a->target, "evicted fraction the suggested default threshold aims at")->check(CLI::Range(0.0, 1.0));
  sub.add_option("--out-dir", a->out_dir, "write calibration.json and calibration.svg here");
  sub.add_flag("--write-default", a->write_default, "record the suggested threshold in <surrogate>/kvzap.json");
  return [a]() { return run_calibrate(*a); };
});

}  // namespace
}  // namespace kvzap::cli
