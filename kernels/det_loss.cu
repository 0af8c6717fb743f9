/* det_loss.cu — the YOLOv9 loss terms of one head branch on the GPU: BCE-with-logits against the soft TAL
 * targets, CIoU box loss and DFL, forward and backward, plus the DFL box decode the assigner reads.
 *
 * Maths: that of csrc/det_loss_ref.c (stated there), in float32 (the C reference uses float64). One thread
 * per (image, anchor) reads the anchor's 4·reg_max + NC channels straight from the level maps (any strides,
 * float32/float16/bfloat16): for a fixed channel, neighbouring threads read neighbouring anchors, so the loads
 * of NCHW maps coalesce. Only foreground anchors do the DFL/CIoU work (a few per cent of the anchors).
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
 * Test: python -m pytest -q tests/test_det_loss.py (CUDA cases); speed: python benchmarks/bench_loss.py
 */
#include <math.h>
#include <stdint.h>

#include "common.cuh"
#include "yv_kernels.h"

#define DL_THREADS 256
#define DL_FINAL_THREADS 256
#define DL_CIOU_EPS 1e-7f
#define DL_PI 3.14159265358979323846f

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

/* Level of anchor a (at most YV_MAX_LEVELS comparisons), and its row and column there. */
__device__ __forceinline__ int dl_locate(const yv_levels &L, int64_t a, int64_t *h, int64_t *w)
{
    int l = 0;
    while (l + 1 < L.nl && a >= L.offset[l + 1])
        l++;
    int64_t r = a - L.offset[l];
    *h = r / L.W[l];
    *w = r - *h * L.W[l];
    return l;
}

/* Softmax statistics of one side: max m, S = Σ exp(z − m), expectation d = Σ k·p_k. */
__device__ void dl_side(const void *map, yv_dtype dtype, int64_t base, int64_t sc, int R, int s, float *m, float *S,
                        float *d)
{
    float mx = -INFINITY;
    for (int k = 0; k < R; k++)
        mx = fmaxf(mx, yv_load_float(map, dtype, base + (int64_t)(s * R + k) * sc));
    float sum = 0.0f, first = 0.0f;
    for (int k = 0; k < R; k++) {
        float e = expf(yv_load_float(map, dtype, base + (int64_t)(s * R + k) * sc) - mx);
        sum += e;
        first += (float)k * e;
    }
    *m = mx;
    *S = sum;
    *d = first / sum;
}

__device__ __forceinline__ float dl_dmax(float a, float b) { return a > b ? 1.0f : (a == b ? 0.5f : 0.0f); }
__device__ __forceinline__ float dl_dmin(float a, float b) { return a < b ? 1.0f : (a == b ? 0.5f : 0.0f); }

/* CIoU(p, t) and, when g != NULL, dCIoU/dp with α constant: csrc/det_loss_ref.c::ciou in float32. */
__device__ float dl_ciou(const float p[4], const float t[4], float g[4])
{
    const float eps = DL_CIOU_EPS, K = 4.0f / (DL_PI * DL_PI);
    float w1 = p[2] - p[0], h1 = p[3] - p[1] + eps;
    float w2 = t[2] - t[0], h2 = t[3] - t[1] + eps;
    float iw_raw = fminf(p[2], t[2]) - fmaxf(p[0], t[0]);
    float ih_raw = fminf(p[3], t[3]) - fmaxf(p[1], t[1]);
    float iw = iw_raw > 0.0f ? iw_raw : 0.0f, ih = ih_raw > 0.0f ? ih_raw : 0.0f;
    float inter = iw * ih;
    float uni = w1 * h1 + w2 * h2 - inter + eps;
    float iou = inter / uni;
    float cw = fmaxf(p[2], t[2]) - fminf(p[0], t[0]);
    float ch = fmaxf(p[3], t[3]) - fminf(p[1], t[1]);
    float c2 = cw * cw + ch * ch + eps;
    float sx = t[0] + t[2] - p[0] - p[2], sy = t[1] + t[3] - p[1] - p[3];
    float rho2 = (sx * sx + sy * sy) / 4.0f;
    float D = atanf(w2 / h2) - atanf(w1 / h1);
    float v = K * (D * D);
    float alpha = v / (v - iou + (1.0f + eps));
    float out = iou - (rho2 / c2 + v * alpha);
    if (g != NULL) {
        float g_uni = -inter / (uni * uni);
        float g_inter = 1.0f / uni - g_uni;
        float g_w1 = g_uni * h1, g_h1 = g_uni * w1;
        float g_rho2 = -1.0f / c2, g_c2 = rho2 / (c2 * c2);
        float g_D = -alpha * K * 2.0f * D;
        float r1 = w1 / h1;
        float g_r1 = -g_D / (1.0f + r1 * r1);
        g_w1 += g_r1 / h1;
        g_h1 -= g_r1 * w1 / (h1 * h1);
        float g_iw = iw_raw >= 0.0f ? g_inter * ih : 0.0f, g_ih = ih_raw >= 0.0f ? g_inter * iw : 0.0f;
        float g_cw = g_c2 * 2.0f * cw, g_ch = g_c2 * 2.0f * ch;
        g[0] = -g_w1 - g_iw * dl_dmax(p[0], t[0]) - g_cw * dl_dmin(p[0], t[0]) - g_rho2 * sx / 2.0f;
        g[1] = -g_h1 - g_ih * dl_dmax(p[1], t[1]) - g_ch * dl_dmin(p[1], t[1]) - g_rho2 * sy / 2.0f;
        g[2] = g_w1 + g_iw * dl_dmin(p[2], t[2]) + g_cw * dl_dmax(p[2], t[2]) - g_rho2 * sx / 2.0f;
        g[3] = g_h1 + g_ih * dl_dmin(p[3], t[3]) + g_ch * dl_dmax(p[3], t[3]) - g_rho2 * sy / 2.0f;
    }
    return out;
}

/* Left DFL bin, kept inside [0, R − 2] (also for a NaN target) so no read leaves the anchor's channels. */
__device__ __forceinline__ int dl_left(float tau, int R)
{
    if (!(tau >= 0.0f))
        return 0;
    int l = (int)tau;
    return l > R - 2 ? R - 2 : l;
}

/* One foreground anchor's softmax statistics, boxes (grid units) and DFL targets. */
struct dl_fg {
    float m[4], S[4], d[4], pred[4], tgt[4], tau[4];
};

__device__ void dl_fg_prepare(const yv_levels &L, yv_dtype dtype, int R, int lvl, int64_t base, int64_t h,
                              int64_t w, const float *tboxes, int64_t i, float max_dist, struct dl_fg *f)
{
    for (int s = 0; s < 4; s++)
        dl_side(L.data[lvl], dtype, base, L.sc[lvl], R, s, &f->m[s], &f->S[s], &f->d[s]);
    float px = (float)w + 0.5f, py = (float)h + 0.5f, st = (float)L.stride[lvl];
    f->pred[0] = px - f->d[0];
    f->pred[1] = py - f->d[1];
    f->pred[2] = px + f->d[2];
    f->pred[3] = py + f->d[3];
    for (int k = 0; k < 4; k++)
        f->tgt[k] = tboxes[4 * i + k] / st;
    float raw[4] = {px - f->tgt[0], py - f->tgt[1], f->tgt[2] - px, f->tgt[3] - py};
    for (int k = 0; k < 4; k++) {
        float v = raw[k] < 0.0f ? 0.0f : raw[k];
        f->tau[k] = v > max_dist ? max_dist : v;
    }
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
        int lvl = dl_locate(L, a, &h, &w);
        const void *map = L.data[lvl];
        int64_t sc = L.sc[lvl];
        int64_t base = b * L.sb[lvl] + h * L.sh[lvl] + w * L.sw[lvl];
        bool is_fg = fg[i] != 0;
        int64_t label = is_fg ? yv_load_int(labels, label_dtype, i) : -1;
        if (is_fg && (label < 0 || label >= NC))
            *flag = 1;   /* benign race: every writer stores 1 */
        float norm = is_fg ? tnorm[i] : 0.0f;
        for (int64_t c = 0; c < NC; c++) {
            float x = yv_load_float(map, dtype, base + (4 * R + c) * sc);
            float t = (c == label ? norm : 0.0f) * (1.0f - eps) + 0.5f * eps;
            float lw = (pos_weight - 1.0f) * t + 1.0f;
            cls += (1.0f - t) * x + lw * (log1pf(expf(-fabsf(x))) + (x < 0.0f ? -x : 0.0f));
        }
        if (is_fg) {
            struct dl_fg f;
            dl_fg_prepare(L, dtype, R, lvl, base, h, w, tboxes, i, max_dist, &f);
            box = (1.0f - dl_ciou(f.pred, f.tgt, NULL)) * norm;
            for (int s = 0; s < 4; s++) {
                int l = dl_left(f.tau[s], R);
                float wl = (float)(l + 1) - f.tau[s], wr = 1.0f - wl;
                float lse = f.m[s] + logf(f.S[s]);
                float zl = yv_load_float(map, dtype, base + (int64_t)(s * R + l) * sc);
                float zr = yv_load_float(map, dtype, base + (int64_t)(s * R + l + 1) * sc);
                dfl += (lse - zl) * wl + (lse - zr) * wr;
            }
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
    int lvl = dl_locate(L, a, &h, &w);
    const void *map = L.data[lvl];
    void *gmap = G.data[lvl];
    int64_t sc = L.sc[lvl], gsc = G.sc[lvl];
    int64_t base = b * L.sb[lvl] + h * L.sh[lvl] + w * L.sw[lvl];
    int64_t gbase = b * G.sb[lvl] + h * G.sh[lvl] + w * G.sw[lvl];
    bool is_fg = fg[i] != 0;
    int64_t label = is_fg ? yv_load_int(labels, label_dtype, i) : -1;
    float norm = is_fg ? tnorm[i] : 0.0f;
    for (int64_t c = 0; c < NC; c++) {
        float x = yv_load_float(map, dtype, base + (4 * R + c) * sc);
        float t = (c == label ? norm : 0.0f) * (1.0f - eps) + 0.5f * eps;
        float lw = (pos_weight - 1.0f) * t + 1.0f;
        float sig = x >= 0.0f ? 1.0f / (1.0f + expf(-x)) : expf(x) / (1.0f + expf(x));
        dl_store(gmap, dtype, gbase + (4 * R + c) * gsc, g_cls * (lw * sig - pos_weight * t));
    }
    if (!is_fg) {
        for (int k = 0; k < 4 * R; k++)
            dl_store(gmap, dtype, gbase + (int64_t)k * gsc, 0.0f);
        return;
    }
    struct dl_fg f;
    dl_fg_prepare(L, dtype, R, lvl, base, h, w, tboxes, i, max_dist, &f);
    float gp[4];
    (void)dl_ciou(f.pred, f.tgt, gp);
    float gb = -g_box * norm;
    float gd[4] = {-gb * gp[0], -gb * gp[1], gb * gp[2], gb * gp[3]};
    float gdfl = g_dfl * norm / 4.0f;
    for (int s = 0; s < 4; s++) {
        int l = dl_left(f.tau[s], R);
        float wl = (float)(l + 1) - f.tau[s], wr = 1.0f - wl;
        float invS = 1.0f / f.S[s];
        for (int k = 0; k < R; k++) {
            float p = expf(yv_load_float(map, dtype, base + (int64_t)(s * R + k) * sc) - f.m[s]) * invS;
            float g = gd[s] * p * ((float)k - f.d[s])
                      + gdfl * ((wl + wr) * p - (k == l ? wl : 0.0f) - (k == l + 1 ? wr : 0.0f));
            dl_store(gmap, dtype, gbase + (int64_t)(s * R + k) * gsc, g);
        }
    }
}

__global__ void det_loss_decode_kernel(yv_levels L, yv_dtype dtype, int R, float *boxes)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= L.B * L.A)
        return;
    int64_t b = i / L.A, a = i - b * L.A, h, w;
    int lvl = dl_locate(L, a, &h, &w);
    int64_t base = b * L.sb[lvl] + h * L.sh[lvl] + w * L.sw[lvl];
    float m, S, d[4];
    for (int s = 0; s < 4; s++)
        dl_side(L.data[lvl], dtype, base, L.sc[lvl], R, s, &m, &S, &d[s]);
    float px = (float)w + 0.5f, py = (float)h + 0.5f, st = (float)L.stride[lvl];
    float4 o = make_float4((px - d[0]) * st, (py - d[1]) * st, (px + d[2]) * st, (py + d[3]) * st);
    ((float4 *)boxes)[i] = o;   /* boxes is contiguous (B, A, 4) float32 from torch: 16-byte aligned */
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
    int64_t n = maps->B * maps->A;
    if (n == 0)
        return cudaSuccess;
    int64_t blocks = yv_ceil_div(n, DL_THREADS);
    if (blocks > INT32_MAX)
        return cudaErrorInvalidValue;
    det_loss_bwd_kernel<<<(unsigned)blocks, DL_THREADS, 0, stream>>>(*maps, dtype, reg_max, labels, label_dtype,
                                                                     tboxes, tnorm, fg, tss, eps, pos_weight,
                                                                     max_dist, grad_out, *grads);
    return cudaGetLastError();
}

extern "C" cudaError_t yv_det_loss_decode(const yv_levels *maps, yv_dtype dtype, int reg_max, float *boxes,
                                          cudaStream_t stream)
{
    int64_t n = maps->B * maps->A;
    if (n == 0)
        return cudaSuccess;
    int64_t blocks = yv_ceil_div(n, DL_THREADS);
    if (blocks > INT32_MAX)
        return cudaErrorInvalidValue;
    det_loss_decode_kernel<<<(unsigned)blocks, DL_THREADS, 0, stream>>>(*maps, dtype, reg_max, boxes);
    return cudaGetLastError();
}
