// Fused spec-decode Gated DeltaNet step: gating + recurrent delta rule for the k+1 tokens of
// every sequence in one launch (contract: vLLM 0.21 `fused_sigmoid_gating_delta_rule_update`).
//
//   g    = -exp(A_log) * softplus(a + dt_bias)      beta = sigmoid(b)
//   q, k = l2norm(q), l2norm(k) (optional);  q *= scale
//   h    = e^g h;  h += k (beta (v - h k));  o = h q      (per token, h[v][k] in f32)
//
// Continuous batching: the initial state is ssm_state[idx[n, num_accepted[n] - 1]] (column 0
// without spec decoding); after token i the state is written to ssm_state[idx[n, i]] when that
// index is > 0 (NULL block 0 is skipped), exactly like the Triton kernel, so the rejected
// tokens' states are available to the next step. One block per (sequence, value head, 32 rows
// of V); each row is owned by 4 threads holding 32 state columns each, in registers.
//
// The causal-conv1d update is deliberately not fused: its state update is in place in a cache
// line shared by the q/k channels of several value-head blocks, so fusing it needs either a
// grid-wide barrier or one block per key head (3-12x fewer blocks at batch 1).
#include "gdn_common.cuh"

namespace tbgdn {

struct DecodeArgs {
  const void* A_log;
  const void* a;
  const void* b;
  const void* dt_bias;
  int A_log_dtype, a_dtype, b_dtype, dt_dtype;
  long long a_st, b_st;
  const void* q;
  const void* k;
  const void* v;
  long long q_st, q_sh, k_st, k_sh, v_st, v_sh;
  void* o;  // [T][Hv][V] contiguous
  float* h0;
  long long h0_stride;  // elements between cache lines (indexed) or sequences (not indexed)
  float* ht;
  long long ht_stride;  // elements between cache lines (in place) or tokens (not in place)
  const int* cu_seqlens;
  int N, T_per_seq;
  const void* idx;
  int idx64;
  long long idx_s_seq, idx_s_tok;
  const int* num_accepted;
  int Hk, Hv;
  float scale, softplus_beta, softplus_threshold;
  int l2norm, inplace;
};

template <typename T>
__global__ void __launch_bounds__(128) gdn_decode_kernel(DecodeArgs a) {
  using E = Elt<T>;
  __shared__ __align__(16) float sQ[kHeadDim];
  __shared__ __align__(16) float sK[kHeadDim];
  __shared__ float sRed[2][4];
  __shared__ float sGate[2];

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int row = tid >> 2, sub = tid & 3;
  const int hv = blockIdx.y, n = blockIdx.z;
  const int vrow = blockIdx.x * 32 + row;
  const int hk = hv / (a.Hv / a.Hk);

  long long bos, Tn;
  if (a.cu_seqlens) {
    bos = a.cu_seqlens[n];
    Tn = a.cu_seqlens[n + 1] - bos;
  } else {
    bos = (long long)n * a.T_per_seq;
    Tn = a.T_per_seq;
  }
  if (Tn <= 0) return;

  const long long head_off = ((long long)hv * kHeadDim + vrow) * kHeadDim + sub * 32;
  float h[32];
#pragma unroll
  for (int j = 0; j < 32; ++j) h[j] = 0.f;
  if (a.h0) {
    const float* src;
    if (a.idx) {
      const long long it = a.num_accepted ? (long long)a.num_accepted[n] - 1 : 0;
      const long long si = load_index(a.idx, a.idx64, n * a.idx_s_seq + it * a.idx_s_tok);
      if (si <= 0) return;  // padded slot: nothing to do (the Triton kernel skips it too)
      src = a.h0 + si * a.h0_stride;
    } else {
      src = a.h0 + (long long)n * a.h0_stride;
    }
    const float4* s4 = reinterpret_cast<const float4*>(src + head_off);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float4 x = s4[j];
      h[4 * j] = x.x;
      h[4 * j + 1] = x.y;
      h[4 * j + 2] = x.z;
      h[4 * j + 3] = x.w;
    }
  }

  const T* qp = reinterpret_cast<const T*>(a.q) + (long long)hk * a.q_sh + tid;
  const T* kp = reinterpret_cast<const T*>(a.k) + (long long)hk * a.k_sh + tid;
  const T* vp = reinterpret_cast<const T*>(a.v) + (long long)hv * a.v_sh + vrow;
  T* op = reinterpret_cast<T*>(a.o) + (long long)hv * kHeadDim + vrow;

  for (long long i = 0; i < Tn; ++i) {
    const long long tok = bos + i;
    float qv = E::to_f(qp[tok * a.q_st]);
    float kv = E::to_f(kp[tok * a.k_st]);
    if (a.l2norm) {
      float sq = qv * qv, sk = kv * kv;
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) {
        sq += __shfl_xor_sync(0xffffffffu, sq, off);
        sk += __shfl_xor_sync(0xffffffffu, sk, off);
      }
      if (lane == 0) {
        sRed[0][warp] = sq;
        sRed[1][warp] = sk;
      }
    }
    if (tid == 0) {
      const float x = load_scalar(a.a, a.a_dtype, tok * a.a_st + hv) +
                      load_scalar(a.dt_bias, a.dt_dtype, hv);
      const float bx = a.softplus_beta * x;
      const float sp = bx <= a.softplus_threshold ? log1pf(expf(bx)) / a.softplus_beta : x;
      const float g = -expf(load_scalar(a.A_log, a.A_log_dtype, hv)) * sp;
      const float bb = load_scalar(a.b, a.b_dtype, tok * a.b_st + hv);
      sGate[0] = expf(g);
      sGate[1] = 1.f / (1.f + expf(-bb));
    }
    __syncthreads();
    if (a.l2norm) {
      qv *= rsqrtf(sRed[0][0] + sRed[0][1] + sRed[0][2] + sRed[0][3] + 1e-6f);
      kv *= rsqrtf(sRed[1][0] + sRed[1][1] + sRed[1][2] + sRed[1][3] + 1e-6f);
    }
    sQ[tid] = qv * a.scale;
    sK[tid] = kv;
    __syncthreads();

    const float decay = sGate[0], beta = sGate[1];
    const float4* k4 = reinterpret_cast<const float4*>(sK + sub * 32);
    const float4* q4 = reinterpret_cast<const float4*>(sQ + sub * 32);
    float dot = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float4 kk = k4[j];
      h[4 * j] *= decay;
      h[4 * j + 1] *= decay;
      h[4 * j + 2] *= decay;
      h[4 * j + 3] *= decay;
      dot += h[4 * j] * kk.x + h[4 * j + 1] * kk.y + h[4 * j + 2] * kk.z + h[4 * j + 3] * kk.w;
    }
    dot += __shfl_xor_sync(0xffffffffu, dot, 1);
    dot += __shfl_xor_sync(0xffffffffu, dot, 2);
    const float delta = (E::to_f(vp[tok * a.v_st]) - dot) * beta;
    float out = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float4 kk = k4[j], qq = q4[j];
      h[4 * j] += delta * kk.x;
      h[4 * j + 1] += delta * kk.y;
      h[4 * j + 2] += delta * kk.z;
      h[4 * j + 3] += delta * kk.w;
      out += h[4 * j] * qq.x + h[4 * j + 1] * qq.y + h[4 * j + 2] * qq.z + h[4 * j + 3] * qq.w;
    }
    out += __shfl_xor_sync(0xffffffffu, out, 1);
    out += __shfl_xor_sync(0xffffffffu, out, 2);
    if (sub == 0) op[tok * a.Hv * kHeadDim] = E::from_f(out);

    float* dst = nullptr;
    if (a.inplace) {
      const long long di = load_index(a.idx, a.idx64, n * a.idx_s_seq + i * a.idx_s_tok);
      if (di > 0) dst = a.ht + di * a.ht_stride;
    } else if (a.ht) {
      dst = a.ht + tok * a.ht_stride;
    }
    if (dst) {
      float4* d4 = reinterpret_cast<float4*>(dst + head_off);
#pragma unroll
      for (int j = 0; j < 8; ++j) d4[j] = make_float4(h[4 * j], h[4 * j + 1], h[4 * j + 2], h[4 * j + 3]);
    }
    __syncthreads();  // sQ/sK/sRed/sGate are rewritten by the next token
  }
}

}  // namespace tbgdn

using namespace tbgdn;

extern "C" {

// Returns 0, a cudaError_t (>0), or -1 head dims, -2 heads, -4 dtype, -5 in place without indices.
int tb_gdn_spec_decode(int dtype, const void* A_log, int A_log_dtype, const void* a, int a_dtype,
                       long long a_st, const void* b, int b_dtype, long long b_st,
                       const void* dt_bias, int dt_dtype, const void* q, const void* k,
                       const void* v, long long q_st, long long q_sh, long long k_st,
                       long long k_sh, long long v_st, long long v_sh, void* o, float* h0,
                       long long h0_stride, float* ht, long long ht_stride,
                       const int* cu_seqlens, int N, int T_per_seq, const void* idx, int idx64,
                       long long idx_s_seq, long long idx_s_tok, const int* num_accepted, int Hk,
                       int Hv, int K, int V, float scale, float softplus_beta,
                       float softplus_threshold, int l2norm, int inplace, void* stream) {
  if (K != kHeadDim || V != kHeadDim) return -1;
  if (Hk <= 0 || Hv <= 0 || Hv % Hk != 0) return -2;
  if (dtype != 0 && dtype != 1) return -4;
  if (inplace && (!idx || !ht)) return -5;
  if (N <= 0) return 0;
  DecodeArgs d{A_log, a, b, dt_bias, A_log_dtype, a_dtype, b_dtype, dt_dtype, a_st, b_st,
               q, k, v, q_st, q_sh, k_st, k_sh, v_st, v_sh, o, h0, h0_stride, ht, ht_stride,
               cu_seqlens, N, T_per_seq, idx, idx64, idx_s_seq, idx_s_tok, num_accepted,
               Hk, Hv, scale, softplus_beta, softplus_threshold, l2norm, inplace};
  const dim3 grid(kHeadDim / 32, (unsigned)Hv, (unsigned)N);
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  if (dtype == 0)
    gdn_decode_kernel<__half><<<grid, 128, 0, s>>>(d);
  else
    gdn_decode_kernel<__nv_bfloat16><<<grid, 128, 0, s>>>(d);
  return (int)cudaGetLastError();
}

int tb_gdn_abi_version() { return 1; }

const char* tb_gdn_error_string(int code) {
  switch (code) {
    case -1: return "head dimensions must be K == V == 128";
    case -2: return "value heads must be a positive multiple of key heads";
    case -3: return "workspace too small";
    case -4: return "unsupported activation dtype (fp16 or bf16)";
    case -5: return "in-place state update needs state indices and a state tensor";
    default: return cudaGetErrorString(static_cast<cudaError_t>(code));
  }
}

}  // extern "C"
