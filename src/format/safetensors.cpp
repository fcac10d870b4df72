#include "format/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>

#include "common/fp16.h"

namespace kvzap {
namespace {

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // the reference implementation's limit
constexpr size_t kMaxDims = 16;

struct DtypeInfo {
  const char* name;
  size_t size;
};
constexpr DtypeInfo kDtypes[] = {
    {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},
    {"BF16", 2}, {"I32", 4}, {"U32", 4}, {"F32", 4},     {"I64", 8},     {"U64", 8}, {"F64", 8},
};

template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

std::string shape_string(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

}  // namespace

size_t safetensors_dtype_size(const std::string& dtype) {
  for (const auto& d : kDtypes)
    if (dtype == d.name) return d.size;
  return 0;
}

int64_t SafetensorsFile::Tensor::n_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

void SafetensorsFile::fail(const std::string& problem) const { throw Error(path_ + ": " + problem); }

std::unique_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    if (e == ENOENT) f->fail("no such file");
    f->fail(std::string("cannot open: ") + std::strerror(e));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    f->fail("not a regular file");
  }
  f->size_ = (size_t)st.st_size;
  if (f->size_ < 8) {
    ::close(fd);
    f->fail("not a safetensors file (only " + std::to_string(f->size_) + " bytes)");
  }
  void* map = mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  ::close(fd);
  if (map == MAP_FAILED) f->fail(std::string("cannot map file: ") + std::strerror(map_errno));
  f->map_ = map;
  f->parse(static_cast<const uint8_t*>(map), f->size_);
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) munmap(map_, size_);
}

void SafetensorsFile::parse(const uint8_t* base, size_t size) {
  const uint64_t header_len = load<uint64_t>(base);
  if (header_len > size - 8)
    fail("header length " + std::to_string(header_len) + " exceeds the file size " + std::to_string(size));
  if (header_len > kMaxHeaderBytes) fail("header length " + std::to_string(header_len) + " is over 100 MB");
  const char* hdr = reinterpret_cast<const char*>(base + 8);

  // nlohmann keeps the last of duplicate keys silently; the callback notices top-level duplicates.
  std::set<std::string> top_keys;
  std::string duplicate;
  auto on_event = [&](int depth, nlohmann::json::parse_event_t ev, nlohmann::json& parsed) {
    if (ev == nlohmann::json::parse_event_t::key && depth == 1 && parsed.is_string() &&
        !top_keys.insert(parsed.get<std::string>()).second && duplicate.empty())
      duplicate = parsed.get<std::string>();
    return true;
  };
  nlohmann::json header = nlohmann::json::parse(hdr, hdr + header_len, on_event, /*allow_exceptions=*/false);
  if (header.is_discarded()) fail("header is not valid JSON");
  if (!header.is_object()) fail("header is not a JSON object");
  if (!duplicate.empty()) fail("duplicate header key '" + duplicate + "'");

  const uint64_t data_size = size - 8 - header_len;
  const uint8_t* data = base + 8 + header_len;
  struct Range {
    uint64_t begin, end;
    size_t index;
  };
  std::vector<Range> ranges;
  for (auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) fail("__metadata__ is not an object");
      for (auto& [k, v] : entry.items())
        if (!v.is_string()) fail("__metadata__ value for '" + k + "' is not a string");
      metadata_ = entry;
      continue;
    }
    const std::string what = "tensor '" + name + "'";
    if (!entry.is_object()) fail(what + ": entry is not an object");
    Tensor t;
    t.name = name;
    auto dtype = entry.find("dtype");
    if (dtype == entry.end() || !dtype->is_string()) fail(what + ": missing dtype");
    t.dtype = dtype->get<std::string>();
    const size_t elem = safetensors_dtype_size(t.dtype);
    if (elem == 0) fail(what + ": unknown dtype '" + t.dtype + "'");
    auto shape = entry.find("shape");
    if (shape == entry.end() || !shape->is_array() || shape->size() > kMaxDims) fail(what + ": bad shape");
    unsigned __int128 n_bytes = elem;
    for (const auto& d : *shape) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > (uint64_t)std::numeric_limits<int64_t>::max())
        fail(what + ": shape entries must be non-negative integers");
      const uint64_t dim = d.get<uint64_t>();
      t.shape.push_back((int64_t)dim);
      n_bytes *= dim;
      if (n_bytes > data_size) n_bytes = (unsigned __int128)data_size + 1;  // saturate: too big anyway
    }
    auto offs = entry.find("data_offsets");
    if (offs == entry.end() || !offs->is_array() || offs->size() != 2 || !(*offs)[0].is_number_unsigned() ||
        !(*offs)[1].is_number_unsigned())
      fail(what + ": data_offsets must be two non-negative integers");
    const uint64_t begin = (*offs)[0].get<uint64_t>(), end = (*offs)[1].get<uint64_t>();
    if (begin > end || end > data_size)
      fail(what + ": data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
           "] lie outside the data section (" + std::to_string(data_size) + " bytes)");
    if (n_bytes != end - begin)
      fail(what + ": " + t.dtype + " " + shape_string(t.shape) + " does not match its " + std::to_string(end - begin) +
           " data bytes");
    t.data = data + begin;
    t.n_bytes = (size_t)(end - begin);
    ranges.push_back({begin, end, tensors_.size()});
    tensors_.push_back(std::move(t));
  }
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].begin < ranges[i - 1].end)
      fail("tensors '" + tensors_[ranges[i - 1].index].name + "' and '" + tensors_[ranges[i].index].name + "' overlap");
  for (size_t i = 0; i < tensors_.size(); ++i) index_.emplace(tensors_[i].name, i);
}

const SafetensorsFile::Tensor* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const SafetensorsFile::Tensor& SafetensorsFile::tensor(const std::string& name) const {
  const Tensor* t = find(name);
  if (!t) fail("missing tensor '" + name + "'");
  return *t;
}

std::vector<float> SafetensorsFile::to_f32(const Tensor& t) const {
  const size_t elem = safetensors_dtype_size(t.dtype);
  const size_t n = elem ? t.n_bytes / elem : 0;
  std::vector<float> out(n);
  const uint8_t* p = t.data;
  auto convert = [&](auto fn, size_t step) {
    for (size_t i = 0; i < n; ++i) out[i] = fn(p + i * step);
  };
  const std::string& d = t.dtype;
  if (d == "F32") {
    if (n) std::memcpy(out.data(), p, n * 4);
  } else if (d == "BF16") convert([](const uint8_t* q) { return bf16_to_fp32(load<uint16_t>(q)); }, 2);
  else if (d == "F16") convert([](const uint8_t* q) { return fp16_to_fp32(load<uint16_t>(q)); }, 2);
  else if (d == "F64") convert([](const uint8_t* q) { return (float)load<double>(q); }, 8);
  else if (d == "I64") convert([](const uint8_t* q) { return (float)load<int64_t>(q); }, 8);
  else if (d == "U64") convert([](const uint8_t* q) { return (float)load<uint64_t>(q); }, 8);
  else if (d == "I32") convert([](const uint8_t* q) { return (float)load<int32_t>(q); }, 4);
  else if (d == "U32") convert([](const uint8_t* q) { return (float)load<uint32_t>(q); }, 4);
  else if (d == "I16") convert([](const uint8_t* q) { return (float)load<int16_t>(q); }, 2);
  else if (d == "U16") convert([](const uint8_t* q) { return (float)load<uint16_t>(q); }, 2);
  else if (d == "I8") convert([](const uint8_t* q) { return (float)(int8_t)*q; }, 1);
  else if (d == "U8") convert([](const uint8_t* q) { return (float)*q; }, 1);
  else if (d == "BOOL") convert([](const uint8_t* q) { return *q ? 1.0f : 0.0f; }, 1);
  else fail("tensor '" + t.name + "' has dtype " + d + ", which cannot be converted to f32");
  return out;
}

void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const TensorToWrite& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__") throw Error(path + ": invalid tensor name '" + t.name + "'");
    if (header.contains(t.name)) throw Error(path + ": duplicate tensor '" + t.name + "'");
    if (t.dtype != "F32" && t.dtype != "BF16")
      throw Error(path + ": tensor '" + t.name + "': can only write F32 or BF16, not " + t.dtype);
    uint64_t n = 1;
    for (int64_t d : t.shape) {
      if (d < 0) throw Error(path + ": tensor '" + t.name + "' has a negative dimension");
      n *= (uint64_t)d;
    }
    if (n != t.values.size())
      throw Error(path + ": tensor '" + t.name + "' has shape " + shape_string(t.shape) + " but " +
                  std::to_string(t.values.size()) + " values");
    const uint64_t bytes = n * safetensors_dtype_size(t.dtype);
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text;
  try {
    text = header.dump(-1, ' ', false, nlohmann::json::error_handler_t::strict);
  } catch (const nlohmann::json::exception& e) {
    throw Error(path + ": tensor names and metadata must be valid UTF-8");
  }
  text.append((8 - text.size() % 8) % 8, ' ');

  const std::string tmp = path + ".tmp-" + std::to_string(getpid());
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) throw Error(tmp + ": cannot create: " + std::strerror(errno));
  bool ok = true;
  const uint64_t len = text.size();
  ok &= std::fwrite(&len, 8, 1, f) == 1;
  ok &= std::fwrite(text.data(), 1, text.size(), f) == text.size();
  std::vector<uint16_t> half;
  for (const TensorToWrite& t : tensors) {
    if (t.values.empty()) continue;
    if (t.dtype == "F32") {
      ok &= std::fwrite(t.values.data(), 4, t.values.size(), f) == t.values.size();
    } else {
      half.resize(t.values.size());
      for (size_t i = 0; i < t.values.size(); ++i) half[i] = fp32_to_bf16(t.values[i]);
      ok &= std::fwrite(half.data(), 2, half.size(), f) == half.size();
    }
  }
  ok &= std::fclose(f) == 0;
  if (!ok) {
    std::remove(tmp.c_str());
    throw Error(path + ": write failed");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    std::remove(tmp.c_str());
    throw Error(path + ": cannot rename into place: " + std::strerror(e));
  }
}

}  // namespace kvzap
