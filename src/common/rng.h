// Portable, seeded randomness: the one RNG module of the tree (the eval suite, the sampler, the random
// press, training splits, sketches).
//
// Every draw goes through this file so that the same seed gives the same bytes with any compiler
// and standard library: std::uniform_int_distribution / std::normal_distribution / std::shuffle are
// implementation-defined, so they are never used. Bounded integers use rejection sampling (no modulo bias), shuffles
// are Fisher-Yates from the back.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

namespace kvzap {

// SplitMix64 finaliser: a bijective 64-bit mixer (Steele, Lea, Flood 2014 constants).
inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// FNV-1a 64 of a byte string: used to turn task names into seed material and to fingerprint data.
inline uint64_t fnv1a64(std::string_view s, uint64_t h = 0xcbf29ce484222325ull) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

// Order-dependent combination of seed material.
inline uint64_t hash_combine(uint64_t a, uint64_t b) { return mix64(a ^ mix64(b + 0x632be59bd9b4e019ull)); }

// xoshiro256** (Blackman & Vigna), state filled from SplitMix64 as its authors recommend.
class Rng {
 public:
  explicit Rng(uint64_t seed) {
    uint64_t x = seed;
    for (auto& s : s_) {
      x += 0x9e3779b97f4a7c15ull;
      uint64_t z = x;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      s = z ^ (z >> 31);
    }
  }

  uint64_t next() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }

  // Uniform in [0, n); n must be > 0. Rejects the top partial bucket, so no modulo bias.
  uint64_t below(uint64_t n) {
    const uint64_t threshold = (0 - n) % n;  // == 2^64 mod n
    for (;;) {
      const uint64_t r = next();
      if (r >= threshold) return r % n;
    }
  }

  // Uniform in [lo, hi] inclusive; requires lo <= hi.
  int64_t range(int64_t lo, int64_t hi) {
    return lo + (int64_t)below((uint64_t)(hi - lo) + 1);
  }

  // Uniform double in [0, 1) with 53 random bits.
  double uniform01() { return (double)(next() >> 11) * 0x1.0p-53; }

  template <class T>
  void shuffle(std::vector<T>& v) {
    for (size_t i = v.size(); i > 1; --i) {
      const size_t j = (size_t)below(i);
      std::swap(v[i - 1], v[j]);
    }
  }

  // k distinct indices from [0, n) in random order (partial Fisher-Yates); requires k <= n.
  std::vector<size_t> sample_indices(size_t n, size_t k) {
    std::vector<size_t> idx(n);
    for (size_t i = 0; i < n; ++i) idx[i] = i;
    for (size_t i = 0; i < k; ++i) {
      const size_t j = i + (size_t)below(n - i);
      std::swap(idx[i], idx[j]);
    }
    idx.resize(k);
    return idx;
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

// The SplitMix64 sequence as a stream: next() returns mix64(state) and advances state by the golden
// gamma, the generator the sampler, the targets' sampling and the training splits use.
inline uint64_t splitmix64_next(uint64_t& state) {
  const uint64_t r = mix64(state);
  state += 0x9e3779b97f4a7c15ull;
  return r;
}
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t state) : s_(state) {}
  uint64_t next() { return splitmix64_next(s_); }
  double uniform01() { return (double)(next() >> 11) * 0x1.0p-53; }  // [0, 1), 53 random bits
  uint64_t state() const { return s_; }

 private:
  uint64_t s_;
};

// A standard normal draw from two uniforms (Box-Muller, the cosine branch): the same value everywhere,
// unlike std::normal_distribution.
template <class Gen>
double standard_normal(Gen& g) {
  const double u1 = 1.0 - g.uniform01();  // (0, 1]: log(u1) is finite
  const double u2 = g.uniform01();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

namespace eval {
using kvzap::fnv1a64;
using kvzap::hash_combine;
using kvzap::mix64;
using kvzap::Rng;
}  // namespace eval

}  // namespace kvzap
