/* augment_ref.c — the augment op on the CPU: one training batch's pixels from decoded source images and a
 * host-drawn plan (mosaic tiles, copy-paste polygons, inverse warp, mixup ratio, flips, HSV LUTs), plain loops
 * over the output.
 *
 * Maths: kernels/augment_pixel.h (shared with kernels/augment.cu, so both write the same bytes).
 * out (B, 3, H, W) uint8 RGB planes, written (=). The plan's layout is stated in csrc/yv_refs.h.
 * Returns -1 when a tile points outside src or outside its image, or a paste list does not fit its row (the
 * binding raises ValueError).
 * Test: python -m pytest -q tests/ops/test_augment.py
 */
#include "augment_pixel.h"
#include "yv_refs.h"

/* A tile that reads only inside its h x w image and inside src (an empty rectangle reads nothing). */
static int tile_ok(const int64_t *q, int64_t src_n)
{
    if (q[5] <= q[3] || q[6] <= q[4])
        return 1;
    if (q[1] <= 0 || q[2] <= 0 || q[1] > YA_MAX_SIDE || q[2] > YA_MAX_SIDE || q[0] < 0
        || q[1] > (INT64_MAX / 3) / q[2] || q[0] > src_n - q[1] * q[2] * 3)
        return 0;
    return q[3] - q[7] >= 0 && q[4] - q[8] >= 0 && q[5] - q[7] <= q[2] && q[6] - q[8] <= q[1];
}

/* A layer's paste list that fits in its L values, each polygon with >= 3 vertices and a non-empty rectangle. */
static int paste_ok(const int32_t *ps, int64_t L)
{
    if (ps[0] < 0)
        return 0;
    int64_t at = YA_PASTE_HEAD;
    for (int64_t i = 0; i < ps[0]; i++) {
        if (at > L - YA_POLY_HEAD)
            return 0;
        const int32_t *q = ps + at;
        if (q[0] < 3 || q[0] > (L - at - YA_POLY_HEAD) / 2 || q[3] <= q[1] || q[4] <= q[2])
            return 0;
        at += YA_POLY_HEAD + 2 * (int64_t)q[0];
    }
    return 1;
}

int yv_augment_check_ref(int64_t B, const int64_t *tiles, const int64_t *flags, const int32_t *paste, int64_t L,
                         int64_t src_n)
{
    for (int64_t b = 0; b < B; b++) {
        int64_t layers = flags[b * 4];
        if (layers != 1 && layers != 2)
            return -1;
        for (int64_t t = 0; t < layers * YA_TILES; t++)
            if (!tile_ok(tiles + (b * YA_LAYERS * YA_TILES + t) * YA_TILE, src_n))
                return -1;
        for (int64_t l = 0; l < layers; l++)
            if (!paste_ok(paste + (b * YA_LAYERS + l) * L, L))
                return -1;
    }
    return 0;
}

int yv_augment_forward_ref(uint8_t *out, int64_t B, int64_t H, int64_t W, const uint8_t *src, int64_t src_n,
                           const int64_t *tiles, const float *warp, const float *mix, const int64_t *flags,
                           const uint8_t *luts, const int32_t *paste, int64_t L)
{
    if (yv_augment_check_ref(B, tiles, flags, paste, L, src_n) < 0)
        return -1;
    int sdiv[256], hdiv[256];
    for (int i = 0; i < 256; i++)
        ya_hsv_tables_entry(i, sdiv, hdiv);
    int64_t plane = H * W;
    for (int64_t b = 0; b < B; b++) {
        const int64_t *tb = tiles + b * YA_LAYERS * YA_TILES * YA_TILE;
        const float *mb = warp + b * YA_LAYERS * 9;
        uint8_t *ob = out + b * 3 * plane;
        for (int64_t y = 0; y < H; y++)
            for (int64_t x = 0; x < W; x++) {
                uint8_t rgb[3];
                ya_pixel(src, src_n, tb, mb, mix + b * 2, flags + b * 4, luts + b * 768, paste + b * YA_LAYERS * L, L,
                         sdiv, hdiv, H, W, x, y, rgb);
                ob[y * W + x] = rgb[0];
                ob[plane + y * W + x] = rgb[1];
                ob[2 * plane + y * W + x] = rgb[2];
            }
    }
    return 0;
}
