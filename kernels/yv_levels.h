/* yv_levels.h — the multi-level head maps of one detection branch, as one descriptor: the nl maps
 * (B, 4·reg_max + NC, H_l, W_l) of a DDetect/DualDDetect branch, read in place (any strides), and the
 * anchor index a that runs over them level after level, row-major within a level (the order of the
 * reference's torch.cat of map.reshape(B, C, -1)). Shared by csrc/ (gcc, C11) and kernels/ (nvcc); plain C,
 * passed by value to CUDA kernels (a few hundred bytes of kernel parameters).
 *
 * Anchor a of level l sits at h = (a − offset[l]) / W[l], w = (a − offset[l]) % W[l]; its point is
 * (w + 0.5, h + 0.5) in grid units and its stride is stride[l] pixels (make_anchors with offset 0.5).
 * Test: tests/ops/test_det_loss.py (strided and channels-last maps, odd H and W, one and three levels).
 */
#ifndef YV_LEVELS_H
#define YV_LEVELS_H

#include <stdint.h>

#define YV_MAX_LEVELS 4

typedef struct yv_levels {
    int nl;                           /* number of levels, 1..YV_MAX_LEVELS */
    int64_t B, C, A;                  /* batch, channels of every map, anchors = sum of H·W */
    void *data[YV_MAX_LEVELS];        /* first element of each map (all of one dtype) */
    int64_t H[YV_MAX_LEVELS], W[YV_MAX_LEVELS];
    int64_t offset[YV_MAX_LEVELS];    /* first anchor index of each level */
    int64_t sb[YV_MAX_LEVELS], sc[YV_MAX_LEVELS], sh[YV_MAX_LEVELS], sw[YV_MAX_LEVELS];   /* in elements */
    double stride[YV_MAX_LEVELS];     /* pixels per grid cell */
} yv_levels;

#endif /* YV_LEVELS_H */
