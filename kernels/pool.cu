/* pool.cu — the 2×2 stride-1 average pool of ADown/AConv (F.avg_pool2d(x, 2, 1, 0, False, True)) on the GPU
 * (and, further down, the nearest 2× upsampling of the heads and CBFuse, nn.Upsample(scale_factor=2,
 * mode='nearest'), and the k×k max pool of ADown/SPPELAN, F.max_pool2d(x, k, s, p)):
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
 * Test: python -m pytest -q tests/ops/test_pool.py (CUDA cases); speed: python benchmarks/bench_pool.py
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

/* ---- upsample_nearest2x: nn.Upsample(scale_factor=2, mode='nearest') -------------------------------------
 * Maths (csrc/pool_ref.c is the CPU twin, bit for bit):
 *   forward   out[b,c,y,x] = in[b,c,y/2,x/2]                         out (2H, 2W): the element's bits (=)
 *   backward  gin[b,c,i,j] = ((g[2i,2j] + g[2i,2j+1]) + g[2i+1,2j]) + g[2i+1,2j+1]                    (=)
 *             float32 in that (row-major) order, rounded once: torch's CPU upsample_nearest2d_backward bits
 * Saved for backward: nothing (the backward reads only g).
 * Kernels: one thread per element (or channel vector) of the small side (in for the forward, gin for the
 * backward), touching its 2×2 block of the big side: the forward loads once and stores four times, the
 * backward loads four times and stores once. Grid x over the lanes of one small-side row, y over its rows,
 * z over b (cl) or (b, c) (planar), grid-stride in y and z beyond 65535:
 *   cl     channel stride 1 in src and dst (channels-last or a channel slice of one, any pixel stride): lanes
 *          (column, channel vector), channels fastest, split with one 32-bit division per thread; V = 16 bytes
 *          (8 halves / 4 floats) when C % V == 0 and every pointer and stride is V-aligned (pool_vector_ok),
 *          else V = 1.
 *   planar everything else (NCHW, any strides): lanes = columns; scalar.
 */

typedef struct up_geom {
    int64_t B, C, H, W;   /* the small side: the forward's input, the backward's grad_in */
} up_geom;

/* Offsets (elements) of small-side pixel (b, c, y, x) in the small view sm and of its block's top-left in big. */
__device__ __forceinline__ void up_offsets(const yv_view4 *sm, const yv_view4 *big, int64_t b, int64_t c, int64_t y,
                                           int64_t x, int64_t *os, int64_t *ob)
{
    *os = b * sm->stride[0] + c * sm->stride[1] + y * sm->stride[2] + x * sm->stride[3];
    *ob = b * big->stride[0] + c * big->stride[1] + 2 * y * big->stride[2] + 2 * x * big->stride[3];
}

/* One small-side pixel's V channels: forward (BWD false) copies src[os] to the 2×2 block at dst[ob]; backward
 * sums the block at src[ob] into dst[os]. s: the view read, d: the view written. */
template <typename T, int V, bool BWD>
__device__ __forceinline__ void up_one(const yv_view4 *s, const yv_view4 *d, int64_t os, int64_t ob)
{
    typedef pool_vec<T, V> vec;
    if (!BWD) {
        vec r = *(const vec *)((const T *)s->data + os);
        T *q = (T *)d->data + ob;
        int64_t rs = d->stride[2], ps = d->stride[3];
        *(vec *)q = r;
        *(vec *)(q + ps) = r;
        *(vec *)(q + rs) = r;
        *(vec *)(q + rs + ps) = r;
        return;
    }
    const T *p = (const T *)s->data + ob;
    int64_t rs = s->stride[2], ps = s->stride[3];
    vec a = *(const vec *)p, b = *(const vec *)(p + ps), c = *(const vec *)(p + rs), e = *(const vec *)(p + rs + ps);
    T out[V];
#pragma unroll
    for (int k = 0; k < V; k++)   /* row-major: upper row left to right, then the lower row */
        pool_set(&out[k], ((pool_get(a, k) + pool_get(b, k)) + pool_get(c, k)) + pool_get(e, k));
    vec w;
    memcpy(&w.bits, out, sizeof(out));
    *(vec *)((T *)d->data + os) = w;
}

/* cl: grid x over (column, channel vector) of a small-side row (32-bit: up_launch checks the count), y over
 * its rows, z over b (grid-stride in y and z beyond 65535): no 64-bit division per element. */
template <typename T, int V, bool BWD>
__global__ void __launch_bounds__(POOL_THREADS) up_cl_kernel(yv_view4 s, yv_view4 d, up_geom g)
{
    int cv = (int)(g.C / V), i = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if ((int64_t)i >= g.W * cv)
        return;
    int64_t c = (int64_t)(i % cv) * V, x = i / cv;
    const yv_view4 *sm = BWD ? &d : &s, *big = BWD ? &s : &d;
    for (int64_t b = blockIdx.z; b < g.B; b += gridDim.z)
        for (int64_t y = blockIdx.y; y < g.H; y += gridDim.y) {
            int64_t os, ob;
            up_offsets(sm, big, b, c, y, x, &os, &ob);
            up_one<T, V, BWD>(&s, &d, os, ob);
        }
}

/* planar: grid x over the columns of a small-side row, y over its rows, z over (b, c). */
template <typename T, bool BWD>
__global__ void __launch_bounds__(POOL_THREADS) up_planar_kernel(yv_view4 s, yv_view4 d, up_geom g)
{
    int64_t x = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (x >= g.W)
        return;
    const yv_view4 *sm = BWD ? &d : &s, *big = BWD ? &s : &d;
    for (int64_t bc = blockIdx.z; bc < g.B * g.C; bc += gridDim.z)
        for (int64_t y = blockIdx.y; y < g.H; y += gridDim.y) {
            int64_t os, ob;
            up_offsets(sm, big, bc / g.C, bc % g.C, y, x, &os, &ob);
            up_one<T, 1, BWD>(&s, &d, os, ob);
        }
}

static unsigned up_dim(int64_t n)
{
    return (unsigned)(n < POOL_MAX_ROWS ? n : POOL_MAX_ROWS);
}

template <typename T, bool BWD> static cudaError_t up_launch(yv_view4 s, yv_view4 d, up_geom g, cudaStream_t stream)
{
    const int V = 16 / (int)sizeof(T);
    int cl = s.stride[1] == 1 && d.stride[1] == 1;
    int vec = cl && pool_vector_ok(&s, g.C, V, sizeof(T)) && pool_vector_ok(&d, g.C, V, sizeof(T));
    int64_t lanes = cl ? g.W * (g.C / (vec ? V : 1)) : g.W;       /* threads per small-side row */
    if (yv_ceil_div(lanes, POOL_THREADS) * POOL_THREADS > INT32_MAX)
        return cudaErrorInvalidConfiguration;
    dim3 grid((unsigned)yv_ceil_div(lanes, POOL_THREADS), up_dim(g.H), up_dim(cl ? g.B : g.B * g.C));
    if (vec)
        up_cl_kernel<T, V, BWD><<<grid, POOL_THREADS, 0, stream>>>(s, d, g);
    else if (cl)
        up_cl_kernel<T, 1, BWD><<<grid, POOL_THREADS, 0, stream>>>(s, d, g);
    else
        up_planar_kernel<T, BWD><<<grid, POOL_THREADS, 0, stream>>>(s, d, g);
    return cudaGetLastError();
}

template <bool BWD> static cudaError_t up_run(yv_view4 s, yv_view4 d, up_geom g, cudaStream_t stream)
{
    if (g.B * g.C * g.H * g.W == 0)
        return cudaSuccess;
    if (s.dtype == YV_FLOAT16)
        return up_launch<__half, BWD>(s, d, g, stream);
    if (s.dtype == YV_BFLOAT16)
        return up_launch<__nv_bfloat16, BWD>(s, d, g, stream);
    return up_launch<float, BWD>(s, d, g, stream);
}

extern "C" cudaError_t yv_upsample_nearest2x_forward(int64_t B, int64_t C, int64_t H, int64_t W, yv_view4 in,
                                                     yv_view4 out, cudaStream_t stream)
{
    up_geom g = {B, C, H, W};
    return up_run<false>(in, out, g, stream);
}

extern "C" cudaError_t yv_upsample_nearest2x_backward(int64_t B, int64_t C, int64_t H, int64_t W,
                                                      yv_view4 grad_out, yv_view4 grad_in, cudaStream_t stream)
{
    up_geom g = {B, C, H, W};
    return up_run<true>(grad_out, grad_in, g, stream);
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
 * backward runs in two phases through a uint8 scratch tensor `index` (the output's shape, 1 byte per output
 * element, from the caller's allocator: k·k <= 255), so there are no atomics and the result is deterministic:
 *   1. index[oy,ox] = the window argmax dy·k + dx (the forward's scan), one thread per output element (=)
 *   2. gin[y,x] = Σ g[oy,ox] over the <= ceil(k/s)² covering windows whose index names (y, x), one thread per
 *      input element; g is loaded only where some channel of the vector matches                    (=)
 * Kernels: one thread per destination element × channel vector, grid-stride over (b, y, x, channel vector)
 * with channels fastest (cl: channel stride 1 in every operand; 16-byte vectors, and V-byte index vectors,
 * when C and every pointer and stride allow, else V = 1), or over (b, c, y, x) with x fastest (planar: any
 * strides, scalar). The backward's vector path has compile-time geometries for ADown's 3×3/2 pad 1 and
 * SPPELAN's 5×5/1 pad 2 (unrolled loops, 32-bit offsets when every operand's offsets and the thread count
 * fit an int32); every other case runs the generic kernels (runtime k, s, p; 64-bit offsets).
 */

#define MAX_BLOCKS (1 << 20)        /* grid-stride beyond */
#define MAX_STEP ((int64_t)MAX_BLOCKS * POOL_THREADS)

typedef struct max_geom {
    int64_t B, C, H, W, Ho, Wo;
    int k, s, p;
} max_geom;

/* V window indices (uint8) moved as one load/store of V bytes. */
template <int BYTES> struct max_bytes;
template <> struct max_bytes<1> { typedef uint8_t type; };
template <> struct max_bytes<4> { typedef uint32_t type; };
template <> struct max_bytes<8> { typedef uint2 type; };

template <int V> struct max_ivec {
    typename max_bytes<V>::type bits;
};

/* The argmax of window (oy, ox) for V channels at base (the (b, c) element of x; rs, ps: row and pixel
 * strides; I: the offset type): window index a[e] = dy·k + dx and the element's raw value best[e]. The loops
 * unroll when k is a compile-time constant. */
template <typename T, int V, typename I>
__device__ __forceinline__ void max_scan(const T *base, I rs, I ps, I H, I W, int k, int s, int p, I oy, I ox,
                                         int a[V], T best[V])
{
    I y0 = oy * s - p, x0 = ox * s - p;
    float m[V];
    bool first = true;
#pragma unroll
    for (int dy = 0; dy < k; dy++) {
        I y = y0 + dy;
        if (y < 0 || y >= H)
            continue;
#pragma unroll
        for (int dx = 0; dx < k; dx++) {
            I x = x0 + dx;
            if (x < 0 || x >= W)
                continue;
            pool_vec<T, V> r = *(const pool_vec<T, V> *)(base + y * rs + x * ps);
            T t[V];
            memcpy(t, &r.bits, sizeof(t));
#pragma unroll
            for (int e = 0; e < V; e++) {
                float v = pool_f(t[e]);
                if (first || v > m[e] || isnan(v)) {
                    m[e] = v;
                    a[e] = dy * k + dx;
                    best[e] = t[e];
                }
            }
            first = false;
        }
    }
}

/* Element i of n = B·C·h·w / V split into (b, c, y, x): channels fastest (cl) or x fastest (planar). */
template <int V, bool CL, typename I>
__device__ __forceinline__ void max_split(I i, I C, I h, I w, I *b, I *c, I *y, I *x)
{
    I r;
    if (CL) {
        I cv = C / V;
        *c = (i % cv) * V, r = i / cv, *x = r % w, r /= w, *y = r % h, *b = r / h;
    } else {
        *x = i % w, r = i / w, *y = r % h, r /= h, *c = r % C, *b = r / C;
    }
}

/* Store V raw elements at q (V-aligned) as one vector. */
template <typename T, int V> __device__ __forceinline__ void max_store(T *q, const T t[V])
{
    pool_vec<T, V> r;
    memcpy(&r.bits, t, sizeof(r.bits));
    *(pool_vec<T, V> *)q = r;
}

__device__ __forceinline__ int64_t max_off(const yv_view4 *v, int64_t b, int64_t c)
{
    return b * v->stride[0] + c * v->stride[1];
}

/* Forward: out = x at each window's argmax (runtime geometry, 64-bit offsets). */
template <typename T, int V, bool CL>
__global__ void __launch_bounds__(POOL_THREADS) max_fwd_kernel(yv_view4 in, yv_view4 dst, max_geom g)
{
    int64_t n = g.B * g.C / V * g.Ho * g.Wo;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t b, c, y, x;
        max_split<V, CL, int64_t>(i, g.C, g.Ho, g.Wo, &b, &c, &y, &x);
        int a[V];
        T best[V];
        max_scan<T, V, int64_t>((const T *)in.data + max_off(&in, b, c), in.stride[2], in.stride[3], g.H, g.W, g.k,
                                g.s, g.p, y, x, a, best);
        max_store<T, V>((T *)dst.data + max_off(&dst, b, c) + y * dst.stride[2] + x * dst.stride[3], best);
    }
}

/* Backward phase 1: index[oy,ox] = the argmax dy·k + dx of each window. K, S, P: a compile-time geometry, or
 * 0 for the runtime one in g; I: int32_t (offsets known to fit) or int64_t. */
template <typename T, int V, bool CL, int K, int S, int P, typename I>
__global__ void __launch_bounds__(POOL_THREADS) max_index_kernel(yv_view4 in, yv_view4 idx, max_geom g)
{
    const int k = K ? K : g.k, s = K ? S : g.s, p = K ? P : g.p;
    I n = (I)(g.B * g.C / V * g.Ho * g.Wo), step = (I)gridDim.x * (I)blockDim.x;
    for (I i = (I)blockIdx.x * (I)blockDim.x + (I)threadIdx.x; i < n; i += step) {
        I b, c, oy, ox;
        max_split<V, CL, I>(i, (I)g.C, (I)g.Ho, (I)g.Wo, &b, &c, &oy, &ox);
        const T *base = (const T *)in.data + (b * (I)in.stride[0] + c * (I)in.stride[1]);
        int a[V];
        T best[V];
        max_scan<T, V, I>(base, (I)in.stride[2], (I)in.stride[3], (I)g.H, (I)g.W, k, s, p, oy, ox, a, best);
        uint8_t out[V];
#pragma unroll
        for (int e = 0; e < V; e++)
            out[e] = (uint8_t)a[e];
        max_ivec<V> w;
        memcpy(&w.bits, out, sizeof(out));
        I o = b * (I)idx.stride[0] + c * (I)idx.stride[1] + oy * (I)idx.stride[2] + ox * (I)idx.stride[3];
        *(max_ivec<V> *)((uint8_t *)idx.data + o) = w;
    }
}

/* [*lo, *hi]: the outputs (n of them) whose window covers input row or column i. */
template <typename I> __device__ __forceinline__ void max_covering(I i, int k, int s, int p, I n, I *lo, I *hi)
{
    I a = i + p - k + 1, b = i + p;
    *lo = a <= 0 ? 0 : (a + s - 1) / s;
    *hi = b / s < n - 1 ? b / s : n - 1;
}

/* Backward phase 2: gin[y,x] = Σ g over the covering windows whose index is (y, x)'s place in them, row-major
 * (oy, ox) order. At most ceil(k/s) covering windows per axis: fixed trip counts (unrolled) when K is set. */
template <typename T, int V, bool CL, int K, int S, int P, typename I>
__global__ void __launch_bounds__(POOL_THREADS) max_gather_kernel(yv_view4 idx, yv_view4 go, yv_view4 gi, max_geom g)
{
    const int k = K ? K : g.k, s = K ? S : g.s, p = K ? P : g.p, span = K ? (K + S - 1) / S : (k + s - 1) / s;
    I n = (I)(g.B * g.C / V * g.H * g.W), step = (I)gridDim.x * (I)blockDim.x;
    for (I i = (I)blockIdx.x * (I)blockDim.x + (I)threadIdx.x; i < n; i += step) {
        I b, c, y, x, oy0, oy1, ox0, ox1;
        max_split<V, CL, I>(i, (I)g.C, (I)g.H, (I)g.W, &b, &c, &y, &x);
        max_covering<I>(y, k, s, p, (I)g.Ho, &oy0, &oy1);
        max_covering<I>(x, k, s, p, (I)g.Wo, &ox0, &ox1);
        const uint8_t *ib = (const uint8_t *)idx.data + (b * (I)idx.stride[0] + c * (I)idx.stride[1]);
        const T *gb = (const T *)go.data + (b * (I)go.stride[0] + c * (I)go.stride[1]);
        float acc[V];
#pragma unroll
        for (int e = 0; e < V; e++)
            acc[e] = 0.0f;
#pragma unroll
        for (int jy = 0; jy < span; jy++) {
            I oy = oy0 + jy;
            if (oy > oy1)
                break;
            int ry = (int)(y - oy * s + p);   /* (y, x)'s row in window (oy, ox): 0 .. k-1 */
#pragma unroll
            for (int jx = 0; jx < span; jx++) {
                I ox = ox0 + jx;
                if (ox > ox1)
                    break;
                int me = ry * k + (int)(x - ox * s + p);
                max_ivec<V> iv = *(const max_ivec<V> *)(ib + oy * (I)idx.stride[2] + ox * (I)idx.stride[3]);
                uint8_t a[V];
                memcpy(a, &iv.bits, sizeof(a));
                bool any = false;
#pragma unroll
                for (int e = 0; e < V; e++)
                    any |= a[e] == me;
                if (!any)   /* most windows point elsewhere: skip their g load */
                    continue;
                pool_vec<T, V> gr = *(const pool_vec<T, V> *)(gb + oy * (I)go.stride[2] + ox * (I)go.stride[3]);
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
        max_store<T, V>((T *)gi.data + (b * (I)gi.stride[0] + c * (I)gi.stride[1] + y * (I)gi.stride[2]
                                        + x * (I)gi.stride[3]), out);
    }
}

static dim3 max_grid(int64_t n)
{
    int64_t blocks = yv_ceil_div(n, POOL_THREADS);
    return dim3((unsigned)(blocks < MAX_BLOCKS ? blocks : MAX_BLOCKS));
}

/* Whether every element offset of v (a (B, C, h, w) view with non-negative strides) fits an int32. */
static int max_fits32(const yv_view4 *v, int64_t B, int64_t C, int64_t h, int64_t w)
{
    int64_t n[4] = {B, C, h, w}, top = 0;
    for (int d = 0; d < 4; d++) {
        if (v->stride[d] < 0 || v->stride[d] > INT32_MAX)
            return 0;
        top += (n[d] - 1) * v->stride[d];
    }
    return top <= INT32_MAX;
}

template <typename T, int V, bool CL>
static cudaError_t max_fwd_launch(yv_view4 in, yv_view4 out, max_geom g, cudaStream_t stream)
{
    max_fwd_kernel<T, V, CL><<<max_grid(g.B * g.C / V * g.Ho * g.Wo), POOL_THREADS, 0, stream>>>(in, out, g);
    return cudaGetLastError();
}

template <typename T> static cudaError_t max_forward_run(yv_view4 in, yv_view4 out, max_geom g, cudaStream_t stream)
{
    const int V = 16 / (int)sizeof(T);
    int cl = in.stride[1] == 1 && out.stride[1] == 1;
    if (cl && pool_vector_ok(&in, g.C, V, sizeof(T)) && pool_vector_ok(&out, g.C, V, sizeof(T)))
        return max_fwd_launch<T, V, true>(in, out, g, stream);
    return cl ? max_fwd_launch<T, 1, true>(in, out, g, stream) : max_fwd_launch<T, 1, false>(in, out, g, stream);
}

/* Both backward phases of one kernel configuration, in stream order. */
template <typename T, int V, bool CL, int K, int S, int P, typename I>
static cudaError_t max_bwd_launch(yv_view4 in, yv_view4 go, yv_view4 idx, yv_view4 gi, max_geom g,
                                  cudaStream_t stream)
{
    max_index_kernel<T, V, CL, K, S, P, I><<<max_grid(g.B * g.C / V * g.Ho * g.Wo), POOL_THREADS, 0, stream>>>(
        in, idx, g);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess)
        return err;
    max_gather_kernel<T, V, CL, K, S, P, I><<<max_grid(g.B * g.C / V * g.H * g.W), POOL_THREADS, 0, stream>>>(
        idx, go, gi, g);
    return cudaGetLastError();
}

template <typename T>
static cudaError_t max_backward_run(yv_view4 in, yv_view4 go, yv_view4 idx, yv_view4 gi, max_geom g,
                                    cudaStream_t stream)
{
    const int V = 16 / (int)sizeof(T);
    int cl = in.stride[1] == 1 && go.stride[1] == 1 && idx.stride[1] == 1 && gi.stride[1] == 1;
    int vec = cl && pool_vector_ok(&in, g.C, V, sizeof(T)) && pool_vector_ok(&go, g.C, V, sizeof(T))
              && pool_vector_ok(&gi, g.C, V, sizeof(T)) && pool_vector_ok(&idx, g.C, V, 1);
    if (!vec)
        return cl ? max_bwd_launch<T, 1, true, 0, 0, 0, int64_t>(in, go, idx, gi, g, stream)
                  : max_bwd_launch<T, 1, false, 0, 0, 0, int64_t>(in, go, idx, gi, g, stream);
    /* 32-bit offsets: every operand's offsets, and both phases' element counts plus one grid step, fit an int32 */
    int64_t n1 = g.B * g.C / V * g.Ho * g.Wo, n2 = g.B * g.C / V * g.H * g.W;
    int fits = (n1 > n2 ? n1 : n2) <= INT32_MAX - MAX_STEP && max_fits32(&in, g.B, g.C, g.H, g.W)
               && max_fits32(&gi, g.B, g.C, g.H, g.W) && max_fits32(&go, g.B, g.C, g.Ho, g.Wo)
               && max_fits32(&idx, g.B, g.C, g.Ho, g.Wo);
    if (fits && g.k == 3 && g.s == 2 && g.p == 1)
        return max_bwd_launch<T, V, true, 3, 2, 1, int32_t>(in, go, idx, gi, g, stream);
    if (fits && g.k == 5 && g.s == 1 && g.p == 2)
        return max_bwd_launch<T, V, true, 5, 1, 2, int32_t>(in, go, idx, gi, g, stream);
    return max_bwd_launch<T, V, true, 0, 0, 0, int64_t>(in, go, idx, gi, g, stream);
}

static max_geom max_geometry(int64_t B, int64_t C, int64_t H, int64_t W, int k, int s, int p)
{
    max_geom g = {B, C, H, W, (H + 2 * p - k) / s + 1, (W + 2 * p - k) / s + 1, k, s, p};
    return g;
}

extern "C" cudaError_t yv_max_pool2d_forward(int64_t B, int64_t C, int64_t H, int64_t W, int k, int s, int p,
                                             yv_view4 in, yv_view4 out, cudaStream_t stream)
{
    max_geom g = max_geometry(B, C, H, W, k, s, p);
    if (g.B * g.C * g.Ho * g.Wo == 0)
        return cudaSuccess;
    if (in.dtype == YV_FLOAT16)
        return max_forward_run<__half>(in, out, g, stream);
    if (in.dtype == YV_BFLOAT16)
        return max_forward_run<__nv_bfloat16>(in, out, g, stream);
    return max_forward_run<float>(in, out, g, stream);
}

extern "C" cudaError_t yv_max_pool2d_backward(int64_t B, int64_t C, int64_t H, int64_t W, int k, int s, int p,
                                              yv_view4 in, yv_view4 grad_out, yv_view4 index, yv_view4 grad_in,
                                              cudaStream_t stream)
{
    max_geom g = max_geometry(B, C, H, W, k, s, p);
    if (g.B * g.C * g.Ho * g.Wo == 0)
        return cudaSuccess;
    if (k * k > 255)   /* the window index is one uint8 (the binding refuses this first) */
        return cudaErrorInvalidValue;
    if (in.dtype == YV_FLOAT16)
        return max_backward_run<__half>(in, grad_out, index, grad_in, g, stream);
    if (in.dtype == YV_BFLOAT16)
        return max_backward_run<__nv_bfloat16>(in, grad_out, index, grad_in, g, stream);
    return max_backward_run<float>(in, grad_out, index, grad_in, g, stream);
}
