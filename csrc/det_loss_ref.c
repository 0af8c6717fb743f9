/* det_loss_ref.c — the YOLOv9 loss terms of one head branch (BCE, CIoU, DFL: forward and backward) and the
 * DFL box decode, plain C on the CPU, float64 arithmetic throughout.
 *
 * Maths (the same in kernels/det_loss.cu, in float32 there, and in yolov9c/ops/det_loss.py::det_loss_reference,
 * which is the published loss of spec §4.4-4.6 written with stock torch ops). Per image b and anchor a, with
 * x the map values of the anchor (channels 0 .. 4R−1: DFL logits z[s][k] of side s = l, t, r, b, bin k < R;
 * channels 4R .. 4R+NC−1: class logits), fg/label/norm/tbox the assigner's targets, st the level stride and
 * (px, py) = (w + 0.5, h + 0.5) the anchor point in grid units:
 *   cls:  t_c = (fg and c == label ? norm : 0)·(1 − eps) + eps/2        (label smoothing eps, 0 = off)
 *         lw  = (pos_weight − 1)·t_c + 1
 *         bce = (1 − t_c)·x_c + lw·(log1p(exp(−|x_c|)) + max(−x_c, 0)),       d/dx_c = lw·σ(x_c) − pos_weight·t_c
 *   box (fg only, weight w = norm):  p_k = softmax_k(z[s]),  d_s = Σ_k k·p_k,
 *         pred = (px − d_l, py − d_t, px + d_r, py + d_b),  T = tbox / st  (grid units)
 *         box = (1 − CIoU(pred, T))·w        CIoU as yolov9c/loss/boxes.py::bbox_ciou (eps 1e-7, α constant)
 *   dfl (fg only): τ_s = clamp((px − T_x1, py − T_y1, T_x2 − px, T_y2 − py)_s, 0, max_dist), max_dist = R − 1.01
 *         l = ⌊τ⌋, wl = (l + 1) − τ, wr = 1 − wl,  dfl = w · mean_s [(lse_s − z[s][l])·wl + (lse_s − z[s][l+1])·wr]
 *   out = (Σ box, Σ bce, Σ dfl) / target_scores_sum.
 * Backward writes (=) every element of the gradient maps: class channels always, DFL channels with the CIoU
 * chain (dd_s/dz_k = p_k·(k − d_s)) plus the DFL term w/4·((wl + wr)·p_k − wl·[k = l] − wr·[k = l+1]) on
 * foreground anchors and 0 elsewhere. Ties in min/max split the gradient in halves, as torch.minimum does.
 * Float16 gradients are rounded double -> float -> half (round to nearest even at each step).
 * Test: python -m pytest -q tests/test_det_loss.py
 */
#include <math.h>
#include <stddef.h>

#include "half.h"
#include "yv_refs.h"

#define CIOU_EPS 1e-7   /* yolov9c/loss/boxes.py::CIOU_EPS */
#define PI 3.14159265358979323846

static double load(const void *p, yv_dtype dtype, int64_t i)
{
    switch (dtype) {
    case YV_FLOAT16: return (double)yv_half_to_float(((const uint16_t *)p)[i]);
    case YV_BFLOAT16: return (double)yv_bfloat16_to_float(((const uint16_t *)p)[i]);
    case YV_FLOAT64: return ((const double *)p)[i];
    default: return (double)((const float *)p)[i];
    }
}

static void store(void *p, yv_dtype dtype, int64_t i, double v)
{
    switch (dtype) {
    case YV_FLOAT16: ((uint16_t *)p)[i] = yv_float_to_half((float)v); break;
    case YV_BFLOAT16: ((uint16_t *)p)[i] = yv_float_to_bfloat16((float)v); break;
    case YV_FLOAT64: ((double *)p)[i] = v; break;
    default: ((float *)p)[i] = (float)v; break;
    }
}

static int64_t load_label(const void *p, yv_dtype dtype, int64_t i)
{
    return dtype == YV_INT32 ? (int64_t)((const int32_t *)p)[i] : ((const int64_t *)p)[i];
}

/* Level of anchor a, and its row h and column w there. */
static int locate(const yv_levels *L, int64_t a, int64_t *h, int64_t *w)
{
    int l = 0;
    while (l + 1 < L->nl && a >= L->offset[l + 1])
        l++;
    int64_t r = a - L->offset[l];
    *h = r / L->W[l];
    *w = r % L->W[l];
    return l;
}

/* Softmax statistics of one side's R logits: max m, S = Σ exp(z − m), expectation d = Σ k·p_k. */
static void dfl_side(const void *map, yv_dtype dtype, int64_t base, int64_t sc, int R, int s, double *m,
                     double *S, double *d)
{
    double mx = -INFINITY;
    for (int k = 0; k < R; k++) {
        double z = load(map, dtype, base + (int64_t)(s * R + k) * sc);
        mx = z > mx ? z : mx;
    }
    double sum = 0.0, first = 0.0;
    for (int k = 0; k < R; k++) {
        double e = exp(load(map, dtype, base + (int64_t)(s * R + k) * sc) - mx);
        sum += e;
        first += (double)k * e;
    }
    *m = mx;
    *S = sum;
    *d = first / sum;
}

/* d max(a, b) / da and d min(a, b) / da with torch's tie rule (half the gradient to each side). */
static double dmax(double a, double b) { return a > b ? 1.0 : (a == b ? 0.5 : 0.0); }
static double dmin(double a, double b) { return a < b ? 1.0 : (a == b ? 0.5 : 0.0); }

/* CIoU(p, t) for xyxy boxes, operation for operation as bbox_ciou(p, t); when g != NULL also dCIoU/dp with
 * α held constant (it is computed under no_grad in the reference). */
static double ciou(const double p[4], const double t[4], double g[4])
{
    const double eps = CIOU_EPS, K = 4.0 / (PI * PI);
    double w1 = p[2] - p[0], h1 = p[3] - p[1] + eps;
    double w2 = t[2] - t[0], h2 = t[3] - t[1] + eps;
    double iw_raw = fmin(p[2], t[2]) - fmax(p[0], t[0]);
    double ih_raw = fmin(p[3], t[3]) - fmax(p[1], t[1]);
    double iw = iw_raw > 0.0 ? iw_raw : 0.0, ih = ih_raw > 0.0 ? ih_raw : 0.0;
    double inter = iw * ih;
    double uni = w1 * h1 + w2 * h2 - inter + eps;
    double iou = inter / uni;
    double cw = fmax(p[2], t[2]) - fmin(p[0], t[0]);
    double ch = fmax(p[3], t[3]) - fmin(p[1], t[1]);
    double c2 = cw * cw + ch * ch + eps;
    double sx = t[0] + t[2] - p[0] - p[2], sy = t[1] + t[3] - p[1] - p[3];
    double rho2 = (sx * sx + sy * sy) / 4.0;
    double D = atan(w2 / h2) - atan(w1 / h1);
    double v = K * (D * D);
    double alpha = v / (v - iou + (1.0 + eps));
    double out = iou - (rho2 / c2 + v * alpha);
    if (g != NULL) {
        double g_uni = -inter / (uni * uni);
        double g_inter = 1.0 / uni - g_uni;   /* inter is in the numerator and, negated, in the union */
        double g_w1 = g_uni * h1, g_h1 = g_uni * w1;
        double g_rho2 = -1.0 / c2, g_c2 = rho2 / (c2 * c2);
        double g_D = -alpha * K * 2.0 * D;
        double r1 = w1 / h1;
        double g_r1 = -g_D / (1.0 + r1 * r1);
        g_w1 += g_r1 / h1;
        g_h1 -= g_r1 * w1 / (h1 * h1);
        /* clamp(min=0) passes the gradient where its input is >= 0 */
        double g_iw = iw_raw >= 0.0 ? g_inter * ih : 0.0, g_ih = ih_raw >= 0.0 ? g_inter * iw : 0.0;
        double g_cw = g_c2 * 2.0 * cw, g_ch = g_c2 * 2.0 * ch;
        g[0] = -g_w1 - g_iw * dmax(p[0], t[0]) - g_cw * dmin(p[0], t[0]) - g_rho2 * sx / 2.0;
        g[1] = -g_h1 - g_ih * dmax(p[1], t[1]) - g_ch * dmin(p[1], t[1]) - g_rho2 * sy / 2.0;
        g[2] = g_w1 + g_iw * dmin(p[2], t[2]) + g_cw * dmax(p[2], t[2]) - g_rho2 * sx / 2.0;
        g[3] = g_h1 + g_ih * dmin(p[3], t[3]) + g_ch * dmax(p[3], t[3]) - g_rho2 * sy / 2.0;
    }
    return out;
}

/* Left bin ⌊τ⌋ of a DFL target (τ ∈ [0, max_dist], max_dist < R − 1); kept in [0, R − 2] even for a NaN
 * target so that no read leaves the anchor's channels. */
static int dfl_left(double tau, int R)
{
    if (!(tau >= 0.0))
        return 0;
    int l = (int)tau;
    return l > R - 2 ? R - 2 : l;
}

/* Everything the box terms of one foreground anchor need. */
typedef struct fg_anchor {
    double m[4], S[4], d[4];   /* softmax statistics of the 4 sides */
    double pred[4], tgt[4];    /* grid units */
    double tau[4];             /* DFL targets */
} fg_anchor;

static void fg_prepare(const yv_levels *L, yv_dtype dtype, int R, int lvl, int64_t base, int64_t h, int64_t w,
                       const void *tboxes, yv_dtype tdtype, int64_t i, double max_dist, fg_anchor *f)
{
    const void *map = L->data[lvl];
    for (int s = 0; s < 4; s++)
        dfl_side(map, dtype, base, L->sc[lvl], R, s, &f->m[s], &f->S[s], &f->d[s]);
    double px = (double)w + 0.5, py = (double)h + 0.5, st = L->stride[lvl];
    f->pred[0] = px - f->d[0];
    f->pred[1] = py - f->d[1];
    f->pred[2] = px + f->d[2];
    f->pred[3] = py + f->d[3];
    for (int k = 0; k < 4; k++)
        f->tgt[k] = load(tboxes, tdtype, 4 * i + k) / st;
    double raw[4] = {px - f->tgt[0], py - f->tgt[1], f->tgt[2] - px, f->tgt[3] - py};
    for (int k = 0; k < 4; k++) {
        double v = raw[k] < 0.0 ? 0.0 : raw[k];
        f->tau[k] = v > max_dist ? max_dist : v;
    }
}

int yv_det_loss_forward_ref(const yv_levels *maps, yv_dtype dtype, int reg_max, const void *labels,
                            yv_dtype label_dtype, const void *tboxes, const void *tnorm, yv_dtype target_dtype,
                            const uint8_t *fg, double tss, double eps, double pos_weight, double max_dist,
                            double out[3])
{
    const int R = reg_max;
    const int64_t NC = maps->C - 4 * (int64_t)R, A = maps->A;
    double sum_box = 0.0, sum_cls = 0.0, sum_dfl = 0.0;
    for (int64_t b = 0; b < maps->B; b++) {
        for (int64_t a = 0; a < A; a++) {
            int64_t i = b * A + a, h, w;
            int lvl = locate(maps, a, &h, &w);
            const void *map = maps->data[lvl];
            int64_t sc = maps->sc[lvl];
            int64_t base = b * maps->sb[lvl] + h * maps->sh[lvl] + w * maps->sw[lvl];
            int is_fg = fg[i] != 0;
            int64_t label = is_fg ? load_label(labels, label_dtype, i) : -1;
            if (is_fg && (label < 0 || label >= NC))
                return -1;
            double norm = is_fg ? load(tnorm, target_dtype, i) : 0.0;

            double cls = 0.0;
            for (int64_t c = 0; c < NC; c++) {
                double x = load(map, dtype, base + (4 * R + c) * sc);
                double t = (c == label ? norm : 0.0) * (1.0 - eps) + 0.5 * eps;
                double lw = (pos_weight - 1.0) * t + 1.0;
                cls += (1.0 - t) * x + lw * (log1p(exp(-fabs(x))) + (x < 0.0 ? -x : 0.0));
            }
            sum_cls += cls;
            if (!is_fg)
                continue;

            fg_anchor f;
            fg_prepare(maps, dtype, R, lvl, base, h, w, tboxes, target_dtype, i, max_dist, &f);
            sum_box += (1.0 - ciou(f.pred, f.tgt, NULL)) * norm;
            double dfl = 0.0;
            for (int s = 0; s < 4; s++) {
                int l = dfl_left(f.tau[s], R);
                double wl = (double)(l + 1) - f.tau[s], wr = 1.0 - wl;
                double lse = f.m[s] + log(f.S[s]);
                double zl = load(map, dtype, base + (int64_t)(s * R + l) * sc);
                double zr = load(map, dtype, base + (int64_t)(s * R + l + 1) * sc);
                dfl += (lse - zl) * wl + (lse - zr) * wr;
            }
            sum_dfl += dfl / 4.0 * norm;
        }
    }
    out[0] = sum_box / tss;
    out[1] = sum_cls / tss;
    out[2] = sum_dfl / tss;
    return 0;
}

int yv_det_loss_backward_ref(const yv_levels *maps, yv_dtype dtype, int reg_max, const void *labels,
                             yv_dtype label_dtype, const void *tboxes, const void *tnorm, yv_dtype target_dtype,
                             const uint8_t *fg, double tss, double eps, double pos_weight, double max_dist,
                             const double grad_out[3], const yv_levels *grads)
{
    const int R = reg_max;
    const int64_t NC = maps->C - 4 * (int64_t)R, A = maps->A;
    const double g_box = grad_out[0] / tss, g_cls = grad_out[1] / tss, g_dfl = grad_out[2] / tss;
    for (int64_t b = 0; b < maps->B; b++) {
        for (int64_t a = 0; a < A; a++) {
            int64_t i = b * A + a, h, w;
            int lvl = locate(maps, a, &h, &w);
            const void *map = maps->data[lvl];
            void *gmap = grads->data[lvl];
            int64_t sc = maps->sc[lvl], gsc = grads->sc[lvl];
            int64_t base = b * maps->sb[lvl] + h * maps->sh[lvl] + w * maps->sw[lvl];
            int64_t gbase = b * grads->sb[lvl] + h * grads->sh[lvl] + w * grads->sw[lvl];
            int is_fg = fg[i] != 0;
            int64_t label = is_fg ? load_label(labels, label_dtype, i) : -1;
            if (is_fg && (label < 0 || label >= NC))
                return -1;
            double norm = is_fg ? load(tnorm, target_dtype, i) : 0.0;

            for (int64_t c = 0; c < NC; c++) {
                double x = load(map, dtype, base + (4 * R + c) * sc);
                double t = (c == label ? norm : 0.0) * (1.0 - eps) + 0.5 * eps;
                double lw = (pos_weight - 1.0) * t + 1.0;
                double sig = x >= 0.0 ? 1.0 / (1.0 + exp(-x)) : exp(x) / (1.0 + exp(x));
                store(gmap, dtype, gbase + (4 * R + c) * gsc, g_cls * (lw * sig - pos_weight * t));
            }
            if (!is_fg) {
                for (int k = 0; k < 4 * R; k++)
                    store(gmap, dtype, gbase + (int64_t)k * gsc, 0.0);
                continue;
            }

            fg_anchor f;
            fg_prepare(maps, dtype, R, lvl, base, h, w, tboxes, target_dtype, i, max_dist, &f);
            double gp[4];
            (void)ciou(f.pred, f.tgt, gp);
            /* loss_box = Σ (1 − CIoU)·w / tss; pred = (px − d_l, py − d_t, px + d_r, py + d_b) */
            double gb = -g_box * norm;
            double gd[4] = {-gb * gp[0], -gb * gp[1], gb * gp[2], gb * gp[3]};
            double gdfl = g_dfl * norm / 4.0;
            for (int s = 0; s < 4; s++) {
                int l = dfl_left(f.tau[s], R);
                double wl = (double)(l + 1) - f.tau[s], wr = 1.0 - wl;
                for (int k = 0; k < R; k++) {
                    double p = exp(load(map, dtype, base + (int64_t)(s * R + k) * sc) - f.m[s]) / f.S[s];
                    double g = gd[s] * p * ((double)k - f.d[s]) + gdfl * ((wl + wr) * p - (k == l ? wl : 0.0)
                                                                         - (k == l + 1 ? wr : 0.0));
                    store(gmap, dtype, gbase + (int64_t)(s * R + k) * gsc, g);
                }
            }
        }
    }
    return 0;
}

int yv_det_loss_decode_ref(const yv_levels *maps, yv_dtype dtype, int reg_max, float *boxes)
{
    for (int64_t b = 0; b < maps->B; b++) {
        for (int64_t a = 0; a < maps->A; a++) {
            int64_t h, w;
            int lvl = locate(maps, a, &h, &w);
            int64_t base = b * maps->sb[lvl] + h * maps->sh[lvl] + w * maps->sw[lvl];
            double m, S, d[4], st = maps->stride[lvl];
            for (int s = 0; s < 4; s++)
                dfl_side(maps->data[lvl], dtype, base, maps->sc[lvl], reg_max, s, &m, &S, &d[s]);
            double px = (double)w + 0.5, py = (double)h + 0.5;
            float *o = boxes + 4 * (b * maps->A + a);
            o[0] = (float)((px - d[0]) * st);
            o[1] = (float)((py - d[1]) * st);
            o[2] = (float)((px + d[2]) * st);
            o[3] = (float)((py + d[3]) * st);
        }
    }
    return 0;
}
