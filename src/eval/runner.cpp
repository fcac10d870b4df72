#include "eval/runner.h"

#include "common/atomic_file.h"
#include "common/json_file.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string_view>
#include <unordered_map>

#include "chat/chat_template.h"
#include "common/rng.h"
#include "engine/context_recording.h"
#include "kvzap/error.h"
#include "model/model.h"
#include "press/policy.h"

namespace kvzap::eval {

namespace fs = std::filesystem;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

std::string dump(const nlohmann::json& j, int indent = -1) {
  return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

// Writes via a temporary file and a rename, so a reader (or a resumed sweep) never sees half a file.
void write_file_atomically(const std::string& path, const std::string& text) { write_file_atomic(path, text); }


std::string short_status(const SampleOutcome& o) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "%s#%lld %.0f", o.task.c_str(), (long long)o.index, o.score);
  return buf;
}

const ScorerEntry* find_scorer(const std::string& name) {
  for (const ScorerEntry& e : scorer_registry())
    if (e.name == name) return &e;
  return nullptr;
}

}  // namespace

// ----------------------------------------------------------------------------------------------
// Prompts.

PromptBuilder::PromptBuilder(ChatPrompt prompt) : tok_(prompt.tokenizer()), prompt_(std::move(prompt)) {
  ChatOptions o;
  o.add_generation_prompt = true;
  o.enable_thinking = false;
  const ChatPrompt::UserTurn turn = prompt_.user_turn(o);
  prefix_ = turn.prefix;
  suffix_ = turn.suffix;
}

PromptBuilder::PromptBuilder(const Tokenizer& tok, ChatFormat fmt) : PromptBuilder(ChatPrompt(tok, fmt)) {}

PromptBuilder::PromptBuilder(const Tokenizer& tok) : PromptBuilder(ChatPrompt(tok)) {}

std::vector<int32_t> PromptBuilder::context_ids(const std::string& context) const {
  return prompt_.encode(prefix_ + context);
}

std::vector<int32_t> PromptBuilder::question_ids(const std::string& question, const std::string& answer_prefix) const {
  return tok_.encode(question + suffix_ + answer_prefix, false);
}

TokenCounter PromptBuilder::counter() const {
  const Tokenizer* t = &tok_;
  const auto prompt = std::make_shared<const ChatPrompt>(prompt_);
  const std::string prefix = prefix_, suffix = suffix_;
  return [t, prompt, prefix, suffix](const std::string& context, const std::string& question) {
    return (int64_t)(prompt->encode(prefix + context).size() + t->encode(question + suffix, false).size());
  };
}

// ----------------------------------------------------------------------------------------------
// Outcomes.

nlohmann::json outcome_to_json(const SampleOutcome& o) {
  return {{"task", o.task},
          {"index", o.index},
          {"prediction", o.prediction},
          {"answers", o.answers},
          {"score", o.score},
          {"evicted_fraction", o.evicted_fraction},
          {"kv_bytes", o.kv_bytes},
          {"kv_bytes_full", o.kv_bytes_full},
          {"evicted_fraction_end", o.evicted_fraction_end},
          {"kv_bytes_end", o.kv_bytes_end},
          {"kv_bytes_full_end", o.kv_bytes_full_end},
          {"context_tokens", o.context_tokens},
          {"question_tokens", o.question_tokens},
          {"generated_tokens", o.generated_tokens},
          {"stop_reason", o.stop_reason},
          {"context_reused", o.context_reused},
          {"depths", o.depths},
          {"timings",
           {{"context_s", o.context_seconds},
            {"question_s", o.question_seconds},
            {"decode_s", o.decode_seconds},
            {"shared_prefill_s", o.shared_prefill_seconds}}}};
}

SampleOutcome outcome_from_json(const nlohmann::json& j) {
  SampleOutcome o;
  try {
    o.task = j.at("task").get<std::string>();
    o.index = j.at("index").get<int64_t>();
    o.prediction = j.at("prediction").get<std::string>();
    o.answers = j.at("answers").get<std::vector<std::string>>();
    o.score = j.at("score").get<double>();
    o.evicted_fraction = j.at("evicted_fraction").get<double>();
    o.kv_bytes = j.at("kv_bytes").get<int64_t>();
    o.kv_bytes_full = j.at("kv_bytes_full").get<int64_t>();
    o.evicted_fraction_end = j.value("evicted_fraction_end", o.evicted_fraction);
    o.kv_bytes_end = j.value("kv_bytes_end", o.kv_bytes);
    o.kv_bytes_full_end = j.value("kv_bytes_full_end", o.kv_bytes_full);
    o.context_tokens = j.at("context_tokens").get<int64_t>();
    o.question_tokens = j.value("question_tokens", (int64_t)0);
    o.generated_tokens = j.value("generated_tokens", (int64_t)0);
    o.stop_reason = j.value("stop_reason", std::string());
    o.context_reused = j.value("context_reused", false);
    o.depths = j.value("depths", std::vector<double>());
    if (j.contains("timings")) {
      const auto& t = j["timings"];
      o.context_seconds = t.value("context_s", 0.0);
      o.question_seconds = t.value("question_s", 0.0);
      o.decode_seconds = t.value("decode_s", 0.0);
      o.shared_prefill_seconds = t.value("shared_prefill_s", 0.0);
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error("sample outcome: " + std::string(e.what()));
  }
  return o;
}

// ----------------------------------------------------------------------------------------------
// Running samples.

namespace {

// Groups of sample indices sharing a context, in order of first appearance.
std::vector<std::vector<size_t>> context_groups(const std::vector<Sample>& samples) {
  std::vector<std::vector<size_t>> groups;
  std::unordered_map<std::string_view, size_t> group_of;
  for (size_t i = 0; i < samples.size(); i++) {
    auto [it, fresh] = group_of.emplace(samples[i].context, groups.size());
    if (fresh) groups.emplace_back();
    groups[it->second].push_back(i);
  }
  return groups;
}

// The tokens of a context group's questions; throws kvzap::Error when a sample does not fit n_ctx.
std::vector<std::vector<int32_t>> group_questions(const PromptBuilder& prompts, const std::vector<Sample>& samples,
                                                  const std::vector<size_t>& group, int64_t context_tokens,
                                                  int64_t n_ctx) {
  std::vector<std::vector<int32_t>> questions;
  for (size_t i : group) {
    const Sample& s = samples[i];
    questions.push_back(prompts.question_ids(s.question, s.answer_prefix));
    const int64_t need = context_tokens + (int64_t)questions.back().size() + s.max_new_tokens;
    if (need > n_ctx)
      throw Error("sample " + s.task + "#" + std::to_string(s.meta.index) + " needs " + std::to_string(need) +
                  " tokens (context, question, answer), more than the context size of " + std::to_string(n_ctx) +
                  " (raise -c)");
  }
  return questions;
}

// Answers one sample greedily on its own copy-on-write fork of the compressed context (pruning while
// answering one question, a decoding press, cannot change what the next one sees). The caller fills in
// the timings of the context and whether it was reused.
SampleOutcome answer_on_fork(const Sequence& compressed, const Sample& s, const std::vector<int32_t>& question,
                             const Tokenizer& tok, int64_t context_tokens) {
  std::unique_ptr<Sequence> fork = compressed.fork();
  GenerateOptions g;
  g.max_new_tokens = s.max_new_tokens;
  g.sampling.temperature = 0;  // greedy, as kvpress
  const GenerateResult r = Session::generate_on(*fork, question, g);
  SampleOutcome o;
  o.task = s.task;
  o.index = s.meta.index;
  o.prediction = tok.decode(r.tokens, /*skip_special=*/true);
  o.answers = s.answers;
  o.score = score_sample(s.metric, o.prediction, s.answers);
  o.evicted_fraction = compressed.cache().evicted_fraction();
  o.kv_bytes = compressed.cache().bytes_resident();
  o.kv_bytes_full = compressed.cache().bytes_full();
  o.evicted_fraction_end = fork->cache().evicted_fraction();
  o.kv_bytes_end = fork->cache().bytes_resident();
  o.kv_bytes_full_end = fork->cache().bytes_full();
  o.context_tokens = context_tokens;
  o.question_tokens = (int64_t)question.size();
  o.generated_tokens = (int64_t)r.tokens.size();
  o.stop_reason = r.stop_reason;
  o.question_seconds = r.prefill_seconds;
  o.decode_seconds = r.decode_seconds;
  o.depths = s.meta.depths;
  return o;
}

}  // namespace


std::vector<SampleOutcome> run_samples(Session& session, Press* press, const PromptBuilder& prompts,
                                       const std::vector<Sample>& samples, const RunOptions& opt) {
  std::unique_ptr<Progress> own;
  Progress* progress = opt.progress;
  if (!progress) {
    own = std::make_unique<Progress>(opt.label, (int64_t)samples.size(), "sample", 0, opt.quiet ? nullptr : stderr);
    progress = own.get();
  }

  const Tokenizer& tok = session.model().tokenizer();
  std::vector<SampleOutcome> out(samples.size());
  for (const auto& group : context_groups(samples)) {
    const std::vector<int32_t> ctx = prompts.context_ids(samples[group.front()].context);
    const auto questions = group_questions(prompts, samples, group, (int64_t)ctx.size(), session.n_ctx());

    const auto t0 = std::chrono::steady_clock::now();
    session.prefill_context(ctx, press);
    const double context_seconds = seconds_since(t0);

    for (size_t k = 0; k < group.size(); k++) {
      SampleOutcome& o = out[group[k]];
      o = answer_on_fork(session.sequence(), samples[group[k]], questions[k], tok, (int64_t)ctx.size());
      o.context_reused = k > 0;
      o.context_seconds = k == 0 ? context_seconds : 0.0;
      if (opt.on_sample) opt.on_sample(o);
      progress->add(1, (opt.progress ? opt.label + " " : "") + short_status(o));
    }
  }
  if (own) own->finish();
  return out;
}

// ----------------------------------------------------------------------------------------------
// Cells.

std::string kvpress_ratio_scope(const std::string& press) { return press_traits(press).kvpress_ratio_scope; }

std::string press_label(const PressSpec* p) {
  if (!p || p->name.empty()) return "no_press";
  std::string s = p->name;
  if (p->decoding) s += "+decoding";
  if (p->has_ratio && p->ratio_scope != kvpress_ratio_scope(p->name)) s += "@" + p->ratio_scope;
  return s;
}

std::string setting_kind(const PressSpec* p) {
  if (!p || p->name.empty()) return "none";
  return p->has_threshold ? "threshold" : "ratio";
}

double setting_value(const PressSpec* p) {
  if (!p || p->name.empty()) return 0;
  return p->has_threshold ? p->threshold : p->ratio;
}

std::string cell_dir_name(const PressSpec* p) {
  if (!p || p->name.empty()) return "no_press";
  return press_label(p) + "__" + setting_kind(p) + "_" + number(setting_value(p));
}

bool cell_finished(const std::string& cell_dir) {
  std::error_code ec;
  return fs::exists(fs::path(cell_dir) / "summary.json", ec);
}

namespace {

// Writes a cell's tasks.csv, tasks.json and, last, summary.json from its outcomes (in the order of its
// samples). shared_prefill: the outcomes came from a sweep that prefilled each context once for all
// cells (their context_s is this press's replay and compression only).
CellResult finish_cell(const EvalSetup& setup, const PressSpec* p, const fs::path& dir,
                       std::vector<SampleOutcome> outcomes, double wall, bool shared_prefill) {
  CellResult cell;
  cell.outcomes = std::move(outcomes);
  std::vector<SampleResult> results;
  double kv_bytes = 0, kv_full = 0, ctx_tokens = 0, ctx_s = 0, q_s = 0, dec_s = 0, gen = 0, evicted_end = 0,
         prefill_s = 0;
  for (const SampleOutcome& o : cell.outcomes) {
    results.push_back({o.task, o.score, o.evicted_fraction});
    kv_bytes += (double)o.kv_bytes;
    kv_full += (double)o.kv_bytes_full;
    ctx_tokens += (double)o.context_tokens;
    ctx_s += o.context_seconds;
    q_s += o.question_seconds;
    dec_s += o.decode_seconds;
    prefill_s += o.shared_prefill_seconds;
    gen += (double)o.generated_tokens;
    evicted_end += o.evicted_fraction_end;
  }
  const double n = std::max<double>(1.0, (double)cell.outcomes.size());
  cell.tasks = aggregate_by_task(results);
  cell.rows = rows_from_task_scores(press_label(p), setting_kind(p), setting_value(p), cell.tasks);
  write_results((dir / "tasks.csv").string(), cell.rows);
  write_results((dir / "tasks.json").string(), cell.rows);

  double evicted = 0;
  for (const SampleResult& r : results) evicted += r.evicted_fraction;
  nlohmann::json tasks = nlohmann::json::array();
  for (const TaskScore& t : cell.tasks)
    tasks.push_back({{"task", t.task},
                     {"n", t.n},
                     {"score", t.score},
                     {"stderr", t.stderr_score},
                     {"evicted_fraction", t.evicted_fraction}});
  nlohmann::json& s = cell.summary;
  s["press"] = press_label(p);
  s["press_name"] = p ? p->name : "none";
  s["setting_kind"] = setting_kind(p);
  s["setting"] = setting_value(p);
  if (p) {
    s["press_spec"] = press_spec_to_json(*p);  // every setting of the cell, as every front end reads it
    s["press_key"] = press_spec_key(p);
  }
  s["suite"] = setup.suite;
  s["n_samples"] = cell.outcomes.size();
  s["average"] = suite_average(cell.tasks);
  s["evicted_fraction"] = evicted / n;
  s["evicted_fraction_end"] = evicted_end / n;
  s["kv_bytes_mean"] = kv_bytes / n;
  s["kv_bytes_full_mean"] = kv_full / n;
  s["context_tokens_mean"] = ctx_tokens / n;
  s["generated_tokens_mean"] = gen / n;
  s["threads"] = setup.session.n_threads();
  // wall_s: this cell's own time. With a shared prefill, shared_prefill_s is the time of the prefills it
  // used, which every cell that shared them counts too.
  s["prefill"] = shared_prefill ? "shared" : "per_cell";
  s["timings"] = {{"wall_s", wall}, {"context_s", ctx_s}, {"question_s", q_s}, {"decode_s", dec_s}};
  if (shared_prefill) s["timings"]["shared_prefill_s"] = prefill_s;
  s["tasks"] = tasks;
  write_file_atomically((dir / "summary.json").string(), dump(s, 2) + "\n");
  return cell;
}

}  // namespace

CellResult run_cell(const EvalSetup& setup, const PressSpec* press_opt, const std::string& out_dir,
                    const RunOptions& opt) {
  const PressSpec* p = press_opt && !press_opt->name.empty() ? press_opt : nullptr;
  std::unique_ptr<Press> press = p ? make_press(*p, setup.model) : nullptr;

  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) throw Error(out_dir + ": cannot create folder: " + ec.message());
  const fs::path dir(out_dir);
  fs::remove(dir / "summary.json", ec);  // a rerun is unfinished until it ends

  const std::string samples_path = (dir / "samples.jsonl").string();
  std::ofstream samples_out(samples_path, std::ios::binary | std::ios::trunc);
  if (!samples_out) throw Error(samples_path + ": cannot open for writing");

  RunOptions run = opt;
  run.on_sample = [&](const SampleOutcome& o) {
    samples_out << dump(outcome_to_json(o)) << '\n';
    samples_out.flush();
    if (opt.on_sample) opt.on_sample(o);
  };
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<SampleOutcome> outcomes = run_samples(setup.session, press.get(), setup.prompts, setup.samples, run);
  const double wall = seconds_since(t0);
  samples_out.close();
  return finish_cell(setup, p, dir, std::move(outcomes), wall, /*shared_prefill=*/false);
}

// ----------------------------------------------------------------------------------------------
// Sweeps.

std::vector<PressSpec> plan_sweep(const std::vector<std::string>& presses, const std::vector<double>& ratios,
                                     const std::vector<double>& thresholds, const PressSpec& base,
                                     bool include_full_cache) {
  std::vector<PressSpec> cells;
  if (include_full_cache) cells.push_back(PressSpec{});
  for (const std::string& spec : presses) {
    std::string name = spec, forced, scope = base.ratio_scope;
    if (const size_t at = name.rfind('@'); at != std::string::npos) {
      scope = name.substr(at + 1);
      name = name.substr(0, at);
    }
    if (const size_t colon = name.rfind(':'); colon != std::string::npos) {
      forced = name.substr(colon + 1);
      name = name.substr(0, colon);
      if (forced != "ratio" && forced != "threshold")
        throw Error("press '" + spec + "': the policy after ':' must be 'ratio' or 'threshold'");
    }
    bool decoding = base.decoding;
    if (const std::string suffix = "+decoding"; name.size() > suffix.size() && name.ends_with(suffix)) {
      decoding = true;  // this press prunes while decoding, whatever base says (the cell's label says so too)
      name.resize(name.size() - suffix.size());
    }
    if (name == "none" || name == "no_press") continue;  // the full-cache cell is separate
    const ScorerEntry* e = find_scorer(name);
    // dms_<press> (kvpress DMSPress): any press by threshold, never by ratio (make_press says why).
    const bool dms = !e && is_dms_name(name) && find_press_entry(name);
    if (dms) e = find_press_entry(name);
    if (!e) throw Error("unknown press '" + name + "' (see `kvzap presses`)");
    const bool takes_threshold = e->supports_threshold || dms;
    bool by_threshold = takes_threshold && press_traits(name).threshold_by_default;
    if (forced == "threshold") {
      if (!takes_threshold) throw Error("press '" + name + "' cannot use a threshold");
      by_threshold = true;
    } else if (forced == "ratio") {
      by_threshold = false;
    }
    if (decoding && !by_threshold && decoding != base.decoding)
      throw Error("press '" + spec + "': +decoding needs the threshold policy");
    const std::vector<double>& settings = by_threshold ? thresholds : ratios;
    if (settings.empty())
      throw Error("press '" + name + "' runs by " + (by_threshold ? "threshold" : "ratio") + " but no --" +
                  (by_threshold ? "thresholds" : "ratios") + " were given");
    for (double v : settings) {
      PressSpec o = base;
      o.name = name;
      o.has_threshold = by_threshold;
      o.has_ratio = !by_threshold;
      o.threshold = by_threshold ? v : 0;
      o.ratio = by_threshold ? 0 : v;
      o.decoding = decoding;
      o.ratio_scope = scope == "kvpress" ? kvpress_ratio_scope(name) : scope;
      parse_ratio_scope(o.ratio_scope);       // fail on a typo before anything runs
      if (!by_threshold) o.decoding = false, o.prefill_evict_every = 0;  // both are the threshold policy's
      if (judges_whole_contexts(o)) o.prefill_evict_every = 0;  // dms_<context press>: judged once prefilled
      const std::string dir = cell_dir_name(&o);
      bool dup = false;
      for (const PressSpec& c : cells) dup = dup || (!c.name.empty() && cell_dir_name(&c) == dir);
      if (!dup) cells.push_back(o);
    }
  }
  return cells;
}

namespace {

// One unfinished cell of a shared-prefill sweep.
struct SharedCell {
  size_t index = 0;                 // in the grid
  const PressSpec* press_opt = nullptr;
  fs::path dir;
  std::unique_ptr<Press> press;
  std::vector<size_t> samples;      // its samples (indices into setup.samples), in order
  std::vector<int64_t> slot_of;     // [setup.samples] position in `samples`, -1 = not this cell's
  std::vector<SampleOutcome> outcomes;  // [samples]
  std::vector<bool> have;               // [samples]
  int64_t missing = 0;
  double wall = 0;
  std::ofstream out;
};

// Reads the outcomes an interrupted run left in the cell's samples.jsonl (those of its samples, whose
// answers match; a torn last line is dropped), rewrites the file with just them, and opens it for
// appending. The cell's cell.json must name this suite, else the file is not trusted: a different
// suite throws, no cell.json (a cell-by-cell run's leftovers) starts the cell afresh.
void resume_cell(SharedCell& cell, const EvalSetup& setup) {
  std::error_code ec;
  fs::create_directories(cell.dir, ec);
  if (ec) throw Error(cell.dir.string() + ": cannot create folder: " + ec.message());
  const fs::path marker = cell.dir / "cell.json", samples_path = cell.dir / "samples.jsonl";
  std::string kept;
  if (fs::exists(marker, ec) && fs::exists(samples_path, ec)) {
    const nlohmann::json m = read_json_file(marker.string());
    if (!m.contains("suite") || m["suite"] != setup.suite)
      throw Error(cell.dir.string() + " holds samples of a different suite; use another --out folder or delete it");
    std::ifstream in(samples_path, std::ios::binary);
    std::stringstream buf;
    buf << in.rdbuf();
    const std::string text = buf.str();
    size_t at = 0;
    while (at < text.size()) {
      const size_t nl = text.find('\n', at);
      if (nl == std::string::npos) break;  // a torn last line: its sample runs again
      const std::string line = text.substr(at, nl - at);
      at = nl + 1;
      if (line.empty()) continue;
      SampleOutcome o;
      try {
        o = outcome_from_json(nlohmann::json::parse(line));
      } catch (const std::exception& e) {
        throw Error(samples_path.string() + ": unreadable line (" + e.what() + "); delete the cell's folder to rerun it");
      }
      for (size_t k = 0; k < cell.samples.size(); k++) {
        const Sample& smp = setup.samples[cell.samples[k]];
        if (cell.have[k] || smp.task != o.task || smp.meta.index != o.index) continue;
        if (smp.answers != o.answers)
          throw Error(samples_path.string() + ": sample " + o.task + "#" + std::to_string(o.index) +
                      " has other answers than the suite's; delete the cell's folder to rerun it");
        cell.outcomes[k] = o;
        cell.have[k] = true;
        cell.missing--;
        kept += line + '\n';
        break;
      }
    }
  }
  write_file_atomically(samples_path.string(), kept);
  write_file_atomically(marker.string(), dump({{"suite", setup.suite}, {"cell", cell_dir_name(cell.press_opt)}}, 2) + "\n");
  cell.out.open(samples_path, std::ios::binary | std::ios::app);
  if (!cell.out) throw Error(samples_path.string() + ": cannot open for writing");
}

}  // namespace

SweepResult run_sweep(const EvalSetup& setup, const std::vector<PressSpec>& cells, const std::string& out_dir,
                      const RunOptions& opt, int shard_index, int shard_count) {
  const auto t0 = std::chrono::steady_clock::now();
  if (shard_count < 1 || shard_index < 0 || shard_index >= shard_count)
    throw Error("invalid shard " + std::to_string(shard_index) + "/" + std::to_string(shard_count) +
                " (expected i/n with 0 <= i < n)");
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) throw Error(out_dir + ": cannot create folder: " + ec.message());
  const fs::path shard_file = fs::path(out_dir) / "shard.json";
  if (shard_count > 1) {
    const nlohmann::json want = {
        {"index", shard_index}, {"count", shard_count}, {"unit", "context"}, {"suite", setup.suite}};
    if (fs::exists(shard_file, ec) && read_json_file(shard_file.string()) != want)
      throw Error(out_dir + " holds another shard or suite; use another --out folder");
    write_file_atomically(shard_file.string(), dump(want, 2) + "\n");
  } else if (fs::exists(shard_file, ec)) {
    throw Error(out_dir + " is a shard folder; an unsharded sweep needs another --out folder");
  }
  // This shard's samples of each cell (indices into setup.samples): the samples of every
  // shard_count-th context, under every cell, so that a context is prefilled on one shard only.
  std::vector<bool> in_shard(setup.samples.size(), false);
  {
    const std::vector<std::vector<size_t>> groups = context_groups(setup.samples);
    for (size_t g = 0; g < groups.size(); g++)
      if ((int64_t)(g % (size_t)shard_count) == shard_index)
        for (size_t i : groups[g]) in_shard[i] = true;
  }
  std::vector<std::vector<size_t>> cell_samples(cells.size());
  for (size_t c = 0; c < cells.size(); c++)
    for (size_t i = 0; i < setup.samples.size(); i++)
      if (in_shard[i]) cell_samples[c].push_back(i);

  // Check every finished cell before running anything, so a mismatch fails fast.
  std::vector<bool> done(cells.size(), false);
  for (size_t c = 0; c < cells.size(); c++) {
    const fs::path dir = fs::path(out_dir) / cell_dir_name(&cells[c]);
    if (!cell_finished(dir.string())) continue;
    const nlohmann::json summary = read_json_file((dir / "summary.json").string());
    if (!summary.contains("suite") || summary["suite"] != setup.suite)
      throw Error(dir.string() +
                  " was finished with a different suite (length, samples, seed, tasks or data); "
                  "use another --out folder or delete it");
    done[c] = true;
  }

  int64_t total = 0, finished_samples = 0;
  for (size_t c = 0; c < cells.size(); c++) {
    total += (int64_t)cell_samples[c].size();
    if (done[c]) finished_samples += (int64_t)cell_samples[c].size();
  }
  Progress overall("sweep", total, "sample", finished_samples, opt.quiet ? nullptr : stderr);
  SweepResult result;
  std::vector<std::vector<ResultRow>> cell_rows(cells.size());  // results.csv keeps the grid's order
  auto cell_label = [&](size_t c) {
    char head[48];
    std::snprintf(head, sizeof head, "[%zu/%zu ", c + 1, cells.size());
    return std::string(head) + cell_dir_name(&cells[c]) + "]";
  };
  auto report_cell = [&](size_t c, const CellResult& cell, double seconds) {
    result.cells_run++;
    cell_rows[c] = cell.rows;
    if (!opt.quiet)
      std::fprintf(stderr, "%s%s: average %.2f, evicted %.3f (%s)\n", overall.is_tty() ? "\r\033[K" : "",
                   cell_label(c).c_str(), cell.summary["average"].get<double>(),
                   cell.summary["evicted_fraction"].get<double>(), format_duration(seconds).c_str());
  };
  std::vector<size_t> to_run;
  for (size_t c = 0; c < cells.size(); c++) {
    if (cell_samples[c].empty()) continue;  // none of this cell's samples belong to this shard
    if (done[c]) {
      result.cells_skipped++;
      cell_rows[c] = read_results((fs::path(out_dir) / cell_dir_name(&cells[c]) / "tasks.csv").string());
    } else {
      to_run.push_back(c);
    }
  }

  bool share = opt.share_prefill && !to_run.empty();
  // A press that evicts while prefilling changes what later context tokens attend to: its cells feed
  // their contexts themselves (a recording holds a context prefilled without evictions).
  for (size_t c : to_run) share = share && cells[c].prefill_evict_every == 0;
  if (share) {
    // The recording holds a whole context's activations: a grid whose longest context would not fit the
    // limit is run cell by cell (the same results, one prefill per cell).
    int64_t longest = 0;
    for (const std::vector<size_t>& group : context_groups(setup.samples))
      longest = std::max<int64_t>(longest, (int64_t)setup.prompts.context_ids(setup.samples[group.front()].context).size());
    const int64_t need = ContextRecording::bytes_for(setup.model.config(), longest);
    const int64_t limit = opt.recording_limit_bytes >= 0 ? opt.recording_limit_bytes : memory_available_bytes() / 2;
    if (need > limit) {
      share = false;
      if (!opt.quiet)
        std::fprintf(stderr,
                     "note: a recorded %lld-token context takes %.1f GiB, over the %.1f GiB allowed (half of the "
                     "available memory): every cell prefills its contexts itself\n",
                     (long long)longest, need / 1073741824.0, limit / 1073741824.0);
    }
  }
  if (!share) {
    for (size_t c : to_run) {
      const PressSpec* p = cells[c].name.empty() ? nullptr : &cells[c];
      RunOptions run = opt;
      run.progress = &overall;
      run.label = cell_label(c);
      const auto tc = std::chrono::steady_clock::now();
      std::vector<Sample> samples;
      for (size_t i : cell_samples[c]) samples.push_back(setup.samples[i]);
      const EvalSetup shard_setup{setup.model, setup.session, setup.prompts, samples, setup.suite};
      const CellResult cell = run_cell(shard_setup, p, (fs::path(out_dir) / cell_dir_name(p)).string(), run);
      finished_samples += (int64_t)samples.size();
      overall.update(finished_samples);
      report_cell(c, cell, seconds_since(tc));
    }
  } else {
    // Context by context: one recorded prefill, then every unfinished cell on a replay of it.
    std::vector<SharedCell> run_cells(to_run.size());
    for (size_t r = 0; r < to_run.size(); r++) {
      SharedCell& cell = run_cells[r];
      cell.index = to_run[r];
      cell.press_opt = cells[cell.index].name.empty() ? nullptr : &cells[cell.index];
      cell.dir = fs::path(out_dir) / cell_dir_name(cell.press_opt);
      if (cell.press_opt) cell.press = make_press(*cell.press_opt, setup.model);
      cell.samples = cell_samples[cell.index];
      cell.slot_of.assign(setup.samples.size(), -1);
      for (size_t k = 0; k < cell.samples.size(); k++) cell.slot_of[cell.samples[k]] = (int64_t)k;
      cell.outcomes.resize(cell.samples.size());
      cell.have.assign(cell.samples.size(), false);
      cell.missing = (int64_t)cell.samples.size();
      fs::remove(cell.dir / "summary.json", ec);
      resume_cell(cell, setup);
      overall.resumed((int64_t)cell.samples.size() - cell.missing);  // not run now: not in the rate
    }
    overall.update(overall.done());

    Session& session = setup.session;
    Engine& engine = session.engine();
    Sequence& base = session.sequence();
    const Tokenizer& tok = setup.model.tokenizer();
    ContextRecording recording(setup.model.config());
    auto finish = [&](SharedCell& cell) {
      cell.out.close();
      const auto tf = std::chrono::steady_clock::now();
      const CellResult res = finish_cell(setup, cell.press_opt, cell.dir, cell.outcomes, cell.wall, true);
      report_cell(cell.index, res, cell.wall + seconds_since(tf));
    };
    for (SharedCell& cell : run_cells)
      if (cell.missing == 0) finish(cell);  // every sample was already in its samples.jsonl

    for (const std::vector<size_t>& group : context_groups(setup.samples)) {
      // What each cell still needs of this context.
      std::vector<std::vector<size_t>> need(run_cells.size());
      bool any = false;
      for (size_t r = 0; r < run_cells.size(); r++)
        for (size_t i : group) {
          const int64_t k = run_cells[r].slot_of[i];
          if (k >= 0 && !run_cells[r].have[(size_t)k]) need[r].push_back(i), any = true;
        }
      if (!any) continue;

      const std::vector<int32_t> ctx = setup.prompts.context_ids(setup.samples[group.front()].context);
      const auto questions = group_questions(setup.prompts, setup.samples, group, (int64_t)ctx.size(), session.n_ctx());
      std::unordered_map<size_t, size_t> question_of;  // sample -> its question in `questions`
      for (size_t k = 0; k < group.size(); k++) question_of[group[k]] = k;
      const auto tp = std::chrono::steady_clock::now();
      base.reset();
      base.attach_press(nullptr);
      engine.prefill_recorded(base, ctx, recording);
      const double prefill_seconds = seconds_since(tp);

      for (size_t r = 0; r < run_cells.size(); r++) {
        if (need[r].empty()) continue;
        SharedCell& cell = run_cells[r];
        const auto tc = std::chrono::steady_clock::now();
        std::unique_ptr<Sequence> seq;
        if (!cell.press) {
          seq = base.fork();  // the full cache: the prefill itself
        } else {
          seq = engine.new_sequence();
          seq->attach_press(cell.press.get());
          seq->begin_context();
          engine.replay(*seq, recording);
          seq->end_context(ctx);
          seq->cache().release_pool();  // a large eviction: give the freed pages back to the system
        }
        const double compress_seconds = cell.press ? seconds_since(tc) : 0.0;
        for (size_t q = 0; q < need[r].size(); q++) {
          const size_t i = need[r][q];
          SampleOutcome o = answer_on_fork(*seq, setup.samples[i], questions[question_of[i]], tok, (int64_t)ctx.size());
          o.context_reused = q > 0;
          o.context_seconds = q == 0 ? compress_seconds : 0.0;
          o.shared_prefill_seconds = q == 0 ? prefill_seconds : 0.0;
          cell.out << dump(outcome_to_json(o)) << '\n';
          cell.out.flush();
          if (!cell.out) throw Error((cell.dir / "samples.jsonl").string() + ": write failed (disk full?)");
          const size_t k = (size_t)cell.slot_of[i];
          cell.outcomes[k] = o;
          cell.have[k] = true;
          cell.missing--;
          if (opt.on_sample) opt.on_sample(o);
          overall.add(1, cell_label(cell.index) + " " + short_status(o));
        }
        cell.wall += seconds_since(tc);
        seq.reset();
        if (cell.missing == 0) finish(cell);
      }
    }
    base.reset();
  }
  overall.finish();
  for (const auto& rows : cell_rows) result.rows.insert(result.rows.end(), rows.begin(), rows.end());
  write_results((fs::path(out_dir) / "results.csv").string(), result.rows);
  result.seconds = seconds_since(t0);
  return result;
}

bool is_shard_folder(const std::string& dir) {
  std::error_code ec;
  return fs::exists(fs::path(dir) / "shard.json", ec);
}

std::vector<ResultRow> merge_shard_folders(const std::vector<std::string>& dirs) {
  int count = -1;
  nlohmann::json suite;
  std::vector<bool> seen;
  struct Cell {
    nlohmann::json summary;
    std::vector<std::pair<int64_t, SampleResult>> results;  // (sample index, result)
  };
  std::map<std::string, Cell> cells;
  for (const std::string& d : dirs) {
    const nlohmann::json sh = read_json_file((fs::path(d) / "shard.json").string());
    const int idx = sh.at("index").get<int>(), n = sh.at("count").get<int>();
    if (sh.value("unit", std::string()) != "context")
      throw Error(d + ": a shard split by (cell, sample), as kvzap did before shards split by context; rerun it");
    if (count < 0) {
      count = n;
      suite = sh.at("suite");
      seen.assign((size_t)n, false);
    }
    if (n != count || sh.at("suite") != suite)
      throw Error(d + ": a shard of another sweep (shard count or suite differs)");
    if (idx < 0 || idx >= n || seen[(size_t)idx]) throw Error(d + ": shard " + std::to_string(idx) + " given twice or out of range");
    seen[(size_t)idx] = true;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(d, ec)) {
      if (!e.is_directory() || !cell_finished(e.path().string())) continue;
      Cell& cell = cells[e.path().filename().string()];
      const nlohmann::json summary = read_json_file((e.path() / "summary.json").string());
      if (cell.summary.is_null()) cell.summary = summary;
      std::ifstream in(e.path() / "samples.jsonl");
      std::string line;
      while (std::getline(in, line)) {
        if (line.empty()) continue;
        const SampleOutcome o = outcome_from_json(nlohmann::json::parse(line));
        cell.results.push_back({o.index, SampleResult{o.task, o.score, o.evicted_fraction}});
      }
    }
  }
  for (int i = 0; i < count; i++)
    if (!seen[(size_t)i]) throw Error("shard " + std::to_string(i) + "/" + std::to_string(count) + " is missing from the inputs");
  std::vector<ResultRow> rows;
  for (auto& [name, cell] : cells) {
    // The unsharded order: by task (as the suite lists them), then sample index.
    std::stable_sort(cell.results.begin(), cell.results.end(), [](const auto& a, const auto& b) {
      return a.second.task != b.second.task ? a.second.task < b.second.task : a.first < b.first;
    });
    std::vector<SampleResult> results;
    for (const auto& r : cell.results) results.push_back(r.second);
    const nlohmann::json& s = cell.summary;
    const auto part = rows_from_task_scores(s.at("press").get<std::string>(), s.at("setting_kind").get<std::string>(),
                                            s.at("setting").get<double>(), aggregate_by_task(results));
    rows.insert(rows.end(), part.begin(), part.end());
  }
  return rows;
}

nlohmann::json suite_description(const SuiteOptions& opt, const std::vector<Sample>& samples,
                                 const std::string& model_name) {
  std::vector<std::string> tasks;
  for (const Sample& s : samples)
    if (tasks.empty() || tasks.back() != s.task) tasks.push_back(s.task);
  // A fingerprint of the generated prompts: catches generator or data changes the fields miss.
  uint64_t h = fnv1a64("");
  for (const Sample& s : samples) {
    h = fnv1a64(s.context, h);
    h = fnv1a64(s.question, h);
    h = fnv1a64(s.answer_prefix, h);
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", (unsigned long long)h);
  return {{"generator", kGeneratorVersion},
          {"length", opt.length},
          {"samples_per_task", opt.samples_per_task},
          {"first_index", opt.first_index},
          {"seed", opt.seed},
          {"tasks", tasks},
          {"corpus_hash", samples.empty() ? std::string() : samples.front().meta.corpus_hash},
          {"model", model_name},
          {"prompts_fnv1a64", std::string(hex)}};
}

}  // namespace kvzap::eval
