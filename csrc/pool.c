/* pool.c — bindings of the 2×2 stride-1 average pool (ADown/AConv's F.avg_pool2d(x, 2, 1, 0, False, True)):
 * avg_pool2x2_forward and avg_pool2x2_backward.
 *
 * Checks every argument (ValueError/TypeError naming the op and the argument), then hands the views to
 * yv_launch: csrc/pool_ref.c (CPU, NumPy arrays: float32/float16) or kernels/pool.cu (CUDA descriptors,
 * float32/float16/bfloat16, on the caller's stream). Operands may have any strides (NCHW, channels-last, a
 * channel slice of a bigger buffer); an output must not have a zero stride, and its memory span must not meet
 * the input's (conservative: two interleaved channel slices of one buffer are refused too).
 * The Python entry point is yolov9c/ops/pool.py; the maths is stated at the top of kernels/pool.cu.
 * Test: python -m pytest -q tests/test_pool.py tests/test_bindings.py
 */
#include <string.h>

#include "module.h"
#include "tensor.h"
#include "yv_refs.h"
#ifdef YV_WITH_CUDA
#include "yv_kernels.h"
#endif

#define FLOATS (YV_DT(YV_FLOAT32) | YV_DT(YV_FLOAT16) | YV_DT(YV_BFLOAT16))
#define CPU_FLOATS (YV_DT(YV_FLOAT32) | YV_DT(YV_FLOAT16))

typedef struct pool_call {
    int64_t B, C, H, W;   /* the pool's input (= grad_in) shape */
    yv_view4 src, dst;    /* forward: in -> out; backward: grad_out -> grad_in */
} pool_call;

static yv_view4 view_of(const yv_tensor *t)
{
    yv_view4 v;
    memset(&v, 0, sizeof(v));
    v.data = t->data;
    v.dtype = t->dtype;
    for (int d = 0; d < 4; d++)
        v.stride[d] = t->strides[d];
    return v;
}

/* The bytes [lo, hi) that t's elements span. */
static void span(const yv_tensor *t, uintptr_t *lo, uintptr_t *hi)
{
    size_t es = yv_dtype_size(t->dtype);
    intptr_t a = 0, b = 0;
    for (int d = 0; d < t->ndim; d++) {
        intptr_t ext = (intptr_t)(t->shape[d] - 1) * (intptr_t)t->strides[d] * (intptr_t)es;
        if (ext < 0)
            a += ext;
        else
            b += ext;
    }
    *lo = (uintptr_t)t->data + (uintptr_t)a;
    *hi = (uintptr_t)t->data + (uintptr_t)b + es;
}

/* big: the (B, C, H, W) operand (H, W >= 2); small: the (B, C, H-1, W-1) one; out: which of them is written. */
static int check_pair(const yv_tensor *big, const yv_tensor *small, const yv_tensor *out, pool_call *c)
{
    const yv_tensor *first = out == big ? small : big;   /* the input: fixes the device and dtype */
    unsigned types = first->device == YV_CPU ? CPU_FLOATS : FLOATS;
    if (yv_check_ndim(first, 4) < 0 || yv_check_dtype(first, types) < 0 || yv_check_ndim(out, 4) < 0
        || yv_check_same_device(out, first) < 0 || yv_check_same_dtype(out, first) < 0)
        return -1;
    if (big->shape[2] < 2 || big->shape[3] < 2) {
        PyErr_Format(PyExc_ValueError, "%s: %s must have H >= 2 and W >= 2 (one 2x2 window), got %lld x %lld",
                     big->op, big->arg, (long long)big->shape[2], (long long)big->shape[3]);
        return -1;
    }
    int64_t want[4] = {big->shape[0], big->shape[1], big->shape[2] - 1, big->shape[3] - 1};
    for (int d = 0; d < 4; d++) {
        if (small->shape[d] != want[d]) {
            PyErr_Format(PyExc_ValueError, "%s: %s must have shape (%lld, %lld, %lld, %lld) (%s's shape less 1 in H "
                         "and W), got (%lld, %lld, %lld, %lld)", small->op, small->arg, (long long)want[0],
                         (long long)want[1], (long long)want[2], (long long)want[3], big->arg,
                         (long long)small->shape[0], (long long)small->shape[1], (long long)small->shape[2],
                         (long long)small->shape[3]);
            return -1;
        }
    }
    for (int d = 0; d < 4 && out->numel > 0; d++) {
        if (out->shape[d] > 1 && out->strides[d] == 0) {
            PyErr_Format(PyExc_ValueError, "%s: %s is an output and has stride 0 in dimension %d (an expanded "
                         "tensor); pass a tensor with its own storage", out->op, out->arg, d);
            return -1;
        }
    }
    uintptr_t ilo, ihi, olo, ohi;
    span(first, &ilo, &ihi);
    span(out, &olo, &ohi);
    if (first->numel > 0 && ilo < ohi && olo < ihi) {
        PyErr_Format(PyExc_ValueError, "%s: %s overlaps %s in memory; write the result into separate storage",
                     out->op, out->arg, first->arg);
        return -1;
    }
    c->B = big->shape[0];
    c->C = big->shape[1];
    c->H = big->shape[2];
    c->W = big->shape[3];
    return 0;
}

static int forward_cpu(void *p)
{
    pool_call *c = (pool_call *)p;
    return yv_avg_pool2x2_forward_ref(c->B, c->C, c->H, c->W, c->src, c->dst);
}

static int backward_cpu(void *p)
{
    pool_call *c = (pool_call *)p;
    return yv_avg_pool2x2_backward_ref(c->B, c->C, c->H, c->W, c->src, c->dst);
}

#ifdef YV_WITH_CUDA
static int forward_cuda(void *p, void *stream)
{
    pool_call *c = (pool_call *)p;
    return (int)yv_avg_pool2x2_forward(c->B, c->C, c->H, c->W, c->src, c->dst, (cudaStream_t)stream);
}

static int backward_cuda(void *p, void *stream)
{
    pool_call *c = (pool_call *)p;
    return (int)yv_avg_pool2x2_backward(c->B, c->C, c->H, c->W, c->src, c->dst, (cudaStream_t)stream);
}
#endif

static const yv_op FORWARD = {"avg_pool2x2_forward", forward_cpu, YV_CUDA_FN(forward_cuda), NULL};
static const yv_op BACKWARD = {"avg_pool2x2_backward", backward_cpu, YV_CUDA_FN(backward_cuda), NULL};

/* Both bindings: (src, dst, stream), src read and dst written; forward: big = src, backward: big = dst. */
static PyObject *pool_binding(PyObject *module, const yv_op *op, const char *src_name, const char *dst_name,
                              int backward, PyObject *const *args, Py_ssize_t nargs)
{
    yv_tensor src, dst;
    uintptr_t stream = 0;
    if (yv_check_nargs(op->name, nargs, 3) < 0 || yv_tensor_parse(args[0], op->name, src_name, 0, &src) < 0
        || yv_tensor_parse(args[1], op->name, dst_name, 1, &dst) < 0
        || yv_parse_stream(args[2], op->name, &stream) < 0)
        return NULL;
    pool_call c;
    if (check_pair(backward ? &dst : &src, backward ? &src : &dst, &dst, &c) < 0)
        return NULL;
    c.src = view_of(&src);
    c.dst = view_of(&dst);
    if (src.numel == 0) {   /* B or C is 0: nothing to compute */
        if (stream != 0 && src.device == YV_CPU) {
            PyErr_Format(PyExc_ValueError, "%s: stream must be 0 for CPU tensors", op->name);
            return NULL;
        }
        Py_RETURN_NONE;
    }
    return yv_launch(module, op, src.device, stream, &c);
}

PyObject *yv_py_avg_pool2x2_forward(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    return pool_binding(module, &FORWARD, "x", "out", 0, args, nargs);
}

PyObject *yv_py_avg_pool2x2_backward(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    return pool_binding(module, &BACKWARD, "grad_out", "grad_in", 1, args, nargs);
}
