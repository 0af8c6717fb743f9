/* det_loss.h — the per-anchor maths of the detection loss (stated at the top of csrc/det_loss_ref.c), written
 * once for its two implementations: csrc/det_loss_ref.c includes it as C11 with dl_real = double (float64 on
 * the host, static inline functions), kernels/det_loss.cu as CUDA C++ with dl_real = float (float32 device
 * functions). Every literal is DL_R(x) (x in C, xf in CUDA) and every maths call a DL_ macro (exp / expf ...),
 * so the float32 code never widens to double.
 *
 * The includer first defines DL_LOAD(p, dtype, i): element i of a map of `dtype` as dl_real.
 * Test: python -m pytest -q tests/ops/test_det_loss.py (the C CPU cases here; the CUDA cases on a GPU).
 */
#ifndef YV_DET_LOSS_H
#define YV_DET_LOSS_H

#include <math.h>
#include <stdint.h>

#include "yv_dtype.h"
#include "yv_levels.h"

#ifndef DL_LOAD
#error "define DL_LOAD(p, dtype, i) before including det_loss.h"
#endif

#ifdef __CUDACC__
typedef float dl_real;
#define DL_R(x) x##f
#define DL_FN __device__
#define DL_INLINE __device__ __forceinline__
#define DL_EXP expf
#define DL_LOG logf
#define DL_LOG1P log1pf
#define DL_ATAN atanf
#define DL_FABS fabsf
#define DL_FMIN fminf
#define DL_FMAX fmaxf
#else
typedef double dl_real;
#define DL_R(x) x
#define DL_FN static inline
#define DL_INLINE static inline
#define DL_EXP exp
#define DL_LOG log
#define DL_LOG1P log1p
#define DL_ATAN atan
#define DL_FABS fabs
#define DL_FMIN fmin
#define DL_FMAX fmax
#endif

#define DL_CIOU_EPS DL_R(1e-7)   /* yolov9c/loss/boxes.py::CIOU_EPS */
#define DL_PI DL_R(3.14159265358979323846)

/* Level of anchor a (at most YV_MAX_LEVELS comparisons), and its row h and column w there. */
DL_INLINE int dl_locate(const yv_levels *L, int64_t a, int64_t *h, int64_t *w)
{
    int l = 0;
    while (l + 1 < L->nl && a >= L->offset[l + 1])
        l++;
    int64_t r = a - L->offset[l];
    *h = r / L->W[l];
    *w = r - *h * L->W[l];
    return l;
}

/* Element offset of the anchor at (h, w) of image b in level lvl's map (its channel 0). */
DL_INLINE int64_t dl_offset(const yv_levels *L, int lvl, int64_t b, int64_t h, int64_t w)
{
    return b * L->sb[lvl] + h * L->sh[lvl] + w * L->sw[lvl];
}

/* Softmax statistics of one side's R logits: max m, S = Σ exp(z − m), expectation d = Σ k·p_k. */
DL_FN void dl_side(const void *map, yv_dtype dtype, int64_t base, int64_t sc, int R, int s, dl_real *m, dl_real *S,
                   dl_real *d)
{
    dl_real mx = -INFINITY;
    for (int k = 0; k < R; k++)
        mx = DL_FMAX(mx, DL_LOAD(map, dtype, base + (int64_t)(s * R + k) * sc));
    dl_real sum = DL_R(0.0), first = DL_R(0.0);
    for (int k = 0; k < R; k++) {
        dl_real e = DL_EXP(DL_LOAD(map, dtype, base + (int64_t)(s * R + k) * sc) - mx);
        sum += e;
        first += (dl_real)k * e;
    }
    *m = mx;
    *S = sum;
    *d = first / sum;
}

/* d max(a, b) / da and d min(a, b) / da with torch's tie rule (half the gradient to each side). */
DL_INLINE dl_real dl_dmax(dl_real a, dl_real b) { return a > b ? DL_R(1.0) : (a == b ? DL_R(0.5) : DL_R(0.0)); }
DL_INLINE dl_real dl_dmin(dl_real a, dl_real b) { return a < b ? DL_R(1.0) : (a == b ? DL_R(0.5) : DL_R(0.0)); }

/* CIoU(p, t) for xyxy boxes, operation for operation as bbox_ciou(p, t); when g != NULL also dCIoU/dp with
 * α held constant (it is computed under no_grad in the reference). */
DL_FN dl_real dl_ciou(const dl_real p[4], const dl_real t[4], dl_real g[4])
{
    const dl_real eps = DL_CIOU_EPS, K = DL_R(4.0) / (DL_PI * DL_PI);
    dl_real w1 = p[2] - p[0], h1 = p[3] - p[1] + eps;
    dl_real w2 = t[2] - t[0], h2 = t[3] - t[1] + eps;
    dl_real iw_raw = DL_FMIN(p[2], t[2]) - DL_FMAX(p[0], t[0]);
    dl_real ih_raw = DL_FMIN(p[3], t[3]) - DL_FMAX(p[1], t[1]);
    dl_real iw = iw_raw > DL_R(0.0) ? iw_raw : DL_R(0.0), ih = ih_raw > DL_R(0.0) ? ih_raw : DL_R(0.0);
    dl_real inter = iw * ih;
    dl_real uni = w1 * h1 + w2 * h2 - inter + eps;
    dl_real iou = inter / uni;
    dl_real cw = DL_FMAX(p[2], t[2]) - DL_FMIN(p[0], t[0]);
    dl_real ch = DL_FMAX(p[3], t[3]) - DL_FMIN(p[1], t[1]);
    dl_real c2 = cw * cw + ch * ch + eps;
    dl_real sx = t[0] + t[2] - p[0] - p[2], sy = t[1] + t[3] - p[1] - p[3];
    dl_real rho2 = (sx * sx + sy * sy) / DL_R(4.0);
    dl_real D = DL_ATAN(w2 / h2) - DL_ATAN(w1 / h1);
    dl_real v = K * (D * D);
    dl_real alpha = v / (v - iou + (DL_R(1.0) + eps));
    dl_real out = iou - (rho2 / c2 + v * alpha);
    if (g != NULL) {
        dl_real g_uni = -inter / (uni * uni);
        dl_real g_inter = DL_R(1.0) / uni - g_uni;   /* inter is in the numerator and, negated, in the union */
        dl_real g_w1 = g_uni * h1, g_h1 = g_uni * w1;
        dl_real g_rho2 = DL_R(-1.0) / c2, g_c2 = rho2 / (c2 * c2);
        dl_real g_D = -alpha * K * DL_R(2.0) * D;
        dl_real r1 = w1 / h1;
        dl_real g_r1 = -g_D / (DL_R(1.0) + r1 * r1);
        g_w1 += g_r1 / h1;
        g_h1 -= g_r1 * w1 / (h1 * h1);
        /* clamp(min=0) passes the gradient where its input is >= 0 */
        dl_real g_iw = iw_raw >= DL_R(0.0) ? g_inter * ih : DL_R(0.0);
        dl_real g_ih = ih_raw >= DL_R(0.0) ? g_inter * iw : DL_R(0.0);
        dl_real g_cw = g_c2 * DL_R(2.0) * cw, g_ch = g_c2 * DL_R(2.0) * ch;
        g[0] = -g_w1 - g_iw * dl_dmax(p[0], t[0]) - g_cw * dl_dmin(p[0], t[0]) - g_rho2 * sx / DL_R(2.0);
        g[1] = -g_h1 - g_ih * dl_dmax(p[1], t[1]) - g_ch * dl_dmin(p[1], t[1]) - g_rho2 * sy / DL_R(2.0);
        g[2] = g_w1 + g_iw * dl_dmin(p[2], t[2]) + g_cw * dl_dmax(p[2], t[2]) - g_rho2 * sx / DL_R(2.0);
        g[3] = g_h1 + g_ih * dl_dmin(p[3], t[3]) + g_ch * dl_dmax(p[3], t[3]) - g_rho2 * sy / DL_R(2.0);
    }
    return out;
}

/* The DFL target τ ∈ [0, max_dist] of one side split over its two bins: left bin l = ⌊τ⌋, kept in [0, R − 2]
 * even for a NaN target so that no read leaves the anchor's channels, with weights wl (bin l), wr (bin l + 1). */
DL_INLINE int dl_bins(dl_real tau, int R, dl_real *wl, dl_real *wr)
{
    int l = 0;
    if (tau >= DL_R(0.0)) {
        l = (int)tau;
        l = l > R - 2 ? R - 2 : l;
    }
    *wl = (dl_real)(l + 1) - tau;
    *wr = DL_R(1.0) - *wl;
    return l;
}

/* Everything the box terms of one foreground anchor need. */
typedef struct dl_fg {
    dl_real m[4], S[4], d[4];   /* softmax statistics of the 4 sides */
    dl_real pred[4], tgt[4];    /* grid units */
    dl_real tau[4];             /* DFL targets */
} dl_fg;

/* dl_fg of the anchor at (h, w) of level lvl, map offset `base`, target box tbox (xyxy pixels). */
DL_FN void dl_fg_prepare(const yv_levels *L, yv_dtype dtype, int R, int lvl, int64_t base, int64_t h, int64_t w,
                         const dl_real tbox[4], dl_real max_dist, dl_fg *f)
{
    for (int s = 0; s < 4; s++)
        dl_side(L->data[lvl], dtype, base, L->sc[lvl], R, s, &f->m[s], &f->S[s], &f->d[s]);
    dl_real px = (dl_real)w + DL_R(0.5), py = (dl_real)h + DL_R(0.5), st = (dl_real)L->stride[lvl];
    f->pred[0] = px - f->d[0];
    f->pred[1] = py - f->d[1];
    f->pred[2] = px + f->d[2];
    f->pred[3] = py + f->d[3];
    for (int k = 0; k < 4; k++)
        f->tgt[k] = tbox[k] / st;
    dl_real raw[4] = {px - f->tgt[0], py - f->tgt[1], f->tgt[2] - px, f->tgt[3] - py};
    for (int k = 0; k < 4; k++) {
        dl_real v = raw[k] < DL_R(0.0) ? DL_R(0.0) : raw[k];
        f->tau[k] = v > max_dist ? max_dist : v;
    }
}

/* The soft target of a class logit: the anchor's score on its label (norm; 0 elsewhere), label-smoothed. */
DL_INLINE dl_real dl_cls_target(int is_label, dl_real norm, dl_real eps)
{
    return (is_label ? norm : DL_R(0.0)) * (DL_R(1.0) - eps) + DL_R(0.5) * eps;
}

/* BCE-with-logits of logit x against target t with positive weight pos_weight, and its derivative in x. */
DL_INLINE dl_real dl_bce(dl_real x, dl_real t, dl_real pos_weight)
{
    dl_real lw = (pos_weight - DL_R(1.0)) * t + DL_R(1.0);
    return (DL_R(1.0) - t) * x + lw * (DL_LOG1P(DL_EXP(-DL_FABS(x))) + (x < DL_R(0.0) ? -x : DL_R(0.0)));
}

DL_INLINE dl_real dl_bce_grad(dl_real x, dl_real t, dl_real pos_weight)
{
    dl_real lw = (pos_weight - DL_R(1.0)) * t + DL_R(1.0);
    dl_real sig = x >= DL_R(0.0) ? DL_R(1.0) / (DL_R(1.0) + DL_EXP(-x)) : DL_EXP(x) / (DL_R(1.0) + DL_EXP(x));
    return lw * sig - pos_weight * t;
}

/* The DFL term of side s of a foreground anchor (before the mean over sides and the weight). */
DL_INLINE dl_real dl_dfl_side(const dl_fg *f, int s, int R, const void *map, yv_dtype dtype, int64_t base,
                              int64_t sc)
{
    dl_real wl, wr;
    int l = dl_bins(f->tau[s], R, &wl, &wr);
    dl_real lse = f->m[s] + DL_LOG(f->S[s]);
    dl_real zl = DL_LOAD(map, dtype, base + (int64_t)(s * R + l) * sc);
    dl_real zr = DL_LOAD(map, dtype, base + (int64_t)(s * R + l + 1) * sc);
    return (lse - zl) * wl + (lse - zr) * wr;
}

/* The gradient of bin k (softmax probability p) of side s: the CIoU chain through d_s (gd = dloss/dd_s) and
 * the DFL term (gdfl = its weight / 4) with the side's bins l, wl, wr. */
DL_INLINE dl_real dl_dfl_grad(const dl_fg *f, int s, int k, dl_real p, dl_real gd, dl_real gdfl, int l, dl_real wl,
                              dl_real wr)
{
    return gd * p * ((dl_real)k - f->d[s])
           + gdfl * ((wl + wr) * p - (k == l ? wl : DL_R(0.0)) - (k == l + 1 ? wr : DL_R(0.0)));
}

#endif /* YV_DET_LOSS_H */
