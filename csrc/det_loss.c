/* det_loss.c — bindings of the detection-loss op (one head branch): det_loss_forward, det_loss_backward,
 * det_loss_decode and det_loss_workspace_size.
 *
 * Checks every argument (raising ValueError/TypeError that name the op and the argument), then releases the
 * GIL and runs csrc/det_loss_ref.c (CPU, float64 arithmetic) or kernels/det_loss.cu (CUDA, on the caller's
 * stream). The Python entry point is yolov9c/ops/det_loss.py; the maths is stated at the top of
 * csrc/det_loss_ref.c.
 * Test: python -m pytest -q tests/test_det_loss.py
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
                PyErr_Format(PyExc_ValueError, "%s: strides must be positive, got %g at level %zd", op, s, l);
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
        double v = T->tss.dtype == YV_FLOAT64 ? *(const double *)T->tss.data : (double)*(const float *)T->tss.data;
        if (!(v > 0.0) || !isfinite(v)) {
            PyErr_Format(PyExc_ValueError, "%s: target_scores_sum must be positive and finite, got %g", op, v);
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
        PyErr_Format(PyExc_ValueError, "%s: label_smoothing must be in [0, 1], got %g", op, *eps);
        return -1;
    }
    if (!(*pos_weight > 0.0)) {
        PyErr_Format(PyExc_ValueError, "%s: pos_weight must be positive, got %g", op, *pos_weight);
        return -1;
    }
    /* the right bin ⌊τ⌋ + 1 must stay inside the R bins */
    if (!(*max_dist >= 0.0 && *max_dist < (double)(reg_max - 1))) {
        PyErr_Format(PyExc_ValueError, "%s: max_dist must be in [0, reg_max - 1) = [0, %d), got %g", op,
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

#define FWD "det_loss_forward"

/* det_loss_forward(maps, strides, reg_max, target_labels, target_boxes, target_norm, fg_mask,
 *                  target_scores_sum, label_smoothing, pos_weight, max_dist, workspace, out, stream) */
PyObject *yv_py_det_loss_forward(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    yv_levels L;
    yv_tensor first, workspace, out;
    targets T;
    int reg_max;
    double eps, pos_weight, max_dist;
    uintptr_t stream = 0;

    (void)module;   /* used by the CUDA error path only */
    if (yv_check_nargs(FWD, nargs, 14) < 0)
        return NULL;
    if (parse_levels(args[0], args[1], FWD, "maps", 0, &L, &first) < 0 || parse_reg_max(args[2], FWD, &reg_max) < 0)
        return NULL;
    int cuda = first.device != YV_CPU;
    if (check_map_dtype(&first, cuda) < 0 || check_reg_max_fits(&L, reg_max, FWD) < 0
        || parse_targets(args + 3, FWD, &L, &first, &T) < 0 || parse_scalars(args + 8, FWD, reg_max, &eps,
                                                                              &pos_weight, &max_dist) < 0)
        return NULL;
    if (yv_tensor_parse(args[11], FWD, "workspace", 1, &workspace) < 0
        || yv_tensor_parse(args[12], FWD, "out", 1, &out) < 0 || yv_parse_stream(args[13], FWD, &stream) < 0)
        return NULL;
    if (yv_check_ndim(&workspace, 1) < 0 || yv_check_dtype(&workspace, YV_DT(YV_UINT8)) < 0
        || yv_check_same_device(&workspace, &first) < 0 || yv_check_contiguous(&workspace) < 0
        || yv_check_alignment(&workspace, 16) < 0)
        return NULL;
    if (yv_check_ndim(&out, 1) < 0 || yv_check_dim(&out, 0, 3) < 0 || yv_check_same_device(&out, &first) < 0
        || yv_check_contiguous(&out) < 0
        || yv_check_dtype(&out, cuda ? YV_DT(YV_FLOAT32) : YV_DT(YV_FLOAT32) | YV_DT(YV_FLOAT64)) < 0)
        return NULL;

    if (!cuda) {
        if (stream != 0) {
            PyErr_SetString(PyExc_ValueError, FWD ": stream must be 0 for CPU tensors");
            return NULL;
        }
        double tss = T.tss.dtype == YV_FLOAT64 ? *(const double *)T.tss.data : (double)*(const float *)T.tss.data;
        double res[3];
        int rc;
        Py_BEGIN_ALLOW_THREADS
        rc = yv_det_loss_forward_ref(&L, first.dtype, reg_max, T.labels.data, T.labels.dtype, T.tboxes.data,
                                     T.tnorm.data, T.tnorm.dtype, (const uint8_t *)T.fg.data, tss, eps, pos_weight,
                                     max_dist, res);
        Py_END_ALLOW_THREADS
        if (rc == -1) {
            PyErr_SetString(PyExc_ValueError, FWD ": target_labels has a foreground label outside [0, NC)");
            return NULL;
        }
        for (int k = 0; k < 3; k++) {
            if (out.dtype == YV_FLOAT64)
                ((double *)out.data)[k] = res[k];
            else
                ((float *)out.data)[k] = (float)res[k];
        }
        Py_RETURN_NONE;
    }
#ifdef YV_WITH_CUDA
    size_t need = yv_det_loss_workspace_size(L.B, L.A);
    if ((uint64_t)workspace.numel < (uint64_t)need) {
        PyErr_Format(PyExc_ValueError, "%s: workspace has %lld bytes, %zu are needed (det_loss_workspace_size)",
                     FWD, (long long)workspace.numel, need);
        return NULL;
    }
    int sync = yv_sync_requested();
    cudaStream_t cstream = (cudaStream_t)stream;
    cudaError_t err;
    Py_BEGIN_ALLOW_THREADS
    int prev = -1;
    err = yv_device_enter(first.device, &prev);
    if (err == cudaSuccess) {
        err = yv_det_loss_forward(&L, first.dtype, reg_max, T.labels.data, T.labels.dtype,
                                  (const float *)T.tboxes.data, (const float *)T.tnorm.data,
                                  (const uint8_t *)T.fg.data, (const float *)T.tss.data, (float)eps,
                                  (float)pos_weight, (float)max_dist, workspace.data, (float *)out.data, cstream);
        err = yv_launch_status(err, cstream, sync);
        yv_device_leave(prev);
    }
    Py_END_ALLOW_THREADS
    if (err != cudaSuccess)
        return yv_cuda_error(module, FWD, err);
    Py_RETURN_NONE;
#else
    return yv_no_cuda_error(FWD);
#endif
}

#define BWD "det_loss_backward"

/* det_loss_backward(maps, strides, reg_max, target_labels, target_boxes, target_norm, fg_mask,
 *                   target_scores_sum, label_smoothing, pos_weight, max_dist, grad_out, grads, stream) */
PyObject *yv_py_det_loss_backward(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    yv_levels L, G;
    yv_tensor first, gfirst, grad_out;
    targets T;
    int reg_max;
    double eps, pos_weight, max_dist;
    uintptr_t stream = 0;

    (void)module;   /* used by the CUDA error path only */
    if (yv_check_nargs(BWD, nargs, 14) < 0)
        return NULL;
    if (parse_levels(args[0], args[1], BWD, "maps", 0, &L, &first) < 0 || parse_reg_max(args[2], BWD, &reg_max) < 0)
        return NULL;
    int cuda = first.device != YV_CPU;
    if (check_map_dtype(&first, cuda) < 0 || check_reg_max_fits(&L, reg_max, BWD) < 0
        || parse_targets(args + 3, BWD, &L, &first, &T) < 0 || parse_scalars(args + 8, BWD, reg_max, &eps,
                                                                              &pos_weight, &max_dist) < 0)
        return NULL;
    if (yv_tensor_parse(args[11], BWD, "grad_out", 0, &grad_out) < 0
        || parse_levels(args[12], NULL, BWD, "grads", 1, &G, &gfirst) < 0 || yv_parse_stream(args[13], BWD, &stream) < 0)
        return NULL;
    if (yv_check_ndim(&grad_out, 1) < 0 || yv_check_dim(&grad_out, 0, 3) < 0
        || yv_check_same_device(&grad_out, &first) < 0 || yv_check_contiguous(&grad_out) < 0
        || yv_check_dtype(&grad_out, cuda ? YV_DT(YV_FLOAT32) : YV_DT(YV_FLOAT32) | YV_DT(YV_FLOAT64)) < 0)
        return NULL;
    if (yv_check_same_dtype(&gfirst, &first) < 0 || yv_check_same_device(&gfirst, &first) < 0)
        return NULL;
    if (G.nl != L.nl || G.B != L.B || G.C != L.C) {
        PyErr_SetString(PyExc_ValueError, BWD ": grads must have the maps' number of levels, batch and channels");
        return NULL;
    }
    for (int l = 0; l < L.nl; l++) {
        if (G.H[l] != L.H[l] || G.W[l] != L.W[l]) {
            PyErr_Format(PyExc_ValueError, "%s: grads level %d is %lld x %lld, the map is %lld x %lld", BWD, l,
                         (long long)G.H[l], (long long)G.W[l], (long long)L.H[l], (long long)L.W[l]);
            return NULL;
        }
        G.stride[l] = L.stride[l];
    }

    if (!cuda) {
        if (stream != 0) {
            PyErr_SetString(PyExc_ValueError, BWD ": stream must be 0 for CPU tensors");
            return NULL;
        }
        double tss = T.tss.dtype == YV_FLOAT64 ? *(const double *)T.tss.data : (double)*(const float *)T.tss.data;
        double g[3];
        for (int k = 0; k < 3; k++)
            g[k] = grad_out.dtype == YV_FLOAT64 ? ((const double *)grad_out.data)[k]
                                                : (double)((const float *)grad_out.data)[k];
        int rc;
        Py_BEGIN_ALLOW_THREADS
        rc = yv_det_loss_backward_ref(&L, first.dtype, reg_max, T.labels.data, T.labels.dtype, T.tboxes.data,
                                      T.tnorm.data, T.tnorm.dtype, (const uint8_t *)T.fg.data, tss, eps, pos_weight,
                                      max_dist, g, &G);
        Py_END_ALLOW_THREADS
        if (rc == -1) {
            PyErr_SetString(PyExc_ValueError, BWD ": target_labels has a foreground label outside [0, NC)");
            return NULL;
        }
        Py_RETURN_NONE;
    }
#ifdef YV_WITH_CUDA
    int sync = yv_sync_requested();
    cudaStream_t cstream = (cudaStream_t)stream;
    cudaError_t err;
    Py_BEGIN_ALLOW_THREADS
    int prev = -1;
    err = yv_device_enter(first.device, &prev);
    if (err == cudaSuccess) {
        err = yv_det_loss_backward(&L, first.dtype, reg_max, T.labels.data, T.labels.dtype,
                                   (const float *)T.tboxes.data, (const float *)T.tnorm.data,
                                   (const uint8_t *)T.fg.data, (const float *)T.tss.data, (float)eps,
                                   (float)pos_weight, (float)max_dist, (const float *)grad_out.data, &G, cstream);
        err = yv_launch_status(err, cstream, sync);
        yv_device_leave(prev);
    }
    Py_END_ALLOW_THREADS
    if (err != cudaSuccess)
        return yv_cuda_error(module, BWD, err);
    Py_RETURN_NONE;
#else
    return yv_no_cuda_error(BWD);
#endif
}

#define DEC "det_loss_decode"

/* det_loss_decode(maps, strides, reg_max, boxes, stream) */
PyObject *yv_py_det_loss_decode(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    yv_levels L;
    yv_tensor first, boxes;
    int reg_max;
    uintptr_t stream = 0;

    (void)module;   /* used by the CUDA error path only */
    if (yv_check_nargs(DEC, nargs, 5) < 0)
        return NULL;
    if (parse_levels(args[0], args[1], DEC, "maps", 0, &L, &first) < 0 || parse_reg_max(args[2], DEC, &reg_max) < 0)
        return NULL;
    int cuda = first.device != YV_CPU;
    if (check_map_dtype(&first, cuda) < 0 || check_reg_max_fits(&L, reg_max, DEC) < 0)
        return NULL;
    if (yv_tensor_parse(args[3], DEC, "boxes", 1, &boxes) < 0 || yv_parse_stream(args[4], DEC, &stream) < 0)
        return NULL;
    if (yv_check_ndim(&boxes, 3) < 0 || yv_check_dim(&boxes, 0, L.B) < 0 || yv_check_dim(&boxes, 1, L.A) < 0
        || yv_check_dim(&boxes, 2, 4) < 0 || yv_check_dtype(&boxes, YV_DT(YV_FLOAT32)) < 0
        || yv_check_contiguous(&boxes) < 0 || yv_check_same_device(&boxes, &first) < 0)
        return NULL;
    if (cuda && yv_check_alignment(&boxes, 16) < 0)   /* the kernel stores one float4 per anchor */
        return NULL;
    if (!cuda) {
        if (stream != 0) {
            PyErr_SetString(PyExc_ValueError, DEC ": stream must be 0 for CPU tensors");
            return NULL;
        }
        Py_BEGIN_ALLOW_THREADS
        (void)yv_det_loss_decode_ref(&L, first.dtype, reg_max, (float *)boxes.data);
        Py_END_ALLOW_THREADS
        Py_RETURN_NONE;
    }
#ifdef YV_WITH_CUDA
    int sync = yv_sync_requested();
    cudaStream_t cstream = (cudaStream_t)stream;
    cudaError_t err;
    Py_BEGIN_ALLOW_THREADS
    int prev = -1;
    err = yv_device_enter(first.device, &prev);
    if (err == cudaSuccess) {
        err = yv_det_loss_decode(&L, first.dtype, reg_max, (float *)boxes.data, cstream);
        err = yv_launch_status(err, cstream, sync);
        yv_device_leave(prev);
    }
    Py_END_ALLOW_THREADS
    if (err != cudaSuccess)
        return yv_cuda_error(module, DEC, err);
    Py_RETURN_NONE;
#else
    return yv_no_cuda_error(DEC);
#endif
}
