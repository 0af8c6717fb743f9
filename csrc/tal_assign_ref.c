/* tal_assign_ref.c — task-aligned label assignment (TOOD / YOLOv9 TaskAlignedAssigner), plain C on the CPU,
 * without any (B, M, A) array: working memory O(A + M + topk) per image.
 *
 * Maths (the reference is yolov9c/loss/assigner.py; kernels/tal_assign.cu does the same, operation for
 * operation), for image b, box m (class c_m, xyxy g, atan term G_m) and anchor a (centre (x, y), predicted
 * xyxy p, atan term P_a):
 *   inside(m, a) = min(x - g0, y - g1, g2 - x, g3 - y) > 1e-9f                 (min taken left to right)
 *   CIoU(m, a)   float32, in the reference's operation order (bbox_ciou, eps = 1e-7f):
 *       w1 = g2 - g0, h1 = (g3 - g1) + eps, w2 = p2 - p0, h2 = (p3 - p1) + eps
 *       inter = max0(min(g2, p2) - max(g0, p0)) * max0(min(g3, p3) - max(g1, p1))
 *       iou = inter / (((w1*h1 + w2*h2) - inter) + eps)
 *       c2 = (cw*cw + ch*ch) + eps over the enclosing box; rho2 = (dx*dx + dy*dy) / 4 with
 *       dx = ((p0 + p2) - g0) - g2 (same for y)
 *       v = (float)(4/pi^2) * (P_a - G_m)^2, alpha = v / ((v - iou) + (float)(1 + eps))
 *       CIoU = iou - (rho2 / c2 + v * alpha), then clamped at 0
 *   G_m = atan(w1 / h1), P_a = atan(w2 / h2): the quotient in float32, atan in float64, rounded to float32
 *   score s = scores[b, a, c_m] (sigmoid first when logits, in float64, rounded to the scores' dtype)
 *   s^alpha: sqrt when alpha = 0.5 (torch does), x*x, x*x*x for 2, 3, else pow in float64; rounded to the
 *            scores' dtype (float16/bfloat16 arithmetic of the reference); CIoU^beta likewise, in float32
 *   align = s^alpha * CIoU^beta in float32 (float64 when the scores are float64, as torch promotes)
 *   candidates of a real box m: the topk anchors by (align · inside, anchor index) — value descending,
 *       lower index first on ties; outside anchors count as value 0, so a box with fewer than topk anchors
 *       of positive metric fills its list with the lowest-index anchors of value 0, and those inside the
 *       box are candidates too (the reference's torch.topk-then-AND-inside rule).
 *   positive(m, a) = candidate; an anchor positive for > 1 box takes argmax_m' CIoU(m', a) over ALL M rows
 *       (padding rows included, first index on ties), whether or not it was a candidate of m'.
 *   per box: A_m = max align, I_m = max CIoU over its final positives (0 when none)
 *   norm(a) = (align(m, a) * I_m) / (A_m + eps) for the anchor's box m, 0 for background.
 * Transcendentals are evaluated in float64 and rounded so that C and CUDA agree bit for bit (glibc's and
 * CUDA's float64 atan/pow are within 2 ulp of exact, far below a float32 rounding step); torch's float32
 * atan/pow can differ from them by an ulp, which changes an assignment only at near-ties.
 * Compiled with -ffp-contract=off, so no fused multiply-add changes a rounding.
 * Cost per image: O(M·A) inside tests, CIoU only for anchors inside a box, plus O(M) CIoUs for each anchor
 * positive for several boxes.
 * Test: python -m pytest -q tests/ops/test_tal_assign.py
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "half.h"
#include "yv_refs.h"

#define CIOU_EPS 1e-7f
#define INSIDE_EPS 1e-9f
#define V_COEF ((float)(4.0 / (3.14159265358979323846 * 3.14159265358979323846)))
#define ONE_PLUS_EPS ((float)(1.0 + 1e-7))

#define ALIGN_UP(x) (((x) + 63u) & ~(size_t)63u)

/* Per-image scratch: p_atan f32[A] | count i32[A] | first i32[A] | ciou f32[A] | align f64[A] |
 * g_atan f32[M] | box_max_align f64[M] | box_max_iou f32[M] | top-k values f64[k] | top-k anchors i32[k]. */
struct tal_ws {
    float *p_atan;
    int32_t *count, *first;
    float *ciou;
    double *align;
    float *g_atan;
    double *box_align;
    float *box_iou;
    double *top_val;
    int32_t *top_idx;
};

static size_t carve(char *base, int64_t M, int64_t A, int64_t k, struct tal_ws *out)
{
    size_t ua = (size_t)A, um = (size_t)M, uk = (size_t)k, off = 0;
#define TAKE(field, type, n)                                          \
    do {                                                              \
        if (out)                                                      \
            out->field = (type *)(base + off);                        \
        off += ALIGN_UP((n) * sizeof(type));                          \
    } while (0)
    TAKE(p_atan, float, ua);
    TAKE(count, int32_t, ua);
    TAKE(first, int32_t, ua);
    TAKE(ciou, float, ua);
    TAKE(align, double, ua);
    TAKE(g_atan, float, um);
    TAKE(box_align, double, um);
    TAKE(box_iou, float, um);
    TAKE(top_val, double, uk);
    TAKE(top_idx, int32_t, uk);
#undef TAKE
    return off;
}

size_t yv_tal_assign_workspace_size_ref(int64_t B, int64_t M, int64_t A, int64_t topk)
{
    (void)B;
    return carve(NULL, M > 0 ? M : 0, A > 0 ? A : 0, topk > 0 ? topk : 0, NULL);
}

/* The float value of the nearest float16 (round to nearest even; overflow to inf). */
static float round_half(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof(x));
    uint32_t sign = x & 0x80000000u;
    x ^= sign;
    if (x >= 0x7f800000u)
        return f;
    if (x >= 0x477ff000u)   /* >= 65520: rounds to inf */
        return yv_bits_to_float(sign | 0x7f800000u);
    if (x < 0x38800000u) {  /* below 2^-14: float16 subnormal, a multiple of 2^-24 (scaling is exact) */
        float m = nearbyintf(yv_bits_to_float(x) * 16777216.0f) / 16777216.0f;
        return sign ? -m : m;
    }
    x += 0xfffu + ((x >> 13) & 1u);
    x &= ~0x1fffu;
    return yv_bits_to_float(sign | x);
}

/* The float value of the nearest bfloat16 (round to nearest even). */
static float round_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof(x));
    if ((x & 0x7f800000u) == 0x7f800000u)
        return f;
    x += 0x7fffu + ((x >> 16) & 1u);
    x &= 0xffff0000u;
    return yv_bits_to_float(x);
}

static inline float round_to(yv_dtype dtype, float f)
{
    if (dtype == YV_FLOAT16)
        return round_half(f);
    if (dtype == YV_BFLOAT16)
        return round_bf16(f);
    return f;
}

/* x^e as torch's pow(tensor, scalar) special-cases it, the general case in float64. */
static inline double pow_f64(double x, double e)
{
    if (e == 0.5)
        return sqrt(x);
    if (e == 2.0)
        return x * x;
    if (e == 3.0)
        return x * x * x;
    return pow(x, e);
}

static inline float pow_f32(float x, double e)
{
    if (e == 0.5)
        return sqrtf(x);
    if (e == 2.0)
        return x * x;
    if (e == 3.0)
        return x * x * x;
    return (float)pow((double)x, e);
}

static inline float atan_ratio(const float *b)
{
    float w = b[2] - b[0], h = (b[3] - b[1]) + CIOU_EPS;
    return (float)atan((double)(w / h));
}

static inline float max_f(float a, float b) { return a > b ? a : b; }
static inline float min_f(float a, float b) { return a < b ? a : b; }

/* CIoU(gt g, prediction p) clamped at 0, the reference's float32 operation order (see the top). */
static inline float ciou(const float *g, float g_atan, const float *p, float p_atan)
{
    float w1 = g[2] - g[0], h1 = (g[3] - g[1]) + CIOU_EPS;
    float w2 = p[2] - p[0], h2 = (p[3] - p[1]) + CIOU_EPS;
    float iw = min_f(g[2], p[2]) - max_f(g[0], p[0]);
    float ih = min_f(g[3], p[3]) - max_f(g[1], p[1]);
    iw = iw > 0.0f ? iw : 0.0f;
    ih = ih > 0.0f ? ih : 0.0f;
    float inter = iw * ih;
    float iou = inter / (((w1 * h1 + w2 * h2) - inter) + CIOU_EPS);
    float cw = max_f(g[2], p[2]) - min_f(g[0], p[0]);
    float ch = max_f(g[3], p[3]) - min_f(g[1], p[1]);
    float c2 = (cw * cw + ch * ch) + CIOU_EPS;
    float dx = ((p[0] + p[2]) - g[0]) - g[2];
    float dy = ((p[1] + p[3]) - g[1]) - g[3];
    float rho2 = (dx * dx + dy * dy) / 4.0f;
    float d = p_atan - g_atan;
    float v = V_COEF * (d * d);
    float alpha = v / ((v - iou) + ONE_PLUS_EPS);
    float c = iou - (rho2 / c2 + v * alpha);
    return c > 0.0f ? c : 0.0f;
}

static inline int inside(const float *pt, const float *g)
{
    float d = min_f(pt[0] - g[0], pt[1] - g[1]);
    d = min_f(d, g[2] - pt[0]);
    d = min_f(d, g[3] - pt[1]);
    return d > INSIDE_EPS;
}

/* Everything the metric needs besides the boxes. */
struct tal_params {
    const void *scores;
    yv_dtype score_dtype, round_dtype;
    int64_t ss[3];   /* score strides (elements) */
    int logits, wide;
    double alpha, beta;
};

/* s^alpha for score element (b, a, c): float64 when wide, else rounded like the reference's arithmetic. */
static double score_pow(const struct tal_params *P, int64_t b, int64_t a, int64_t c)
{
    int64_t off = b * P->ss[0] + a * P->ss[1] + c * P->ss[2];
    double s;
    if (P->score_dtype == YV_FLOAT64)
        s = ((const double *)P->scores)[off];
    else if (P->score_dtype == YV_FLOAT16)
        s = yv_half_to_float(((const uint16_t *)P->scores)[off]);
    else
        s = ((const float *)P->scores)[off];
    if (P->wide) {
        if (P->logits)
            s = 1.0 / (1.0 + exp(-s));
        return pow_f64(s, P->alpha);
    }
    float sf = (float)s;
    if (P->logits)
        sf = round_to(P->round_dtype, (float)(1.0 / (1.0 + exp(-(double)sf))));
    return round_to(P->round_dtype, pow_f32(sf, P->alpha));
}

static inline double align_of(const struct tal_params *P, double sp, float ciou_v)
{
    float cp = pow_f32(ciou_v, P->beta);
    if (P->wide)
        return sp * (double)cp;
    return (double)((float)sp * cp);
}

/* Insert (v, a) into the list sorted by value descending, index ascending; n entries of at most k. */
static inline void topk_insert(double *val, int32_t *idx, int *n, int k, double v, int32_t a)
{
    int i = *n;
    if (i == k) {
        /* anchors arrive in ascending order, so an equal value never displaces the last entry */
        if (!(v > val[k - 1]))
            return;
        i = k - 1;
    } else {
        (*n)++;
    }
    while (i > 0 && v > val[i - 1]) {
        val[i] = val[i - 1];
        idx[i] = idx[i - 1];
        i--;
    }
    val[i] = v;
    idx[i] = a;
}

int yv_tal_assign_forward_ref(const void *scores, yv_dtype score_dtype, const int64_t score_strides[3],
                              yv_dtype round_dtype, int logits, int64_t B, int64_t A, int64_t NC,
                              const float *pred_boxes, const float *points, const int64_t *gt_labels,
                              const float *gt_boxes, const uint8_t *gt_mask, int64_t M, int64_t topk,
                              double alpha, double beta, double eps, void *workspace, int64_t *target_labels,
                              float *target_boxes, void *target_norm, uint8_t *fg, int64_t *gt_idx)
{
    struct tal_params P = {scores, score_dtype, round_dtype, {score_strides[0], score_strides[1],
                           score_strides[2]}, logits, score_dtype == YV_FLOAT64, alpha, beta};
    int k = (int)(topk < A ? topk : A);
    struct tal_ws w;
    carve((char *)workspace, M, A, topk, &w);

    for (int64_t i = 0; i < B * M; i++)
        if (gt_labels[i] < 0 || gt_labels[i] >= NC)
            return -1;

    for (int64_t b = 0; b < B; b++) {
        const float *gb = gt_boxes + b * M * 4, *pb = pred_boxes + b * A * 4;
        const int64_t *lab = gt_labels + b * M;
        const uint8_t *valid = gt_mask + b * M;
        for (int64_t a = 0; a < A; a++) {
            w.p_atan[a] = atan_ratio(pb + 4 * a);
            w.count[a] = 0;
            w.first[a] = INT32_MAX;
        }
        for (int64_t m = 0; m < M; m++) {
            w.g_atan[m] = atan_ratio(gb + 4 * m);
            w.box_align[m] = 0.0;
            w.box_iou[m] = 0.0f;
        }

        /* candidates of each real box, counted into count/first (boxes in ascending order: first = lowest) */
        for (int64_t m = 0; m < M; m++) {
            if (!valid[m])
                continue;
            const float *g = gb + 4 * m;
            int n = 0;
            for (int64_t a = 0; a < A; a++) {
                if (!inside(points + 2 * a, g))
                    continue;
                double sp = score_pow(&P, b, a, lab[m]);
                double v = align_of(&P, sp, ciou(g, w.g_atan[m], pb + 4 * a, w.p_atan[a]));
                if (v > 0.0)
                    topk_insert(w.top_val, w.top_idx, &n, k, v, (int32_t)a);
            }
            /* n < k: the list is completed with the lowest-index anchors of value 0, all below k */
            int fill = k - n;
            for (int32_t j = 0; j < k && fill > 0; j++) {
                int listed = 0;
                for (int i = 0; i < n; i++)
                    listed |= w.top_idx[i] == j;
                if (listed)
                    continue;
                fill--;
                if (inside(points + 2 * j, g))
                    w.top_idx[k - 1 - fill] = j;
                else
                    w.top_idx[k - 1 - fill] = -1;
            }
            for (int i = 0; i < k; i++) {
                int32_t a = w.top_idx[i];
                if (a < 0)
                    continue;
                if (w.count[a]++ == 0)
                    w.first[a] = (int32_t)m;
            }
        }

        /* each anchor's box; the box maxima over its final positives */
        for (int64_t a = 0; a < A; a++) {
            int32_t c = w.count[a];
            int64_t m = 0;
            float iou_v = 0.0f;
            if (c == 1) {
                m = w.first[a];
                iou_v = ciou(gb + 4 * m, w.g_atan[m], pb + 4 * a, w.p_atan[a]);
            } else if (c > 1) {
                float best = -1.0f;
                for (int64_t mm = 0; mm < M; mm++) {
                    float o = ciou(gb + 4 * mm, w.g_atan[mm], pb + 4 * a, w.p_atan[a]);
                    if (o > best) {
                        best = o;
                        m = mm;
                    }
                }
                iou_v = best;
            }
            gt_idx[b * A + a] = m;
            fg[b * A + a] = c > 0;
            if (c == 0)
                continue;
            double v = align_of(&P, score_pow(&P, b, a, lab[m]), iou_v);
            w.ciou[a] = iou_v;
            w.align[a] = v;
            if (v > w.box_align[m])
                w.box_align[m] = v;
            if (iou_v > w.box_iou[m])
                w.box_iou[m] = iou_v;
        }

        for (int64_t a = 0; a < A; a++) {
            int64_t m = gt_idx[b * A + a];
            int is_fg = fg[b * A + a];
            target_labels[b * A + a] = lab[m];
            memcpy(target_boxes + (b * A + a) * 4, gb + 4 * m, 4 * sizeof(float));
            if (P.wide) {
                double nv = is_fg ? (w.align[a] * (double)w.box_iou[m]) / (w.box_align[m] + eps) : 0.0;
                ((double *)target_norm)[b * A + a] = nv;
            } else {
                float nv = 0.0f;
                if (is_fg)
                    nv = ((float)w.align[a] * w.box_iou[m]) / ((float)w.box_align[m] + (float)eps);
                ((float *)target_norm)[b * A + a] = nv;
            }
        }
    }
    return 0;
}
