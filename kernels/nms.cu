/* nms.cu — class-aware greedy non-maximum suppression on the GPU (forward only: NMS has no gradient).
 *
 * Maths: exactly that of csrc/nms_ref.c (stated there): order by score descending, ties by lower index,
 * NaN scores first; a kept box suppresses later boxes of its class with IoU > iou_thres, IoU computed in
 * float32 with the same operation order. Rounding-exact intrinsics (__fmul_rn, ...) keep nvcc from fusing
 * a multiply into an add, so the kept set equals the CPU reference's bit for bit.
 *
 * Three launches on the caller's stream, no host synchronisation:
 *   1. nms_rank_kernel   rank of each box in the sorted order by counting (O(n^2) comparisons, no sort
 *                        library and no extra memory); scatters boxes, classes and indices to sorted slots.
 *   2. nms_mask_kernel   suppression bits: for sorted rows i < j, bit j of row i = same class and
 *                        IoU > thr. Stored upper-triangular in 64-bit words: chunk row c (rows 64c..64c+63)
 *                        keeps words c..W-1 only, W = ceil(n/64): 64*W*(W+1)/2 words, about n*n/16 bytes.
 *   3. nms_scan_kernel   one block walks the chunks in order: resolves the 64 boxes of a chunk serially
 *                        against the "removed" bits (one thread, bit tricks), then ORs the kept rows into
 *                        the removed bits of all later chunks in parallel. Writes keep[] and *count.
 * Workspace (yv_nms_workspace_size): sorted boxes float4[n] | sorted classes i64[n] | order i32[n] |
 *   removed u64[W] (used when W*8 exceeds the shared-memory budget) | mask u64[64*W*(W+1)/2].
 * Nothing is saved for backward. Outputs are written (=), never accumulated.
 * Test: python -m pytest -q tests/ops/test_nms.py (CUDA cases); speed: python benchmarks/bench_nms.py
 */
#include <stdint.h>

#include "common.cuh"
#include "yv_kernels.h"

#define NMS_RANK_THREADS 128
#define NMS_SCAN_THREADS 256
/* Dynamic shared memory for the removed bits, leaving room for the static arrays under the 48 KiB a block
 * may use without opting in: up to 5120 words, n <= 327 680. */
#define NMS_SCAN_SMEM_MAX (40 * 1024)

/* Same monotone key as csrc/nms_ref.c::score_key: NaN above +inf, -0 == +0. */
__device__ __forceinline__ uint32_t nms_score_key(float s)
{
    if (s != s)
        return 0xffffffffu;
    if (s == 0.0f)
        s = 0.0f;
    uint32_t bits = __float_as_uint(s);
    return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

/* Ascending order of this key = score descending, then index ascending. */
__device__ __forceinline__ uint64_t nms_sort_key(const void *scores, yv_dtype dtype, int64_t i)
{
    return ((uint64_t)(~nms_score_key(yv_load_float(scores, dtype, i))) << 32) | (uint64_t)i;
}

/* IoU(a, b) with a the higher-ranked box, operation for operation as csrc/nms_ref.c::iou. */
__device__ __forceinline__ float nms_iou(float4 a, float4 b)
{
    float ix1 = a.x > b.x ? a.x : b.x;
    float iy1 = a.y > b.y ? a.y : b.y;
    float ix2 = a.z < b.z ? a.z : b.z;
    float iy2 = a.w < b.w ? a.w : b.w;
    float iw = __fsub_rn(ix2, ix1), ih = __fsub_rn(iy2, iy1);
    iw = iw > 0.0f ? iw : 0.0f;
    ih = ih > 0.0f ? ih : 0.0f;
    float inter = __fmul_rn(iw, ih);
    float area_a = __fmul_rn(__fsub_rn(a.z, a.x), __fsub_rn(a.w, a.y));
    float area_b = __fmul_rn(__fsub_rn(b.z, b.x), __fsub_rn(b.w, b.y));
    return __fdiv_rn(inter, __fsub_rn(__fadd_rn(area_a, area_b), inter));
}

/* Word offset of sorted row i (in chunk row c = i / 64) in the triangular mask: rows of chunk row k hold
 * W - k words, so chunk rows before c take 64 * (c*W - c*(c-1)/2) words. */
__device__ __forceinline__ int64_t nms_row_offset(int64_t i, int64_t W)
{
    int64_t c = i >> 6;
    return 64 * (c * W - c * (c - 1) / 2) + (i - 64 * c) * (W - c);
}

__global__ void nms_rank_kernel(const void *boxes, const void *scores, yv_dtype dtype, const void *classes,
                                yv_dtype cls_dtype, int n, float4 *sboxes, int64_t *scls, int32_t *order)
{
    __shared__ uint64_t tile[NMS_RANK_THREADS];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    uint64_t key = i < n ? nms_sort_key(scores, dtype, i) : 0;
    int rank = 0;
    for (int base = 0; base < n; base += NMS_RANK_THREADS) {
        int j = base + threadIdx.x;
        /* Padding with the largest key never counts as "before" anything. */
        tile[threadIdx.x] = j < n ? nms_sort_key(scores, dtype, j) : UINT64_MAX;
        __syncthreads();
#pragma unroll 8
        for (int k = 0; k < NMS_RANK_THREADS; k++)
            rank += tile[k] < key;
        __syncthreads();
    }
    if (i >= n)
        return;
    sboxes[rank] = make_float4(yv_load_float(boxes, dtype, 4 * (int64_t)i + 0),
                               yv_load_float(boxes, dtype, 4 * (int64_t)i + 1),
                               yv_load_float(boxes, dtype, 4 * (int64_t)i + 2),
                               yv_load_float(boxes, dtype, 4 * (int64_t)i + 3));
    scls[rank] = classes ? yv_load_int(classes, cls_dtype, i) : 0;
    order[rank] = i;
}

/* grid (W, W), block 64: block (cc, rc) fills word cc of the 64 rows of chunk row rc (cc >= rc only). */
__global__ void nms_mask_kernel(const float4 *sboxes, const int64_t *scls, int n, int W, float thr,
                                uint64_t *mask)
{
    int cc = blockIdx.x, rc = blockIdx.y;
    if (cc < rc)
        return;
    __shared__ float4 cbox[64];
    __shared__ int64_t ccls[64];
    int j0 = cc * 64;
    if (j0 + (int)threadIdx.x < n) {
        cbox[threadIdx.x] = sboxes[j0 + threadIdx.x];
        ccls[threadIdx.x] = scls[j0 + threadIdx.x];
    }
    __syncthreads();
    int i = rc * 64 + threadIdx.x;
    if (i >= n)
        return;
    float4 a = sboxes[i];
    int64_t ca = scls[i];
    int cols = min(64, n - j0);
    /* Only later boxes (j > i) can be suppressed by row i. */
    int k0 = cc == rc ? (int)threadIdx.x + 1 : 0;
    uint64_t bits = 0;
    for (int k = k0; k < cols; k++) {
        if (ccls[k] == ca && nms_iou(a, cbox[k]) > thr)
            bits |= 1ull << k;
    }
    mask[nms_row_offset(i, W) + (cc - rc)] = bits;
}

/* One block. removed_global is used when the W removed words do not fit the dynamic shared memory. */
__global__ void nms_scan_kernel(const uint64_t *mask, const int32_t *order, int n, int W, int use_shared,
                                uint64_t *removed_global, int64_t *keep, int64_t *count)
{
    extern __shared__ uint64_t removed_shared[];
    __shared__ uint64_t diag[2][64];   /* word c of each row of chunk c, double-buffered */
    __shared__ int32_t ord[2][64];
    __shared__ uint64_t kept_word;
    uint64_t *removed = use_shared ? removed_shared : removed_global;
    int tid = threadIdx.x;
    for (int w = tid; w < W; w += blockDim.x)
        removed[w] = 0;
    if (tid < 64 && tid < n) {
        diag[0][tid] = mask[nms_row_offset(tid, W)];
        ord[0][tid] = order[tid];
    }
    __syncthreads();

    int64_t kept = 0;   /* meaningful in thread 0 only */
    for (int c = 0; c < W; c++) {
        int buf = c & 1;
        int rows = min(64, n - 64 * c);
        if (tid == 0) {
            /* Serial within the chunk: each kept box may remove later boxes of the same chunk. */
            uint64_t valid = rows == 64 ? ~0ull : ((1ull << rows) - 1);
            uint64_t rem = removed[c];
            uint64_t avail = ~rem & valid;
            uint64_t kw = 0;
            while (avail) {
                int t = __ffsll((long long)avail) - 1;
                kw |= 1ull << t;
                keep[kept++] = ord[buf][t];
                rem |= diag[buf][t];
                avail = t == 63 ? 0 : (~rem & valid & (~0ull << (t + 1)));
            }
            kept_word = kw;
        }
        /* Prefetch chunk c+1's diagonal words and indices; they do not depend on the scan. */
        int next = 64 * (c + 1) + tid;
        uint64_t next_diag = 0;
        int32_t next_ord = 0;
        bool prefetch = tid < 64 && c + 1 < W && next < n;
        if (prefetch) {
            next_diag = mask[nms_row_offset(next, W)];
            next_ord = order[next];
        }
        __syncthreads();
        uint64_t kw = kept_word;
        if (kw) {
            for (int w = c + 1 + tid; w < W; w += blockDim.x) {
                uint64_t acc = removed[w];
                uint64_t bitsleft = kw;
                while (bitsleft) {
                    int t = __ffsll((long long)bitsleft) - 1;
                    bitsleft &= bitsleft - 1;
                    acc |= mask[nms_row_offset(64 * (int64_t)c + t, W) + (w - c)];
                }
                removed[w] = acc;
            }
        }
        if (prefetch) {
            diag[buf ^ 1][tid] = next_diag;
            ord[buf ^ 1][tid] = next_ord;
        }
        __syncthreads();
    }
    if (tid == 0)
        *count = kept;
}

struct nms_layout {
    size_t sboxes, scls, order, removed, mask, total;
};

static struct nms_layout nms_plan(int64_t n)
{
    struct nms_layout L;
    size_t un = (size_t)(n > 0 ? n : 0);
    size_t W = (size_t)yv_ceil_div((int64_t)un, 64);
    L.sboxes = 0;
    L.scls = L.sboxes + yv_align256(un * 16);
    L.order = L.scls + yv_align256(un * 8);
    L.removed = L.order + yv_align256(un * 4);
    L.mask = L.removed + yv_align256(W * 8);
    L.total = L.mask + yv_align256(64 * W * (W + 1) / 2 * 8);
    return L;
}

extern "C" size_t yv_nms_workspace_size(int64_t n)
{
    return nms_plan(n).total;
}

extern "C" cudaError_t yv_nms_forward(const void *boxes, const void *scores, yv_dtype dtype, const void *classes,
                                      yv_dtype cls_dtype, int64_t n, float iou_thres, void *workspace,
                                      int64_t *keep, int64_t *count, cudaStream_t stream)
{
    if (n == 0)
        return cudaMemsetAsync(count, 0, sizeof(int64_t), stream);
    int64_t W = yv_ceil_div(n, 64);
    if (n > INT32_MAX || W > 65535)   /* grid.y limit of the mask kernel */
        return cudaErrorInvalidValue;
    struct nms_layout L = nms_plan(n);
    char *ws = (char *)workspace;
    float4 *sboxes = (float4 *)(ws + L.sboxes);
    int64_t *scls = (int64_t *)(ws + L.scls);
    int32_t *order = (int32_t *)(ws + L.order);
    uint64_t *removed = (uint64_t *)(ws + L.removed);
    uint64_t *mask = (uint64_t *)(ws + L.mask);

    int ni = (int)n, Wi = (int)W;
    nms_rank_kernel<<<(unsigned)yv_ceil_div(n, NMS_RANK_THREADS), NMS_RANK_THREADS, 0, stream>>>(
        boxes, scores, dtype, classes, cls_dtype, ni, sboxes, scls, order);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess)
        return err;
    nms_mask_kernel<<<dim3((unsigned)Wi, (unsigned)Wi), 64, 0, stream>>>(sboxes, scls, ni, Wi, iou_thres, mask);
    err = cudaGetLastError();
    if (err != cudaSuccess)
        return err;
    size_t smem = (size_t)W * 8;
    int use_shared = smem <= NMS_SCAN_SMEM_MAX;
    nms_scan_kernel<<<1, NMS_SCAN_THREADS, use_shared ? smem : 0, stream>>>(mask, order, ni, Wi, use_shared,
                                                                          removed, keep, count);
    return cudaGetLastError();
}
