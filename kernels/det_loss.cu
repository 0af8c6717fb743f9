/* det_loss.cu — the YOLOv9 loss terms of one head branch on the GPU: BCE-with-logits against the soft TAL
 * targets, CIoU box loss and DFL, forward and backward, plus the DFL box decode the assigner reads.
 *
 * Maths: that of csrc/det_loss_ref.c (stated there), in float32 (the C reference uses float64); the per-anchor
 * functions are kernels/det_loss.h, shared with the C reference. One thread per (image, anchor) reads the
 * anchor's 4·reg_max + NC channels straight from the level maps (any strides, float32/float16/bfloat16): for a
 * fixed channel, neighbouring threads read neighbouring anchors, so the loads of NCHW maps coalesce. Only
 * foreground anchors do the DFL/CIoU work (a few per cent of the anchors).
 *
 * Launches (all on the caller's stream, no host synchronisation; tss and grad_out are read on the device):
 *   forward   memset(flag) -> det_loss_fwd_kernel: per-thread float32 terms, block tree reduction in a fixed
 *             order -> partial[block][3] -> det_loss_final_kernel: one block sums the partials in a fixed
 *             order in float64 and divides by tss. No atomics: the result is bitwise reproducible.
 *   backward  det_loss_bwd_kernel: recomputes each anchor's softmax/CIoU/BCE from the maps and writes (=) all
 *             4·reg_max + NC gradient channels of the anchor in the maps' dtype (zeros for the DFL channels
 *             of background anchors).
 *   decode    det_loss_decode_kernel: boxes (B, A, 4) float32 pixels.
 * Saved for backward (by yolov9c/ops/det_loss.py): nothing new per map element — the maps are the head's own
 * outputs (alive anyway) — and 29 bytes per anchor of targets (int64 label, 4 float32 box, float32 norm, bool).
 * Workspace: 12 bytes per block of 256 anchors + an int error flag (yv_det_loss_workspace_size).
 * Test: python -m pytest -q tests/ops/test_det_loss.py (CUDA cases); speed: python benchmarks/bench_loss.py
 */
#include <math.h>
#include <stdint.h>

#include "common.cuh"
#include "yv_kernels.h"

#define DL_LOAD yv_load_float
#include "det_loss.h"   /* the per-anchor maths, shared with csrc/det_loss_ref.c (here in float32) */

#define DL_THREADS 256
#define DL_FINAL_THREADS 256

struct dl_layout {
    size_t partial, flag, total;
};

static struct dl_layout dl_plan(int64_t B, int64_t A)
{
    struct dl_layout L;
    int64_t blocks = yv_ceil_div(B * A > 0 ? B * A : 1, DL_THREADS);
    L.partial = 0;
    L.flag = yv_align256((size_t)blocks * 3 * sizeof(float));
    L.total = L.flag + yv_align256(sizeof(int));
    return L;
}

__device__ __forceinline__ void dl_store(void *p, yv_dtype dtype, int64_t i, float v)
{
    if (dtype == YV_FLOAT16)
        ((__half *)p)[i] = __float2half_rn(v);
    else if (dtype == YV_BFLOAT16)
        ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v);
    else
        ((float *)p)[i] = v;
}

/* Sum of v over the block in a fixed order (shuffles within warps, then warp 0 over the warp sums). */
__device__ float dl_block_sum(float v, float *smem)
{
    for (int off = 16; off > 0; off >>= 1)
        v += __shfl_down_sync(0xffffffffu, v, off);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0)
        smem[warp] = v;
    __syncthreads();
    float r = 0.0f;
    if (warp == 0) {
        r = lane < (int)(blockDim.x >> 5) ? smem[lane] : 0.0f;
        for (int off = 16; off > 0; off >>= 1)
            r += __shfl_down_sync(0xffffffffu, r, off);
    }
    __syncthreads();
    return r;   /* valid in thread 0 */
}

__global__ void det_loss_fwd_kernel(yv_levels L, yv_dtype dtype, int R, const void *labels, yv_dtype label_dtype,
                                    const float *tboxes, const float *tnorm, const uint8_t *fg, float eps,
                                    float pos_weight, float max_dist, float *partial, int *flag)
{
    __shared__ float smem[32];
    const int64_t n = L.B * L.A, NC = L.C - 4 * (int64_t)R;
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    float box = 0.0f, cls = 0.0f, dfl = 0.0f;
    if (i < n) {
        int64_t b = i / L.A, a = i - b * L.A, h, w;
        int lvl = dl_locate(&L, a, &h, &w);
        const void *map = L.data[lvl];
        int64_t sc = L.sc[lvl];
        int64_t base = dl_offset(&L, lvl, b, h, w);
        bool is_fg = fg[i] != 0;
        int64_t label = is_fg ? yv_load_int(labels, label_dtype, i) : -1;
        if (is_fg && (label < 0 || label >= NC))
            *flag = 1;   /* benign race: every writer stores 1 */
        float norm = is_fg ? tnorm[i] : 0.0f;
        for (int64_t c = 0; c < NC; c++)
            cls += dl_bce(yv_load_float(map, dtype, base + (4 * R + c) * sc), dl_cls_target(c == label, norm, eps),
                          pos_weight);
        if (is_fg) {
            dl_fg f;
            dl_fg_prepare(&L, dtype, R, lvl, base, h, w, tboxes + 4 * i, max_dist, &f);
            box = (1.0f - dl_ciou(f.pred, f.tgt, NULL)) * norm;
            for (int s = 0; s < 4; s++)
                dfl += dl_dfl_side(&f, s, R, map, dtype, base, sc);
            dfl = dfl / 4.0f * norm;
        }
    }
    float sb = dl_block_sum(box, smem);
    float sc_ = dl_block_sum(cls, smem);
    float sd = dl_block_sum(dfl, smem);
    if (threadIdx.x == 0) {
        partial[3 * (int64_t)blockIdx.x + 0] = sb;
        partial[3 * (int64_t)blockIdx.x + 1] = sc_;
        partial[3 * (int64_t)blockIdx.x + 2] = sd;
    }
}

/* One block: out[k] = (Σ_blocks partial[.][k]) / tss, summed in float64 in a fixed order. */
__global__ void det_loss_final_kernel(const float *partial, int64_t blocks, const int *flag, const float *tss,
                                      float *out)
{
    __shared__ double smem[3][DL_FINAL_THREADS];
    double acc[3] = {0.0, 0.0, 0.0};
    for (int64_t j = threadIdx.x; j < blocks; j += blockDim.x)
        for (int k = 0; k < 3; k++)
            acc[k] += (double)partial[3 * j + k];
    for (int k = 0; k < 3; k++)
        smem[k][threadIdx.x] = acc[k];
    __syncthreads();
    for (int half = DL_FINAL_THREADS / 2; half > 0; half >>= 1) {
        if ((int)threadIdx.x < half)
            for (int k = 0; k < 3; k++)
                smem[k][threadIdx.x] += smem[k][threadIdx.x + half];
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        double t = (double)*tss;
        for (int k = 0; k < 3; k++)
            out[k] = *flag ? __int_as_float(0x7fc00000) : (float)(smem[k][0] / t);
    }
}

__global__ void det_loss_bwd_kernel(yv_levels L, yv_dtype dtype, int R, const void *labels, yv_dtype label_dtype,
                                    const float *tboxes, const float *tnorm, const uint8_t *fg, const float *tss,
                                    float eps, float pos_weight, float max_dist, const float *grad_out, yv_levels G)
{
    const int64_t n = L.B * L.A, NC = L.C - 4 * (int64_t)R;
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    const float inv = 1.0f / *tss;
    const float g_box = grad_out[0] * inv, g_cls = grad_out[1] * inv, g_dfl = grad_out[2] * inv;
    int64_t b = i / L.A, a = i - b * L.A, h, w;
    int lvl = dl_locate(&L, a, &h, &w);
    const void *map = L.data[lvl];
    void *gmap = G.data[lvl];
    int64_t sc = L.sc[lvl], gsc = G.sc[lvl];
    int64_t base = dl_offset(&L, lvl, b, h, w);
    int64_t gbase = dl_offset(&G, lvl, b, h, w);
    bool is_fg = fg[i] != 0;
    int64_t label = is_fg ? yv_load_int(labels, label_dtype, i) : -1;
    float norm = is_fg ? tnorm[i] : 0.0f;
    for (int64_t c = 0; c < NC; c++) {
        float x = yv_load_float(map, dtype, base + (4 * R + c) * sc);
        dl_store(gmap, dtype, gbase + (4 * R + c) * gsc,
                 g_cls * dl_bce_grad(x, dl_cls_target(c == label, norm, eps), pos_weight));
    }
    if (!is_fg) {
        for (int k = 0; k < 4 * R; k++)
            dl_store(gmap, dtype, gbase + (int64_t)k * gsc, 0.0f);
        return;
    }
    dl_fg f;
    dl_fg_prepare(&L, dtype, R, lvl, base, h, w, tboxes + 4 * i, max_dist, &f);
    float gp[4];
    (void)dl_ciou(f.pred, f.tgt, gp);
    float gb = -g_box * norm;
    float gd[4] = {-gb * gp[0], -gb * gp[1], gb * gp[2], gb * gp[3]};
    float gdfl = g_dfl * norm / 4.0f;
    for (int s = 0; s < 4; s++) {
        float wl, wr;
        int l = dl_bins(f.tau[s], R, &wl, &wr);
        float invS = 1.0f / f.S[s];
        for (int k = 0; k < R; k++) {
            float p = expf(yv_load_float(map, dtype, base + (int64_t)(s * R + k) * sc) - f.m[s]) * invS;
            dl_store(gmap, dtype, gbase + (int64_t)(s * R + k) * gsc, dl_dfl_grad(&f, s, k, p, gd[s], gdfl, l, wl, wr));
        }
    }
}

__global__ void det_loss_decode_kernel(yv_levels L, yv_dtype dtype, int R, float *boxes)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= L.B * L.A)
        return;
    int64_t b = i / L.A, a = i - b * L.A, h, w;
    int lvl = dl_locate(&L, a, &h, &w);
    int64_t base = dl_offset(&L, lvl, b, h, w);
    float m, S, d[4];
    for (int s = 0; s < 4; s++)
        dl_side(L.data[lvl], dtype, base, L.sc[lvl], R, s, &m, &S, &d[s]);
    float px = (float)w + 0.5f, py = (float)h + 0.5f, st = (float)L.stride[lvl];
    float4 o = make_float4((px - d[0]) * st, (py - d[1]) * st, (px + d[2]) * st, (py + d[3]) * st);
    ((float4 *)boxes)[i] = o;   /* boxes is contiguous (B, A, 4) float32 from torch: 16-byte aligned */
}

/* Blocks of DL_THREADS for one thread per (image, anchor) of maps: 0 when there is no anchor (nothing to
 * launch), -1 when the grid would pass INT32_MAX blocks. */
static int64_t dl_anchor_blocks(const yv_levels *maps)
{
    int64_t blocks = yv_ceil_div(maps->B * maps->A, DL_THREADS);
    return blocks > INT32_MAX ? -1 : blocks;
}

extern "C" size_t yv_det_loss_workspace_size(int64_t B, int64_t A)
{
    return dl_plan(B, A).total;
}

extern "C" cudaError_t yv_det_loss_forward(const yv_levels *maps, yv_dtype dtype, int reg_max, const void *labels,
                                           yv_dtype label_dtype, const float *tboxes, const float *tnorm,
                                           const uint8_t *fg, const float *tss, float eps, float pos_weight,
                                           float max_dist, void *workspace, float *out, cudaStream_t stream)
{
    struct dl_layout P = dl_plan(maps->B, maps->A);
    int64_t n = maps->B * maps->A;
    int64_t blocks = yv_ceil_div(n > 0 ? n : 1, DL_THREADS);
    if (blocks > INT32_MAX)
        return cudaErrorInvalidValue;
    float *partial = (float *)((char *)workspace + P.partial);
    int *flag = (int *)((char *)workspace + P.flag);
    cudaError_t err = cudaMemsetAsync(flag, 0, sizeof(int), stream);
    if (err != cudaSuccess)
        return err;
    det_loss_fwd_kernel<<<(unsigned)blocks, DL_THREADS, 0, stream>>>(*maps, dtype, reg_max, labels, label_dtype,
                                                                     tboxes, tnorm, fg, eps, pos_weight, max_dist,
                                                                     partial, flag);
    err = cudaGetLastError();
    if (err != cudaSuccess)
        return err;
    det_loss_final_kernel<<<1, DL_FINAL_THREADS, 0, stream>>>(partial, blocks, flag, tss, out);
    return cudaGetLastError();
}

extern "C" cudaError_t yv_det_loss_backward(const yv_levels *maps, yv_dtype dtype, int reg_max, const void *labels,
                                            yv_dtype label_dtype, const float *tboxes, const float *tnorm,
                                            const uint8_t *fg, const float *tss, float eps, float pos_weight,
                                            float max_dist, const float *grad_out, const yv_levels *grads,
                                            cudaStream_t stream)
{
    int64_t blocks = dl_anchor_blocks(maps);
    if (blocks <= 0)
        return blocks == 0 ? cudaSuccess : cudaErrorInvalidValue;
    det_loss_bwd_kernel<<<(unsigned)blocks, DL_THREADS, 0, stream>>>(*maps, dtype, reg_max, labels, label_dtype,
                                                                     tboxes, tnorm, fg, tss, eps, pos_weight,
                                                                     max_dist, grad_out, *grads);
    return cudaGetLastError();
}

extern "C" cudaError_t yv_det_loss_decode(const yv_levels *maps, yv_dtype dtype, int reg_max, float *boxes,
                                          cudaStream_t stream)
{
    int64_t blocks = dl_anchor_blocks(maps);
    if (blocks <= 0)
        return blocks == 0 ? cudaSuccess : cudaErrorInvalidValue;
    det_loss_decode_kernel<<<(unsigned)blocks, DL_THREADS, 0, stream>>>(*maps, dtype, reg_max, boxes);
    return cudaGetLastError();
}
