/* pool_ref.c — the 2×2 stride-1 average pool (ADown/AConv's F.avg_pool2d(x, 2, 1, 0, False, True)) on the CPU,
 * plain loops over strided views: forward and backward (and, further down, the nearest 2× upsampling and the
 * k×k max pool).
 *
 * Maths (the same as kernels/pool.cu, bit for bit; torch reference in yolov9c/ops/pool.py):
 *   forward   out[b,c,y,x] = 0.25·(((in[y,x] + in[y,x+1]) + in[y+1,x]) + in[y+1,x+1])        out (H-1, W-1)
 *   backward  gin[b,c,y,x] = 0.25·(((g[y-1,x-1] + g[y-1,x]) + g[y,x-1]) + g[y,x])            gin (H, W)
 *             with g = 0 outside (H-1, W-1)
 * Float32 sums in that order (row-major over the window, as torch's CPU float32 kernel: equal bit for bit),
 * one rounding to the storage dtype at the end. Float32 rather than the float64 of the other references: the
 * float32 order is the op's definition (four adds; the kernel follows it exactly), so this is the exact twin.
 * Loops run channels innermost when the channel stride is 1 (channels-last), else x innermost.
 * Test: python -m pytest -q tests/ops/test_pool.py
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "half.h"
#include "view4_ref.h"
#include "yv_refs.h"

/* dst (Hd, Wd) = scale · the 2×2 window sums of src (Hs, Ws): window (y, x) starts at (st·y + o, st·x + o);
 * avg pool: st 1, o 0 (forward) or -1 (backward), scale 0.25; nearest 2× upsampling's backward: st 2, o 0,
 * scale 1 (exact: the plain sum). */
typedef struct pool_geom {
    int64_t B, C, Hs, Ws, Hd, Wd;
    int o, st;
    float scale;
} pool_geom;

static inline float at(const yv_view4 *s, const pool_geom *g, int64_t b, int64_t c, int64_t y, int64_t x)
{
    if (y < 0 || y >= g->Hs || x < 0 || x >= g->Ws)
        return 0.0f;
    return yv_view_load(s, b * s->stride[0] + c * s->stride[1] + y * s->stride[2] + x * s->stride[3]);
}

static inline void one(const yv_view4 *s, const yv_view4 *d, const pool_geom *g, int64_t b, int64_t c, int64_t y,
                       int64_t x)
{
    int64_t sy = g->st * y + g->o, sx = g->st * x + g->o;
    float sum = ((at(s, g, b, c, sy, sx) + at(s, g, b, c, sy, sx + 1)) + at(s, g, b, c, sy + 1, sx))
                + at(s, g, b, c, sy + 1, sx + 1);
    yv_view_store(d, b * d->stride[0] + c * d->stride[1] + y * d->stride[2] + x * d->stride[3], sum * g->scale);
}

/* Channel stride 1 in both: all C channels of one output pixel, the four source pixels' offsets computed once
 * (a window corner outside src reads zeros); dtype a constant after inlining, so each loop is one type's. */
static inline void pixel(const yv_view4 *s, const yv_view4 *d, const pool_geom *g, yv_dtype dt, int64_t b,
                         int64_t y, int64_t x)
{
    int64_t off[4];
    int ok[4];
    for (int k = 0; k < 4; k++) {
        int64_t sy = g->st * y + g->o + k / 2, sx = g->st * x + g->o + k % 2;
        ok[k] = sy >= 0 && sy < g->Hs && sx >= 0 && sx < g->Ws;
        off[k] = ok[k] ? b * s->stride[0] + sy * s->stride[2] + sx * s->stride[3] : 0;
    }
    int64_t o = b * d->stride[0] + y * d->stride[2] + x * d->stride[3];
    yv_view4 sv = *s, dv = *d;
    sv.dtype = dv.dtype = dt;
    for (int64_t c = 0; c < g->C; c++) {
        float v[4];
        for (int k = 0; k < 4; k++)
            v[k] = ok[k] ? yv_view_load(&sv, off[k] + c) : 0.0f;
        yv_view_store(&dv, o + c, (((v[0] + v[1]) + v[2]) + v[3]) * g->scale);   /* k = 2·dy + dx: row-major */
    }
}

static void pixels(const yv_view4 *s, const yv_view4 *d, const pool_geom *g, yv_dtype dt)
{
    for (int64_t b = 0; b < g->B; b++)
        for (int64_t y = 0; y < g->Hd; y++)
            for (int64_t x = 0; x < g->Wd; x++)
                pixel(s, d, g, dt, b, y, x);
}

static void window_sum(const yv_view4 *s, const yv_view4 *d, const pool_geom *g)
{
    if (s->stride[1] == 1 && d->stride[1] == 1) {
        if (s->dtype == YV_FLOAT16)
            pixels(s, d, g, YV_FLOAT16);
        else if (s->dtype == YV_BFLOAT16)
            pixels(s, d, g, YV_BFLOAT16);
        else
            pixels(s, d, g, YV_FLOAT32);
        return;
    }
    for (int64_t b = 0; b < g->B; b++)
        for (int64_t c = 0; c < g->C; c++)
            for (int64_t y = 0; y < g->Hd; y++)
                for (int64_t x = 0; x < g->Wd; x++)
                    one(s, d, g, b, c, y, x);
}

int yv_avg_pool2x2_forward_ref(int64_t B, int64_t C, int64_t H, int64_t W, yv_view4 in, yv_view4 out)
{
    pool_geom g = {B, C, H, W, H - 1, W - 1, 0, 1, 0.25f};
    window_sum(&in, &out, &g);
    return 0;
}

int yv_avg_pool2x2_backward_ref(int64_t B, int64_t C, int64_t H, int64_t W, yv_view4 grad_out, yv_view4 grad_in)
{
    pool_geom g = {B, C, H - 1, W - 1, H, W, -1, 1, 0.25f};
    window_sum(&grad_out, &grad_in, &g);
    return 0;
}

/* ---- upsample_nearest2x: nn.Upsample(scale_factor=2, mode='nearest') (F.interpolate to twice the size) ----
 * Maths (the same as kernels/pool.cu, bit for bit; torch reference in yolov9c/ops/pool.py):
 *   forward   out[b,c,y,x] = in[b,c,y/2,x/2]                                                   out (2H, 2W)
 *             (the element's own bits: a copy)
 *   backward  gin[b,c,i,j] = ((g[2i,2j] + g[2i,2j+1]) + g[2i+1,2j]) + g[2i+1,2j+1]              gin (H, W)
 *             float32 in that (row-major) order, rounded once to the storage dtype: torch's CPU
 *             upsample_nearest2d_backward in float32, float16 and bfloat16 bit for bit (the window sum above
 *             with st 2, scale 1).
 */
int yv_upsample_nearest2x_forward_ref(int64_t B, int64_t C, int64_t H, int64_t W, yv_view4 in, yv_view4 out)
{
    size_t es = in.dtype == YV_FLOAT32 ? 4 : 2;
    int cl = in.stride[1] == 1 && out.stride[1] == 1;   /* a pixel's C channels are one run of bytes */
    for (int64_t b = 0; b < B; b++)
        for (int64_t c = 0; c < (cl ? 1 : C); c++)
            for (int64_t y = 0; y < 2 * H; y++)
                for (int64_t x = 0; x < 2 * W; x++) {
                    const char *src = (const char *)in.data
                                      + (size_t)(b * in.stride[0] + c * in.stride[1] + (y / 2) * in.stride[2]
                                                 + (x / 2) * in.stride[3]) * es;
                    char *dst = (char *)out.data
                                + (size_t)(b * out.stride[0] + c * out.stride[1] + y * out.stride[2]
                                           + x * out.stride[3]) * es;
                    memcpy(dst, src, (cl ? (size_t)C : 1) * es);
                }
    return 0;
}

int yv_upsample_nearest2x_backward_ref(int64_t B, int64_t C, int64_t H, int64_t W, yv_view4 grad_out,
                                       yv_view4 grad_in)
{
    pool_geom g = {B, C, 2 * H, 2 * W, H, W, 0, 2, 1.0f};
    window_sum(&grad_out, &grad_in, &g);
    return 0;
}

/* ---- max_pool2d: F.max_pool2d(x, k, s, p) (dilation 1, floor mode), forward and backward --------------
 * Maths (the same as kernels/pool.cu, bit for bit; torch reference in yolov9c/ops/pool.py):
 *   window (oy, ox) = rows oy·s-p .. oy·s-p+k-1, columns ox·s-p .. ox·s-p+k-1, cut to the image (the padding
 *   is -inf: never picked; every window keeps >= 1 element since p <= k/2)
 *   argmax: scan the window row-major from its first element, taking v when v > best or v is NaN (torch's
 *   rule: the first maximum; a NaN window picks its last NaN)
 *   forward   out[oy,ox] = x at the argmax (the element itself: exact)
 *   backward  gin[y,x] = Σ g[oy,ox] over the windows whose argmax is (y, x), in row-major (oy, ox) order, in
 *             float32 (torch's scatter order: float32 equal bit for bit), rounded once
 * The backward runs the kernels' two phases through the caller's uint8 scratch `index` (the output's shape):
 * 1. index[oy,ox] = each window's argmax dy·k + dx (k·k <= 255); 2. a gather: each input element adds the g of
 * the <= ceil(k/s)² covering windows whose index names it. Needs x and g only, no atomics, deterministic.
 */
typedef struct max_geom {
    int64_t B, C, H, W, Ho, Wo;
    int k, s, p;
} max_geom;

static inline int64_t max_off(const yv_view4 *v, int64_t b, int64_t c, int64_t y, int64_t x)
{
    return b * v->stride[0] + c * v->stride[1] + y * v->stride[2] + x * v->stride[3];
}

/* The argmax of window (oy, ox) of channel (b, c) as a window-relative row-major index dy·k + dx; *val: its
 * value. */
static int window_argmax(const yv_view4 *x, const max_geom *g, int64_t b, int64_t c, int64_t oy, int64_t ox,
                         float *val)
{
    int64_t y0 = oy * g->s - g->p, x0 = ox * g->s - g->p;
    int best = -1;
    float m = 0.0f;
    for (int dy = 0; dy < g->k; dy++) {
        int64_t y = y0 + dy;
        if (y < 0 || y >= g->H)
            continue;
        for (int dx = 0; dx < g->k; dx++) {
            int64_t xx = x0 + dx;
            if (xx < 0 || xx >= g->W)
                continue;
            float v = yv_view_load(x, max_off(x, b, c, y, xx));
            if (best < 0 || v > m || v != v) {
                m = v;
                best = dy * g->k + dx;
            }
        }
    }
    *val = m;
    return best;
}

/* [*lo, *hi]: the output rows (or columns) whose window covers input row i (n outputs). */
static void covering(int64_t i, const max_geom *g, int64_t n, int64_t *lo, int64_t *hi)
{
    int64_t a = i + g->p - g->k + 1, b = i + g->p;
    *lo = a <= 0 ? 0 : (a + g->s - 1) / g->s;
    *hi = b / g->s < n - 1 ? b / g->s : n - 1;
}

int yv_max_pool2d_forward_ref(int64_t B, int64_t C, int64_t H, int64_t W, int k, int s, int p, yv_view4 in,
                              yv_view4 out)
{
    max_geom g = {B, C, H, W, (H + 2 * p - k) / s + 1, (W + 2 * p - k) / s + 1, k, s, p};
    for (int64_t b = 0; b < B; b++)
        for (int64_t c = 0; c < C; c++)
            for (int64_t oy = 0; oy < g.Ho; oy++)
                for (int64_t ox = 0; ox < g.Wo; ox++) {
                    float v;
                    int a = window_argmax(&in, &g, b, c, oy, ox, &v);
                    int64_t y = oy * s - p + a / k, x = ox * s - p + a % k;
                    /* the element's own bits (a NaN keeps its payload, -0.0 its sign) */
                    size_t es = in.dtype == YV_FLOAT32 ? 4 : 2;
                    const char *src = (const char *)in.data + (size_t)max_off(&in, b, c, y, x) * es;
                    char *dst = (char *)out.data + (size_t)max_off(&out, b, c, oy, ox) * es;
                    for (size_t i = 0; i < es; i++)
                        dst[i] = src[i];
                }
    return 0;
}

/* The window index of (b, c, oy, ox) in the uint8 view ix. */
static inline uint8_t *index_at(const yv_view4 *ix, int64_t b, int64_t c, int64_t oy, int64_t ox)
{
    return (uint8_t *)ix->data + max_off(ix, b, c, oy, ox);
}

int yv_max_pool2d_backward_ref(int64_t B, int64_t C, int64_t H, int64_t W, int k, int s, int p, yv_view4 in,
                               yv_view4 grad_out, yv_view4 index, yv_view4 grad_in)
{
    max_geom g = {B, C, H, W, (H + 2 * p - k) / s + 1, (W + 2 * p - k) / s + 1, k, s, p};
    for (int64_t b = 0; b < B; b++)   /* phase 1: the window argmaxes */
        for (int64_t c = 0; c < C; c++)
            for (int64_t oy = 0; oy < g.Ho; oy++)
                for (int64_t ox = 0; ox < g.Wo; ox++) {
                    float v;
                    *index_at(&index, b, c, oy, ox) = (uint8_t)window_argmax(&in, &g, b, c, oy, ox, &v);
                }
    for (int64_t b = 0; b < B; b++)   /* phase 2: the gather, covering windows in row-major order */
        for (int64_t c = 0; c < C; c++)
            for (int64_t y = 0; y < H; y++) {
                int64_t oy0, oy1;
                covering(y, &g, g.Ho, &oy0, &oy1);
                for (int64_t x = 0; x < W; x++) {
                    int64_t ox0, ox1;
                    covering(x, &g, g.Wo, &ox0, &ox1);
                    float acc = 0.0f;
                    for (int64_t oy = oy0; oy <= oy1; oy++)
                        for (int64_t ox = ox0; ox <= ox1; ox++)
                            if (*index_at(&index, b, c, oy, ox) == (y - (oy * s - p)) * k + (x - (ox * s - p)))
                                acc += yv_view_load(&grad_out, max_off(&grad_out, b, c, oy, ox));
                    yv_view_store(&grad_in, max_off(&grad_in, b, c, y, x), acc);
                }
            }
    return 0;
}
