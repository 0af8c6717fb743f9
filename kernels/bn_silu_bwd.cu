/* bn_silu_bwd.cu — the full training BatchNorm backward through the activation: yv_bn_silu_backward
 * (bn_silu.cuh has the shared maths and layouts).
 * Maths: g = dy·act'(u); dβ = Σg, dγ = Σg·x̂; dz = γ·invstd·(g − Σg/n − x̂·Σ(g·x̂)/n) with batch statistics,
 * γ·invstd·g without; the bn2 form gives both operands their terms from one g.
 * Passes and bytes per element: a reduction reading z (z2) and dy into partials [2 or 3][S][C] (the fast
 * kernel here; the generic and planar-vector ones in bn_silu_stats.cu), bn_bwd_finish_kernel writing dγ, dβ
 * (=) and the coefficients [5][C], then one elementwise pass reading z (z2), dy [and dz for +=] and writing
 * dz1 (dz2): written (=) or accumulated (+=, `accumulate`). Reads only what the forward saved: z, mean,
 * invstd, γ, β.
 * Test: python -m pytest -q tests/ops/test_bn_silu.py (CUDA cases); speed: python benchmarks/bench_bn_silu.py
 */
#include "bn_silu.cuh"

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

__global__ void bn_bwd_planar_kernel(bn_args a, bn_geom g, int64_t tile)
{
    BN_PLANAR_LOOP(g, tile, bn_bwd_elem(&a, &g, b, c, h, w));
}

__global__ void bn_bwd_rows_kernel(bn_args a, bn_geom g)
{
    BN_ROWS_LOOP(g, bn_bwd_elem(&a, &g, b, c, h, w));
}

#define BN_BWD_VEC_BYTES 8     /* backward: 8-byte loads (more per-channel constants per thread) */

template <typename T, int V>
__device__ __forceinline__ void bn_vstore(const yv_view4 *v, int64_t k, int64_t c, const float x[V], int accumulate)
{
    bn_vstore_at<T, V>(bn_at<T>(v, k, c), x, accumulate);
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
