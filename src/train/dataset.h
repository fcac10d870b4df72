// Surrogate training pairs (h, y): for every sampled token, the post-input-RMSNorm attention input
// h of every layer and the KVzip+ log-score y of every KV head of every layer (docs/ALGORITHMS.md §5.1).
//
// File format ".kvzd" (little-endian), built for resumable collection:
//   header, 64 bytes:
//     0  char[4] magic "KVZD"      4  u32 version (1)
//     8  u32 n_layers (L)          12 u32 d_model (D_h)
//     16 u32 n_heads (H, KV heads) 20 u32 x_dtype (0 f32, 1 f16, 2 bf16)
//     24 u64 n_records at the last flush (informational)
//     32 u32 record_bytes          36..63 zero
//   records, record_bytes each:
//     u32 group (e.g. the text window id), u32 position (token index in the window),
//     f32 y[L][H], x[L][D_h] in x_dtype, zero padding to a multiple of 8 bytes.
// The record count is the number of whole records in the file; a partial last record (an interrupted
// append) is ignored by readers and cut off by DatasetWriter::open_append before it appends.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kvzap {

enum class DatasetDtype : uint32_t { F32 = 0, F16 = 1, BF16 = 2 };
const char* dataset_dtype_name(DatasetDtype t);     // "f32" / "f16" / "bf16"
DatasetDtype parse_dataset_dtype(const std::string& s);  // throws kvzap::Error

struct DatasetShape {
  int n_layers = 0;  // L
  int d_model = 0;   // D_h
  int n_heads = 0;   // H (KV heads per layer)
  DatasetDtype x_dtype = DatasetDtype::F16;
  size_t record_bytes() const;
  bool operator==(const DatasetShape&) const = default;
};

class Dataset {
 public:
  explicit Dataset(const DatasetShape& shape);  // empty, in memory, appendable
  // Maps a .kvzd file read-only (throws kvzap::Error naming the file on any format problem).
  static Dataset open(const std::string& path);
  Dataset(Dataset&& other) noexcept;
  Dataset& operator=(Dataset&& other) noexcept;
  Dataset(const Dataset&) = delete;
  Dataset& operator=(const Dataset&) = delete;
  ~Dataset();

  const DatasetShape& shape() const { return shape_; }
  int n_layers() const { return shape_.n_layers; }
  int d_model() const { return shape_.d_model; }
  int n_heads() const { return shape_.n_heads; }
  int64_t size() const { return n_; }
  bool is_mapped() const { return map_ != nullptr; }

  // In-memory datasets only.
  void reserve(int64_t n_records);
  void append(uint32_t group, uint32_t position, const float* x /*[L][D_h]*/, const float* y /*[L][H]*/);

  uint32_t group(int64_t i) const;
  uint32_t position(int64_t i) const;
  const float* y_record(int64_t i) const;                     // [L][H]
  float y(int64_t i, int layer, int head) const { return y_record(i)[layer * shape_.n_heads + head]; }
  void x_row(int64_t i, int layer, float* out /*[D_h]*/) const;  // decoded to f32
  // Decodes one layer of records idx[0..n): x_out [n][D_h], y_out [n][H]; either may be null.
  void gather(int layer, const int64_t* idx, int64_t n, float* x_out, float* y_out) const;
  // Same for the contiguous records [begin, begin + n).
  void gather_range(int layer, int64_t begin, int64_t n, float* x_out, float* y_out) const;

  Dataset subset(const std::vector<int64_t>& idx) const;  // in-memory copy
  // Keeps only the first n records in view (n >= size(): no change); nothing is copied or written.
  void limit(int64_t n) { n_ = std::min(n_, std::max<int64_t>(n, 0)); }
  void save(const std::string& path) const;               // complete file, overwrites

 private:
  const uint8_t* record(int64_t i) const { return base_ + header_bytes + size_t(i) * rec_bytes_; }
  void release();

  static constexpr size_t header_bytes = 64;
  DatasetShape shape_;
  size_t rec_bytes_ = 0;
  int64_t n_ = 0;
  std::vector<uint8_t> bytes_;  // in-memory: header + records
  void* map_ = nullptr;         // mapped file
  size_t map_len_ = 0;
  const uint8_t* base_ = nullptr;

  friend class DatasetWriter;
};

// Appends records to a .kvzd file; buffered, flushed (data, then header count) by flush() and the
// destructor. Not copyable; movable.
class DatasetWriter {
 public:
  // Creates (or truncates) path with an empty dataset of the given shape.
  static DatasetWriter create(const std::string& path, const DatasetShape& shape);
  // Opens path for appending, creating it if missing. An existing file must have exactly `shape`
  // (else kvzap::Error); a partial last record is truncated away.
  static DatasetWriter open_append(const std::string& path, const DatasetShape& shape);

  DatasetWriter(DatasetWriter&& other) noexcept;
  DatasetWriter& operator=(DatasetWriter&& other) noexcept;
  DatasetWriter(const DatasetWriter&) = delete;
  DatasetWriter& operator=(const DatasetWriter&) = delete;
  ~DatasetWriter();

  const DatasetShape& shape() const { return shape_; }
  int64_t size() const { return n_written_ + int64_t(pending_records_); }  // whole records, incl. buffered
  // Group of the last record (nullopt when empty) and how many trailing records share it:
  // lets a collector detect a window that was only partly written and drop it.
  std::optional<uint32_t> last_group() const;
  int64_t last_group_count() const;
  // Keeps only the first n records (n <= size()).
  void truncate(int64_t n);
  void drop_last_group();  // truncate(size() - last_group_count())

  void append(uint32_t group, uint32_t position, const float* x /*[L][D_h]*/, const float* y /*[L][H]*/);
  void flush();

 private:
  DatasetWriter() = default;
  void close() noexcept;
  void scan_tail_groups();

  std::string path_;
  DatasetShape shape_;
  size_t rec_bytes_ = 0;
  int fd_ = -1;
  int64_t n_written_ = 0;             // whole records on disk
  std::vector<uint8_t> pending_;      // encoded records not yet written
  size_t pending_records_ = 0;
  std::optional<uint32_t> last_group_;
  int64_t last_group_count_ = 0;

  friend class Dataset;
};

}  // namespace kvzap
