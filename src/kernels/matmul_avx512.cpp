// avx512 kernels (stub while the SIMD paths are written).
#include "kernels/kernel_table.h"

namespace kvzap::kernels {
MatmulKernel avx512_kernel(GgmlType) { return {}; }
const VectorKernels& avx512_vector_kernels() { return scalar_vector_kernels(); }
}  // namespace kvzap::kernels
