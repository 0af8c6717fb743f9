/* bn_silu.cuh — what the three files of the fused training-mode BatchNorm + SiLU kernels share: the maths
 * and pass structure below, the operand structs (bn_args, bn_geom), loads/stores and vector types, the
 * reduction slots and the finish kernels' fixed-order sum, the planar position stepping, and on the host
 * the layout merge, the vector-width and grid choices and the launch macros. The kernels: bn_silu_stats.cu
 * (batch statistics; the per-channel reduction kernels of both directions), bn_silu_fwd.cu (normalise and
 * activate), bn_silu_bwd.cu (the BN backward). C-style CUDA: structs, macros, templates only for the
 * storage type and vector width.
 *
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
 * Test: python -m pytest -q tests/ops/test_bn_silu.py (CUDA cases); speed: python benchmarks/bench_bn_silu.py
 */
#ifndef YV_BN_SILU_CUH
#define YV_BN_SILU_CUH

#include <stdint.h>
#include <string.h>

#include "common.cuh"
#include "yv_kernels.h"

#define BN_THREADS 256
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

/* ---- fast path: row-uniform operands, storage type T and vector width V fixed at compile time ---- */

#define BN_FAST_SPLITS 1024    /* fast reductions: at most this many blocks (S) */
#define BN_FAST_MIN_BLOCKS 528 /* ~4 blocks per SM on a 132-SM H200 */
#define BN_FAST_ROWS 256       /* rows per block when the grid is large enough anyway */
#define BN_FAST_MIN_ROWS 64    /* never fewer rows per block than this (unless n is smaller) */
#define BN_VEC_BYTES 16        /* stats and forward: 16-byte loads */
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

/* Elementwise passes (channels-last): block (tx, ty), a grid sized to the machine (bn_elem_grid), grid-stride
 * over groups of ty rows, several groups per iteration with every load issued before the first use; the
 * channel vector cv is fixed per thread (loops over cv only when C/V > 256), so the per-channel constants are
 * computed once per thread, not once per row. */
#define BN_UNROLL 4

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

/* ---- host side ---- */

static inline int64_t bn_splits(int64_t n)
{
    int64_t s = yv_ceil_div(n, 2048);
    return s < 1 ? 1 : (s > BN_MAX_SPLITS ? BN_MAX_SPLITS : s);
}

/* Fast reductions: S = n/BN_FAST_ROWS blocks, raised towards BN_FAST_MIN_BLOCKS while blocks keep
 * >= BN_FAST_MIN_ROWS rows, at most BN_FAST_SPLITS. */
static inline int64_t bn_fast_splits(int64_t n)
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
static inline int bn_sm_count(void);
static inline int64_t bn_red_splits(int64_t n)
{
    int64_t s = bn_fast_splits(n), wave = (int64_t)bn_sm_count() * BN_RED_BLOCKS;
    return s < wave ? s : wave;
}

/* Planar reductions: at most BN_FAST_SPLITS blocks (bn_planar_red_plan), so a channel's blocks, and with them
 * its partial slots S, never exceed BN_FAST_SPLITS/C + 2 (S = (Bv - 1)/chunk + 2 with chunk >= C·Bv/blocks). */
static inline int64_t bn_planar_max_splits(int64_t C)
{
    return BN_FAST_SPLITS / (C > 0 ? C : 1) + 2;
}

static inline size_t bn_partial_bytes(yv_bn_shape s)
{
    int64_t n = s.B * s.H * s.W, S = bn_splits(n), Sf = bn_fast_splits(n), Sp = bn_planar_max_splits(s.C);
    S = S > Sf ? S : Sf;
    S = S > Sp ? S : Sp;
    return yv_align256((size_t)BN_NSUM * (size_t)S * (size_t)s.C * sizeof(double));
}

/* Merge (H, W) into one dimension, then (B, H·W), when every present operand's strides allow it. */
static inline bn_geom bn_merge(yv_bn_shape s, yv_view4 *ops[], int nops)
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

static inline int bn_rows_layout(const yv_view4 *z, int64_t C)
{
    return C > 1 && z->stride[1] == 1;
}

/* The fast path's vector width: the largest V <= max_v (a power of two) with C % V == 0 and every present
 * operand row-uniform (B == H == 1 after the merge, channel stride 1 unless C == 1), in z1's dtype, with a
 * V-aligned pointer and row stride. 0: not row-uniform (generic kernels). */
static inline int bn_fast_vec(const bn_geom *g, yv_view4 *ops[], int nops, int max_bytes)
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
static inline int bn_planar_vec(const bn_geom *g, yv_view4 *ops[], int nops, int max_bytes)
{
#ifdef YOLOV9C_NO_PLANAR_VEC /* the A/B build of dev/gpu_run.sh bnab: NCHW BatchNorm through the generic kernels */
    return 0;
#endif
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
static inline int bn_sm_count(void)
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
static inline unsigned bn_elem_grid(int64_t needed)
{
    int64_t most = (int64_t)bn_sm_count() * BN_ELEM_BLOCKS_PER_SM;
    return (unsigned)(needed < 1 ? 1 : (needed < most ? needed : most));
}

/* The planar kernels' geometry with `step` (flat vectors between a thread's consecutive vectors) decomposed. */
static inline bn_pplan bn_planar_plan(const bn_geom *g, int v, int64_t step)
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
static inline bn_pplan bn_planar_elem_plan(const bn_geom *g, int v, unsigned *grid)
{
    int64_t total = g->B * g->C * (g->W / v), wave = (int64_t)bn_sm_count() * BN_RED_BLOCKS;
    int64_t blocks = yv_ceil_div(total, (int64_t)BN_THREADS * BN_UNROLL);
    blocks = blocks < wave ? blocks : wave;
    *grid = (unsigned)(blocks < 1 ? 1 : blocks);
    return bn_planar_plan(g, v, (int64_t)*grid * BN_THREADS);
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

/* Block (tx, ty) of the fast kernels for vector width v. */
static inline dim3 bn_fast_block(const bn_geom *g, int v)
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

static inline unsigned bn_grid(int64_t blocks)
{
    return (unsigned)(blocks < 1 ? 1 : (blocks > BN_MAX_GRID ? BN_MAX_GRID : blocks));
}

static inline int64_t bn_tile(const bn_geom *g)
{
    int64_t per = yv_ceil_div(g->HW, BN_THREADS);
    return BN_THREADS * (per < 8 ? per : 8);
}

/* The finish kernels' launch, shared by every reduction family: BN_FIN_C channels per block (C <= INT32_MAX,
 * checked by the callers, so the grid fits), BN_FIN_L lanes over S. */
static inline unsigned bn_finish_grid(int64_t C)
{
    return (unsigned)yv_ceil_div(C, BN_FIN_C);
}

static inline dim3 bn_finish_block(void)
{
    return dim3(BN_FIN_C, BN_FIN_L);
}

/* Reductions defined in bn_silu_stats.cu and also launched by bn_silu_bwd.cu: the generic (rows / planar)
 * reduction into a->partial (a->S set by the caller), and the planar-vector one (mode 0 statistics, 1
 * backward, 2 the bn2 backward; it sets a->S). */
void bn_planar_red_launch(bn_args *a, const bn_geom *g, int v, int mode, cudaStream_t stream);
void bn_launch_reduce(bn_args *a, const bn_geom *g, int rows, cudaStream_t stream);

#endif /* YV_BN_SILU_CUH */
