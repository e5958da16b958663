// Shared helpers for the turingbox Gated DeltaNet kernels.
//
// Everything here targets sm_75 and newer: the only tensor-core instruction used is
// mma.sync.m16n8k8 (f16 inputs, f32 accumulate), which Turing has; m16n8k16 and bf16 mma
// need sm_80, cp.async needs sm_80, so neither is used. bf16 inputs are converted to f16
// when fragments are loaded (Turing has no bf16 tensor-core path).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace tbgdn {

constexpr int kHeadDim = 128;  // K == V == 128 (Qwen3.5/3.6 GDN); checked by the launchers.
constexpr int kChunk = 64;     // chunk length, as FLA's FLA_CHUNK_SIZE.

// D += A(16x8, row) * B(8x8, col); f16 inputs, f32 accumulators.
// Fragment layout (PTX ISA, mma.m16n8k8 .f16): with g = lane / 4, t = lane % 4,
//   a0 = {A[g][2t], A[g][2t+1]}, a1 = {A[g+8][2t], A[g+8][2t+1]},
//   b0 = {B[2t][g], B[2t+1][g]},
//   d0,d1 = D[g][2t], D[g][2t+1]; d2,d3 = D[g+8][2t], D[g+8][2t+1].
__device__ __forceinline__ void mma_16x8x8(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t b0) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 "
      "{%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(b0));
}

__device__ __forceinline__ uint32_t pack_f2h(float lo, float hi) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

__device__ __forceinline__ uint32_t pack_hh(__half lo, __half hi) {
  return static_cast<uint32_t>(__half_as_ushort(lo)) |
         (static_cast<uint32_t>(__half_as_ushort(hi)) << 16);
}

// Input element type traits: fp16 and bf16 activations, f16 for the tensor cores.
template <typename T> struct Elt;

template <> struct Elt<__half> {
  static __device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
  static __device__ __forceinline__ __half from_f(float x) { return __float2half_rn(x); }
  static __device__ __forceinline__ __half to_h(__half x) { return x; }
  // Two consecutive elements as a packed f16 pair (p must be 4-byte aligned).
  static __device__ __forceinline__ uint32_t pair_h(const __half* p) {
    return *reinterpret_cast<const uint32_t*>(p);
  }
  static __device__ __forceinline__ void store_pair(__half* p, float a, float b) {
    *reinterpret_cast<__half2*>(p) = __floats2half2_rn(a, b);
  }
};

template <> struct Elt<__nv_bfloat16> {
  static __device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
  static __device__ __forceinline__ __nv_bfloat16 from_f(float x) { return __float2bfloat16_rn(x); }
  static __device__ __forceinline__ __half to_h(__nv_bfloat16 x) {
    return __float2half_rn(__bfloat162float(x));
  }
  static __device__ __forceinline__ uint32_t pair_h(const __nv_bfloat16* p) {
    float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
    return pack_f2h(f.x, f.y);
  }
  static __device__ __forceinline__ void store_pair(__nv_bfloat16* p, float a, float b) {
    *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(a, b);
  }
};

// Scalars whose dtype is decided at run time (gating parameters, indices): 0 f32, 1 f16, 2 bf16.
__device__ __forceinline__ float load_scalar(const void* p, int dtype, long long i) {
  if (dtype == 1) return __half2float(reinterpret_cast<const __half*>(p)[i]);
  if (dtype == 2) return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(p)[i]);
  return reinterpret_cast<const float*>(p)[i];
}

// 0: int32, 1: int64.
__device__ __forceinline__ long long load_index(const void* p, int idx64, long long i) {
  if (idx64) return reinterpret_cast<const long long*>(p)[i];
  return reinterpret_cast<const int*>(p)[i];
}

}  // namespace tbgdn
