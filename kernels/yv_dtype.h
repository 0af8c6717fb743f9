/* yv_dtype.h — the element-type codes that cross the C boundary, shared by csrc/ (gcc) and kernels/ (nvcc).
 *
 * Python reads the same codes from the module (yolov9c._C.DTYPE_FLOAT32, ...), so they are defined once,
 * here. Plain C with no includes: it compiles as C11 and as CUDA C++.
 * Test: tests/ops/test_build.py checks the exported codes; tests/ops/test_nms.py exercises them.
 */
#ifndef YV_DTYPE_H
#define YV_DTYPE_H

typedef enum yv_dtype {
    YV_FLOAT32 = 0,
    YV_FLOAT16 = 1,
    YV_BFLOAT16 = 2,
    YV_FLOAT64 = 3,
    YV_INT8 = 4,
    YV_INT16 = 5,
    YV_INT32 = 6,
    YV_INT64 = 7,
    YV_UINT8 = 8,
    YV_BOOL = 9,
    YV_NUM_DTYPES = 10
} yv_dtype;

/* Bit for a dtype in an "allowed dtypes" mask: YV_DT(YV_FLOAT32) | YV_DT(YV_FLOAT16). */
#define YV_DT(code) (1u << (unsigned)(code))

#endif /* YV_DTYPE_H */
