// Chunked gated delta rule (prefill) on tensor cores, sm_75 and newer.
//
// Contract: vLLM 0.21 `chunk_gated_delta_rule` (FLA): q, k [1, T, Hk, 128], v [1, T, Hv, 128],
// g (log gate, f32) and beta (f32) [1, T, Hv], varlen cu_seqlens [N+1] (int32), initial/final
// state [N, Hv, V, K] f32 (FLA stores the state transposed: h[v][k]). Value head hv reads key
// head hv / (Hv / Hk).
//
// Two launches, both on the caller's stream, no allocation, no host sync:
//  1. gdn_chunk_prep_kernel, one block per (chunk, value head), fully parallel:
//       Gc = chunk-local cumsum(g)
//       A  = strict_tril(beta_t k_t.k_s exp(Gc_t - Gc_s))          (K K^T on tensor cores)
//       P  = scale * tril(q_t.k_s exp(Gc_t - Gc_s))                 (Q K^T on tensor cores)
//       T  = (I + A)^-1                                             (blocked solve, f32)
//       W  = T diag(beta e^Gc) K,  U = T diag(beta) V               (tensor cores)
//  2. gdn_chunk_state_kernel, one block per (sequence, value head, 32-wide slice of V),
//     sequential over the chunks of its sequence, state h[v][k] in f32 registers:
//       Vn = U - W S                                                (tensor cores)
//       O  = scale e^Gc (Q S) + P Vn                                (tensor cores)
//       S  = e^Gc_last S + K^T (diag(e^(Gc_last - Gc)) Vn)          (tensor cores)
// Precision mirrors FLA: f16 operands (T, W, U, Vn, the state copy used as an operand),
// f32 accumulation, f32 state; the 64x64 triangular solve stays in f32 (FLA's default is
// IEEE f32 there too) and is <1% of the chunk's FLOPs.
#include "gdn_common.cuh"

namespace tbgdn {

struct PrepArgs {
  const void* q;
  const void* k;
  const void* v;
  const float* g;     // [T][Hv]
  const float* beta;  // [T][Hv]
  const int* cu_seqlens;
  int N, Hk, Hv;
  long long q_st, q_sh, k_st, k_sh, v_st, v_sh;
  float scale;
  __half* W;   // [T][Hv][128]
  __half* U;   // [T][Hv][128]
  __half* P;   // [T][Hv][64]
  float* Gc;   // [T][Hv]
};

constexpr int kSK = 136;  // padded f16 row stride: conflict-free 32-bit fragment loads
constexpr int kSA = 72;   // padded f32 row stride: conflict-free float2 fragment loads

// out[r][n] = sum_s T[r][s] * fac[s] * M[s][n] for the warp's 16 rows x 64 columns.
__device__ __forceinline__ void t_times_panel(const float (*sA)[kSA], const __half (*sM)[kSK],
                                              const float* fac, int warp, int gq, int tq,
                                              float (&acc)[8][4]) {
  const int r0 = (warp & 3) * 16 + gq;
  const int nbase = (warp >> 2) * 64;
#pragma unroll
  for (int j = 0; j < 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
#pragma unroll
  for (int ks = 0; ks < 8; ++ks) {
    const int c = ks * 8 + 2 * tq;
    const float2 x0 = *reinterpret_cast<const float2*>(&sA[r0][c]);
    const float2 x1 = *reinterpret_cast<const float2*>(&sA[r0 + 8][c]);
    const uint32_t a0 = pack_f2h(x0.x, x0.y);
    const uint32_t a1 = pack_f2h(x1.x, x1.y);
    const float f0 = fac[c], f1 = fac[c + 1];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int n = nbase + j * 8 + gq;
      const uint32_t b = pack_f2h(__half2float(sM[c][n]) * f0, __half2float(sM[c + 1][n]) * f1);
      mma_16x8x8(acc[j], a0, a1, b);
    }
  }
}

__device__ __forceinline__ void store_panel(__half* out, const float (&acc)[8][4], int bos, int L,
                                            int Hv, int hv, int warp, int gq, int tq) {
  const int r0 = (warp & 3) * 16 + gq;
  const int nbase = (warp >> 2) * 64;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int n = nbase + j * 8 + 2 * tq;
    if (r0 < L)
      *reinterpret_cast<__half2*>(out + ((long long)(bos + r0) * Hv + hv) * kHeadDim + n) =
          __floats2half2_rn(acc[j][0], acc[j][1]);
    if (r0 + 8 < L)
      *reinterpret_cast<__half2*>(out + ((long long)(bos + r0 + 8) * Hv + hv) * kHeadDim + n) =
          __floats2half2_rn(acc[j][2], acc[j][3]);
  }
}

template <typename T>
__device__ __forceinline__ void load_panel(__half (*sM)[kSK], const T* base, long long st, int L,
                                           int tid) {
  // 64 rows x 128 columns, 8 elements per step; rows past the sequence end are zero.
  for (int idx = tid; idx < kChunk * 16; idx += 256) {
    const int r = idx >> 4, c = (idx & 15) * 8;
    uint32_t w0 = 0, w1 = 0, w2 = 0, w3 = 0;
    if (r < L) {
      const T* src = base + (long long)r * st + c;
      w0 = Elt<T>::pair_h(src);
      w1 = Elt<T>::pair_h(src + 2);
      w2 = Elt<T>::pair_h(src + 4);
      w3 = Elt<T>::pair_h(src + 6);
    }
    *reinterpret_cast<uint4*>(&sM[r][c]) = make_uint4(w0, w1, w2, w3);
  }
}

template <typename T>
__global__ void __launch_bounds__(256) gdn_chunk_prep_kernel(PrepArgs a) {
  using E = Elt<T>;
  __shared__ __align__(16) __half sK[kChunk][kSK];  // K, later V
  __shared__ __align__(16) float sA[kChunk][kSA];   // A, then T = (I + A)^-1 in place
  __shared__ float sX[16][kChunk + 4];
  __shared__ float sG[kChunk], sBeta[kChunk], sF[kChunk];
  __shared__ int sInfo[2];

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int gq = lane >> 2, tq = lane & 3;
  const int hv = blockIdx.y;
  const int hk = hv / (a.Hv / a.Hk);

  if (tid == 0) {
    // Map the flat chunk id to (sequence, chunk) without a host-side chunk table.
    int b = blockIdx.x, acc = 0, bos = -1, L = 0;
    for (int n = 0; n < a.N; ++n) {
      const int s = a.cu_seqlens[n], e = a.cu_seqlens[n + 1];
      const int nch = (e - s + kChunk - 1) / kChunk;
      if (b < acc + nch) {
        bos = s + (b - acc) * kChunk;
        L = min(kChunk, e - bos);
        break;
      }
      acc += nch;
    }
    sInfo[0] = bos;
    sInfo[1] = L;
  }
  __syncthreads();
  const int bos = sInfo[0], L = sInfo[1];
  if (bos < 0) return;

  load_panel<T>(sK, reinterpret_cast<const T*>(a.k) + (long long)bos * a.k_st + (long long)hk * a.k_sh,
                a.k_st, L, tid);
  if (tid < kChunk) {
    float gv = 0.f, bv = 0.f;
    if (tid < L) {
      const long long o = (long long)(bos + tid) * a.Hv + hv;
      gv = a.g[o];
      bv = a.beta[o];
    }
    sG[tid] = gv;
    sBeta[tid] = bv;
  }
  __syncthreads();
  if (warp == 0) {  // chunk-local inclusive cumsum of g, two elements per lane
    const float x0 = sG[2 * lane], x1 = sG[2 * lane + 1];
    float s = x0 + x1;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const float y = __shfl_up_sync(0xffffffffu, s, off);
      if (lane >= off) s += y;
    }
    const float c0 = s - x1, c1 = s;
    sG[2 * lane] = c0;
    sG[2 * lane + 1] = c1;
    sF[2 * lane] = sBeta[2 * lane] * expf(c0);
    sF[2 * lane + 1] = sBeta[2 * lane + 1] * expf(c1);
  }
  __syncthreads();
  if (tid < L) a.Gc[(long long)(bos + tid) * a.Hv + hv] = sG[tid];

  // ---- K K^T and Q K^T: warp -> 16 rows (warp & 3) x 32 columns (warp >> 2) ----
  {
    const int r0 = (warp & 3) * 16 + gq, r1 = r0 + 8;
    const int nh = warp >> 2;
    float acck[4][4], accq[4][4];
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acck[j][e] = accq[j][e] = 0.f;
    const T* qbase = reinterpret_cast<const T*>(a.q) + (long long)hk * a.q_sh;
    const T* q0 = r0 < L ? qbase + (long long)(bos + r0) * a.q_st : nullptr;
    const T* q1 = r1 < L ? qbase + (long long)(bos + r1) * a.q_st : nullptr;
#pragma unroll 4
    for (int ks = 0; ks < 16; ++ks) {
      const int c = ks * 8 + 2 * tq;
      const uint32_t ak0 = *reinterpret_cast<const uint32_t*>(&sK[r0][c]);
      const uint32_t ak1 = *reinterpret_cast<const uint32_t*>(&sK[r1][c]);
      const uint32_t aq0 = q0 ? E::pair_h(q0 + c) : 0u;
      const uint32_t aq1 = q1 ? E::pair_h(q1 + c) : 0u;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t b = *reinterpret_cast<const uint32_t*>(&sK[nh * 32 + j * 8 + gq][c]);
        mma_16x8x8(acck[j], ak0, ak1, b);
        mma_16x8x8(accq[j], aq0, aq1, b);
      }
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float pv[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e < 2 ? r0 : r1;
        const int col = nh * 32 + j * 8 + 2 * tq + (e & 1);
        const bool lower = r >= col && r < L;
        const float decay = lower ? expf(sG[r] - sG[col]) : 0.f;
        sA[r][col] = (lower && r != col) ? acck[j][e] * sBeta[r] * decay : 0.f;
        pv[e] = lower ? accq[j][e] * decay * a.scale : 0.f;
      }
      const int col = nh * 32 + j * 8 + 2 * tq;
      if (r0 < L)
        *reinterpret_cast<__half2*>(a.P + ((long long)(bos + r0) * a.Hv + hv) * kChunk + col) =
            __floats2half2_rn(pv[0], pv[1]);
      if (r1 < L)
        *reinterpret_cast<__half2*>(a.P + ((long long)(bos + r1) * a.Hv + hv) * kChunk + col) =
            __floats2half2_rn(pv[2], pv[3]);
    }
  }
  __syncthreads();

  // ---- T = (I + A)^-1, forward substitution by 16-row blocks, in place in sA ----
  float x[16];
#pragma unroll
  for (int b = 0; b < 4; ++b) {
    {
      // Rows of T above this block are final: X = E - A[R_b, :16b] T[:16b, :].
      const int c = tid & 63, rq = tid >> 6;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int r = rq * 4 + i, R = 16 * b + r;
        float s = (R == c) ? 1.f : 0.f;
        for (int j = 0; j < 16 * b; ++j) s -= sA[R][j] * sA[j][c];
        sX[r][c] = s;
      }
    }
    __syncthreads();
    if (tid < kChunk) {
      const int c = tid;
#pragma unroll
      for (int r = 0; r < 16; ++r) {
        float s = sX[r][c];
#pragma unroll
        for (int rr = 0; rr < r; ++rr) s -= sA[16 * b + r][16 * b + rr] * x[rr];
        x[r] = s;
      }
    }
    __syncthreads();
    if (tid < kChunk) {
#pragma unroll
      for (int r = 0; r < 16; ++r) sA[16 * b + r][tid] = x[r];
    }
    __syncthreads();
  }

  // ---- W = T diag(beta e^G) K ; U = T diag(beta) V ----
  float acc[8][4];
  t_times_panel(sA, sK, sF, warp, gq, tq, acc);
  store_panel(a.W, acc, bos, L, a.Hv, hv, warp, gq, tq);
  __syncthreads();
  load_panel<T>(sK, reinterpret_cast<const T*>(a.v) + (long long)bos * a.v_st + (long long)hv * a.v_sh,
                a.v_st, L, tid);
  __syncthreads();
  t_times_panel(sA, sK, sBeta, warp, gq, tq, acc);
  store_panel(a.U, acc, bos, L, a.Hv, hv, warp, gq, tq);
}

struct StateArgs {
  const void* q;
  const void* k;
  long long q_st, q_sh, k_st, k_sh;
  const __half* W;
  const __half* U;
  const __half* P;
  const float* Gc;
  const int* cu_seqlens;
  int N, Hk, Hv;
  float scale;
  const float* h0;  // [N][Hv][V][K] or null
  float* ht;        // [N][Hv][V][K] or null (may alias h0)
  void* o;
  long long o_st, o_sh;
};

constexpr int kBV = 32;  // V columns per block

template <typename T>
__global__ void __launch_bounds__(128) gdn_chunk_state_kernel(StateArgs a) {
  using E = Elt<T>;
  __shared__ __align__(16) __half sH[kBV][kSK];        // f16 copy of the state slice, h[v][k]
  __shared__ __align__(16) __half sVn[kBV][kChunk + 8];  // Vn^T [v][t]
  __shared__ __align__(16) __half sVd[kBV][kChunk + 8];  // (decayed Vn)^T [v][t]
  __shared__ float sG[kChunk];

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int gq = lane >> 2, tq = lane & 3;
  const int v0 = blockIdx.x * kBV, hv = blockIdx.y, n = blockIdx.z;
  const int hk = hv / (a.Hv / a.Hk);
  const int seq_bos = a.cu_seqlens[n], seq_eos = a.cu_seqlens[n + 1];
  const long long sbase = ((long long)n * a.Hv + hv) * kHeadDim * kHeadDim;

  // State accumulators h[v][d]: v = 16 mi + gq (+8), d = 32 warp + 8 j + 2 tq (+1).
  float hacc[2][4][4];
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int v = v0 + 16 * mi + gq, d = 32 * warp + 8 * j + 2 * tq;
      float2 x = make_float2(0.f, 0.f), y = make_float2(0.f, 0.f);
      if (a.h0) {
        x = *reinterpret_cast<const float2*>(a.h0 + sbase + (long long)v * kHeadDim + d);
        y = *reinterpret_cast<const float2*>(a.h0 + sbase + (long long)(v + 8) * kHeadDim + d);
      }
      hacc[mi][j][0] = x.x;
      hacc[mi][j][1] = x.y;
      hacc[mi][j][2] = y.x;
      hacc[mi][j][3] = y.y;
    }
  auto write_sH = [&]() {
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int v = 16 * mi + gq, d = 32 * warp + 8 * j + 2 * tq;
        *reinterpret_cast<__half2*>(&sH[v][d]) = __floats2half2_rn(hacc[mi][j][0], hacc[mi][j][1]);
        *reinterpret_cast<__half2*>(&sH[v + 8][d]) = __floats2half2_rn(hacc[mi][j][2], hacc[mi][j][3]);
      }
  };
  write_sH();

  const T* qbase = reinterpret_cast<const T*>(a.q) + (long long)hk * a.q_sh;
  const T* kbase = reinterpret_cast<const T*>(a.k) + (long long)hk * a.k_sh;
  T* obase = reinterpret_cast<T*>(a.o) + (long long)hv * a.o_sh + v0;
  const int nchunks = (seq_eos - seq_bos + kChunk - 1) / kChunk;

  for (int c = 0; c < nchunks; ++c) {
    const int bos = seq_bos + c * kChunk;
    const int L = min(kChunk, seq_eos - bos);
    if (tid < kChunk) sG[tid] = tid < L ? a.Gc[(long long)(bos + tid) * a.Hv + hv] : 0.f;
    __syncthreads();
    const float glast = sG[L - 1];
    const int r0 = warp * 16 + gq, r1 = r0 + 8;

    // (a) W S and Q S: rows t = r0 / r1, columns v = 8 j + 2 tq (+1), reduction over d.
    float accv[4][4], acco[4][4];
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) accv[j][e] = acco[j][e] = 0.f;
    {
      const __half* w0 = r0 < L ? a.W + ((long long)(bos + r0) * a.Hv + hv) * kHeadDim : nullptr;
      const __half* w1 = r1 < L ? a.W + ((long long)(bos + r1) * a.Hv + hv) * kHeadDim : nullptr;
      const T* q0 = r0 < L ? qbase + (long long)(bos + r0) * a.q_st : nullptr;
      const T* q1 = r1 < L ? qbase + (long long)(bos + r1) * a.q_st : nullptr;
#pragma unroll 4
      for (int ks = 0; ks < 16; ++ks) {
        const int cc = ks * 8 + 2 * tq;
        const uint32_t aw0 = w0 ? *reinterpret_cast<const uint32_t*>(w0 + cc) : 0u;
        const uint32_t aw1 = w1 ? *reinterpret_cast<const uint32_t*>(w1 + cc) : 0u;
        const uint32_t aq0 = q0 ? E::pair_h(q0 + cc) : 0u;
        const uint32_t aq1 = q1 ? E::pair_h(q1 + cc) : 0u;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const uint32_t b = *reinterpret_cast<const uint32_t*>(&sH[j * 8 + gq][cc]);
          mma_16x8x8(accv[j], aw0, aw1, b);
          mma_16x8x8(acco[j], aq0, aq1, b);
        }
      }
    }
    {
      const bool ok0 = r0 < L, ok1 = r1 < L;
      const float e0 = ok0 ? expf(sG[r0]) * a.scale : 0.f;
      const float e1 = ok1 ? expf(sG[r1]) * a.scale : 0.f;
      const float d0 = ok0 ? expf(glast - sG[r0]) : 0.f;
      const float d1 = ok1 ? expf(glast - sG[r1]) : 0.f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int col = j * 8 + 2 * tq;
        float2 u0 = make_float2(0.f, 0.f), u1 = make_float2(0.f, 0.f);
        if (ok0)
          u0 = __half22float2(*reinterpret_cast<const __half2*>(
              a.U + ((long long)(bos + r0) * a.Hv + hv) * kHeadDim + v0 + col));
        if (ok1)
          u1 = __half22float2(*reinterpret_cast<const __half2*>(
              a.U + ((long long)(bos + r1) * a.Hv + hv) * kHeadDim + v0 + col));
        const float n00 = ok0 ? u0.x - accv[j][0] : 0.f, n01 = ok0 ? u0.y - accv[j][1] : 0.f;
        const float n10 = ok1 ? u1.x - accv[j][2] : 0.f, n11 = ok1 ? u1.y - accv[j][3] : 0.f;
        // FLA keeps v_new in the activation dtype; round once, use it for both products.
        const __half h00 = __float2half_rn(n00), h01 = __float2half_rn(n01);
        const __half h10 = __float2half_rn(n10), h11 = __float2half_rn(n11);
        sVn[col][r0] = h00;
        sVn[col + 1][r0] = h01;
        sVn[col][r1] = h10;
        sVn[col + 1][r1] = h11;
        sVd[col][r0] = __float2half_rn(__half2float(h00) * d0);
        sVd[col + 1][r0] = __float2half_rn(__half2float(h01) * d0);
        sVd[col][r1] = __float2half_rn(__half2float(h10) * d1);
        sVd[col + 1][r1] = __float2half_rn(__half2float(h11) * d1);
        acco[j][0] *= e0;
        acco[j][1] *= e0;
        acco[j][2] *= e1;
        acco[j][3] *= e1;
      }
    }
    __syncthreads();

    // (b) O += P Vn, reduction over the chunk's tokens.
    {
      const __half* p0 = r0 < L ? a.P + ((long long)(bos + r0) * a.Hv + hv) * kChunk : nullptr;
      const __half* p1 = r1 < L ? a.P + ((long long)(bos + r1) * a.Hv + hv) * kChunk : nullptr;
#pragma unroll
      for (int ks = 0; ks < 8; ++ks) {
        const int cc = ks * 8 + 2 * tq;
        const uint32_t ap0 = p0 ? *reinterpret_cast<const uint32_t*>(p0 + cc) : 0u;
        const uint32_t ap1 = p1 ? *reinterpret_cast<const uint32_t*>(p1 + cc) : 0u;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const uint32_t b = *reinterpret_cast<const uint32_t*>(&sVn[j * 8 + gq][cc]);
          mma_16x8x8(acco[j], ap0, ap1, b);
        }
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int col = j * 8 + 2 * tq;
        if (r0 < L) E::store_pair(obase + (long long)(bos + r0) * a.o_st + col, acco[j][0], acco[j][1]);
        if (r1 < L) E::store_pair(obase + (long long)(bos + r1) * a.o_st + col, acco[j][2], acco[j][3]);
      }
    }

    // (c) S = e^glast S + Vd^T K: rows v (2 tiles), columns d (warp's 32), reduction over t.
    {
      const float eg = expf(glast);
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) hacc[mi][j][e] *= eg;
#pragma unroll 2
      for (int ks = 0; ks < 8; ++ks) {
        const int t0 = ks * 8 + 2 * tq;
        uint32_t aa[2][2];
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
          aa[mi][0] = *reinterpret_cast<const uint32_t*>(&sVd[16 * mi + gq][t0]);
          aa[mi][1] = *reinterpret_cast<const uint32_t*>(&sVd[16 * mi + gq + 8][t0]);
        }
        const T* k0 = kbase + (long long)(bos + t0) * a.k_st;
        const T* k1 = k0 + a.k_st;
        const bool ok0 = t0 < L, ok1 = t0 + 1 < L;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int d = 32 * warp + 8 * j + gq;
          const __half x0 = ok0 ? E::to_h(k0[d]) : __float2half(0.f);
          const __half x1 = ok1 ? E::to_h(k1[d]) : __float2half(0.f);
          const uint32_t b = pack_hh(x0, x1);
#pragma unroll
          for (int mi = 0; mi < 2; ++mi) mma_16x8x8(hacc[mi][j], aa[mi][0], aa[mi][1], b);
        }
      }
    }
    // Every warp finished reading sH in (a) before the barrier above, so it can be rewritten.
    write_sH();
    __syncthreads();
  }

  if (a.ht) {
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int v = v0 + 16 * mi + gq, d = 32 * warp + 8 * j + 2 * tq;
        *reinterpret_cast<float2*>(a.ht + sbase + (long long)v * kHeadDim + d) =
            make_float2(hacc[mi][j][0], hacc[mi][j][1]);
        *reinterpret_cast<float2*>(a.ht + sbase + (long long)(v + 8) * kHeadDim + d) =
            make_float2(hacc[mi][j][2], hacc[mi][j][3]);
      }
  }
}

static inline long long align256(long long x) { return (x + 255) & ~255LL; }

}  // namespace tbgdn

using namespace tbgdn;

extern "C" {

// Bytes of scratch the prefill needs for T tokens and Hv value heads (W, U, P, Gc).
long long tb_gdn_chunk_workspace_bytes(long long T, int Hv) {
  const long long rows = T * (long long)Hv;
  return align256(rows * kHeadDim * 2) * 2 + align256(rows * kChunk * 2) + align256(rows * 4);
}

// Returns 0 on success, a cudaError_t (>0) from the launch, or a negative argument error:
// -1 head dims not 128, -2 Hv not a multiple of Hk, -3 workspace too small, -4 dtype.
int tb_gdn_chunk_fwd(int dtype, const void* q, const void* k, const void* v, const float* g,
                     const float* beta, long long q_st, long long q_sh, long long k_st,
                     long long k_sh, long long v_st, long long v_sh, const int* cu_seqlens, int N,
                     long long T, int Hk, int Hv, int K, int V, float scale, const float* h0,
                     float* ht, void* o, long long o_st, long long o_sh, void* workspace,
                     long long workspace_bytes, void* stream) {
  if (K != kHeadDim || V != kHeadDim) return -1;
  if (Hk <= 0 || Hv <= 0 || Hv % Hk != 0) return -2;
  if (workspace_bytes < tb_gdn_chunk_workspace_bytes(T, Hv)) return -3;
  if (dtype != 0 && dtype != 1) return -4;
  if (N <= 0) return 0;
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  const long long rows = T * (long long)Hv;
  char* ws = reinterpret_cast<char*>(workspace);
  __half* W = reinterpret_cast<__half*>(ws);
  __half* U = reinterpret_cast<__half*>(ws + align256(rows * kHeadDim * 2));
  __half* P = reinterpret_cast<__half*>(ws + 2 * align256(rows * kHeadDim * 2));
  float* Gc = reinterpret_cast<float*>(ws + 2 * align256(rows * kHeadDim * 2) + align256(rows * kChunk * 2));

  PrepArgs pa{q, k, v, g, beta, cu_seqlens, N, Hk, Hv, q_st, q_sh, k_st, k_sh, v_st, v_sh,
              scale, W, U, P, Gc};
  const dim3 grid_a((unsigned)((T + kChunk - 1) / kChunk + N), (unsigned)Hv);
  StateArgs sa{q, k, q_st, q_sh, k_st, k_sh, W, U, P, Gc, cu_seqlens, N, Hk, Hv, scale,
               h0, ht, o, o_st, o_sh};
  const dim3 grid_b(kHeadDim / kBV, (unsigned)Hv, (unsigned)N);
  if (dtype == 0) {
    gdn_chunk_prep_kernel<__half><<<grid_a, 256, 0, s>>>(pa);
    gdn_chunk_state_kernel<__half><<<grid_b, 128, 0, s>>>(sa);
  } else {
    gdn_chunk_prep_kernel<__nv_bfloat16><<<grid_a, 256, 0, s>>>(pa);
    gdn_chunk_state_kernel<__nv_bfloat16><<<grid_b, 128, 0, s>>>(sa);
  }
  return (int)cudaGetLastError();
}

}  // extern "C"
