#include "train/dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <utility>

#include "common/fp16.h"
#include "kvzap/error.h"

namespace kvzap {
namespace {

constexpr char kMagic[4] = {'K', 'V', 'Z', 'D'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderBytes = 64;
constexpr int kMaxDim = 1 << 20;  // sanity bound on L, D_h, H

size_t dtype_bytes(DatasetDtype t) { return t == DatasetDtype::F32 ? 4 : 2; }

void put_u32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }
void put_u64(uint8_t* p, uint64_t v) { std::memcpy(p, &v, 8); }
uint32_t get_u32(const uint8_t* p) { uint32_t v; std::memcpy(&v, p, 4); return v; }

std::array<uint8_t, kHeaderBytes> encode_header(const DatasetShape& s, uint64_t n) {
  std::array<uint8_t, kHeaderBytes> h{};
  std::memcpy(h.data(), kMagic, 4);
  put_u32(h.data() + 4, kVersion);
  put_u32(h.data() + 8, uint32_t(s.n_layers));
  put_u32(h.data() + 12, uint32_t(s.d_model));
  put_u32(h.data() + 16, uint32_t(s.n_heads));
  put_u32(h.data() + 20, uint32_t(s.x_dtype));
  put_u64(h.data() + 24, n);
  put_u32(h.data() + 32, uint32_t(s.record_bytes()));
  return h;
}

void check_shape(const DatasetShape& s, const std::string& what) {
  if (s.n_layers <= 0 || s.d_model <= 0 || s.n_heads <= 0 || s.n_layers > kMaxDim ||
      s.d_model > kMaxDim || s.n_heads > kMaxDim)
    throw Error(what + ": invalid dataset shape L=" + std::to_string(s.n_layers) + " D_h=" +
                std::to_string(s.d_model) + " H=" + std::to_string(s.n_heads));
  const uint32_t t = uint32_t(s.x_dtype);
  if (t > 2) throw Error(what + ": unknown x dtype code " + std::to_string(t));
}

// Parses and validates a header; throws naming `path`.
DatasetShape decode_header(const uint8_t* h, size_t file_len, const std::string& path) {
  if (file_len < kHeaderBytes) throw Error("dataset " + path + ": file too short for a KVZD header");
  if (std::memcmp(h, kMagic, 4) != 0) throw Error("dataset " + path + ": bad magic (not a KVZD file)");
  const uint32_t version = get_u32(h + 4);
  if (version != kVersion)
    throw Error("dataset " + path + ": unsupported KVZD version " + std::to_string(version));
  DatasetShape s;
  const uint32_t L = get_u32(h + 8), D = get_u32(h + 12), H = get_u32(h + 16), t = get_u32(h + 20);
  if (L == 0 || D == 0 || H == 0 || L > uint32_t(kMaxDim) || D > uint32_t(kMaxDim) || H > uint32_t(kMaxDim))
    throw Error("dataset " + path + ": invalid shape in header");
  if (t > 2) throw Error("dataset " + path + ": unknown x dtype code " + std::to_string(t));
  s.n_layers = int(L);
  s.d_model = int(D);
  s.n_heads = int(H);
  s.x_dtype = DatasetDtype(t);
  if (get_u32(h + 32) != s.record_bytes())
    throw Error("dataset " + path + ": record size in header does not match its shape");
  return s;
}

std::string shape_string(const DatasetShape& s) {
  return "L=" + std::to_string(s.n_layers) + " D_h=" + std::to_string(s.d_model) + " H=" +
         std::to_string(s.n_heads) + " x=" + dataset_dtype_name(s.x_dtype);
}

// Table for f16 -> f32 (256 KiB): decoding is on the training hot path.
const float* f16_table() {
  static const std::vector<float> table = [] {
    std::vector<float> t(65536);
    for (uint32_t i = 0; i < 65536; ++i) t[i] = fp16_to_fp32(uint16_t(i));
    return t;
  }();
  return table.data();
}

void decode_x(DatasetDtype t, const uint8_t* src, int64_t n, float* out) {
  switch (t) {
    case DatasetDtype::F32:
      std::memcpy(out, src, size_t(n) * 4);
      return;
    case DatasetDtype::F16: {
      const float* tab = f16_table();
      for (int64_t i = 0; i < n; ++i) {
        uint16_t v;
        std::memcpy(&v, src + 2 * i, 2);
        out[i] = tab[v];
      }
      return;
    }
    case DatasetDtype::BF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t v;
        std::memcpy(&v, src + 2 * i, 2);
        out[i] = bf16_to_fp32(v);
      }
      return;
  }
}

// Writes one record into dst (rec_bytes, zero padding included).
void encode_record(const DatasetShape& s, uint32_t group, uint32_t position, const float* x,
                   const float* y, uint8_t* dst) {
  const size_t ny = size_t(s.n_layers) * s.n_heads, nx = size_t(s.n_layers) * s.d_model;
  std::memset(dst, 0, s.record_bytes());
  put_u32(dst, group);
  put_u32(dst + 4, position);
  std::memcpy(dst + 8, y, ny * 4);
  uint8_t* px = dst + 8 + ny * 4;
  switch (s.x_dtype) {
    case DatasetDtype::F32:
      std::memcpy(px, x, nx * 4);
      break;
    case DatasetDtype::F16:
      for (size_t i = 0; i < nx; ++i) {
        const uint16_t v = fp32_to_fp16(x[i]);
        std::memcpy(px + 2 * i, &v, 2);
      }
      break;
    case DatasetDtype::BF16:
      for (size_t i = 0; i < nx; ++i) {
        const uint16_t v = fp32_to_bf16(x[i]);
        std::memcpy(px + 2 * i, &v, 2);
      }
      break;
  }
}

std::string errno_text() { return std::strerror(errno); }

void write_all(int fd, const uint8_t* p, size_t n, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw Error("dataset " + path + ": write failed: " + errno_text());
    }
    p += w;
    n -= size_t(w);
  }
}

void pwrite_all(int fd, const uint8_t* p, size_t n, off_t off, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, n, off);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw Error("dataset " + path + ": write failed: " + errno_text());
    }
    p += w;
    n -= size_t(w);
    off += w;
  }
}

void pread_all(int fd, uint8_t* p, size_t n, off_t off, const std::string& path) {
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, off);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) throw Error("dataset " + path + ": read failed");
    p += r;
    n -= size_t(r);
    off += r;
  }
}

}  // namespace

const char* dataset_dtype_name(DatasetDtype t) {
  switch (t) {
    case DatasetDtype::F32: return "f32";
    case DatasetDtype::F16: return "f16";
    case DatasetDtype::BF16: return "bf16";
  }
  return "?";
}

DatasetDtype parse_dataset_dtype(const std::string& s) {
  if (s == "f32") return DatasetDtype::F32;
  if (s == "f16") return DatasetDtype::F16;
  if (s == "bf16") return DatasetDtype::BF16;
  throw Error("unknown dataset dtype '" + s + "' (expected f32, f16 or bf16)");
}

size_t DatasetShape::record_bytes() const {
  const size_t raw = 8 + size_t(n_layers) * n_heads * 4 + size_t(n_layers) * d_model * dtype_bytes(x_dtype);
  return (raw + 7) / 8 * 8;
}

// ---------------------------------------------------------------- Dataset

Dataset::Dataset(const DatasetShape& shape) : shape_(shape) {
  check_shape(shape, "dataset");
  rec_bytes_ = shape.record_bytes();
  const auto h = encode_header(shape, 0);
  bytes_.assign(h.begin(), h.end());
  base_ = bytes_.data();
}

Dataset Dataset::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error("dataset " + path + ": cannot open: " + errno_text());
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    throw Error("dataset " + path + ": cannot stat: " + errno_text());
  }
  const size_t len = size_t(st.st_size);
  if (len < kHeaderBytes) {
    ::close(fd);
    throw Error("dataset " + path + ": file too short for a KVZD header");
  }
  void* m = ::mmap(nullptr, len, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) throw Error("dataset " + path + ": mmap failed: " + errno_text());
  const DatasetShape shape = [&] {
    try {
      return decode_header(static_cast<const uint8_t*>(m), len, path);
    } catch (...) {
      ::munmap(m, len);
      throw;
    }
  }();
  Dataset d(shape);
  d.bytes_.clear();
  d.bytes_.shrink_to_fit();
  d.map_ = m;
  d.map_len_ = len;
  d.base_ = static_cast<const uint8_t*>(m);
  d.n_ = int64_t((len - kHeaderBytes) / d.rec_bytes_);  // a partial tail record is ignored
  ::madvise(m, len, MADV_WILLNEED);
  return d;
}

Dataset::Dataset(Dataset&& o) noexcept { *this = std::move(o); }

Dataset& Dataset::operator=(Dataset&& o) noexcept {
  if (this == &o) return *this;
  release();
  shape_ = o.shape_;
  rec_bytes_ = o.rec_bytes_;
  n_ = o.n_;
  bytes_ = std::move(o.bytes_);
  map_ = o.map_;
  map_len_ = o.map_len_;
  base_ = map_ ? static_cast<const uint8_t*>(map_) : bytes_.data();
  o.map_ = nullptr;
  o.map_len_ = 0;
  o.base_ = nullptr;
  o.n_ = 0;
  return *this;
}

Dataset::~Dataset() { release(); }

void Dataset::release() {
  if (map_) ::munmap(map_, map_len_);
  map_ = nullptr;
  map_len_ = 0;
}

void Dataset::reserve(int64_t n) {
  if (map_) throw Error("dataset: cannot append to a memory-mapped file (use DatasetWriter)");
  bytes_.reserve(kHeaderBytes + size_t(n) * rec_bytes_);
  base_ = bytes_.data();
}

void Dataset::append(uint32_t group, uint32_t position, const float* x, const float* y) {
  if (map_) throw Error("dataset: cannot append to a memory-mapped file (use DatasetWriter)");
  const size_t off = bytes_.size();
  bytes_.resize(off + rec_bytes_);
  encode_record(shape_, group, position, x, y, bytes_.data() + off);
  base_ = bytes_.data();
  ++n_;
}

uint32_t Dataset::group(int64_t i) const { return get_u32(record(i)); }
uint32_t Dataset::position(int64_t i) const { return get_u32(record(i) + 4); }

const float* Dataset::y_record(int64_t i) const {
  // Records are 8-byte aligned and y starts at offset 8, so this is a valid float pointer.
  return reinterpret_cast<const float*>(record(i) + 8);
}

void Dataset::x_row(int64_t i, int layer, float* out) const {
  const size_t xb = dtype_bytes(shape_.x_dtype);
  const uint8_t* px = record(i) + 8 + size_t(shape_.n_layers) * shape_.n_heads * 4 +
                      size_t(layer) * shape_.d_model * xb;
  decode_x(shape_.x_dtype, px, shape_.d_model, out);
}

void Dataset::gather(int layer, const int64_t* idx, int64_t n, float* x_out, float* y_out) const {
  const int D = shape_.d_model, H = shape_.n_heads;
  for (int64_t r = 0; r < n; ++r) {
    if (x_out) x_row(idx[r], layer, x_out + r * D);
    if (y_out) std::memcpy(y_out + r * H, y_record(idx[r]) + layer * H, size_t(H) * 4);
  }
}

void Dataset::gather_range(int layer, int64_t begin, int64_t n, float* x_out, float* y_out) const {
  const int D = shape_.d_model, H = shape_.n_heads;
  for (int64_t r = 0; r < n; ++r) {
    if (x_out) x_row(begin + r, layer, x_out + r * D);
    if (y_out) std::memcpy(y_out + r * H, y_record(begin + r) + layer * H, size_t(H) * 4);
  }
}

Dataset Dataset::subset(const std::vector<int64_t>& idx) const {
  Dataset d(shape_);
  d.bytes_.resize(kHeaderBytes + idx.size() * rec_bytes_);
  std::memcpy(d.bytes_.data(), base_, kHeaderBytes);
  for (size_t r = 0; r < idx.size(); ++r) {
    if (idx[r] < 0 || idx[r] >= n_) throw Error("dataset subset: index out of range");
    std::memcpy(d.bytes_.data() + kHeaderBytes + r * rec_bytes_, record(idx[r]), rec_bytes_);
  }
  d.base_ = d.bytes_.data();
  d.n_ = int64_t(idx.size());
  return d;
}

void Dataset::save(const std::string& path) const {
  DatasetWriter w = DatasetWriter::create(path, shape_);
  const auto h = encode_header(shape_, uint64_t(n_));
  pwrite_all(w.fd_, h.data(), h.size(), 0, path);
  if (n_ > 0) write_all(w.fd_, record(0), size_t(n_) * rec_bytes_, path);
  w.n_written_ = n_;
  w.flush();
}

// ---------------------------------------------------------------- DatasetWriter

DatasetWriter DatasetWriter::create(const std::string& path, const DatasetShape& shape) {
  check_shape(shape, "dataset " + path);
  DatasetWriter w;
  w.path_ = path;
  w.shape_ = shape;
  w.rec_bytes_ = shape.record_bytes();
  w.fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (w.fd_ < 0) throw Error("dataset " + path + ": cannot create: " + errno_text());
  const auto h = encode_header(shape, 0);
  write_all(w.fd_, h.data(), h.size(), path);
  return w;
}

DatasetWriter DatasetWriter::open_append(const std::string& path, const DatasetShape& shape) {
  check_shape(shape, "dataset " + path);
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || st.st_size == 0) return create(path, shape);
  DatasetWriter w;
  w.path_ = path;
  w.shape_ = shape;
  w.rec_bytes_ = shape.record_bytes();
  w.fd_ = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (w.fd_ < 0) throw Error("dataset " + path + ": cannot open for appending: " + errno_text());
  const size_t len = size_t(st.st_size);
  std::array<uint8_t, kHeaderBytes> h{};
  if (len < kHeaderBytes) throw Error("dataset " + path + ": file too short for a KVZD header");
  pread_all(w.fd_, h.data(), h.size(), 0, path);
  const DatasetShape found = decode_header(h.data(), len, path);
  if (!(found == shape))
    throw Error("dataset " + path + ": existing file has shape " + shape_string(found) +
                ", expected " + shape_string(shape));
  w.n_written_ = int64_t((len - kHeaderBytes) / w.rec_bytes_);
  const off_t whole = off_t(kHeaderBytes + size_t(w.n_written_) * w.rec_bytes_);
  if (size_t(whole) != len && ::ftruncate(w.fd_, whole) != 0)
    throw Error("dataset " + path + ": cannot truncate partial record: " + errno_text());
  if (::lseek(w.fd_, whole, SEEK_SET) < 0) throw Error("dataset " + path + ": seek failed");
  w.scan_tail_groups();
  w.flush();  // header count now matches the whole records
  return w;
}

DatasetWriter::DatasetWriter(DatasetWriter&& o) noexcept { *this = std::move(o); }

DatasetWriter& DatasetWriter::operator=(DatasetWriter&& o) noexcept {
  if (this == &o) return *this;
  close();
  path_ = std::move(o.path_);
  shape_ = o.shape_;
  rec_bytes_ = o.rec_bytes_;
  fd_ = o.fd_;
  n_written_ = o.n_written_;
  pending_ = std::move(o.pending_);
  pending_records_ = o.pending_records_;
  last_group_ = o.last_group_;
  last_group_count_ = o.last_group_count_;
  o.fd_ = -1;
  o.pending_records_ = 0;
  return *this;
}

DatasetWriter::~DatasetWriter() { close(); }

void DatasetWriter::close() noexcept {
  if (fd_ < 0) return;
  try {
    flush();
  } catch (...) {
    // Destructors must not throw; callers that need the error call flush() themselves.
  }
  ::close(fd_);
  fd_ = -1;
}

std::optional<uint32_t> DatasetWriter::last_group() const { return last_group_; }
int64_t DatasetWriter::last_group_count() const { return last_group_count_; }

void DatasetWriter::scan_tail_groups() {
  last_group_.reset();
  last_group_count_ = 0;
  const int64_t n = size();
  auto group_of = [&](int64_t i) -> uint32_t {
    if (i >= n_written_) return get_u32(pending_.data() + size_t(i - n_written_) * rec_bytes_);
    uint8_t b[4];
    pread_all(fd_, b, 4, off_t(kHeaderBytes + size_t(i) * rec_bytes_), path_);
    return get_u32(b);
  };
  if (n == 0) return;
  const uint32_t g = group_of(n - 1);
  last_group_ = g;
  int64_t i = n - 1;
  while (i >= 0 && group_of(i) == g) --i;
  last_group_count_ = n - 1 - i;
}

void DatasetWriter::append(uint32_t group, uint32_t position, const float* x, const float* y) {
  const size_t off = pending_.size();
  pending_.resize(off + rec_bytes_);
  encode_record(shape_, group, position, x, y, pending_.data() + off);
  ++pending_records_;
  if (last_group_ && *last_group_ == group) {
    ++last_group_count_;
  } else {
    last_group_ = group;
    last_group_count_ = 1;
  }
  if (pending_.size() >= (size_t(8) << 20)) flush();  // bound the buffer at ~8 MiB
}

void DatasetWriter::flush() {
  if (fd_ < 0) return;
  if (!pending_.empty()) {
    write_all(fd_, pending_.data(), pending_.size(), path_);
    n_written_ += int64_t(pending_records_);
    pending_.clear();
    pending_records_ = 0;
  }
  const auto h = encode_header(shape_, uint64_t(n_written_));
  pwrite_all(fd_, h.data(), h.size(), 0, path_);
}

void DatasetWriter::truncate(int64_t n) {
  if (n < 0 || n > size()) throw Error("dataset " + path_ + ": truncate beyond the end");
  if (n >= n_written_) {
    const size_t keep = size_t(n - n_written_);
    pending_.resize(keep * rec_bytes_);
    pending_records_ = keep;
  } else {
    pending_.clear();
    pending_records_ = 0;
    const off_t whole = off_t(kHeaderBytes + size_t(n) * rec_bytes_);
    if (::ftruncate(fd_, whole) != 0) throw Error("dataset " + path_ + ": truncate failed: " + errno_text());
    if (::lseek(fd_, whole, SEEK_SET) < 0) throw Error("dataset " + path_ + ": seek failed");
    n_written_ = n;
    flush();
  }
  scan_tail_groups();
}

void DatasetWriter::drop_last_group() { truncate(size() - last_group_count_); }

}  // namespace kvzap
