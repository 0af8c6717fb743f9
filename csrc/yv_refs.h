/* yv_refs.h — every plain-C CPU implementation (csrc/<op>_ref.c), the twin of kernels/yv_kernels.h.
 *
 * No Python here: callable with the GIL released. Pointers are to contiguous host memory; the binding has
 * checked shapes and dtypes. Return 0 on success, a negative code otherwise (see each op).
 * Test: tests/test_<op>.py compares each against its torch reference.
 */
#ifndef YV_REFS_H
#define YV_REFS_H

#include <stddef.h>
#include <stdint.h>

#include "bn_silu.h"
#include "yv_dtype.h"

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

#endif /* YV_REFS_H */
