/* pool.cu — the 2×2 stride-1 average pool of ADown/AConv (F.avg_pool2d(x, 2, 1, 0, False, True)) on the GPU
 * (and, at the end of the file, the k×k max pool of ADown/SPPELAN, F.max_pool2d(x, k, s, p)):
 * forward and backward, one window-sum kernel for both.
 *
 * Maths (csrc/pool_ref.c is the CPU twin, bit for bit; yolov9c/ops/pool.py holds the torch reference):
 *   forward   out[b,c,y,x] = 0.25·(((in[y,x] + in[y,x+1]) + in[y+1,x]) + in[y+1,x+1])        out (H-1, W-1)
 *   backward  gin[b,c,y,x] = 0.25·(((g[y-1,x-1] + g[y-1,x]) + g[y,x-1]) + g[y,x])            gin (H, W)
 *             (a g outside (H-1, W-1) counts as 0: the outputs whose window covers (y, x))
 * Both are dst[y,x] = 0.25·Σ src[y+o+dy, x+o+dx] over the window (dy, dx) in row-major order, with o = 0
 * (forward) or o = -1 (backward) and zeros outside src. Float32 sums in exactly that order: torch's CPU
 * float32 kernel adds the window row by row too, so the forward equals it bit for bit; the 16-bit results are
 * the float32 value rounded once to nearest-even (torch's CPU float16/bfloat16 backward rounds after every
 * add, so it can differ by an ulp or two there).
 * Saved for backward: nothing but the input's shape (the backward reads only g). Outputs written (=).
 *
 * Kernels (every thread walks a strip of POOL_ROWS output rows of one column, keeping the source row it
 * read last in registers, so each source element is loaded ~1.1 times from L1/L2 per column it feeds; the
 * next POOL_GROUP source rows are loaded before any of their results is stored, for loads in flight):
 *   cl     channel stride 1 in src and dst (channels-last, or a channel slice of a channels-last buffer: any
 *          pixel stride): grid x over (column, channel vector) of an output row, channels fastest, so a warp
 *          reads whole pixels; grid y over (b, strip). V = 16 bytes of channels (8 halves / 4 floats) per load
 *          and store when C % V == 0 and every pointer and stride is V-aligned, else V = 1.
 *   planar everything else (NCHW, any strides): grid x over columns, y over (b, c, strip); scalar loads.
 * Registers (sm_90, ptxas): <= 80 per thread in the cl kernels with POOL_GROUP 2 (4 loaded rows of 16 bytes
 * in flight per thread, >= 3 blocks of 256 per SM); POOL_GROUP 4 took 102-124.
 * All offsets are 64-bit. float32, float16, bfloat16 storage (src and dst one dtype).
 * Test: python -m pytest -q tests/test_pool.py (CUDA cases); speed: python benchmarks/bench_pool.py
 */
#include <stdint.h>
#include <string.h>

#include "common.cuh"
#include "yv_kernels.h"

#define POOL_THREADS 256
#define POOL_ROWS 8                 /* output rows per thread */
#define POOL_GROUP 2                /* source rows loaded before their results are stored */
#define POOL_MAX_ROWS 65535         /* gridDim.y limit: grid-stride beyond it */

/* One direction of the op as a window sum: dst (Hd, Wd) from src (Hs, Ws), window origin offset o. */
typedef struct pool_geom {
    int64_t B, C, Hs, Ws, Hd, Wd, strips;
    int o;
} pool_geom;

__device__ __forceinline__ float pool_f(float v) { return v; }
__device__ __forceinline__ float pool_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float pool_f(__nv_bfloat16 v) { return __bfloat162float(v); }

__device__ __forceinline__ void pool_set(float *p, float v) { *p = v; }
__device__ __forceinline__ void pool_set(__half *p, float v) { *p = __float2half_rn(v); }
__device__ __forceinline__ void pool_set(__nv_bfloat16 *p, float v) { *p = __float2bfloat16_rn(v); }

/* V elements moved as one load/store of their raw bits (2, 4 or 16 bytes); kept raw in registers (8 halves in
 * four 32-bit registers, not eight) and widened to float32 where they are used. All-zero bits are +0.0. */
template <int BYTES> struct pool_bits;
template <> struct pool_bits<2> { typedef uint16_t type; };
template <> struct pool_bits<4> { typedef uint32_t type; };
template <> struct pool_bits<16> { typedef uint4 type; };

template <typename T, int V> struct pool_vec {
    typename pool_bits<sizeof(T) * V>::type bits;
};

template <typename T, int V> __device__ __forceinline__ float pool_get(const pool_vec<T, V> &r, int e)
{
    T t[V];
    memcpy(t, &r.bits, sizeof(t));
    return pool_f(t[e]);
}

/* V channels of source row y of a column (col: its row-0 element, NULL when the column lies outside src),
 * raw; zeros outside src. */
template <typename T, int V>
__device__ __forceinline__ pool_vec<T, V> pool_raw(const T *col, int64_t y, const pool_geom *g, int64_t row_stride)
{
    pool_vec<T, V> r;
    if (col == NULL || y < 0 || y >= g->Hs) {
        memset(&r, 0, sizeof(r));
        return r;
    }
    return *(const pool_vec<T, V> *)(col + y * row_stride);
}

/* One thread's strip: dst rows [y0, y1) of column x, channels [c, c + V). The source rows are loaded
 * POOL_GROUP at a time before any of their results is stored, so 2·POOL_GROUP loads are in flight per thread
 * (a memory-bound pass needs them: one row at a time leaves ~25 KB in flight per SM, less than DRAM latency
 * times bandwidth on an H200). Rows are kept raw (16 bytes) and widened where they are used. */
template <typename T, int V>
__device__ __forceinline__ void pool_strip(const yv_view4 *s, const yv_view4 *d, const pool_geom *g, int64_t b,
                                           int64_t c, int64_t y0, int64_t y1, int64_t x)
{
    int64_t sx = x + g->o, rs = s->stride[2];
    const T *base = (const T *)s->data + b * s->stride[0] + c * s->stride[1];
    const T *col0 = sx >= 0 ? base + sx * s->stride[3] : NULL;
    const T *col1 = sx + 1 < g->Ws ? base + (sx + 1) * s->stride[3] : NULL;
    int64_t sy = y0 + g->o;
    pool_vec<T, V> a0 = pool_raw<T, V>(col0, sy, g, rs), a1 = pool_raw<T, V>(col1, sy, g, rs);
    T *q = (T *)d->data + b * d->stride[0] + c * d->stride[1] + x * d->stride[3];
#pragma unroll 1
    for (int64_t y = y0; y < y1; y += POOL_GROUP, sy += POOL_GROUP) {
        pool_vec<T, V> r0[POOL_GROUP], r1[POOL_GROUP];
#pragma unroll
        for (int k = 0; k < POOL_GROUP; k++) {
            if (y + k < y1) {
                r0[k] = pool_raw<T, V>(col0, sy + k + 1, g, rs);
                r1[k] = pool_raw<T, V>(col1, sy + k + 1, g, rs);
            }
        }
#pragma unroll
        for (int k = 0; k < POOL_GROUP; k++) {
            if (y + k >= y1)
                break;
            T out[V];
#pragma unroll
            for (int e = 0; e < V; e++) {
                /* the fixed order: upper row left to right, then lower row; one multiply by 0.25 (exact) */
                float sum = ((pool_get(a0, e) + pool_get(a1, e)) + pool_get(r0[k], e)) + pool_get(r1[k], e);
                pool_set(&out[e], sum * 0.25f);
            }
            pool_vec<T, V> w;
            memcpy(&w.bits, out, sizeof(out));
            a0 = r0[k];
            a1 = r1[k];
            *(pool_vec<T, V> *)(q + (y + k) * d->stride[2]) = w;
        }
    }
}

/* Grid: x over the lanes of one output row (the columns × channel vectors, or the columns), y over
 * (b, strip) pairs, grid-stride in y beyond 65535. */
template <typename T, int V>
__global__ void __launch_bounds__(POOL_THREADS) pool_cl_kernel(yv_view4 s, yv_view4 d, pool_geom g)
{
    int64_t cv = g.C / V, i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= g.Wd * cv)
        return;
    int64_t c = (i % cv) * V, x = i / cv;
    for (int64_t r = blockIdx.y; r < g.B * g.strips; r += gridDim.y) {
        int64_t strip = r % g.strips, b = r / g.strips;
        int64_t y0 = strip * POOL_ROWS, y1 = y0 + POOL_ROWS < g.Hd ? y0 + POOL_ROWS : g.Hd;
        pool_strip<T, V>(&s, &d, &g, b, c, y0, y1, x);
    }
}

/* Grid: x over the columns, y over (b, c, strip) triples (grid-stride beyond 65535). */
template <typename T>
__global__ void __launch_bounds__(POOL_THREADS) pool_planar_kernel(yv_view4 s, yv_view4 d, pool_geom g)
{
    int64_t x = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (x >= g.Wd)
        return;
    for (int64_t r = blockIdx.y; r < g.B * g.C * g.strips; r += gridDim.y) {
        int64_t strip = r % g.strips, bc = r / g.strips;
        int64_t c = bc % g.C, b = bc / g.C;
        int64_t y0 = strip * POOL_ROWS, y1 = y0 + POOL_ROWS < g.Hd ? y0 + POOL_ROWS : g.Hd;
        pool_strip<T, 1>(&s, &d, &g, b, c, y0, y1, x);
    }
}

/* Whether V channels at a time can move as one aligned vector through view v. */
static int pool_vector_ok(const yv_view4 *v, int64_t C, int V, size_t esize)
{
    if (C % V != 0 || ((uintptr_t)v->data % (esize * (size_t)V)) != 0)
        return 0;
    return v->stride[0] % V == 0 && v->stride[2] % V == 0 && v->stride[3] % V == 0;
}

template <typename T> static cudaError_t pool_launch(yv_view4 s, yv_view4 d, pool_geom g, cudaStream_t stream)
{
    const int V = 16 / (int)sizeof(T);
    int cl = s.stride[1] == 1 && d.stride[1] == 1;
    int vec = cl && pool_vector_ok(&s, g.C, V, sizeof(T)) && pool_vector_ok(&d, g.C, V, sizeof(T));
    int64_t lanes = cl ? g.Wd * (g.C / (vec ? V : 1)) : g.Wd;       /* threads per output row */
    int64_t rows = cl ? g.B * g.strips : g.B * g.C * g.strips;
    if (yv_ceil_div(lanes, POOL_THREADS) > INT32_MAX)
        return cudaErrorInvalidConfiguration;
    dim3 grid((unsigned)yv_ceil_div(lanes, POOL_THREADS), (unsigned)(rows < POOL_MAX_ROWS ? rows : POOL_MAX_ROWS));
    if (vec)
        pool_cl_kernel<T, V><<<grid, POOL_THREADS, 0, stream>>>(s, d, g);
    else if (cl)
        pool_cl_kernel<T, 1><<<grid, POOL_THREADS, 0, stream>>>(s, d, g);
    else
        pool_planar_kernel<T><<<grid, POOL_THREADS, 0, stream>>>(s, d, g);
    return cudaGetLastError();
}

static cudaError_t pool_run(yv_view4 s, yv_view4 d, pool_geom g, cudaStream_t stream)
{
    g.strips = yv_ceil_div(g.Hd, POOL_ROWS);
    if (g.B * g.C * g.Hd * g.Wd == 0)
        return cudaSuccess;
    if (s.dtype == YV_FLOAT16)
        return pool_launch<__half>(s, d, g, stream);
    if (s.dtype == YV_BFLOAT16)
        return pool_launch<__nv_bfloat16>(s, d, g, stream);
    return pool_launch<float>(s, d, g, stream);
}

extern "C" cudaError_t yv_avg_pool2x2_forward(int64_t B, int64_t C, int64_t H, int64_t W, yv_view4 in,
                                              yv_view4 out, cudaStream_t stream)
{
    pool_geom g = {B, C, H, W, H - 1, W - 1, 0, 0};
    return pool_run(in, out, g, stream);
}

extern "C" cudaError_t yv_avg_pool2x2_backward(int64_t B, int64_t C, int64_t H, int64_t W, yv_view4 grad_out,
                                               yv_view4 grad_in, cudaStream_t stream)
{
    pool_geom g = {B, C, H - 1, W - 1, H, W, 0, -1};
    return pool_run(grad_out, grad_in, g, stream);
}

/* ---- max_pool2d: F.max_pool2d(x, k, s, p), dilation 1, floor mode ------------------------------------------
 * Maths (csrc/pool_ref.c is the CPU twin, bit for bit):
 *   window (oy, ox): rows oy·s-p .. +k-1, columns ox·s-p .. +k-1, cut to the image (padding counts as -inf:
 *   never picked; p <= k/2 leaves >= 1 element in every window)
 *   argmax: scanned row-major from the window's first element, v taken when v > best or v is NaN (torch's
 *   rule: ties go to the first maximum, a window with NaN picks its last NaN)
 *   forward   out[oy,ox] = x at the argmax (its own bits)                                           (=)
 *   backward  gin[y,x] = Σ g[oy,ox] over the covering windows whose argmax is (y, x), float32 in row-major
 *             (oy, ox) order (torch's scatter order), rounded once                                     (=)
 * Saved for backward: x itself (which autograd keeps as the pool's input anyway); no index tensor. The
 * backward is a gather: each input element rescans the <= ceil(k/s)² windows covering it (k=3 s=2: <= 4
 * windows of 9; k=5 s=1: 25 of 25, from L1), so there are no atomics and the result is deterministic.
 * Kernels: one thread per destination element × channel vector, grid-stride over (b, y, x, channel vector)
 * with channels fastest (cl: channel stride 1 in every operand; 16-byte vectors when C and every pointer and
 * stride allow, else V = 1), or over (b, c, y, x) with x fastest (planar: any strides, scalar).
 */

#define MAX_BLOCKS (1 << 20)        /* grid-stride beyond */

typedef struct max_geom {
    int64_t B, C, H, W, Ho, Wo;
    int k, s, p;
} max_geom;

/* The argmax of window (oy, ox) for V channels at base (the (b, c) element of x; rs, ps: row and pixel
 * strides): window index a[e] = dy·k + dx and the element's raw value best[e]. */
template <typename T, int V>
__device__ __forceinline__ void max_scan(const T *base, int64_t rs, int64_t ps, const max_geom *g, int64_t oy,
                                         int64_t ox, int a[V], T best[V])
{
    int64_t y0 = oy * g->s - g->p, x0 = ox * g->s - g->p;
    float m[V];
    bool first = true;
    for (int dy = 0; dy < g->k; dy++) {
        int64_t y = y0 + dy;
        if (y < 0 || y >= g->H)
            continue;
        for (int dx = 0; dx < g->k; dx++) {
            int64_t x = x0 + dx;
            if (x < 0 || x >= g->W)
                continue;
            pool_vec<T, V> r = *(const pool_vec<T, V> *)(base + y * rs + x * ps);
            T t[V];
            memcpy(t, &r.bits, sizeof(t));
#pragma unroll
            for (int e = 0; e < V; e++) {
                float v = pool_f(t[e]);
                if (first || v > m[e] || isnan(v)) {
                    m[e] = v;
                    a[e] = dy * g->k + dx;
                    best[e] = t[e];
                }
            }
            first = false;
        }
    }
}

/* [*lo, *hi]: the outputs (n of them) whose window covers input row or column i. */
__device__ __forceinline__ void max_covering(int64_t i, const max_geom *g, int64_t n, int64_t *lo, int64_t *hi)
{
    int64_t a = i + g->p - g->k + 1, b = i + g->p;
    *lo = a <= 0 ? 0 : (a + g->s - 1) / g->s;
    *hi = b / g->s < n - 1 ? b / g->s : n - 1;
}

template <typename T, int V, bool CL, bool BWD>
__global__ void __launch_bounds__(POOL_THREADS) max_kernel(yv_view4 in, yv_view4 go, yv_view4 dst, max_geom g)
{
    int64_t Hd = BWD ? g.H : g.Ho, Wd = BWD ? g.W : g.Wo, cv = g.C / V, n = g.B * cv * Hd * Wd;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t b, c, y, x, r;
        if (CL) {
            c = (i % cv) * V, r = i / cv, x = r % Wd, r /= Wd, y = r % Hd, b = r / Hd;
        } else {
            x = i % Wd, r = i / Wd, y = r % Hd, r /= Hd, c = r % g.C, b = r / g.C;
        }
        const T *base = (const T *)in.data + b * in.stride[0] + c * in.stride[1];
        T *q = (T *)dst.data + b * dst.stride[0] + c * dst.stride[1] + y * dst.stride[2] + x * dst.stride[3];
        int a[V];
        T best[V];
        pool_vec<T, V> w;
        if (!BWD) {
            max_scan<T, V>(base, in.stride[2], in.stride[3], &g, y, x, a, best);
            memcpy(&w.bits, best, sizeof(best));
        } else {
            float acc[V];
#pragma unroll
            for (int e = 0; e < V; e++)
                acc[e] = 0.0f;
            int64_t oy0, oy1, ox0, ox1;
            max_covering(y, &g, g.Ho, &oy0, &oy1);
            max_covering(x, &g, g.Wo, &ox0, &ox1);
            const T *gb = (const T *)go.data + b * go.stride[0] + c * go.stride[1];
            for (int64_t oy = oy0; oy <= oy1; oy++) {
                for (int64_t ox = ox0; ox <= ox1; ox++) {
                    max_scan<T, V>(base, in.stride[2], in.stride[3], &g, oy, ox, a, best);
                    int me = (int)((y - (oy * g.s - g.p)) * g.k + (x - (ox * g.s - g.p)));
                    pool_vec<T, V> gr = *(const pool_vec<T, V> *)(gb + oy * go.stride[2] + ox * go.stride[3]);
#pragma unroll
                    for (int e = 0; e < V; e++)
                        if (a[e] == me)
                            acc[e] += pool_get(gr, e);
                }
            }
            T out[V];
#pragma unroll
            for (int e = 0; e < V; e++)
                pool_set(&out[e], acc[e]);
            memcpy(&w.bits, out, sizeof(out));
        }
        *(pool_vec<T, V> *)q = w;
    }
}

template <typename T, bool BWD>
static cudaError_t max_launch(yv_view4 in, yv_view4 go, yv_view4 dst, max_geom g, cudaStream_t stream)
{
    const int V = 16 / (int)sizeof(T);
    int cl = in.stride[1] == 1 && dst.stride[1] == 1 && (!BWD || go.stride[1] == 1);
    int vec = cl && pool_vector_ok(&in, g.C, V, sizeof(T)) && pool_vector_ok(&dst, g.C, V, sizeof(T))
              && (!BWD || pool_vector_ok(&go, g.C, V, sizeof(T)));
    int64_t n = g.B * g.C * (BWD ? g.H * g.W : g.Ho * g.Wo) / (vec ? V : 1);
    int64_t blocks = yv_ceil_div(n, POOL_THREADS);
    dim3 grid((unsigned)(blocks < MAX_BLOCKS ? blocks : MAX_BLOCKS));
    if (vec)
        max_kernel<T, V, true, BWD><<<grid, POOL_THREADS, 0, stream>>>(in, go, dst, g);
    else if (cl)
        max_kernel<T, 1, true, BWD><<<grid, POOL_THREADS, 0, stream>>>(in, go, dst, g);
    else
        max_kernel<T, 1, false, BWD><<<grid, POOL_THREADS, 0, stream>>>(in, go, dst, g);
    return cudaGetLastError();
}

template <bool BWD> static cudaError_t max_run(yv_view4 in, yv_view4 go, yv_view4 dst, max_geom g, cudaStream_t stream)
{
    if (g.B * g.C * g.Ho * g.Wo == 0)
        return cudaSuccess;
    if (in.dtype == YV_FLOAT16)
        return max_launch<__half, BWD>(in, go, dst, g, stream);
    if (in.dtype == YV_BFLOAT16)
        return max_launch<__nv_bfloat16, BWD>(in, go, dst, g, stream);
    return max_launch<float, BWD>(in, go, dst, g, stream);
}

extern "C" cudaError_t yv_max_pool2d_forward(int64_t B, int64_t C, int64_t H, int64_t W, int k, int s, int p,
                                             yv_view4 in, yv_view4 out, cudaStream_t stream)
{
    max_geom g = {B, C, H, W, (H + 2 * p - k) / s + 1, (W + 2 * p - k) / s + 1, k, s, p};
    return max_run<false>(in, in, out, g, stream);
}

extern "C" cudaError_t yv_max_pool2d_backward(int64_t B, int64_t C, int64_t H, int64_t W, int k, int s, int p,
                                              yv_view4 in, yv_view4 grad_out, yv_view4 grad_in, cudaStream_t stream)
{
    max_geom g = {B, C, H, W, (H + 2 * p - k) / s + 1, (W + 2 * p - k) / s + 1, k, s, p};
    return max_run<true>(in, grad_out, grad_in, g, stream);
}
