// The vector type of the kernel's micro-kernels: ATen's at::vec::Vectorized<float>, at the width
// the compiler targets (-march=native where the set-up builds; a variant's flags elsewhere).
// Vectorized is ATen's own CPU-dispatch layer (its 256-bit AVX2 and 512-bit AVX-512 classes);
// ATen compiles one copy per ISA and picks at run time, a build of this kernel picks at compile
// time, so one source serves every x86 host: kLanes floats a vector.
//
// Must be the first include of the kernel: ATen's vec headers read CPU_CAPABILITY_* when first
// included, and torch/extension.h includes them too.
#pragma once

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__AVX512VL__) && defined(__FMA__)
#define CPU_CAPABILITY AVX512
#define CPU_CAPABILITY_AVX512
#define GRIDSHARD_ISA "avx512"
#define GRIDSHARD_SIMD 1
#elif defined(__AVX2__) && defined(__FMA__)
#define CPU_CAPABILITY AVX2
#define CPU_CAPABILITY_AVX2
#define GRIDSHARD_ISA "avx2"
#define GRIDSHARD_SIMD 1
#else
#define CPU_CAPABILITY DEFAULT
#define GRIDSHARD_ISA "scalar"
#define GRIDSHARD_SIMD 0  // no vector micro-kernels: BLAS and loops the compiler vectorises
#endif

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

namespace simd {

using Vec = at::vec::Vectorized<float>;
using IntVec = at::vec::Vectorized<int32_t>;
constexpr int kLanes = Vec::size();

#if GRIDSHARD_SIMD
// Each lane shifted left by the constant `bits` (Vectorized's own shift takes a vector of counts,
// which GCC keeps as a variable shift with its counts in memory).
template <int bits>
inline IntVec shift_left(IntVec x) {
#if defined(CPU_CAPABILITY_AVX512)
  return _mm512_slli_epi32(x, bits);
#else
  return _mm256_slli_epi32(x, bits);
#endif
}
#endif

}  // namespace simd
