// Crash-safe file replacement: the data goes to a temporary next to the target (checked write(2)s,
// then fsync), which is renamed over the target only once complete. A crash or a kill leaves either
// the previous file or the new one, never half of one; a failed write (disk full, EFBIG, EIO) throws
// kvzap::Error "<path>: write failed: <reason>", removes the temporary and leaves the previous file in
// place.
#pragma once
#include <initializer_list>
#include <string>
#include <string_view>

namespace kvzap {

void write_file_atomic(const std::string& path, std::initializer_list<std::string_view> parts);
inline void write_file_atomic(const std::string& path, std::string_view data) { write_file_atomic(path, {data}); }

// Replaces the folder `dir` by `staged` (a complete folder written next to it): dir is moved aside,
// staged renamed into place, the old one removed. A kill in between leaves no `dir` (a rerun redoes it),
// never a mix of old and new files.
void replace_dir(const std::string& staged, const std::string& dir);

}  // namespace kvzap
