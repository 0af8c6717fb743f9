/* yv_refs.h — every plain-C CPU implementation (csrc/<op>_ref.c), the twin of kernels/yv_kernels.h.
 *
 * No Python here: callable with the GIL released. Pointers are to contiguous host memory; the binding has
 * checked shapes and dtypes. Return 0 on success, a negative code otherwise (see each op).
 * Test: tests/ops/test_<op>.py compares each against its torch reference.
 */
#ifndef YV_REFS_H
#define YV_REFS_H

#include <stddef.h>
#include <stdint.h>

#include "bn_silu.h"
#include "yv_dtype.h"
#include "yv_levels.h"

/* ---- augment (csrc/augment_ref.c): one training batch's pixels from a host-drawn plan ----
 * out (B, 3, H, W) uint8 RGB, written. src (src_n,) uint8: the source images, each h x w x 3 BGR.
 * tiles (B, 2, 4, 9) int64, warp (B, 2, 9) float32 inverse maps, mix (B, 2) float32 (r, 1 - r),
 * flags (B, 4) int64 (layers 1|2, flipud, fliplr, hsv), luts (B, 3, 256) uint8, paste (B, 2, L) int32 each
 * layer's copy-paste polygons; maths and the paste list in kernels/augment_pixel.h.
 * check: -1 when a layer count is not 1 or 2, a used tile reads outside src or its image, or a used layer's
 * paste list does not fit in L; forward runs it.
 */
int yv_augment_check_ref(int64_t B, const int64_t *tiles, const int64_t *flags, const int32_t *paste, int64_t L,
                         int64_t src_n);
int yv_augment_forward_ref(uint8_t *out, int64_t B, int64_t H, int64_t W, const uint8_t *src, int64_t src_n,
                           const int64_t *tiles, const float *warp, const float *mix, const int64_t *flags,
                           const uint8_t *luts, const int32_t *paste, int64_t L);

/* ---- nms (csrc/nms_ref.c) ----
 * boxes   (n, 4) xyxy, scores (n,): `dtype` YV_FLOAT32 or YV_FLOAT16 (IoU computed in float32)
 * classes (n,) YV_INT32/YV_INT64 by `cls_dtype`, or NULL (one class)
 * workspace: yv_nms_workspace_size_ref(n) bytes, 16-byte aligned
 * keep    (n,) int64 out: kept indices, score descending, ties by lower index; count (1,) int64 out.
 */
size_t yv_nms_workspace_size_ref(int64_t n);
int yv_nms_forward_ref(const void *boxes, const void *scores, yv_dtype dtype, const void *classes,
                       yv_dtype cls_dtype, int64_t n, float iou_thres, void *workspace, int64_t *keep,
                       int64_t *count);

/* ---- bn_silu (csrc/bn_silu_ref.c): fused training BatchNorm + SiLU; maths at the top of that file ----
 * Views are strided host arrays of shape s (see kernels/bn_silu.h); yv_bn_params arrays are float32 (C,).
 * stats:    z -> mean, invstd (C,) written; running_mean/running_var (C,) updated in place unless NULL.
 *           Returns -1 when B·H·W < 2.
 * forward:  out = act(BN1(z1) [+ BN2(z2)]) [+ residual] (=); z2.data / residual.data NULL when absent;
 *           silu: 1 SiLU, 0 identity.
 * backward: dz1, dz2 (= or += by `accumulate`; data NULL: skipped), dweight/dbias (C,) written;
 *           dweight2/dbias2 used only with z2. batch_stats: 1 includes the statistics' terms in dz.
 */
int yv_bn_stats_forward_ref(yv_bn_shape s, yv_view4 z, float *running_mean, float *running_var, double momentum,
                            double eps, float *mean, float *invstd);
int yv_bn_silu_forward_ref(yv_bn_shape s, yv_view4 z1, yv_bn_params p1, yv_view4 z2, yv_bn_params p2,
                           yv_view4 residual, int silu, yv_view4 out);
int yv_bn_silu_backward_ref(yv_bn_shape s, yv_view4 z1, yv_bn_params p1, yv_view4 z2, yv_bn_params p2,
                            yv_view4 grad_out, int silu, int batch_stats, yv_view4 dz1, yv_view4 dz2, int accumulate,
                            float *dweight1, float *dbias1, float *dweight2, float *dbias2);
/* ---- det_loss (csrc/det_loss_ref.c; maths stated there) ----
 * maps    the nl level maps of one branch (yv_levels.h), C = 4·reg_max + NC, `dtype` YV_FLOAT32/FLOAT16/FLOAT64
 * labels  (B, A) int32/int64 by `label_dtype`; read on foreground anchors only, must be in [0, NC)
 * tboxes  (B, A, 4) xyxy pixels and tnorm (B, A), `target_dtype` YV_FLOAT32/FLOAT64; fg (B, A) bool (0/1)
 * tss     target_scores_sum (> 0); eps label smoothing; max_dist DFL target clamp (reg_max − 1.01)
 * out     (3,) = (box, cls, dfl) / tss; grad_out (3,) their incoming gradients; grads: maps of the same
 *         shape and dtype, every element written (=). decode: boxes (B, A, 4) float32 xyxy pixels.
 * Return 0, or -1 when a foreground label is outside [0, NC).
 */
int yv_det_loss_forward_ref(const yv_levels *maps, yv_dtype dtype, int reg_max, const void *labels,
                            yv_dtype label_dtype, const void *tboxes, const void *tnorm, yv_dtype target_dtype,
                            const uint8_t *fg, double tss, double eps, double pos_weight, double max_dist,
                            double out[3]);
int yv_det_loss_backward_ref(const yv_levels *maps, yv_dtype dtype, int reg_max, const void *labels,
                             yv_dtype label_dtype, const void *tboxes, const void *tnorm, yv_dtype target_dtype,
                             const uint8_t *fg, double tss, double eps, double pos_weight, double max_dist,
                             const double grad_out[3], const yv_levels *grads);
int yv_det_loss_decode_ref(const yv_levels *maps, yv_dtype dtype, int reg_max, float *boxes);

/* ---- tal_assign (csrc/tal_assign_ref.c) ----
 * scores (B, A, NC) YV_FLOAT32/YV_FLOAT16/YV_FLOAT64 by `score_dtype`, any non-negative strides
 *   `score_strides` (elements); logits != 0: sigmoid on read; `round_dtype`: the dtype whose arithmetic the
 *   reference rounds the sigmoid and s^alpha to (the scores' dtype, or YV_BFLOAT16 for upcast bfloat16)
 * pred_boxes (B, A, 4) xyxy float32; points (A, 2) float32; gt_labels (B, M) int64 in [0, NC);
 * gt_boxes (B, M, 4) float32; gt_mask (B, M) uint8/bool (nonzero: a real box); M >= 1, topk >= 1
 * workspace: yv_tal_assign_workspace_size_ref(B, M, A, topk) bytes, 16-byte aligned (O(A + M + topk))
 * out (all written): target_labels (B, A) int64, target_boxes (B, A, 4) float32, target_norm (B, A) float32
 *   (float64 when score_dtype is YV_FLOAT64), fg (B, A) bool, gt_idx (B, A) int64.
 * Returns 0, or -1 when a label lies outside [0, NC).
 */
size_t yv_tal_assign_workspace_size_ref(int64_t B, int64_t M, int64_t A, int64_t topk);
int yv_tal_assign_forward_ref(const void *scores, yv_dtype score_dtype, const int64_t score_strides[3],
                              yv_dtype round_dtype, int logits, int64_t B, int64_t A, int64_t NC,
                              const float *pred_boxes, const float *points, const int64_t *gt_labels,
                              const float *gt_boxes, const uint8_t *gt_mask, int64_t M, int64_t topk,
                              double alpha, double beta, double eps, void *workspace, int64_t *target_labels,
                              float *target_boxes, void *target_norm, uint8_t *fg, int64_t *gt_idx);

/* ---- avg_pool2x2 (csrc/pool_ref.c; maths stated there) ----
 * in / grad_in (B, C, H, W), out / grad_out (B, C, H-1, W-1): strided host views (yv_view4), one dtype
 * YV_FLOAT32/YV_FLOAT16/YV_BFLOAT16; H, W >= 2. forward: out = 2x2 window means (=); backward: grad_in (=).
 * Float32 sums in the kernels' order: the same bits as kernels/pool.cu. Return 0.
 */
int yv_avg_pool2x2_forward_ref(int64_t B, int64_t C, int64_t H, int64_t W, yv_view4 in, yv_view4 out);
int yv_avg_pool2x2_backward_ref(int64_t B, int64_t C, int64_t H, int64_t W, yv_view4 grad_out, yv_view4 grad_in);

/* ---- upsample_nearest2x (csrc/pool_ref.c; maths stated there): nn.Upsample(scale_factor=2, mode='nearest') ----
 * in / grad_in (B, C, H, W), out / grad_out (B, C, 2H, 2W): strided host views, one dtype
 * YV_FLOAT32/YV_FLOAT16/YV_BFLOAT16. forward: out = in[y/2, x/2] (=, the elements' bits); backward: grad_in (=)
 * the float32 sum of each 2x2 block of grad_out in row-major order (torch's bits). Return 0.
 */
int yv_upsample_nearest2x_forward_ref(int64_t B, int64_t C, int64_t H, int64_t W, yv_view4 in, yv_view4 out);
int yv_upsample_nearest2x_backward_ref(int64_t B, int64_t C, int64_t H, int64_t W, yv_view4 grad_out,
                                       yv_view4 grad_in);

/* ---- max_pool2d (csrc/pool_ref.c; maths stated there): F.max_pool2d(x, k, s, p), dilation 1, floor mode ----
 * in / grad_in (B, C, H, W), out / grad_out (B, C, Ho, Wo), Ho = (H + 2p - k) / s + 1 (W alike): strided host
 * views, one dtype YV_FLOAT32/YV_FLOAT16/YV_BFLOAT16; k >= 1, s >= 1, 0 <= p <= k/2, Ho, Wo >= 1.
 * forward: out = the window maxima (=, the elements' own bits); backward: index (B, C, Ho, Wo) YV_UINT8
 * scratch (=) the window argmaxes dy·k + dx (torch's first-maximum / last-NaN rule; k·k <= 255), then grad_in
 * (=) gathered from grad_out through index. Return 0.
 */
int yv_max_pool2d_forward_ref(int64_t B, int64_t C, int64_t H, int64_t W, int k, int s, int p, yv_view4 in,
                              yv_view4 out);
int yv_max_pool2d_backward_ref(int64_t B, int64_t C, int64_t H, int64_t W, int k, int s, int p, yv_view4 in,
                               yv_view4 grad_out, yv_view4 index, yv_view4 grad_in);

#endif /* YV_REFS_H */
