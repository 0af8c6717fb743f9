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
 * Cost: sort O(n log n); suppression O(sum over classes of n_class * kept_class): boxes are grouped by
 * class first, and the kept boxes are put back in global score order at the end.
 * Test: python -m pytest -q tests/ops/test_nms.py
 */
#include <stdlib.h>
#include <string.h>

#include "half.h"
#include "yv_refs.h"

#define ALIGN_UP(x) (((x) + 63u) & ~(size_t)63u)

/* One box in the class-then-score order: class, then the sort key of score_key below. */
typedef struct nms_item {
    int64_t cls;
    uint64_t key;   /* high word ~score_key (ascending = score descending), low word the index */
} nms_item;

/* Workspace layout: items[n] | sorted boxes float[n][4] | areas float[n] | kept keys u64[n] | removed u8[n]. */
#define WS_ITEMS(n) 0
#define WS_BOXES(n) ALIGN_UP((n) * sizeof(nms_item))
#define WS_AREAS(n) (WS_BOXES(n) + ALIGN_UP((n) * 16))
#define WS_KEPT(n) (WS_AREAS(n) + ALIGN_UP((n) * 4))
#define WS_REMOVED(n) (WS_KEPT(n) + ALIGN_UP((n) * 8))

size_t yv_nms_workspace_size_ref(int64_t n)
{
    size_t un = (size_t)(n > 0 ? n : 0);
    return WS_REMOVED(un) + ALIGN_UP(un);
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

static int cmp_item(const void *a, const void *b)
{
    const nms_item *x = (const nms_item *)a, *y = (const nms_item *)b;
    if (x->cls != y->cls)
        return x->cls < y->cls ? -1 : 1;
    return (x->key > y->key) - (x->key < y->key);
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

static inline float box_area(const float *b)
{
    return (b[2] - b[0]) * (b[3] - b[1]);
}

/* IoU(a, b) with a the higher-ranked box; areas precomputed with box_area (same value as inline). */
static inline float iou(const float *a, const float *b, float area_a, float area_b)
{
    float ix1 = a[0] > b[0] ? a[0] : b[0];
    float iy1 = a[1] > b[1] ? a[1] : b[1];
    float ix2 = a[2] < b[2] ? a[2] : b[2];
    float iy2 = a[3] < b[3] ? a[3] : b[3];
    float iw = ix2 - ix1, ih = iy2 - iy1;
    iw = iw > 0.0f ? iw : 0.0f;
    ih = ih > 0.0f ? ih : 0.0f;
    float inter = iw * ih;
    return inter / ((area_a + area_b) - inter);
}

int yv_nms_forward_ref(const void *boxes, const void *scores, yv_dtype dtype, const void *classes,
                       yv_dtype cls_dtype, int64_t n, float iou_thres, void *workspace, int64_t *keep,
                       int64_t *count)
{
    size_t un = (size_t)n;
    char *ws = (char *)workspace;
    nms_item *items = (nms_item *)(ws + WS_ITEMS(un));
    float *sboxes = (float *)(ws + WS_BOXES(un));
    float *areas = (float *)(ws + WS_AREAS(un));
    uint64_t *kept_keys = (uint64_t *)(ws + WS_KEPT(un));
    uint8_t *removed = (uint8_t *)(ws + WS_REMOVED(un));

    /* Group by class, score order inside a class: boxes of different classes never interact, so the
     * suppression loop only scans its own class. The binding guarantees n < 2^32 (index in 32 bits). */
    for (int64_t i = 0; i < n; i++) {
        if (classes == NULL)
            items[i].cls = 0;
        else if (cls_dtype == YV_INT32)
            items[i].cls = ((const int32_t *)classes)[i];
        else
            items[i].cls = ((const int64_t *)classes)[i];
        items[i].key = ((uint64_t)(~score_key(load_float(scores, dtype, i))) << 32) | (uint64_t)i;
    }
    qsort(items, un, sizeof(nms_item), cmp_item);
    for (int64_t r = 0; r < n; r++) {
        int64_t i = (int64_t)(items[r].key & 0xffffffffu);
        for (int k = 0; k < 4; k++)
            sboxes[4 * r + k] = load_float(boxes, dtype, 4 * i + k);
        areas[r] = box_area(sboxes + 4 * r);
        removed[r] = 0;
    }

    int64_t kept = 0;
    for (int64_t start = 0, end; start < n; start = end) {
        for (end = start + 1; end < n && items[end].cls == items[start].cls; end++)
            ;
        for (int64_t r = start; r < end; r++) {
            if (removed[r])
                continue;
            kept_keys[kept++] = items[r].key;
            const float *a = sboxes + 4 * r;
            for (int64_t q = r + 1; q < end; q++) {
                if (!removed[q] && iou(a, sboxes + 4 * q, areas[r], areas[q]) > iou_thres)
                    removed[q] = 1;
            }
        }
    }
    /* Back to one global order: score descending, ties by lower index. */
    qsort(kept_keys, (size_t)kept, sizeof(uint64_t), cmp_u64);
    for (int64_t k = 0; k < kept; k++)
        keep[k] = (int64_t)(kept_keys[k] & 0xffffffffu);
    count[0] = kept;
    return 0;
}
