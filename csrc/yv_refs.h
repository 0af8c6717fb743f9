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

#endif /* YV_REFS_H */
