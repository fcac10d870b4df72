// A small GGUF v3 writer for tests that need a whole model file (F32 tensors only), independent of the
// reader: metadata entries are encoded by hand, tensors packed at 32-byte alignment.
#pragma once
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace kvzap::test {

class TinyGguf {
 public:
  void u32(const std::string& k, uint32_t v) { kv(k, 4).put(v); }
  void i32(const std::string& k, int32_t v) { kv(k, 5).put(v); }
  void f32(const std::string& k, float v) { kv(k, 6).put(v); }
  void boolean(const std::string& k, bool v) { kv(k, 7).put((uint8_t)(v ? 1 : 0)); }
  void str(const std::string& k, const std::string& v) { kv(k, 8).put_str(v); }
  void str_array(const std::string& k, const std::vector<std::string>& v) {
    kv(k, 9).put((uint32_t)8).put((uint64_t)v.size());
    for (const std::string& s : v) put_str(s);
  }
  void f32_array(const std::string& k, const std::vector<float>& v) {
    kv(k, 9).put((uint32_t)6).put((uint64_t)v.size());
    for (float x : v) put(x);
  }
  void i32_array(const std::string& k, const std::vector<int32_t>& v) {
    kv(k, 9).put((uint32_t)5).put((uint64_t)v.size());
    for (int32_t x : v) put(x);
  }
  // ne in ggml order (ne[0] = row length); data.size() must be the product.
  void tensor(const std::string& name, const std::vector<uint64_t>& ne, const std::vector<float>& data) {
    tensors_.push_back({name, ne, data});
  }

  void write(const std::string& path) const {
    std::string b = "GGUF";
    auto app = [&](const void* p, size_t n) { b.append((const char*)p, n); };
    const uint32_t version = 3;
    const uint64_t n_t = tensors_.size(), n_kv = n_kv_;
    app(&version, 4);
    app(&n_t, 8);
    app(&n_kv, 8);
    b += meta_;
    uint64_t off = 0;
    std::vector<uint64_t> offsets;
    for (const T& t : tensors_) {
      const uint64_t len = t.name.size();
      app(&len, 8);
      b += t.name;
      const uint32_t nd = (uint32_t)t.ne.size(), type = 0;
      app(&nd, 4);
      for (uint64_t d : t.ne) app(&d, 8);
      app(&type, 4);
      app(&off, 8);
      offsets.push_back(off);
      off = (off + t.data.size() * 4 + 31) / 32 * 32;
    }
    while (b.size() % 32) b.push_back('\0');
    const size_t start = b.size();
    for (size_t i = 0; i < tensors_.size(); i++) {
      b.resize(start + offsets[i], '\0');
      app(tensors_[i].data.data(), tensors_[i].data.size() * 4);
    }
    std::ofstream(path, std::ios::binary).write(b.data(), (std::streamsize)b.size());
  }

 private:
  struct T {
    std::string name;
    std::vector<uint64_t> ne;
    std::vector<float> data;
  };
  template <class V>
  TinyGguf& put(V v) {
    meta_.append((const char*)&v, sizeof v);
    return *this;
  }
  TinyGguf& put_str(const std::string& s) {
    put((uint64_t)s.size());
    meta_ += s;
    return *this;
  }
  TinyGguf& kv(const std::string& k, uint32_t type) {
    n_kv_++;
    put_str(k);
    return put(type);
  }
  std::string meta_;
  uint64_t n_kv_ = 0;
  std::vector<T> tensors_;
};

}  // namespace kvzap::test
