// probe_bn_stats.cu — issue 12 D2 probe, not product code: ways to compute channels-last fp16 BN statistics
// (Σ(z-K), Σ(z-K)² per channel of an [n][C] matrix, then mean and invstd), each timed in a CUDA graph of 20
// calls (median of 30 replays), beside a pure read of the same bytes (the ceiling). Variants: the product's
// design (kernels/bn_silu.cu bn_stats_fast_kernel: one wave of blocks, float64 partials, a separate finish
// kernel), with the finish launched programmatically (PDL), float64 atomics with the last block finishing,
// a cooperative grid sync with the finish spread over the blocks, and bulk async copies (TMA) into shared
// stages. SWEEP2=1: where the reduce loses time against the read (K's load, the fp16 conversion, the
// partial writes), TMA with more threads, and one kernel that finishes in its last cluster (distributed shared
// memory, a ticket per slice), the interleaved TMA reduce with its finish launched programmatically, and the
// product's own statistics pass (yv_bn_stats_forward, linked in) in the same harness. FWD=1: the forward
// (y = silu(BN(z))) against a copy, the product's forward and a TMA load/compute/bulk-store variant. Results:
// benchmarks/RESULTS.md. Build and run on the GPU machine:
//   nvcc -O3 -arch=sm_90 -std=c++17 --extended-lambda -Ikernels benchmarks/probe_bn_stats.cu kernels/bn_silu.cu \
//     -o /tmp/probe_bn_stats
//   /tmp/probe_bn_stats [n] [C]          (default 102400 512 = 64x512x40x40; 409600 256 = 64x256x80x80)
#include <cooperative_groups.h>
#include <cuda_fp16.h>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cmath>
#include <vector>
#include <algorithm>
#include "yv_kernels.h"   // the product's launchers, linked in (kernels/bn_silu.cu): the "product" row
namespace cg = cooperative_groups;

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("CUDA %s at %d: %s\n", #x, __LINE__, cudaGetErrorString(e_)); exit(1); } } while (0)

struct alignas(16) h8 { __half v[8]; };

// ---------------- pure read ceiling ----------------
template <int U> __global__ void read_kernel(const uint4 *p, int64_t nv, unsigned *out)
{
    unsigned acc = 0;
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, st = (int64_t)gridDim.x * blockDim.x;
    for (; i + (U - 1) * st < nv; i += U * st) {
        uint4 x[U];
#pragma unroll
        for (int r = 0; r < U; r++) x[r] = p[i + r * st];
#pragma unroll
        for (int r = 0; r < U; r++) acc ^= x[r].x ^ x[r].y ^ x[r].z ^ x[r].w;
    }
    for (; i < nv; i += st) { uint4 x = p[i]; acc ^= x.x ^ x.y ^ x.z ^ x.w; }
    if (acc == 0x12345678u) out[0] = acc;
}

// Contiguous chunk per block (as the stats kernels read).
template <int U> __global__ void read_chunk_kernel(const uint4 *p, int64_t nv, unsigned *out)
{
    int64_t chunk = (nv + gridDim.x - 1) / gridDim.x, b0 = blockIdx.x * chunk, b1 = b0 + chunk < nv ? b0 + chunk : nv;
    unsigned acc = 0;
    int64_t i = b0 + threadIdx.x, st = blockDim.x;
    for (; i + (U - 1) * st < b1; i += U * st) {
        uint4 x[U];
#pragma unroll
        for (int r = 0; r < U; r++) x[r] = p[i + r * st];
#pragma unroll
        for (int r = 0; r < U; r++) acc ^= x[r].x ^ x[r].y ^ x[r].z ^ x[r].w;
    }
    for (; i < b1; i += st) { uint4 x = p[i]; acc ^= x.x ^ x.y ^ x.z ^ x.w; }
    if (acc == 0x12345678u) out[0] = acc;
}

// ---------------- stats: common pieces ----------------
struct Args {
    const __half *z; int64_t n, C; int S;
    double *partial;       // [2][S][C]
    double *acc;           // [2][C] (atomic variant), zero between calls
    unsigned *ticket;      // zero between calls
    float *mean, *invstd;
};

__device__ __forceinline__ void add8(const h8 &x, const float K[8], float f[2][8])
{
#pragma unroll
    for (int e = 0; e < 8; e++) { float d = __half2float(x.v[e]) - K[e]; f[0][e] += d; f[1][e] = fmaf(d, d, f[1][e]); }
}

// Block sums (double) of its threads' float32 runs, kept in shared slots [2][8][T]; tx = channel vector.
template <int T> struct Slots { double d[2][8][T]; };

__device__ __forceinline__ void fold(double *d0, float f[2][8], int t, int T)
{
#pragma unroll
    for (int j = 0; j < 2; j++)
#pragma unroll
        for (int e = 0; e < 8; e++) { volatile double *d = d0 + (j * 8 + e) * T + t; *d = *d + (double)f[j][e]; f[j][e] = 0.f; }
}

// After the loop: block sum of channel c = cv0+tx (lane e), sum j over ty -> out(j, c) callback.
template <int T, typename F> __device__ __forceinline__ void block_sums(double *d0, int bx, int by, int cv0, int nv, F out)
{
    int t = threadIdx.y * bx + threadIdx.x;
    __syncthreads();
    for (int i = t; i < 16 * nv; i += bx * by) {
        int je = i / nv, tx = i - je * nv, j = je / 8, e = je - j * 8;
        double x = 0.0;
        for (int r = 0; r < by; r++) x += d0[(j * 8 + e) * T + r * bx + tx];
        out(j, (cv0 + tx) * 8 + e, x);
    }
    __syncthreads();
}

__device__ __forceinline__ void finish_one(const Args &a, int64_t c, double s0, double s1)
{
    double n = (double)a.n, K = __half2float(a.z[c]);
    double m1 = s0 / n, var = s1 / n - m1 * m1;
    var = var > 0 ? var : 0;
    a.mean[c] = (float)(K + m1);
    a.invstd[c] = (float)(1.0 / sqrt(var + 1e-3));
}

// MODE 0: partials [2][S][C]; 1: atomics into acc + last block finishes; 2: partials + grid sync + spread finish.
template <int R, int MODE> __global__ void __launch_bounds__(256, 4) stats_kernel(Args a)
{
    __shared__ Slots<256> sl;
    __shared__ int last;
    int bx = blockDim.x, by = blockDim.y, t = threadIdx.y * bx + threadIdx.x;
    int64_t Cv = a.C / 8, chunk = (a.n + a.S - 1) / a.S, k0 = (int64_t)blockIdx.x * chunk, k1 = k0 + chunk < a.n ? k0 + chunk : a.n;
    int64_t k = k0 + threadIdx.y, rows = k < k1 ? (k1 - k + by - 1) / by : 0, step = by * a.C;
    double *d0 = &sl.d[0][0][0];
    if (MODE == 3) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    for (int64_t cv0 = 0; cv0 < Cv; cv0 += bx) {
        for (int j = 0; j < 16; j++) d0[j * 256 + t] = 0.0;
        if (cv0 + threadIdx.x < Cv && rows > 0) {
            int64_t c0 = (cv0 + threadIdx.x) * 8;
            float K[8], f[2][8] = {};
            h8 kk = *(const h8 *)(a.z + c0);
#pragma unroll
            for (int e = 0; e < 8; e++) K[e] = __half2float(kk.v[e]);
            const __half *p = a.z + (k0 + threadIdx.y) * a.C + c0;
            for (int64_t done = 0; done < rows; done += 32) {
                int m = rows - done < 32 ? (int)(rows - done) : 32, i = 0;
                for (; i + R <= m; i += R) {
                    h8 x[R];
#pragma unroll
                    for (int r = 0; r < R; r++) x[r] = *(const h8 *)(p + r * step);
#pragma unroll
                    for (int r = 0; r < R; r++) add8(x[r], K, f);
                    p += R * step;
                }
                for (; i < m; i++, p += step) add8(*(const h8 *)p, K, f);
                fold(d0, f, t, 256);
            }
        }
        int64_t left = Cv - cv0;
        int nv = (int)(left < bx ? left : bx);
        if (MODE == 1)
            block_sums<256>(d0, bx, by, (int)cv0, nv, [&](int j, int64_t c, double x) { atomicAdd(&a.acc[j * a.C + c], x); });
        else
            block_sums<256>(d0, bx, by, (int)cv0, nv, [&](int j, int64_t c, double x) { a.partial[((int64_t)j * a.S + blockIdx.x) * a.C + c] = x; });
    }
    if (MODE == 1) {
        __threadfence();
        __syncthreads();
        if (t == 0) last = atomicAdd(a.ticket, 1u) == (unsigned)(gridDim.x - 1);
        __syncthreads();
        if (!last) return;
        __threadfence();
        for (int64_t c = t; c < a.C; c += bx * by) {
            volatile double *q = a.acc;
            double s0 = q[c], s1 = q[a.C + c];
            finish_one(a, c, s0, s1);
            a.acc[c] = 0.0; a.acc[a.C + c] = 0.0;
        }
        if (t == 0) *a.ticket = 0;
    }
    if (MODE == 2) {
        cg::this_grid().sync();
        // channel c finished by block c % S, its 256 threads over S.
        __shared__ double red[2][8];
        for (int64_t c = blockIdx.x; c < a.C; c += gridDim.x) {
            double s0 = 0, s1 = 0;
            for (int s = t; s < a.S; s += bx * by) { s0 += a.partial[(int64_t)s * a.C + c]; s1 += a.partial[((int64_t)a.S + s) * a.C + c]; }
            for (int o = 16; o; o >>= 1) { s0 += __shfl_down_sync(~0u, s0, o); s1 += __shfl_down_sync(~0u, s1, o); }
            if ((t & 31) == 0) { red[0][t >> 5] = s0; red[1][t >> 5] = s1; }
            __syncthreads();
            if (t == 0) {
                double x0 = 0, x1 = 0;
                for (int w = 0; w < 8; w++) { x0 += red[0][w]; x1 += red[1][w]; }
                finish_one(a, c, x0, x1);
            }
            __syncthreads();
        }
    }
}

// ---------------- stats via bulk async copies (TMA, non-tensor) into shared stages ----------------
__device__ __forceinline__ unsigned smem_u32(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_init(uint64_t *b, unsigned cnt) { asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(b)), "r"(cnt)); }
__device__ __forceinline__ void mbar_expect(uint64_t *b, unsigned bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(b)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk_g2s(void *dst, const void *src, unsigned bytes, uint64_t *b)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 ::"r"(smem_u32(dst)), "l"(src), "r"(bytes), "r"(smem_u32(b)) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t *b, unsigned parity)
{
    asm volatile("{\n .reg .pred p;\n W: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra W;\n}" ::"r"(smem_u32(b)), "r"(parity) : "memory");
}

// ---------------- finish of partials [2][S][C]: 4 channels x 64 lanes per block (as the product) ----------------
__device__ __forceinline__ void finish_block(const Args &a)
{
    __shared__ double sh[2][8][4];
    int cx = threadIdx.x & 3, l = threadIdx.x >> 2;   // 4 channels fastest in the warp: 8 lanes x 4 channels per warp
    int64_t c = (int64_t)blockIdx.x * 4 + cx;
    double s0 = 0, s1 = 0;
    if (c < a.C)
        for (int s = l; s < a.S; s += 64) { s0 += a.partial[(int64_t)s * a.C + c]; s1 += a.partial[((int64_t)a.S + s) * a.C + c]; }
    for (int o = 16; o >= 4; o >>= 1) { s0 += __shfl_down_sync(~0u, s0, o); s1 += __shfl_down_sync(~0u, s1, o); }
    int w = threadIdx.x >> 5;
    if ((threadIdx.x & 31) < 4) { sh[0][w][cx] = s0; sh[1][w][cx] = s1; }
    __syncthreads();
    if (threadIdx.x < 4 && c < a.C) {
        double x0 = 0, x1 = 0;
        for (int i = 0; i < 8; i++) { x0 += sh[0][i][threadIdx.x]; x1 += sh[1][i][threadIdx.x]; }
        finish_one(a, c, x0, x1);
    }
}

__global__ void __launch_bounds__(256) finish_kernel(Args a) { finish_block(a); }

__global__ void __launch_bounds__(256) finish_pdl_kernel(Args a)
{
    asm volatile("griddepcontrol.wait;" ::: "memory");
    finish_block(a);
}

static void launch_pdl_finish(const Args &a, cudaStream_t s)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)((a.C + 3) / 4));
    cfg.blockDim = dim3(256);
    cfg.stream = s;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    CK(cudaLaunchKernelEx(&cfg, finish_pdl_kernel, a));
}

// ---------------- timing ----------------
template <typename F> float time_graph(F launch, int calls = 20, int reps = 30);

// ---------------- sweep 2: where the reduce loses time against a pure read ----------------
// OPT bit 0: K converted after the first loads are issued; bit 1: fp16 -> fp32 by integer ops (exact for
// finite halves, no inf/nan); bit 2: no partial writes; bit 3: loads with xor only (no arithmetic);
// bit 4: __half22float2 on pairs.
template <int OPT> __device__ __forceinline__ void cvt8(const h8 &x, float o[8])
{
    const unsigned *w = (const unsigned *)&x;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if (OPT & 2) {
            unsigned lo = (((int)(w[i] << 16)) >> 3) & 0x8FFFE000u, hi = (((int)w[i]) >> 3) & 0x8FFFE000u;
            o[2 * i] = __int_as_float((int)lo) * 0x1p112f;
            o[2 * i + 1] = __int_as_float((int)hi) * 0x1p112f;
        } else if (OPT & 16) {
            float2 f = __half22float2(*(const __half2 *)&w[i]);
            o[2 * i] = f.x; o[2 * i + 1] = f.y;
        } else {
            o[2 * i] = __half2float(x.v[2 * i]); o[2 * i + 1] = __half2float(x.v[2 * i + 1]);
        }
    }
}

template <int R, int OPT> __global__ void __launch_bounds__(256, 4) stats2_kernel(Args a)
{
    __shared__ Slots<256> sl;
    __shared__ unsigned sink;
    int bx = blockDim.x, by = blockDim.y, t = threadIdx.y * bx + threadIdx.x;
    int64_t Cv = a.C / 8, chunk = (a.n + a.S - 1) / a.S, k0 = (int64_t)blockIdx.x * chunk, k1 = k0 + chunk < a.n ? k0 + chunk : a.n;
    int64_t k = k0 + threadIdx.y, rows = k < k1 ? (k1 - k + by - 1) / by : 0, step = by * a.C;
    double *d0 = &sl.d[0][0][0];
    unsigned xacc = 0;
    for (int64_t cv0 = 0; cv0 < Cv; cv0 += bx) {
        for (int j = 0; j < 16; j++) d0[j * 256 + t] = 0.0;
        if (cv0 + threadIdx.x < Cv && rows > 0) {
            int64_t c0 = (cv0 + threadIdx.x) * 8;
            float K[8], f[2][8] = {};
            h8 kk = *(const h8 *)(a.z + c0);
            if (!(OPT & 1)) cvt8<OPT>(kk, K);
            const __half *p = a.z + (k0 + threadIdx.y) * a.C + c0;
            bool first = true;
            for (int64_t done = 0; done < rows; done += 32) {
                int m = rows - done < 32 ? (int)(rows - done) : 32, i = 0;
                for (; i + R <= m; i += R) {
                    h8 x[R];
#pragma unroll
                    for (int r = 0; r < R; r++) x[r] = *(const h8 *)(p + r * step);
                    if ((OPT & 1) && first) { cvt8<OPT>(kk, K); first = false; }
                    if (OPT & 8) {
#pragma unroll
                        for (int r = 0; r < R; r++) { const unsigned *w = (const unsigned *)&x[r]; xacc ^= w[0] ^ w[1] ^ w[2] ^ w[3]; }
                    } else {
#pragma unroll
                        for (int r = 0; r < R; r++) {
                            float v[8];
                            cvt8<OPT>(x[r], v);
#pragma unroll
                            for (int e = 0; e < 8; e++) { float d = v[e] - K[e]; f[0][e] += d; f[1][e] = fmaf(d, d, f[1][e]); }
                        }
                    }
                    p += R * step;
                }
                for (; i < m; i++, p += step) add8(*(const h8 *)p, K, f);
                if ((OPT & 1) && first) { cvt8<OPT>(kk, K); first = false; }
                fold(d0, f, t, 256);
            }
        }
        int64_t left = Cv - cv0;
        int nv = (int)(left < bx ? left : bx);
        if (OPT & 4)
            block_sums<256>(d0, bx, by, (int)cv0, nv, [&](int j, int64_t c, double x) { if (x == 1.2345) a.partial[c] = x; });
        else
            block_sums<256>(d0, bx, by, (int)cv0, nv, [&](int j, int64_t c, double x) { a.partial[((int64_t)j * a.S + blockIdx.x) * a.C + c] = x; });
    }
    if (xacc == 0x12345u) sink = xacc;
}

// TMA stages: ROWS rows per stage, NST stages, blockDim 64 x TY (C = 512), fp16 conversion by OPT (cvt8); OPT bit 5:
// the block's tiles of ROWS rows interleaved with the other blocks' (tile b, b + grid, ...) instead of one chunk;
// bit 6: a stage is refilled once its rows are in registers (before the arithmetic); bit 7: the dependent
// (programmatically launched) finish may start at once (griddepcontrol.launch_dependents). Leaves the block's sums of
// channel c (j = 0: Σ(z-K), 1: Σ(z-K)²) to out(j, c, x) after a __syncthreads.
// Shared: NST stages of ROWS x C halves, 128 bytes of barriers, [16][64 * TY] doubles.
template <int ROWS, int NST, int TY, int OPT, typename OUT> __device__ __forceinline__ void tma_block_sums(const Args &a, unsigned char *smem, OUT out)
{
    __half *buf = (__half *)smem;
    uint64_t *full = (uint64_t *)(smem + (size_t)NST * ROWS * a.C * 2);
    double *slots = (double *)(smem + (size_t)NST * ROWS * a.C * 2 + 128);
    const int T = 64 * TY;
    int bx = blockDim.x, by = blockDim.y, t = threadIdx.y * bx + threadIdx.x;
    int64_t r_of0, nst, tstride;                 // first row of stage st: r_of0 + st * tstride; last row < rend
    int64_t rend;
    if (OPT & 32) {
        int64_t ntiles = (a.n + ROWS - 1) / ROWS;
        nst = blockIdx.x < ntiles ? (ntiles - blockIdx.x + gridDim.x - 1) / gridDim.x : 0;
        r_of0 = (int64_t)blockIdx.x * ROWS; tstride = (int64_t)gridDim.x * ROWS; rend = a.n;
    } else {
        int64_t chunk = (a.n + gridDim.x - 1) / gridDim.x, k0 = (int64_t)blockIdx.x * chunk, k1 = k0 + chunk < a.n ? k0 + chunk : a.n;
        nst = k1 > k0 ? (k1 - k0 + ROWS - 1) / ROWS : 0;
        r_of0 = k0; tstride = ROWS; rend = k1;
    }
    unsigned rowb = (unsigned)(a.C * 2);
    if (OPT & 128) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    if (t == 0) {
        for (int s = 0; s < NST; s++) mbar_init(&full[s], 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    auto issue = [&](int64_t st) {
        int s = (int)(st % NST);
        int64_t r0 = r_of0 + st * tstride, r = rend - r0 < ROWS ? rend - r0 : ROWS;
        mbar_expect(&full[s], (unsigned)r * rowb);
        bulk_g2s(buf + (size_t)s * ROWS * a.C, a.z + r0 * a.C, (unsigned)r * rowb, &full[s]);
    };
    if (t == 0)
        for (int64_t st = 0; st < NST && st < nst; st++) issue(st);
    auto refill = [&](int64_t st) {
        __syncthreads();
        if (t == 0 && st + NST < nst) { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); issue(st + NST); }
    };
    int64_t c0 = threadIdx.x * 8;
    float K[8], f[2][8] = {};
    h8 kk = *(const h8 *)(a.z + c0);
    cvt8<OPT>(kk, K);
    for (int j = 0; j < 16; j++) slots[j * T + t] = 0.0;
    int cnt = 0;
    for (int64_t st = 0; st < nst; st++) {
        int s = (int)(st % NST);
        mbar_wait(&full[s], (unsigned)((st / NST) & 1));
        int64_t r0 = r_of0 + st * tstride, r = rend - r0 < ROWS ? rend - r0 : ROWS;
        const __half *q = buf + (size_t)s * ROWS * a.C + c0;
        if (r == ROWS) {
            h8 x[ROWS / TY];
#pragma unroll
            for (int i = 0; i < ROWS / TY; i++) x[i] = *(const h8 *)(q + (threadIdx.y + TY * i) * a.C);
            if (OPT & 64) refill(st);
#pragma unroll
            for (int i = 0; i < ROWS / TY; i++) {
                float v[8];
                cvt8<OPT>(x[i], v);
#pragma unroll
                for (int e = 0; e < 8; e++) { float d = v[e] - K[e]; f[0][e] += d; f[1][e] = fmaf(d, d, f[1][e]); }
            }
            cnt += ROWS / TY;
            if (!(OPT & 64)) refill(st);
        } else {
            for (int64_t i = threadIdx.y; i < r; i += TY) { add8(*(const h8 *)(q + i * a.C), K, f); cnt++; }
            refill(st);
        }
        if (cnt >= 32) { fold(slots, f, t, T); cnt = 0; }
    }
    fold(slots, f, t, T);
    __syncthreads();
    for (int i = t; i < 16 * 64; i += T) {
        int je = i / 64, tx = i - je * 64, j = je / 8, e = je - j * 8;
        double x = 0.0;
        for (int r = 0; r < by; r++) x += slots[je * T + r * bx + tx];
        out(j, tx * 8 + e, x);
    }
    __syncthreads();
}

template <int ROWS, int NST, int TY, int OPT> __global__ void __launch_bounds__(64 * TY, TY == 4 ? 2 : 1) stats_tma2_kernel(Args a)
{
    extern __shared__ __align__(128) unsigned char smem[];
    tma_block_sums<ROWS, NST, TY, OPT>(a, smem, [&](int j, int c, double x) { a.partial[((int64_t)j * a.S + blockIdx.x) * a.C + c] = x; });
}

// One kernel, no finish launch: tma_block_sums, then the block sums of a cluster of CL blocks are added over
// distributed shared memory (block rank r adds the slice r of the [C][2] sums), each slice is written as one
// cluster partial, and the block that is last for its slice (a ticket per slice) finishes it, its loads of the
// cluster partials 8 at a time. Layout: partial [ncl][C][2]; ticket [CL], zero between calls (the finishing
// block resets it).
template <int ROWS, int NST, int TY, int OPT, int CL> __global__ void __launch_bounds__(64 * TY, 1) stats_tma_cl_kernel(Args a)
{
    extern __shared__ __align__(128) unsigned char smem[];
    double *bsum = (double *)smem;                                           // [C][2], over the stages after the loop
    double *red = (double *)(smem + (size_t)NST * ROWS * a.C * 2 + 128);     // over the slots
    __shared__ int last;
    const int T = 64 * TY;
    cg::cluster_group cluster = cg::this_cluster();
    int t = threadIdx.y * blockDim.x + threadIdx.x;
    int rank = (int)cluster.block_rank(), ncl = gridDim.x / CL, cl = blockIdx.x / CL;
    tma_block_sums<ROWS, NST, TY, OPT>(a, smem, [&](int j, int c, double x) { bsum[c * 2 + j] = x; });
    cluster.sync();
    int P = (int)(2 * a.C / CL);                 // values in a slice
    int64_t base = (int64_t)rank * P;
    for (int i = t; i < P; i += T) {
        double x = 0.0;
#pragma unroll
        for (int q = 0; q < CL; q++) x += cluster.map_shared_rank(bsum, q)[base + i];
        a.partial[(int64_t)cl * 2 * a.C + base + i] = x;
    }
    cluster.sync();                              // the other blocks' shared memory is read: now it may go
    __threadfence();
    __syncthreads();
    if (t == 0) last = atomicAdd(&a.ticket[rank], 1u) == (unsigned)(ncl - 1);
    __syncthreads();
    if (!last) return;
    __threadfence();
    int parts = T / P > 0 ? T / P : 1;           // red [parts][P]
    for (int i = t; i < P * parts; i += T) {
        int v = i % P, part = i / P;
        double x = 0.0;
        for (int c = part; c < ncl; c += 8 * parts) {
            double y[8];
#pragma unroll
            for (int u = 0; u < 8; u++) { int cc = c + u * parts; y[u] = cc < ncl ? __ldcg(&a.partial[(int64_t)cc * 2 * a.C + base + v]) : 0.0; }
#pragma unroll
            for (int u = 0; u < 8; u++) x += y[u];
        }
        red[part * P + v] = x;
    }
    __syncthreads();
    for (int i = t; i < P / 2; i += T) {
        double s0 = 0.0, s1 = 0.0;
        for (int part = 0; part < parts; part++) { s0 += red[part * P + 2 * i]; s1 += red[part * P + 2 * i + 1]; }
        finish_one(a, base / 2 + i, s0, s1);
    }
    if (t == 0) a.ticket[rank] = 0;
}

// ---------------- forward sweep (FWD=1): y = silu(z·scale + shift) of fp16 channels-last [n][C] ----------------
// Against a plain copy of the same bytes (the ceiling), the product's forward (yv_bn_silu_forward, linked in) and a
// TMA variant: bulk loads of ROWS-row tiles into NST shared stages, the tile computed in place, written back by a
// bulk store; a stage is refilled once the store before the current one has read it (one store in flight).
__global__ void copy_kernel(const uint4 *src, uint4 *dst, int64_t nv)
{
    int64_t st = (int64_t)gridDim.x * blockDim.x, i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * st < nv; i += 4 * st) {
        uint4 x0 = src[i], x1 = src[i + st], x2 = src[i + 2 * st], x3 = src[i + 3 * st];
        dst[i] = x0; dst[i + st] = x1; dst[i + 2 * st] = x2; dst[i + 3 * st] = x3;
    }
    for (; i < nv; i += st) dst[i] = src[i];
}

struct FwdArgs { const __half *z; __half *y; int64_t n, C; const float *scale, *shift; };

__device__ __forceinline__ void silu8(h8 &x, const float *sc, const float *sh)
{
#pragma unroll
    for (int e = 0; e < 8; e++) {
        float v = fmaf(__half2float(x.v[e]), sc[e], sh[e]);
        x.v[e] = __float2half(v / (1.0f + __expf(-v)));
    }
}

// The forward as a flat grid-stride over 16-byte vectors (U in flight per thread): with the grid's thread count
// a multiple of C/8, a thread keeps one channel vector, so its constants stay in registers; the work splits to
// within one vector per thread (the product's kernel splits by groups of rows).
template <int U> __global__ void __launch_bounds__(256) fwd_flat_kernel(FwdArgs a)
{
    int64_t cv = a.C / 8, nv = a.n * cv, st = (int64_t)gridDim.x * blockDim.x;
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int64_t c0 = (i % cv) * 8;
    float sc[8], sh[8];
    for (int e = 0; e < 8; e++) { sc[e] = a.scale[c0 + e]; sh[e] = a.shift[c0 + e]; }
    const h8 *z = (const h8 *)a.z;
    h8 *y = (h8 *)a.y;
    for (; i + (U - 1) * st < nv; i += U * st) {
        h8 x[U];
#pragma unroll
        for (int u = 0; u < U; u++) x[u] = z[i + u * st];
#pragma unroll
        for (int u = 0; u < U; u++) { silu8(x[u], sc, sh); y[i + u * st] = x[u]; }
    }
    for (; i < nv; i += st) { h8 x = z[i]; silu8(x, sc, sh); y[i] = x; }
}

template <int ROWS, int NST> __global__ void __launch_bounds__(256, 1) fwd_tma_kernel(FwdArgs a)
{
    extern __shared__ __align__(128) unsigned char smem[];
    __half *buf = (__half *)smem;
    __shared__ __align__(8) uint64_t full[NST];
    int t = threadIdx.y * blockDim.x + threadIdx.x;
    int64_t S = gridDim.x, ntiles = (a.n + ROWS - 1) / ROWS;
    int64_t mine = blockIdx.x < ntiles ? (ntiles - blockIdx.x + S - 1) / S : 0;
    unsigned rowb = (unsigned)(a.C * 2);
    auto rows_of = [&](int64_t i, int64_t *r0) { *r0 = ((int64_t)blockIdx.x + i * S) * ROWS; int64_t r = a.n - *r0; return r < ROWS ? r : (int64_t)ROWS; };
    auto issue = [&](int64_t i) {
        int s = (int)(i % NST);
        int64_t r0, r = rows_of(i, &r0);
        mbar_expect(&full[s], (unsigned)r * rowb);
        bulk_g2s(buf + (size_t)s * ROWS * a.C, a.z + r0 * a.C, (unsigned)r * rowb, &full[s]);
    };
    if (t == 0) {
        for (int s = 0; s < NST; s++) mbar_init(&full[s], 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (t == 0)
        for (int64_t i = 0; i < NST && i < mine; i++) issue(i);
    int64_t c0 = threadIdx.x * 8;
    float sc[8], sh[8];
    for (int e = 0; e < 8; e++) { sc[e] = a.scale[c0 + e]; sh[e] = a.shift[c0 + e]; }
    for (int64_t i = 0; i < mine; i++) {
        int s = (int)(i % NST);
        mbar_wait(&full[s], (unsigned)((i / NST) & 1));
        int64_t r0, r = rows_of(i, &r0);
        __half *q = buf + (size_t)s * ROWS * a.C + c0;
        for (int64_t u = threadIdx.y; u < r; u += blockDim.y) {
            h8 x = *(const h8 *)(q + u * a.C);
            silu8(x, sc, sh);
            *(h8 *)(q + u * a.C) = x;
        }
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");   // the generic writes, seen by the bulk store
        __syncthreads();
        if (t == 0) {
            asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;"
                         ::"l"(a.y + r0 * a.C), "r"(smem_u32(buf + (size_t)s * ROWS * a.C)), "r"((unsigned)r * rowb) : "memory");
            asm volatile("cp.async.bulk.commit_group;" ::: "memory");
            if (i >= 1) {
                asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");   // tile i-1's store has read its stage
                if (i - 1 + NST < mine) issue(i - 1 + NST);
            }
        }
    }
    if (t == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

static void sweep_forward(const __half *z, int64_t n, int64_t C, int sms)
{
    size_t bytes = (size_t)n * C * 2;
    auto row = [&](const char *name, float us) { printf("%-44s %8.2f us  %7.0f GB/s\n", name, us, 2 * bytes / (us * 1e3)); };
    printf("forward: n=%lld C=%lld, %.1f MB read + %.1f MB written\n", (long long)n, (long long)C, bytes / 1e6, bytes / 1e6);
    __half *y, *y2; float *par;   // par: mean, invstd, weight, bias, scale, shift (C each)
    CK(cudaMalloc(&y, bytes)); CK(cudaMalloc(&y2, bytes)); CK(cudaMalloc(&par, 6 * C * 4));
    std::vector<float> hp(6 * C);
    for (int64_t c = 0; c < C; c++) {
        float m = 3.0f + 0.01f * c, is = 0.3f + 0.001f * (c % 7), w = 0.5f + 0.002f * (c % 11), b = 0.1f * ((c % 5) - 2);
        hp[c] = m; hp[C + c] = is; hp[2 * C + c] = w; hp[3 * C + c] = b;
        hp[4 * C + c] = is * w; hp[5 * C + c] = b - m * (is * w);
    }
    CK(cudaMemcpy(par, hp.data(), 6 * C * 4, cudaMemcpyHostToDevice));
    int64_t nv = bytes / 16;
    row("copy kernel (same bytes)", time_graph([&](cudaStream_t s) { copy_kernel<<<sms * 8, 256, 0, s>>>((const uint4 *)z, (uint4 *)y, nv); }));
    row("cudaMemcpyAsync D2D", time_graph([&](cudaStream_t s) { CK(cudaMemcpyAsync(y, z, bytes, cudaMemcpyDeviceToDevice, s)); }));
    yv_bn_shape sh = {1, C, 1, n};
    yv_view4 zv = {(void *)z, YV_FLOAT16, {n * C, 1, n * C, C}}, ov = {(void *)y2, YV_FLOAT16, {n * C, 1, n * C, C}}, none = {};
    yv_bn_params p1 = {par, par + C, par + 2 * C, par + 3 * C}, p0 = {};
    row("product yv_bn_silu_forward", time_graph([&](cudaStream_t s) { CK(yv_bn_silu_forward(sh, zv, p1, none, p0, none, 1, ov, s)); }));
    FwdArgs fa{z, y, n, C, par + 4 * C, par + 5 * C};
    dim3 blk((unsigned)(C / 8), (unsigned)(256 / (C / 8)));
    auto vs_product = [&](const char *tag) {   // y against the product's output y2
        std::vector<__half> a1((size_t)n * C), a2((size_t)n * C);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(a1.data(), y, bytes, cudaMemcpyDeviceToHost)); CK(cudaMemcpy(a2.data(), y2, bytes, cudaMemcpyDeviceToHost));
        double worst = 0;
        for (size_t i = 0; i < a1.size(); i++) worst = fmax(worst, fabs((double)__half2float(a1[i]) - (double)__half2float(a2[i])));
        printf("  check %-28s max |y - product y| %.3g\n", tag, worst);
    };
    auto tma = [&](auto kern, int rows, int nst, const char *tag) {
        size_t sm = (size_t)nst * rows * C * 2;
        CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
        CK(cudaMemset(y, 0, bytes));
        row(tag, time_graph([&](cudaStream_t s) { kern<<<sms, blk, sm, s>>>(fa); }));
        vs_product(tag);
    };
    for (int bpsm : {4, 8}) {
        char nm[64];
        snprintf(nm, sizeof nm, "flat fwd U4 grid %d x 256", sms * bpsm);
        CK(cudaMemset(y, 0, bytes));
        row(nm, time_graph([&](cudaStream_t s) { fwd_flat_kernel<4><<<sms * bpsm, 256, 0, s>>>(fa); }));
        vs_product(nm);
        snprintf(nm, sizeof nm, "flat fwd U8 grid %d x 256", sms * bpsm);
        row(nm, time_graph([&](cudaStream_t s) { fwd_flat_kernel<8><<<sms * bpsm, 256, 0, s>>>(fa); }));
    }
    tma(fwd_tma_kernel<32, 3>, 32, 3, "tma fwd 32 rows x 3 stages");
    tma(fwd_tma_kernel<32, 4>, 32, 4, "tma fwd 32 rows x 4 stages");
    tma(fwd_tma_kernel<32, 6>, 32, 6, "tma fwd 32 rows x 6 stages");
    tma(fwd_tma_kernel<16, 8>, 16, 8, "tma fwd 16 rows x 8 stages");
    CK(cudaFree(y)); CK(cudaFree(y2)); CK(cudaFree(par));
}

// The product's statistics pass (yv_bn_stats_forward: on these operands the TMA reduce and its programmatically
// launched finish, with running statistics) in this harness, against the probe's variants of the same design.
static float time_product(const Args &a)
{
    yv_bn_shape sh = {1, a.C, 1, a.n};
    yv_view4 z = {(void *)a.z, YV_FLOAT16, {a.n * a.C, 1, a.n * a.C, a.C}};
    void *ws; float *run;
    CK(cudaMalloc(&ws, yv_bn_workspace_size(sh))); CK(cudaMalloc(&run, 2 * a.C * 4)); CK(cudaMemset(run, 0, 2 * a.C * 4));
    float us = time_graph([&](cudaStream_t s) { CK(yv_bn_stats_forward(sh, z, run, run + a.C, 0.03, 1e-3, a.mean, a.invstd, ws, s)); });
    CK(cudaFree(ws)); CK(cudaFree(run));
    return us;
}

template <typename CHECK> static void sweep2(Args a, int sms, size_t bytes, int64_t C, CHECK check)
{
    auto row = [&](const char *name, float us) { printf("%-44s %8.2f us  %7.0f GB/s\n", name, us, bytes / (us * 1e3)); };
    row("product yv_bn_stats_forward", time_product(a));
    check("product yv_bn_stats_forward");
    dim3 blk(64, 4);
    auto fin = [&](cudaStream_t s) { finish_kernel<<<(unsigned)((C + 3) / 4), 256, 0, s>>>(a); };
    a.S = sms * 4;
    char nm[96];
#define S2(O) snprintf(nm, sizeof nm, "s2 R4 S=%d opt %d", a.S, O); row(nm, time_graph([&](cudaStream_t s) { stats2_kernel<4, O><<<a.S, blk, 0, s>>>(a); }));
    S2(0) S2(1) S2(2) S2(3) S2(4) S2(8) S2(12) S2(16) S2(17) S2(7)
    a.S = sms * 2;
    S2(0) S2(1) S2(3) S2(8)
    snprintf(nm, sizeof nm, "s2 R4 S=%d opt 3 + finish", a.S);
    row(nm, time_graph([&](cudaStream_t s) { stats2_kernel<4, 3><<<a.S, blk, 0, s>>>(a); fin(s); }));
    check(nm);
    if (C != 512) return;
    auto tma = [&](auto kern, int rows, int nst, int ty, const char *tag) {
        size_t sm = (size_t)nst * rows * C * 2 + 128 + 16 * 64 * ty * 8;
        CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
        for (int bpsm = 1; bpsm <= (sm <= 110 * 1024 && ty == 4 ? 2 : 1); bpsm++) {   // two blocks an SM where they fit
            a.S = sms * bpsm;
            snprintf(nm, sizeof nm, "tma2 %s S=%d", tag, a.S);
            row(nm, time_graph([&](cudaStream_t s) { kern<<<a.S, dim3(64, ty), sm, s>>>(a); }));
            snprintf(nm, sizeof nm, "tma2 %s S=%d + finish", tag, a.S);
            row(nm, time_graph([&](cudaStream_t s) { kern<<<a.S, dim3(64, ty), sm, s>>>(a); fin(s); }));
            check(nm);   // the integer conversion is exact for finite halves
        }
    };
    tma(stats_tma2_kernel<32, 3, 4, 0>, 32, 3, 4, "32x3 ty4 cvt");
    tma(stats_tma2_kernel<32, 3, 4, 32>, 32, 3, 4, "32x3 ty4 interleaved");
    tma(stats_tma2_kernel<32, 3, 4, 64>, 32, 3, 4, "32x3 ty4 early refill");
    tma(stats_tma2_kernel<32, 3, 4, 96>, 32, 3, 4, "32x3 ty4 interl.+early");
    tma(stats_tma2_kernel<32, 4, 4, 96>, 32, 4, 4, "32x4 ty4 interl.+early");
    tma(stats_tma2_kernel<16, 6, 4, 96>, 16, 6, 4, "16x6 ty4 interl.+early");
    tma(stats_tma2_kernel<16, 3, 4, 96>, 16, 3, 4, "16x3 ty4 interl.+early");
    tma(stats_tma2_kernel<32, 3, 8, 96>, 32, 3, 8, "32x3 ty8 interl.+early");
    {   // the finish launched programmatically: with one reduce block an SM, its blocks can be resident early
        size_t sm = (size_t)3 * 32 * C * 2 + 128 + 16 * 64 * 4 * 8;
        auto k0 = stats_tma2_kernel<32, 3, 4, 32>, k1 = stats_tma2_kernel<32, 3, 4, 160>;
        CK(cudaFuncSetAttribute(k0, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
        CK(cudaFuncSetAttribute(k1, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
        a.S = sms;
        row("tma2 32x3 ty4 interleaved + finish PDL", time_graph([&](cudaStream_t s) { k0<<<a.S, dim3(64, 4), sm, s>>>(a); launch_pdl_finish(a, s); }));
        check("tma2 interleaved + finish PDL");
        row("tma2 32x3 ty4 interleaved + finish PDL early", time_graph([&](cudaStream_t s) { k1<<<a.S, dim3(64, 4), sm, s>>>(a); launch_pdl_finish(a, s); }));
        check("tma2 interleaved + finish PDL early");
    }
    auto tcl = [&](auto kern, int rows, int nst, int ty, int cl, const char *tag) {
        size_t sm = (size_t)nst * rows * C * 2 + 128 + 16 * 64 * ty * 8;
        CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeClusterDimension;
        at[0].val.clusterDim.x = cl; at[0].val.clusterDim.y = 1; at[0].val.clusterDim.z = 1;
        cfg.blockDim = dim3(64, ty); cfg.dynamicSmemBytes = sm; cfg.attrs = at; cfg.numAttrs = 1;
        cfg.gridDim = dim3((unsigned)(sms / cl * cl));
        int active = 0;
        CK(cudaOccupancyMaxActiveClusters(&active, kern, &cfg));
        int grid = std::min(active, sms / cl) * cl;
        cfg.gridDim = dim3((unsigned)grid);
        snprintf(nm, sizeof nm, "tma cluster %s CL=%d grid %d (active %d)", tag, cl, grid, active);
        row(nm, time_graph([&](cudaStream_t s) { cfg.stream = s; CK(cudaLaunchKernelEx(&cfg, kern, a)); }));
        check(nm);
    };
    tcl(stats_tma_cl_kernel<32, 3, 4, 0, 2>, 32, 3, 4, 2, "32x3 ty4");
    tcl(stats_tma_cl_kernel<32, 3, 4, 0, 4>, 32, 3, 4, 4, "32x3 ty4");
    tcl(stats_tma_cl_kernel<32, 3, 4, 96, 2>, 32, 3, 4, 2, "32x3 ty4 interl.+early");
    tcl(stats_tma_cl_kernel<32, 3, 8, 96, 2>, 32, 3, 8, 2, "32x3 ty8 interl.+early");
    tcl(stats_tma_cl_kernel<32, 3, 4, 96, 4>, 32, 3, 4, 4, "32x3 ty4 interl.+early");
}

template <typename F> float time_graph(F launch, int calls, int reps)
{
    cudaStream_t s; CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (int i = 0; i < 3; i++) launch(s);
    CK(cudaStreamSynchronize(s));
    cudaGraph_t g; cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < calls; i++) launch(s);
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    std::vector<float> v;
    CK(cudaGraphLaunch(ge, s));
    for (int r = 0; r < reps; r++) {
        CK(cudaEventRecord(e0, s)); CK(cudaGraphLaunch(ge, s)); CK(cudaEventRecord(e1, s)); CK(cudaEventSynchronize(e1));
        float ms; CK(cudaEventElapsedTime(&ms, e0, e1)); v.push_back(ms * 1000.f / calls);
    }
    std::sort(v.begin(), v.end());
    CK(cudaGraphExecDestroy(ge)); CK(cudaGraphDestroy(g)); CK(cudaStreamDestroy(s));
    return v[v.size() / 2];
}

int main(int argc, char **argv)
{
    int64_t n = argc > 1 ? atoll(argv[1]) : 64 * 1600, C = argc > 2 ? atoll(argv[2]) : 512;
    int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    size_t bytes = (size_t)n * C * 2;
    printf("n=%lld C=%lld bytes=%.1f MB SMs=%d\n", (long long)n, (long long)C, bytes / 1e6, sms);
    std::vector<__half> h((size_t)n * C);
    srand(1);
    for (size_t i = 0; i < h.size(); i++) h[i] = __float2half(3.0f + (float)((rand() % 2001) - 1000) / 300.0f + (float)(i % C) * 0.01f);
    __half *z; double *partial, *acc; unsigned *ticket, *out; float *mean, *invstd;
    CK(cudaMalloc(&z, bytes)); CK(cudaMemcpy(z, h.data(), bytes, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&partial, 2 * 4096 * C * 8)); CK(cudaMalloc(&acc, 2 * C * 8)); CK(cudaMemset(acc, 0, 2 * C * 8));
    CK(cudaMalloc(&ticket, 64)); CK(cudaMemset(ticket, 0, 64)); CK(cudaMalloc(&out, 4));
    CK(cudaMalloc(&mean, C * 4)); CK(cudaMalloc(&invstd, C * 4));
    // reference (double on host)
    std::vector<double> rm(C), ri(C);
    {
        std::vector<double> s0(C), s1(C);
        for (int64_t k = 0; k < n; k++) for (int64_t c = 0; c < C; c++) { double x = __half2float(h[k * C + c]); s0[c] += x; s1[c] += x * x; }
        for (int64_t c = 0; c < C; c++) { double m = s0[c] / n, v = s1[c] / n - m * m; rm[c] = m; ri[c] = 1.0 / sqrt(v + 1e-3); }
    }
    auto check = [&](const char *name) {
        std::vector<float> m(C), is(C);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(m.data(), mean, C * 4, cudaMemcpyDeviceToHost)); CK(cudaMemcpy(is.data(), invstd, C * 4, cudaMemcpyDeviceToHost));
        double em = 0, ei = 0;
        for (int c = 0; c < C; c++) { em = fmax(em, fabs(m[c] - rm[c]) / fabs(rm[c])); ei = fmax(ei, fabs(is[c] - ri[c]) / ri[c]); }
        printf("  check %-28s max rel err mean %.2e invstd %.2e\n", name, em, ei);
        CK(cudaMemset(mean, 0, C * 4)); CK(cudaMemset(invstd, 0, C * 4));
    };
    auto row = [&](const char *name, float us) { printf("%-44s %8.2f us  %7.0f GB/s\n", name, us, bytes / (us * 1e3)); };

    Args a2{z, n, C, sms * 4, partial, acc, ticket, mean, invstd};
    if (getenv("FWD")) { sweep_forward(z, n, C, sms); return 0; }
    if (getenv("SWEEP2")) { sweep2(a2, sms, bytes, C, check); return 0; }
    int64_t nv = bytes / 16;
    for (int bpsm : {2, 4, 8}) for (int thr : {256, 512, 1024}) {
        if (bpsm * thr > 2048) continue;
        int grid = sms * bpsm;
        char nm[96];
        snprintf(nm, sizeof nm, "read strided U4 grid %d x %d", grid, thr);
        row(nm, time_graph([&](cudaStream_t s) { read_kernel<4><<<grid, thr, 0, s>>>((const uint4 *)z, nv, out); }));
        snprintf(nm, sizeof nm, "read strided U8 grid %d x %d", grid, thr);
        row(nm, time_graph([&](cudaStream_t s) { read_kernel<8><<<grid, thr, 0, s>>>((const uint4 *)z, nv, out); }));
        snprintf(nm, sizeof nm, "read chunk   U4 grid %d x %d", grid, thr);
        row(nm, time_graph([&](cudaStream_t s) { read_chunk_kernel<4><<<grid, thr, 0, s>>>((const uint4 *)z, nv, out); }));
    }
    Args a{z, n, C, sms * 4, partial, acc, ticket, mean, invstd};
    dim3 blk(64, 4);
    auto fin = [&](cudaStream_t s) { finish_kernel<<<(unsigned)((C + 3) / 4), 256, 0, s>>>(a); };
    for (int S : {sms * 2, sms * 4, sms * 8}) {
        a.S = S;
        char nm[96];
        snprintf(nm, sizeof nm, "stats R4 S=%d reduce only", S);
        row(nm, time_graph([&](cudaStream_t s) { stats_kernel<4, 0><<<S, blk, 0, s>>>(a); }));
        snprintf(nm, sizeof nm, "stats R4 S=%d + finish", S);
        row(nm, time_graph([&](cudaStream_t s) { stats_kernel<4, 0><<<S, blk, 0, s>>>(a); fin(s); }));
        check(nm);
        snprintf(nm, sizeof nm, "stats R4 S=%d + finish PDL", S);
        row(nm, time_graph([&](cudaStream_t s) { stats_kernel<4, 0><<<S, blk, 0, s>>>(a); launch_pdl_finish(a, s); }));
        check(nm);
        snprintf(nm, sizeof nm, "stats R4 S=%d + finish PDL early", S);
        row(nm, time_graph([&](cudaStream_t s) { stats_kernel<4, 3><<<S, blk, 0, s>>>(a); launch_pdl_finish(a, s); }));
        check(nm);
        snprintf(nm, sizeof nm, "stats R8 S=%d reduce only", S);
        row(nm, time_graph([&](cudaStream_t s) { stats_kernel<8, 0><<<S, blk, 0, s>>>(a); }));
        snprintf(nm, sizeof nm, "stats R8 S=%d + finish", S);
        row(nm, time_graph([&](cudaStream_t s) { stats_kernel<8, 0><<<S, blk, 0, s>>>(a); fin(s); }));
        snprintf(nm, sizeof nm, "stats R4 S=%d atomic+last", S);
        row(nm, time_graph([&](cudaStream_t s) { stats_kernel<4, 1><<<S, blk, 0, s>>>(a); }));
        check(nm);
        snprintf(nm, sizeof nm, "stats R8 S=%d atomic+last", S);
        row(nm, time_graph([&](cudaStream_t s) { stats_kernel<8, 1><<<S, blk, 0, s>>>(a); }));
        if (S <= sms * 4) {
            snprintf(nm, sizeof nm, "stats R4 S=%d coop gridsync finish", S);
            void *args[] = {&a};
            cudaError_t ce = cudaSuccess;
            float us = time_graph([&](cudaStream_t s) { cudaError_t e = cudaLaunchCooperativeKernel((void *)stats_kernel<4, 2>, dim3(S), blk, args, 0, s); if (e != cudaSuccess) ce = e; });
            if (ce != cudaSuccess) printf("%s: %s\n", nm, cudaGetErrorString(ce)); else row(nm, us);
            check(nm);
        }
    }
    if (C == 512) {
        auto tma = [&](auto kern, int rows, int nst, const char *tag) {
            size_t sm = (size_t)nst * rows * C * 2 + 128 + 16 * 64 * 4 * 8;
            CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
            for (int bpsm : {1, 2}) {
                a.S = sms * bpsm;
                char nm[96];
                snprintf(nm, sizeof nm, "tma %s S=%d reduce only", tag, a.S);
                row(nm, time_graph([&](cudaStream_t s) { kern<<<a.S, blk, sm, s>>>(a); }));
                snprintf(nm, sizeof nm, "tma %s S=%d + finish", tag, a.S);
                row(nm, time_graph([&](cudaStream_t s) { kern<<<a.S, blk, sm, s>>>(a); fin(s); }));
                check(nm);
            }
        };
        tma(stats_tma2_kernel<16, 4, 4, 0>, 16, 4, "16rows x4");
        tma(stats_tma2_kernel<16, 6, 4, 0>, 16, 6, "16rows x6");
        tma(stats_tma2_kernel<32, 3, 4, 0>, 32, 3, "32rows x3");
        tma(stats_tma2_kernel<8, 8, 4, 0>, 8, 8, "8rows x8");
    }
    return 0;
}
