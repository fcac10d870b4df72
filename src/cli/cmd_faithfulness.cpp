// kvzap faithfulness: teacher-forced agreement of a pressed cache with the full cache on held-out
// text (KL(full || pressed), top-1 agreement, NLL difference), as one JSON object.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>

#include "cli/cli_common.h"
#include "eval/faithfulness.h"
#include "eval/runner.h"

namespace kvzap::cli {
namespace {

struct FaithArgs {
  ModelArgs m;
  PressArgs press;
  std::string file, out;
  bool decoding_alias = false, quiet = false, scope_given = false;
  eval::FaithfulnessOptions opt;
};

int run_faithfulness(FaithArgs a) {
  if (a.decoding_alias) a.press.flags.decoding = true;
  if (a.press.flags.name == "none" || a.press.flags.name == "no_press") a.press.flags.name.clear();
  if (!a.scope_given) a.press.flags.ratio_scope = eval::kvpress_ratio_scope(a.press.flags.name);  // as kvpress splits it
  const std::string text = read_text_file(a.file);
  auto model = a.m.load_model();
  std::unique_ptr<Press> press = a.press.make(*model);
  const Tokenizer& tok = model->tokenizer();
  const std::vector<int32_t> ids = tok.encode(text, tok.vocab().add_bos, /*parse_special=*/false);
  const int64_t span = a.opt.context_tokens + a.opt.window_tokens + 1;
  // Room for KVzip's repeat-the-context scoring pass, within what the session accepts.
  if (a.m.ctx == 0)
    a.m.ctx = std::max<int64_t>(
        span, std::min<int64_t>(span + a.opt.context_tokens + 256, 4 * (int64_t)model->config().n_ctx_train));
  Session full(*model, a.m.session_options());
  Session pressed(*model, a.m.session_options());

  const int64_t n_windows = std::min<int64_t>(a.opt.windows, (int64_t)ids.size() / span);
  Progress progress("faithfulness", n_windows * a.opt.window_tokens, "tok", 0, a.quiet ? nullptr : stderr);
  const eval::FaithfulnessResult r = eval::measure_faithfulness(full, pressed, press.get(), ids, a.opt, &progress);
  progress.finish();

  const bool has_t = a.press.given_threshold();
  const char* kind = "none";
  double setting = 0;
  if (press) {
    kind = has_t ? "threshold" : "ratio";
    setting = has_t ? a.press.flags.threshold : a.press.flags.ratio;
  }
  nlohmann::json j{{"press", press ? a.press.flags.name : "none"},
                   {"press_description", press ? press->name() : "full cache"},
                   {"setting_kind", kind},
                   {"setting", setting},
                   {"decoding", a.press.flags.decoding},
                   {"file", a.file},
                   {"text_tokens", ids.size()},
                   {"context_tokens", a.opt.context_tokens},
                   {"window_tokens", a.opt.window_tokens},
                   {"windows", r.windows},
                   {"positions", r.positions},
                   {"mean_kl", r.mean_kl},
                   {"max_kl", r.max_kl},
                   {"kl_by_window", r.kl_by_window},
                   {"top1_agreement", r.top1_agreement},
                   {"nll_full", r.nll_full},
                   {"nll_pressed", r.nll_pressed},
                   {"nll_diff", r.nll_diff},
                   {"ppl_ratio", r.ppl_ratio},
                   {"evicted_fraction", r.evicted_fraction},
                   {"evicted_fraction_end", r.evicted_fraction_end},
                   {"kv_bytes", r.kv_bytes},
                   {"kv_bytes_full", r.kv_bytes_full},
                   {"threads", full.n_threads()},
                   {"seconds", r.seconds}};
  const std::string s = json_dump(j, 2);
  std::printf("%s\n", s.c_str());
  if (!a.out.empty()) {
    std::ofstream out(a.out, std::ios::binary | std::ios::trunc);
    if (!out || !(out << s << '\n')) throw Error(a.out + ": cannot write");
  }
  return 0;
}

RegisterCommand reg(
    "faithfulness", "teacher-forced agreement of a pressed cache with the full cache on a text", [](CLI::App& sub) {
      auto a = std::make_shared<FaithArgs>();
      a->m.add_to(sub);
      a->press.add_to(sub);
      sub.add_option("-f,--file", a->file, "held-out text (not training text)")->required();
      sub.add_flag("--decoding", a->decoding_alias, "same as --decode-press: prune the continuation too");
      sub.add_option("--context-tokens", a->opt.context_tokens, "tokens prefilled (and compressed) per window")
          ->check(CLI::Range((int64_t)1, (int64_t)1 << 22));
      sub.add_option("--window-tokens", a->opt.window_tokens, "teacher-forced positions scored per window")
          ->check(CLI::Range((int64_t)1, (int64_t)1 << 22));
      sub.add_option("--windows", a->opt.windows, "consecutive windows of the text to score")
          ->check(CLI::Range((int64_t)1, (int64_t)1 << 20));
      sub.add_option("--out", a->out, "also write the JSON to this file");
      sub.add_flag("-q,--quiet", a->quiet, "no progress on stderr");
      return [a, &sub]() {
        a->scope_given = sub.get_option("--ratio-scope")->count() > 0;
        return run_faithfulness(*a);
      };
    });

}  // namespace
}  // namespace kvzap::cli
