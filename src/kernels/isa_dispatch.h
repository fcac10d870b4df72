// One ISA dispatch for the portable (auto-vectorised) kernels outside src/kernels: a body written once in
// plain C++ is compiled three times — with the feature sets the *_avx512.cpp and *_avx2.cpp files are
// compiled with, and baseline x86-64 — and each call picks its variant by active_isa(), so KVZAP_ISA and
// set_active_isa() select it exactly as they select the matmul kernels. (target_clones picked by CPU
// alone: under KVZAP_ISA=avx2 an AVX-512 host still ran AVX-512 code, and TSan crashed in its resolvers.)
//
//   KVZAP_INLINE_BODY void softmax_row_body(float* x, int64_t n) { ... }
//   KVZAP_ISA_DISPATCH(void, softmax_row, (float* x, int64_t n), (x, n))
//
// defines softmax_row(float*, int64_t). The body must be inlinable (KVZAP_INLINE_BODY): it is inlined into
// each target-specific wrapper and compiled for that target there.
#pragma once
#include "kernels/matmul.h"

#define KVZAP_INLINE_BODY static inline __attribute__((always_inline))

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KVZAP_TARGET_AVX512 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c,bmi2")))
#define KVZAP_TARGET_AVX2 __attribute__((target("avx2,fma,f16c,bmi2")))
#define KVZAP_ISA_DISPATCH(ret, name, params, args)                            \
  KVZAP_TARGET_AVX512 static ret name##_isa_avx512 params { return name##_body args; } \
  KVZAP_TARGET_AVX2 static ret name##_isa_avx2 params { return name##_body args; }     \
  static ret name##_isa_baseline params { return name##_body args; }                   \
  ret name params {                                                            \
    switch (::kvzap::active_isa()) {                                           \
      case ::kvzap::Isa::Avx512: return name##_isa_avx512 args;                \
      case ::kvzap::Isa::Avx2: return name##_isa_avx2 args;                    \
      default: return name##_isa_baseline args;                                \
    }                                                                          \
  }
#else
#define KVZAP_ISA_DISPATCH(ret, name, params, args) \
  ret name params { return name##_body args; }
#endif
