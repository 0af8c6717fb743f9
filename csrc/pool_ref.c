/* pool_ref.c — the 2×2 stride-1 average pool (ADown/AConv's F.avg_pool2d(x, 2, 1, 0, False, True)) on the CPU,
 * plain loops over strided views: forward and backward.
 *
 * Maths (the same as kernels/pool.cu, bit for bit; torch reference in yolov9c/ops/pool.py):
 *   forward   out[b,c,y,x] = 0.25·(((in[y,x] + in[y,x+1]) + in[y+1,x]) + in[y+1,x+1])        out (H-1, W-1)
 *   backward  gin[b,c,y,x] = 0.25·(((g[y-1,x-1] + g[y-1,x]) + g[y,x-1]) + g[y,x])            gin (H, W)
 *             with g = 0 outside (H-1, W-1)
 * Float32 sums in that order (row-major over the window, as torch's CPU float32 kernel: equal bit for bit),
 * one rounding to the storage dtype at the end. Float32 rather than the float64 of the other references: the
 * float32 order is the op's definition (four adds; the kernel follows it exactly), so this is the exact twin.
 * Loops run channels innermost when the channel stride is 1 (channels-last), else x innermost.
 * Test: python -m pytest -q tests/test_pool.py
 */
#include <stddef.h>

#include "half.h"
#include "view4_ref.h"
#include "yv_refs.h"

/* dst (Hd, Wd) = 0.25 · window sums of src (Hs, Ws) with window origin offset o (0 forward, -1 backward). */
typedef struct pool_geom {
    int64_t B, C, Hs, Ws, Hd, Wd;
    int o;
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
    int64_t sy = y + g->o, sx = x + g->o;
    float sum = ((at(s, g, b, c, sy, sx) + at(s, g, b, c, sy, sx + 1)) + at(s, g, b, c, sy + 1, sx))
                + at(s, g, b, c, sy + 1, sx + 1);
    yv_view_store(d, b * d->stride[0] + c * d->stride[1] + y * d->stride[2] + x * d->stride[3], sum * 0.25f);
}

/* Channel stride 1 in both: all C channels of one output pixel, the four source pixels' offsets computed once
 * (a window corner outside src reads zeros); dtype a constant after inlining, so each loop is one type's. */
static inline void pixel(const yv_view4 *s, const yv_view4 *d, const pool_geom *g, yv_dtype dt, int64_t b,
                         int64_t y, int64_t x)
{
    int64_t off[4];
    int ok[4];
    for (int k = 0; k < 4; k++) {
        int64_t sy = y + g->o + k / 2, sx = x + g->o + k % 2;
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
        yv_view_store(&dv, o + c, (((v[0] + v[1]) + v[2]) + v[3]) * 0.25f);   /* k = 2·dy + dx: row-major order */
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
    pool_geom g = {B, C, H, W, H - 1, W - 1, 0};
    window_sum(&in, &out, &g);
    return 0;
}

int yv_avg_pool2x2_backward_ref(int64_t B, int64_t C, int64_t H, int64_t W, yv_view4 grad_out, yv_view4 grad_in)
{
    pool_geom g = {B, C, H - 1, W - 1, H, W, -1};
    window_sum(&grad_out, &grad_in, &g);
    return 0;
}
