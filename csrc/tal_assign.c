/* tal_assign.c — bindings of the task-aligned assigner: tal_assign_forward and tal_assign_workspace_size.
 *
 * Checks every argument (raising ValueError/TypeError that name "tal_assign_forward" and the argument), then
 * releases the GIL and runs csrc/tal_assign_ref.c (CPU) or kernels/tal_assign.cu (CUDA, on the caller's
 * stream). The Python entry point is yolov9c/ops/tal_assign.py; the maths is stated at the top of
 * csrc/tal_assign_ref.c.
 * Test: python -m pytest -q tests/ops/test_tal_assign.py
 */
#include <math.h>

#include "module.h"
#include "tensor.h"
#include "yv_refs.h"
#ifdef YV_WITH_CUDA
#include "yv_kernels.h"
#endif

#define OP "tal_assign_forward"

/* Anchor and box indices are int32 in the workspaces and kernels. */
#define TAL_MAX_INDEX ((int64_t)INT32_MAX - 1)

static int parse_int(PyObject *obj, const char *op, const char *arg, int64_t lo, int64_t hi, int64_t *out)
{
    if (!PyLong_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s: %s must be an int, got %.80s", op, arg, Py_TYPE(obj)->tp_name);
        return -1;
    }
    long long v = PyLong_AsLongLong(obj);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (v < lo || v > hi) {
        PyErr_Format(PyExc_ValueError, "%s: %s must be in [%lld, %lld], got %lld", op, arg, (long long)lo,
                     (long long)hi, v);
        return -1;
    }
    *out = (int64_t)v;
    return 0;
}

PyObject *yv_py_tal_assign_workspace_size(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    const char *op = "tal_assign_workspace_size";
    int64_t B, M, A, topk;
    if (yv_check_nargs(op, nargs, 5) < 0 || parse_int(args[0], op, "B", 0, TAL_MAX_INDEX, &B) < 0
        || parse_int(args[1], op, "M", 0, TAL_MAX_INDEX, &M) < 0
        || parse_int(args[2], op, "A", 0, TAL_MAX_INDEX, &A) < 0
        || parse_int(args[3], op, "topk", 1, TAL_MAX_INDEX, &topk) < 0)
        return NULL;
    int cuda = PyObject_IsTrue(args[4]);
    if (cuda < 0)
        return NULL;
    if (!cuda)
        return PyLong_FromSize_t(yv_tal_assign_workspace_size_ref(B, M, A, topk));
#ifdef YV_WITH_CUDA
    if (topk > YV_TAL_MAX_TOPK) {
        PyErr_Format(PyExc_ValueError, "%s: topk must be at most %d on CUDA, got %lld", op, YV_TAL_MAX_TOPK,
                     (long long)topk);
        return NULL;
    }
    return PyLong_FromSize_t(yv_tal_assign_workspace_size(B, M, A, topk));
#else
    return yv_no_cuda_error(op);
#endif
}

/* ndim, exact shape, dtype, device of ref, contiguous. */
static int check_array(const yv_tensor *t, int ndim, const int64_t *shape, unsigned dtypes, const yv_tensor *ref)
{
    if (yv_check_ndim(t, ndim) < 0)
        return -1;
    for (int d = 0; d < ndim; d++)
        if (yv_check_dim(t, d, shape[d]) < 0)
            return -1;
    if (yv_check_dtype(t, dtypes) < 0 || yv_check_contiguous(t) < 0)
        return -1;
    return ref ? yv_check_same_device(t, ref) : 0;
}

typedef struct tal_call {
    const void *scores;
    yv_dtype score_dtype, round_dtype;
    const int64_t *score_strides;
    int logits;
    int64_t B, A, NC, M, topk;
    const float *pred, *points, *gt;
    const int64_t *labels;
    const uint8_t *mask;
    double alpha, beta, eps;
    void *workspace;
    int64_t *t_labels, *idx;
    float *t_boxes;
    void *t_norm;
    uint8_t *fg;
} tal_call;

static int tal_cpu(void *p)
{
    tal_call *c = (tal_call *)p;
    return yv_tal_assign_forward_ref(c->scores, c->score_dtype, c->score_strides, c->round_dtype, c->logits, c->B,
                                     c->A, c->NC, c->pred, c->points, c->labels, c->gt, c->mask, c->M, c->topk,
                                     c->alpha, c->beta, c->eps, c->workspace, c->t_labels, c->t_boxes, c->t_norm,
                                     c->fg, c->idx);
}

#ifdef YV_WITH_CUDA
static int tal_cuda(void *p, void *stream)
{
    tal_call *c = (tal_call *)p;
    return (int)yv_tal_assign_forward(c->scores, c->score_dtype, c->score_strides, c->logits, c->B, c->A, c->NC,
                                      c->pred, c->points, c->labels, c->gt, c->mask, c->M, (int)c->topk, c->alpha,
                                      c->beta, c->eps, c->workspace, c->t_labels, c->t_boxes, (float *)c->t_norm,
                                      c->fg, c->idx, (cudaStream_t)stream);
}
#endif

static const yv_op TAL = {OP, tal_cpu, YV_CUDA_FN(tal_cuda), "gt_labels holds a class outside [0, NC)"};

/* tal_assign_forward(scores, pred_boxes, points, gt, params, logits, round_dtype, workspace, targets, stream)
 * with gt = (gt_labels, gt_boxes, gt_mask), params = (topk, alpha, beta, eps) and targets = (target_labels,
 * target_boxes, target_norm, fg_mask, target_gt_idx). */
PyObject *yv_py_tal_assign_forward(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    yv_tensor scores, pred, points, labels, gt, mask, workspace, t_labels, t_boxes, t_norm, fg, idx;
    uintptr_t stream = 0;
    int64_t topk, round_code;
    double alpha, beta, eps;
    int logits;
    PyObject *g[3], *hp[4], *out[5];

    if (yv_check_nargs(OP, nargs, 10) < 0)
        return NULL;
    if (yv_tensor_parse(args[0], OP, "scores", 0, &scores) < 0
        || yv_tensor_parse(args[1], OP, "pred_boxes", 0, &pred) < 0
        || yv_tensor_parse(args[2], OP, "points", 0, &points) < 0
        || yv_parse_group(args[3], OP, "gt", "(gt_labels, gt_boxes, gt_mask)", 3, g) < 0
        || yv_tensor_parse(g[0], OP, "gt_labels", 0, &labels) < 0
        || yv_tensor_parse(g[1], OP, "gt_boxes", 0, &gt) < 0
        || yv_tensor_parse(g[2], OP, "gt_mask", 0, &mask) < 0
        || yv_parse_group(args[4], OP, "params", "(topk, alpha, beta, eps)", 4, hp) < 0
        || parse_int(hp[0], OP, "topk", 1, TAL_MAX_INDEX, &topk) < 0
        || yv_parse_finite(hp[1], OP, "alpha", &alpha) < 0 || yv_parse_finite(hp[2], OP, "beta", &beta) < 0
        || yv_parse_finite(hp[3], OP, "eps", &eps) < 0
        || yv_parse_flag(args[5], OP, "logits", &logits) < 0
        || parse_int(args[6], OP, "round_dtype", 0, YV_NUM_DTYPES - 1, &round_code) < 0
        || yv_tensor_parse(args[7], OP, "workspace", 1, &workspace) < 0
        || yv_parse_group(args[8], OP, "targets",
                          "(target_labels, target_boxes, target_norm, fg_mask, target_gt_idx)", 5, out) < 0
        || yv_tensor_parse(out[0], OP, "target_labels", 1, &t_labels) < 0
        || yv_tensor_parse(out[1], OP, "target_boxes", 1, &t_boxes) < 0
        || yv_tensor_parse(out[2], OP, "target_norm", 1, &t_norm) < 0
        || yv_tensor_parse(out[3], OP, "fg_mask", 1, &fg) < 0
        || yv_tensor_parse(out[4], OP, "target_gt_idx", 1, &idx) < 0
        || yv_parse_stream(args[9], OP, &stream) < 0)
        return NULL;

    int cuda = scores.device != YV_CPU;
    unsigned score_types = YV_DT(YV_FLOAT32) | YV_DT(YV_FLOAT16) | (cuda ? YV_DT(YV_BFLOAT16) : YV_DT(YV_FLOAT64));
    if (yv_check_ndim(&scores, 3) < 0 || yv_check_dtype(&scores, score_types) < 0)
        return NULL;
    for (int d = 0; d < 3; d++) {
        if (scores.strides[d] < 0) {
            PyErr_Format(PyExc_ValueError, "%s: scores must have non-negative strides, got %lld in dimension %d",
                         OP, (long long)scores.strides[d], d);
            return NULL;
        }
    }
    int64_t B = scores.shape[0], A = scores.shape[1], NC = scores.shape[2];
    if (A < 1 || A > TAL_MAX_INDEX || NC < 1) {
        PyErr_Format(PyExc_ValueError, "%s: scores must be (B, A, NC) with 1 <= A <= %lld and NC >= 1, got "
                     "(%lld, %lld, %lld)", OP, (long long)TAL_MAX_INDEX, (long long)B, (long long)A, (long long)NC);
        return NULL;
    }
    if (gt.ndim != 3) {
        PyErr_Format(PyExc_ValueError, "%s: gt_boxes must be (B, M, 4), got %d dimensions", OP, gt.ndim);
        return NULL;
    }
    int64_t M = gt.shape[1];
    if (M < 1 || M > TAL_MAX_INDEX) {
        PyErr_Format(PyExc_ValueError, "%s: gt_boxes must hold 1 <= M <= %lld boxes per image, got %lld (the "
                     "Python wrapper handles M = 0)", OP, (long long)TAL_MAX_INDEX, (long long)M);
        return NULL;
    }
    const int64_t s_ba4[3] = {B, A, 4}, s_a2[2] = {A, 2}, s_bm[2] = {B, M}, s_bm4[3] = {B, M, 4}, s_ba[2] = {B, A};
    yv_dtype norm_dtype = scores.dtype == YV_FLOAT64 ? YV_FLOAT64 : YV_FLOAT32;
    if (check_array(&pred, 3, s_ba4, YV_DT(YV_FLOAT32), &scores) < 0
        || check_array(&points, 2, s_a2, YV_DT(YV_FLOAT32), &scores) < 0
        || check_array(&labels, 2, s_bm, YV_DT(YV_INT64), &scores) < 0
        || check_array(&gt, 3, s_bm4, YV_DT(YV_FLOAT32), &scores) < 0
        || check_array(&mask, 2, s_bm, YV_DT(YV_BOOL) | YV_DT(YV_UINT8), &scores) < 0
        || check_array(&t_labels, 2, s_ba, YV_DT(YV_INT64), &scores) < 0
        || check_array(&t_boxes, 3, s_ba4, YV_DT(YV_FLOAT32), &scores) < 0
        || check_array(&t_norm, 2, s_ba, YV_DT(norm_dtype), &scores) < 0
        || check_array(&fg, 2, s_ba, YV_DT(YV_BOOL), &scores) < 0
        || check_array(&idx, 2, s_ba, YV_DT(YV_INT64), &scores) < 0)
        return NULL;
    if (yv_check_ndim(&workspace, 1) < 0 || yv_check_dtype(&workspace, YV_DT(YV_UINT8)) < 0
        || yv_check_same_device(&workspace, &scores) < 0 || yv_check_contiguous(&workspace) < 0
        || yv_check_alignment(&workspace, 16) < 0)
        return NULL;

    /* The dtype whose arithmetic the reference's sigmoid and pow round to: the scores' own dtype, or
     * bfloat16 for bfloat16 scores upcast to float32 (the CPU path takes no bfloat16 scores). */
    yv_dtype round_dtype = (yv_dtype)round_code;
    int round_ok = round_dtype == scores.dtype
                   || (!cuda && scores.dtype == YV_FLOAT32 && round_dtype == YV_BFLOAT16);
    if (!round_ok) {
        PyErr_Format(PyExc_ValueError, "%s: round_dtype must be the scores' dtype %s (or bfloat16 for float32 "
                     "scores on the CPU), got %s", OP, yv_dtype_name(scores.dtype), yv_dtype_name(round_dtype));
        return NULL;
    }

    size_t need;
#ifdef YV_WITH_CUDA
    if (cuda && topk > YV_TAL_MAX_TOPK) {
        PyErr_Format(PyExc_ValueError, "%s: topk must be at most %d on CUDA, got %lld", OP, YV_TAL_MAX_TOPK,
                     (long long)topk);
        return NULL;
    }
    need = cuda ? yv_tal_assign_workspace_size(B, M, A, topk) : yv_tal_assign_workspace_size_ref(B, M, A, topk);
#else
    if (cuda)
        return yv_no_cuda_error(OP);
    need = yv_tal_assign_workspace_size_ref(B, M, A, topk);
#endif
    if ((uint64_t)workspace.numel < (uint64_t)need) {
        PyErr_Format(PyExc_ValueError, "%s: workspace has %lld bytes, %zu are needed "
                     "(tal_assign_workspace_size(B, M, A, topk, cuda))", OP, (long long)workspace.numel, need);
        return NULL;
    }
    if (B == 0)
        Py_RETURN_NONE;
    tal_call c = {scores.data, scores.dtype, round_dtype, scores.strides, logits, B, A, NC, M, topk,
                  (const float *)pred.data, (const float *)points.data, (const float *)gt.data,
                  (const int64_t *)labels.data, (const uint8_t *)mask.data, alpha, beta, eps, workspace.data,
                  (int64_t *)t_labels.data, (int64_t *)idx.data, (float *)t_boxes.data, t_norm.data,
                  (uint8_t *)fg.data};
    return yv_launch(module, &TAL, scores.device, stream, &c);
}
