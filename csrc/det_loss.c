/* det_loss.c — bindings of the detection-loss op (one head branch): det_loss_forward, det_loss_backward,
 * det_loss_decode and det_loss_workspace_size.
 *
 * Checks every argument (raising ValueError/TypeError that name the op and the argument), then releases the
 * GIL and runs csrc/det_loss_ref.c (CPU, float64 arithmetic) or kernels/det_loss.cu (CUDA, on the caller's
 * stream). The Python entry point is yolov9c/ops/det_loss.py; the maths is stated at the top of
 * csrc/det_loss_ref.c.
 * Test: python -m pytest -q tests/ops/test_det_loss.py
 */
#include <math.h>
#include <string.h>

#include "module.h"
#include "tensor.h"
#include "yv_refs.h"
#ifdef YV_WITH_CUDA
#include "yv_kernels.h"
#endif

#define MAX_REG_MAX 64   /* the CUDA kernels keep no per-bin arrays, but bound R for the index arithmetic */

/* Same contract as csrc/nms.c's stream argument: an int handle, 0 for the CPU. */

static int parse_reg_max(PyObject *obj, const char *op, int *reg_max)
{
    long v = PyLong_Check(obj) ? PyLong_AsLong(obj) : -1;
    if (!PyLong_Check(obj) || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: reg_max must be an int, got %.80s", op, Py_TYPE(obj)->tp_name);
        return -1;
    }
    if (v < 2 || v > MAX_REG_MAX) {
        PyErr_Format(PyExc_ValueError, "%s: reg_max must be in [2, %d], got %ld", op, MAX_REG_MAX, v);
        return -1;
    }
    *reg_max = (int)v;
    return 0;
}

/* `maps` (a tuple or list of nl 4-D tensors (B, C, H, W), one dtype and device, any strides) and `strides`
 * (nl positive floats) into a yv_levels; `first` receives the first map's descriptor (dtype, device). */
static int parse_levels(PyObject *maps, PyObject *strides, const char *op, const char *arg, int writable,
                        yv_levels *L, yv_tensor *first)
{
    memset(L, 0, sizeof(*L));
    if (!PyTuple_Check(maps) && !PyList_Check(maps)) {
        PyErr_Format(PyExc_TypeError, "%s: %s must be a tuple of level maps, got %.80s", op, arg,
                     Py_TYPE(maps)->tp_name);
        return -1;
    }
    Py_ssize_t nl = PySequence_Fast_GET_SIZE(maps);
    if (nl < 1 || nl > YV_MAX_LEVELS) {
        PyErr_Format(PyExc_ValueError, "%s: %s must hold 1 to %d level maps, got %zd", op, arg, YV_MAX_LEVELS, nl);
        return -1;
    }
    if (strides != NULL) {
        if (!PyTuple_Check(strides) && !PyList_Check(strides)) {
            PyErr_Format(PyExc_TypeError, "%s: strides must be a tuple of floats, got %.80s", op,
                         Py_TYPE(strides)->tp_name);
            return -1;
        }
        if (PySequence_Fast_GET_SIZE(strides) != nl) {
            PyErr_Format(PyExc_ValueError, "%s: strides must have one entry per level map (%zd), got %zd", op, nl,
                         PySequence_Fast_GET_SIZE(strides));
            return -1;
        }
    }
    L->nl = (int)nl;
    int64_t A = 0;
    for (Py_ssize_t l = 0; l < nl; l++) {
        yv_tensor t;
        if (yv_tensor_parse(PySequence_Fast_GET_ITEM(maps, l), op, arg, writable, &t) < 0)
            return -1;
        if (yv_check_ndim(&t, 4) < 0)
            return -1;
        if (l == 0) {
            *first = t;
            L->B = t.shape[0];
            L->C = t.shape[1];
        } else if (yv_check_same_dtype(&t, first) < 0 || yv_check_same_device(&t, first) < 0
                   || yv_check_dim(&t, 0, L->B) < 0 || yv_check_dim(&t, 1, L->C) < 0) {
            return -1;
        }
        if (t.shape[2] < 1 || t.shape[3] < 1) {
            PyErr_Format(PyExc_ValueError, "%s: %s level %zd has an empty grid (%lld x %lld)", op, arg, l,
                         (long long)t.shape[2], (long long)t.shape[3]);
            return -1;
        }
        L->data[l] = t.data;
        L->H[l] = t.shape[2];
        L->W[l] = t.shape[3];
        L->sb[l] = t.strides[0];
        L->sc[l] = t.strides[1];
        L->sh[l] = t.strides[2];
        L->sw[l] = t.strides[3];
        L->offset[l] = A;
        A += t.shape[2] * t.shape[3];
        if (strides != NULL) {
            double s;
            if (yv_parse_finite(PySequence_Fast_GET_ITEM(strides, l), op, "strides", &s) < 0)
                return -1;
            if (!(s > 0.0)) {
                yv_errorf(PyExc_ValueError, "%s: strides must be positive, got %g at level %zd", op, s, l);
                return -1;
            }
            L->stride[l] = s;
        }
    }
    L->A = A;
    if (L->B < 1) {
        PyErr_Format(PyExc_ValueError, "%s: %s has an empty batch", op, arg);
        return -1;
    }
    for (int l = 0; l < L->nl; l++) {
        /* A map with overlapping elements (stride 0 from expand) would make gradient writes race. */
        if (writable && (L->sb[l] == 0 || L->sc[l] == 0 || L->sh[l] == 0 || L->sw[l] == 0)) {
            PyErr_Format(PyExc_ValueError, "%s: %s level %d has a zero stride (an expanded tensor)", op, arg, l);
            return -1;
        }
    }
    return 0;
}

static int check_map_dtype(const yv_tensor *first, int cuda)
{
    unsigned allowed = cuda ? YV_DT(YV_FLOAT32) | YV_DT(YV_FLOAT16) | YV_DT(YV_BFLOAT16)
                            : YV_DT(YV_FLOAT32) | YV_DT(YV_FLOAT16) | YV_DT(YV_FLOAT64);
    return yv_check_dtype(first, allowed);
}

/* Element k of a contiguous float32/float64 host tensor. */
static double value_at(const yv_tensor *t, int k)
{
    return t->dtype == YV_FLOAT64 ? ((const double *)t->data)[k] : (double)((const float *)t->data)[k];
}

/* The per-anchor targets of one branch; all (B, A)-shaped, contiguous, on the maps' device. */
typedef struct targets {
    yv_tensor labels, tboxes, tnorm, fg, tss;
} targets;

static int parse_targets(PyObject *const *args, const char *op, const yv_levels *L, const yv_tensor *first,
                         targets *T)
{
    int cuda = first->device != YV_CPU;
    unsigned tdt = cuda ? YV_DT(YV_FLOAT32) : YV_DT(YV_FLOAT32) | YV_DT(YV_FLOAT64);
    if (yv_tensor_parse(args[0], op, "target_labels", 0, &T->labels) < 0
        || yv_tensor_parse(args[1], op, "target_boxes", 0, &T->tboxes) < 0
        || yv_tensor_parse(args[2], op, "target_norm", 0, &T->tnorm) < 0
        || yv_tensor_parse(args[3], op, "fg_mask", 0, &T->fg) < 0
        || yv_tensor_parse(args[4], op, "target_scores_sum", 0, &T->tss) < 0)
        return -1;
    yv_tensor *two[3] = {&T->labels, &T->tnorm, &T->fg};
    for (int k = 0; k < 3; k++) {
        if (yv_check_ndim(two[k], 2) < 0 || yv_check_dim(two[k], 0, L->B) < 0 || yv_check_dim(two[k], 1, L->A) < 0
            || yv_check_contiguous(two[k]) < 0 || yv_check_same_device(two[k], first) < 0)
            return -1;
    }
    if (yv_check_dtype(&T->labels, YV_DT(YV_INT32) | YV_DT(YV_INT64)) < 0
        || yv_check_dtype(&T->tnorm, tdt) < 0 || yv_check_dtype(&T->fg, YV_DT(YV_BOOL)) < 0)
        return -1;
    if (yv_check_ndim(&T->tboxes, 3) < 0 || yv_check_dim(&T->tboxes, 0, L->B) < 0
        || yv_check_dim(&T->tboxes, 1, L->A) < 0 || yv_check_dim(&T->tboxes, 2, 4) < 0
        || yv_check_contiguous(&T->tboxes) < 0 || yv_check_same_device(&T->tboxes, first) < 0
        || yv_check_same_dtype(&T->tboxes, &T->tnorm) < 0)
        return -1;
    if (yv_check_ndim(&T->tss, 1) < 0 || yv_check_dim(&T->tss, 0, 1) < 0 || yv_check_same_device(&T->tss, first) < 0
        || yv_check_dtype(&T->tss, tdt) < 0)
        return -1;
    if (!cuda) {
        double v = value_at(&T->tss, 0);
        if (!(v > 0.0) || !isfinite(v)) {
            yv_errorf(PyExc_ValueError, "%s: target_scores_sum must be positive and finite, got %g", op, v);
            return -1;
        }
    }
    return 0;
}

/* eps, pos_weight, max_dist, checked against reg_max. */
static int parse_scalars(PyObject *const *args, const char *op, int reg_max, double *eps, double *pos_weight,
                         double *max_dist)
{
    if (yv_parse_finite(args[0], op, "label_smoothing", eps) < 0 || yv_parse_finite(args[1], op, "pos_weight", pos_weight) < 0
        || yv_parse_finite(args[2], op, "max_dist", max_dist) < 0)
        return -1;
    if (*eps < 0.0 || *eps > 1.0) {
        yv_errorf(PyExc_ValueError, "%s: label_smoothing must be in [0, 1], got %g", op, *eps);
        return -1;
    }
    if (!(*pos_weight > 0.0)) {
        yv_errorf(PyExc_ValueError, "%s: pos_weight must be positive, got %g", op, *pos_weight);
        return -1;
    }
    /* the right bin ⌊τ⌋ + 1 must stay inside the R bins */
    if (!(*max_dist >= 0.0 && *max_dist < (double)(reg_max - 1))) {
        yv_errorf(PyExc_ValueError, "%s: max_dist must be in [0, reg_max - 1) = [0, %d), got %g", op,
                     reg_max - 1, *max_dist);
        return -1;
    }
    return 0;
}

static int check_reg_max_fits(const yv_levels *L, int reg_max, const char *op)
{
    if (L->C <= 4 * (int64_t)reg_max) {
        PyErr_Format(PyExc_ValueError, "%s: maps have %lld channels, need 4*reg_max + NC = %d + NC with NC >= 1", op,
                     (long long)L->C, 4 * reg_max);
        return -1;
    }
    return 0;
}

PyObject *yv_py_det_loss_workspace_size(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (yv_check_nargs("det_loss_workspace_size", nargs, 3) < 0)
        return NULL;
    long long B = PyLong_AsLongLong(args[0]);
    if (B == -1 && PyErr_Occurred())
        return NULL;
    long long A = PyLong_AsLongLong(args[1]);
    if (A == -1 && PyErr_Occurred())
        return NULL;
    if (B < 0 || A < 0 || (A > 0 && B > INT64_MAX / A)) {
        PyErr_Format(PyExc_ValueError, "det_loss_workspace_size: B and A must be >= 0 and B*A must fit int64, "
                     "got %lld, %lld", B, A);
        return NULL;
    }
    int cuda = PyObject_IsTrue(args[2]);
    if (cuda < 0)
        return NULL;
    if (!cuda)
        return PyLong_FromLong(0);
#ifdef YV_WITH_CUDA
    return PyLong_FromSize_t(yv_det_loss_workspace_size((int64_t)B, (int64_t)A));
#else
    return yv_no_cuda_error("det_loss_workspace_size");
#endif
}

/* Everything one det_loss call hands to its implementations. */
typedef struct det_call {
    yv_levels L, G;            /* maps; G: the gradient maps (backward) */
    yv_dtype dtype;            /* the maps' */
    int reg_max;
    targets T;
    double eps, pos_weight, max_dist;
    void *workspace;
    yv_tensor out, grad_out;   /* forward's (3,) result; backward's (3,) incoming gradient */
    float *boxes;              /* decode */
} det_call;

/* out (forward) and grad_out (backward): the (3,) loss terms, contiguous on the maps' device, float32 (or
 * float64 on the CPU). */
static int check_terms(const yv_tensor *t, const yv_tensor *first, int cuda)
{
    if (yv_check_ndim(t, 1) < 0 || yv_check_dim(t, 0, 3) < 0 || yv_check_same_device(t, first) < 0
        || yv_check_contiguous(t) < 0
        || yv_check_dtype(t, cuda ? YV_DT(YV_FLOAT32) : YV_DT(YV_FLOAT32) | YV_DT(YV_FLOAT64)) < 0)
        return -1;
    return 0;
}

/* maps, strides, reg_max, targets, label_smoothing, pos_weight, max_dist: args[0..6] of forward/backward. */
static int parse_loss_args(PyObject *const *args, const char *op, det_call *c, yv_tensor *first)
{
    PyObject *items[5];
    if (parse_levels(args[0], args[1], op, "maps", 0, &c->L, first) < 0 || parse_reg_max(args[2], op, &c->reg_max) < 0)
        return -1;
    int cuda = first->device != YV_CPU;
    c->dtype = first->dtype;
    if (check_map_dtype(first, cuda) < 0 || check_reg_max_fits(&c->L, c->reg_max, op) < 0
        || yv_parse_group(args[3], op, "targets",
                          "(target_labels, target_boxes, target_norm, fg_mask, target_scores_sum)", 5, items) < 0
        || parse_targets(items, op, &c->L, first, &c->T) < 0
        || parse_scalars(args + 4, op, c->reg_max, &c->eps, &c->pos_weight, &c->max_dist) < 0)
        return -1;
    return 0;
}

static int forward_cpu(void *p)
{
    det_call *c = (det_call *)p;
    double res[3];
    int rc = yv_det_loss_forward_ref(&c->L, c->dtype, c->reg_max, c->T.labels.data, c->T.labels.dtype,
                                     c->T.tboxes.data, c->T.tnorm.data, c->T.tnorm.dtype,
                                     (const uint8_t *)c->T.fg.data, value_at(&c->T.tss, 0), c->eps, c->pos_weight,
                                     c->max_dist, res);
    for (int k = 0; rc == 0 && k < 3; k++) {
        if (c->out.dtype == YV_FLOAT64)
            ((double *)c->out.data)[k] = res[k];
        else
            ((float *)c->out.data)[k] = (float)res[k];
    }
    return rc;
}

static int backward_cpu(void *p)
{
    det_call *c = (det_call *)p;
    double g[3];
    for (int k = 0; k < 3; k++)
        g[k] = value_at(&c->grad_out, k);
    return yv_det_loss_backward_ref(&c->L, c->dtype, c->reg_max, c->T.labels.data, c->T.labels.dtype,
                                    c->T.tboxes.data, c->T.tnorm.data, c->T.tnorm.dtype,
                                    (const uint8_t *)c->T.fg.data, value_at(&c->T.tss, 0), c->eps, c->pos_weight,
                                    c->max_dist, g, &c->G);
}

static int decode_cpu(void *p)
{
    det_call *c = (det_call *)p;
    (void)yv_det_loss_decode_ref(&c->L, c->dtype, c->reg_max, c->boxes);
    return 0;
}

#ifdef YV_WITH_CUDA
static int forward_cuda(void *p, void *stream)
{
    det_call *c = (det_call *)p;
    return (int)yv_det_loss_forward(&c->L, c->dtype, c->reg_max, c->T.labels.data, c->T.labels.dtype,
                                    (const float *)c->T.tboxes.data, (const float *)c->T.tnorm.data,
                                    (const uint8_t *)c->T.fg.data, (const float *)c->T.tss.data, (float)c->eps,
                                    (float)c->pos_weight, (float)c->max_dist, c->workspace, (float *)c->out.data,
                                    (cudaStream_t)stream);
}

static int backward_cuda(void *p, void *stream)
{
    det_call *c = (det_call *)p;
    return (int)yv_det_loss_backward(&c->L, c->dtype, c->reg_max, c->T.labels.data, c->T.labels.dtype,
                                     (const float *)c->T.tboxes.data, (const float *)c->T.tnorm.data,
                                     (const uint8_t *)c->T.fg.data, (const float *)c->T.tss.data, (float)c->eps,
                                     (float)c->pos_weight, (float)c->max_dist, (const float *)c->grad_out.data,
                                     &c->G, (cudaStream_t)stream);
}

static int decode_cuda(void *p, void *stream)
{
    det_call *c = (det_call *)p;
    return (int)yv_det_loss_decode(&c->L, c->dtype, c->reg_max, c->boxes, (cudaStream_t)stream);
}
#endif

#define BAD_LABEL "target_labels has a foreground label outside [0, NC)"
static const yv_op FORWARD = {"det_loss_forward", forward_cpu, YV_CUDA_FN(forward_cuda), BAD_LABEL};
static const yv_op BACKWARD = {"det_loss_backward", backward_cpu, YV_CUDA_FN(backward_cuda), BAD_LABEL};
static const yv_op DECODE = {"det_loss_decode", decode_cpu, YV_CUDA_FN(decode_cuda), NULL};

/* det_loss_forward(maps, strides, reg_max, targets, label_smoothing, pos_weight, max_dist, workspace, out,
 *                  stream) */
PyObject *yv_py_det_loss_forward(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    const char *op = FORWARD.name;
    det_call c;
    yv_tensor first, workspace;
    uintptr_t stream = 0;
    memset(&c, 0, sizeof(c));

    if (yv_check_nargs(op, nargs, 10) < 0 || parse_loss_args(args, op, &c, &first) < 0)
        return NULL;
    int cuda = first.device != YV_CPU;
    if (yv_tensor_parse(args[7], op, "workspace", 1, &workspace) < 0
        || yv_tensor_parse(args[8], op, "out", 1, &c.out) < 0 || yv_parse_stream(args[9], op, &stream) < 0)
        return NULL;
    if (yv_check_ndim(&workspace, 1) < 0 || yv_check_dtype(&workspace, YV_DT(YV_UINT8)) < 0
        || yv_check_same_device(&workspace, &first) < 0 || yv_check_contiguous(&workspace) < 0
        || yv_check_alignment(&workspace, 16) < 0)
        return NULL;
    if (check_terms(&c.out, &first, cuda) < 0)
        return NULL;
#ifdef YV_WITH_CUDA
    size_t need = cuda ? yv_det_loss_workspace_size(c.L.B, c.L.A) : 0;
    if ((uint64_t)workspace.numel < (uint64_t)need) {
        PyErr_Format(PyExc_ValueError, "%s: workspace has %lld bytes, %zu are needed (det_loss_workspace_size)",
                     op, (long long)workspace.numel, need);
        return NULL;
    }
#endif
    c.workspace = workspace.data;
    return yv_launch(module, &FORWARD, first.device, stream, &c);
}

/* det_loss_backward(maps, strides, reg_max, targets, label_smoothing, pos_weight, max_dist, grad_out, grads,
 *                   stream) */
PyObject *yv_py_det_loss_backward(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    const char *op = BACKWARD.name;
    det_call c;
    yv_tensor first, gfirst;
    uintptr_t stream = 0;
    memset(&c, 0, sizeof(c));

    if (yv_check_nargs(op, nargs, 10) < 0 || parse_loss_args(args, op, &c, &first) < 0)
        return NULL;
    int cuda = first.device != YV_CPU;
    if (yv_tensor_parse(args[7], op, "grad_out", 0, &c.grad_out) < 0
        || parse_levels(args[8], NULL, op, "grads", 1, &c.G, &gfirst) < 0 || yv_parse_stream(args[9], op, &stream) < 0)
        return NULL;
    if (check_terms(&c.grad_out, &first, cuda) < 0)
        return NULL;
    if (yv_check_same_dtype(&gfirst, &first) < 0 || yv_check_same_device(&gfirst, &first) < 0)
        return NULL;
    if (c.G.nl != c.L.nl || c.G.B != c.L.B || c.G.C != c.L.C) {
        PyErr_Format(PyExc_ValueError, "%s: grads must have the maps' number of levels, batch and channels", op);
        return NULL;
    }
    for (int l = 0; l < c.L.nl; l++) {
        if (c.G.H[l] != c.L.H[l] || c.G.W[l] != c.L.W[l]) {
            PyErr_Format(PyExc_ValueError, "%s: grads level %d is %lld x %lld, the map is %lld x %lld", op, l,
                         (long long)c.G.H[l], (long long)c.G.W[l], (long long)c.L.H[l], (long long)c.L.W[l]);
            return NULL;
        }
        c.G.stride[l] = c.L.stride[l];
    }
    return yv_launch(module, &BACKWARD, first.device, stream, &c);
}

/* det_loss_decode(maps, strides, reg_max, boxes, stream) */
PyObject *yv_py_det_loss_decode(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    const char *op = DECODE.name;
    det_call c;
    yv_tensor first, boxes;
    uintptr_t stream = 0;
    memset(&c, 0, sizeof(c));

    if (yv_check_nargs(op, nargs, 5) < 0 || parse_levels(args[0], args[1], op, "maps", 0, &c.L, &first) < 0
        || parse_reg_max(args[2], op, &c.reg_max) < 0)
        return NULL;
    int cuda = first.device != YV_CPU;
    c.dtype = first.dtype;
    if (check_map_dtype(&first, cuda) < 0 || check_reg_max_fits(&c.L, c.reg_max, op) < 0)
        return NULL;
    if (yv_tensor_parse(args[3], op, "boxes", 1, &boxes) < 0 || yv_parse_stream(args[4], op, &stream) < 0)
        return NULL;
    if (yv_check_ndim(&boxes, 3) < 0 || yv_check_dim(&boxes, 0, c.L.B) < 0 || yv_check_dim(&boxes, 1, c.L.A) < 0
        || yv_check_dim(&boxes, 2, 4) < 0 || yv_check_dtype(&boxes, YV_DT(YV_FLOAT32)) < 0
        || yv_check_contiguous(&boxes) < 0 || yv_check_same_device(&boxes, &first) < 0)
        return NULL;
    if (cuda && yv_check_alignment(&boxes, 16) < 0)   /* the kernel stores one float4 per anchor */
        return NULL;
    c.boxes = (float *)boxes.data;
    return yv_launch(module, &DECODE, first.device, stream, &c);
}
