/* augment.cu — the augment op on the GPU: one training batch's pixels (4-image mosaic or letterbox placement,
 * copy-paste, random perspective/affine with grey 114 border, mixup, HSV gain, flips) from decoded source images
 * and a host-drawn plan, written as uint8 RGB planes into the batch buffer.
 *
 * Maths: kernels/augment_pixel.h, the same function the C reference (csrc/augment_ref.c) runs; its float
 * steps use round-to-nearest intrinsics there, so the kernel writes the reference's bytes.
 * One thread per output pixel: grid (ceil(H*W / 256), B), 256 threads. Each block first fills the BGR->HSV
 * divisor tables (2 x 256 int) in shared memory. Reads: the 4 bilinear neighbours of each layer from src
 * (4 tiles tested per neighbour; tiles/warp of an image are the same for the whole block: broadcast loads), and
 * per neighbour the rectangles of the layer's pasted polygons (the polygon's edges only when inside one).
 * No saved tensors, no gradient (forward only); out is written (=). src is read-only; a tile that points
 * outside src reads grey, a paste list that overruns L pastes no further (the CPU path raises instead).
 * Test: python -m pytest -q tests/ops/test_augment.py (CUDA cases); speed: benchmarks/bench_train.py.
 */
#include <stdint.h>

#include "augment_pixel.h"
#include "common.cuh"
#include "yv_kernels.h"

#define AUGMENT_THREADS 256

__global__ void augment_fwd_kernel(uint8_t *out, int64_t H, int64_t W, const uint8_t *src, int64_t src_n,
                                   const int64_t *tiles, const float *warp, const float *mix, const int64_t *flags,
                                   const uint8_t *luts, const int32_t *paste, int64_t L)
{
    __shared__ int sdiv[256], hdiv[256];
    ya_hsv_tables_entry(threadIdx.x, sdiv, hdiv);
    __syncthreads();
    int64_t b = blockIdx.y;
    int64_t plane = H * W;
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= plane)
        return;
    int64_t y = i / W, x = i - y * W;
    uint8_t rgb[3];
    ya_pixel(src, src_n, tiles + b * YA_LAYERS * YA_TILES * YA_TILE, warp + b * YA_LAYERS * 9, mix + b * 2,
             flags + b * 4, luts + b * 768, paste + b * YA_LAYERS * L, L, sdiv, hdiv, H, W, x, y, rgb);
    uint8_t *o = out + b * 3 * plane + i;
    o[0] = rgb[0];
    o[plane] = rgb[1];
    o[2 * plane] = rgb[2];
}

extern "C" cudaError_t yv_augment_forward(uint8_t *out, int64_t B, int64_t H, int64_t W, const uint8_t *src,
                                          int64_t src_n, const int64_t *tiles, const float *warp, const float *mix,
                                          const int64_t *flags, const uint8_t *luts, const int32_t *paste,
                                          int64_t L, cudaStream_t stream)
{
    if (B == 0 || H == 0 || W == 0)
        return cudaSuccess;
    if (B > 65535)
        return cudaErrorInvalidValue;
    dim3 grid((unsigned)yv_ceil_div(H * W, AUGMENT_THREADS), (unsigned)B);
    augment_fwd_kernel<<<grid, AUGMENT_THREADS, 0, stream>>>(out, H, W, src, src_n, tiles, warp, mix, flags, luts,
                                                             paste, L);
    return cudaGetLastError();
}
