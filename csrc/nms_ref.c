/* nms_ref.c — class-aware greedy non-maximum suppression, plain C on the CPU.
 *
 * Maths (identical in kernels/nms.cu and yolov9c/ops/nms.py::nms_reference, so that kept sets agree
 * bit for bit):
 *   order: score descending, equal scores by lower index first; NaN scores rank above +inf; -0 == +0.
 *   walk boxes in that order; a box not yet suppressed is kept and suppresses every later box b of its
 *   class with IoU(kept, b) > iou_thres, where, all in float32 and in this operation order:
 *       ix1 = x1a > x1b ? x1a : x1b      ix2 = x2a < x2b ? x2a : x2b     (same for y)
 *       iw  = ix2 - ix1 > 0 ? ix2 - ix1 : 0   (same for ih)
 *       inter = iw * ih;   area = (x2 - x1) * (y2 - y1)
 *       IoU = inter / ((area_a + area_b) - inter)
 *   (compiled with -ffp-contract=off, so no fused multiply-add changes a rounding.)
 * Cost: sort O(n log n); suppression O(n * kept).
 * Test: python -m pytest -q tests/test_nms.py
 */
#include <stdlib.h>
#include <string.h>

#include "half.h"
#include "yv_refs.h"

#define ALIGN_UP(x) (((x) + 63u) & ~(size_t)63u)

/* Workspace layout: sort keys u64[n] | sorted boxes float[n][4] | sorted classes i64[n] | removed u8[n]. */
size_t yv_nms_workspace_size_ref(int64_t n)
{
    size_t un = (size_t)(n > 0 ? n : 0);
    return ALIGN_UP(un * 8) + ALIGN_UP(un * 16) + ALIGN_UP(un * 8) + ALIGN_UP(un);
}

/* Monotone map of a float to u32 (a > b  =>  key(a) > key(b)); NaN above everything, -0 == +0. */
static inline uint32_t score_key(float s)
{
    if (s != s)
        return 0xffffffffu;
    if (s == 0.0f)
        s = 0.0f;
    uint32_t bits;
    memcpy(&bits, &s, sizeof(bits));
    return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static inline float load_float(const void *p, yv_dtype dtype, int64_t i)
{
    if (dtype == YV_FLOAT16)
        return yv_half_to_float(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}

static inline float iou(const float *a, const float *b)
{
    float ix1 = a[0] > b[0] ? a[0] : b[0];
    float iy1 = a[1] > b[1] ? a[1] : b[1];
    float ix2 = a[2] < b[2] ? a[2] : b[2];
    float iy2 = a[3] < b[3] ? a[3] : b[3];
    float iw = ix2 - ix1, ih = iy2 - iy1;
    iw = iw > 0.0f ? iw : 0.0f;
    ih = ih > 0.0f ? ih : 0.0f;
    float inter = iw * ih;
    float area_a = (a[2] - a[0]) * (a[3] - a[1]);
    float area_b = (b[2] - b[0]) * (b[3] - b[1]);
    return inter / ((area_a + area_b) - inter);
}

int yv_nms_forward_ref(const void *boxes, const void *scores, yv_dtype dtype, const void *classes,
                       yv_dtype cls_dtype, int64_t n, float iou_thres, void *workspace, int64_t *keep,
                       int64_t *count)
{
    size_t un = (size_t)n;
    char *ws = (char *)workspace;
    uint64_t *keys = (uint64_t *)ws;
    float *sboxes = (float *)(ws + ALIGN_UP(un * 8));
    int64_t *scls = (int64_t *)(ws + ALIGN_UP(un * 8) + ALIGN_UP(un * 16));
    uint8_t *removed = (uint8_t *)(ws + ALIGN_UP(un * 8) + ALIGN_UP(un * 16) + ALIGN_UP(un * 8));

    /* Sort key: high word = ~score_key (ascending sort = score descending), low word = index (ties by
     * lower index). The binding guarantees n < 2^32. */
    for (int64_t i = 0; i < n; i++)
        keys[i] = ((uint64_t)(~score_key(load_float(scores, dtype, i))) << 32) | (uint64_t)i;
    qsort(keys, un, sizeof(uint64_t), cmp_u64);

    for (int64_t r = 0; r < n; r++) {
        int64_t i = (int64_t)(keys[r] & 0xffffffffu);
        for (int k = 0; k < 4; k++)
            sboxes[4 * r + k] = load_float(boxes, dtype, 4 * i + k);
        if (classes == NULL)
            scls[r] = 0;
        else if (cls_dtype == YV_INT32)
            scls[r] = ((const int32_t *)classes)[i];
        else
            scls[r] = ((const int64_t *)classes)[i];
        removed[r] = 0;
    }

    int64_t kept = 0;
    for (int64_t r = 0; r < n; r++) {
        if (removed[r])
            continue;
        keep[kept++] = (int64_t)(keys[r] & 0xffffffffu);
        const float *a = sboxes + 4 * r;
        int64_t c = scls[r];
        for (int64_t q = r + 1; q < n; q++) {
            if (!removed[q] && scls[q] == c && iou(a, sboxes + 4 * q) > iou_thres)
                removed[q] = 1;
        }
    }
    count[0] = kept;
    return 0;
}
