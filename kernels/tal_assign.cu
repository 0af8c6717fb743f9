/* tal_assign.cu — task-aligned label assignment (YOLOv9's TaskAlignedAssigner) on the GPU, forward only
 * (assignment has no gradient), without any (B, M, A) array.
 *
 * Maths: exactly that of csrc/tal_assign_ref.c (stated there), operation for operation: float32 CIoU and
 * metric with rounding-exact intrinsics (__fmul_rn, ...) so that nvcc fuses no multiply-add; atan, pow and
 * the sigmoid's exp in float64, rounded, as the C code does, so both give the same assignment bit for bit.
 *
 * Five launches on the caller's stream, no host synchronisation:
 *   1. tal_anchor_init_kernel  per anchor: atan(w/h) of its predicted box; hit count 0, first box INT_MAX.
 *   2. tal_topk_kernel         one block per (image, box): scans every anchor, keeps per thread the top-k
 *                              (metric, lower index) keys of the anchors inside the box with metric > 0, merges
 *                              the thread lists in shared memory (k rounds of a block max), completes the list
 *                              with the lowest-index anchors of metric 0 that are inside (see the reference's
 *                              tie rule), writes the box's candidates (-1 = none). Also the box's atan term
 *                              and zeroed maxima.
 *   3. tal_count_kernel        per candidate: hit count and lowest box index of its anchor (atomics; the
 *                              result does not depend on their order).
 *   4. tal_resolve_kernel      per anchor: its box (the one hit, or for several hits the argmax of CIoU over
 *                              all M boxes, first index on ties); labels, boxes, fg, gt_idx; its metric kept in
 *                              target_norm; the box's max metric and max CIoU by atomicMax on the float bits
 *                              (all values >= +0, so the unsigned order is the float order).
 *   5. tal_norm_kernel         per anchor: norm = (metric * max CIoU) / (max metric + eps), 0 for background.
 * Workspace (yv_tal_assign_workspace_size), O(B·A + B·M·topk): p_atan f32[B·A] | count i32[B·A] |
 *   first i32[B·A] | g_atan f32[B·M] | box max metric u32[B·M] | box max CIoU u32[B·M] | cand i32[B·M·k].
 * Nothing is saved for backward. Outputs are written (=), never accumulated.
 * Test: python -m pytest -q tests/ops/test_tal_assign.py (CUDA cases)
 */
#include <stdint.h>

#include "common.cuh"
#include "yv_kernels.h"

#define TAL_THREADS 128      /* tal_topk_kernel: shared lists take TAL_THREADS * topk * 8 bytes (32 KiB max) */
#define TAL_ELEM_THREADS 256
#define TAL_CIOU_EPS 1e-7f
#define TAL_INSIDE_EPS 1e-9f
#define TAL_V_COEF ((float)(4.0 / (3.14159265358979323846 * 3.14159265358979323846)))
#define TAL_ONE_PLUS_EPS ((float)(1.0 + 1e-7))

struct tal_score {
    const void *p;
    yv_dtype dtype;
    int64_t s0, s1, s2;
    int logits;
    int64_t nc;
    double alpha;
};

__device__ __forceinline__ float tal_round(yv_dtype dtype, float f)
{
    if (dtype == YV_FLOAT16)
        return __half2float(__float2half_rn(f));
    if (dtype == YV_BFLOAT16)
        return __bfloat162float(__float2bfloat16_rn(f));
    return f;
}

/* x^e as csrc/tal_assign_ref.c::pow_f32 (torch's special cases, else float64 pow rounded). */
__device__ __forceinline__ float tal_pow(float x, double e)
{
    if (e == 0.5)
        return __fsqrt_rn(x);
    if (e == 2.0)
        return __fmul_rn(x, x);
    if (e == 3.0)
        return __fmul_rn(__fmul_rn(x, x), x);
    return (float)pow((double)x, e);
}

/* s^alpha of score (b, a, c), rounded like the reference's arithmetic in the scores' dtype. */
__device__ __forceinline__ float tal_score_pow(const struct tal_score *S, int64_t b, int64_t a, int64_t c)
{
    if (c < 0 || c >= S->nc)
        return 0.0f;
    float s = yv_load_float(S->p, S->dtype, b * S->s0 + a * S->s1 + c * S->s2);
    if (S->logits)
        s = tal_round(S->dtype, (float)(1.0 / (1.0 + exp(-(double)s))));
    return tal_round(S->dtype, tal_pow(s, S->alpha));
}

__device__ __forceinline__ float tal_max(float a, float b) { return a > b ? a : b; }
__device__ __forceinline__ float tal_min(float a, float b) { return a < b ? a : b; }

__device__ __forceinline__ float tal_atan_ratio(float4 b)
{
    float w = __fsub_rn(b.z, b.x), h = __fadd_rn(__fsub_rn(b.w, b.y), TAL_CIOU_EPS);
    return (float)atan((double)__fdiv_rn(w, h));
}

/* CIoU(gt g, prediction p) clamped at 0, as csrc/tal_assign_ref.c::ciou. */
__device__ __forceinline__ float tal_ciou(float4 g, float g_atan, float4 p, float p_atan)
{
    float w1 = __fsub_rn(g.z, g.x), h1 = __fadd_rn(__fsub_rn(g.w, g.y), TAL_CIOU_EPS);
    float w2 = __fsub_rn(p.z, p.x), h2 = __fadd_rn(__fsub_rn(p.w, p.y), TAL_CIOU_EPS);
    float iw = __fsub_rn(tal_min(g.z, p.z), tal_max(g.x, p.x));
    float ih = __fsub_rn(tal_min(g.w, p.w), tal_max(g.y, p.y));
    iw = iw > 0.0f ? iw : 0.0f;
    ih = ih > 0.0f ? ih : 0.0f;
    float inter = __fmul_rn(iw, ih);
    float uni = __fadd_rn(__fsub_rn(__fadd_rn(__fmul_rn(w1, h1), __fmul_rn(w2, h2)), inter), TAL_CIOU_EPS);
    float iou = __fdiv_rn(inter, uni);
    float cw = __fsub_rn(tal_max(g.z, p.z), tal_min(g.x, p.x));
    float ch = __fsub_rn(tal_max(g.w, p.w), tal_min(g.y, p.y));
    float c2 = __fadd_rn(__fadd_rn(__fmul_rn(cw, cw), __fmul_rn(ch, ch)), TAL_CIOU_EPS);
    float dx = __fsub_rn(__fsub_rn(__fadd_rn(p.x, p.z), g.x), g.z);
    float dy = __fsub_rn(__fsub_rn(__fadd_rn(p.y, p.w), g.y), g.w);
    float rho2 = __fdiv_rn(__fadd_rn(__fmul_rn(dx, dx), __fmul_rn(dy, dy)), 4.0f);
    float d = __fsub_rn(p_atan, g_atan);
    float v = __fmul_rn(TAL_V_COEF, __fmul_rn(d, d));
    float alpha = __fdiv_rn(v, __fadd_rn(__fsub_rn(v, iou), TAL_ONE_PLUS_EPS));
    float c = __fsub_rn(iou, __fadd_rn(__fdiv_rn(rho2, c2), __fmul_rn(v, alpha)));
    return c > 0.0f ? c : 0.0f;
}

__device__ __forceinline__ int tal_inside(float2 pt, float4 g)
{
    float d = tal_min(__fsub_rn(pt.x, g.x), __fsub_rn(pt.y, g.y));
    d = tal_min(d, __fsub_rn(g.z, pt.x));
    d = tal_min(d, __fsub_rn(g.w, pt.y));
    return d > TAL_INSIDE_EPS;
}

__device__ __forceinline__ float4 tal_box(const float *p, int64_t i)
{
    return make_float4(p[4 * i], p[4 * i + 1], p[4 * i + 2], p[4 * i + 3]);
}

__global__ void tal_anchor_init_kernel(const float *pred, int64_t n, float *p_atan, int32_t *count,
                                       int32_t *first)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    p_atan[i] = tal_atan_ratio(tal_box(pred, i));
    count[i] = 0;
    first[i] = INT32_MAX;
}

/* Sort key: metric bits (> 0, so monotone as unsigned) high, then the complemented index (lower index wins). */
__device__ __forceinline__ uint64_t tal_key(float v, int a)
{
    return ((uint64_t)__float_as_uint(v) << 32) | (uint64_t)(0xffffffffu - (uint32_t)a);
}

__global__ void __launch_bounds__(TAL_THREADS)
tal_topk_kernel(struct tal_score S, const float *pred, const float *points, const int64_t *labels,
                const float *gt, const uint8_t *mask, int A, int M, int k, double beta, const float *p_atan,
                float *g_atan, unsigned *box_align, unsigned *box_iou, int32_t *cand)
{
    extern __shared__ uint64_t lists[];   /* TAL_THREADS * k keys */
    __shared__ uint64_t warp_best[TAL_THREADS / 32];
    __shared__ uint64_t chosen[YV_TAL_MAX_TOPK];
    __shared__ int n_chosen;
    int64_t bm = blockIdx.x;
    int64_t b = bm / M;
    int tid = threadIdx.x;
    float4 g = tal_box(gt, bm);
    float ga = tal_atan_ratio(g);
    int32_t *out = cand + bm * k;
    if (tid == 0) {
        g_atan[bm] = ga;
        box_align[bm] = 0u;
        box_iou[bm] = 0u;
    }
    if (!mask[bm]) {
        for (int i = tid; i < k; i += blockDim.x)
            out[i] = -1;
        return;
    }
    int64_t c = labels[bm];

    uint64_t keys[YV_TAL_MAX_TOPK];
    int n = 0;
    for (int a = tid; a < A; a += blockDim.x) {
        float2 pt = make_float2(points[2 * a], points[2 * a + 1]);
        if (!tal_inside(pt, g))
            continue;
        int64_t ba = b * A + a;
        float cp = tal_pow(tal_ciou(g, ga, tal_box(pred, ba), p_atan[ba]), beta);
        float v = __fmul_rn(tal_score_pow(&S, b, a, c), cp);
        if (!(v > 0.0f))
            continue;
        uint64_t key = tal_key(v, a);
        int i;
        if (n < k) {
            i = n++;
        } else {
            if (key <= keys[k - 1])
                continue;
            i = k - 1;
        }
        while (i > 0 && key > keys[i - 1]) {
            keys[i] = keys[i - 1];
            i--;
        }
        keys[i] = key;
    }
    for (int i = 0; i < k; i++)
        lists[tid * k + i] = i < n ? keys[i] : 0ull;
    if (tid == 0)
        n_chosen = 0;
    __syncthreads();

    /* k rounds: the block's largest remaining key is at the head of one thread's sorted list. */
    int head = 0;
    for (int r = 0; r < k; r++) {
        uint64_t mine = head < k ? lists[tid * k + head] : 0ull;
        uint64_t best = mine;
        for (int off = 16; off > 0; off >>= 1) {
            uint64_t o = __shfl_xor_sync(0xffffffffu, best, off);
            best = o > best ? o : best;
        }
        if ((tid & 31) == 0)
            warp_best[tid >> 5] = best;
        __syncthreads();
        best = warp_best[0];
        for (int w = 1; w < TAL_THREADS / 32; w++)
            best = warp_best[w] > best ? warp_best[w] : best;
        __syncthreads();   /* warp_best is rewritten next round */
        if (best == 0ull)
            break;
        if (mine == best)
            head++;
        if (tid == 0) {
            chosen[r] = best;
            n_chosen = r + 1;
        }
    }
    __syncthreads();

    if (tid == 0) {
        int np = n_chosen;
        for (int i = 0; i < np; i++)
            out[i] = (int32_t)(0xffffffffu - (uint32_t)(chosen[i] & 0xffffffffull));
        /* fewer than k anchors of metric > 0: the lowest-index anchors of metric 0 fill the list (all < k) */
        int fill = k - np, slot = np;
        for (int j = 0; j < k && fill > 0; j++) {
            int listed = 0;
            for (int i = 0; i < np; i++)
                listed |= out[i] == j;
            if (listed)
                continue;
            fill--;
            out[slot++] = tal_inside(make_float2(points[2 * j], points[2 * j + 1]), g) ? j : -1;
        }
    }
}

__global__ void tal_count_kernel(const int32_t *cand, int64_t n, int M, int A, int k, int32_t *count,
                                 int32_t *first)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    int32_t a = cand[i];
    if (a < 0)
        return;
    int64_t bm = i / k;
    int64_t b = bm / M;
    int m = (int)(bm - b * M);
    atomicAdd(&count[b * A + a], 1);
    atomicMin(&first[b * A + a], m);
}

__global__ void tal_resolve_kernel(struct tal_score S, const float *pred, const int64_t *labels, const float *gt,
                                   int64_t B, int A, int M, double beta, const float *p_atan, const int32_t *count,
                                   const int32_t *first, const float *g_atan, unsigned *box_align,
                                   unsigned *box_iou, int64_t *t_labels, float *t_boxes, float *t_norm,
                                   uint8_t *fg, int64_t *gt_idx)
{
    int64_t ba = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (ba >= B * A)
        return;
    int64_t b = ba / A, a = ba - b * A;
    int32_t c = count[ba];
    int m = 0;
    float iou = 0.0f;
    float4 p = tal_box(pred, ba);
    float pa = p_atan[ba];
    if (c == 1) {
        m = first[ba];
        iou = tal_ciou(tal_box(gt, b * M + m), g_atan[b * M + m], p, pa);
    } else if (c > 1) {
        float best = -1.0f;
        for (int mm = 0; mm < M; mm++) {
            float o = tal_ciou(tal_box(gt, b * M + mm), g_atan[b * M + mm], p, pa);
            if (o > best) {
                best = o;
                m = mm;
            }
        }
        iou = best;
    }
    int64_t bm = b * M + m;
    t_labels[ba] = labels[bm];
    float4 g = tal_box(gt, bm);
    t_boxes[4 * ba] = g.x;
    t_boxes[4 * ba + 1] = g.y;
    t_boxes[4 * ba + 2] = g.z;
    t_boxes[4 * ba + 3] = g.w;
    gt_idx[ba] = m;
    fg[ba] = c > 0;
    float v = 0.0f;
    if (c > 0) {
        v = __fmul_rn(tal_score_pow(&S, b, a, labels[bm]), tal_pow(iou, beta));
        v = v > 0.0f ? v : 0.0f;
        atomicMax(&box_align[bm], __float_as_uint(v));
        atomicMax(&box_iou[bm], __float_as_uint(iou));
    }
    t_norm[ba] = v;
}

__global__ void tal_norm_kernel(int64_t n, int A, int M, float eps, const unsigned *box_align,
                                const unsigned *box_iou, const uint8_t *fg, const int64_t *gt_idx, float *t_norm)
{
    int64_t ba = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (ba >= n)
        return;
    if (!fg[ba]) {
        t_norm[ba] = 0.0f;
        return;
    }
    int64_t bm = (ba / A) * M + gt_idx[ba];
    float max_align = __uint_as_float(box_align[bm]), max_iou = __uint_as_float(box_iou[bm]);
    t_norm[ba] = __fdiv_rn(__fmul_rn(t_norm[ba], max_iou), __fadd_rn(max_align, eps));
}

struct tal_layout {
    size_t p_atan, count, first, g_atan, box_align, box_iou, cand, total;
};

static struct tal_layout tal_plan(int64_t B, int64_t M, int64_t A, int64_t k)
{
    struct tal_layout L;
    size_t ba = (size_t)(B * A), bm = (size_t)(B * M);
    L.p_atan = 0;
    L.count = L.p_atan + yv_align256(ba * 4);
    L.first = L.count + yv_align256(ba * 4);
    L.g_atan = L.first + yv_align256(ba * 4);
    L.box_align = L.g_atan + yv_align256(bm * 4);
    L.box_iou = L.box_align + yv_align256(bm * 4);
    L.cand = L.box_iou + yv_align256(bm * 4);
    L.total = L.cand + yv_align256(bm * (size_t)k * 4);
    return L;
}

extern "C" size_t yv_tal_assign_workspace_size(int64_t B, int64_t M, int64_t A, int64_t topk)
{
    return tal_plan(B > 0 ? B : 0, M > 0 ? M : 0, A > 0 ? A : 0, topk > 0 ? topk : 0).total;
}

extern "C" cudaError_t yv_tal_assign_forward(const void *scores, yv_dtype score_dtype,
                                             const int64_t score_strides[3], int logits, int64_t B, int64_t A,
                                             int64_t NC, const float *pred_boxes, const float *points,
                                             const int64_t *gt_labels, const float *gt_boxes,
                                             const uint8_t *gt_mask, int64_t M, int topk, double alpha,
                                             double beta, double eps, void *workspace, int64_t *target_labels,
                                             float *target_boxes, float *target_norm, uint8_t *fg,
                                             int64_t *gt_idx, cudaStream_t stream)
{
    if (B == 0)
        return cudaSuccess;
    if (M < 1 || A < 1 || A >= INT32_MAX || M >= INT32_MAX || topk < 1 || topk > YV_TAL_MAX_TOPK
        || B * M > INT32_MAX)   /* one block per (image, box) */
        return cudaErrorInvalidValue;
    int k = (int)(topk < A ? topk : A);
    struct tal_layout L = tal_plan(B, M, A, topk);
    char *ws = (char *)workspace;
    float *p_atan = (float *)(ws + L.p_atan);
    int32_t *count = (int32_t *)(ws + L.count);
    int32_t *first = (int32_t *)(ws + L.first);
    float *g_atan = (float *)(ws + L.g_atan);
    unsigned *box_align = (unsigned *)(ws + L.box_align);
    unsigned *box_iou = (unsigned *)(ws + L.box_iou);
    int32_t *cand = (int32_t *)(ws + L.cand);
    struct tal_score S = {scores, score_dtype, score_strides[0], score_strides[1], score_strides[2], logits, NC,
                          alpha};
    int Ai = (int)A, Mi = (int)M;
    int64_t nba = B * A, ncand = B * M * k;

    tal_anchor_init_kernel<<<(unsigned)yv_ceil_div(nba, TAL_ELEM_THREADS), TAL_ELEM_THREADS, 0, stream>>>(
        pred_boxes, nba, p_atan, count, first);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess)
        return err;
    size_t smem = (size_t)TAL_THREADS * (size_t)k * sizeof(uint64_t);
    tal_topk_kernel<<<(unsigned)(B * M), TAL_THREADS, smem, stream>>>(
        S, pred_boxes, points, gt_labels, gt_boxes, gt_mask, Ai, Mi, k, beta, p_atan, g_atan, box_align, box_iou,
        cand);
    err = cudaGetLastError();
    if (err != cudaSuccess)
        return err;
    tal_count_kernel<<<(unsigned)yv_ceil_div(ncand, TAL_ELEM_THREADS), TAL_ELEM_THREADS, 0, stream>>>(
        cand, ncand, Mi, Ai, k, count, first);
    err = cudaGetLastError();
    if (err != cudaSuccess)
        return err;
    tal_resolve_kernel<<<(unsigned)yv_ceil_div(nba, TAL_ELEM_THREADS), TAL_ELEM_THREADS, 0, stream>>>(
        S, pred_boxes, gt_labels, gt_boxes, B, Ai, Mi, beta, p_atan, count, first, g_atan, box_align, box_iou,
        target_labels, target_boxes, target_norm, fg, gt_idx);
    err = cudaGetLastError();
    if (err != cudaSuccess)
        return err;
    tal_norm_kernel<<<(unsigned)yv_ceil_div(nba, TAL_ELEM_THREADS), TAL_ELEM_THREADS, 0, stream>>>(
        nba, Ai, Mi, (float)eps, box_align, box_iou, fg, gt_idx, target_norm);
    return cudaGetLastError();
}
