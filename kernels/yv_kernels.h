/* yv_kernels.h — every CUDA launcher (kernels/<op>.cu), with shapes and dtypes. Included by the C bindings
 * (gcc, C11) and by the .cu files (nvcc); hence the extern "C" and no CUDA C++ in here.
 *
 * Conventions: pointers are device pointers to contiguous memory; the binding has checked shapes, dtypes,
 * devices and sizes. Launchers enqueue work on `stream` only (never the default stream implicitly), never
 * allocate device memory (the caller passes the workspace, sized by the op's *_workspace_size), never
 * synchronise, and return the launch's cudaError_t.
 * Test: tests/ops/test_<op>.py (CUDA cases).
 */
#ifndef YV_KERNELS_H
#define YV_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "bn_silu.h"
#include "yv_dtype.h"
#include "yv_levels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- augment (kernels/augment.cu): one training batch's pixels from a host-drawn plan ----
 * Arguments as yv_augment_forward_ref (csrc/yv_refs.h), all device pointers; one thread per output pixel.
 */
cudaError_t yv_augment_forward(uint8_t *out, int64_t B, int64_t H, int64_t W, const uint8_t *src, int64_t src_n,
                               const int64_t *tiles, const float *warp, const float *mix, const int64_t *flags,
                               const uint8_t *luts, const int32_t *paste, int64_t L, cudaStream_t stream);

/* ---- nms (kernels/nms.cu) ----
 * boxes   (n, 4) xyxy, scores (n,): `dtype` YV_FLOAT32, YV_FLOAT16 or YV_BFLOAT16 (IoU in float32)
 * classes (n,) YV_INT32/YV_INT64 by `cls_dtype`, or NULL (one class); n <= INT32_MAX
 * workspace: yv_nms_workspace_size(n) bytes (about n*n/8 bytes for the suppression bits), 16-byte aligned
 * keep    (n,) int64 out: kept indices, score descending, ties by lower index; rows past *count untouched
 * count   (1,) int64 out: number of kept boxes (the caller reads it back to size the result).
 */
size_t yv_nms_workspace_size(int64_t n);
cudaError_t yv_nms_forward(const void *boxes, const void *scores, yv_dtype dtype, const void *classes,
                           yv_dtype cls_dtype, int64_t n, float iou_thres, void *workspace, int64_t *keep,
                           int64_t *count, cudaStream_t stream);

/* ---- bn_silu (kernels/bn_silu_{stats,fwd,bwd}.cu): fused training BatchNorm + SiLU; maths in bn_silu.cuh ----
 * Views are strided device arrays of shape s (kernels/bn_silu.h; float32/float16/bfloat16 storage, any
 * strides, 64-bit offsets); yv_bn_params arrays are float32 (C,). workspace: yv_bn_workspace_size(s) bytes,
 * 256-byte aligned (per-block float64 partial sums and per-channel coefficients).
 * stats:    z -> mean, invstd (C,) written; running_mean/running_var (C,) updated in place unless NULL.
 * forward:  out = act(BN1(z1) [+ BN2(z2)]) [+ residual] (=); z2.data / residual.data NULL when absent.
 * backward: dz1, dz2 (= or += by `accumulate`; data NULL: skipped), dweight/dbias (C,) written.
 */
size_t yv_bn_workspace_size(yv_bn_shape s);
cudaError_t yv_bn_stats_forward(yv_bn_shape s, yv_view4 z, float *running_mean, float *running_var, double momentum,
                                double eps, float *mean, float *invstd, void *workspace, cudaStream_t stream);
cudaError_t yv_bn_silu_forward(yv_bn_shape s, yv_view4 z1, yv_bn_params p1, yv_view4 z2, yv_bn_params p2,
                               yv_view4 residual, int silu, yv_view4 out, cudaStream_t stream);
cudaError_t yv_bn_silu_backward(yv_bn_shape s, yv_view4 z1, yv_bn_params p1, yv_view4 z2, yv_bn_params p2,
                                yv_view4 grad_out, int silu, int batch_stats, yv_view4 dz1, yv_view4 dz2,
                                int accumulate, float *dweight1, float *dbias1, float *dweight2, float *dbias2,
                                void *workspace, cudaStream_t stream);
/* ---- det_loss (kernels/det_loss.cu; maths in csrc/det_loss_ref.c) ----
 * maps    the nl level maps of one branch (yv_levels.h, any strides), C = 4·reg_max + NC, reg_max <= 64,
 *         `dtype` YV_FLOAT32, YV_FLOAT16 or YV_BFLOAT16 (float32 arithmetic, fp32 partial sums)
 * labels  (B, A) YV_INT32/YV_INT64 by `label_dtype`; tboxes (B, A, 4) float32 xyxy pixels; tnorm (B, A)
 *         float32; fg (B, A) bool; tss (1,) float32 target_scores_sum (device, > 0, read by the kernels)
 * workspace: yv_det_loss_workspace_size(B, A) bytes: per-block partial sums + an error flag
 * out     (3,) float32 = (box, cls, dfl) / tss, reduced in a fixed order (deterministic); NaN when a
 *         foreground label is outside [0, NC) (flagged on the device, no host synchronisation)
 * grad_out (3,) float32 (device); grads: maps of the maps' shape and dtype (own strides), written (=).
 * decode: boxes (B, A, 4) float32 xyxy pixels (DFL expectation, detached).
 */
size_t yv_det_loss_workspace_size(int64_t B, int64_t A);
cudaError_t yv_det_loss_forward(const yv_levels *maps, yv_dtype dtype, int reg_max, const void *labels,
                                yv_dtype label_dtype, const float *tboxes, const float *tnorm,
                                const uint8_t *fg, const float *tss, float eps, float pos_weight, float max_dist,
                                void *workspace, float *out, cudaStream_t stream);
cudaError_t yv_det_loss_backward(const yv_levels *maps, yv_dtype dtype, int reg_max, const void *labels,
                                 yv_dtype label_dtype, const float *tboxes, const float *tnorm,
                                 const uint8_t *fg, const float *tss, float eps, float pos_weight,
                                 float max_dist, const float *grad_out, const yv_levels *grads,
                                 cudaStream_t stream);
cudaError_t yv_det_loss_decode(const yv_levels *maps, yv_dtype dtype, int reg_max, float *boxes,
                               cudaStream_t stream);

/* ---- tal_assign (kernels/tal_assign.cu) ----
 * scores (B, A, NC) YV_FLOAT32/YV_FLOAT16/YV_BFLOAT16 by `score_dtype`, any non-negative strides
 *   `score_strides` (elements); logits != 0: sigmoid on read (rounded to the scores' dtype)
 * pred_boxes (B, A, 4) xyxy float32; points (A, 2) float32; gt_labels (B, M) int64 (a label outside
 *   [0, NC) reads score 0); gt_boxes (B, M, 4) float32; gt_mask (B, M) uint8/bool; M >= 1;
 *   1 <= topk <= YV_TAL_MAX_TOPK; A, M < INT32_MAX
 * workspace: yv_tal_assign_workspace_size(B, M, A, topk) bytes, 256-byte aligned: O(B·A + B·M·topk)
 * out (all written): target_labels (B, A) int64, target_boxes (B, A, 4) float32, target_norm (B, A)
 *   float32, fg (B, A) bool, gt_idx (B, A) int64. Same results as yv_tal_assign_forward_ref.
 */
#define YV_TAL_MAX_TOPK 32
size_t yv_tal_assign_workspace_size(int64_t B, int64_t M, int64_t A, int64_t topk);
cudaError_t yv_tal_assign_forward(const void *scores, yv_dtype score_dtype, const int64_t score_strides[3],
                                  int logits, int64_t B, int64_t A, int64_t NC, const float *pred_boxes,
                                  const float *points, const int64_t *gt_labels, const float *gt_boxes,
                                  const uint8_t *gt_mask, int64_t M, int topk, double alpha, double beta,
                                  double eps, void *workspace, int64_t *target_labels, float *target_boxes,
                                  float *target_norm, uint8_t *fg, int64_t *gt_idx, cudaStream_t stream);

/* ---- avg_pool2x2 (kernels/pool.cu; maths stated there): ADown's F.avg_pool2d(x, 2, 1, 0, False, True) ----
 * in / grad_in (B, C, H, W), out / grad_out (B, C, H-1, W-1): yv_view4 device views, any strides (a channel
 * slice of a channels-last buffer included), one dtype YV_FLOAT32/YV_FLOAT16/YV_BFLOAT16; H, W >= 2.
 * forward:  out = 2x2 window mean of in (=), float32 sum in row-major window order
 * backward: grad_in = 0.25 * the sum of grad_out over the windows covering each element (=); reads only
 *           grad_out (nothing is saved from the forward)
 */
cudaError_t yv_avg_pool2x2_forward(int64_t B, int64_t C, int64_t H, int64_t W, yv_view4 in, yv_view4 out,
                                   cudaStream_t stream);
cudaError_t yv_avg_pool2x2_backward(int64_t B, int64_t C, int64_t H, int64_t W, yv_view4 grad_out,
                                    yv_view4 grad_in, cudaStream_t stream);

/* ---- upsample_nearest2x (kernels/pool.cu; maths stated there): nn.Upsample(scale_factor=2, mode='nearest') ----
 * in / grad_in (B, C, H, W), out / grad_out (B, C, 2H, 2W): yv_view4 device views, any strides (a channel
 * slice of a channels-last buffer included), one dtype YV_FLOAT32/YV_FLOAT16/YV_BFLOAT16.
 * forward:  out[y,x] = in[y/2,x/2] (=, the elements' bits)
 * backward: grad_in (=) the float32 sum of each 2x2 block of grad_out, row-major, rounded once; reads only
 *           grad_out
 */
cudaError_t yv_upsample_nearest2x_forward(int64_t B, int64_t C, int64_t H, int64_t W, yv_view4 in, yv_view4 out,
                                          cudaStream_t stream);
cudaError_t yv_upsample_nearest2x_backward(int64_t B, int64_t C, int64_t H, int64_t W, yv_view4 grad_out,
                                           yv_view4 grad_in, cudaStream_t stream);

/* ---- max_pool2d (kernels/pool.cu; maths stated there): F.max_pool2d(x, k, s, p), dilation 1, floor mode ----
 * in / grad_in (B, C, H, W), out / grad_out (B, C, Ho, Wo), Ho = (H + 2p - k) / s + 1 (W alike): yv_view4
 * device views, any strides, one dtype YV_FLOAT32/YV_FLOAT16/YV_BFLOAT16; k >= 1, s >= 1, 0 <= p <= k/2.
 * forward:  out = window maxima (=), torch's argmax rule (first maximum row-major; a NaN window: its last NaN)
 * backward: grad_in (=) = Σ grad_out over the windows whose argmax each element is, float32 in row-major
 *           output order; two kernels (no atomics): index (B, C, Ho, Wo) YV_UINT8 scratch, any strides, (=) the
 *           window argmaxes dy·k + dx of in (k·k <= 255, else cudaErrorInvalidValue), then a gather of
 *           grad_out through index
 */
cudaError_t yv_max_pool2d_forward(int64_t B, int64_t C, int64_t H, int64_t W, int k, int s, int p, yv_view4 in,
                                  yv_view4 out, cudaStream_t stream);
cudaError_t yv_max_pool2d_backward(int64_t B, int64_t C, int64_t H, int64_t W, int k, int s, int p, yv_view4 in,
                                   yv_view4 grad_out, yv_view4 index, yv_view4 grad_in, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* YV_KERNELS_H */
