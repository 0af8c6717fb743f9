/* bn_silu_stats.cu — per-channel sums over z and the batch statistics: yv_bn_stats_forward and
 * yv_bn_workspace_size (bn_silu.cuh has the shared maths and layouts).
 * Maths: mean = K + S1/n, var = S2/n − (S1/n)², S1 = Σ(z − K), S2 = Σ(z − K)², K = z[0, c, 0, 0] (close to the
 * mean: no cancellation); invstd = 1/sqrt(var + eps); running_mean = (1−m)·rm + m·mean, running_var =
 * (1−m)·rv + m·var·n/(n−1). Float32 runs of up to BN_FOLD elements folded into float64; fixed order.
 * Bytes: reads z once (2 B/element in fp16), writes float64 partials [2][S][C] into the workspace, then
 * bn_stats_finish_kernel writes mean, invstd (=) and updates the running statistics in place.
 * Also here, so that each reduction kernel lives in one file: the generic (rows, planar) and planar-vector
 * reductions in both modes (statistics, and the backward's Σg, Σg·x̂ that bn_silu_bwd.cu launches through
 * bn_launch_reduce and bn_planar_red_launch).
 * Test: python -m pytest -q tests/ops/test_bn_silu.py (CUDA cases); speed: python benchmarks/bench_bn_silu.py
 */
#include "bn_silu.cuh"

#define BN_ROWS_Y 8            /* rows kernels: blocks of 32 channels x 8 rows (reduction) or 8 warps */

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

/* V elements at p (aligned to V·sizeof(T) bytes) as float32; stored from float32 (+= when accumulate). */
template <typename T, int V> __device__ __forceinline__ void bn_vload_at(const T *p, float x[V])
{
    bn_vec<T, V> r = *(const bn_vec<T, V> *)p;
#pragma unroll
    for (int e = 0; e < V; e++)
        x[e] = bn_tof(r.v[e]);
}

template <typename T, int V> __device__ __forceinline__ void bn_vload(const yv_view4 *v, int64_t k, int64_t c, float x[V])
{
    bn_vload_at<T, V>(bn_at<T>(v, k, c), x);
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

extern "C" size_t yv_bn_workspace_size(yv_bn_shape s)
{
    return bn_partial_bytes(s) + yv_align256((size_t)5 * (size_t)s.C * sizeof(float));
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

/* The planar reduction: stats (mode 0) or backward (1, 2 = bn2 form). */
void bn_planar_red_launch(bn_args *a, const bn_geom *g, int v, int mode, cudaStream_t stream)
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

void bn_launch_reduce(bn_args *a, const bn_geom *g, int rows, cudaStream_t stream)
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
