/* nms.c — bindings of the class-aware NMS op: nms_forward and nms_workspace_size.
 *
 * Checks every argument (raising ValueError/TypeError that name "nms_forward" and the argument), then
 * releases the GIL and runs csrc/nms_ref.c (CPU) or kernels/nms.cu (CUDA, on the caller's stream).
 * The Python entry point is yolov9c/ops/nms.py; the maths is stated at the top of csrc/nms_ref.c.
 * Test: python -m pytest -q tests/ops/test_nms.py
 */
#include <math.h>

#include "module.h"
#include "tensor.h"
#include "yv_refs.h"
#ifdef YV_WITH_CUDA
#include "yv_kernels.h"
#endif

#define OP "nms_forward"

/* The CPU sort key packs the index into 32 bits and the CUDA kernels index with int32. */
#define NMS_MAX_N ((int64_t)INT32_MAX)

PyObject *yv_py_nms_workspace_size(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (yv_check_nargs("nms_workspace_size", nargs, 2) < 0)
        return NULL;
    long long n = PyLong_AsLongLong(args[0]);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n < 0 || n > NMS_MAX_N) {
        PyErr_Format(PyExc_ValueError, "nms_workspace_size: n must be in [0, %lld], got %lld",
                     (long long)NMS_MAX_N, n);
        return NULL;
    }
    int cuda = PyObject_IsTrue(args[1]);
    if (cuda < 0)
        return NULL;
    if (!cuda)
        return PyLong_FromSize_t(yv_nms_workspace_size_ref((int64_t)n));
#ifdef YV_WITH_CUDA
    return PyLong_FromSize_t(yv_nms_workspace_size((int64_t)n));
#else
    return yv_no_cuda_error("nms_workspace_size");
#endif
}

typedef struct nms_call {
    const void *boxes, *scores, *classes;
    yv_dtype dtype, cls_dtype;
    int64_t n;
    float iou_thres;
    void *workspace;
    int64_t *keep, *count;
} nms_call;

static int nms_cpu(void *p)
{
    nms_call *c = (nms_call *)p;
    return yv_nms_forward_ref(c->boxes, c->scores, c->dtype, c->classes, c->cls_dtype, c->n, c->iou_thres,
                              c->workspace, c->keep, c->count);
}

#ifdef YV_WITH_CUDA
static int nms_cuda(void *p, void *stream)
{
    nms_call *c = (nms_call *)p;
    return (int)yv_nms_forward(c->boxes, c->scores, c->dtype, c->classes, c->cls_dtype, c->n, c->iou_thres,
                               c->workspace, c->keep, c->count, (cudaStream_t)stream);
}
#endif

static const yv_op NMS = {OP, nms_cpu, YV_CUDA_FN(nms_cuda), NULL};

PyObject *yv_py_nms_forward(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    yv_tensor boxes, scores, classes, workspace, keep, count;
    uintptr_t stream = 0;

    if (yv_check_nargs(OP, nargs, 8) < 0)
        return NULL;
    if (yv_tensor_parse(args[0], OP, "boxes", 0, &boxes) < 0
        || yv_tensor_parse(args[1], OP, "scores", 0, &scores) < 0
        || yv_tensor_parse_optional(args[2], OP, "classes", 0, &classes) < 0)
        return NULL;
    if (PyBool_Check(args[3]) || !(PyFloat_Check(args[3]) || PyLong_Check(args[3]))) {  /* as the reference */
        PyErr_Format(PyExc_TypeError, "%s: iou_thres must be a float, got %.80s", OP, Py_TYPE(args[3])->tp_name);
        return NULL;
    }
    double thr = PyFloat_AsDouble(args[3]);
    if (thr == -1.0 && PyErr_Occurred())
        return NULL;
    if (isnan(thr)) {
        PyErr_SetString(PyExc_ValueError, OP ": iou_thres must not be NaN");
        return NULL;
    }
    if (yv_tensor_parse(args[4], OP, "workspace", 1, &workspace) < 0
        || yv_tensor_parse(args[5], OP, "keep", 1, &keep) < 0
        || yv_tensor_parse(args[6], OP, "count", 1, &count) < 0
        || yv_parse_stream(args[7], OP, &stream) < 0)
        return NULL;

    int cuda = boxes.device != YV_CPU;
    unsigned float_types = YV_DT(YV_FLOAT32) | YV_DT(YV_FLOAT16) | (cuda ? YV_DT(YV_BFLOAT16) : 0u);
    if (yv_check_ndim(&boxes, 2) < 0 || yv_check_dim(&boxes, 1, 4) < 0 || yv_check_dtype(&boxes, float_types) < 0
        || yv_check_contiguous(&boxes) < 0)
        return NULL;
    int64_t n = boxes.shape[0];
    if (n > NMS_MAX_N) {
        PyErr_Format(PyExc_ValueError, "%s: boxes has %lld rows, at most %lld are supported", OP, (long long)n,
                     (long long)NMS_MAX_N);
        return NULL;
    }
    if (yv_check_ndim(&scores, 1) < 0 || yv_check_dim(&scores, 0, n) < 0 || yv_check_same_dtype(&scores, &boxes) < 0
        || yv_check_same_device(&scores, &boxes) < 0 || yv_check_contiguous(&scores) < 0)
        return NULL;
    if (classes.ndim != -1
        && (yv_check_ndim(&classes, 1) < 0 || yv_check_dim(&classes, 0, n) < 0
            || yv_check_dtype(&classes, YV_DT(YV_INT32) | YV_DT(YV_INT64)) < 0
            || yv_check_same_device(&classes, &boxes) < 0 || yv_check_contiguous(&classes) < 0))
        return NULL;
    if (yv_check_ndim(&keep, 1) < 0 || yv_check_dim(&keep, 0, n) < 0 || yv_check_dtype(&keep, YV_DT(YV_INT64)) < 0
        || yv_check_same_device(&keep, &boxes) < 0 || yv_check_contiguous(&keep) < 0)
        return NULL;
    if (yv_check_ndim(&count, 1) < 0 || yv_check_dim(&count, 0, 1) < 0 || yv_check_dtype(&count, YV_DT(YV_INT64)) < 0
        || yv_check_same_device(&count, &boxes) < 0)
        return NULL;
    if (yv_check_ndim(&workspace, 1) < 0 || yv_check_dtype(&workspace, YV_DT(YV_UINT8)) < 0
        || yv_check_same_device(&workspace, &boxes) < 0 || yv_check_contiguous(&workspace) < 0
        || yv_check_alignment(&workspace, 16) < 0)
        return NULL;

    size_t need;
#ifdef YV_WITH_CUDA
    need = cuda ? yv_nms_workspace_size(n) : yv_nms_workspace_size_ref(n);
#else
    if (cuda)
        return yv_no_cuda_error(OP);
    need = yv_nms_workspace_size_ref(n);
#endif
    if ((uint64_t)workspace.numel < (uint64_t)need) {
        PyErr_Format(PyExc_ValueError, "%s: workspace has %lld bytes, %zu are needed for %lld boxes "
                     "(nms_workspace_size(n, cuda))", OP, (long long)workspace.numel, need, (long long)n);
        return NULL;
    }
    /* The comparison is done in float32 in every implementation, so round the threshold once, here. */
    nms_call c = {boxes.data, scores.data, classes.data, boxes.dtype, classes.ndim == -1 ? YV_INT64 : classes.dtype,
                  n, (float)thr, workspace.data, (int64_t *)keep.data, (int64_t *)count.data};
    return yv_launch(module, &NMS, boxes.device, stream, &c);
}
