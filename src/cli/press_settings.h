// The PressOptions a PressArgs stands for (serve's default press, and the settings recorded in saved
// caches so the server's prefix cache can match a file saved by `generate --save-cache`).
#pragma once
#include "cli/cli_common.h"

namespace kvzap::cli {

inline PressOptions press_options_from(const PressArgs& p) { return p.options(); }

}  // namespace kvzap::cli
