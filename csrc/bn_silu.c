/* bn_silu.c — bindings of the fused BatchNorm/SiLU op: bn_workspace_size, bn_stats_forward, bn_silu_forward,
 * bn_silu_backward.
 *
 * A BatchNorm operand crosses as one tuple (z, mean, invstd, weight, bias) and its gradients as one tuple
 * (dz, dweight, dbias), parsed and checked here (ValueError/TypeError naming the op and the argument: "z",
 * "mean", ... for one BN, "z1", "mean2", ... for the two-BN form). The checked arguments go into one bn_call
 * and through yv_launch to csrc/bn_silu_ref.c (CPU: float32/float16) or kernels/bn_silu_*.cu (CUDA, on the
 * caller's stream). 4-D operands may have any strides; outputs must not map two elements to one address
 * through a zero stride. The Python entry point is yolov9c/ops/bn_silu.py (it checks nothing this
 * file checks); the maths is stated at the top of csrc/bn_silu_ref.c and kernels/bn_silu.cuh.
 * Test: python -m pytest -q tests/ops/test_bn_silu.py tests/ops/test_bindings.py
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
#define CPU_FLOATS (YV_DT(YV_FLOAT32) | YV_DT(YV_FLOAT16))

/* Everything one call of any of the three ops hands to its implementations. */
typedef struct bn_call {
    yv_bn_shape s;
    yv_view4 z1, z2, res, out, gy, dz1, dz2;   /* data NULL: absent */
    yv_bn_params p1, p2;
    int silu, batch_stats, accumulate;
    float *dw1, *db1, *dw2, *db2;              /* backward: (C,) written */
    float *rm, *rv, *mean, *invstd;            /* stats */
    double momentum, eps;
    void *workspace;
} bn_call;

/* Names of a BN operand's fields: one BN (index 0), or the first / second of the two-BN form (1, 2). */
static const char *const BN_OPERAND[3] = {"bn", "bn1", "bn2"};
static const char *const BN_FIELDS[3][5] = {
    {"z", "mean", "invstd", "weight", "bias"},
    {"z1", "mean1", "invstd1", "weight1", "bias1"},
    {"z2", "mean2", "invstd2", "weight2", "bias2"},
};
static const char *const GRAD_OPERAND[3] = {"grads", "grads1", "grads2"};
static const char *const GRAD_FIELDS[3][3] = {
    {"dz", "dweight", "dbias"}, {"dz1", "dweight1", "dbias1"}, {"dz2", "dweight2", "dbias2"},
};

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

static unsigned storage_types(const yv_tensor *z)
{
    return z->device == YV_CPU ? CPU_FLOATS : FLOATS;
}

/* The first 4-D operand: fixes the shape and the device. */
static int check_z(const yv_tensor *t, yv_bn_shape *s)
{
    if (yv_check_ndim(t, 4) < 0 || yv_check_dtype(t, storage_types(t)) < 0)
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
    if (yv_check_same_device(t, z) < 0 || yv_check_same_shape(t, z) < 0 || yv_check_dtype(t, dtypes) < 0)
        return -1;
    for (int d = 0; output && d < 4; d++) {
        if (t->shape[d] > 1 && t->strides[d] == 0) {
            PyErr_Format(PyExc_ValueError, "%s: %s is an output and has stride 0 in dimension %d (an expanded "
                         "tensor); pass a tensor with its own storage", t->op, t->arg, d);
            return -1;
        }
    }
    return 0;
}

/* A (C,) float32 contiguous array on z's device. */
static int parse_vec(PyObject *obj, const char *op, const char *arg, int writable, const yv_tensor *z, float **p)
{
    yv_tensor t;
    if (yv_tensor_parse(obj, op, arg, writable, &t) < 0 || yv_check_same_device(&t, z) < 0
        || yv_check_ndim(&t, 1) < 0 || yv_check_dim(&t, 0, z->shape[1]) < 0
        || yv_check_dtype(&t, YV_DT(YV_FLOAT32)) < 0 || yv_check_contiguous(&t) < 0)
        return -1;
    *p = (float *)t.data;
    return 0;
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

/* A BN operand (z, mean, invstd, weight, bias). which: 0 one BN, 1/2 the two-BN form; z1: the first
 * operand's z for the second (same shape, device and storage dtypes), NULL for the first (which sets s). */
static int parse_bn(PyObject *obj, const char *op, int which, const yv_tensor *z1, yv_tensor *z, yv_view4 *v,
                    yv_bn_params *p, yv_bn_shape *s)
{
    PyObject *items[5];
    const char *const *names = BN_FIELDS[which];
    memset(p, 0, sizeof(*p));
    if (yv_parse_group(obj, op, BN_OPERAND[which], "(z, mean, invstd, weight, bias)", 5, items) < 0
        || yv_tensor_parse(items[0], op, names[0], 0, z) < 0)
        return -1;
    if (z1 == NULL ? check_z(z, s) < 0 : check_like(z, z1, storage_types(z1), 0) < 0)
        return -1;
    float *vec[4];
    for (int i = 0; i < 4; i++)
        if (parse_vec(items[i + 1], op, names[i + 1], 0, z, &vec[i]) < 0)
            return -1;
    p->mean = vec[0];
    p->invstd = vec[1];
    p->weight = vec[2];
    p->bias = vec[3];
    *v = view_of(z);
    return 0;
}

/* bn1 and bn2 (None: the one-BN form) into call; *two says which form. */
static int parse_bn_pair(PyObject *bn1, PyObject *bn2, const char *op, yv_tensor *z1, yv_tensor *z2, int *two,
                         bn_call *call)
{
    *two = bn2 != Py_None;
    if (parse_bn(bn1, op, *two, NULL, z1, &call->z1, &call->p1, &call->s) < 0)
        return -1;
    if (*two && parse_bn(bn2, op, 2, z1, z2, &call->z2, &call->p2, NULL) < 0)
        return -1;
    return 0;
}

/* A gradient operand (dz, dweight, dbias) of operand `which`; dz may be None (not computed), of z's dtype
 * or float32. */
static int parse_grads(PyObject *obj, const char *op, int which, const yv_tensor *z, const yv_tensor *z1,
                       yv_view4 *dz, float **dw, float **db)
{
    PyObject *items[3];
    const char *const *names = GRAD_FIELDS[which];
    yv_tensor t;
    if (yv_parse_group(obj, op, GRAD_OPERAND[which], "(dz, dweight, dbias)", 3, items) < 0
        || yv_tensor_parse_optional(items[0], op, names[0], 1, &t) < 0)
        return -1;
    if (t.ndim != -1 && check_like(&t, z1, YV_DT(z->dtype) | YV_DT(YV_FLOAT32), 1) < 0)
        return -1;
    *dz = view_of(&t);
    return (parse_vec(items[1], op, names[1], 1, z1, dw) < 0 || parse_vec(items[2], op, names[2], 1, z1, db) < 0)
           ? -1 : 0;
}

static int check_workspace(PyObject *obj, const char *op, const yv_tensor *z, yv_bn_shape s, void **data)
{
    yv_tensor ws;
    if (yv_tensor_parse_optional(obj, op, "workspace", 1, &ws) < 0)
        return -1;
    size_t need = 0;
#ifdef YV_WITH_CUDA
    need = z->device != YV_CPU ? yv_bn_workspace_size(s) : 0;
#else
    (void)s;
#endif
    *data = ws.data;
    if (ws.ndim == -1) {
        if (need == 0)
            return 0;
        PyErr_Format(PyExc_ValueError, "%s: workspace is required on CUDA (%zu bytes, bn_workspace_size)", op, need);
        return -1;
    }
    if (yv_check_ndim(&ws, 1) < 0 || yv_check_dtype(&ws, YV_DT(YV_UINT8)) < 0 || yv_check_same_device(&ws, z) < 0
        || yv_check_contiguous(&ws) < 0 || yv_check_alignment(&ws, 256) < 0)
        return -1;
    if ((uint64_t)ws.numel < (uint64_t)need) {
        PyErr_Format(PyExc_ValueError, "%s: workspace has %lld bytes, %zu are needed (bn_workspace_size)", op,
                     (long long)ws.numel, need);
        return -1;
    }
    return 0;
}

/* ---- the implementations behind yv_launch ---- */

static int stats_cpu(void *p)
{
    bn_call *c = (bn_call *)p;
    return yv_bn_stats_forward_ref(c->s, c->z1, c->rm, c->rv, c->momentum, c->eps, c->mean, c->invstd);
}

static int forward_cpu(void *p)
{
    bn_call *c = (bn_call *)p;
    return yv_bn_silu_forward_ref(c->s, c->z1, c->p1, c->z2, c->p2, c->res, c->silu, c->out);
}

static int backward_cpu(void *p)
{
    bn_call *c = (bn_call *)p;
    return yv_bn_silu_backward_ref(c->s, c->z1, c->p1, c->z2, c->p2, c->gy, c->silu, c->batch_stats, c->dz1, c->dz2,
                                   c->accumulate, c->dw1, c->db1, c->dw2, c->db2);
}

#ifdef YV_WITH_CUDA
static int stats_cuda(void *p, void *stream)
{
    bn_call *c = (bn_call *)p;
    return (int)yv_bn_stats_forward(c->s, c->z1, c->rm, c->rv, c->momentum, c->eps, c->mean, c->invstd,
                                    c->workspace, (cudaStream_t)stream);
}

static int forward_cuda(void *p, void *stream)
{
    bn_call *c = (bn_call *)p;
    return (int)yv_bn_silu_forward(c->s, c->z1, c->p1, c->z2, c->p2, c->res, c->silu, c->out, (cudaStream_t)stream);
}

static int backward_cuda(void *p, void *stream)
{
    bn_call *c = (bn_call *)p;
    return (int)yv_bn_silu_backward(c->s, c->z1, c->p1, c->z2, c->p2, c->gy, c->silu, c->batch_stats, c->dz1,
                                    c->dz2, c->accumulate, c->dw1, c->db1, c->dw2, c->db2, c->workspace,
                                    (cudaStream_t)stream);
}
#endif

static const yv_op STATS = {"bn_stats_forward", stats_cpu, YV_CUDA_FN(stats_cuda), NULL};
static const yv_op FORWARD = {"bn_silu_forward", forward_cpu, YV_CUDA_FN(forward_cuda), NULL};
static const yv_op BACKWARD = {"bn_silu_backward", backward_cpu, YV_CUDA_FN(backward_cuda), NULL};

/* ---- bindings ---- */

PyObject *yv_py_bn_workspace_size(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    const char *op = "bn_workspace_size";
    PyObject *items[4];
    if (yv_check_nargs(op, nargs, 2) < 0 || yv_parse_group(args[0], op, "shape", "(B, C, H, W)", 4, items) < 0)
        return NULL;
    long long dims[4];
    for (int i = 0; i < 4; i++) {
        dims[i] = PyLong_AsLongLong(items[i]);
        if (dims[i] == -1 && PyErr_Occurred())
            return NULL;
        if (dims[i] <= 0) {
            PyErr_Format(PyExc_ValueError, "%s: B, C, H, W must be positive, got %lld in dimension %d", op,
                         dims[i], i);
            return NULL;
        }
    }
    int cuda;
    if (yv_parse_flag(args[1], op, "cuda", &cuda) < 0)
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

/* bn_stats_forward(z, running_mean, running_var, momentum, eps, mean, invstd, workspace, stream) */
PyObject *yv_py_bn_stats_forward(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    const char *op = STATS.name;
    yv_tensor z;
    uintptr_t stream = 0;
    bn_call c;
    memset(&c, 0, sizeof(c));

    if (yv_check_nargs(op, nargs, 9) < 0 || yv_tensor_parse(args[0], op, "z", 0, &z) < 0 || check_z(&z, &c.s) < 0)
        return NULL;
    float **rp[2] = {&c.rm, &c.rv};   /* stay NULL for None */
    const char *rnames[2] = {"running_mean", "running_var"};
    for (int i = 0; i < 2; i++) {
        if (args[1 + i] != Py_None && parse_vec(args[1 + i], op, rnames[i], 1, &z, rp[i]) < 0)
            return NULL;
    }
    if (yv_parse_finite(args[3], op, "momentum", &c.momentum) < 0 || yv_parse_finite(args[4], op, "eps", &c.eps) < 0
        || parse_vec(args[5], op, "mean", 1, &z, &c.mean) < 0 || parse_vec(args[6], op, "invstd", 1, &z, &c.invstd) < 0
        || check_workspace(args[7], op, &z, c.s, &c.workspace) < 0 || yv_parse_stream(args[8], op, &stream) < 0)
        return NULL;
    if (c.momentum < 0.0 || c.momentum > 1.0) {
        yv_errorf(PyExc_ValueError, "%s: momentum must be in [0, 1], got %g", op, c.momentum);
        return NULL;
    }
    if (!(c.eps > 0.0)) {
        yv_errorf(PyExc_ValueError, "%s: eps must be > 0, got %g", op, c.eps);
        return NULL;
    }
    if (c.s.B * c.s.H * c.s.W < 2) {
        PyErr_Format(PyExc_ValueError, "%s: expected more than 1 value per channel (B*H*W > 1), got z of shape "
                     "(%lld, %lld, %lld, %lld)", op, (long long)c.s.B, (long long)c.s.C, (long long)c.s.H,
                     (long long)c.s.W);
        return NULL;
    }
    c.z1 = view_of(&z);
    return yv_launch(module, &STATS, z.device, stream, &c);
}

/* bn_silu_forward(bn1, bn2, residual, act, out, stream) */
PyObject *yv_py_bn_silu_forward(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    const char *op = FORWARD.name;
    yv_tensor z1, z2, res, out;
    uintptr_t stream = 0;
    int two;
    bn_call c;
    memset(&c, 0, sizeof(c));

    if (yv_check_nargs(op, nargs, 6) < 0 || parse_bn_pair(args[0], args[1], op, &z1, &z2, &two, &c) < 0
        || yv_tensor_parse_optional(args[2], op, "residual", 0, &res) < 0
        || (res.ndim != -1 && check_like(&res, &z1, storage_types(&z1), 0) < 0)
        || parse_act(args[3], op, &c.silu) < 0
        || yv_tensor_parse(args[4], op, "out", 1, &out) < 0 || check_like(&out, &z1, storage_types(&z1), 1) < 0
        || yv_parse_stream(args[5], op, &stream) < 0)
        return NULL;
    if (two && !c.silu) {
        PyErr_Format(PyExc_ValueError, "%s: the two-BN form (bn2 given) has act 'silu' only", op);
        return NULL;
    }
    c.res = view_of(&res);
    c.out = view_of(&out);
    return yv_launch(module, &FORWARD, z1.device, stream, &c);
}

/* bn_silu_backward(bn1, bn2, grad_out, act, batch_stats, grads1, grads2, accumulate, workspace, stream) */
PyObject *yv_py_bn_silu_backward(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    const char *op = BACKWARD.name;
    yv_tensor z1, z2, gy;
    uintptr_t stream = 0;
    int two;
    bn_call c;
    memset(&c, 0, sizeof(c));

    if (yv_check_nargs(op, nargs, 10) < 0 || parse_bn_pair(args[0], args[1], op, &z1, &z2, &two, &c) < 0
        || yv_tensor_parse(args[2], op, "grad_out", 0, &gy) < 0 || check_like(&gy, &z1, storage_types(&z1), 0) < 0
        || parse_act(args[3], op, &c.silu) < 0 || yv_parse_flag(args[4], op, "batch_stats", &c.batch_stats) < 0
        || parse_grads(args[5], op, two, &z1, &z1, &c.dz1, &c.dw1, &c.db1) < 0)
        return NULL;
    if (two) {
        if (parse_grads(args[6], op, 2, &z2, &z1, &c.dz2, &c.dw2, &c.db2) < 0)
            return NULL;
        if (!c.silu) {
            PyErr_Format(PyExc_ValueError, "%s: the two-BN form (bn2 given) has act 'silu' only", op);
            return NULL;
        }
    }
    else if (args[6] != Py_None) {
        PyErr_Format(PyExc_ValueError, "%s: grads2 must be None when bn2 is None", op);
        return NULL;
    }
    if (yv_parse_flag(args[7], op, "accumulate", &c.accumulate) < 0
        || check_workspace(args[8], op, &z1, c.s, &c.workspace) < 0 || yv_parse_stream(args[9], op, &stream) < 0)
        return NULL;
    c.gy = view_of(&gy);
    return yv_launch(module, &BACKWARD, z1.device, stream, &c);
}
