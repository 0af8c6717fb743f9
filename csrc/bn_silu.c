/* bn_silu.c — bindings of the fused BatchNorm/SiLU op: bn_workspace_size, bn_stats_forward, bn_silu_forward,
 * bn_silu_backward.
 *
 * Checks every argument (ValueError/TypeError naming the op and the argument), releases the GIL and runs
 * csrc/bn_silu_ref.c (CPU, NumPy arrays) or kernels/bn_silu.cu (CUDA descriptors, on the caller's stream).
 * 4-D operands may have any strides; outputs must not map two elements to one address through a zero
 * stride. The Python entry point is yolov9c/ops/bn_silu.py; the maths is stated at the top of
 * csrc/bn_silu_ref.c and kernels/bn_silu.cu.
 * Test: python -m pytest -q tests/test_bn_silu.py
 */
#include <math.h>
#include <string.h>

#include "module.h"
#include "tensor.h"
#include "yv_refs.h"
#ifdef YV_WITH_CUDA
#include "yv_kernels.h"
#endif

#define FLOATS (YV_DT(YV_FLOAT32) | YV_DT(YV_FLOAT16) | YV_DT(YV_BFLOAT16))

static int parse_flag(PyObject *obj, const char *op, const char *arg, int *out)
{
    if (!PyBool_Check(obj) && !PyLong_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s: %s must be a bool, got %.80s", op, arg, Py_TYPE(obj)->tp_name);
        return -1;
    }
    int v = PyObject_IsTrue(obj);
    if (v < 0)
        return -1;
    *out = v;
    return 0;
}

/* act: "silu" -> 1, "identity" -> 0. */
static int parse_act(PyObject *obj, const char *op, int *silu)
{
    if (!PyUnicode_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s: act must be a str ('silu' or 'identity'), got %.80s", op,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    if (PyUnicode_CompareWithASCIIString(obj, "silu") == 0)
        *silu = 1;
    else if (PyUnicode_CompareWithASCIIString(obj, "identity") == 0)
        *silu = 0;
    else {
        PyErr_Format(PyExc_ValueError, "%s: act must be 'silu' or 'identity', got %R", op, obj);
        return -1;
    }
    return 0;
}

/* The first 4-D operand: fixes the shape and the device. */
static int check_z(const yv_tensor *t, unsigned dtypes, yv_bn_shape *s)
{
    if (yv_check_ndim(t, 4) < 0 || yv_check_dtype(t, dtypes) < 0)
        return -1;
    for (int d = 0; d < 4; d++) {
        if (t->shape[d] <= 0) {
            PyErr_Format(PyExc_ValueError, "%s: %s must not be empty, got size %lld in dimension %d", t->op,
                         t->arg, (long long)t->shape[d], d);
            return -1;
        }
    }
    s->B = t->shape[0];
    s->C = t->shape[1];
    s->H = t->shape[2];
    s->W = t->shape[3];
    return 0;
}

/* Another 4-D operand of z's shape and device; outputs also must not alias themselves. */
static int check_like(const yv_tensor *t, const yv_tensor *z, unsigned dtypes, int output)
{
    if (yv_check_ndim(t, 4) < 0 || yv_check_dtype(t, dtypes) < 0 || yv_check_same_device(t, z) < 0)
        return -1;
    for (int d = 0; d < 4; d++) {
        if (yv_check_dim(t, d, z->shape[d]) < 0)
            return -1;
        if (output && t->shape[d] > 1 && t->strides[d] == 0) {
            PyErr_Format(PyExc_ValueError, "%s: %s is an output and has stride 0 in dimension %d (an expanded "
                         "tensor); pass a tensor with its own storage", t->op, t->arg, d);
            return -1;
        }
    }
    return 0;
}

static int check_vec(const yv_tensor *t, const yv_tensor *z)
{
    return (yv_check_ndim(t, 1) < 0 || yv_check_dim(t, 0, z->shape[1]) < 0
            || yv_check_dtype(t, YV_DT(YV_FLOAT32)) < 0 || yv_check_same_device(t, z) < 0
            || yv_check_contiguous(t) < 0) ? -1 : 0;
}

static yv_view4 view_of(const yv_tensor *t)
{
    yv_view4 v;
    memset(&v, 0, sizeof(v));
    if (t->ndim != 4)
        return v;   /* absent (None) */
    v.data = t->data;
    v.dtype = t->dtype;
    for (int d = 0; d < 4; d++)
        v.stride[d] = t->strides[d];
    return v;
}

/* Four (C,) float32 arrays mean, invstd, weight, bias from args[0..3]. */
static int parse_params(PyObject *const *args, const char *op, const char *const names[4], const yv_tensor *z,
                        yv_bn_params *p)
{
    yv_tensor t[4];
    memset(p, 0, sizeof(*p));
    for (int i = 0; i < 4; i++) {
        if (yv_tensor_parse(args[i], op, names[i], 0, &t[i]) < 0 || check_vec(&t[i], z) < 0)
            return -1;
    }
    p->mean = (const float *)t[0].data;
    p->invstd = (const float *)t[1].data;
    p->weight = (const float *)t[2].data;
    p->bias = (const float *)t[3].data;
    return 0;
}

static int check_workspace(const yv_tensor *ws, const yv_tensor *z, size_t need)
{
    if (ws->ndim == -1) {
        if (need == 0)
            return 0;
        PyErr_Format(PyExc_ValueError, "%s: workspace is required on CUDA (%zu bytes, bn_workspace_size)", ws->op,
                     need);
        return -1;
    }
    if (yv_check_ndim(ws, 1) < 0 || yv_check_dtype(ws, YV_DT(YV_UINT8)) < 0 || yv_check_same_device(ws, z) < 0
        || yv_check_contiguous(ws) < 0 || yv_check_alignment(ws, 256) < 0)
        return -1;
    if ((uint64_t)ws->numel < (uint64_t)need) {
        PyErr_Format(PyExc_ValueError, "%s: workspace has %lld bytes, %zu are needed (bn_workspace_size)", ws->op,
                     (long long)ws->numel, need);
        return -1;
    }
    return 0;
}

static size_t workspace_need(int cuda, yv_bn_shape s)
{
#ifdef YV_WITH_CUDA
    return cuda ? yv_bn_workspace_size(s) : 0;
#else
    (void)cuda;
    (void)s;
    return 0;
#endif
}

static int check_cpu_stream(int cuda, uintptr_t stream, const char *op)
{
    if (!cuda && stream != 0) {
        PyErr_Format(PyExc_ValueError, "%s: stream must be 0 for CPU tensors", op);
        return -1;
    }
#ifndef YV_WITH_CUDA
    if (cuda) {
        yv_no_cuda_error(op);
        return -1;
    }
#endif
    return 0;
}

PyObject *yv_py_bn_workspace_size(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    const char *op = "bn_workspace_size";
    if (yv_check_nargs(op, nargs, 5) < 0)
        return NULL;
    long long dims[4];
    for (int i = 0; i < 4; i++) {
        dims[i] = PyLong_AsLongLong(args[i]);
        if (dims[i] == -1 && PyErr_Occurred())
            return NULL;
        if (dims[i] <= 0) {
            PyErr_Format(PyExc_ValueError, "%s: B, C, H, W must be positive, got %lld for argument %d", op, dims[i],
                         i);
            return NULL;
        }
    }
    int cuda = PyObject_IsTrue(args[4]);
    if (cuda < 0)
        return NULL;
    if (!cuda)
        return PyLong_FromSize_t(0);
#ifdef YV_WITH_CUDA
    yv_bn_shape s = {dims[0], dims[1], dims[2], dims[3]};
    return PyLong_FromSize_t(yv_bn_workspace_size(s));
#else
    return yv_no_cuda_error(op);
#endif
}

PyObject *yv_py_bn_stats_forward(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    const char *op = "bn_stats_forward";
    yv_tensor z, rm, rv, mean, invstd, ws;
    yv_bn_shape s;
    double momentum, eps;
    uintptr_t stream = 0;

    if (yv_check_nargs(op, nargs, 9) < 0)
        return NULL;
    if (yv_tensor_parse(args[0], op, "z", 0, &z) < 0)
        return NULL;
    int cuda = z.device != YV_CPU;
    if (check_z(&z, FLOATS, &s) < 0)
        return NULL;
    if (yv_tensor_parse_optional(args[1], op, "running_mean", 1, &rm) < 0
        || yv_tensor_parse_optional(args[2], op, "running_var", 1, &rv) < 0
        || (rm.ndim != -1 && check_vec(&rm, &z) < 0) || (rv.ndim != -1 && check_vec(&rv, &z) < 0)
        || yv_parse_finite(args[3], op, "momentum", &momentum) < 0 || yv_parse_finite(args[4], op, "eps", &eps) < 0
        || yv_tensor_parse(args[5], op, "mean", 1, &mean) < 0 || check_vec(&mean, &z) < 0
        || yv_tensor_parse(args[6], op, "invstd", 1, &invstd) < 0 || check_vec(&invstd, &z) < 0
        || yv_tensor_parse_optional(args[7], op, "workspace", 1, &ws) < 0
        || yv_parse_stream(args[8], op, &stream) < 0 || check_cpu_stream(cuda, stream, op) < 0)
        return NULL;
    if (momentum < 0.0 || momentum > 1.0) {
        PyErr_Format(PyExc_ValueError, "%s: momentum must be in [0, 1], got %g", op, momentum);
        return NULL;
    }
    if (!(eps > 0.0)) {
        PyErr_Format(PyExc_ValueError, "%s: eps must be > 0, got %g", op, eps);
        return NULL;
    }
    if (s.B * s.H * s.W < 2) {
        PyErr_Format(PyExc_ValueError, "%s: expected more than 1 value per channel (B*H*W > 1), got z of shape "
                     "(%lld, %lld, %lld, %lld)", op, (long long)s.B, (long long)s.C, (long long)s.H, (long long)s.W);
        return NULL;
    }
    if (check_workspace(&ws, &z, workspace_need(cuda, s)) < 0)
        return NULL;
    yv_view4 zv = view_of(&z);
    float *rmp = (float *)rm.data, *rvp = (float *)rv.data;
    if (!cuda) {
        int rc;
        Py_BEGIN_ALLOW_THREADS
        rc = yv_bn_stats_forward_ref(s, zv, rmp, rvp, momentum, eps, (float *)mean.data, (float *)invstd.data);
        Py_END_ALLOW_THREADS
        if (rc != 0)
            return yv_kernel_error(module, op, "CPU implementation failed");
        Py_RETURN_NONE;
    }
#ifdef YV_WITH_CUDA
    int sync = yv_sync_requested();
    cudaStream_t cs = (cudaStream_t)stream;
    cudaError_t err;
    Py_BEGIN_ALLOW_THREADS
    int prev = -1;
    err = yv_device_enter(z.device, &prev);
    if (err == cudaSuccess) {
        err = yv_bn_stats_forward(s, zv, rmp, rvp, momentum, eps, (float *)mean.data, (float *)invstd.data, ws.data,
                                  cs);
        err = yv_launch_status(err, cs, sync);
        yv_device_leave(prev);
    }
    Py_END_ALLOW_THREADS
    if (err != cudaSuccess)
        return yv_cuda_error(module, op, err);
#endif
    Py_RETURN_NONE;
}

static const char *const NAMES1[4] = {"mean1", "invstd1", "weight1", "bias1"};
static const char *const NAMES2[4] = {"mean2", "invstd2", "weight2", "bias2"};

/* args[0..9]: z1, mean1, invstd1, weight1, bias1, z2, mean2, invstd2, weight2, bias2 (z2..bias2 may all be
 * None). */
static int parse_bn_pair(PyObject *const *args, const char *op, unsigned dtypes, yv_tensor *z1, yv_tensor *z2,
                         yv_bn_shape *s, yv_bn_params *p1, yv_bn_params *p2)
{
    if (yv_tensor_parse(args[0], op, "z1", 0, z1) < 0 || check_z(z1, dtypes, s) < 0
        || parse_params(args + 1, op, NAMES1, z1, p1) < 0)
        return -1;
    if (yv_tensor_parse_optional(args[5], op, "z2", 0, z2) < 0)
        return -1;
    memset(p2, 0, sizeof(*p2));
    if (z2->ndim == -1) {
        for (int i = 6; i < 10; i++) {
            if (args[i] != Py_None) {
                PyErr_Format(PyExc_ValueError, "%s: %s must be None when z2 is None", op, NAMES2[i - 6]);
                return -1;
            }
        }
        return 0;
    }
    if (check_like(z2, z1, dtypes, 0) < 0 || parse_params(args + 6, op, NAMES2, z1, p2) < 0)
        return -1;
    return 0;
}

PyObject *yv_py_bn_silu_forward(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    const char *op = "bn_silu_forward";
    yv_tensor z1, z2, res, out;
    yv_bn_shape s;
    yv_bn_params p1, p2;
    int silu;
    uintptr_t stream = 0;

    if (yv_check_nargs(op, nargs, 14) < 0)
        return NULL;
    if (yv_tensor_parse(args[0], op, "z1", 0, &z1) < 0)
        return NULL;
    int cuda = z1.device != YV_CPU;
    unsigned dtypes = cuda ? FLOATS : (YV_DT(YV_FLOAT32) | YV_DT(YV_FLOAT16));
    if (parse_bn_pair(args, op, dtypes, &z1, &z2, &s, &p1, &p2) < 0
        || yv_tensor_parse_optional(args[10], op, "residual", 0, &res) < 0
        || (res.ndim != -1 && check_like(&res, &z1, dtypes, 0) < 0)
        || parse_act(args[11], op, &silu) < 0
        || yv_tensor_parse(args[12], op, "out", 1, &out) < 0 || check_like(&out, &z1, dtypes, 1) < 0
        || yv_parse_stream(args[13], op, &stream) < 0 || check_cpu_stream(cuda, stream, op) < 0)
        return NULL;
    if (z2.ndim != -1 && !silu) {
        PyErr_Format(PyExc_ValueError, "%s: the two-BN form (z2 given) has act 'silu' only", op);
        return NULL;
    }
    yv_view4 v1 = view_of(&z1), v2 = view_of(&z2), vr = view_of(&res), vo = view_of(&out);
    if (!cuda) {
        int rc;
        Py_BEGIN_ALLOW_THREADS
        rc = yv_bn_silu_forward_ref(s, v1, p1, v2, p2, vr, silu, vo);
        Py_END_ALLOW_THREADS
        if (rc != 0)
            return yv_kernel_error(module, op, "CPU implementation failed");
        Py_RETURN_NONE;
    }
#ifdef YV_WITH_CUDA
    int sync = yv_sync_requested();
    cudaStream_t cs = (cudaStream_t)stream;
    cudaError_t err;
    Py_BEGIN_ALLOW_THREADS
    int prev = -1;
    err = yv_device_enter(z1.device, &prev);
    if (err == cudaSuccess) {
        err = yv_bn_silu_forward(s, v1, p1, v2, p2, vr, silu, vo, cs);
        err = yv_launch_status(err, cs, sync);
        yv_device_leave(prev);
    }
    Py_END_ALLOW_THREADS
    if (err != cudaSuccess)
        return yv_cuda_error(module, op, err);
#endif
    Py_RETURN_NONE;
}

/* dz of z's dtype or float32 (None allowed: that gradient is not computed). */
static int parse_dz(PyObject *obj, const char *op, const char *arg, const yv_tensor *z, const yv_tensor *z1,
                    yv_tensor *dz)
{
    if (yv_tensor_parse_optional(obj, op, arg, 1, dz) < 0)
        return -1;
    if (dz->ndim == -1)
        return 0;
    return check_like(dz, z1, YV_DT(z->dtype) | YV_DT(YV_FLOAT32), 1);
}

static int parse_grad_vec(PyObject *obj, const char *op, const char *arg, const yv_tensor *z1, float **p)
{
    yv_tensor t;
    if (yv_tensor_parse(obj, op, arg, 1, &t) < 0 || check_vec(&t, z1) < 0)
        return -1;
    *p = (float *)t.data;
    return 0;
}

PyObject *yv_py_bn_silu_backward(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    const char *op = "bn_silu_backward";
    yv_tensor z1, z2, gy, dz1, dz2, ws;
    yv_bn_shape s;
    yv_bn_params p1, p2;
    int silu, batch_stats, accumulate;
    float *dw1 = NULL, *db1 = NULL, *dw2 = NULL, *db2 = NULL;
    uintptr_t stream = 0;

    if (yv_check_nargs(op, nargs, 22) < 0)
        return NULL;
    if (yv_tensor_parse(args[0], op, "z1", 0, &z1) < 0)
        return NULL;
    int cuda = z1.device != YV_CPU;
    unsigned dtypes = cuda ? FLOATS : (YV_DT(YV_FLOAT32) | YV_DT(YV_FLOAT16));
    if (parse_bn_pair(args, op, dtypes, &z1, &z2, &s, &p1, &p2) < 0
        || yv_tensor_parse(args[10], op, "grad_out", 0, &gy) < 0 || check_like(&gy, &z1, dtypes, 0) < 0
        || parse_act(args[11], op, &silu) < 0 || parse_flag(args[12], op, "batch_stats", &batch_stats) < 0
        || parse_dz(args[13], op, "dz1", &z1, &z1, &dz1) < 0)
        return NULL;
    int two = z2.ndim != -1;
    if (two) {
        if (parse_dz(args[14], op, "dz2", &z2, &z1, &dz2) < 0)
            return NULL;
    }
    else {
        memset(&dz2, 0, sizeof(dz2));
        dz2.ndim = -1;
        if (args[14] != Py_None) {
            PyErr_Format(PyExc_ValueError, "%s: dz2 must be None when z2 is None", op);
            return NULL;
        }
    }
    if (parse_flag(args[15], op, "accumulate", &accumulate) < 0
        || parse_grad_vec(args[16], op, "dweight1", &z1, &dw1) < 0
        || parse_grad_vec(args[17], op, "dbias1", &z1, &db1) < 0)
        return NULL;
    if (two) {
        if (parse_grad_vec(args[18], op, "dweight2", &z1, &dw2) < 0
            || parse_grad_vec(args[19], op, "dbias2", &z1, &db2) < 0)
            return NULL;
    }
    else if (args[18] != Py_None || args[19] != Py_None) {
        PyErr_Format(PyExc_ValueError, "%s: dweight2 and dbias2 must be None when z2 is None", op);
        return NULL;
    }
    if (two && !silu) {
        PyErr_Format(PyExc_ValueError, "%s: the two-BN form (z2 given) has act 'silu' only", op);
        return NULL;
    }
    if (yv_tensor_parse_optional(args[20], op, "workspace", 1, &ws) < 0
        || yv_parse_stream(args[21], op, &stream) < 0 || check_cpu_stream(cuda, stream, op) < 0
        || check_workspace(&ws, &z1, workspace_need(cuda, s)) < 0)
        return NULL;
    yv_view4 v1 = view_of(&z1), v2 = view_of(&z2), vg = view_of(&gy), vd1 = view_of(&dz1), vd2 = view_of(&dz2);
    if (!cuda) {
        int rc;
        Py_BEGIN_ALLOW_THREADS
        rc = yv_bn_silu_backward_ref(s, v1, p1, v2, p2, vg, silu, batch_stats, vd1, vd2, accumulate, dw1, db1, dw2,
                                     db2);
        Py_END_ALLOW_THREADS
        if (rc != 0)
            return yv_kernel_error(module, op, "CPU implementation failed");
        Py_RETURN_NONE;
    }
#ifdef YV_WITH_CUDA
    int sync = yv_sync_requested();
    cudaStream_t cs = (cudaStream_t)stream;
    cudaError_t err;
    Py_BEGIN_ALLOW_THREADS
    int prev = -1;
    err = yv_device_enter(z1.device, &prev);
    if (err == cudaSuccess) {
        err = yv_bn_silu_backward(s, v1, p1, v2, p2, vg, silu, batch_stats, vd1, vd2, accumulate, dw1, db1, dw2, db2,
                                  ws.data, cs);
        err = yv_launch_status(err, cs, sync);
        yv_device_leave(prev);
    }
    Py_END_ALLOW_THREADS
    if (err != cudaSuccess)
        return yv_cuda_error(module, op, err);
#endif
    Py_RETURN_NONE;
}
