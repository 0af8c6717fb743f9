/* common.cuh — small helpers shared by the kernels/<op>.cu files: element loads that upcast to float32,
 * ceil division, workspace carving. CUDA C++ used as C (no classes, no templates beyond loads).
 * Test: through each op's tests (tests/ops/test_<op>.py, CUDA cases).
 */
#ifndef YV_COMMON_CUH
#define YV_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "yv_dtype.h"

static inline int64_t yv_ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* Round a workspace offset up so every carved region starts 256-byte aligned. */
static inline size_t yv_align256(size_t bytes) { return (bytes + 255u) & ~(size_t)255u; }

/* Element i of a float32/float16/bfloat16 array as float32 (exact for all three). */
__device__ __forceinline__ float yv_load_float(const void *p, yv_dtype dtype, int64_t i)
{
    if (dtype == YV_FLOAT16)
        return __half2float(((const __half *)p)[i]);
    if (dtype == YV_BFLOAT16)
        return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    return ((const float *)p)[i];
}

/* Element i of an int32/int64 array as int64. */
__device__ __forceinline__ int64_t yv_load_int(const void *p, yv_dtype dtype, int64_t i)
{
    return dtype == YV_INT32 ? (int64_t)((const int32_t *)p)[i] : ((const int64_t *)p)[i];
}

#endif /* YV_COMMON_CUH */
