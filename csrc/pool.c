/* pool.c — bindings of the 2×2 stride-1 average pool (ADown/AConv's F.avg_pool2d(x, 2, 1, 0, False, True)):
 * avg_pool2x2_forward and avg_pool2x2_backward; and of the k×k max pool (ADown's F.max_pool2d(x, 3, 2, 1),
 * SPPELAN's nn.MaxPool2d(5, 1, 2)): max_pool2d_forward and max_pool2d_backward (from x and grad_out, through
 * the caller's uint8 scratch `index`); and of the nearest 2× upsampling (nn.Upsample(scale_factor=2,
 * mode='nearest'), CBFuse's resize to twice the size): upsample_nearest2x_forward and
 * upsample_nearest2x_backward (from grad_out alone).
 *
 * Checks every argument (ValueError/TypeError naming the op and the argument), then hands the views to
 * yv_launch: csrc/pool_ref.c (CPU: float32/float16) or kernels/pool.cu (CUDA: float32/float16/bfloat16, on
 * the caller's stream). Operands may have any strides (NCHW, channels-last, a channel slice of a bigger
 * buffer); an output must not have a zero stride, and its memory span must not meet the input's
 * (conservative: two interleaved channel slices of one buffer are refused too).
 * The Python entry point is yolov9c/ops/pool.py; the maths is stated at the top of kernels/pool.cu.
 * Test: python -m pytest -q tests/ops/test_pool.py tests/ops/test_bindings.py
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

/* out has its own storage (no zero stride) and does not meet input `in` in memory. */
static int check_output(const yv_tensor *out, const yv_tensor *in)
{
    for (int d = 0; d < 4 && out->numel > 0; d++) {
        if (out->shape[d] > 1 && out->strides[d] == 0) {
            PyErr_Format(PyExc_ValueError, "%s: %s is an output and has stride 0 in dimension %d (an expanded "
                         "tensor); pass a tensor with its own storage", out->op, out->arg, d);
            return -1;
        }
    }
    uintptr_t ilo, ihi, olo, ohi;
    span(in, &ilo, &ihi);
    span(out, &olo, &ohi);
    if (in->numel > 0 && out->numel > 0 && ilo < ohi && olo < ihi) {
        PyErr_Format(PyExc_ValueError, "%s: %s overlaps %s in memory; write the result into separate storage",
                     out->op, out->arg, in->arg);
        return -1;
    }
    return 0;
}

/* The input `first` is a float 4-D tensor (it fixes the device and dtype); out is 4-D, of its device and dtype. */
static int check_io(const yv_tensor *first, const yv_tensor *out)
{
    unsigned types = first->device == YV_CPU ? CPU_FLOATS : FLOATS;
    if (yv_check_ndim(first, 4) < 0 || yv_check_dtype(first, types) < 0 || yv_check_ndim(out, 4) < 0
        || yv_check_same_device(out, first) < 0 || yv_check_same_dtype(out, first) < 0)
        return -1;
    return 0;
}

/* t has shape want, derived from `of` as `how` says (" less 1 in H and W", " with H and W doubled"). */
static int check_derived(const yv_tensor *t, const int64_t want[4], const yv_tensor *of, const char *how)
{
    for (int d = 0; d < 4; d++) {
        if (t->shape[d] != want[d]) {
            PyErr_Format(PyExc_ValueError, "%s: %s must have shape (%lld, %lld, %lld, %lld) (%s's shape%s), got "
                         "(%lld, %lld, %lld, %lld)", t->op, t->arg, (long long)want[0], (long long)want[1],
                         (long long)want[2], (long long)want[3], of->arg, how, (long long)t->shape[0],
                         (long long)t->shape[1], (long long)t->shape[2], (long long)t->shape[3]);
            return -1;
        }
    }
    return 0;
}

static void set_shape(pool_call *c, const yv_tensor *t)
{
    c->B = t->shape[0];
    c->C = t->shape[1];
    c->H = t->shape[2];
    c->W = t->shape[3];
}

/* big: the (B, C, H, W) operand (H, W >= 2); small: the (B, C, H-1, W-1) one; out: which of them is written. */
static int check_pair(const yv_tensor *big, const yv_tensor *small, const yv_tensor *out, pool_call *c)
{
    const yv_tensor *first = out == big ? small : big;   /* the input: fixes the device and dtype */
    if (check_io(first, out) < 0)
        return -1;
    if (big->shape[2] < 2 || big->shape[3] < 2) {
        PyErr_Format(PyExc_ValueError, "%s: %s must have H >= 2 and W >= 2 (one 2x2 window), got %lld x %lld",
                     big->op, big->arg, (long long)big->shape[2], (long long)big->shape[3]);
        return -1;
    }
    int64_t want[4] = {big->shape[0], big->shape[1], big->shape[2] - 1, big->shape[3] - 1};
    if (check_derived(small, want, big, " less 1 in H and W") < 0 || check_output(out, first) < 0)
        return -1;
    set_shape(c, big);
    return 0;
}

/* The upsampling's pair: small (B, C, H, W) (x or grad_in), big (B, C, 2H, 2W) (out or grad_out); out: which
 * of them is written. The shape checked is big's, from small's: a grad_out of odd H or W is refused. */
static int check_upsample_pair(const yv_tensor *small, const yv_tensor *big, const yv_tensor *out, pool_call *c)
{
    const yv_tensor *first = out == big ? small : big;
    if (check_io(first, out) < 0)
        return -1;
    int64_t want[4] = {small->shape[0], small->shape[1], 2 * small->shape[2], 2 * small->shape[3]};
    if (check_derived(big, want, small, " with H and W doubled") < 0 || check_output(out, first) < 0)
        return -1;
    set_shape(c, small);
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

/* The four bindings (src, dst, stream): src read and dst written. avg pool (upsample 0): forward big = src,
 * backward big = dst; upsampling (upsample 1): forward small = src, backward small = dst. */
static PyObject *pool_binding(PyObject *module, const yv_op *op, const char *src_name, const char *dst_name,
                              int backward, int upsample, PyObject *const *args, Py_ssize_t nargs)
{
    yv_tensor src, dst;
    uintptr_t stream = 0;
    if (yv_check_nargs(op->name, nargs, 3) < 0 || yv_tensor_parse(args[0], op->name, src_name, 0, &src) < 0
        || yv_tensor_parse(args[1], op->name, dst_name, 1, &dst) < 0
        || yv_parse_stream(args[2], op->name, &stream) < 0)
        return NULL;
    pool_call c;
    const yv_tensor *first = backward ? &dst : &src, *second = backward ? &src : &dst;
    if ((upsample ? check_upsample_pair(first, second, &dst, &c) : check_pair(first, second, &dst, &c)) < 0)
        return NULL;
    c.src = view_of(&src);
    c.dst = view_of(&dst);
    if (src.numel == 0 || dst.numel == 0) {   /* B, C (or the upsampling's H or W) is 0: nothing to compute */
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
    return pool_binding(module, &FORWARD, "x", "out", 0, 0, args, nargs);
}

PyObject *yv_py_avg_pool2x2_backward(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    return pool_binding(module, &BACKWARD, "grad_out", "grad_in", 1, 0, args, nargs);
}

/* ---- upsample_nearest2x: the same call struct (B, C, H, W: the upsampling's input shape) and binding ---- */

static int up_forward_cpu(void *p)
{
    pool_call *c = (pool_call *)p;
    return yv_upsample_nearest2x_forward_ref(c->B, c->C, c->H, c->W, c->src, c->dst);
}

static int up_backward_cpu(void *p)
{
    pool_call *c = (pool_call *)p;
    return yv_upsample_nearest2x_backward_ref(c->B, c->C, c->H, c->W, c->src, c->dst);
}

#ifdef YV_WITH_CUDA
static int up_forward_cuda(void *p, void *stream)
{
    pool_call *c = (pool_call *)p;
    return (int)yv_upsample_nearest2x_forward(c->B, c->C, c->H, c->W, c->src, c->dst, (cudaStream_t)stream);
}

static int up_backward_cuda(void *p, void *stream)
{
    pool_call *c = (pool_call *)p;
    return (int)yv_upsample_nearest2x_backward(c->B, c->C, c->H, c->W, c->src, c->dst, (cudaStream_t)stream);
}
#endif

static const yv_op UP_FORWARD = {"upsample_nearest2x_forward", up_forward_cpu, YV_CUDA_FN(up_forward_cuda), NULL};
static const yv_op UP_BACKWARD = {"upsample_nearest2x_backward", up_backward_cpu, YV_CUDA_FN(up_backward_cuda),
                                  NULL};

PyObject *yv_py_upsample_nearest2x_forward(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    return pool_binding(module, &UP_FORWARD, "x", "out", 0, 1, args, nargs);
}

PyObject *yv_py_upsample_nearest2x_backward(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    return pool_binding(module, &UP_BACKWARD, "grad_out", "grad_in", 1, 1, args, nargs);
}

/* ---- max_pool2d ---- */

#define MAX_POOL_K 63   /* window side: window indices fit an int; ample for the models' 3 and 5 */
#define MAX_INDEX 255   /* the backward's window indices dy·k + dx are uint8: k·k <= 255 (k <= 15) */

typedef struct max_call {
    int64_t B, C, H, W;
    int k, s, p;
    yv_view4 in, src, dst;   /* forward: src = in, dst = out; backward: src = grad_out, dst = grad_in */
    yv_view4 index;          /* backward: the uint8 window-argmax scratch (B, C, Ho, Wo) */
} max_call;

static int parse_small(PyObject *obj, const char *op, const char *arg, long lo, long hi, int *out)
{
    if (!PyLong_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s: %s must be an int, got %.80s", op, arg, Py_TYPE(obj)->tp_name);
        return -1;
    }
    long v = PyLong_AsLong(obj);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (v < lo || v > hi) {
        PyErr_Format(PyExc_ValueError, "%s: %s must be in [%ld, %ld], got %ld", op, arg, lo, hi, v);
        return -1;
    }
    *out = (int)v;
    return 0;
}

/* k, s, p from args[0..2]; the input x (B, C, H, W) fixes the device and dtype; *ho, *wo: the output size. */
static int check_max_geometry(PyObject *const *args, const yv_tensor *x, max_call *c, int64_t *ho, int64_t *wo)
{
    const char *op = x->op;
    unsigned types = x->device == YV_CPU ? CPU_FLOATS : FLOATS;
    if (yv_check_ndim(x, 4) < 0 || yv_check_dtype(x, types) < 0
        || parse_small(args[0], op, "k", 1, MAX_POOL_K, &c->k) < 0
        || parse_small(args[1], op, "s", 1, MAX_POOL_K, &c->s) < 0
        || parse_small(args[2], op, "p", 0, c->k / 2, &c->p) < 0)
        return -1;
    c->B = x->shape[0];
    c->C = x->shape[1];
    c->H = x->shape[2];
    c->W = x->shape[3];
    if (c->H + 2 * c->p < c->k || c->W + 2 * c->p < c->k) {
        PyErr_Format(PyExc_ValueError, "%s: x is %lld x %lld, smaller than one %d x %d window with padding %d",
                     op, (long long)c->H, (long long)c->W, c->k, c->k, c->p);
        return -1;
    }
    *ho = (c->H + 2 * c->p - c->k) / c->s + 1;
    *wo = (c->W + 2 * c->p - c->k) / c->s + 1;
    return 0;
}

/* t has 4 dimensions, shape (B, C, h, w) and x's device. */
static int check_shape(const yv_tensor *t, const yv_tensor *x, int64_t h, int64_t w)
{
    if (yv_check_ndim(t, 4) < 0 || yv_check_same_device(t, x) < 0)
        return -1;
    int64_t want[4] = {x->shape[0], x->shape[1], h, w};
    for (int d = 0; d < 4; d++) {
        if (t->shape[d] != want[d]) {
            PyErr_Format(PyExc_ValueError, "%s: %s must have shape (%lld, %lld, %lld, %lld), got (%lld, %lld, %lld, "
                         "%lld)", t->op, t->arg, (long long)want[0], (long long)want[1], (long long)want[2],
                         (long long)want[3], (long long)t->shape[0], (long long)t->shape[1],
                         (long long)t->shape[2], (long long)t->shape[3]);
            return -1;
        }
    }
    return 0;
}

/* t has shape (B, C, h, w) and x's device and dtype. */
static int check_like(const yv_tensor *t, const yv_tensor *x, int64_t h, int64_t w)
{
    return yv_check_same_dtype(t, x) < 0 ? -1 : check_shape(t, x, h, w);
}

/* The backward's index: uint8 (B, C, ho, wo) on x's device, an output apart from x, grad_out and grad_in; the
 * window's k·k indices fit a uint8. */
static int check_index(const yv_tensor *idx, const yv_tensor *x, const yv_tensor *go, const yv_tensor *gi,
                       const max_call *c, int64_t ho, int64_t wo)
{
    if (c->k * c->k > MAX_INDEX) {
        PyErr_Format(PyExc_ValueError, "%s: k*k must be <= %d (the window argmax is stored as one uint8 in "
                     "index), got k = %d; use torch's F.max_pool2d for larger windows", idx->op, MAX_INDEX, c->k);
        return -1;
    }
    if (yv_check_dtype(idx, YV_DT(YV_UINT8)) < 0 || check_shape(idx, x, ho, wo) < 0 || check_output(idx, x) < 0
        || check_output(idx, go) < 0 || check_output(gi, idx) < 0)
        return -1;
    return 0;
}

static int max_forward_cpu(void *p)
{
    max_call *c = (max_call *)p;
    return yv_max_pool2d_forward_ref(c->B, c->C, c->H, c->W, c->k, c->s, c->p, c->src, c->dst);
}

static int max_backward_cpu(void *p)
{
    max_call *c = (max_call *)p;
    return yv_max_pool2d_backward_ref(c->B, c->C, c->H, c->W, c->k, c->s, c->p, c->in, c->src, c->index, c->dst);
}

#ifdef YV_WITH_CUDA
static int max_forward_cuda(void *p, void *stream)
{
    max_call *c = (max_call *)p;
    return (int)yv_max_pool2d_forward(c->B, c->C, c->H, c->W, c->k, c->s, c->p, c->src, c->dst,
                                      (cudaStream_t)stream);
}

static int max_backward_cuda(void *p, void *stream)
{
    max_call *c = (max_call *)p;
    return (int)yv_max_pool2d_backward(c->B, c->C, c->H, c->W, c->k, c->s, c->p, c->in, c->src, c->index,
                                       c->dst, (cudaStream_t)stream);
}
#endif

static const yv_op MAX_FORWARD = {"max_pool2d_forward", max_forward_cpu, YV_CUDA_FN(max_forward_cuda), NULL};
static const yv_op MAX_BACKWARD = {"max_pool2d_backward", max_backward_cpu, YV_CUDA_FN(max_backward_cuda), NULL};

static PyObject *max_launch(PyObject *module, const yv_op *op, const yv_tensor *x, uintptr_t stream, max_call *c)
{
    if (x->numel == 0) {   /* B or C is 0 */
        if (stream != 0 && x->device == YV_CPU) {
            PyErr_Format(PyExc_ValueError, "%s: stream must be 0 for CPU tensors", op->name);
            return NULL;
        }
        Py_RETURN_NONE;
    }
    return yv_launch(module, op, x->device, stream, c);
}

/* max_pool2d_forward(x, out, k, s, p, stream) */
PyObject *yv_py_max_pool2d_forward(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    const yv_op *op = &MAX_FORWARD;
    yv_tensor x, out;
    uintptr_t stream = 0;
    max_call c;
    int64_t ho, wo;
    if (yv_check_nargs(op->name, nargs, 6) < 0 || yv_tensor_parse(args[0], op->name, "x", 0, &x) < 0
        || yv_tensor_parse(args[1], op->name, "out", 1, &out) < 0 || check_max_geometry(args + 2, &x, &c, &ho, &wo) < 0
        || yv_parse_stream(args[5], op->name, &stream) < 0 || check_like(&out, &x, ho, wo) < 0
        || check_output(&out, &x) < 0)
        return NULL;
    c.in = c.src = view_of(&x);
    c.dst = view_of(&out);
    return max_launch(module, op, &x, stream, &c);
}

/* max_pool2d_backward(x, grad_out, index, grad_in, k, s, p, stream) */
PyObject *yv_py_max_pool2d_backward(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    const yv_op *op = &MAX_BACKWARD;
    yv_tensor x, go, idx, gi;
    uintptr_t stream = 0;
    max_call c;
    int64_t ho, wo;
    if (yv_check_nargs(op->name, nargs, 8) < 0 || yv_tensor_parse(args[0], op->name, "x", 0, &x) < 0
        || yv_tensor_parse(args[1], op->name, "grad_out", 0, &go) < 0
        || yv_tensor_parse(args[2], op->name, "index", 1, &idx) < 0
        || yv_tensor_parse(args[3], op->name, "grad_in", 1, &gi) < 0
        || check_max_geometry(args + 4, &x, &c, &ho, &wo) < 0 || yv_parse_stream(args[7], op->name, &stream) < 0
        || check_like(&go, &x, ho, wo) < 0 || check_like(&gi, &x, c.H, c.W) < 0 || check_output(&gi, &x) < 0
        || check_output(&gi, &go) < 0 || check_index(&idx, &x, &go, &gi, &c, ho, wo) < 0)
        return NULL;
    c.in = view_of(&x);
    c.src = view_of(&go);
    c.index = view_of(&idx);
    c.dst = view_of(&gi);
    return max_launch(module, op, &x, stream, &c);
}
