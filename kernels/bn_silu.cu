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
 * Per-element arithmetic is float32. Sums: each thread adds up to 32 elements in float32, then folds them
 * into float64 accumulators; blocks write float64 partial sums; a per-channel pass adds those in float64.
 *
 * Saved for backward (by the caller, yolov9c/ops/bn_silu.py): z in its storage dtype (2 B/element in fp16)
 * plus mean, invstd (C,) float32: no normalised or activated tensor. y and dz are recomputed from z.
 * Outputs: out is written (=); dz is written (=) or accumulated (+=, `accumulate`); dγ, dβ, mean, invstd
 * are written; running statistics are updated in place.
 *
 * Passes (all on the caller's stream, no host synchronisation):
 *   stats     bn_reduce_*   float64 partial sums [3][S][C] into the workspace
 *             bn_stats_finish_kernel   one thread per channel: mean, invstd, running update
 *   forward   bn_fwd_*      one elementwise pass
 *   backward  bn_reduce_*   partial Σg, Σg·x̂1, Σg·x̂2;  bn_bwd_finish_kernel: dγ, dβ and the dz coefficients
 *             bn_bwd_*      one elementwise pass writing dz1 (and dz2)
 * Layouts: the iteration follows z1. Channel stride 1 (channels-last, also a channel slice of a
 * channels-last buffer): "rows" kernels, a warp per (b, h, w) row with lanes over channels. Otherwise
 * "planar" kernels over (b, c) planes. Before launching, (H, W) and then (B, H·W) are merged when every
 * operand's strides allow it, so the dense layouts need no division per element; other strides work through
 * a general (slower) index decomposition. All offsets are 64-bit: tensors over 2^31 elements are fine.
 * Test: python -m pytest -q tests/test_bn_silu.py (CUDA cases)
 */
#include <stdint.h>
#include <string.h>

#include "common.cuh"
#include "yv_kernels.h"

#define BN_THREADS 256
#define BN_ROWS_Y 8            /* rows kernels: blocks of 32 channels x 8 rows (reduction) or 8 warps */
#define BN_MAX_SPLITS 512      /* partial sums per channel (S) */
#define BN_FOLD 32             /* float32 elements per thread before folding into float64 */
#define BN_MAX_GRID (1 << 20)
#define BN_NSUM 3

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

__device__ __forceinline__ double bn_partial_sum(const bn_args *a, int j, int64_t c, int64_t C)
{
    double x = 0.0;
    for (int64_t s = 0; s < a->S; s++)
        x += a->partial[((int64_t)j * a->S + s) * C + c];
    return x;
}

__global__ void bn_stats_finish_kernel(bn_args a, bn_geom g, float *running_mean, float *running_var, double momentum,
                                       double eps, float *mean, float *invstd)
{
    int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= g.C)
        return;
    double n = (double)g.n;
    double K = bn_load(&a.z1, bn_off(&a.z1, 0, c, 0, 0));
    double m1 = bn_partial_sum(&a, 0, c, g.C) / n;
    double var = bn_partial_sum(&a, 1, c, g.C) / n - m1 * m1;
    var = var > 0.0 ? var : 0.0;
    double m = K + m1;
    mean[c] = (float)m;
    invstd[c] = (float)(1.0 / sqrt(var + eps));
    if (running_mean != NULL)
        running_mean[c] = (float)((1.0 - momentum) * running_mean[c] + momentum * m);
    if (running_var != NULL)
        running_var[c] = (float)((1.0 - momentum) * running_var[c] + momentum * var * n / (n - 1.0));
}

__global__ void bn_bwd_finish_kernel(bn_args a, bn_geom g, int batch_stats, float *coef, float *dweight1,
                                     float *dbias1, float *dweight2, float *dbias2)
{
    int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= g.C)
        return;
    int64_t C = g.C;
    double n = (double)g.n;
    double sg = bn_partial_sum(&a, 0, c, C), sgx1 = bn_partial_sum(&a, 1, c, C);
    dbias1[c] = (float)sg;
    dweight1[c] = (float)sgx1;
    double sgx2 = 0.0;
    if (a.z2.data != NULL) {
        sgx2 = bn_partial_sum(&a, 2, c, C);
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

/* ---- host side ---- */

static int64_t bn_splits(int64_t n)
{
    int64_t s = yv_ceil_div(n, 2048);
    return s < 1 ? 1 : (s > BN_MAX_SPLITS ? BN_MAX_SPLITS : s);
}

static size_t bn_partial_bytes(yv_bn_shape s)
{
    return yv_align256((size_t)BN_NSUM * (size_t)bn_splits(s.B * s.H * s.W) * (size_t)s.C * sizeof(double));
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
    a.S = bn_splits(g.n);
    a.partial = (double *)workspace;
    if (g.C > INT32_MAX)
        return cudaErrorInvalidValue;
    bn_launch_reduce(&a, &g, rows, stream);
    bn_stats_finish_kernel<<<(unsigned)yv_ceil_div(g.C, BN_THREADS), BN_THREADS, 0, stream>>>(
        a, g, running_mean, running_var, momentum, eps, mean, invstd);
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
    if (rows) {
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
    a.S = bn_splits(g.n);
    a.partial = (double *)workspace;
    float *coef = (float *)((char *)workspace + bn_partial_bytes(s));
    a.coef = coef;
    bn_launch_reduce(&a, &g, rows, stream);
    bn_bwd_finish_kernel<<<(unsigned)yv_ceil_div(g.C, BN_THREADS), BN_THREADS, 0, stream>>>(
        a, g, batch_stats, coef, dweight1, dbias1, dweight2, dbias2);
    if (a.dz1.data == NULL && a.dz2.data == NULL)
        return cudaGetLastError();
    if (rows) {
        bn_bwd_rows_kernel<<<bn_grid(yv_ceil_div(g.n, BN_THREADS / 32)), BN_THREADS, 0, stream>>>(a, g);
    }
    else {
        int64_t tile = bn_tile(&g);
        bn_bwd_planar_kernel<<<bn_grid(g.B * g.C * yv_ceil_div(g.HW, tile)), BN_THREADS, 0, stream>>>(a, g, tile);
    }
    return cudaGetLastError();
}
