// The PressOptions a PressArgs stands for (serve's default press, and the settings recorded in saved
// caches so the server's prefix cache can match a file saved by `generate --save-cache`).
#pragma once
#include "cli/cli_common.h"

namespace kvzap::cli {

inline PressOptions press_options_from(const PressArgs& p) {
  PressOptions o;
  o.name = p.name;
  o.has_threshold = p.threshold_opt && p.threshold_opt->count() > 0;
  o.threshold = p.threshold;
  o.has_ratio = p.ratio_opt && p.ratio_opt->count() > 0;
  o.ratio = p.ratio;
  o.ratio_scope = p.scope;
  o.window = p.window;
  o.decoding = p.decoding;
  o.sliding_layers = p.sliding_layers;
  o.surrogate_dir = p.surrogate;
  o.seed = p.seed;
  return o;
}

}  // namespace kvzap::cli
