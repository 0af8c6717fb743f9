/* bn_silu_fwd.cu — the forward pass of BatchNorm + activation from the stored z and its batch statistics:
 * yv_bn_silu_forward (bn_silu.cuh has the shared maths and layouts).
 * Maths: out = act(u) [+ residual], u = (z − mean)·invstd·γ + β [+ the same of z2: the bn2 form, RepConvN];
 * act silu or identity; float32 arithmetic, one rounding to the storage dtype.
 * Bytes per element: reads z (z2, residual), writes out (=): one sweep. Nothing is saved (the backward
 * recomputes u from z). Families: fast (channels-last rows, bn_fwd_fast_kernel), planar vector (NCHW,
 * bn_fwd_planar_vec_kernel), generic rows and planar.
 * Test: python -m pytest -q tests/ops/test_bn_silu.py (CUDA cases); speed: python benchmarks/bench_bn_silu.py
 */
#include "bn_silu.cuh"

__device__ __forceinline__ void bn_fwd_elem(const bn_args *a, int64_t b, int64_t c, int64_t h, int64_t w)
{
    float xh1, xh2;
    float u = bn_u(a, b, c, h, w, &xh1, &xh2);
    float y = a->silu ? u * bn_sigmoid(u) : u;
    if (a->res.data != NULL)
        y = bn_load(&a->res, bn_off(&a->res, b, c, h, w)) + y;
    bn_store(&a->out, bn_off(&a->out, b, c, h, w), y, 0);
}

__global__ void bn_fwd_planar_kernel(bn_args a, bn_geom g, int64_t tile)
{
    BN_PLANAR_LOOP(g, tile, bn_fwd_elem(&a, b, c, h, w));
}

__global__ void bn_fwd_rows_kernel(bn_args a, bn_geom g)
{
    BN_ROWS_LOOP(g, bn_fwd_elem(&a, b, c, h, w));
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
