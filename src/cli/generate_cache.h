// `generate --save-cache F` / `--load-cache F`: the compressed context as a file (engine/cache_file.h),
// in the same format as the server's /slots/save, so a context is compressed once and reused later.
#pragma once
#include <string>
#include <vector>

#include "cli/cli_common.h"
#include "engine/session.h"

namespace kvzap::cli {

// After answer_questions the session's own sequence still holds the compressed context (questions run
// on forks): saves it with the context's ids and the logits after its last token.
void save_context_cache(const std::string& path, Session& s, const std::vector<int32_t>& context_ids,
                        const PressArgs& press);

struct CachedGenerateOptions {
  std::string continuation;  // text fed after the saved context (may be empty)
  GenerateOptions gen;
  bool json = false, stream = true;
};

// Loads a saved context into the session and generates after it (plus the continuation). Prints like
// `generate` (streamed text, or one JSON object with --json). Returns the exit code.
int generate_from_saved_cache(const std::string& path, Session& s, const CachedGenerateOptions& o);

}  // namespace kvzap::cli
