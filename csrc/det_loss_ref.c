/* det_loss_ref.c — the YOLOv9 loss terms of one head branch (BCE, CIoU, DFL: forward and backward) and the
 * DFL box decode, plain C on the CPU, float64 arithmetic throughout.
 *
 * Maths (the same in kernels/det_loss.cu, in float32 there, and in yolov9c/ops/det_loss.py::det_loss_reference,
 * which is the published loss_tal_dual.py loss written with stock torch ops). Per image b and anchor a, with
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
 * The per-anchor functions (softmax statistics, CIoU and its gradient, BCE, DFL bins) are kernels/det_loss.h,
 * which kernels/det_loss.cu compiles in float32; this file holds the loops over images and anchors.
 * Test: python -m pytest -q tests/ops/test_det_loss.py
 */
#include <math.h>
#include <stddef.h>

#include "half.h"
#include "yv_refs.h"

static double load(const void *p, yv_dtype dtype, int64_t i)
{
    switch (dtype) {
    case YV_FLOAT16: return (double)yv_half_to_float(((const uint16_t *)p)[i]);
    case YV_BFLOAT16: return (double)yv_bfloat16_to_float(((const uint16_t *)p)[i]);
    case YV_FLOAT64: return ((const double *)p)[i];
    default: return (double)((const float *)p)[i];
    }
}

#define DL_LOAD load
#include "det_loss.h"   /* the per-anchor maths, shared with kernels/det_loss.cu (here in float64) */

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

/* dl_fg of a foreground anchor whose target box is row i of tboxes (float32 or float64 by tdtype). */
static void fg_prepare(const yv_levels *L, yv_dtype dtype, int R, int lvl, int64_t base, int64_t h, int64_t w,
                       const void *tboxes, yv_dtype tdtype, int64_t i, double max_dist, dl_fg *f)
{
    double tbox[4];
    for (int k = 0; k < 4; k++)
        tbox[k] = load(tboxes, tdtype, 4 * i + k);
    dl_fg_prepare(L, dtype, R, lvl, base, h, w, tbox, max_dist, f);
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
            int lvl = dl_locate(maps, a, &h, &w);
            const void *map = maps->data[lvl];
            int64_t sc = maps->sc[lvl];
            int64_t base = dl_offset(maps, lvl, b, h, w);
            int is_fg = fg[i] != 0;
            int64_t label = is_fg ? load_label(labels, label_dtype, i) : -1;
            if (is_fg && (label < 0 || label >= NC))
                return -1;
            double norm = is_fg ? load(tnorm, target_dtype, i) : 0.0;

            double cls = 0.0;
            for (int64_t c = 0; c < NC; c++)
                cls += dl_bce(load(map, dtype, base + (4 * R + c) * sc), dl_cls_target(c == label, norm, eps),
                              pos_weight);
            sum_cls += cls;
            if (!is_fg)
                continue;

            dl_fg f;
            fg_prepare(maps, dtype, R, lvl, base, h, w, tboxes, target_dtype, i, max_dist, &f);
            sum_box += (1.0 - dl_ciou(f.pred, f.tgt, NULL)) * norm;
            double dfl = 0.0;
            for (int s = 0; s < 4; s++)
                dfl += dl_dfl_side(&f, s, R, map, dtype, base, sc);
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
            int lvl = dl_locate(maps, a, &h, &w);
            const void *map = maps->data[lvl];
            void *gmap = grads->data[lvl];
            int64_t sc = maps->sc[lvl], gsc = grads->sc[lvl];
            int64_t base = dl_offset(maps, lvl, b, h, w);
            int64_t gbase = dl_offset(grads, lvl, b, h, w);
            int is_fg = fg[i] != 0;
            int64_t label = is_fg ? load_label(labels, label_dtype, i) : -1;
            if (is_fg && (label < 0 || label >= NC))
                return -1;
            double norm = is_fg ? load(tnorm, target_dtype, i) : 0.0;

            for (int64_t c = 0; c < NC; c++) {
                double x = load(map, dtype, base + (4 * R + c) * sc);
                store(gmap, dtype, gbase + (4 * R + c) * gsc,
                      g_cls * dl_bce_grad(x, dl_cls_target(c == label, norm, eps), pos_weight));
            }
            if (!is_fg) {
                for (int k = 0; k < 4 * R; k++)
                    store(gmap, dtype, gbase + (int64_t)k * gsc, 0.0);
                continue;
            }

            dl_fg f;
            fg_prepare(maps, dtype, R, lvl, base, h, w, tboxes, target_dtype, i, max_dist, &f);
            double gp[4];
            (void)dl_ciou(f.pred, f.tgt, gp);
            /* loss_box = Σ (1 − CIoU)·w / tss; pred = (px − d_l, py − d_t, px + d_r, py + d_b) */
            double gb = -g_box * norm;
            double gd[4] = {-gb * gp[0], -gb * gp[1], gb * gp[2], gb * gp[3]};
            double gdfl = g_dfl * norm / 4.0;
            for (int s = 0; s < 4; s++) {
                double wl, wr;
                int l = dl_bins(f.tau[s], R, &wl, &wr);
                for (int k = 0; k < R; k++) {
                    double p = exp(load(map, dtype, base + (int64_t)(s * R + k) * sc) - f.m[s]) / f.S[s];
                    store(gmap, dtype, gbase + (int64_t)(s * R + k) * gsc,
                          dl_dfl_grad(&f, s, k, p, gd[s], gdfl, l, wl, wr));
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
            int lvl = dl_locate(maps, a, &h, &w);
            int64_t base = dl_offset(maps, lvl, b, h, w);
            double m, S, d[4], st = maps->stride[lvl];
            for (int s = 0; s < 4; s++)
                dl_side(maps->data[lvl], dtype, base, maps->sc[lvl], reg_max, s, &m, &S, &d[s]);
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
