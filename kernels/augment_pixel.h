/* augment_pixel.h — the per-output-pixel function of the augment op, shared word for word by the C reference
 * (csrc/augment_ref.c, gcc with -ffp-contract=off) and the CUDA kernel (kernels/augment.cu, where the YA_*
 * macros are round-to-nearest intrinsics, so nvcc fuses no multiply into an add): both compute the same bytes.
 *
 * One output pixel (x, y) of image b, H x W, from the host-drawn plan (yolov9c/data/augment_plan.py):
 *   1. flips: (sx, sy) = (fliplr ? W-1-x : x, flipud ? H-1-y : y), the pixel before the flips;
 *   2. per layer l (1, or 2 with mixup): (u, v) = inverse perspective map m_l (3x3 float32, row-major) of
 *      (sx, sy); bilinear over the 4 canvas pixels around (u, v), each read from the tile covering it or
 *      grey 114 (the mosaic canvas and cv2's BORDER_CONSTANT 114 alike), rounded half-even to uint8
 *      (OpenCV 5's warpAffine/warpPerspective INTER_LINEAR: float coordinates and weights); copy-paste: a
 *      canvas pixel (cx, cy) whose mirror (m - cx, cy) lies in one of the layer's pasted polygons reads the
 *      mirror instead (ya_paste_column);
 *   3. mixup: round(p0 * r + p1 * (1 - r)) in float32 (cv2.addWeighted);
 *   4. HSV gain: OpenCV's 8-bit BGR->HSV (integer, exact), the three 256-entry LUTs, HSV->BGR in float32
 *      on 0..1 values (1 - s h as one fma), x 255 truncated: OpenCV 5.1's result on every triple tested.
 * Tile t of a layer: int64 [src offset, h, w, x1, y1, x2, y2, padw, padh]: canvas pixels x1 <= cx < x2,
 * y1 <= cy < y2 read source pixel (cx - padw, cy - padh) of the h x w x 3 BGR image at src + offset.
 * Pasted polygons of a layer: int32 list of L values [n, m, then n times: k, x0, y0, x1, y1 (the polygon's
 * bounding rectangle, end exclusive), k vertices (x, y)]; m = canvas width - 1 (column c mirrors to m - c).
 * A polygon holds a pixel inside it by the even-odd rule or on an edge as OpenCV's 8-connected line draws it
 * (Bresenham from the edge's left end): cv2.drawContours' fill, pixel for pixel on polygons inside the canvas
 * (OpenCV clips an edge that leaves it, which can shift that edge's pixels).
 * Every read is checked against src_n and L (a bad plan reads grey or pastes nothing, never out of bounds).
 * Test: python -m pytest -q tests/ops/test_augment.py
 */
#ifndef YV_AUGMENT_PIXEL_H
#define YV_AUGMENT_PIXEL_H

#include <stdint.h>

#ifdef __CUDACC__
#define YA_HD static __device__ __forceinline__
#define YA_MUL(a, b) __fmul_rn((a), (b))
#define YA_ADD(a, b) __fadd_rn((a), (b))
#define YA_SUB(a, b) __fsub_rn((a), (b))
#define YA_DIV(a, b) __fdiv_rn((a), (b))
#define YA_FMA(a, b, c) __fmaf_rn((a), (b), (c))
#define YA_FLOOR(a) floorf(a)
#define YA_RINT(a) ((int)__float2int_rn(a))
#else
#include <math.h>
#define YA_HD static inline
#define YA_MUL(a, b) ((a) * (b))
#define YA_ADD(a, b) ((a) + (b))
#define YA_SUB(a, b) ((a) - (b))
#define YA_DIV(a, b) ((a) / (b))
#define YA_FMA(a, b, c) fmaf((a), (b), (c))
#define YA_FLOOR(a) floorf(a)
#define YA_RINT(a) ((int)lrintf(a))
#endif

#define YA_TILE 9      /* int64 per tile */
#define YA_TILES 4     /* tiles per layer */
#define YA_LAYERS 2    /* layers per output image (the second one only with mixup) */
#define YA_GREY 114
#define YA_MAX_SIDE ((int64_t)1 << 20)  /* a source tile's largest side */

#define YA_PASTE_HEAD 2 /* [polygon count n, mirror m] */
#define YA_POLY_HEAD 5  /* [vertex count k, x0, y0, x1, y1] */
#define YA_COORD_MAX ((int64_t)1 << 29) /* coordinates clamped to +-2^29: |2 cross| < 2^63 on any plan */

YA_HD int64_t ya_coord(int64_t c)
{
    return c > YA_COORD_MAX ? YA_COORD_MAX : (c < -YA_COORD_MAX ? -YA_COORD_MAX : c);
}

/* Whether integer point (px, py) is in polygon v[0..2k) (the rule at the top of this file); exact integers. */
YA_HD int ya_in_polygon(const int32_t *v, int64_t k, int64_t px, int64_t py)
{
    int inside = 0;
    px = ya_coord(px);
    py = ya_coord(py);
    int64_t x1 = ya_coord(v[2 * k - 2]), y1 = ya_coord(v[2 * k - 1]);
    for (int64_t i = 0; i < k; i++) {
        int64_t x2 = ya_coord(v[2 * i]), y2 = ya_coord(v[2 * i + 1]);
        int64_t dx = x2 - x1, dy = y2 - y1;
        int64_t adx = dx < 0 ? -dx : dx, ady = dy < 0 ? -dy : dy, a = adx > ady ? adx : ady;
        /* cross / dy: the signed distance along x from (px, py) to the edge's line; -cross / dx: along y */
        int64_t cross = dx * (py - y1) - dy * (px - x1);
        /* the line's pixel at this step of its long axis: 2 x (the short-axis offset from the line), signed
           so that a tie (a half pixel) rounds toward the line's left end, as OpenCV's Bresenham walk does */
        int64_t off = (adx >= ady ? -2 : 2) * (dy < 0 ? -cross : cross);
        int in_long = adx >= ady ? (px >= (x1 < x2 ? x1 : x2) && px <= (x1 < x2 ? x2 : x1))
                                 : (py >= (y1 < y2 ? y1 : y2) && py <= (y1 < y2 ? y2 : y1));
        if (in_long && (a ? off > -a && off <= a : px == x1 && py == y1))
            return 1;
        if ((y1 > py) != (y2 > py) && (cross > 0) == (dy > 0)) /* the edge crosses the ray x > px */
            inside ^= 1;
        x1 = x2;
        y1 = y2;
    }
    return inside;
}

/* The column canvas pixel (cx, cy) reads after copy-paste: m - cx when (m - cx, cy) is in a pasted polygon of
 * the layer's list ps[0..L), else cx. A list that does not fit in L ends the walk (nothing more is pasted). */
YA_HD int64_t ya_paste_column(const int32_t *ps, int64_t L, int64_t cx, int64_t cy)
{
    if (L < YA_PASTE_HEAD)
        return cx;
    int64_t n = ps[0], sx = (int64_t)ps[1] - cx;
    int64_t at = YA_PASTE_HEAD;
    for (int64_t i = 0; i < n && at <= L - YA_POLY_HEAD; i++) {
        const int32_t *q = ps + at;
        int64_t k = q[0];
        if (k < 3 || k > (L - at - YA_POLY_HEAD) / 2)
            break;
        if (sx >= q[1] && sx < q[3] && cy >= q[2] && cy < q[4] && ya_in_polygon(q + YA_POLY_HEAD, k, sx, cy))
            return sx;
        at += YA_POLY_HEAD + 2 * k;
    }
    return cx;
}

/* Canvas pixel (cx, cy) of one layer, BGR into p[3]; paste/L: the layer's pasted polygons. */
YA_HD void ya_fetch(const uint8_t *src, int64_t src_n, const int64_t *tiles, const int32_t *paste, int64_t L,
                    int64_t cx, int64_t cy, float p[3])
{
    cx = ya_paste_column(paste, L, cx, cy);
    for (int t = 0; t < YA_TILES; t++) {
        const int64_t *q = tiles + t * YA_TILE;
        if (cx >= q[3] && cx < q[5] && cy >= q[4] && cy < q[6]) {
            int64_t px = cx - q[7], py = cy - q[8];
            /* overflow-free on any plan (the CUDA path reads the plan unchecked): sides capped, so the offset
               within the tile fits; the tile's start compared before it is added */
            if (px < 0 || py < 0 || px >= q[2] || py >= q[1] || q[1] > YA_MAX_SIDE || q[2] > YA_MAX_SIDE
                || q[0] < 0 || q[0] > src_n)
                break;
            int64_t off = (py * q[2] + px) * 3;
            if (off > src_n - q[0] - 3)
                break;
            int64_t at = q[0] + off;
            p[0] = (float)src[at];
            p[1] = (float)src[at + 1];
            p[2] = (float)src[at + 2];
            return;
        }
    }
    p[0] = p[1] = p[2] = (float)YA_GREY;
}

/* Step 2 for one layer at (sx, sy): BGR uint8 into out[3]. */
YA_HD void ya_warp(const uint8_t *src, int64_t src_n, const int64_t *tiles, const int32_t *paste, int64_t L,
                   const float *m, float sx, float sy, int out[3])
{
    float X = YA_ADD(YA_ADD(YA_MUL(m[0], sx), YA_MUL(m[1], sy)), m[2]);
    float Y = YA_ADD(YA_ADD(YA_MUL(m[3], sx), YA_MUL(m[4], sy)), m[5]);
    float Z = YA_ADD(YA_ADD(YA_MUL(m[6], sx), YA_MUL(m[7], sy)), m[8]);
    float u = YA_DIV(X, Z), v = YA_DIV(Y, Z);
    /* far outside (or a degenerate Z): only grey around; also keeps the int64 casts in range */
    if (!(u > -4.0f && u < 1.0e7f && v > -4.0f && v < 1.0e7f)) {
        out[0] = out[1] = out[2] = YA_GREY;
        return;
    }
    float u0 = YA_FLOOR(u), v0 = YA_FLOOR(v);
    float ax = YA_SUB(u, u0), ay = YA_SUB(v, v0);
    float bx = YA_SUB(1.0f, ax), by = YA_SUB(1.0f, ay);
    int64_t cx = (int64_t)u0, cy = (int64_t)v0;
    float p00[3], p01[3], p10[3], p11[3];
    ya_fetch(src, src_n, tiles, paste, L, cx, cy, p00);
    ya_fetch(src, src_n, tiles, paste, L, cx + 1, cy, p01);
    ya_fetch(src, src_n, tiles, paste, L, cx, cy + 1, p10);
    ya_fetch(src, src_n, tiles, paste, L, cx + 1, cy + 1, p11);
    for (int c = 0; c < 3; c++) {
        float top = YA_ADD(YA_MUL(p00[c], bx), YA_MUL(p01[c], ax));
        float bot = YA_ADD(YA_MUL(p10[c], bx), YA_MUL(p11[c], ax));
        int q = YA_RINT(YA_ADD(YA_MUL(top, by), YA_MUL(bot, ay)));
        out[c] = q < 0 ? 0 : (q > 255 ? 255 : q);
    }
}

/* OpenCV's 8-bit BGR->HSV divisor tables (hue range 180): sdiv[i] = round(255 * 4096 / i),
 * hdiv[i] = round(180 * 4096 / (6 i)), 0 at i = 0. */
YA_HD void ya_hsv_tables_entry(int i, int *sdiv, int *hdiv)
{
    sdiv[i] = i ? (int)(1044480.0 / (double)i + 0.5) : 0;
    hdiv[i] = i ? (int)(122880.0 / (double)i + 0.5) : 0;
}

/* Step 4: BGR p[3] in place through the LUTs lut[0..767] (hue, saturation, value). */
YA_HD void ya_hsv(int p[3], const uint8_t *lut, const int *sdiv, const int *hdiv)
{
    int b = p[0], g = p[1], r = p[2];
    int v = b > g ? b : g;
    v = v > r ? v : r;
    int mn = b < g ? b : g;
    mn = mn < r ? mn : r;
    int diff = v - mn;
    int s = (diff * sdiv[v] + (1 << 11)) >> 12;
    int h = v == r ? g - b : (v == g ? b - r + 2 * diff : r - g + 4 * diff);
    h = (h * hdiv[diff] + (1 << 11)) >> 12;
    if (h < 0)
        h += 180;
    h = lut[h];
    s = lut[256 + s];
    v = lut[512 + v];
    float V = YA_MUL((float)v, 1.0f / 255.0f);
    float tab[4];
    int k = 0;
    if (s == 0) {
        tab[0] = tab[1] = tab[2] = tab[3] = V;
    } else {
        float H = YA_MUL((float)h, 6.0f / 180.0f);
        float S = YA_MUL((float)s, 1.0f / 255.0f);
        float sector = YA_FLOOR(H);
        float f = YA_SUB(H, sector);
        k = (int)sector;
        if (k < 0 || k >= 6) {
            k = 0;
            f = 0.0f;
        }
        tab[0] = V;
        tab[1] = YA_MUL(V, YA_SUB(1.0f, S));
        /* 1 - S f as one fused multiply-add, as OpenCV 5.1's SIMD path computes it */
        tab[2] = YA_MUL(V, YA_FMA(-S, f, 1.0f));
        tab[3] = YA_MUL(V, YA_FMA(-S, YA_SUB(1.0f, f), 1.0f));
    }
    /* (b, g, r) picks per hue sector; scaled back to 0..255 and truncated */
    const int pick[6][3] = {{1, 3, 0}, {1, 0, 2}, {3, 0, 1}, {0, 2, 1}, {0, 1, 3}, {2, 1, 0}};
    for (int c = 0; c < 3; c++) {
        int q = (int)YA_MUL(tab[pick[k][c]], 255.0f);
        p[c] = q < 0 ? 0 : (q > 255 ? 255 : q);
    }
}

/* Steps 1-4 for output pixel (x, y) of one image: RGB into rgb[3]. Per-image arguments: tiles (2, 4, 9),
 * m (2, 9), mix (2,) = (r, 1 - r), flags (4,) = (layers, flipud, fliplr, hsv), lut (3, 256), paste (2, L). */
YA_HD void ya_pixel(const uint8_t *src, int64_t src_n, const int64_t *tiles, const float *m, const float *mix,
                    const int64_t *flags, const uint8_t *lut, const int32_t *paste, int64_t L, const int *sdiv,
                    const int *hdiv, int64_t H, int64_t W, int64_t x, int64_t y, uint8_t rgb[3])
{
    float sx = (float)(flags[2] ? W - 1 - x : x);
    float sy = (float)(flags[1] ? H - 1 - y : y);
    int p[3];
    ya_warp(src, src_n, tiles, paste, L, m, sx, sy, p);
    if (flags[0] == 2) {
        int p2[3];
        ya_warp(src, src_n, tiles + YA_TILES * YA_TILE, paste + L, L, m + 9, sx, sy, p2);
        for (int c = 0; c < 3; c++) {
            int q = YA_RINT(YA_ADD(YA_MUL((float)p[c], mix[0]), YA_MUL((float)p2[c], mix[1])));
            p[c] = q < 0 ? 0 : (q > 255 ? 255 : q);
        }
    }
    if (flags[3])
        ya_hsv(p, lut, sdiv, hdiv);
    rgb[0] = (uint8_t)p[2];
    rgb[1] = (uint8_t)p[1];
    rgb[2] = (uint8_t)p[0];
}

#endif /* YV_AUGMENT_PIXEL_H */
