/* bn_silu.cu — fused training-mode BatchNorm + SiLU on the GPU: batch statistics, forward (bn_silu,
 * bn_silu_add, bn2_silu) and the full BN backward. C-style CUDA: structs, macros, no templates.
 *
 * Maths (csrc/bn_silu_ref.c is the CPU twin; n = B·H·W):
 *   stats     mean = K + S1/n, var = S2/n - (S1/n)² with S1 = Σ(z - K), S2 = Σ(z - K)² and the shift K = z[0,c,0,0]
 *             (close to the mean, so the sum of squares does not cancel); invstd = 1/sqrt(var + eps);
 *             running_mean = (1-m)·rm + m·mean, running_var = (1-m)·rv + m·var·n/(n-1)
 *   forward   x̂ = (z - mean)·invstd, u = x̂·γ + β [+ x̂2·γ2 + β2], y = act(u) [+ residual]
 *   backward  g = dy·act'(u), silu'(u) = s·(1 + u·(1 - s)), s = sigmoid(u); dβ = Σg, dγ = Σg·x̂;
 *             dz = γ·invstd·(g - Σg/n - x̂·Σ(g·x̂)/n)  (batch statistics), γ·invstd·g  (batch_stats = 0)
 * Per-element arithmetic is float32. Sums: each thread adds up to 32 elements per channel in float32, then
 * folds them into float64 accumulators; blocks write float64 partial sums; a per-channel pass adds those in
 * float64 in a fixed order (no atomics: results are the same run to run on one device; the channels-last
 * and planar reductions' block counts follow the device's SM count).
 * The channels-last and planar-vector forward and backward passes take s from the hardware exp2 and
 * reciprocal (bn_sigmoid_hw, ~1e-6 relative); the generic passes use expf and the IEEE division, as
 * csrc/bn_silu_ref.c.
 *
 * Saved for backward (by the caller, yolov9c/ops/bn_silu.py): z in its storage dtype (2 B/element in fp16)
 * plus mean, invstd (C,) float32: no normalised or activated tensor. y and dz are recomputed from z.
 * Outputs: out is written (=); dz is written (=) or accumulated (+=, `accumulate`); dγ, dβ, mean, invstd
 * are written; running statistics are updated in place.
 *
 * Passes (all on the caller's stream, no host synchronisation):
 *   stats     reduce        float64 partial sums [2][S][C] (Σ(z-K), Σ(z-K)²) into the workspace: reads z once
 *             bn_stats_finish_kernel: mean, invstd, running update. Both finish kernels run blocks of 4 channels
 *             × 64 lanes over S (C/4 blocks: 128 for C = 512), each lane with all sums' partials in flight
 *             (10 per sum), then a fixed shuffle tree and warp order per channel (bn_finish_sums)
 *   forward   one elementwise pass: reads z (z2, residual), writes out
 *   backward  reduce        partial Σg, Σg·x̂1 [, Σg·x̂2] [2 or 3][S][C]: reads z (z2) and dy once
 *             bn_bwd_finish_kernel: dγ, dβ and the dz coefficients [5][C] (k1, k2_1, k2_2, a1, a2)
 *             one elementwise pass: reads z (z2), dy [, dz for +=], writes dz1 (dz2)
 * So a training step moves ~2 reads (stats, forward) + 1 write of z-sized data forward and ~4 (+1 for +=)
 * backward, every pass a single sweep at memory bandwidth in the fast path.
 *
 * Layouts: the iteration follows z1. Before launching, (H, W) and then (B, H·W) are merged when every
 * operand's strides allow it. Four kernel families:
 *   fast      "row-uniform" operands: after the merge B == H == 1 and channel stride 1 (C == 1: any), so element
 *             (row k, channel c) is at k·rs + c with the operand's own row stride rs: channels-last tensors and
 *             channel slices of a channels-last buffer (rs = C_total > C). Every operand in z1's dtype. Kernels
 *             are specialised on the storage type T (half, bfloat16, float) and the vector width V: V elements
 *             (16 bytes: 8 halfs or 4 floats; backward passes 8 bytes to bound registers) per load/store when
 *             C % V == 0 and every pointer and row stride is V-aligned, else 2 or 1. Blocks are (tx, ty) =
 *             (min(C/V, 256) channel vectors, 256/tx rows): a thread keeps its channels for the whole pass, so
 *             the per-channel scale = invstd·γ, shift = β − mean·scale (and x̂ = (z − mean)·invstd for the
 *             backward) live in registers and no element needs a division. Elementwise passes are grid-stride
 *             over groups of ty rows; reductions give block s the contiguous rows [s·chunk, (s+1)·chunk) with
 *             one wave of blocks (S = 4 per SM, fewer when blocks would get < ~64 rows), <= 64 registers per
 *             thread (4 blocks of 256 resident per SM), BN_RED_ROWS rows of loads in flight per thread and the
 *             float64 accumulators in shared memory, summed over ty in a fixed order.
 *             The elementwise passes run a grid of whole waves (24 blocks per SM) and keep 4 rows in flight
 *             per thread, so the constants are computed once per thread for many rows; they too stay at <= 64
 *             registers (4 blocks per SM). The forward keeps its 16-byte loads as raw 32-bit words until used
 *             (4 rows of z1; 2 when it also reads z2 or a residual; 1 when both), each row under its own
 *             bounds test (which also keeps ptxas from sinking the later rows' loads into the arithmetic).
 *   planar vector  NCHW and channel slices of NCHW buffers: after the merge H == 1 and every operand has unit
 *             W stride, (b, c) planes of W = H·W elements, one dtype, V-wide loads along the plane (16 bytes
 *             where W % V == 0 and pointers and plane strides allow, down to V = 1 for odd planes). Every
 *             pass walks flat vector indices with one wave of blocks (not a block per plane or channel:
 *             small planes starved it), stepping without divisions (bn_pplan). Reductions: block k adds `chunk` contiguous vectors of
 *             the channel-major order, i.e. the parts of one or a few channels, into per-channel partial
 *             slots (the same [NSUM][S][C] layout, so the finish kernels are shared). Elementwise:
 *             grid-stride over (b, c, i) with the channel constants read per vector through the read-only
 *             cache. u = ((z - mean)·invstd)·γ + β as in the generic kernels. Details above the kernels.
 *   rows      channel stride 1 otherwise (mixed dtypes, unmerged strides): a warp per (b, h, w) row with lanes
 *             over channels, scalar loads (generic, slow).
 *   planar    everything else (odd H·W, 'hw'-permuted layouts): (b, c) planes, tiles of contiguous elements.
 * Other strides work through a general (slower) index decomposition. All offsets are 64-bit: tensors over
 * 2^31 elements are fine.
 * Test: python -m pytest -q tests/test_bn_silu.py (CUDA cases); speed: python benchmarks/bench_bn_silu.py
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.cuh"
#include "yv_kernels.h"

#define BN_THREADS 256
#define BN_ROWS_Y 8            /* rows kernels: blocks of 32 channels x 8 rows (reduction) or 8 warps */
#define BN_MAX_SPLITS 512      /* partial sums per channel (S) of the generic reductions (bn_splits); the fast and
                                  planar ones have their own bounds, and bn_partial_bytes sizes for the largest */
#define BN_FOLD 32             /* float32 elements per thread before folding into float64 */
#define BN_MAX_GRID (1 << 20)
#define BN_NSUM 3
#define BN_FIN_C 4             /* finish kernels: channels per block (a divisor of 32) */
#define BN_FIN_L 64            /* finish kernels: lanes over S per channel */
#define BN_FIN_U 10            /* finish kernels: partials per sum and lane in flight: S <= 640 in one round;
                                  3 sums stay under 128 registers (12 took 188), 2 blocks per SM */
#define BN_FIN_THREADS (BN_FIN_C * BN_FIN_L)   /* 256 */
#define BN_FIN_W (BN_FIN_THREADS / 32)         /* warps per finish block */
static_assert(32 % BN_FIN_C == 0 && BN_FIN_L % (32 / BN_FIN_C) == 0, "finish blocks: whole warps of whole channels");

typedef struct bn_geom {
    int64_t B, C, H, W, HW, n;
} bn_geom;

/* Everything one elementwise or reduction pass reads and writes. */
typedef struct bn_args {
    yv_view4 z1, z2, res, gy, out, dz1, dz2;
    yv_bn_params p1, p2;
    int silu, accumulate, stats;   /* stats: the reduction sums z - K, (z - K)² instead of g, g·x̂ */
    const float *coef;             /* backward pass 2: [5][C] k1, k2_1, k2_2, a1, a2 */
    double *partial;               /* reductions: [BN_NSUM][S][C] */
    int64_t S;
} bn_args;

__device__ __forceinline__ float bn_load(const yv_view4 *v, int64_t off)
{
    return yv_load_float(v->data, v->dtype, off);
}

__device__ __forceinline__ void bn_store(const yv_view4 *v, int64_t off, float x, int accumulate)
{
    if (accumulate)
        x = bn_load(v, off) + x;
    if (v->dtype == YV_FLOAT16)
        ((__half *)v->data)[off] = __float2half_rn(x);
    else if (v->dtype == YV_BFLOAT16)
        ((__nv_bfloat16 *)v->data)[off] = __float2bfloat16_rn(x);
    else
        ((float *)v->data)[off] = x;
}

__device__ __forceinline__ int64_t bn_off(const yv_view4 *v, int64_t b, int64_t c, int64_t h, int64_t w)
{
    return b * v->stride[0] + c * v->stride[1] + h * v->stride[2] + w * v->stride[3];
}

/* (b, h, w) of row k in [0, n); the merged layouts (H == 1, and B == 1) need no division. */
__device__ __forceinline__ void bn_row(const bn_geom *g, int64_t k, int64_t *b, int64_t *h, int64_t *w)
{
    int64_t hw = k;
    *b = 0;
    if (g->B > 1) {
        *b = k / g->HW;
        hw = k - *b * g->HW;
    }
    if (g->H > 1) {
        *h = hw / g->W;
        *w = hw - *h * g->W;
    }
    else {
        *h = 0;
        *w = hw;
    }
}

__device__ __forceinline__ float bn_sigmoid(float u)
{
    return 1.0f / (1.0f + expf(-u));
}

/* sigmoid from the hardware exp2 and reciprocal (MUFU.EX2, MUFU.RCP): 4 instructions instead of ~25 for
 * expf and the IEEE division, which made the channels-last backward passes instruction-bound. Relative error
 * ~1e-6 for |u| < 16 (the exp2 of a rounded u·log2(e)), far inside the float32 tolerance (1e-5 of max|dz|);
 * u -> -inf gives 0, u -> +inf gives 1. */
__device__ __forceinline__ float bn_sigmoid_hw(float u)
{
    float e;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(u * -1.44269504f));   /* exp(-u); a denormal result is 0 */
    return __fdividef(1.0f, 1.0f + e);
}

/* u of one element (x̂1, x̂2 returned for the backward). */
__device__ __forceinline__ float bn_u(const bn_args *a, int64_t b, int64_t c, int64_t h, int64_t w, float *xh1,
                                      float *xh2)
{
    float x1 = (bn_load(&a->z1, bn_off(&a->z1, b, c, h, w)) - a->p1.mean[c]) * a->p1.invstd[c];
    float u = x1 * a->p1.weight[c] + a->p1.bias[c];
    *xh1 = x1;
    *xh2 = 0.0f;
    if (a->z2.data != NULL) {
        float x2 = (bn_load(&a->z2, bn_off(&a->z2, b, c, h, w)) - a->p2.mean[c]) * a->p2.invstd[c];
        u = u + (x2 * a->p2.weight[c] + a->p2.bias[c]);
        *xh2 = x2;
    }
    return u;
}

__device__ __forceinline__ float bn_g(const bn_args *a, int64_t b, int64_t c, int64_t h, int64_t w, float *xh1,
                                      float *xh2)
{
    float u = bn_u(a, b, c, h, w, xh1, xh2);
    float dy = bn_load(&a->gy, bn_off(&a->gy, b, c, h, w));
    if (!a->silu)
        return dy;
    float s = bn_sigmoid(u);
    return dy * (s * (1.0f + u * (1.0f - s)));
}

__device__ __forceinline__ void bn_fwd_elem(const bn_args *a, int64_t b, int64_t c, int64_t h, int64_t w)
{
    float xh1, xh2;
    float u = bn_u(a, b, c, h, w, &xh1, &xh2);
    float y = a->silu ? u * bn_sigmoid(u) : u;
    if (a->res.data != NULL)
        y = bn_load(&a->res, bn_off(&a->res, b, c, h, w)) + y;
    bn_store(&a->out, bn_off(&a->out, b, c, h, w), y, 0);
}

__device__ __forceinline__ void bn_bwd_elem(const bn_args *a, const bn_geom *g, int64_t b, int64_t c, int64_t h,
                                            int64_t w)
{
    float xh1, xh2;
    float gg = bn_g(a, b, c, h, w, &xh1, &xh2);
    const float *k = a->coef;
    float d = gg - k[c];
    if (a->dz1.data != NULL)
        bn_store(&a->dz1, bn_off(&a->dz1, b, c, h, w), k[3 * g->C + c] * (d - xh1 * k[g->C + c]), a->accumulate);
    if (a->dz2.data != NULL)
        bn_store(&a->dz2, bn_off(&a->dz2, b, c, h, w), k[4 * g->C + c] * (d - xh2 * k[2 * g->C + c]),
                 a->accumulate);
}

/* The values a reduction adds up for one element. */
__device__ __forceinline__ void bn_red_values(const bn_args *a, float K, int64_t b, int64_t c, int64_t h, int64_t w,
                                              float v[BN_NSUM])
{
    if (a->stats) {
        float d = bn_load(&a->z1, bn_off(&a->z1, b, c, h, w)) - K;
        v[0] = d;
        v[1] = d * d;
        v[2] = 0.0f;
        return;
    }
    float xh1, xh2;
    float gg = bn_g(a, b, c, h, w, &xh1, &xh2);
    v[0] = gg;
    v[1] = gg * xh1;
    v[2] = gg * xh2;
}

/* Per-thread accumulation: float32 runs of at most BN_FOLD elements folded into float64. */
typedef struct bn_acc {
    double d[BN_NSUM];
    float f[BN_NSUM];
    int count;
} bn_acc;

__device__ __forceinline__ void bn_acc_add(bn_acc *acc, const float v[BN_NSUM])
{
    for (int j = 0; j < BN_NSUM; j++)
        acc->f[j] += v[j];
    if (++acc->count == BN_FOLD) {
        for (int j = 0; j < BN_NSUM; j++) {
            acc->d[j] += acc->f[j];
            acc->f[j] = 0.0f;
        }
        acc->count = 0;
    }
}

__device__ __forceinline__ void bn_acc_init(bn_acc *acc)
{
    for (int j = 0; j < BN_NSUM; j++) {
        acc->d[j] = 0.0;
        acc->f[j] = 0.0f;
    }
    acc->count = 0;
}

__device__ __forceinline__ void bn_acc_flush(bn_acc *acc)
{
    for (int j = 0; j < BN_NSUM; j++)
        acc->d[j] += acc->f[j];
}

/* Planar reduction: block (c, s) adds rows [s·chunk, (s+1)·chunk) of channel c. */
__global__ void bn_reduce_planar_kernel(bn_args a, bn_geom g)
{
    __shared__ double sh[BN_NSUM][BN_THREADS / 32];
    int64_t c = blockIdx.x, s = blockIdx.y;
    int64_t chunk = (g.n + a.S - 1) / a.S;
    int64_t k = s * chunk, k1 = k + chunk < g.n ? k + chunk : g.n;
    float K = a.stats ? bn_load(&a.z1, bn_off(&a.z1, 0, c, 0, 0)) : 0.0f;
    bn_acc acc;
    bn_acc_init(&acc);
    float v[BN_NSUM];
    while (k < k1) {
        /* one image b at a time, so the division by H·W happens once per segment, not per element */
        int64_t b = g.B > 1 ? k / g.HW : 0;
        int64_t hw0 = k - b * g.HW;
        int64_t end = (b + 1) * g.HW < k1 ? (b + 1) * g.HW : k1;
        int64_t len = end - k;
        for (int64_t i = threadIdx.x; i < len; i += blockDim.x) {
            int64_t hw = hw0 + i, h = 0, w = hw;
            if (g.H > 1) {
                h = hw / g.W;
                w = hw - h * g.W;
            }
            bn_red_values(&a, K, b, c, h, w, v);
            bn_acc_add(&acc, v);
        }
        k = end;
    }
    bn_acc_flush(&acc);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int j = 0; j < BN_NSUM; j++) {
        double x = acc.d[j];
        for (int o = 16; o > 0; o >>= 1)
            x += __shfl_down_sync(0xffffffffu, x, o);
        if (lane == 0)
            sh[j][warp] = x;
    }
    __syncthreads();
    if (threadIdx.x < BN_NSUM) {
        int j = threadIdx.x;
        double x = 0.0;
        for (int i = 0; i < BN_THREADS / 32; i++)
            x += sh[j][i];
        a.partial[((int64_t)j * a.S + s) * g.C + c] = x;
    }
}

/* Rows reduction (channel stride 1): block (channel group of 32, s), threads (32 channels, 8 rows). */
__global__ void bn_reduce_rows_kernel(bn_args a, bn_geom g)
{
    __shared__ double sh[BN_NSUM][BN_ROWS_Y][32];
    int64_t c = (int64_t)blockIdx.x * 32 + threadIdx.x, s = blockIdx.y;
    int64_t chunk = (g.n + a.S - 1) / a.S;
    int64_t k0 = s * chunk, k1 = k0 + chunk < g.n ? k0 + chunk : g.n;
    bn_acc acc;
    bn_acc_init(&acc);
    if (c < g.C) {
        float K = a.stats ? bn_load(&a.z1, bn_off(&a.z1, 0, c, 0, 0)) : 0.0f;
        float v[BN_NSUM];
        for (int64_t k = k0 + threadIdx.y; k < k1; k += BN_ROWS_Y) {
            int64_t b, h, w;
            bn_row(&g, k, &b, &h, &w);
            bn_red_values(&a, K, b, c, h, w, v);
            bn_acc_add(&acc, v);
        }
    }
    bn_acc_flush(&acc);
    for (int j = 0; j < BN_NSUM; j++)
        sh[j][threadIdx.y][threadIdx.x] = acc.d[j];
    __syncthreads();
    if (threadIdx.y < BN_NSUM && c < g.C) {
        int j = threadIdx.y;
        double x = 0.0;
        for (int i = 0; i < BN_ROWS_Y; i++)
            x += sh[j][i][threadIdx.x];
        a.partial[((int64_t)j * a.S + s) * g.C + c] = x;
    }
}

/* Finish kernels: blocks of BN_FIN_C channels x BN_FIN_L lanes over S (256 threads), so that C = 512 spreads
 * over 128 blocks (one per SM on an H200) rather than 16. Lane y loads the partials s = s0 + k·BN_FIN_L,
 * k < BN_FIN_U (s0 = y, then s0 += BN_FIN_L·BN_FIN_U while s0 < S), of all ns sums before adding any: up to
 * ns·BN_FIN_U loads in flight, so S <= BN_FIN_L·BN_FIN_U (the H200's 528) is one round trip. Fixed order:
 * a lane adds its partials in the order of s (an absent one, s >= S, as 0.0); the 32/BN_FIN_C lanes of a
 * channel within a warp are combined by a fixed shuffle tree, then thread y = 0 adds the BN_FIN_W warps'
 * results in warp order. A warp's load covers 32/BN_FIN_C rows of BN_FIN_C channels: whole 32-byte sectors. */
__device__ __forceinline__ void bn_finish_sums(const bn_args *a, const bn_geom *g, const int ns, int64_t c,
                                               double sh[BN_NSUM][BN_FIN_W][BN_FIN_C], double out[BN_NSUM])
{
    double x[BN_NSUM] = {0.0, 0.0, 0.0};
    if (c < g->C) {
        int64_t C = g->C, S = a->S, js = S * C, ks = (int64_t)BN_FIN_L * C;
        for (int64_t s0 = threadIdx.y; s0 < S; s0 += BN_FIN_L * BN_FIN_U) {
            /* m = how many k have s0 + k·BN_FIN_L < S; one pointer stepped by ks keeps the addressing cheap */
            int64_t left = (S - s0 + BN_FIN_L - 1) / BN_FIN_L;
            int m = left < BN_FIN_U ? (int)left : BN_FIN_U;
            const double *q = a->partial + s0 * C + c;
            double v[BN_NSUM][BN_FIN_U];
#pragma unroll
            for (int k = 0; k < BN_FIN_U; k++) {
#pragma unroll
                for (int j = 0; j < BN_NSUM; j++)
                    v[j][k] = j < ns && k < m ? q[j * js] : 0.0;
                if (k + 1 < BN_FIN_U)
                    q += ks;
            }
#pragma unroll
            for (int k = 0; k < BN_FIN_U; k++)
#pragma unroll
                for (int j = 0; j < BN_NSUM; j++)
                    x[j] += v[j][k];
        }
    }
    /* linear thread t = y·BN_FIN_C + x: lane t % 32 holds channel x, so the tree's offsets stop at BN_FIN_C */
    int t = threadIdx.y * BN_FIN_C + threadIdx.x;
#pragma unroll
    for (int j = 0; j < BN_NSUM; j++) {
        if (j < ns) {
            double xj = x[j];
#pragma unroll
            for (int o = 16; o >= BN_FIN_C; o /= 2)
                xj += __shfl_down_sync(0xffffffffu, xj, o);
            if ((t & 31) < BN_FIN_C)
                sh[j][t / 32][threadIdx.x] = xj;
        }
    }
    __syncthreads();
    for (int j = 0; j < BN_NSUM; j++) {
        double xj = 0.0;
        if (j < ns && threadIdx.y == 0)
            for (int w = 0; w < BN_FIN_W; w++)
                xj += sh[j][w][threadIdx.x];
        out[j] = xj;
    }
}

__global__ void __launch_bounds__(BN_FIN_THREADS) bn_stats_finish_kernel(bn_args a, bn_geom g, float *running_mean,
                                                                        float *running_var, double momentum,
                                                                        double eps, float *mean, float *invstd)
{
    __shared__ double sh[BN_NSUM][BN_FIN_W][BN_FIN_C];
    int64_t c = (int64_t)blockIdx.x * BN_FIN_C + threadIdx.x;
    double sum[BN_NSUM];
    bn_finish_sums(&a, &g, 2, c, sh, sum);
    if (threadIdx.y != 0 || c >= g.C)
        return;
    double K = bn_load(&a.z1, bn_off(&a.z1, 0, c, 0, 0));
    double n = (double)g.n;
    double m1 = sum[0] / n;
    double var = sum[1] / n - m1 * m1;
    var = var > 0.0 ? var : 0.0;
    double m = K + m1;
    mean[c] = (float)m;
    invstd[c] = (float)(1.0 / sqrt(var + eps));
    if (running_mean != NULL)
        running_mean[c] = (float)((1.0 - momentum) * running_mean[c] + momentum * m);
    if (running_var != NULL)
        running_var[c] = (float)((1.0 - momentum) * running_var[c] + momentum * var * n / (n - 1.0));
}

__global__ void __launch_bounds__(BN_FIN_THREADS) bn_bwd_finish_kernel(bn_args a, bn_geom g, int batch_stats,
                                                                      float *coef, float *dweight1, float *dbias1,
                                                                      float *dweight2, float *dbias2)
{
    __shared__ double sh[BN_NSUM][BN_FIN_W][BN_FIN_C];
    int64_t c = (int64_t)blockIdx.x * BN_FIN_C + threadIdx.x;
    double sum[BN_NSUM];
    if (a.z2.data != NULL)   /* ns a constant in each inlined copy: no loads or registers for an absent sum */
        bn_finish_sums(&a, &g, 3, c, sh, sum);
    else
        bn_finish_sums(&a, &g, 2, c, sh, sum);
    if (threadIdx.y != 0 || c >= g.C)
        return;
    int64_t C = g.C;
    double n = (double)g.n;
    double sg = sum[0], sgx1 = sum[1], sgx2 = sum[2];
    dbias1[c] = (float)sg;
    dweight1[c] = (float)sgx1;
    if (a.z2.data != NULL) {
        dbias2[c] = (float)sg;
        dweight2[c] = (float)sgx2;
    }
    coef[c] = batch_stats ? (float)(sg / n) : 0.0f;
    coef[C + c] = batch_stats ? (float)(sgx1 / n) : 0.0f;
    coef[2 * C + c] = batch_stats ? (float)(sgx2 / n) : 0.0f;
    coef[3 * C + c] = a.p1.weight[c] * a.p1.invstd[c];
    coef[4 * C + c] = a.z2.data != NULL ? a.p2.weight[c] * a.p2.invstd[c] : 0.0f;
}

/* Elementwise loops. Planar: tiles of `tile` elements of one (b, c) plane, grid-stride over tiles.
 * Rows: a warp per row, lanes over channels, grid-stride over rows. */
#define BN_PLANAR_LOOP(g, tile, BODY)                                                                          \
    do {                                                                                                       \
        int64_t per_plane_ = ((g).HW + (tile) - 1) / (tile);                                                   \
        int64_t tiles_ = (g).B * (g).C * per_plane_;                                                           \
        for (int64_t t_ = blockIdx.x; t_ < tiles_; t_ += gridDim.x) {                                          \
            int64_t plane_ = t_ / per_plane_, hw0_ = (t_ - plane_ * per_plane_) * (tile);                      \
            int64_t b = plane_ / (g).C, c = plane_ - b * (g).C;                                                \
            int64_t hw1_ = hw0_ + (tile) < (g).HW ? hw0_ + (tile) : (g).HW;                                    \
            for (int64_t hw_ = hw0_ + threadIdx.x; hw_ < hw1_; hw_ += blockDim.x) {                            \
                int64_t h = 0, w = hw_;                                                                        \
                if ((g).H > 1) {                                                                               \
                    h = hw_ / (g).W;                                                                           \
                    w = hw_ - h * (g).W;                                                                       \
                }                                                                                              \
                BODY;                                                                                          \
            }                                                                                                  \
        }                                                                                                      \
    } while (0)

#define BN_ROWS_LOOP(g, BODY)                                                                                  \
    do {                                                                                                       \
        int64_t warps_ = (int64_t)gridDim.x * (blockDim.x >> 5);                                               \
        for (int64_t k_ = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); k_ < (g).n;            \
             k_ += warps_) {                                                                                   \
            int64_t b, h, w;                                                                                   \
            bn_row(&(g), k_, &b, &h, &w);                                                                      \
            for (int64_t c = threadIdx.x & 31; c < (g).C; c += 32) {                                           \
                BODY;                                                                                          \
            }                                                                                                  \
        }                                                                                                      \
    } while (0)

__global__ void bn_fwd_planar_kernel(bn_args a, bn_geom g, int64_t tile)
{
    BN_PLANAR_LOOP(g, tile, bn_fwd_elem(&a, b, c, h, w));
}

__global__ void bn_fwd_rows_kernel(bn_args a, bn_geom g)
{
    BN_ROWS_LOOP(g, bn_fwd_elem(&a, b, c, h, w));
}

__global__ void bn_bwd_planar_kernel(bn_args a, bn_geom g, int64_t tile)
{
    BN_PLANAR_LOOP(g, tile, bn_bwd_elem(&a, &g, b, c, h, w));
}

__global__ void bn_bwd_rows_kernel(bn_args a, bn_geom g)
{
    BN_ROWS_LOOP(g, bn_bwd_elem(&a, &g, b, c, h, w));
}

/* ---- fast path: row-uniform operands, storage type T and vector width V fixed at compile time ---- */

#define BN_FAST_SPLITS 1024    /* fast reductions: at most this many blocks (S) */
#define BN_FAST_MIN_BLOCKS 528 /* ~4 blocks per SM on a 132-SM H200 */
#define BN_FAST_ROWS 256       /* rows per block when the grid is large enough anyway */
#define BN_FAST_MIN_ROWS 64    /* never fewer rows per block than this (unless n is smaller) */
#define BN_VEC_BYTES 16        /* stats and forward: 16-byte loads */
#define BN_BWD_VEC_BYTES 8     /* backward: 8-byte loads (more per-channel constants per thread) */
#define BN_RED_BLOCKS 4        /* fast reductions, backward elementwise: blocks resident per SM (<= 64 registers) */
#define BN_RED_ROWS 4          /* fast reductions: rows of loads in flight per thread */

__device__ __forceinline__ float bn_tof(float x) { return x; }
__device__ __forceinline__ float bn_tof(__half x) { return __half2float(x); }
__device__ __forceinline__ float bn_tof(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ void bn_fromf(float x, float *d) { *d = x; }
__device__ __forceinline__ void bn_fromf(float x, __half *d) { *d = __float2half_rn(x); }
__device__ __forceinline__ void bn_fromf(float x, __nv_bfloat16 *d) { *d = __float2bfloat16_rn(x); }

/* V elements of one row, loaded/stored as one aligned access of V·sizeof(T) bytes. */
template <typename T, int V> struct alignas(sizeof(T) * V) bn_vec {
    T v[V];
};

/* Element (row k, channel c) of a row-uniform operand: k·rs + c. */
template <typename T> __device__ __forceinline__ T *bn_at(const yv_view4 *v, int64_t k, int64_t c)
{
    return (T *)v->data + k * v->stride[3] + c;
}

/* V elements at p (aligned to V·sizeof(T) bytes) as float32; stored from float32 (+= when accumulate). */
template <typename T, int V> __device__ __forceinline__ void bn_vload_at(const T *p, float x[V])
{
    bn_vec<T, V> r = *(const bn_vec<T, V> *)p;
#pragma unroll
    for (int e = 0; e < V; e++)
        x[e] = bn_tof(r.v[e]);
}

template <typename T, int V> __device__ __forceinline__ void bn_vstore_at(T *p, const float x[V], int accumulate)
{
    bn_vec<T, V> r;
    if (accumulate) {
        r = *(const bn_vec<T, V> *)p;
#pragma unroll
        for (int e = 0; e < V; e++)
            bn_fromf(bn_tof(r.v[e]) + x[e], &r.v[e]);
    }
    else {
#pragma unroll
        for (int e = 0; e < V; e++)
            bn_fromf(x[e], &r.v[e]);
    }
    *(bn_vec<T, V> *)p = r;
}

template <typename T, int V> __device__ __forceinline__ void bn_vload(const yv_view4 *v, int64_t k, int64_t c, float x[V])
{
    bn_vload_at<T, V>(bn_at<T>(v, k, c), x);
}

template <typename T, int V>
__device__ __forceinline__ void bn_vstore(const yv_view4 *v, int64_t k, int64_t c, const float x[V], int accumulate)
{
    bn_vstore_at<T, V>(bn_at<T>(v, k, c), x, accumulate);
}

/* Per-channel constants of one BN for channels c0 .. c0+V-1. */
template <int V> struct bn_chan {
    float mean[V], invstd[V], scale[V], shift[V];
};

template <int V> __device__ __forceinline__ void bn_chan_load(const yv_bn_params *p, int64_t c0, bn_chan<V> *k)
{
#pragma unroll
    for (int e = 0; e < V; e++) {
        k->mean[e] = p->mean[c0 + e];
        k->invstd[e] = p->invstd[c0 + e];
        k->scale[e] = k->invstd[e] * p->weight[c0 + e];
        k->shift[e] = p->bias[c0 + e] - k->mean[e] * k->scale[e];
    }
}

/* ---- fast reductions: one wave of blocks with float64 accumulators in shared memory ----
 * Registers bound the bytes a thread can have in flight, so the float64 sums live in shared memory, not in
 * registers: __launch_bounds__(BN_THREADS, BN_RED_BLOCKS) keeps a thread at <= 64 registers and 4 blocks
 * (1024 threads) resident per SM, each thread with BN_RED_ROWS row loads issued before the first use. The grid
 * is one wave (bn_red_splits: S = SMs · BN_RED_BLOCKS, fewer for small n), so no block waits for a second wave
 * and the finish kernels add few partials. Per thread: float32 runs of at most BN_FOLD of its rows, each run
 * then added to the thread's own float64 slots; the block adds the slots over ty in a fixed order. */

/* The V elements at p (aligned to V·sizeof(T) bytes) as stored: converted to float32 only where they are used,
 * so a load in flight holds V·sizeof(T) bytes of registers. */
template <typename T, int V> __device__ __forceinline__ bn_vec<T, V> bn_vraw(const T *p)
{
    return *(const bn_vec<T, V> *)p;
}

/* The float64 slots of a block's threads: d[j][e][t] is sum j of channel lane e of thread t = ty·bx + tx,
 * touched only by thread t until bn_slots_store (consecutive t: consecutive doubles, no bank conflicts). */
template <int NS, int V> struct bn_slots {
    double d[NS][V][BN_THREADS];
};

template <int NS, int V> __device__ __forceinline__ void bn_slots_zero(bn_slots<NS, V> *s, int t)
{
#pragma unroll
    for (int j = 0; j < NS; j++)
#pragma unroll
        for (int e = 0; e < V; e++)
            s->d[j][e][t] = 0.0;
}

/* The float32 run f into thread t's slots; f restarts at 0. Volatile: the compiler would otherwise keep the
 * slots in registers across the loop, which is what they are there to avoid. */
template <int NS, int V> __device__ __forceinline__ void bn_slots_fold(bn_slots<NS, V> *s, int t, float f[NS][V])
{
#pragma unroll
    for (int j = 0; j < NS; j++)
#pragma unroll
        for (int e = 0; e < V; e++) {
            volatile double *d = &s->d[j][e][t];
            *d = *d + (double)f[j][e];
            f[j][e] = 0.0f;
        }
}

/* Block sums of channel vectors cv0 .. cv0+nv-1: partial[j][blockIdx.x][(cv0 + tx)·V + e] = Σ_ty (in ty
 * order) of slot [j][e][ty·bx + tx]. The barriers order it after every thread's last fold and before the slots
 * are zeroed for the next channel chunk. */
template <int NS, int V>
__device__ __forceinline__ void bn_slots_store(bn_slots<NS, V> *s, const bn_args *a, int64_t C, int64_t cv0, int nv)
{
    int bx = blockDim.x, by = blockDim.y, t = threadIdx.y * bx + threadIdx.x;
    __syncthreads();
    for (int i = t; i < NS * V * nv; i += bx * by) {
        int je = i / nv, tx = i - je * nv, j = je / V, e = je - j * V;
        double x = 0.0;
        for (int r = 0; r < by; r++)
            x += s->d[j][e][r * bx + tx];
        a->partial[((int64_t)j * a->S + blockIdx.x) * C + (cv0 + tx) * V + e] = x;
    }
    __syncthreads();
}

/* Rows [k0, k1) of block s: S blocks over n rows. */
__device__ __forceinline__ void bn_fast_chunk(const bn_args *a, const bn_geom *g, int64_t *k0, int64_t *k1)
{
    int64_t chunk = (g->n + a->S - 1) / a->S;
    *k0 = (int64_t)blockIdx.x * chunk;
    *k1 = *k0 + chunk < g->n ? *k0 + chunk : g->n;
}

/* This thread's rows of its block's chunk: k0 + ty, k0 + ty + by, ... below k1; their count. */
__device__ __forceinline__ int64_t bn_thread_rows(int64_t k0, int64_t k1)
{
    int64_t k = k0 + threadIdx.y, by = blockDim.y;
    return k < k1 ? (k1 - k + by - 1) / by : 0;
}

template <typename T, int V> __device__ __forceinline__ void bn_stats_add(bn_vec<T, V> x, const float K[V], float f[2][V])
{
#pragma unroll
    for (int e = 0; e < V; e++) {
        float d = bn_tof(x.v[e]) - K[e];
        f[0][e] += d;
        f[1][e] += d * d;
    }
}

/* Stats reduction: Σ(z - K), Σ(z - K)² per channel, K = z[row 0]. Grid (S), block (tx, ty). */
template <typename T, int V, int Z2>   /* Z2 unused */
__global__ void __launch_bounds__(BN_THREADS, BN_RED_BLOCKS) bn_stats_fast_kernel(bn_args a, bn_geom g)
{
    __shared__ bn_slots<2, V> sl;
    int64_t k0, k1, Cv = g.C / V;
    int t = threadIdx.y * blockDim.x + threadIdx.x;
    bn_fast_chunk(&a, &g, &k0, &k1);
    int64_t rows = bn_thread_rows(k0, k1), step = (int64_t)blockDim.y * a.z1.stride[3];
    for (int64_t cv0 = 0; cv0 < Cv; cv0 += blockDim.x) {
        int64_t c0 = (cv0 + threadIdx.x) * V;
        bn_slots_zero<2, V>(&sl, t);
        if (cv0 + threadIdx.x < Cv && rows > 0) {
            float K[V], f[2][V];
            bn_vload<T, V>(&a.z1, 0, c0, K);
#pragma unroll
            for (int e = 0; e < V; e++)
                f[0][e] = f[1][e] = 0.0f;
            const T *p = bn_at<T>(&a.z1, k0 + threadIdx.y, c0);
            for (int64_t done = 0; done < rows; done += BN_FOLD) {
                int m = rows - done < BN_FOLD ? (int)(rows - done) : BN_FOLD, i = 0;
                for (; i + BN_RED_ROWS <= m; i += BN_RED_ROWS) {
                    bn_vec<T, V> x[BN_RED_ROWS];
#pragma unroll
                    for (int r = 0; r < BN_RED_ROWS; r++)
                        x[r] = bn_vraw<T, V>(p + r * step);
#pragma unroll
                    for (int r = 0; r < BN_RED_ROWS; r++)
                        bn_stats_add<T, V>(x[r], K, f);
                    p += BN_RED_ROWS * step;
                }
                for (; i < m; i++, p += step)
                    bn_stats_add<T, V>(bn_vraw<T, V>(p), K, f);
                bn_slots_fold<2, V>(&sl, t, f);
            }
        }
        int64_t left = Cv - cv0;
        bn_slots_store<2, V>(&sl, &a, g.C, cv0, (int)(left < (int64_t)blockDim.x ? left : (int64_t)blockDim.x));
    }
}

/* g = dy·act'(u) and z_i - mean_i of V channels of one row from its stored z1 [, z2], dy (backward reduction):
 * u = z1·scale1 + shift [+ z2·scale2], as the channels-last forward. The reduction multiplies Σg·(z_i - mean_i)
 * by invstd_i when it folds a float32 run, so x̂_i costs no per-element multiply and no registers. */
template <typename T, int V, int Z2>
__device__ __forceinline__ void bn_fast_g(int silu, const bn_vec<T, V> *z1, const bn_vec<T, V> *z2,
                                          const bn_vec<T, V> *dy, const bn_chan<V> *k1, const bn_chan<V> *k2,
                                          const float shift[V], float gg[V], float xm1[V], float xm2[V])
{
    float u[V];
#pragma unroll
    for (int e = 0; e < V; e++) {
        float x1 = bn_tof(z1->v[e]);
        u[e] = x1 * k1->scale[e] + shift[e];
        xm1[e] = x1 - k1->mean[e];
        xm2[e] = 0.0f;
        if (Z2) {
            float x2 = bn_tof(z2->v[e]);
            u[e] += x2 * k2->scale[e];
            xm2[e] = x2 - k2->mean[e];
        }
        gg[e] = bn_tof(dy->v[e]);
    }
    if (silu)
#pragma unroll
        for (int e = 0; e < V; e++) {
            float sg = bn_sigmoid_hw(u[e]);
            gg[e] = gg[e] * (sg * (1.0f + u[e] * (1.0f - sg)));
        }
}

/* shift1 + shift2 (bn2 form: u = z1·s1 + z2·s2 + (t1 + t2)). */
template <int V, int Z2>
__device__ __forceinline__ void bn_fast_consts(const bn_args *a, int64_t c0, bn_chan<V> *k1, bn_chan<V> *k2,
                                               float shift[V])
{
    bn_chan_load<V>(&a->p1, c0, k1);
    if (Z2)
        bn_chan_load<V>(&a->p2, c0, k2);
#pragma unroll
    for (int e = 0; e < V; e++) {
        if (!Z2)
            k2->mean[e] = k2->invstd[e] = k2->scale[e] = k2->shift[e] = 0.0f;
        shift[e] = k1->shift[e] + k2->shift[e];
    }
}

/* One row's terms into the float32 run f: Σg, Σg·(z1 - mean1) [, Σg·(z2 - mean2)]. */
template <typename T, int V, int Z2>
__device__ __forceinline__ void bn_bwd_red_add(int silu, const bn_vec<T, V> *z1, const bn_vec<T, V> *z2,
                                               const bn_vec<T, V> *dy, const bn_chan<V> *k1, const bn_chan<V> *k2,
                                               const float shift[V], float f[Z2 ? 3 : 2][V])
{
    float gg[V], xm1[V], xm2[V];
    bn_fast_g<T, V, Z2>(silu, z1, z2, dy, k1, k2, shift, gg, xm1, xm2);
#pragma unroll
    for (int e = 0; e < V; e++) {
        f[0][e] += gg[e];
        f[1][e] += gg[e] * xm1[e];
        if (Z2)
            f[Z2 ? 2 : 1][e] += gg[e] * xm2[e];
    }
}

/* Backward reduction: Σg, Σg·x̂1 [, Σg·x̂2]. Grid (S), block (tx, ty); rows in flight: BN_RED_ROWS (z1, dy), half
 * that in the bn2 form (z1, z2, dy and twice the constants). */
template <typename T, int V, int Z2>
__global__ void __launch_bounds__(BN_THREADS, BN_RED_BLOCKS) bn_bwd_red_fast_kernel(bn_args a, bn_geom g)
{
    constexpr int NS = Z2 ? 3 : 2, R = Z2 ? BN_RED_ROWS / 2 : BN_RED_ROWS;
    __shared__ bn_slots<NS, V> sl;
    int64_t k0, k1, Cv = g.C / V, by = blockDim.y;
    int t = threadIdx.y * blockDim.x + threadIdx.x;
    bn_fast_chunk(&a, &g, &k0, &k1);
    int64_t rows = bn_thread_rows(k0, k1);
    int64_t s1 = by * a.z1.stride[3], s2 = Z2 ? by * a.z2.stride[3] : 0, sg = by * a.gy.stride[3];
    for (int64_t cv0 = 0; cv0 < Cv; cv0 += blockDim.x) {
        int64_t c0 = (cv0 + threadIdx.x) * V;
        bn_slots_zero<NS, V>(&sl, t);
        if (cv0 + threadIdx.x < Cv && rows > 0) {
            bn_chan<V> q1, q2;
            float shift[V], f[NS][V];
            bn_chan_load<V>(&a.p1, c0, &q1);
            if (Z2)
                bn_chan_load<V>(&a.p2, c0, &q2);
#pragma unroll
            for (int e = 0; e < V; e++) {
                shift[e] = Z2 ? q1.shift[e] + q2.shift[e] : q1.shift[e];
#pragma unroll
                for (int j = 0; j < NS; j++)
                    f[j][e] = 0.0f;
            }
            int64_t k = k0 + threadIdx.y;
            const T *p1 = bn_at<T>(&a.z1, k, c0), *pg = bn_at<T>(&a.gy, k, c0);
            const T *p2 = Z2 ? bn_at<T>(&a.z2, k, c0) : p1;
            for (int64_t done = 0; done < rows; done += BN_FOLD) {
                int m = rows - done < BN_FOLD ? (int)(rows - done) : BN_FOLD, i = 0;
                for (; i + R <= m; i += R) {
                    bn_vec<T, V> z1[R], z2[R], dy[R];
#pragma unroll
                    for (int r = 0; r < R; r++) {
                        z1[r] = bn_vraw<T, V>(p1 + r * s1);
                        z2[r] = Z2 ? bn_vraw<T, V>(p2 + r * s2) : z1[r];
                        dy[r] = bn_vraw<T, V>(pg + r * sg);
                    }
#pragma unroll
                    for (int r = 0; r < R; r++)
                        bn_bwd_red_add<T, V, Z2>(a.silu, &z1[r], &z2[r], &dy[r], &q1, &q2, shift, f);
                    p1 += R * s1;
                    p2 += R * s2;
                    pg += R * sg;
                }
                for (; i < m; i++, p1 += s1, p2 += s2, pg += sg) {
                    bn_vec<T, V> z1 = bn_vraw<T, V>(p1), z2 = Z2 ? bn_vraw<T, V>(p2) : z1, dy = bn_vraw<T, V>(pg);
                    bn_bwd_red_add<T, V, Z2>(a.silu, &z1, &z2, &dy, &q1, &q2, shift, f);
                }
                /* Σg·(z - mean) · invstd = Σg·x̂ */
#pragma unroll
                for (int e = 0; e < V; e++) {
                    f[1][e] *= a.p1.invstd[c0 + e];
                    if (Z2)
                        f[NS - 1][e] *= a.p2.invstd[c0 + e];
                }
                bn_slots_fold<NS, V>(&sl, t, f);
            }
        }
        int64_t left = Cv - cv0;
        bn_slots_store<NS, V>(&sl, &a, g.C, cv0, (int)(left < (int64_t)blockDim.x ? left : (int64_t)blockDim.x));
    }
}

/* Elementwise passes (channels-last): block (tx, ty), a grid sized to the machine (bn_elem_grid), grid-stride
 * over groups of ty rows, several groups per iteration with every load issued before the first use; the
 * channel vector cv is fixed per thread (loops over cv only when C/V > 256), so the per-channel constants are
 * computed once per thread, not once per row. */
#define BN_UNROLL 4

/* Forward pass (channels-last), FORM: bit 0 = the bn2 form (z2), bit 1 = a residual (which may be out itself:
 * fill() adds into out; a row's loads come before its store, and each element belongs to one thread).
 * R rows (R·ty apart) per iteration: BN_UNROLL of z1, half that when a second operand (z2 or a residual) is
 * read, 1 when both are, so a thread has up to 4 16-byte loads in flight and stays at <= 64 registers (4
 * blocks of 256 per SM; it was 70-130 with the rows converted to float32 at once): the loads are kept as
 * stored (bn_braw) and converted where used. u = z1·scale1 + shift [+ z2·scale2] exactly as before (and as
 * the backward passes recompute it); y = u·s with s from the hardware exp2 and reciprocal (bn_sigmoid_hw,
 * ~1e-6 relative) instead of expf and the IEEE division: ~8 instructions per element instead of ~20, the
 * pass was instruction-bound at about half the copy bandwidth. The identity activation is bit for bit as
 * before. SILU: the activation, a compile-time constant. */
template <int V, int FORM> struct bn_fwd_q {
    float scale1[V], shift[V], scale2[(FORM & 1) ? V : 1];
};

template <int V, int FORM> __device__ __forceinline__ void bn_fwd_q_load(const bn_args *a, int64_t c0, bn_fwd_q<V, FORM> *q)
{
    const int Z2 = FORM & 1;
    bn_chan<V> k1, k2;
    bn_fast_consts<V, Z2>(a, c0, &k1, &k2, q->shift);
#pragma unroll
    for (int e = 0; e < V; e++) {
        q->scale1[e] = k1.scale[e];
        if (Z2)
            q->scale2[(FORM & 1) ? e : 0] = k2.scale[e];
    }
}

/* The forward keeps its loads as 32-bit words of storage bits and converts each element where it is used:
 * a bn_vec of __nv_bfloat16 was split into 16-bit registers (twice the registers per row in flight, ~300
 * bytes of spills at 64 registers). bn_bget: element e as float32, exactly as bn_tof (bfloat16: its bits in
 * the high half of a float32). Fewer than 4 bytes (V = 1 of a 2-byte type): one 16-bit load. */
template <typename T, int V> struct bn_bvec {
    enum { NW = (V * (int)sizeof(T) + 3) / 4 };
    bn_vec<unsigned int, NW> w;
};

template <typename T, int V> __device__ __forceinline__ bn_bvec<T, V> bn_braw(const T *p)
{
    bn_bvec<T, V> r;
    if (V * sizeof(T) >= 4)
        r.w = *(const bn_vec<unsigned int, bn_bvec<T, V>::NW> *)p;
    else
        r.w.v[0] = *(const unsigned short *)p;
    return r;
}

template <int V> __device__ __forceinline__ float bn_bget(const bn_bvec<float, V> *x, int e)
{
    return __uint_as_float(x->w.v[e]);
}

template <int V> __device__ __forceinline__ float bn_bget(const bn_bvec<__half, V> *x, int e)
{
    unsigned int w = x->w.v[e / 2];
    return __half2float(__ushort_as_half((unsigned short)((e & 1) ? w >> 16 : w & 0xffffu)));
}

template <int V> __device__ __forceinline__ float bn_bget(const bn_bvec<__nv_bfloat16, V> *x, int e)
{
    unsigned int w = x->w.v[e / 2];
    return __uint_as_float((e & 1) ? w & 0xffff0000u : w << 16);
}

/* y of V channels of one row from its stored z1 [, z2] [, residual]. */
template <typename T, int V, int FORM, int SILU>
__device__ __forceinline__ void bn_fwd_vec(const bn_fwd_q<V, FORM> *q, const bn_bvec<T, V> *z1,
                                           const bn_bvec<T, V> *z2, const bn_bvec<T, V> *res, float y[V])
{
    const int Z2 = FORM & 1, RES = FORM & 2;
#pragma unroll
    for (int e = 0; e < V; e++) {
        float v = bn_bget<V>(z1, e) * q->scale1[e] + q->shift[e];
        if (Z2)
            v += bn_bget<V>(z2, e) * q->scale2[Z2 ? e : 0];
        v = SILU ? v * bn_sigmoid_hw(v) : v;
        y[e] = RES ? bn_bget<V>(res, e) + v : v;
    }
}

/* Rows k, k + step, ... below n of channels c0 .. c0+V-1, R per iteration. Each row's load and its y/store
 * are under their own `row < n` test: the branches also keep ptxas from sinking the later rows' loads into
 * the first rows' arithmetic (without them it issues two of four loads up front and the rest mid-way). */
template <typename T, int V, int FORM, int SILU>
__device__ __forceinline__ void bn_fwd_fast_rows(const bn_args *a, int64_t n, int64_t c0)
{
    const int Z2 = FORM & 1, RES = FORM & 2;
    constexpr int R = FORM == 0 ? BN_UNROLL : (FORM == 3 ? 1 : BN_UNROLL / 2);
    bn_fwd_q<V, FORM> q;
    bn_fwd_q_load<V, FORM>(a, c0, &q);
    int64_t step = (int64_t)gridDim.x * blockDim.y, k = (int64_t)blockIdx.x * blockDim.y + threadIdx.y;
    int64_t s1 = step * a->z1.stride[3], s2 = Z2 ? step * a->z2.stride[3] : 0;
    int64_t sr = RES ? step * a->res.stride[3] : 0, so = step * a->out.stride[3];
    const T *p1 = bn_at<T>(&a->z1, k, c0), *p2 = Z2 ? bn_at<T>(&a->z2, k, c0) : p1;
    const T *pr = RES ? bn_at<T>(&a->res, k, c0) : p1;
    T *po = bn_at<T>(&a->out, k, c0);
    for (; k < n; k += R * step, p1 += R * s1, p2 += R * s2, pr += R * sr, po += R * so) {
        bn_bvec<T, V> x1[R], x2[R], xr[R];
#pragma unroll
        for (int r = 0; r < R; r++)
            if (k + r * step < n) {
                x1[r] = bn_braw<T, V>(p1 + r * s1);
                x2[r] = Z2 ? bn_braw<T, V>(p2 + r * s2) : x1[r];
                xr[r] = RES ? bn_braw<T, V>(pr + r * sr) : x1[r];
            }
#pragma unroll
        for (int r = 0; r < R; r++)
            if (k + r * step < n) {
                float y[V];
                bn_fwd_vec<T, V, FORM, SILU>(&q, &x1[r], &x2[r], &xr[r], y);
                bn_vstore_at<T, V>(po + r * so, y, 0);
            }
    }
}

template <typename T, int V, int FORM>
__global__ void __launch_bounds__(BN_THREADS, BN_RED_BLOCKS) bn_fwd_fast_kernel(bn_args a, bn_geom g)
{
    for (int64_t cv = threadIdx.x; cv < g.C / V; cv += blockDim.x) {
        if (a.silu)
            bn_fwd_fast_rows<T, V, FORM, 1>(&a, g.n, cv * V);
        else
            bn_fwd_fast_rows<T, V, FORM, 0>(&a, g.n, cv * V);
    }
}


/* The backward elementwise pass's constants of channels c0 .. c0+V-1: u = z1·scale1 + shift [+ z2·scale2];
 * dz_i = a_i·((g - k0) - (z_i - mean_i)·k_i) with k_i = (Σg·x̂_i/n)·invstd_i (bn_bwd_finish_kernel's coefficients
 * [5][C] k0, k1, k2, a1, a2 with x̂_i's invstd folded in), so no invstd is kept. */
template <int V, int Z2> struct bn_bwd_q {
    float scale1[V], shift[V], mean1[V], k0[V], k1[V], a1[V];
    float scale2[Z2 ? V : 1], mean2[Z2 ? V : 1], k2[Z2 ? V : 1], a2[Z2 ? V : 1];
};

template <int V, int Z2> __device__ __forceinline__ void bn_bwd_q_load(const bn_args *a, int64_t C, int64_t c0,
                                                                       bn_bwd_q<V, Z2> *q)
{
    const float *k = a->coef;
#pragma unroll
    for (int e = 0; e < V; e++) {
        int64_t c = c0 + e;
        float m1 = a->p1.mean[c], i1 = a->p1.invstd[c], s1 = i1 * a->p1.weight[c];
        q->scale1[e] = s1;
        q->mean1[e] = m1;
        q->shift[e] = a->p1.bias[c] - m1 * s1;
        q->k0[e] = k[c];
        q->k1[e] = k[C + c] * i1;
        q->a1[e] = k[3 * C + c];
        if (Z2) {
            float m2 = a->p2.mean[c], i2 = a->p2.invstd[c], s2 = i2 * a->p2.weight[c];
            q->scale2[e] = s2;
            q->mean2[e] = m2;
            q->shift[e] += a->p2.bias[c] - m2 * s2;
            q->k2[e] = k[2 * C + c] * i2;
            q->a2[e] = k[4 * C + c];
        }
    }
}

/* dz1 [, dz2] of row k, channels c0 .. c0+V-1, from its stored z1 [, z2], dy; SILU: the activation (a
 * compile-time constant, so the per-element branch goes). */
template <typename T, int V, int Z2, int SILU>
__device__ __forceinline__ void bn_bwd_row_act(const bn_args *a, const bn_bwd_q<V, Z2> *q, int64_t k, int64_t c0,
                                               const bn_vec<T, V> *z1, const bn_vec<T, V> *z2,
                                               const bn_vec<T, V> *dy)
{
    const int silu = SILU;
    float d1[V], d2[V];
#pragma unroll
    for (int e = 0; e < V; e++) {
        float x1 = bn_tof(z1->v[e]), x2 = 0.0f;
        float u = x1 * q->scale1[e] + q->shift[e];
        if (Z2) {
            x2 = bn_tof(z2->v[e]);
            u += x2 * q->scale2[e];
        }
        float gg = bn_tof(dy->v[e]);
        if (silu) {
            float s = bn_sigmoid_hw(u);
            gg = gg * (s * (1.0f + u * (1.0f - s)));
        }
        float d = gg - q->k0[e];
        d1[e] = q->a1[e] * (d - (x1 - q->mean1[e]) * q->k1[e]);
        d2[e] = Z2 ? q->a2[e] * (d - (x2 - q->mean2[e]) * q->k2[e]) : 0.0f;
    }
    if (a->dz1.data != NULL)
        bn_vstore<T, V>(&a->dz1, k, c0, d1, a->accumulate);
    if (Z2 && a->dz2.data != NULL)
        bn_vstore<T, V>(&a->dz2, k, c0, d2, a->accumulate);
}

template <typename T, int V, int Z2>
__device__ __forceinline__ void bn_bwd_row(const bn_args *a, const bn_bwd_q<V, Z2> *q, int64_t k, int64_t c0,
                                           const bn_vec<T, V> *z1, const bn_vec<T, V> *z2, const bn_vec<T, V> *dy)
{
    if (a->silu)
        bn_bwd_row_act<T, V, Z2, 1>(a, q, k, c0, z1, z2, dy);
    else
        bn_bwd_row_act<T, V, Z2, 0>(a, q, k, c0, z1, z2, dy);
}

/* Backward elementwise pass (channels-last): as bn_fwd_fast_kernel (grid-stride over groups of ty rows, the
 * constants in registers for many rows), BN_UNROLL rows' z1, dy (half that in the bn2 form) loaded before the
 * first use, at most 64 registers per thread (4 blocks per SM). */
template <typename T, int V, int Z2>
__global__ void __launch_bounds__(BN_THREADS, BN_RED_BLOCKS) bn_bwd_fast_kernel(bn_args a, bn_geom g)
{
    constexpr int R = Z2 ? BN_UNROLL / 2 : BN_UNROLL;
    int64_t Cv = g.C / V, step = (int64_t)gridDim.x * blockDim.y;
    for (int64_t cv = threadIdx.x; cv < Cv; cv += blockDim.x) {
        int64_t c0 = cv * V;
        bn_bwd_q<V, Z2> q;
        bn_bwd_q_load<V, Z2>(&a, g.C, c0, &q);
        for (int64_t k = (int64_t)blockIdx.x * blockDim.y + threadIdx.y; k < g.n; k += R * step) {
            bn_vec<T, V> z1[R], z2[R], dy[R];
#pragma unroll
            for (int r = 0; r < R; r++)
                if (k + r * step < g.n) {
                    z1[r] = bn_vraw<T, V>(bn_at<T>(&a.z1, k + r * step, c0));
                    z2[r] = Z2 ? bn_vraw<T, V>(bn_at<T>(&a.z2, k + r * step, c0)) : z1[r];
                    dy[r] = bn_vraw<T, V>(bn_at<T>(&a.gy, k + r * step, c0));
                }
#pragma unroll
            for (int r = 0; r < R; r++)
                if (k + r * step < g.n)
                    bn_bwd_row<T, V, Z2>(&a, &q, k + r * step, c0, &z1[r], &z2[r], &dy[r]);
        }
    }
}

/* ---- planar fast path (NCHW and channel slices of NCHW buffers): after the merge H == 1, every operand has
 * unit W stride, (b, c) planes of W = H·W elements at b·s0 + c·s1, W % V == 0 (V = 1 serves any W),
 * V-aligned pointers and plane strides, all in z1's dtype. Loads and stores are V-wide (16 bytes) along the
 * plane; B, C and W/V below 2^30 (bn_planar_vec), so positions are 32-bit and offsets 64-bit.
 *
 * Every planar kernel walks flat vector indices, never one block per plane or per channel (a 40x40 plane is
 * 3.2 KB of fp16: a block per plane cannot keep enough bytes in flight, and a plane of 200 vectors left most
 * of a 1024-vector tile idle). A flat index is decomposed once per thread; after that a thread's next vector,
 * `step` flat vectors on, is reached by adding the step's precomputed decomposition (bn_pplan) and at most
 * two carries, so no division per vector (the previous reductions did a 64-bit division per step whenever
 * the step left a plane: every step for planes of fewer than 256 vectors).
 *   reductions  one wave of blocks (BN_RED_BLOCKS per SM, <= 64 registers) over the C·B·W/V vectors in
 *               channel-major order, `chunk` contiguous vectors per block: a block adds the part of each
 *               channel that falls into its range (one channel or a few, or part of one) and writes one
 *               partial sum per channel it touched into slot s = block - first block of that channel; the
 *               channel's last block zeroes the slots above its own, so the finish kernels (shared with the
 *               other layouts) add a fixed [NSUM][S][C] layout. Equal ranges: no block waits for a second
 *               wave, whatever C and H·W are. Per thread BN_UNROLL 16-byte loads in flight (raw, converted
 *               where used) and a float32 run of at most BN_UNROLL vectors (32 fp16 elements) per sum,
 *               folded into float64; the block adds its threads' float64 values in a fixed order.
 *   elementwise one wave of blocks, grid-stride over all B·C·W/V vectors in (b, c, i) order: every thread
 *               has work at any plane size; R vectors per iteration loaded before the first use (forward:
 *               BN_UNROLL of z1, half that with z2 or a residual, 1 with both; backward: 2 of z1 and dy, 1
 *               in the bn2 form), stored from 32-bit words packed here (bn_bput); the channel constants
 *               come through the read-only path (__ldg, L1-resident) per vector, so nothing per plane is
 *               kept in registers.
 * Bytes in flight: every planar kernel is __launch_bounds__(BN_THREADS, BN_RED_BLOCKS), <= 64 registers, 4
 * blocks = 1024 threads per SM; per thread 64 B of loads in flight (stats 4 x 16 B; forward 4 x 16 B, or 2
 * x 2 x 16 B; backward elementwise 2 x 2 x 16 B), 128 B in the backward reduction (4 x (z1, dy)): 64-128
 * KB per SM, against ~32 KB that 4.2 TB/s needs at ~1 us of loaded latency on 132 SMs.
 * u = ((z - mean)·invstd)·γ + β [+ ((z2 - mean2)·invstd2)·γ2 + β2], operation for operation as the generic
 * kernels (bn_u) that served these layouts before (not the channels-last z·scale + shift, which rounds
 * differently when |mean| >> std); the sigmoid is bn_sigmoid_hw, as in the channels-last passes. ---- */

/* The planar geometry and the decomposition of one thread's step: step = (sb·C + sc)·Wv + si with
 * sc < C, si < Wv (the reductions: bt = BN_THREADS = sb·Wv + si, sc = 0). */
typedef struct bn_pplan {
    int B, C, Wv;
    int sb, sc, si;
    int64_t chunk;     /* reductions: flat vectors per block */
} bn_pplan;

/* Position of a flat vector: plane (b, c), vector i of the plane. */
typedef struct bn_ppos {
    int b, c, i;
} bn_ppos;

/* q = x / d, r = x % d; 32-bit when it fits (the usual case), 64-bit otherwise. */
__device__ __forceinline__ void bn_divmod(int64_t x, int64_t d, int64_t *q, int64_t *r)
{
    if ((uint64_t)x <= 0xffffffffu && (uint64_t)d <= 0xffffffffu) {
        unsigned qq = (unsigned)x / (unsigned)d;
        *q = qq;
        *r = (int64_t)((unsigned)x - qq * (unsigned)d);
    }
    else {
        *q = x / d;
        *r = x - *q * d;
    }
}

/* (b, c, i) of flat vector j of the whole tensor (j = (b·C + c)·Wv + i). */
__device__ __forceinline__ bn_ppos bn_ppos_of(const bn_pplan *pl, int64_t j)
{
    int64_t p, i, b, c;
    bn_divmod(j, pl->Wv, &p, &i);
    bn_divmod(p, pl->C, &b, &c);
    bn_ppos r = {(int)b, (int)c, (int)i};
    return r;
}

/* The position `step` flat vectors on. */
__device__ __forceinline__ void bn_ppos_step(bn_ppos *p, const bn_pplan *pl)
{
    p->i += pl->si;
    p->c += pl->sc;
    p->b += pl->sb;
    if (p->i >= pl->Wv) {
        p->i -= pl->Wv;
        p->c++;
    }
    if (p->c >= pl->C) {
        p->c -= pl->C;
        p->b++;
    }
}

/* Element offset of vector i of plane (b, c) of a planar operand. */
template <int V> __device__ __forceinline__ int64_t bn_poff(const yv_view4 *v, bn_ppos p)
{
    return (int64_t)p.b * v->stride[0] + (int64_t)p.c * v->stride[1] + (int64_t)p.i * V;
}

/* The storage bits of x (the low 16 bits for 2-byte types), rounded to nearest as bn_fromf. */
__device__ __forceinline__ unsigned bn_bits(float x, const float *) { return __float_as_uint(x); }
__device__ __forceinline__ unsigned bn_bits(float x, const __half *) { return __half_as_ushort(__float2half_rn(x)); }
__device__ __forceinline__ unsigned bn_bits(float x, const __nv_bfloat16 *)
{
    return __bfloat16_as_ushort(__float2bfloat16_rn(x));
}

/* NW 32-bit words stored at global address p (aligned to 4·NW bytes) as one access. Inline PTX: stores of
 * words built here (a struct, or uint4) were split into 32-bit stores by the front end. No memory clobber:
 * the only other accesses of p in these kernels are the loads whose values the words are computed from. */
template <int NW> __device__ __forceinline__ void bn_wstore(void *p, const unsigned int w[NW])
{
    if (NW == 4)
        asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(w[0]), "r"(w[NW > 1 ? 1 : 0]),
                     "r"(w[NW > 2 ? 2 : 0]), "r"(w[NW > 3 ? 3 : 0]));
    else if (NW == 2)
        asm volatile("st.global.v2.b32 [%0], {%1, %2};" ::"l"(p), "r"(w[0]), "r"(w[NW > 1 ? 1 : 0]));
    else
        asm volatile("st.global.b32 [%0], %1;" ::"l"(p), "r"(w[0]));
}

/* x[0..V) stored at p (aligned to V·sizeof(T) bytes) as one access of 32-bit words packed here (a struct of
 * V halves was split into 16-bit stores by the front end), += the stored values when accumulate. */
template <typename T, int V> __device__ __forceinline__ void bn_bput(T *p, const float x[V], int accumulate)
{
    float y[V];
    bn_bvec<T, V> r;
    if (accumulate)
        r = bn_braw<T, V>(p);
#pragma unroll
    for (int e = 0; e < V; e++)
        y[e] = accumulate ? bn_bget<V>(&r, e) + x[e] : x[e];
    if (sizeof(T) == 4) {
#pragma unroll
        for (int e = 0; e < V; e++)
            r.w.v[e < bn_bvec<T, V>::NW ? e : 0] = bn_bits(y[e], p);
    }
    else if (V == 1) {
        *(unsigned short *)p = (unsigned short)bn_bits(y[0], p);
        return;
    }
    else {
#pragma unroll
        for (int w = 0; w < bn_bvec<T, V>::NW; w++)
            r.w.v[w] = bn_bits(y[2 * w], p) | (bn_bits(y[(2 * w + 1) % V], p) << 16);
    }
    bn_wstore<bn_bvec<T, V>::NW>(p, r.w.v);
}

/* One channel's scalar constants, loaded through the read-only path. */
typedef struct bn_c1 {
    float mean, invstd, weight, bias;
} bn_c1;

__device__ __forceinline__ bn_c1 bn_c1_load(const yv_bn_params *p, int c)
{
    bn_c1 k;
    k.mean = __ldg(p->mean + c);
    k.invstd = __ldg(p->invstd + c);
    k.weight = __ldg(p->weight + c);
    k.bias = __ldg(p->bias + c);
    return k;
}

/* x̂ and γ·x̂ + β of one element, as bn_u. */
__device__ __forceinline__ float bn_c1_u(bn_c1 k, float z, float *xh)
{
    float x = (z - k.mean) * k.invstd;
    *xh = x;
    return x * k.weight + k.bias;
}

/* g = dy·act'(u) of one element. */
template <int SILU> __device__ __forceinline__ float bn_c1_g(float u, float dy)
{
    if (!SILU)
        return dy;
    float s = bn_sigmoid_hw(u);
    return dy * (s * (1.0f + u * (1.0f - s)));
}

/* Sum of ns float64 values per thread over the block in a fixed order (lanes by shuffles, then warps);
 * thread 0 gets the result in out[]. Ends with a barrier, so sh can be reused at once. */
__device__ __forceinline__ void bn_block_sum1(double sh[BN_NSUM][BN_THREADS / 32], int ns, const double v[BN_NSUM],
                                              double out[BN_NSUM])
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int j = 0; j < ns; j++) {
        double x = v[j];
        for (int o = 16; o > 0; o >>= 1)
            x += __shfl_down_sync(0xffffffffu, x, o);
        if (lane == 0)
            sh[j][warp] = x;
    }
    __syncthreads();
    for (int j = 0; j < ns; j++) {
        double x = 0.0;
        if (threadIdx.x == 0)
            for (int w = 0; w < BN_THREADS / 32; w++)
                x += sh[j][w];
        out[j] = x;
    }
    __syncthreads();
}

/* Channel c's sums over its flat vectors [j0, j1) (j = b·Wv + i) into d[]: stats (MODE 0) Σ(z - K),
 * Σ(z - K)²; backward (1, 2 = bn2 form) Σg, Σg·x̂1 [, Σg·x̂2]. R vectors per thread in flight. */
template <typename T, int V, int MODE, int SILU>
__device__ __forceinline__ void bn_planar_red_channel(const bn_args *a, const bn_pplan *pl, int c, int64_t j0,
                                                      int64_t j1, double d[BN_NSUM])
{
    const int Z2 = MODE == 2;
    constexpr int R = Z2 ? BN_UNROLL / 2 : BN_UNROLL;
    const T *z1 = (const T *)a->z1.data + (int64_t)c * a->z1.stride[1];
    const T *z2 = Z2 ? (const T *)a->z2.data + (int64_t)c * a->z2.stride[1] : z1;
    const T *gy = MODE ? (const T *)a->gy.data + (int64_t)c * a->gy.stride[1] : z1;
    int64_t s1 = a->z1.stride[0], s2 = Z2 ? a->z2.stride[0] : 0, sg = MODE ? a->gy.stride[0] : 0;
    float K = 0.0f;
    bn_c1 k1 = {0.0f, 0.0f, 0.0f, 0.0f}, k2 = k1;
    if (MODE == 0)
        K = bn_tof(*z1);
    else {
        k1 = bn_c1_load(&a->p1, c);
        if (Z2)
            k2 = bn_c1_load(&a->p2, c);
    }
    int64_t j = j0 + threadIdx.x;
    if (j >= j1)
        return;
    int64_t qb, qi;
    bn_divmod(j, pl->Wv, &qb, &qi);
    int b = (int)qb, i = (int)qi;
    for (; j < j1; j += R * BN_THREADS) {
        bn_bvec<T, V> x1[R], x2[R], dy[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            if (j + r * BN_THREADS < j1) {
                x1[r] = bn_braw<T, V>(z1 + b * s1 + (int64_t)i * V);
                x2[r] = Z2 ? bn_braw<T, V>(z2 + b * s2 + (int64_t)i * V) : x1[r];
                dy[r] = MODE ? bn_braw<T, V>(gy + b * sg + (int64_t)i * V) : x1[r];
            }
            i += pl->si;
            b += pl->sb;
            if (i >= pl->Wv) {
                i -= pl->Wv;
                b++;
            }
        }
        float f[BN_NSUM] = {0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int r = 0; r < R; r++) {
            if (j + r * BN_THREADS >= j1)
                continue;
#pragma unroll
            for (int e = 0; e < V; e++) {
                if (MODE == 0) {
                    float t = bn_bget<V>(&x1[r], e) - K;
                    f[0] += t;
                    f[1] += t * t;
                }
                else {
                    float xh1, xh2 = 0.0f;
                    float u = bn_c1_u(k1, bn_bget<V>(&x1[r], e), &xh1);
                    if (Z2)
                        u = u + bn_c1_u(k2, bn_bget<V>(&x2[r], e), &xh2);
                    float g = bn_c1_g<SILU>(u, bn_bget<V>(&dy[r], e));
                    f[0] += g;
                    f[1] += g * xh1;
                    if (Z2)
                        f[2] += g * xh2;
                }
            }
        }
#pragma unroll
        for (int s = 0; s < BN_NSUM; s++)
            d[s] += f[s];
    }
}

/* Planar reduction (MODE 0 stats, 1 backward, 2 backward bn2; SILU for the backward): block k adds the
 * flat vectors [k·chunk, (k+1)·chunk) of the channel-major C·Bv (Bv = B·Wv), see the section comment. */
template <typename T, int V, int MODE, int SILU>
__global__ void __launch_bounds__(BN_THREADS, BN_RED_BLOCKS) bn_planar_red_kernel(bn_args a, bn_pplan pl)
{
    const int ns = MODE == 2 ? 3 : 2;
    __shared__ double sh[BN_NSUM][BN_THREADS / 32];
    int64_t Bv = (int64_t)pl.B * pl.Wv, J0 = (int64_t)blockIdx.x * pl.chunk;
    int64_t J1 = J0 + pl.chunk < (int64_t)pl.C * Bv ? J0 + pl.chunk : (int64_t)pl.C * Bv;
    int64_t c0, rest;
    bn_divmod(J0, Bv, &c0, &rest);
    for (int64_t c = c0; c < pl.C && c * Bv < J1; c++) {
        int64_t j0 = c * Bv > J0 ? 0 : J0 - c * Bv, j1 = (c + 1) * Bv < J1 ? Bv : J1 - c * Bv;
        double d[BN_NSUM] = {0.0, 0.0, 0.0}, out[BN_NSUM];
        bn_planar_red_channel<T, V, MODE, SILU>(&a, &pl, (int)c, j0, j1, d);
        bn_block_sum1(sh, ns, d, out);
        int64_t s = blockIdx.x - c * Bv / pl.chunk;   /* this block's slot for channel c */
        if (threadIdx.x == 0)
            for (int j = 0; j < ns; j++)
                a.partial[((int64_t)j * a.S + s) * pl.C + c] = out[j];
        if ((c + 1) * Bv <= J1)   /* the channel's last block: zero its unused slots */
            for (int64_t x = s + 1 + threadIdx.x; x < a.S; x += BN_THREADS)
                for (int j = 0; j < ns; j++)
                    a.partial[((int64_t)j * a.S + x) * pl.C + c] = 0.0;
    }
}

/* Planar forward, FORM as in bn_fwd_fast_kernel (bit 0 z2, bit 1 residual, which may be out itself: each
 * element's loads come before its store and belong to one thread); SILU the activation. */
template <typename T, int V, int FORM, int SILU>
__global__ void __launch_bounds__(BN_THREADS, BN_RED_BLOCKS) bn_fwd_planar_vec_kernel(bn_args a, bn_pplan pl)
{
    const int Z2 = FORM & 1, RES = FORM & 2;
    constexpr int R = FORM == 0 ? BN_UNROLL : (FORM == 3 ? 1 : BN_UNROLL / 2);
    bn_ppos p = bn_ppos_of(&pl, (int64_t)blockIdx.x * BN_THREADS + threadIdx.x);
    while (p.b < pl.B) {
        bn_ppos q[R];
        bn_bvec<T, V> x1[R], x2[R], xr[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            q[r] = p;
            if (p.b < pl.B) {
                x1[r] = bn_braw<T, V>((const T *)a.z1.data + bn_poff<V>(&a.z1, p));
                x2[r] = Z2 ? bn_braw<T, V>((const T *)a.z2.data + bn_poff<V>(&a.z2, p)) : x1[r];
                xr[r] = RES ? bn_braw<T, V>((const T *)a.res.data + bn_poff<V>(&a.res, p)) : x1[r];
            }
            bn_ppos_step(&p, &pl);
        }
#pragma unroll
        for (int r = 0; r < R; r++) {
            if (q[r].b >= pl.B)
                continue;
            bn_c1 k1 = bn_c1_load(&a.p1, q[r].c), k2 = k1;
            if (Z2)
                k2 = bn_c1_load(&a.p2, q[r].c);
            float y[V];
#pragma unroll
            for (int e = 0; e < V; e++) {
                float xh;
                float u = bn_c1_u(k1, bn_bget<V>(&x1[r], e), &xh);
                if (Z2)
                    u = u + bn_c1_u(k2, bn_bget<V>(&x2[r], e), &xh);
                u = SILU ? u * bn_sigmoid_hw(u) : u;
                y[e] = RES ? bn_bget<V>(&xr[r], e) + u : u;
            }
            bn_bput<T, V>((T *)a.out.data + bn_poff<V>(&a.out, q[r]), y, 0);
        }
    }
}

/* Planar backward elementwise pass (Z2: the bn2 form): dz_i = a_i·((g - k0) - x̂_i·k_i) with the
 * coefficients [5][C] of bn_bwd_finish_kernel. 16-byte vectors, 2 of z1 and dy in flight (1 of z1, z2, dy in
 * the bn2 form): as many bytes in flight as 4 vectors of 8 bytes, with half the per-vector work (position,
 * offsets, 7 constants) per element; 4 vectors of 16 bytes spilled at 64 registers. */
template <typename T, int V, int Z2, int SILU>
__global__ void __launch_bounds__(BN_THREADS, BN_RED_BLOCKS) bn_bwd_planar_vec_kernel(bn_args a, bn_pplan pl)
{
    constexpr int R = Z2 ? BN_UNROLL / 4 : BN_UNROLL / 2;
    const float *k = a.coef;
    int C = pl.C;
    bn_ppos p = bn_ppos_of(&pl, (int64_t)blockIdx.x * BN_THREADS + threadIdx.x);
    while (p.b < pl.B) {
        bn_ppos q[R];
        bn_bvec<T, V> x1[R], x2[R], dy[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            q[r] = p;
            if (p.b < pl.B) {
                x1[r] = bn_braw<T, V>((const T *)a.z1.data + bn_poff<V>(&a.z1, p));
                x2[r] = Z2 ? bn_braw<T, V>((const T *)a.z2.data + bn_poff<V>(&a.z2, p)) : x1[r];
                dy[r] = bn_braw<T, V>((const T *)a.gy.data + bn_poff<V>(&a.gy, p));
            }
            bn_ppos_step(&p, &pl);
        }
#pragma unroll
        for (int r = 0; r < R; r++) {
            if (q[r].b >= pl.B)
                continue;
            int c = q[r].c;
            bn_c1 k1 = bn_c1_load(&a.p1, c), k2 = k1;
            if (Z2)
                k2 = bn_c1_load(&a.p2, c);
            float q0 = __ldg(k + c), q1 = __ldg(k + C + c), a1 = __ldg(k + 3 * C + c);
            float q2 = Z2 ? __ldg(k + 2 * C + c) : 0.0f, a2 = Z2 ? __ldg(k + 4 * C + c) : 0.0f;
            float d1[V], d2[V];
#pragma unroll
            for (int e = 0; e < V; e++) {
                float xh1, xh2 = 0.0f;
                float u = bn_c1_u(k1, bn_bget<V>(&x1[r], e), &xh1);
                if (Z2)
                    u = u + bn_c1_u(k2, bn_bget<V>(&x2[r], e), &xh2);
                float d = bn_c1_g<SILU>(u, bn_bget<V>(&dy[r], e)) - q0;
                d1[e] = a1 * (d - xh1 * q1);
                d2[e] = a2 * (d - xh2 * q2);
            }
            if (a.dz1.data != NULL)
                bn_bput<T, V>((T *)a.dz1.data + bn_poff<V>(&a.dz1, q[r]), d1, a.accumulate);
            if (Z2 && a.dz2.data != NULL)
                bn_bput<T, V>((T *)a.dz2.data + bn_poff<V>(&a.dz2, q[r]), d2, a.accumulate);
        }
    }
}

/* ---- host side ---- */

static int64_t bn_splits(int64_t n)
{
    int64_t s = yv_ceil_div(n, 2048);
    return s < 1 ? 1 : (s > BN_MAX_SPLITS ? BN_MAX_SPLITS : s);
}

/* Fast reductions: S = n/BN_FAST_ROWS blocks, raised towards BN_FAST_MIN_BLOCKS while blocks keep
 * >= BN_FAST_MIN_ROWS rows, at most BN_FAST_SPLITS. */
static int64_t bn_fast_splits(int64_t n)
{
    int64_t s = yv_ceil_div(n, BN_FAST_ROWS);
    if (s < BN_FAST_MIN_BLOCKS) {
        int64_t most = yv_ceil_div(n, BN_FAST_MIN_ROWS);
        s = most < BN_FAST_MIN_BLOCKS ? most : BN_FAST_MIN_BLOCKS;
    }
    return s < 1 ? 1 : (s > BN_FAST_SPLITS ? BN_FAST_SPLITS : s);
}

/* Fast reductions on the device: one wave of BN_RED_BLOCKS blocks per SM, fewer when bn_fast_splits gives
 * fewer (small n), so S never exceeds what bn_partial_bytes sized the workspace for. */
static int bn_sm_count(void);
static int64_t bn_red_splits(int64_t n)
{
    int64_t s = bn_fast_splits(n), wave = (int64_t)bn_sm_count() * BN_RED_BLOCKS;
    return s < wave ? s : wave;
}

/* Planar reductions: at most BN_FAST_SPLITS blocks (bn_planar_red_plan), so a channel's blocks, and with them
 * its partial slots S, never exceed BN_FAST_SPLITS/C + 2 (S = (Bv - 1)/chunk + 2 with chunk >= C·Bv/blocks). */
static int64_t bn_planar_max_splits(int64_t C)
{
    return BN_FAST_SPLITS / (C > 0 ? C : 1) + 2;
}

static size_t bn_partial_bytes(yv_bn_shape s)
{
    int64_t n = s.B * s.H * s.W, S = bn_splits(n), Sf = bn_fast_splits(n), Sp = bn_planar_max_splits(s.C);
    S = S > Sf ? S : Sf;
    S = S > Sp ? S : Sp;
    return yv_align256((size_t)BN_NSUM * (size_t)S * (size_t)s.C * sizeof(double));
}

extern "C" size_t yv_bn_workspace_size(yv_bn_shape s)
{
    return bn_partial_bytes(s) + yv_align256((size_t)5 * (size_t)s.C * sizeof(float));
}

/* Merge (H, W) into one dimension, then (B, H·W), when every present operand's strides allow it. */
static bn_geom bn_merge(yv_bn_shape s, yv_view4 *ops[], int nops)
{
    bn_geom g = {s.B, s.C, s.H, s.W, s.H * s.W, s.B * s.H * s.W};
    int ok = g.H > 1;
    for (int i = 0; ok && i < nops; i++)
        if (ops[i]->data != NULL && ops[i]->stride[2] != g.W * ops[i]->stride[3])
            ok = 0;
    if (ok) {
        g.W = g.H * g.W;
        g.H = 1;
        for (int i = 0; i < nops; i++)
            ops[i]->stride[2] = 0;
    }
    if (g.W == 1) {   /* a lone H (W == 1) also becomes the inner dimension */
        for (int i = 0; i < nops; i++) {
            ops[i]->stride[3] = ops[i]->stride[2];
            ops[i]->stride[2] = 0;
        }
        g.W = g.H;
        g.H = 1;
    }
    ok = g.B > 1 && g.H == 1;
    for (int i = 0; ok && i < nops; i++)
        if (ops[i]->data != NULL && ops[i]->stride[0] != g.W * ops[i]->stride[3])
            ok = 0;
    if (ok) {
        g.W = g.B * g.W;
        g.B = 1;
        for (int i = 0; i < nops; i++)
            ops[i]->stride[0] = 0;
    }
    g.HW = g.H * g.W;
    return g;
}

static int bn_rows_layout(const yv_view4 *z, int64_t C)
{
    return C > 1 && z->stride[1] == 1;
}

/* The fast path's vector width: the largest V <= max_v (a power of two) with C % V == 0 and every present
 * operand row-uniform (B == H == 1 after the merge, channel stride 1 unless C == 1), in z1's dtype, with a
 * V-aligned pointer and row stride. 0: not row-uniform (generic kernels). */
static int bn_fast_vec(const bn_geom *g, yv_view4 *ops[], int nops, int max_bytes)
{
    if (g->B != 1 || g->H != 1 || g->n < 1)
        return 0;
    yv_dtype dt = ops[0]->dtype;
    size_t es = dt == YV_FLOAT32 ? 4 : 2;
    if (dt != YV_FLOAT32 && dt != YV_FLOAT16 && dt != YV_BFLOAT16)
        return 0;
    for (int i = 0; i < nops; i++) {
        if (ops[i]->data == NULL)
            continue;
        if (ops[i]->dtype != dt || (g->C > 1 && ops[i]->stride[1] != 1) || ops[i]->stride[3] < 0)
            return 0;
    }
    int v = (int)(max_bytes / es);
    for (; v > 1; v >>= 1) {
        int ok = g->C % v == 0;
        for (int i = 0; ok && i < nops; i++)
            if (ops[i]->data != NULL
                && ((uintptr_t)ops[i]->data % (v * es) != 0 || ops[i]->stride[3] % v != 0))
                ok = 0;
        if (ok)
            break;
    }
    return v;
}

/* The planar fast path's vector width: after the merge H == 1 and every present operand has unit inner stride
 * (planes (b, c) of W contiguous elements), z1's dtype, and the largest V <= max_bytes/es with W % V == 0, a
 * V-aligned pointer and V-multiple plane strides (V = 1 for odd planes). 0: not planar. B, C and W/V below
 * 2^30 (32-bit positions in the planar kernels; larger ones take the generic kernels). */
#define BN_PLANAR_MAX_DIM ((int64_t)1 << 30)
static int bn_planar_vec(const bn_geom *g, yv_view4 *ops[], int nops, int max_bytes)
{
    if (g->H != 1 || g->n < 1 || g->B >= BN_PLANAR_MAX_DIM || g->C >= BN_PLANAR_MAX_DIM)
        return 0;
    yv_dtype dt = ops[0]->dtype;
    size_t es = dt == YV_FLOAT32 ? 4 : 2;
    if (dt != YV_FLOAT32 && dt != YV_FLOAT16 && dt != YV_BFLOAT16)
        return 0;
    for (int i = 0; i < nops; i++)
        if (ops[i]->data != NULL && (ops[i]->dtype != dt || ops[i]->stride[3] != 1))
            return 0;
    for (int v = (int)(max_bytes / es); v >= 1; v >>= 1) {
        int ok = g->W % v == 0;
        for (int i = 0; ok && i < nops; i++)
            if (ops[i]->data != NULL && ((uintptr_t)ops[i]->data % (v * es) != 0 || ops[i]->stride[0] % v != 0
                                         || ops[i]->stride[1] % v != 0))
                ok = 0;
        if (ok)
            return g->W / v < BN_PLANAR_MAX_DIM ? v : 0;
    }
    return 0;
}

/* Multiprocessors of the current device (cached per device index). */
static int bn_sm_count(void)
{
    static int cached[64];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0)
        return 132;
    if (dev < 64 && cached[dev] > 0)
        return cached[dev];
    int n = 0;
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n < 1) {
        (void)cudaGetLastError();
        n = 132;
    }
    if (dev < 64)
        cached[dev] = n;
    return n;
}

/* Elementwise grids: whole waves of blocks of BN_THREADS on every SM (grid-stride beyond that), never
 * more than the work. */
#define BN_ELEM_BLOCKS_PER_SM 24   /* a multiple of 2, 3, 4, 6 and 8 resident blocks: whole waves */
static unsigned bn_elem_grid(int64_t needed)
{
    int64_t most = (int64_t)bn_sm_count() * BN_ELEM_BLOCKS_PER_SM;
    return (unsigned)(needed < 1 ? 1 : (needed < most ? needed : most));
}

/* The planar kernels' geometry with `step` (flat vectors between a thread's consecutive vectors) decomposed. */
static bn_pplan bn_planar_plan(const bn_geom *g, int v, int64_t step)
{
    bn_pplan pl;
    pl.B = (int)g->B;
    pl.C = (int)g->C;
    pl.Wv = (int)(g->W / v);
    int64_t planes = step / pl.Wv;
    pl.si = (int)(step % pl.Wv);
    pl.sc = (int)(planes % pl.C);
    pl.sb = (int)(planes / pl.C);
    pl.chunk = 0;
    return pl;
}

/* Planar elementwise passes: one wave of BN_RED_BLOCKS blocks per SM (fewer for small tensors), grid-stride
 * over the B·C·W/V vectors; *grid: the block count. */
static bn_pplan bn_planar_elem_plan(const bn_geom *g, int v, unsigned *grid)
{
    int64_t total = g->B * g->C * (g->W / v), wave = (int64_t)bn_sm_count() * BN_RED_BLOCKS;
    int64_t blocks = yv_ceil_div(total, (int64_t)BN_THREADS * BN_UNROLL);
    blocks = blocks < wave ? blocks : wave;
    *grid = (unsigned)(blocks < 1 ? 1 : blocks);
    return bn_planar_plan(g, v, (int64_t)*grid * BN_THREADS);
}

/* Planar reductions: at most one wave of BN_RED_BLOCKS blocks per SM (and BN_FAST_SPLITS), equal ranges of
 * `chunk` >= BN_PLANAR_MIN_VECS flat vectors; the step is a block's BN_THREADS vectors within one channel
 * (sc unused). *S: partial slots per channel, *grid: the block count. */
#define BN_PLANAR_MIN_VECS 1024   /* 4 vectors per thread */
static bn_pplan bn_planar_red_plan(const bn_geom *g, int v, int64_t *S, unsigned *grid)
{
    bn_pplan pl = bn_planar_plan(g, v, 0);
    pl.sb = BN_THREADS / pl.Wv;
    pl.si = BN_THREADS % pl.Wv;
    int64_t Bv = g->B * (int64_t)pl.Wv, total = g->C * Bv, wave = (int64_t)bn_sm_count() * BN_RED_BLOCKS;
    wave = wave < BN_FAST_SPLITS ? wave : BN_FAST_SPLITS;
    int64_t chunk = yv_ceil_div(total, wave);
    pl.chunk = chunk > BN_PLANAR_MIN_VECS ? chunk : BN_PLANAR_MIN_VECS;
    *grid = (unsigned)yv_ceil_div(total, pl.chunk);
    *S = (Bv - 1) / pl.chunk + 2;
    return pl;
}

/* Launch KERNEL<T, V, X, SILU>(a, pl) for z1's dtype and the planar vector width v, blocks of BN_THREADS. */
#define BN_PV_CASES(KERNEL, X, SILU, T, vec, grid, a, pl, stream)                                             \
    switch (vec) {                                                                                              \
    case 8: KERNEL<T, (sizeof(T) == 2 ? 8 : 4), X, SILU><<<grid, BN_THREADS, 0, stream>>>(a, pl); \
            break;                                                                                              \
    case 4: KERNEL<T, 4, X, SILU><<<grid, BN_THREADS, 0, stream>>>(a, pl); break;              \
    case 2: KERNEL<T, 2, X, SILU><<<grid, BN_THREADS, 0, stream>>>(a, pl); break;              \
    default: KERNEL<T, 1, X, SILU><<<grid, BN_THREADS, 0, stream>>>(a, pl); break;             \
    }
#define BN_PV_DTYPES(CASES, KERNEL, X, SILU, dtype, v, grid, a, pl, stream)                                     \
    do {                                                                                                        \
        if ((dtype) == YV_FLOAT16) {                                                                            \
            CASES(KERNEL, X, SILU, __half, v, grid, a, pl, stream)                                              \
        }                                                                                                       \
        else if ((dtype) == YV_BFLOAT16) {                                                                      \
            CASES(KERNEL, X, SILU, __nv_bfloat16, v, grid, a, pl, stream)                                       \
        }                                                                                                       \
        else {                                                                                                  \
            CASES(KERNEL, X, SILU, float, v, grid, a, pl, stream)                                               \
        }                                                                                                       \
    } while (0)
#define BN_PV_LAUNCH(KERNEL, X, SILU, dtype, v, grid, a, pl, stream)                                            \
    BN_PV_DTYPES(BN_PV_CASES, KERNEL, X, SILU, dtype, v, grid, a, pl, stream)

/* The planar reduction: stats (mode 0) or backward (1, 2 = bn2 form). */
static void bn_planar_red_launch(bn_args *a, const bn_geom *g, int v, int mode, cudaStream_t stream)
{
    unsigned grid;
    bn_pplan pl = bn_planar_red_plan(g, v, &a->S, &grid);
    yv_dtype dt = a->z1.dtype;
    int x = mode * 2 + (mode > 0 && a->silu);
    switch (x) {
    case 0: BN_PV_LAUNCH(bn_planar_red_kernel, 0, 0, dt, v, grid, *a, pl, stream); break;
    case 2: BN_PV_LAUNCH(bn_planar_red_kernel, 1, 0, dt, v, grid, *a, pl, stream); break;
    case 3: BN_PV_LAUNCH(bn_planar_red_kernel, 1, 1, dt, v, grid, *a, pl, stream); break;
    case 4: BN_PV_LAUNCH(bn_planar_red_kernel, 2, 0, dt, v, grid, *a, pl, stream); break;
    default: BN_PV_LAUNCH(bn_planar_red_kernel, 2, 1, dt, v, grid, *a, pl, stream); break;
    }
}

/* The planar forward (form: bit 0 z2, bit 1 residual). */
static void bn_planar_fwd_launch(const bn_args *a, const bn_geom *g, int v, int form, cudaStream_t stream)
{
    unsigned grid;
    bn_pplan pl = bn_planar_elem_plan(g, v, &grid);
    yv_dtype dt = a->z1.dtype;
    switch (form * 2 + (a->silu != 0)) {
    case 0: BN_PV_LAUNCH(bn_fwd_planar_vec_kernel, 0, 0, dt, v, grid, *a, pl, stream); break;
    case 1: BN_PV_LAUNCH(bn_fwd_planar_vec_kernel, 0, 1, dt, v, grid, *a, pl, stream); break;
    case 2: BN_PV_LAUNCH(bn_fwd_planar_vec_kernel, 1, 0, dt, v, grid, *a, pl, stream); break;
    case 3: BN_PV_LAUNCH(bn_fwd_planar_vec_kernel, 1, 1, dt, v, grid, *a, pl, stream); break;
    case 4: BN_PV_LAUNCH(bn_fwd_planar_vec_kernel, 2, 0, dt, v, grid, *a, pl, stream); break;
    case 5: BN_PV_LAUNCH(bn_fwd_planar_vec_kernel, 2, 1, dt, v, grid, *a, pl, stream); break;
    case 6: BN_PV_LAUNCH(bn_fwd_planar_vec_kernel, 3, 0, dt, v, grid, *a, pl, stream); break;
    default: BN_PV_LAUNCH(bn_fwd_planar_vec_kernel, 3, 1, dt, v, grid, *a, pl, stream); break;
    }
}

/* The planar backward elementwise pass (two: the bn2 form). */
static void bn_planar_bwd_launch(const bn_args *a, const bn_geom *g, int v, int two, cudaStream_t stream)
{
    unsigned grid;
    bn_pplan pl = bn_planar_elem_plan(g, v, &grid);
    yv_dtype dt = a->z1.dtype;
    switch (two * 2 + (a->silu != 0)) {
    case 0: BN_PV_LAUNCH(bn_bwd_planar_vec_kernel, 0, 0, dt, v, grid, *a, pl, stream); break;
    case 1: BN_PV_LAUNCH(bn_bwd_planar_vec_kernel, 0, 1, dt, v, grid, *a, pl, stream); break;
    case 2: BN_PV_LAUNCH(bn_bwd_planar_vec_kernel, 1, 0, dt, v, grid, *a, pl, stream); break;
    default: BN_PV_LAUNCH(bn_bwd_planar_vec_kernel, 1, 1, dt, v, grid, *a, pl, stream); break;
    }
}

/* Block (tx, ty) of the fast kernels for vector width v. */
static dim3 bn_fast_block(const bn_geom *g, int v)
{
    int64_t cv = g->C / v;
    unsigned tx = (unsigned)(cv < BN_THREADS ? cv : BN_THREADS);
    return dim3(tx, BN_THREADS / tx);
}

/* Launch KERNEL<T, V, Z2> for z1's dtype and the vector width v (16-byte vectors at most); Z2: the bn2 form
 * (backward kernels; the others ignore it). */
#define BN_FAST_CASES(KERNEL, Z2, T, vec, grid, block, a, g, stream)                                                  \
    switch (vec) {                                                                                              \
    case 8: KERNEL<T, (sizeof(T) == 2 ? 8 : 4), Z2><<<grid, block, 0, stream>>>(a, g); break;    \
    case 4: KERNEL<T, 4, Z2><<<grid, block, 0, stream>>>(a, g); break;                            \
    case 2: KERNEL<T, 2, Z2><<<grid, block, 0, stream>>>(a, g); break;                            \
    default: KERNEL<T, 1, Z2><<<grid, block, 0, stream>>>(a, g); break;                           \
    }
#define BN_FAST_LAUNCH(KERNEL, Z2, dtype, v, grid, block, a, g, stream)                                            \
    do {                                                                                                        \
        if ((dtype) == YV_FLOAT16) {                                                                            \
            BN_FAST_CASES(KERNEL, Z2, __half, v, grid, block, a, g, stream)                                            \
        }                                                                                                       \
        else if ((dtype) == YV_BFLOAT16) {                                                                      \
            BN_FAST_CASES(KERNEL, Z2, __nv_bfloat16, v, grid, block, a, g, stream)                                     \
        }                                                                                                       \
        else {                                                                                                  \
            BN_FAST_CASES(KERNEL, Z2, float, v, grid, block, a, g, stream)                                             \
        }                                                                                                       \
    } while (0)

/* BN_FAST_LAUNCH with the forward's FORM (0..3: bit 0 z2, bit 1 residual) as the third template argument. */
#define BN_FORM_LAUNCH(KERNEL, form, dtype, v, grid, block, a, g, stream)                                           \
    do {                                                                                                        \
        switch (form) {                                                                                         \
        case 0: BN_FAST_LAUNCH(KERNEL, 0, dtype, v, grid, block, a, g, stream); break;                          \
        case 1: BN_FAST_LAUNCH(KERNEL, 1, dtype, v, grid, block, a, g, stream); break;                          \
        case 2: BN_FAST_LAUNCH(KERNEL, 2, dtype, v, grid, block, a, g, stream); break;                          \
        default: BN_FAST_LAUNCH(KERNEL, 3, dtype, v, grid, block, a, g, stream); break;                         \
        }                                                                                                       \
    } while (0)

static unsigned bn_grid(int64_t blocks)
{
    return (unsigned)(blocks < 1 ? 1 : (blocks > BN_MAX_GRID ? BN_MAX_GRID : blocks));
}

static void bn_launch_reduce(bn_args *a, const bn_geom *g, int rows, cudaStream_t stream)
{
    if (rows) {
        dim3 grid((unsigned)yv_ceil_div(g->C, 32), (unsigned)a->S);
        bn_reduce_rows_kernel<<<grid, dim3(32, BN_ROWS_Y), 0, stream>>>(*a, *g);
    }
    else {
        dim3 grid((unsigned)g->C, (unsigned)a->S);
        bn_reduce_planar_kernel<<<grid, BN_THREADS, 0, stream>>>(*a, *g);
    }
}

static int64_t bn_tile(const bn_geom *g)
{
    int64_t per = yv_ceil_div(g->HW, BN_THREADS);
    return BN_THREADS * (per < 8 ? per : 8);
}

/* The finish kernels' launch, shared by every reduction family: BN_FIN_C channels per block (C <= INT32_MAX,
 * checked by the callers, so the grid fits), BN_FIN_L lanes over S. */
static unsigned bn_finish_grid(int64_t C)
{
    return (unsigned)yv_ceil_div(C, BN_FIN_C);
}

static dim3 bn_finish_block(void)
{
    return dim3(BN_FIN_C, BN_FIN_L);
}

extern "C" cudaError_t yv_bn_stats_forward(yv_bn_shape s, yv_view4 z, float *running_mean, float *running_var,
                                           double momentum, double eps, float *mean, float *invstd, void *workspace,
                                           cudaStream_t stream)
{
    bn_args a;
    memset(&a, 0, sizeof(a));
    a.z1 = z;
    a.stats = 1;
    yv_view4 *ops[] = {&a.z1};
    int rows = bn_rows_layout(&a.z1, s.C);
    bn_geom g = bn_merge(s, ops, 1);
    a.partial = (double *)workspace;
    if (g.C > INT32_MAX)
        return cudaErrorInvalidValue;
    int v = bn_fast_vec(&g, ops, 1, BN_VEC_BYTES), vp = v > 0 ? 0 : bn_planar_vec(&g, ops, 1, BN_VEC_BYTES);
    if (v > 0) {
        a.S = bn_red_splits(g.n);
        BN_FAST_LAUNCH(bn_stats_fast_kernel, 0, a.z1.dtype, v, (unsigned)a.S, bn_fast_block(&g, v), a, g, stream);
    }
    else if (vp > 0) {
        bn_planar_red_launch(&a, &g, vp, 0, stream);
    }
    else {
        a.S = bn_splits(g.n);
        bn_launch_reduce(&a, &g, rows, stream);
    }
    bn_stats_finish_kernel<<<bn_finish_grid(g.C), bn_finish_block(), 0, stream>>>(a, g, running_mean, running_var,
                                                                              momentum, eps, mean, invstd);
    return cudaGetLastError();
}

extern "C" cudaError_t yv_bn_silu_forward(yv_bn_shape s, yv_view4 z1, yv_bn_params p1, yv_view4 z2, yv_bn_params p2,
                                          yv_view4 residual, int silu, yv_view4 out, cudaStream_t stream)
{
    bn_args a;
    memset(&a, 0, sizeof(a));
    a.z1 = z1;
    a.z2 = z2;
    a.res = residual;
    a.out = out;
    a.p1 = p1;
    a.p2 = p2;
    a.silu = silu;
    yv_view4 *ops[] = {&a.z1, &a.z2, &a.res, &a.out};
    int rows = bn_rows_layout(&a.z1, s.C);
    bn_geom g = bn_merge(s, ops, 4);
    int v = bn_fast_vec(&g, ops, 4, BN_VEC_BYTES), vp = v > 0 ? 0 : bn_planar_vec(&g, ops, 4, BN_VEC_BYTES);
    int form = (a.z2.data != NULL ? 1 : 0) | (a.res.data != NULL ? 2 : 0);
    if (v > 0) {
        dim3 block = bn_fast_block(&g, v);   /* rows per thread and iteration as in bn_fwd_fast_rows */
        unsigned grid = bn_elem_grid(yv_ceil_div(g.n, (int64_t)block.y * (form ? BN_UNROLL / 2 : BN_UNROLL)));
        BN_FORM_LAUNCH(bn_fwd_fast_kernel, form, a.z1.dtype, v, grid, block, a, g, stream);
    }
    else if (vp > 0) {
        bn_planar_fwd_launch(&a, &g, vp, form, stream);
    }
    else if (rows) {
        bn_fwd_rows_kernel<<<bn_grid(yv_ceil_div(g.n, BN_THREADS / 32)), BN_THREADS, 0, stream>>>(a, g);
    }
    else {
        int64_t tile = bn_tile(&g);
        bn_fwd_planar_kernel<<<bn_grid(g.B * g.C * yv_ceil_div(g.HW, tile)), BN_THREADS, 0, stream>>>(a, g, tile);
    }
    return cudaGetLastError();
}

extern "C" cudaError_t yv_bn_silu_backward(yv_bn_shape s, yv_view4 z1, yv_bn_params p1, yv_view4 z2,
                                           yv_bn_params p2, yv_view4 grad_out, int silu, int batch_stats,
                                           yv_view4 dz1, yv_view4 dz2, int accumulate, float *dweight1,
                                           float *dbias1, float *dweight2, float *dbias2, void *workspace,
                                           cudaStream_t stream)
{
    bn_args a;
    memset(&a, 0, sizeof(a));
    a.z1 = z1;
    a.z2 = z2;
    a.gy = grad_out;
    a.dz1 = dz1;
    a.dz2 = z2.data != NULL ? dz2 : yv_view4{};
    a.p1 = p1;
    a.p2 = p2;
    a.silu = silu;
    a.accumulate = accumulate;
    yv_view4 *ops[] = {&a.z1, &a.z2, &a.gy, &a.dz1, &a.dz2};
    int rows = bn_rows_layout(&a.z1, s.C);
    bn_geom g = bn_merge(s, ops, 5);
    if (g.C > INT32_MAX)
        return cudaErrorInvalidValue;
    a.partial = (double *)workspace;
    float *coef = (float *)((char *)workspace + bn_partial_bytes(s));
    a.coef = coef;
    /* the reduction reads z1, z2, dy; the elementwise pass also writes dz1, dz2 (their own eligibility) */
    int vr = bn_fast_vec(&g, ops, 3, BN_BWD_VEC_BYTES), v = bn_fast_vec(&g, ops, 5, BN_BWD_VEC_BYTES);
    int pr = vr > 0 ? 0 : bn_planar_vec(&g, ops, 3, BN_VEC_BYTES);
    int pv = v > 0 ? 0 : bn_planar_vec(&g, ops, 5, BN_VEC_BYTES);
    int two = a.z2.data != NULL;
    if (vr > 0) {
        a.S = bn_red_splits(g.n);
        if (a.z2.data != NULL)
            BN_FAST_LAUNCH(bn_bwd_red_fast_kernel, 1, a.z1.dtype, vr, (unsigned)a.S, bn_fast_block(&g, vr), a, g, stream);
        else
            BN_FAST_LAUNCH(bn_bwd_red_fast_kernel, 0, a.z1.dtype, vr, (unsigned)a.S, bn_fast_block(&g, vr), a, g, stream);
    }
    else if (pr > 0) {
        bn_planar_red_launch(&a, &g, pr, two ? 2 : 1, stream);
    }
    else {
        a.S = bn_splits(g.n);
        bn_launch_reduce(&a, &g, rows, stream);
    }
    bn_bwd_finish_kernel<<<bn_finish_grid(g.C), bn_finish_block(), 0, stream>>>(a, g, batch_stats, coef, dweight1,
                                                                            dbias1, dweight2, dbias2);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess || (a.dz1.data == NULL && a.dz2.data == NULL))
        return e;
    if (v > 0) {
        dim3 block = bn_fast_block(&g, v);
        unsigned grid = bn_elem_grid(yv_ceil_div(g.n, (int64_t)block.y * BN_UNROLL));
        if (two)
            BN_FAST_LAUNCH(bn_bwd_fast_kernel, 1, a.z1.dtype, v, grid, block, a, g, stream);
        else
            BN_FAST_LAUNCH(bn_bwd_fast_kernel, 0, a.z1.dtype, v, grid, block, a, g, stream);
    }
    else if (pv > 0) {
        bn_planar_bwd_launch(&a, &g, pv, two, stream);
    }
    else if (rows) {
        bn_bwd_rows_kernel<<<bn_grid(yv_ceil_div(g.n, BN_THREADS / 32)), BN_THREADS, 0, stream>>>(a, g);
    }
    else {
        int64_t tile = bn_tile(&g);
        bn_bwd_planar_kernel<<<bn_grid(g.B * g.C * yv_ceil_div(g.HW, tile)), BN_THREADS, 0, stream>>>(a, g, tile);
    }
    return cudaGetLastError();
}
