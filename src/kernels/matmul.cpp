// Matmul dispatch (ISA selection, activation preparation, splitting work over the pool), the scalar
// kernels, the float reference and the public row (de)quantizers.
#include "kernels/matmul.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/fp16.h"
#include "kernels/kernel_table.h"
#include "kernels/quant_ref.h"
#include "kvzap/error.h"

namespace kvzap {
namespace kernels {
namespace {

size_t scalar_act_bytes_q8_0(int64_t n) { return kernel_row_bytes(GgmlType::Q8_0, n); }
size_t scalar_act_bytes_q8_1(int64_t n) { return kernel_row_bytes(GgmlType::Q8_1, n); }
size_t scalar_act_bytes_q8_k(int64_t n) { return kernel_row_bytes(GgmlType::Q8_K, n); }
void scalar_prep_q8_0(const float* x, uint8_t* dst, int64_t n) { quantize_q8_0_ref(x, (BlockQ8_0*)dst, n); }
void scalar_prep_q8_1(const float* x, uint8_t* dst, int64_t n) { quantize_q8_1_ref(x, (BlockQ8_1*)dst, n); }
void scalar_prep_q8_k(const float* x, uint8_t* dst, int64_t n) { quantize_q8_K_ref(x, (BlockQ8_K*)dst, n); }
// F16 / BF16 weights: activations rounded to the weight type, kept as floats.
size_t scalar_act_bytes_f32(int64_t n) { return (size_t)n * sizeof(float); }
template <GgmlType W>
void scalar_prep_rounded(const float* x, uint8_t* dst, int64_t n) { quantize_activation_ref(W, x, dst, n); }

template <GgmlType T>
void scalar_compute(const WeightMatrix& w, const uint8_t* act, size_t act_stride, int64_t r0, int64_t r1,
                    int64_t t0, int64_t t1, float* y, int64_t ldy, uint8_t*) {
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* wr = w.data + (size_t)r * w.row_stride;
    for (int64_t t = t0; t < t1; ++t) y[t * ldy + r] = vec_dot_ref(T, wr, act + (size_t)t * act_stride, w.n_in);
  }
}

float scalar_dot_f32(const float* a, const float* b, int64_t n) {
  float s = 0;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}
float scalar_dot_f32_f16(const float* a, const uint16_t* b, int64_t n) {
  float s = 0;
  for (int64_t i = 0; i < n; ++i) s += a[i] * fp16_to_fp32(b[i]);
  return s;
}
void scalar_axpy_f16(float alpha, const uint16_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * fp16_to_fp32(x[i]);
}
void scalar_f32_to_f16_row(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = fp32_to_fp16(src[i]);
}

}  // namespace

MatmulKernel scalar_kernel(GgmlType type) {
  MatmulKernel k;
  switch (partner_type(type)) {
    case GgmlType::Q8_0: k.act_row_bytes = scalar_act_bytes_q8_0; k.prepare_act = scalar_prep_q8_0; break;
    case GgmlType::Q8_1: k.act_row_bytes = scalar_act_bytes_q8_1; k.prepare_act = scalar_prep_q8_1; break;
    case GgmlType::Q8_K: k.act_row_bytes = scalar_act_bytes_q8_k; k.prepare_act = scalar_prep_q8_k; break;
    case GgmlType::F16:
      k.act_row_bytes = scalar_act_bytes_f32;
      k.prepare_act = scalar_prep_rounded<GgmlType::F16>;
      break;
    case GgmlType::BF16:
      k.act_row_bytes = scalar_act_bytes_f32;
      k.prepare_act = scalar_prep_rounded<GgmlType::BF16>;
      break;
    default: break;
  }
  switch (type) {
    case GgmlType::F32: k.compute = scalar_compute<GgmlType::F32>; break;
    case GgmlType::F16: k.compute = scalar_compute<GgmlType::F16>; break;
    case GgmlType::BF16: k.compute = scalar_compute<GgmlType::BF16>; break;
    case GgmlType::Q4_0: k.compute = scalar_compute<GgmlType::Q4_0>; break;
    case GgmlType::Q4_1: k.compute = scalar_compute<GgmlType::Q4_1>; break;
    case GgmlType::Q5_0: k.compute = scalar_compute<GgmlType::Q5_0>; break;
    case GgmlType::Q5_1: k.compute = scalar_compute<GgmlType::Q5_1>; break;
    case GgmlType::Q8_0: k.compute = scalar_compute<GgmlType::Q8_0>; break;
    case GgmlType::Q4_K: k.compute = scalar_compute<GgmlType::Q4_K>; break;
    case GgmlType::Q5_K: k.compute = scalar_compute<GgmlType::Q5_K>; break;
    case GgmlType::Q6_K: k.compute = scalar_compute<GgmlType::Q6_K>; break;
    default: return {};
  }
  return k;
}

const VectorKernels& scalar_vector_kernels() {
  static const VectorKernels k{scalar_dot_f32, scalar_dot_f32_f16, scalar_axpy_f16, scalar_f32_to_f16_row};
  return k;
}

}  // namespace kernels

using namespace kernels;

namespace {

bool is_matmul_type(GgmlType t) {
  switch (t) {
    case GgmlType::F32: case GgmlType::F16: case GgmlType::BF16: case GgmlType::Q4_0: case GgmlType::Q4_1:
    case GgmlType::Q5_0: case GgmlType::Q5_1: case GgmlType::Q8_0: case GgmlType::Q4_K: case GgmlType::Q5_K:
    case GgmlType::Q6_K:
      return true;
    default:
      return false;
  }
}

#if defined(__x86_64__) || defined(__i386__)
// CPUID.1:ECX.F16C[bit 29]; clang (14) does not accept "f16c" in __builtin_cpu_supports.
static bool cpu_has_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
}
#endif

Isa detect_isa() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("fma") && cpu_has_f16c() &&
      __builtin_cpu_supports("bmi2"))
    return Isa::Avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c() &&
      __builtin_cpu_supports("bmi2"))
    return Isa::Avx2;
#endif
  return Isa::Scalar;
}

Isa clamp_isa(Isa want) { return std::min(want, detected_isa()); }

Isa isa_from_env() {
  const char* env = std::getenv("KVZAP_ISA");
  if (!env || !*env) return detected_isa();
  const std::string v = env;
  if (v == "scalar") return Isa::Scalar;
  if (v == "avx2") return clamp_isa(Isa::Avx2);
  if (v == "avx512") return clamp_isa(Isa::Avx512);
  throw Error("KVZAP_ISA='" + v + "' is not one of scalar, avx2, avx512");
}

std::atomic<int>& active_isa_slot() {
  static std::atomic<int> slot{(int)isa_from_env()};
  return slot;
}

MatmulKernel kernel_for(Isa isa, GgmlType type) {
  MatmulKernel k;
  if (isa >= Isa::Avx512) k = avx512_kernel(type);
  if (!k && isa >= Isa::Avx2) k = avx2_kernel(type);
  if (!k) k = scalar_kernel(type);
  return k;
}

const VectorKernels& vector_kernels() {
  switch (active_isa()) {
    case Isa::Avx512: return avx512_vector_kernels();
    case Isa::Avx2: return avx2_vector_kernels();
    default: return scalar_vector_kernels();
  }
}

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

constexpr size_t kAlign = 64;
uint8_t* align_up(uint8_t* p) { return (uint8_t*)(((uintptr_t)p + kAlign - 1) & ~(uintptr_t)(kAlign - 1)); }

void check_row(GgmlType type, int64_t n, const char* what) {
  const TypeGeometry g = geometry(type);
  if (!is_matmul_type(type) || g.block_elems == 0)
    throw Error(std::string(what) + ": unsupported type " + type_name(type));
  if (n < 0 || n % g.block_elems != 0)
    throw Error(std::string(what) + ": length " + std::to_string(n) + " is not a multiple of the " +
                type_name(type) + " block size " + std::to_string(g.block_elems));
}

void check_matrix(const WeightMatrix& w, const float* x, int64_t n_tok, const float* y) {
  check_row(w.type, w.n_in, "matmul");
  if (w.n_out < 0 || n_tok < 0) throw Error("matmul: negative dimension");
  if (w.row_stride < kernel_row_bytes(w.type, w.n_in))
    throw Error("matmul: row stride " + std::to_string(w.row_stride) + " is shorter than a " + type_name(w.type) +
                " row of " + std::to_string(w.n_in));
  if ((w.n_out > 0 && !w.data) || (n_tok > 0 && (!x || !y))) throw Error("matmul: null buffer");
}

// Work split. Token blocks keep the prepared activations of one block in L2; row chunks are multiples of
// 16 so micro-kernel tiles never straddle chunks (results do not depend on the split anyway).
constexpr int64_t kTokenBlock = 64;
constexpr int64_t kRowAlign = 16;

}  // namespace

void MatmulScratch::reserve(int64_t max_tokens, int64_t max_n_in, int max_threads) {
  if (max_threads <= 0) max_threads = ThreadPool::default_threads();
  const size_t need_act = (size_t)std::max<int64_t>(max_tokens, 1) * max_act_row_bytes(max_n_in) + kAlign;
  if (act.size() < need_act) act.resize(need_act);
  const size_t need_work = (size_t)max_threads * round_up((int64_t)max_work_bytes(max_n_in), kAlign) + kAlign;
  if (work.size() < need_work) work.resize(need_work);
}

Isa detected_isa() {
  static const Isa isa = detect_isa();
  return isa;
}

Isa active_isa() { return (Isa)active_isa_slot().load(std::memory_order_relaxed); }

void set_active_isa(Isa isa) { active_isa_slot().store((int)clamp_isa(isa), std::memory_order_relaxed); }

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Avx512: return "avx512";
    case Isa::Avx2: return "avx2";
    default: return "scalar";
  }
}

void matmul(const WeightMatrix& w, const float* x, int64_t n_tok, float* y, ThreadPool& pool,
            MatmulScratch& scratch) {
  const WeightMatrix* ws[1] = {&w};
  float* ys[1] = {y};
  matmul_group(ws, ys, 1, x, n_tok, pool, scratch);
}

void matmul_group(const WeightMatrix* const* ws, float* const* ys, int n_mats, const float* x, int64_t n_tok,
                  ThreadPool& pool, MatmulScratch& scratch) {
  if (n_mats <= 0) return;
  constexpr int kMaxMats = 4;
  bool shared = n_mats <= kMaxMats;
  for (int m = 0; m < n_mats; m++) {
    check_matrix(*ws[m], x, n_tok, ys[m]);
    shared = shared && ws[m]->type == ws[0]->type && ws[m]->n_in == ws[0]->n_in;
  }
  if (!shared) {  // different kernels or input formats: one job each
    for (int m = 0; m < n_mats; m++) matmul_group(&ws[m], &ys[m], 1, x, n_tok, pool, scratch);
    return;
  }
  if (n_tok == 0) return;
  const MatmulKernel k = kernel_for(active_isa(), ws[0]->type);
  const int nth = pool.size();
  const int64_t n_in = ws[0]->n_in;
  int64_t n_out_total = 0;
  for (int m = 0; m < n_mats; m++) n_out_total += ws[m]->n_out;
  if (n_out_total == 0) return;

  // Activations -> the kernel's format, once per call, reused for every weight row of every matrix.
  const uint8_t* act = reinterpret_cast<const uint8_t*>(x);
  size_t act_stride = (size_t)n_in * sizeof(float);
  if (k.act_row_bytes) {
    act_stride = k.act_row_bytes(n_in);
    const size_t need = act_stride * (size_t)n_tok + kAlign;
    if (scratch.act.size() < need) scratch.act.resize(need);  // only when reserve() was too small
    uint8_t* dst = align_up(scratch.act.data());
    constexpr int64_t kPrepTokens = 8;
    if (nth > 1 && n_tok >= 2 * kPrepTokens) {
      pool.parallel_for((n_tok + kPrepTokens - 1) / kPrepTokens, [&](int64_t c, int) {
        for (int64_t t = c * kPrepTokens; t < std::min(n_tok, (c + 1) * kPrepTokens); ++t)
          k.prepare_act(x + t * n_in, dst + (size_t)t * act_stride, n_in);
      });
    } else {
      for (int64_t t = 0; t < n_tok; ++t) k.prepare_act(x + t * n_in, dst + (size_t)t * act_stride, n_in);
    }
    act = dst;
  }

  const int64_t tok_block = std::min(n_tok, k.token_block > 0 ? k.token_block : kTokenBlock);
  const int64_t n_tb = (n_tok + tok_block - 1) / tok_block;
  // Aim for ~4 work items per thread (dynamic hand-out evens out the rest).
  const int64_t max_rows = n_tb > 1 || n_tok > 4 ? 64 : 512;
  int64_t rows = round_up((n_out_total * n_tb + 4 * nth - 1) / (4 * nth), kRowAlign);
  rows = std::clamp<int64_t>(rows, kRowAlign, max_rows);
  int64_t first_item[kMaxMats + 1];  // items of matrix m: [first_item[m], first_item[m + 1])
  first_item[0] = 0;
  for (int m = 0; m < n_mats; m++) first_item[m + 1] = first_item[m] + (ws[m]->n_out + rows - 1) / rows * n_tb;

  // Per-thread workspace slices.
  size_t work_stride = 0;
  uint8_t* work = nullptr;
  if (k.work_bytes) {
    work_stride = (size_t)round_up((int64_t)k.work_bytes(n_in), kAlign);
    const size_t need = work_stride * (size_t)nth + kAlign;
    if (scratch.work.size() < need) scratch.work.resize(need);  // only when reserve() was too small
    work = align_up(scratch.work.data());
  }

  pool.parallel_for(first_item[n_mats], [&](int64_t item, int tid) {
    int m = 0;
    while (item >= first_item[m + 1]) m++;
    const WeightMatrix& w = *ws[m];
    const int64_t local = item - first_item[m];
    const int64_t n_rc = (w.n_out + rows - 1) / rows;
    const int64_t rc = local % n_rc, tb = local / n_rc;
    const int64_t r0 = rc * rows, r1 = std::min(w.n_out, r0 + rows);
    const int64_t t0 = tb * tok_block, t1 = std::min(n_tok, t0 + tok_block);
    k.compute(w, act, act_stride, r0, r1, t0, t1, ys[m], w.n_out, work ? work + work_stride * (size_t)tid : nullptr);
  });
}

void matmul_reference(const WeightMatrix& w, const float* x, int64_t n_tok, float* y) {
  check_matrix(w, x, n_tok, y);
  std::vector<float> row((size_t)w.n_in);
  for (int64_t o = 0; o < w.n_out; ++o) {
    dequantize_row_ref(w.type, w.data + (size_t)o * w.row_stride, row.data(), w.n_in);
    for (int64_t t = 0; t < n_tok; ++t) {
      const float* xt = x + t * w.n_in;
      double s = 0;
      for (int64_t i = 0; i < w.n_in; ++i) s += (double)row[(size_t)i] * (double)xt[i];
      y[t * w.n_out + o] = (float)s;
    }
  }
}

void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n) {
  check_row(type, n, "dequantize_row");
  dequantize_row_ref(type, src, dst, n);
}

void quantize_row(GgmlType type, const float* src, void* dst, int64_t n) {
  check_row(type, n, "quantize_row");
  quantize_row_ref(type, src, dst, n);
}

float dot_f32_f16(const float* a, const uint16_t* b, int64_t n) { return vector_kernels().dot_f32_f16(a, b, n); }
void axpy_f16(float alpha, const uint16_t* x, float* y, int64_t n) { vector_kernels().axpy_f16(alpha, x, y, n); }
void f32_to_f16_row(const float* src, uint16_t* dst, int64_t n) { vector_kernels().f32_to_f16_row(src, dst, n); }
float dot_f32(const float* a, const float* b, int64_t n) { return vector_kernels().dot_f32(a, b, n); }

}  // namespace kvzap
