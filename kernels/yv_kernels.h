/* yv_kernels.h — every CUDA launcher (kernels/<op>.cu), with shapes and dtypes. Included by the C bindings
 * (gcc, C11) and by the .cu files (nvcc); hence the extern "C" and no CUDA C++ in here.
 *
 * Conventions: pointers are device pointers to contiguous memory; the binding has checked shapes, dtypes,
 * devices and sizes. Launchers enqueue work on `stream` only (never the default stream implicitly), never
 * allocate device memory (the caller passes the workspace, sized by the op's *_workspace_size), never
 * synchronise, and return the launch's cudaError_t.
 * Test: tests/test_<op>.py (CUDA cases).
 */
#ifndef YV_KERNELS_H
#define YV_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "bn_silu.h"
#include "yv_dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

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

/* ---- bn_silu (kernels/bn_silu.cu): fused training BatchNorm + SiLU; maths at the top of that file ----
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

#ifdef __cplusplus
}
#endif

#endif /* YV_KERNELS_H */
