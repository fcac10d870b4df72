// GGUF reader. The whole file is mapped read-only first; the header is then parsed straight out of the
// mapping by a cursor that checks every read against the file size, and no count read from the file is
// trusted before it is shown to fit in the bytes that remain.
#include "format/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <limits>

namespace kvzap {

namespace gguf {

const char* value_type_name(uint32_t type) {
  static const char* const kNames[] = {"u8",  "i8",     "u16",   "i16", "u32", "i32", "f32",
                                       "bool", "string", "array", "u64", "i64", "f64"};
  return type < sizeof(kNames) / sizeof(kNames[0]) ? kNames[type] : "?";
}

int64_t TensorInfo::n_elements() const {
  int64_t n = 1;
  for (int64_t d : ne) n *= d;
  return n;
}

namespace {

constexpr uint32_t kMaxDims = 4;
constexpr int kMaxArrayDepth = 4;                  // nested arrays deeper than this are not sane
constexpr uint64_t kMaxMetadataValues = 1u << 22;  // caps memory spent on metadata values (4M)
constexpr uint64_t kMaxTensorNameLen = 256;
constexpr uint64_t kMaxKeyLen = 65535;

bool is_integer_type(uint32_t t) {
  return t == kU8 || t == kI8 || t == kU16 || t == kI16 || t == kU32 || t == kI32 || t == kU64 ||
         t == kI64;
}
bool is_float_type(uint32_t t) { return t == kF32 || t == kF64; }

// Smallest number of bytes one value of type t can occupy (used to bound counts before allocating).
uint64_t min_value_bytes(uint32_t t) {
  switch (t) {
    case kU8: case kI8: case kBool: return 1;
    case kU16: case kI16: return 2;
    case kU32: case kI32: case kF32: return 4;
    case kU64: case kI64: case kF64: return 8;
    case kString: return 8;    // u64 length
    case kArray: return 4 + 8;  // u32 type + u64 count
    default: return 1;
  }
}

std::string shape_string(const std::vector<int64_t>& ne) {
  std::string s = "[";
  for (size_t i = 0; i < ne.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(ne[i]);
  }
  return s + "]";
}

// Escapes a string so it prints on one line.
std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\x%02x", c);
          out += buf;
        } else {
          out += (char)c;
        }
    }
  }
  return out + "\"";
}

std::string float_string(double d, bool single) {
  char buf[64];
  auto res = single ? std::to_chars(buf, buf + sizeof buf, (float)d) : std::to_chars(buf, buf + sizeof buf, d);
  return std::string(buf, res.ptr);
}

}  // namespace

// Reads the header out of the mapping. Every accessor checks bounds first.
class Parser {
 public:
  Parser(File& f, const uint8_t* base, size_t size) : f_(f), base_(base), size_(size) {}

  void parse() {
    parse_preamble();
    for (uint64_t i = 0; i < n_kv_; ++i) parse_kv();
    apply_alignment();
    for (uint64_t i = 0; i < n_tensors_; ++i) parse_tensor_info();
    place_tensors();
  }

 private:
  [[noreturn]] void fail(const std::string& problem) const { throw Error(f_.path_ + ": " + problem); }

  size_t remaining() const { return size_ - pos_; }

  void need(uint64_t n, const char* what) const {
    if (n > remaining())
      fail("truncated file: needs " + std::to_string(n) + " more bytes at offset " + std::to_string(pos_) +
           " for " + what + " but only " + std::to_string(remaining()) + " remain");
  }
  template <typename T>
  T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, base_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string read_string(const char* what, uint64_t max_len) {
    const uint64_t len = read<uint64_t>(what);
    if (len > remaining())
      fail(std::string(what) + " at offset " + std::to_string(pos_ - 8) + " claims " + std::to_string(len) +
           " bytes but only " + std::to_string(remaining()) + " remain");
    if (len > max_len) fail(std::string(what) + " is " + std::to_string(len) + " bytes long (limit " +
                            std::to_string(max_len) + ")");
    std::string s(reinterpret_cast<const char*>(base_ + pos_), len);
    pos_ += len;
    return s;
  }
  // Checks that `count` items of at least `item_bytes` each can fit in the rest of the file.
  void check_count(uint64_t count, uint64_t item_bytes, const std::string& what) const {
    if (count > remaining() / item_bytes)
      fail(what + " count " + std::to_string(count) + " cannot fit in the " + std::to_string(remaining()) +
           " bytes that remain");
  }

  void parse_preamble() {
    if (size_ < 4 || std::memcmp(base_, "GGUF", 4) != 0) {
      if (size_ >= 4) fail("not a GGUF file (bad magic)");
      fail("not a GGUF file (only " + std::to_string(size_) + " bytes)");
    }
    pos_ = 4;
    const uint32_t version = read<uint32_t>("version");
    if ((version & 0xffffu) == 0 && version != 0)
      fail("GGUF version field reads 0x" + hex(version) +
           ": the file looks big-endian, only little-endian GGUF is supported");
    if (version == 1) fail("GGUF version 1 is not supported (need 2 or 3)");
    if (version != 2 && version != 3) fail("unsupported GGUF version " + std::to_string(version) + " (need 2 or 3)");
    f_.version_ = version;
    n_tensors_ = read<uint64_t>("tensor count");
    n_kv_ = read<uint64_t>("metadata count");
    // Each KV needs at least key length (8) + value type (4) + 1 byte; each tensor info at least
    // name length (8) + n_dims (4) + one dim (8) + type (4) + offset (8).
    check_count(n_kv_, 8 + 4 + 1, "metadata");
    check_count(n_tensors_, 8 + 4 + 8 + 4 + 8, "tensor");
  }

  static std::string hex(uint32_t v) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "%08x", v);
    return buf;
  }

  void parse_kv() {
    const size_t key_pos = pos_;
    std::string key = read_string("metadata key", kMaxKeyLen);
    if (key.empty()) fail("empty metadata key at offset " + std::to_string(key_pos));
    if (f_.kv_index_.count(key)) fail("duplicate metadata key '" + key + "'");
    const uint32_t type = read<uint32_t>("metadata value type");
    Value v = parse_value(type, key, 0);
    f_.kv_index_.emplace(key, f_.kv_.size());
    f_.kv_.emplace_back(std::move(key), std::move(v));
  }

  void count_values(uint64_t n, const std::string& key) {
    n_values_ += n;
    if (n_values_ > kMaxMetadataValues)
      fail("metadata key '" + key + "': more than " + std::to_string(kMaxMetadataValues) +
           " metadata values in total");
  }

  Value parse_value(uint32_t type, const std::string& key, int depth) {
    Value v;
    v.type = type;
    switch (type) {
      case kU8: v.v = (int64_t)read<uint8_t>("u8 value"); break;
      case kI8: v.v = (int64_t)read<int8_t>("i8 value"); break;
      case kU16: v.v = (int64_t)read<uint16_t>("u16 value"); break;
      case kI16: v.v = (int64_t)read<int16_t>("i16 value"); break;
      case kU32: v.v = (int64_t)read<uint32_t>("u32 value"); break;
      case kI32: v.v = (int64_t)read<int32_t>("i32 value"); break;
      case kI64: v.v = read<int64_t>("i64 value"); break;
      case kU64: {
        const uint64_t u = read<uint64_t>("u64 value");
        if (u > (uint64_t)std::numeric_limits<int64_t>::max())
          fail("metadata key '" + key + "': u64 value " + std::to_string(u) + " is too large");
        v.v = (int64_t)u;
        break;
      }
      case kF32: v.v = (double)read<float>("f32 value"); break;
      case kF64: v.v = read<double>("f64 value"); break;
      case kBool: {
        const uint8_t b = read<uint8_t>("bool value");
        if (b > 1) fail("metadata key '" + key + "': bool value " + std::to_string(b) + " is not 0 or 1");
        v.v = (b == 1);
        break;
      }
      case kString: v.v = read_string("string value", std::numeric_limits<uint64_t>::max()); break;
      case kArray: {
        if (depth >= kMaxArrayDepth) fail("metadata key '" + key + "': arrays nested too deeply");
        const uint32_t elem = read<uint32_t>("array element type");
        if (elem > kF64) fail("metadata key '" + key + "': unknown array element type " + std::to_string(elem));
        const uint64_t count = read<uint64_t>("array length");
        check_count(count, min_value_bytes(elem), "metadata key '" + key + "': array");
        count_values(count, key);
        auto arr = std::make_shared<Array>();
        arr->reserve(count);
        for (uint64_t i = 0; i < count; ++i) arr->push_back(parse_value(elem, key, depth + 1));
        v.array_type = elem;
        v.v = std::move(arr);
        break;
      }
      default:
        fail("metadata key '" + key + "' has unknown value type " + std::to_string(type));
    }
    return v;
  }

  void apply_alignment() {
    const Value* a = f_.find("general.alignment");
    if (!a) return;
    if (!is_integer_type(a->type)) fail("general.alignment must be an integer");
    const int64_t al = std::get<int64_t>(a->v);
    if (al <= 0 || (al & (al - 1)) != 0 || al > (1 << 30))
      fail("general.alignment " + std::to_string(al) + " is not a power of two");
    f_.alignment_ = (size_t)al;
  }

  void parse_tensor_info() {
    TensorInfo t;
    t.name = read_string("tensor name", kMaxTensorNameLen);
    if (t.name.empty()) fail("empty tensor name at tensor " + std::to_string(f_.tensors_.size()));
    if (f_.tensor_index_.count(t.name)) fail("duplicate tensor '" + t.name + "'");
    const std::string what = "tensor '" + t.name + "'";
    const uint32_t n_dims = read<uint32_t>("tensor dimension count");
    if (n_dims == 0 || n_dims > kMaxDims)
      fail(what + " has " + std::to_string(n_dims) + " dimensions (must be 1 to 4)");
    uint64_t n_elements = 1;
    for (uint32_t i = 0; i < n_dims; ++i) {
      const uint64_t d = read<uint64_t>("tensor dimension");
      if (d == 0 || d > (uint64_t)std::numeric_limits<int64_t>::max())
        fail(what + " has invalid dimension " + std::to_string(d));
      if (n_elements > (uint64_t)std::numeric_limits<int64_t>::max() / d)
        fail(what + " element count overflows");
      n_elements *= d;
      t.ne.push_back((int64_t)d);
    }
    const uint32_t type_id = read<uint32_t>("tensor type");
    t.type = (GgmlType)type_id;
    if (!is_known_type(t.type)) fail(what + " has unknown ggml type " + std::to_string(type_id));
    if (!is_supported_type(t.type)) fail(what + " has unsupported type " + type_name(t.type));
    const int64_t bs = type_block_size(t.type), bb = type_block_bytes(t.type);
    if (t.ne[0] % bs != 0)
      fail(what + " row length " + std::to_string(t.ne[0]) + " is not a multiple of the " + type_name(t.type) +
           " block size " + std::to_string(bs));
    const unsigned __int128 bytes = (unsigned __int128)(n_elements / (uint64_t)bs) * (uint64_t)bb;
    if (bytes > (unsigned __int128)size_) fail(what + " is larger than the file");
    t.n_bytes = (size_t)bytes;
    t.offset = read<uint64_t>("tensor offset");
    f_.tensor_index_.emplace(t.name, f_.tensors_.size());
    f_.tensors_.push_back(std::move(t));
  }

  void place_tensors() {
    const size_t al = f_.alignment_;
    const uint64_t data_start = ((uint64_t)pos_ + al - 1) / al * al;
    if (f_.tensors_.empty()) return;
    if (data_start > size_) fail("truncated file: the tensor data section starts past the end of the file");
    const uint64_t data_size = size_ - data_start;
    std::vector<const TensorInfo*> by_offset;
    for (TensorInfo& t : f_.tensors_) {
      if (t.offset % al != 0)
        fail("tensor '" + t.name + "' offset " + std::to_string(t.offset) + " is not a multiple of the alignment " +
             std::to_string(al));
      if (t.offset > data_size || t.n_bytes > data_size - t.offset)
        fail("tensor '" + t.name + "' data [" + std::to_string(t.offset) + ", +" + std::to_string(t.n_bytes) +
             ") lies outside the file (data section is " + std::to_string(data_size) + " bytes)");
      t.data = base_ + data_start + t.offset;
      by_offset.push_back(&t);
    }
    std::sort(by_offset.begin(), by_offset.end(),
              [](const TensorInfo* a, const TensorInfo* b) { return a->offset < b->offset; });
    for (size_t i = 1; i < by_offset.size(); ++i) {
      const TensorInfo& prev = *by_offset[i - 1];
      if (prev.offset + prev.n_bytes > by_offset[i]->offset)
        fail("tensors '" + prev.name + "' and '" + by_offset[i]->name + "' overlap");
    }
  }

  File& f_;
  const uint8_t* base_;
  size_t size_;
  size_t pos_ = 0;
  uint64_t n_tensors_ = 0, n_kv_ = 0, n_values_ = 0;
};

std::unique_ptr<File> File::open(const std::string& path) {
  std::unique_ptr<File> f(new File());
  f->path_ = path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    if (e == ENOENT) throw Error(path + ": no such file");
    throw Error(path + ": cannot open: " + std::strerror(e));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(path + ": not a regular file");
  }
  f->size_ = (size_t)st.st_size;
  if (f->size_ == 0) {
    ::close(fd);
    throw Error(path + ": not a GGUF file (empty)");
  }
  void* map = mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  ::close(fd);
  if (map == MAP_FAILED) throw Error(path + ": cannot map file: " + std::strerror(map_errno));
  f->map_ = map;  // owned by f from here on, so a parse failure unmaps it
  Parser(*f, static_cast<const uint8_t*>(map), f->size_).parse();
  return f;
}

File::~File() {
  if (map_) munmap(map_, size_);
}

const Value* File::find(const std::string& key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

namespace {

[[noreturn]] void wrong_type(const std::string& path, const std::string& key, const Value& v, const char* want) {
  std::string got = value_type_name(v.type);
  if (v.type == kArray) got = std::string("array of ") + value_type_name(v.array_type);
  throw Error(path + ": metadata key '" + key + "' has wrong type " + got + " (expected " + want + ")");
}

bool as_int(const Value& v, int64_t& out) {
  if (!is_integer_type(v.type)) return false;
  out = std::get<int64_t>(v.v);
  return true;
}
bool as_float(const Value& v, double& out) {
  if (is_float_type(v.type)) {
    out = std::get<double>(v.v);
    return true;
  }
  if (is_integer_type(v.type)) {
    out = (double)std::get<int64_t>(v.v);
    return true;
  }
  return false;
}

}  // namespace

std::optional<int64_t> File::get_int_opt(const std::string& key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  int64_t out = 0;
  if (!as_int(*v, out)) wrong_type(path_, key, *v, "integer");
  return out;
}
int64_t File::get_int(const std::string& key) const {
  auto v = get_int_opt(key);
  if (!v) throw Error(path_ + ": missing metadata key '" + key + "'");
  return *v;
}

std::optional<double> File::get_float_opt(const std::string& key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  double out = 0;
  if (!as_float(*v, out)) wrong_type(path_, key, *v, "number");
  return out;
}
double File::get_float(const std::string& key) const {
  auto v = get_float_opt(key);
  if (!v) throw Error(path_ + ": missing metadata key '" + key + "'");
  return *v;
}

bool File::get_bool_opt(const std::string& key, bool dflt) const {
  const Value* v = find(key);
  if (!v) return dflt;
  if (v->type != kBool) wrong_type(path_, key, *v, "bool");
  return std::get<bool>(v->v);
}

std::optional<std::string> File::get_string_opt(const std::string& key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  if (v->type != kString) wrong_type(path_, key, *v, "string");
  return std::get<std::string>(v->v);
}
std::string File::get_string(const std::string& key) const {
  auto v = get_string_opt(key);
  if (!v) throw Error(path_ + ": missing metadata key '" + key + "'");
  return *v;
}

std::vector<std::string> File::get_string_array(const std::string& key) const {
  const Value* v = find(key);
  if (!v) throw Error(path_ + ": missing metadata key '" + key + "'");
  if (v->type != kArray || v->array_type != kString) wrong_type(path_, key, *v, "array of string");
  const Array& arr = *std::get<std::shared_ptr<Array>>(v->v);
  std::vector<std::string> out;
  out.reserve(arr.size());
  for (const Value& e : arr) out.push_back(std::get<std::string>(e.v));
  return out;
}

std::vector<int64_t> File::get_int_array(const std::string& key) const {
  const Value* v = find(key);
  if (!v) throw Error(path_ + ": missing metadata key '" + key + "'");
  int64_t x = 0;
  if (as_int(*v, x)) return {x};
  if (v->type != kArray || !is_integer_type(v->array_type)) wrong_type(path_, key, *v, "integer array");
  const Array& arr = *std::get<std::shared_ptr<Array>>(v->v);
  std::vector<int64_t> out;
  out.reserve(arr.size());
  for (const Value& e : arr) out.push_back(std::get<int64_t>(e.v));
  return out;
}

std::vector<double> File::get_float_array(const std::string& key) const {
  const Value* v = find(key);
  if (!v) throw Error(path_ + ": missing metadata key '" + key + "'");
  double x = 0;
  if (as_float(*v, x)) return {x};
  if (v->type != kArray || !(is_float_type(v->array_type) || is_integer_type(v->array_type)))
    wrong_type(path_, key, *v, "number array");
  const Array& arr = *std::get<std::shared_ptr<Array>>(v->v);
  std::vector<double> out;
  out.reserve(arr.size());
  for (const Value& e : arr) {
    double y = 0;
    as_float(e, y);  // element types were checked above
    out.push_back(y);
  }
  return out;
}

const TensorInfo* File::find_tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const TensorInfo& File::tensor(const std::string& name, const std::vector<int64_t>& expected_ne) const {
  const TensorInfo* t = find_tensor(name);
  if (!t) throw Error(path_ + ": missing tensor '" + name + "'");
  if (t->ne != expected_ne)
    throw Error(path_ + ": tensor '" + name + "' has shape " + shape_string(t->ne) + ", expected " +
                shape_string(expected_ne));
  return *t;
}

std::string File::value_to_string(const Value& v, size_t max_array_items) const {
  switch (v.type) {
    case kString: return quoted(std::get<std::string>(v.v));
    case kBool: return std::get<bool>(v.v) ? "true" : "false";
    case kF32: return float_string(std::get<double>(v.v), true);
    case kF64: return float_string(std::get<double>(v.v), false);
    case kArray: {
      const Array& arr = *std::get<std::shared_ptr<Array>>(v.v);
      std::string s = "[";
      const size_t shown = std::min(arr.size(), max_array_items);
      for (size_t i = 0; i < shown; ++i) {
        if (i) s += ", ";
        s += value_to_string(arr[i], max_array_items);
      }
      if (shown < arr.size()) s += std::string(shown ? ", " : "") + "... (" + std::to_string(arr.size()) + " items)";
      return s + "]";
    }
    default:
      if (is_integer_type(v.type)) return std::to_string(std::get<int64_t>(v.v));
      return "?";
  }
}

}  // namespace gguf
}  // namespace kvzap
