/* bn_silu.h — the plain-C types shared by the fused BatchNorm/SiLU op's CUDA launchers (kernels/bn_silu_*.cu),
 * its CPU implementation (csrc/bn_silu_ref.c) and its binding (csrc/bn_silu.c). No includes beyond the
 * dtype codes, so it compiles as C11 and as CUDA C++.
 *
 * Every 4-D operand (z, residual, out, grad_out, dz) is a yv_view4 over one logical shape (B, C, H, W):
 * any strides in elements (NCHW, channels-last, a channel slice of a bigger buffer), so nothing is copied
 * to make it contiguous. A view with data == NULL is an absent optional operand.
 * Test: python -m pytest -q tests/ops/test_bn_silu.py
 */
#ifndef YV_BN_SILU_H
#define YV_BN_SILU_H

#include <stdint.h>

#include "yv_dtype.h"

typedef struct yv_bn_shape {
    int64_t B, C, H, W;
} yv_bn_shape;

typedef struct yv_view4 {
    void *data;           /* NULL: absent */
    yv_dtype dtype;       /* YV_FLOAT32, YV_FLOAT16 or YV_BFLOAT16 */
    int64_t stride[4];    /* elements, in B, C, H, W order */
} yv_view4;

/* One BatchNorm's per-channel float32 (C,) arrays: batch statistics and affine parameters. */
typedef struct yv_bn_params {
    const float *mean, *invstd, *weight, *bias;
} yv_bn_params;

#endif /* YV_BN_SILU_H */
