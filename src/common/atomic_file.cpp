#include "common/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "kvzap/error.h"

namespace kvzap {

void write_file_atomic(const std::string& path, std::initializer_list<std::string_view> parts) {
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(path + ": cannot create " + tmp + ": " + std::strerror(errno));
  auto fail = [&](const char* what) {
    const int e = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    throw Error(path + ": " + what + ": " + std::strerror(e) + " (the previous file, if any, is unchanged)");
  };
  for (std::string_view part : parts) {
    const char* p = part.data();
    size_t n = part.size();
    while (n > 0) {
      const ssize_t w = ::write(fd, p, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        if (w == 0) errno = EIO;
        fail("write failed");
      }
      p += w;
      n -= (size_t)w;
    }
  }
  if (::fsync(fd) != 0) fail("write failed (fsync)");
  if (::close(fd) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    throw Error(path + ": write failed (close): " + std::strerror(e));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    throw Error(path + ": cannot rename the finished file into place: " + std::strerror(e));
  }
}

void replace_dir(const std::string& staged, const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const std::string old = dir + ".old-" + std::to_string(::getpid());
  const bool had = fs::exists(dir);
  if (had) {
    fs::rename(dir, old, ec);
    if (ec) throw Error(dir + ": cannot move the previous folder aside: " + ec.message());
  }
  fs::rename(staged, dir, ec);
  if (ec) {
    if (had) fs::rename(old, dir);
    throw Error(dir + ": cannot rename " + staged + " into place: " + ec.message());
  }
  if (had) fs::remove_all(old, ec);
}

}  // namespace kvzap
