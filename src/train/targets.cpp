#include "train/targets.h"

#include "common/atomic_file.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "chat/chat_prompt.h"
#include "common/rng.h"
#include "kernels/thread_pool.h"
#include "kvzap/error.h"

namespace kvzap {

namespace {

constexpr const char* kRepeatInstruction = "\n\nRepeat the previous context exactly.";

uint64_t splitmix64(uint64_t& s) { return splitmix64_next(s); }  // common/rng.h

// Uniform integer in [0, n) (n > 0), rejection-free enough for our sizes (bias < n / 2^64).
uint64_t below(uint64_t& s, uint64_t n) { return (uint64_t)(((unsigned __int128)splitmix64(s) * n) >> 64); }

uint64_t mix_seed(uint64_t a, uint64_t b) {
  uint64_t s = a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull);
  return splitmix64(s);
}

uint64_t hash_string(const std::string& s) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

bool is_strip_space(unsigned char c) { return c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F); }

}  // namespace

std::string strip_text(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && is_strip_space((unsigned char)s[b])) b++;
  while (e > b && is_strip_space((unsigned char)s[e - 1])) e--;
  return s.substr(b, e - b);
}

RepeatPrompt build_repeat_prompt(const Tokenizer& tok, const std::string& raw_text) {
  const std::string t = strip_text(raw_text);
  if (t.empty()) throw Error("repeat prompt: the text is empty");
  const ChatPrompt prompt(tok);
  ChatOptions co;
  co.add_generation_prompt = false;
  const std::string rendered = prompt.render({{"user", t + kRepeatInstruction}, {"assistant", t}}, co);
  const size_t a = rendered.find(t);
  const size_t b = a == std::string::npos ? a : rendered.find(t, a + t.size() + std::string(kRepeatInstruction).size());
  if (b == std::string::npos) throw Error("repeat prompt: the chat template did not keep the text verbatim");
  RepeatPrompt r;
  r.ids = prompt.encode(rendered);
  // When the pieces tokenise on their own exactly as the whole conversation does, their lengths give the
  // spans (this also works for vocabularies that cannot spell every byte).
  {
    const std::vector<int32_t> p0 = prompt.encode(rendered.substr(0, a));
    const std::vector<int32_t> tt = tok.encode(t, false, true);
    const std::vector<int32_t> p1 = tok.encode(rendered.substr(a + t.size(), b - a - t.size()), false, true);
    const std::vector<int32_t> p2 = tok.encode(rendered.substr(b + t.size()), false, true);
    std::vector<int32_t> joined = p0;
    for (const auto* piece : {&tt, &p1, &tt, &p2}) joined.insert(joined.end(), piece->begin(), piece->end());
    if (joined == r.ids) {
      r.start_prompt = (int64_t)p0.size();
      r.end_prompt = r.start_prompt + (int64_t)tt.size();
      r.start_rep = r.end_prompt + (int64_t)p1.size();
      r.end_rep = r.start_rep + (int64_t)tt.size();
      return r;
    }
  }
  // Otherwise a token was merged across a boundary: find the spans from character offsets. The tokens'
  // bytes spell the rendered string, after any tokens the encoder adds in front (an automatic BOS).
  std::vector<size_t> start(r.ids.size() + 1);
  std::string spelled;
  for (size_t i = 0; i < r.ids.size(); i++) {
    start[i] = spelled.size();
    spelled += tok.token_bytes(r.ids[i]);
  }
  start[r.ids.size()] = spelled.size();
  if (spelled.size() < rendered.size() || spelled.compare(spelled.size() - rendered.size(), rendered.size(), rendered) != 0)
    throw Error("repeat prompt: the text does not tokenise the same inside the chat template, and the tokens do "
                "not spell the conversation");
  const size_t shift = spelled.size() - rendered.size();
  // As in the paper's data pipeline, a boundary at character c is the first token starting at or after c;
  // a token straddling a boundary (Qwen's pre-tokenizer joins a final "." with the "\n\n" after it)
  // belongs to the span it starts in, so the two copies may differ in their last token.
  auto first_at = [&](size_t c) {
    return (int64_t)(std::lower_bound(start.begin(), start.end() - 1, c + shift) - start.begin());
  };
  r.start_prompt = first_at(a);
  r.end_prompt = first_at(a + t.size());
  r.start_rep = first_at(b);
  r.end_rep = first_at(b + t.size());
  if (r.n_text() <= 0 || r.end_rep <= r.start_rep || r.start_rep < r.end_prompt)
    throw Error("repeat prompt: the text has no tokens of its own inside the chat template");
  return r;
}

std::vector<int64_t> sample_positions(int64_t n, int64_t k, uint64_t seed) {
  k = std::clamp<int64_t>(k, 0, std::max<int64_t>(n, 0));
  std::vector<int64_t> idx((size_t)std::max<int64_t>(n, 0));
  for (int64_t i = 0; i < n; i++) idx[(size_t)i] = i;
  uint64_t s = seed;
  for (int64_t i = 0; i < k; i++) std::swap(idx[(size_t)i], idx[(size_t)(i + (int64_t)below(s, (uint64_t)(n - i)))]);
  idx.resize((size_t)k);
  std::sort(idx.begin(), idx.end());
  return idx;
}

// ---------------------------------------------------------------- targets

struct TargetComputer::Observer : LayerObserver {
  Observer(TargetComputer& t, const RepeatPrompt& p_, WindowTargets& o, ThreadPool& pool_)
      : tc(t), p(p_), out(o), pool(pool_) {}
  void after_attention(const LayerStep& st, KvCache& cache) override;

  TargetComputer& tc;
  const RepeatPrompt& p;
  WindowTargets& out;
  ThreadPool& pool;
  std::vector<float> inv_hnorm, kt, vnorm, colmax;
};

void TargetComputer::Observer::after_attention(const LayerStep& st, KvCache& cache) {
  const ModelConfig& c = tc.model_.config();
  const int64_t D = c.head_dim, H = c.n_head, Hkv = c.n_head_kv, G = c.n_group(), E = c.n_embd;
  const int l = st.layer;
  const int64_t T = p.end_rep, n_text = p.n_text(), n_rep = p.end_rep - p.start_rep;
  if (st.n_tok != T || st.pos[0] != 0) throw Error("internal: KVzip+ targets need the whole prompt in one step");

  inv_hnorm.resize((size_t)n_rep);
  inverse_row_norms(st.h + p.start_rep * E, n_rep, E, inv_hnorm.data());
  kt.resize((size_t)(D * T));
  vnorm.resize((size_t)(G * n_text));
  colmax.resize((size_t)n_text);
  for (int64_t hk = 0; hk < Hkv; hk++) {
    transpose_rows(st.k + hk * D, Hkv * D, T, D, kt.data());  // keys of every position, [D][T]
    const float* v0 = st.v + p.start_prompt * Hkv * D + hk * D;
    pool.parallel_for(G, [&](int64_t g, int) {
      tc.norms_.norms(l, (int)(hk * G + g), v0, Hkv * D, n_text, &vnorm[(size_t)(g * n_text)]);
    });
    ColumnMaxProblem pr;
    pr.q = st.q + p.start_rep * H * D + hk * G * D;
    pr.q_row_stride = H * D;
    pr.q_head_stride = D;
    pr.n_rows = n_rep;
    pr.n_group = (int)G;
    pr.head_dim = (int)D;
    pr.keys_t = kt.data();
    pr.n_keys = T;
    pr.visible0 = p.start_rep + 1;  // row j (position start_rep + j) sees keys 0 .. start_rep + j
    pr.col0 = p.start_prompt;
    pr.n_cols = n_text;
    pr.row_scale = inv_hnorm.data();
    pr.col_scale = vnorm.data();
    pr.logit_scale = c.query_scale();
    attention_column_max(pr, pool, tc.ws_, colmax.data());
    float* dst = &out.log_scores[(size_t)((l * Hkv + hk) * n_text)];
    for (int64_t i = 0; i < n_text; i++) dst[i] = std::log(std::max(colmax[(size_t)i], 1e-30f));
  }
  for (size_t si = 0; si < out.sample.size(); si++) {
    const float* h = st.h + (p.start_prompt + out.sample[si]) * E;
    std::copy(h, h + E, &out.x[(si * c.n_layer + (size_t)l) * (size_t)E]);
  }
}

TargetComputer::TargetComputer(const Model& model) : model_(model), norms_(model) {}

WindowTargets TargetComputer::compute(Session& session, const RepeatPrompt& p, const std::vector<int64_t>& sample) {
  const ModelConfig& c = model_.config();
  const int64_t T = p.end_rep;
  if (p.n_text() <= 0 || p.end_rep <= p.start_rep || p.start_rep < p.end_prompt || T > (int64_t)p.ids.size())
    throw Error("internal: malformed repeat prompt");
  if (T > session.n_ctx() || T > session.forward().max_batch())
    throw Error("KVzip+ targets need the whole prompt (" + std::to_string(T) + " tokens) in one step; the session holds " +
                std::to_string(session.n_ctx()) + " tokens, " + std::to_string(session.forward().max_batch()) + " per step");
  for (int64_t s : sample)
    if (s < 0 || s >= p.n_text()) throw Error("internal: sampled position out of range");
  WindowTargets out;
  out.n_text = p.n_text();
  out.n_layer = c.n_layer;
  out.n_head_kv = c.n_head_kv;
  out.n_embd = c.n_embd;
  out.log_scores.assign((size_t)c.n_layer * c.n_head_kv * out.n_text, 0.0f);
  out.sample = sample;
  out.x.assign(sample.size() * c.n_layer * c.n_embd, 0.0f);
  session.reset();
  Observer obs(*this, p, out, session.forward().pool());
  session.forward().run(p.ids.data(), T, session.cache(), LogitsMode::None, nullptr, &obs);
  session.reset();
  return out;
}

// ---------------------------------------------------------------- windows

std::vector<std::string> read_file_list(const std::string& list_file) {
  namespace fs = std::filesystem;
  std::ifstream in(list_file);
  if (!in) throw Error(list_file + ": cannot open file list");
  const fs::path base = fs::path(list_file).parent_path();
  std::vector<std::string> out;
  std::string line;
  while (std::getline(in, line)) {
    line = strip_text(line);
    if (line.empty() || line[0] == '#') continue;
    const fs::path p(line);
    out.push_back((p.is_absolute() ? p : base / p).string());
  }
  if (out.empty()) throw Error(list_file + ": lists no files");
  return out;
}

namespace {

std::string read_whole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot open file");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> lines;
  size_t b = 0;
  while (b <= s.size()) {
    size_t e = s.find('\n', b);
    if (e == std::string::npos) e = s.size();
    lines.push_back(s.substr(b, e - b));
    b = e + 1;
  }
  return lines;
}

bool is_blank(const std::string& line) { return strip_text(line).empty(); }

std::string join_lines(const std::vector<std::string>& lines, size_t a, size_t b) {
  std::string s;
  for (size_t i = a; i < b; i++) {
    s += lines[i];
    if (i + 1 < b) s += '\n';
  }
  return strip_text(s);
}

// One window from a document: a paragraph start and a length target from `rng`, then lines added or
// removed until the exact token count is in range. Returns false when no start works.
bool cut_one(const Tokenizer& tok, const std::string& text, const WindowOptions& opt, uint64_t rng_seed, TextWindow& w) {
  if (!is_valid_utf8(text)) return false;
  const std::vector<std::string> lines = split_lines(text);
  const size_t nl = lines.size();
  std::vector<int64_t> approx(nl);  // tokens per line (+1 for its newline)
  for (size_t i = 0; i < nl; i++) approx[i] = (int64_t)tok.encode(lines[i], false, true).size() + 1;
  std::vector<int64_t> cum(nl + 1, 0);
  for (size_t i = 0; i < nl; i++) cum[i + 1] = cum[i] + approx[i];
  std::vector<size_t> starts;
  for (size_t i = 0; i < nl; i++)
    if (!is_blank(lines[i]) && (i == 0 || is_blank(lines[i - 1])) && cum[nl] - cum[i] >= opt.min_tokens) starts.push_back(i);
  if (starts.empty()) return false;
  uint64_t s = rng_seed;
  const int64_t target = opt.min_tokens + (int64_t)below(s, (uint64_t)(opt.max_tokens - opt.min_tokens + 1));
  // Try starts in a seeded order; a few attempts are enough (most starts work).
  for (size_t attempt = 0; attempt < std::min<size_t>(starts.size(), 8); attempt++) {
    const size_t k = attempt + (size_t)below(s, (uint64_t)(starts.size() - attempt));
    std::swap(starts[attempt], starts[k]);
    const size_t a = starts[attempt];
    size_t b = a + 1;
    while (b < nl && cum[b] - cum[a] < target) b++;
    auto count = [&](size_t end) { return (int64_t)tok.encode(join_lines(lines, a, end), false, true).size(); };
    int64_t n = count(b);
    while (n > opt.max_tokens && b > a + 1) n = count(--b);
    while (n < opt.min_tokens && b < nl) n = count(++b);
    if (n < opt.min_tokens || n > opt.max_tokens) continue;
    w.text = join_lines(lines, a, b);
    w.n_tokens = n;
    w.first_line = (int64_t)a;
    return true;
  }
  return false;
}

}  // namespace

std::vector<TextWindow> cut_windows(const Tokenizer& tok, const std::vector<std::string>& docs, int64_t count,
                                    const WindowOptions& opt) {
  namespace fs = std::filesystem;
  if (opt.min_tokens <= 0 || opt.max_tokens < opt.min_tokens)
    throw Error("window lengths must satisfy 0 < min <= max, got " + std::to_string(opt.min_tokens) + ".." +
                std::to_string(opt.max_tokens));
  std::map<std::string, std::vector<std::string>> by_source;
  for (const std::string& d : docs) by_source[fs::path(d).parent_path().filename().string()].push_back(d);
  std::vector<std::pair<std::string, std::vector<std::string>>> sources(by_source.begin(), by_source.end());
  for (auto& [name, list] : sources) {
    uint64_t s = mix_seed(opt.seed, hash_string(name));
    for (size_t i = list.size(); i > 1; i--) std::swap(list[i - 1], list[(size_t)below(s, i)]);
  }
  std::vector<TextWindow> out;
  for (size_t round = 0; (int64_t)out.size() < count; round++) {
    bool any = false;
    for (auto& [name, list] : sources) {
      if ((int64_t)out.size() >= count) break;
      if (round >= list.size()) continue;
      any = true;
      const std::string& doc = list[round];
      TextWindow w;
      if (!cut_one(tok, read_whole(doc), opt, mix_seed(opt.seed, hash_string(fs::path(doc).filename().string())), w))
        continue;
      w.id = (uint32_t)out.size();
      w.doc = doc;
      w.source = name;
      out.push_back(std::move(w));
    }
    if (!any) break;
  }
  return out;
}

// ---------------------------------------------------------------- collection

namespace {

void check_settings(const std::string& path, const std::string& settings) {
  namespace fs = std::filesystem;
  const std::string side = path + ".json";
  std::error_code ec;
  if (fs::exists(side, ec)) {
    const std::string old = read_whole(side);
    if (strip_text(old) != strip_text(settings))
      throw Error(path + " was collected with different settings (see " + side +
                  "); use another --out or delete both files");
    return;
  }
  // Atomically: a torn sidecar would make every rerun refuse the dataset as "different settings".
  write_file_atomic(side, settings + "\n");
}

}  // namespace

CollectReport collect_targets(Session& session, TargetComputer& targets, const std::vector<TextWindow>& windows,
                              const std::string& out_path, const CollectOptions& opt, const CollectCallback& callback) {
  const Model& model = session.model();
  const ModelConfig& c = model.config();
  if (opt.tokens_per_window <= 0) throw Error("tokens per window must be positive");
  for (size_t i = 1; i < windows.size(); i++)
    if (windows[i].id <= windows[i - 1].id) throw Error("internal: windows must come in increasing id order");
  DatasetShape shape;
  shape.n_layers = c.n_layer;
  shape.d_model = c.n_embd;
  shape.n_heads = c.n_head_kv;
  shape.x_dtype = opt.x_dtype;
  if (!opt.settings.empty()) check_settings(out_path, opt.settings);
  DatasetWriter writer = DatasetWriter::open_append(out_path, shape);

  CollectReport rep;
  rep.windows_total = (int64_t)windows.size();
  size_t next = 0;  // first window to compute
  if (writer.size() > 0) {
    const uint32_t last = *writer.last_group();
    const auto it = std::find_if(windows.begin(), windows.end(), [&](const TextWindow& w) { return w.id == last; });
    if (it == windows.end())
      throw Error(out_path + " holds window " + std::to_string(last) + ", which these settings do not produce");
    const int64_t expected = std::min(opt.tokens_per_window, it->n_tokens);
    next = (size_t)(it - windows.begin());
    if (writer.last_group_count() == expected) {
      next++;
    } else {
      writer.drop_last_group();  // interrupted while writing that window
      writer.flush();
      rep.dropped_partial = true;
    }
  }
  rep.windows_resumed = (int64_t)next;
  rep.windows_done = (int64_t)next;
  rep.records = writer.size();

  if (callback) {  // the start event: window == nullptr, windows_done = already complete
    CollectEvent ev;
    ev.windows_done = rep.windows_done;
    ev.windows_total = rep.windows_total;
    ev.records = rep.records;
    if (!callback(ev)) {
      rep.stopped = next < windows.size();
      return rep;
    }
  }
  const int64_t L = c.n_layer, H = c.n_head_kv, E = c.n_embd;
  std::vector<float> y((size_t)(L * H));
  for (size_t wi = next; wi < windows.size(); wi++) {
    const TextWindow& w = windows[wi];
    CollectEvent ev;
    ev.window = &w;
    // A text that does not tokenise cleanly inside the template is passed over (deterministically, so
    // a resumed run passes over it again); anything else is a real error.
    RepeatPrompt p;
    std::vector<int64_t> sample;
    try {
      p = build_repeat_prompt(model.tokenizer(), w.text);
      sample = sample_positions(p.n_text(), opt.tokens_per_window, mix_seed(opt.seed, w.id));
      if ((int64_t)sample.size() != std::min(opt.tokens_per_window, w.n_tokens))
        throw Error("the text has " + std::to_string(p.n_text()) + " tokens in the template but " +
                    std::to_string(w.n_tokens) + " alone");
    } catch (const Error& e) {
      ev.skipped = true;
      ev.note = e.what();
      rep.windows_skipped++;
    }
    if (!ev.skipped) {
      const WindowTargets t = targets.compute(session, p, sample);
      for (size_t si = 0; si < sample.size(); si++) {
        for (int64_t l = 0; l < L; l++)
          for (int64_t h = 0; h < H; h++) y[(size_t)(l * H + h)] = t.log_score((int)l, (int)h, sample[si]);
        writer.append(w.id, (uint32_t)sample[si], &t.x[si * (size_t)(L * E)], y.data());
      }
      writer.flush();
    }
    rep.windows_done++;
    rep.records = writer.size();
    ev.windows_done = rep.windows_done;
    ev.windows_total = rep.windows_total;
    ev.records = rep.records;
    if (callback && !callback(ev)) {
      rep.stopped = wi + 1 < windows.size();
      break;
    }
  }
  writer.flush();
  return rep;
}

}  // namespace kvzap
