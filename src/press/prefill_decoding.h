// "prefill_decoding_<a>+<b>" (kvpress PrefillDecodingPress(prefilling_press, decoding_press)): <a> any press for
// the context (the spec's ratio or threshold), <b> a decoding_<press> or compression_ratio_decoding_<press>;
// press/scorer_prefill_decoding.cpp, the name family in registry.cpp. A header of its own beside press.h.
#pragma once
#include <memory>
#include <string>
#include <utility>

#include "press/press.h"

namespace kvzap {

inline constexpr const char* kPrefillDecodingPrefix = "prefill_decoding_";
// {<a>, <b>} split at the last '+' that starts a decoding name (so <a> may hold a '+'); {"", ""} for another
// name or one without such a '+'; <a> empty where nothing comes before it.
std::pair<std::string, std::string> prefill_decoding_parts(const std::string& name);
// True for a prefill_decoding_... name that is not a registered press (whether or not its parts are valid).
bool is_prefill_decoding_name(const std::string& name);
// Builds it from its spec (make_press calls it): throws kvzap::Error naming what is wrong with either side.
std::unique_ptr<Press> make_prefill_decoding_press(const PressSpec& spec, const Model& model);

}  // namespace kvzap
