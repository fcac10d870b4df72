// What `kvzap eval` and `kvzap sweep` share: the context size they need and the suite they generate.
#pragma once
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "eval/runner.h"
#include "model/model.h"

namespace kvzap::cli {

// A sample for length N fits N tokens with its answer; KVzip scoring also feeds a repeat of the
// context, so leave room for twice that (within what the session accepts).
inline int64_t eval_context_size(int64_t length, const Model& model) {
  return std::max<int64_t>(length, std::min<int64_t>(2 * length + 256, 4 * (int64_t)model.config().n_ctx_train));
}

// Generates the suite the arguments ask for (Args: length, samples, first_index, tasks, seed, quiet).
template <typename Args>
std::vector<eval::Sample> generate_eval_suite(const Args& a, const eval::PromptBuilder& prompts, eval::SuiteOptions& so) {
  so.tasks = a.tasks;
  so.length = a.length;
  so.samples_per_task = a.samples;
  so.first_index = a.first_index;
  so.seed = a.seed;
  so.count_tokens = prompts.counter();
  if (!a.quiet)
    std::fprintf(stderr, "generating the suite (length %lld, %lld samples per task)...\n", (long long)a.length,
                 (long long)a.samples);
  return eval::generate_suite(so);
}

}  // namespace kvzap::cli
