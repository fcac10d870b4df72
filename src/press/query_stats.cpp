// Query statistics for expected_attention_stats and qfilter (press/query_stats.h).
#include "press/query_stats.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <mutex>

#include "format/safetensors.h"
#include "kernels/thread_pool.h"
#include "kvzap/error.h"
#include "model/model.h"
#include "press/press_spec.h"

namespace kvzap {

namespace fs = std::filesystem;

namespace {

constexpr const char* kFormat = "kvzap-query-stats";
constexpr const char* kFileName = "query_stats.safetensors";

std::string command_hint(const std::string& path) {
  return "compute them with `kvzap query-stats -m MODEL --corpus DIR` (or --files LIST), which writes " + path +
         ", or pass --surrogate PATH to a file it wrote";
}

}  // namespace

void top_eigenvector(const double* g, const double* start, int D, double* out) {
  std::vector<double> u((size_t)D), w((size_t)D);
  double norm = 0;
  for (int a = 0; a < D; a++) norm += start[a] * start[a];
  for (int a = 0; a < D; a++) u[(size_t)a] = norm > 0 ? start[a] / std::sqrt(norm) : (a == 0 ? 1.0 : 0.0);
  // A start orthogonal to the top eigenvector would stay orthogonal: mix in a fixed dense direction.
  for (int a = 0; a < D; a++) u[(size_t)a] += 1e-3 * std::cos(1.0 + 0.7 * a);
  for (int it = 0; it < 20000; it++) {
    double n2 = 0;
    for (int a = 0; a < D; a++) {
      double x = 0;
      for (int b = 0; b < D; b++) x += g[(size_t)a * D + b] * u[(size_t)b];
      w[(size_t)a] = x;
      n2 += x * x;
    }
    if (n2 == 0) break;  // g = 0: any unit vector
    const double inv = 1.0 / std::sqrt(n2);
    double change = 0;
    for (int a = 0; a < D; a++) {
      const double x = w[(size_t)a] * inv;
      change = std::max(change, std::fabs(x - u[(size_t)a]));
      u[(size_t)a] = x;
    }
    if (change < 1e-13) break;
  }
  double n2 = 0, dot = 0;
  for (int a = 0; a < D; a++) n2 += u[(size_t)a] * u[(size_t)a], dot += u[(size_t)a] * start[a];
  const double s = (dot < 0 ? -1.0 : 1.0) / std::sqrt(n2);
  for (int a = 0; a < D; a++) out[a] = u[(size_t)a] * s;
}

// ---------------------------------------------------------------- collector

QueryStatsCollector::QueryStatsCollector(const ModelConfig& c, int64_t n_sink)
    : cfg_(c), n_sink_(n_sink), rope_(c), s1_((size_t)c.n_layer), s2_((size_t)c.n_layer), p1_((size_t)c.n_layer),
      gram_((size_t)c.n_layer), n_((size_t)c.n_layer, 0), q_((size_t)c.n_head * c.head_dim) {
  const size_t H = (size_t)c.n_head, Hkv = (size_t)c.n_head_kv, D = (size_t)c.head_dim;
  for (size_t l = 0; l < (size_t)c.n_layer; l++) {
    s1_[l].assign(H * D, 0.0);
    s2_[l].assign(H * D * D, 0.0);
    p1_[l].assign(Hkv * D, 0.0);
    gram_[l].assign(Hkv * D * D, 0.0);
  }
}

void QueryStatsCollector::after_attention(const LayerStep& step, KvCache& cache) {
  (void)cache;
  const int H = cfg_.n_head, Hkv = cfg_.n_head_kv, G = cfg_.n_group(), D = cfg_.head_dim;
  const size_t l = (size_t)step.layer;
  int32_t max_pos = 0;
  for (int64_t t = 0; t < step.n_tok; t++) max_pos = std::max(max_pos, step.pos[t]);
  rope_.reserve((int64_t)max_pos + 1);
  for (int64_t t = 0; t < step.n_tok; t++) n_[l] += step.pos[t] >= n_sink_;
  // Pre-RoPE statistics per query head (task h < H), then post-RoPE Gram per KV head (task H + hk).
  auto task = [&](int64_t i, int) {
    if (i < H) {
      const int h = (int)i;
      double* s1 = &s1_[l][(size_t)h * D];
      double* s2 = &s2_[l][(size_t)h * D * D];
      float* q = &q_[(size_t)h * D];  // [D] this head's scratch
      for (int64_t t = 0; t < step.n_tok; t++) {
        if (step.pos[t] < n_sink_) continue;
        std::copy_n(step.q + ((size_t)t * H + h) * D, D, q);  // step.q: [n_tok][H][D] after RoPE
        rope_.unrotate(q, step.pos[t], step.layer);
        for (int a = 0; a < D; a++) {
          const double qa = q[a];
          s1[a] += qa;
          double* row = s2 + (size_t)a * D;
          for (int b = 0; b < D; b++) row[b] += qa * (double)q[b];
        }
      }
      return;
    }
    const int hk = (int)(i - H);
    double* p1 = &p1_[l][(size_t)hk * D];
    double* gm = &gram_[l][(size_t)hk * D * D];
    for (int64_t t = 0; t < step.n_tok; t++) {
      if (step.pos[t] < n_sink_) continue;
      for (int g = 0; g < G; g++) {
        const float* q = step.q + ((size_t)t * H + (size_t)hk * G + g) * D;
        for (int a = 0; a < D; a++) {
          const double qa = q[a];
          p1[a] += qa;
          double* row = gm + (size_t)a * D;
          for (int b = 0; b < D; b++) row[b] += qa * (double)q[b];
        }
      }
    }
  };
  if (step.pool) step.pool->parallel_for(H + Hkv, task);
  else
    for (int64_t i = 0; i < H + Hkv; i++) task(i, 0);
}

QueryStats QueryStatsCollector::finish() const {
  const int L = cfg_.n_layer, H = cfg_.n_head, Hkv = cfg_.n_head_kv, D = cfg_.head_dim;
  QueryStats s;
  s.n_layer = L, s.n_head = H, s.n_head_kv = Hkv, s.head_dim = D, s.n_sink = n_sink_;
  s.n_queries = n_.empty() ? 0 : n_[0];
  for (int l = 0; l < L; l++)
    if (n_[(size_t)l] != s.n_queries || n_[(size_t)l] < 2)
      throw Error("query statistics need at least 2 queries past the first " + std::to_string(n_sink_) +
                  " tokens in every layer (layer " + std::to_string(l) + " saw " + std::to_string(n_[(size_t)l]) + ")");
  const double n = (double)s.n_queries;
  s.mean.resize((size_t)L * H * D);
  s.cov.resize((size_t)L * H * D * D);
  s.q_filters.resize((size_t)L * Hkv * D);
  std::vector<double> u((size_t)D);
  for (int l = 0; l < L; l++) {
    for (int h = 0; h < H; h++) {
      const double* s1 = &s1_[(size_t)l][(size_t)h * D];
      const double* s2 = &s2_[(size_t)l][(size_t)h * D * D];
      float* mu = &s.mean[((size_t)l * H + h) * D];
      float* cv = &s.cov[((size_t)l * H + h) * D * D];
      for (int a = 0; a < D; a++) mu[a] = (float)(s1[a] / n);
      // sum (q - m)(q - m)^T = s2 - n m m^T, over N - 1 (Bessel, as kvpress's collect_queries).
      for (int a = 0; a < D; a++)
        for (int b = 0; b < D; b++)
          cv[(size_t)a * D + b] = (float)((s2[(size_t)a * D + b] - s1[a] * s1[b] / n) / (n - 1));
    }
    for (int hk = 0; hk < Hkv; hk++) {
      // u: top eigenvector of Q^T Q, signed so that p1 . u >= 0 (the queries' mean projection); filter -u.
      top_eigenvector(&gram_[(size_t)l][(size_t)hk * D * D], &p1_[(size_t)l][(size_t)hk * D], D, u.data());
      float* f = &s.q_filters[((size_t)l * Hkv + hk) * D];
      for (int a = 0; a < D; a++) f[a] = (float)-u[(size_t)a];
    }
  }
  return s;
}

// ---------------------------------------------------------------- file

void QueryStats::save(const std::string& path, const std::map<std::string, std::string>& metadata) const {
  std::error_code ec;
  const fs::path parent = fs::path(path).parent_path();
  if (!parent.empty()) fs::create_directories(parent, ec);
  std::map<std::string, std::string> meta = metadata;
  meta["format"] = kFormat;
  meta["n_sink"] = std::to_string(n_sink);
  meta["n_queries"] = std::to_string(n_queries);
  const int64_t L = n_layer, H = n_head, Hkv = n_head_kv, D = head_dim;
  write_safetensors(path,
                    {{"query_mean", "F32", {L, H, D}, mean},
                     {"query_cov", "F32", {L, H, D, D}, cov},
                     {"q_filters", "F32", {L, Hkv, D}, q_filters}},
                    meta);
}

QueryStats QueryStats::load(const std::string& path) {
  auto f = SafetensorsFile::open(path);
  if (f->metadata().value("format", std::string()) != kFormat)
    throw Error(path + ": not a kvzap query statistics file (metadata format is not '" + kFormat + "')");
  const auto& m = f->tensor("query_mean");
  const auto& c = f->tensor("query_cov");
  const auto& q = f->tensor("q_filters");
  if (m.shape.size() != 3 || c.shape.size() != 4 || q.shape.size() != 3 || c.shape[0] != m.shape[0] ||
      c.shape[1] != m.shape[1] || c.shape[2] != m.shape[2] || c.shape[3] != m.shape[2] || q.shape[0] != m.shape[0] ||
      q.shape[2] != m.shape[2])
    throw Error(path + ": query_mean, query_cov and q_filters have inconsistent shapes");
  QueryStats s;
  s.n_layer = (int)m.shape[0], s.n_head = (int)m.shape[1], s.head_dim = (int)m.shape[2], s.n_head_kv = (int)q.shape[1];
  s.mean = f->to_f32(m);
  s.cov = f->to_f32(c);
  s.q_filters = f->to_f32(q);
  try {
    s.n_sink = std::stoll(f->metadata().value("n_sink", std::string("4")));
    s.n_queries = std::stoll(f->metadata().value("n_queries", std::string("0")));
  } catch (const std::exception&) {
    throw Error(path + ": bad n_sink or n_queries metadata");
  }
  return s;
}

void QueryStats::check_fits(const ModelConfig& c, const std::string& path, const std::string& press) const {
  auto shape = [](int64_t layers, int64_t heads, int64_t kv_heads, int64_t d) {
    return std::to_string(layers) + " layers, " + std::to_string(heads) + " query heads, " + std::to_string(kv_heads) +
           " KV heads, head_dim " + std::to_string(d);
  };
  if (n_layer != c.n_layer || n_head != c.n_head || n_head_kv != c.n_head_kv || head_dim != c.head_dim)
    throw Error("press '" + press + "': the query statistics in " + path + " (" +
                shape(n_layer, n_head, n_head_kv, head_dim) + ") do not fit the model (" +
                shape(c.n_layer, c.n_head, c.n_head_kv, c.head_dim) + "): " + command_hint(path));
}

std::string default_query_stats_path(const Model& model) {
  const fs::path w(model.weights_path());
  return (w.parent_path() / (w.stem().string() + ".query_stats.safetensors")).string();
}

std::string query_stats_path(const PressSpec& spec, const Model& model) {
  if (spec.surrogate_dir.empty()) return default_query_stats_path(model);
  std::error_code ec;
  if (fs::is_directory(spec.surrogate_dir, ec)) return (fs::path(spec.surrogate_dir) / kFileName).string();
  return spec.surrogate_dir;
}

std::shared_ptr<const QueryStats> load_query_stats(const PressSpec& spec, const Model& model, const std::string& press) {
  const std::string path = query_stats_path(spec, model);
  std::error_code ec;
  if (!fs::exists(path, ec))
    throw Error("press '" + press + "' needs query statistics of model '" + model.config().name + "', and " + path +
                " does not exist: " + command_hint(path));
  static std::mutex mu;
  static std::map<std::string, std::weak_ptr<const QueryStats>> loaded;
  std::shared_ptr<const QueryStats> s;
  {
    std::lock_guard<std::mutex> lock(mu);
    const std::string key = fs::absolute(path, ec).string() + "@" +
                            std::to_string(fs::last_write_time(path, ec).time_since_epoch().count());
    s = loaded[key].lock();
    if (!s) {
      std::erase_if(loaded, [](const auto& kv) { return kv.second.expired(); });
      s = std::make_shared<const QueryStats>(QueryStats::load(path));
      loaded[key] = s;
    }
  }
  s->check_fits(model.config(), path, press);
  return s;
}

}  // namespace kvzap
