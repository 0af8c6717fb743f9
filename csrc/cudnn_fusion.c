/* cudnn_fusion.c — cudnn_fusion_probe: which fused GELAN convolution graphs cuDNN 9 can run on this GPU
 * (issue 12, deliverable 3, first step: support, not yet speed).
 *
 * Each pattern below is a cuDNN backend operation graph over NHWC tensors (fp16 or bf16 in memory, fp32
 * accumulation and fp32 virtual intermediates). For each, the probe asks cuDNN's heuristics (mode A, then
 * FALLBACK when no config of A finalizes) for engine configs and tries to finalize an execution plan from
 * them; nothing is executed. Shapes: x (N, C, H, W), w (K, C, R, S), same padding R/2, S/2, one stride.
 * `scale`/`bias` are per-channel (1, C, 1, 1) fp32: BN folded into one multiply-add (scale = weight*invstd,
 * bias = bias - mean*scale), so act(scale*z + bias) is a Conv block's lazy activation (DESIGN.md).
 *
 *   conv_fprop              y = conv(x, w)                                   baseline: the probe works
 *   conv_genstats           (a) y = conv(x, w); sum_c(y), sum_c(y^2) by GEN_STATS in the epilogue
 *   conv_reduction          (a) the same statistics by two REDUCTION(ADD) ops (y and y*y)
 *   ssr_conv                y = conv(relu(scale*x + bias), w): the MLPerf ResNet prologue, as a control
 *   ssa_conv                (b) y = conv(swish(scale*x + bias), w), SWISH_FWD with beta 1 = SiLU
 *   ssa_sigmoid_conv        (b) the same with SiLU spelled as v * sigmoid(v)
 *   ssa_conv_genstats       (a)+(b) the whole Conv block: prologue, conv, statistics of y
 *   wgrad                   dw = wgrad(x, dy)                                baseline
 *   ssa_wgrad               (c) dw = wgrad(swish(scale*x + bias), dy)
 *   dgrad                   dx = dgrad(dy, w)                                baseline
 *   dgrad_dswish            (d) dv = swish'(scale*z + bias) * dgrad(dy, w): z (N, C, H, W) the producer's
 *                               pre-BN output, dv (N, C, H, W) the gradient at the BN output
 *   dgrad_dswish_stats      (d) plus sum_c(dv) and sum_c(dv*z), all a BN backward needs from the pass
 *
 * libcudnn is not linked: it is opened with dlopen("libcudnn.so.9") on first use (torch has normally loaded
 * it; else the wheel's library found at build time, YV_CUDNN_LIBRARY) and the few functions used are looked
 * up with dlsym, so the module imports where cuDNN is absent. Every cuDNN failure becomes the pattern's
 * status string ("<step>: CUDNN_STATUS_...: <cuDNN's last message>"); every descriptor is destroyed.
 * Built without CUDA or without cuDNN 9 headers (setup.py), the binding raises RuntimeError saying so.
 *
 * Test: python -m pytest -q tests/test_cudnn_fusion.py (the CUDA case needs a GPU and a cuDNN build);
 * run: python benchmarks/probe_cudnn_fusion.py
 */
#include "module.h"

#include <string.h>

#include "tensor.h"

static const char OP[] = "cudnn_fusion_probe";

#ifdef YV_WITH_CUDNN

#include <dlfcn.h>
#include <stdbool.h>
#include <time.h>

#include <cudnn_graph.h>
#include <cuda_runtime_api.h>

/* ---------------------------------------------------------------- the library, opened at run time */

typedef struct cudnn_api {
    __typeof__(&cudnnGetVersion) GetVersion;
    __typeof__(&cudnnGetErrorString) GetErrorString;
    __typeof__(&cudnnGetLastErrorString) GetLastErrorString;
    __typeof__(&cudnnCreate) Create;
    __typeof__(&cudnnDestroy) Destroy;
    __typeof__(&cudnnBackendCreateDescriptor) CreateDescriptor;
    __typeof__(&cudnnBackendDestroyDescriptor) DestroyDescriptor;
    __typeof__(&cudnnBackendFinalize) Finalize;
    __typeof__(&cudnnBackendSetAttribute) SetAttribute;
    __typeof__(&cudnnBackendGetAttribute) GetAttribute;
} cudnn_api;

static cudnn_api API;
static int api_loaded;   /* set once, with the GIL held */

/* dlsym returns an object pointer; copying its bytes into the function pointer is the POSIX-sanctioned
 * conversion without a cast ISO C leaves undefined. */
static int lookup(void *lib, const char *name, void *fn_slot, size_t size)
{
    void *sym = dlsym(lib, name);
    if (sym == NULL)
        return -1;
    memcpy(fn_slot, &sym, size);
    return 0;
}

#define LOOKUP(lib, field, name) lookup((lib), (name), &API.field, sizeof(API.field))

/* Open libcudnn.so.9 and resolve the functions; RuntimeError naming what is missing on failure. */
static int load_cudnn(void)
{
    if (api_loaded)
        return 0;
    void *lib = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_LOCAL);
    const char *first_error = lib == NULL ? dlerror() : NULL;
    char first[256] = "";
    if (first_error != NULL)
        PyOS_snprintf(first, sizeof(first), "%s", first_error);
#ifdef YV_CUDNN_LIBRARY
    if (lib == NULL)
        lib = dlopen(YV_CUDNN_LIBRARY, RTLD_NOW | RTLD_LOCAL);
#endif
    if (lib == NULL) {
        PyErr_Format(PyExc_RuntimeError, "%s: cannot open libcudnn.so.9 (%s); import a CUDA build of torch "
                     "first (it loads cuDNN) or install its nvidia-cudnn-cu* wheel", OP, first);
        return -1;
    }
    if (LOOKUP(lib, GetVersion, "cudnnGetVersion") < 0 || LOOKUP(lib, GetErrorString, "cudnnGetErrorString") < 0
        || LOOKUP(lib, GetLastErrorString, "cudnnGetLastErrorString") < 0 || LOOKUP(lib, Create, "cudnnCreate") < 0
        || LOOKUP(lib, Destroy, "cudnnDestroy") < 0
        || LOOKUP(lib, CreateDescriptor, "cudnnBackendCreateDescriptor") < 0
        || LOOKUP(lib, DestroyDescriptor, "cudnnBackendDestroyDescriptor") < 0
        || LOOKUP(lib, Finalize, "cudnnBackendFinalize") < 0
        || LOOKUP(lib, SetAttribute, "cudnnBackendSetAttribute") < 0
        || LOOKUP(lib, GetAttribute, "cudnnBackendGetAttribute") < 0) {
        PyErr_Format(PyExc_RuntimeError, "%s: libcudnn.so.9 lacks a cuDNN 9 backend function (%s)", OP, dlerror());
        dlclose(lib);
        return -1;
    }
    size_t version = API.GetVersion();
    if (version / 10000 != 9) {
        PyErr_Format(PyExc_RuntimeError, "%s: the loaded libcudnn is version %zu; cuDNN 9 is needed", OP, version);
        dlclose(lib);
        return -1;
    }
    api_loaded = 1;   /* the library stays open for the life of the process, as torch keeps it */
    return 0;
}

/* Attributes cuDNN 9 later deprecated (the handle now optional) but that cuDNN 9.0 requires: their values,
 * so that naming them does not warn. */
#define ATTR_OPERATIONGRAPH_HANDLE ((cudnnBackendAttributeName_t)800)
#define ATTR_EXECUTION_PLAN_HANDLE ((cudnnBackendAttributeName_t)400)

/* ---------------------------------------------------------------- a graph builder with a sticky error */

#define MAX_DESCS 160
#define STATUS_LEN 400
#define MAX_TRIES 8   /* engine configs tried per heuristics mode: runtime-fusion plans compile (NVRTC) */

typedef struct builder {
    cudnnHandle_t handle;
    cudnnBackendDescriptor_t descs[MAX_DESCS];   /* every descriptor made, destroyed in reverse */
    int n;
    int64_t next_uid;
    int failed;
    char status[STATUS_LEN];                     /* the first failure */
} builder;

static void fail(builder *b, const char *step, cudnnStatus_t st)
{
    if (b->failed)
        return;
    b->failed = 1;
    char last[256] = "";
    API.GetLastErrorString(last, sizeof(last));
    PyOS_snprintf(b->status, sizeof(b->status), "%s: %s%s%s", step, API.GetErrorString(st), last[0] ? ": " : "",
                  last);
}

static void fail_text(builder *b, const char *text)
{
    if (!b->failed) {
        b->failed = 1;
        PyOS_snprintf(b->status, sizeof(b->status), "%s", text);
    }
}

static cudnnBackendDescriptor_t make(builder *b, cudnnBackendDescriptorType_t type, const char *step)
{
    if (b->failed)
        return NULL;
    if (b->n == MAX_DESCS) {
        fail_text(b, "probe: too many descriptors (MAX_DESCS)");
        return NULL;
    }
    cudnnBackendDescriptor_t d = NULL;
    cudnnStatus_t st = API.CreateDescriptor(type, &d);
    if (st != CUDNN_STATUS_SUCCESS) {
        fail(b, step, st);
        return NULL;
    }
    b->descs[b->n++] = d;
    return d;
}

static void set(builder *b, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                cudnnBackendAttributeType_t type, int64_t count, const void *value, const char *step)
{
    if (b->failed)
        return;
    cudnnStatus_t st = API.SetAttribute(d, name, type, count, value);
    if (st != CUDNN_STATUS_SUCCESS)
        fail(b, step, st);
}

static void set_desc(builder *b, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                     cudnnBackendDescriptor_t value, const char *step)
{
    set(b, d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &value, step);
}

static void finalize(builder *b, cudnnBackendDescriptor_t d, const char *step)
{
    if (b->failed)
        return;
    cudnnStatus_t st = API.Finalize(d);
    if (st != CUDNN_STATUS_SUCCESS)
        fail(b, step, st);
}

static void destroy_all(builder *b)
{
    while (b->n > 0)
        (void)API.DestroyDescriptor(b->descs[--b->n]);
}

/* ---------------------------------------------------------------- tensors and operations */

typedef cudnnBackendDescriptor_t desc;

/* A 4-d tensor of logical dims (n, c, h, w) stored NHWC (channels innermost). Virtual tensors live only
 * inside a fused kernel; they are fp32 here (the accumulator's type). */
static desc tensor(builder *b, cudnnDataType_t dtype, int64_t n, int64_t c, int64_t h, int64_t w, int is_virtual)
{
    desc t = make(b, CUDNN_BACKEND_TENSOR_DESCRIPTOR, "tensor");
    int64_t dims[4] = {n, c, h, w};
    int64_t strides[4] = {c * h * w, 1, w * c, c};
    int64_t uid = ++b->next_uid;
    int64_t align = 16;
    bool virt = is_virtual != 0;
    set(b, t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dtype, "tensor data type");
    set(b, t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims, "tensor dimensions");
    set(b, t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides, "tensor strides");
    set(b, t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, "tensor uid");
    set(b, t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, "tensor alignment");
    set(b, t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt, "tensor virtual flag");
    finalize(b, t, "tensor finalize");
    return t;
}

/* A per-channel (1, C, 1, 1) fp32 tensor: BN scale/bias, or a statistic. */
static desc per_channel(builder *b, int64_t c)
{
    return tensor(b, CUDNN_DATA_FLOAT, 1, c, 1, 1, 0);
}

static desc virtual_like(builder *b, int64_t n, int64_t c, int64_t h, int64_t w)
{
    return tensor(b, CUDNN_DATA_FLOAT, n, c, h, w, 1);
}

typedef struct conv_shape {
    int64_t N, C, H, W, K, R, S, stride;
    int64_t Ho, Wo;   /* output size, from the above with padding R/2, S/2 */
} conv_shape;

static desc conv_descriptor(builder *b, const conv_shape *s)
{
    desc c = make(b, CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, "convolution descriptor");
    cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;   /* what torch's conv2d computes */
    int64_t dims = 2;
    int64_t dilation[2] = {1, 1}, stride[2] = {s->stride, s->stride}, pad[2] = {s->R / 2, s->S / 2};
    set(b, c, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, "convolution compute type");
    set(b, c, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode, "convolution mode");
    set(b, c, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &dims, "convolution spatial dims");
    set(b, c, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, dilation, "convolution dilations");
    set(b, c, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, stride, "convolution strides");
    set(b, c, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, pad, "convolution pre-paddings");
    set(b, c, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, pad, "convolution post-paddings");
    finalize(b, c, "convolution descriptor finalize");
    return c;
}

/* The three convolution nodes; alpha 1, beta 0 (written, not accumulated). */
typedef enum { FPROP, DGRAD, WGRAD } conv_kind;

static desc conv_op(builder *b, conv_kind kind, const conv_shape *s, desc x, desc w, desc y)
{
    static const cudnnBackendDescriptorType_t types[3] = {
        CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
        CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
        CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
    };
    /* attribute names per kind: alpha, beta, conv desc, then the x-like, w-like and y-like tensors */
    static const cudnnBackendAttributeName_t names[3][6] = {
        {CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA,
         CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
         CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y},
        {CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA,
         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY},
        {CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA,
         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY},
    };
    desc cd = conv_descriptor(b, s);
    desc op = make(b, types[kind], "convolution operation");
    float alpha = 1.0f, beta = 0.0f;
    set(b, op, names[kind][0], CUDNN_TYPE_FLOAT, 1, &alpha, "convolution alpha");
    set(b, op, names[kind][1], CUDNN_TYPE_FLOAT, 1, &beta, "convolution beta");
    set_desc(b, op, names[kind][2], cd, "convolution descriptor of the operation");
    set_desc(b, op, names[kind][3], x, "convolution x / dx");
    set_desc(b, op, names[kind][4], w, "convolution w / dw");
    set_desc(b, op, names[kind][5], y, "convolution y / dy");
    finalize(b, op, "convolution operation finalize");
    return op;
}

/* y = mode(x) or mode(x, second); for the *_BWD modes: dx = mode'(x) * dy, with `second` the dy. */
static desc pointwise(builder *b, cudnnPointwiseMode_t mode, desc x, desc second, desc y)
{
    desc pw = make(b, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, "pointwise descriptor");
    cudnnDataType_t prec = CUDNN_DATA_FLOAT;
    set(b, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, "pointwise mode");
    set(b, pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec, "pointwise precision");
    if (mode == CUDNN_POINTWISE_SWISH_FWD || mode == CUDNN_POINTWISE_SWISH_BWD) {
        double beta = 1.0;   /* swish with beta 1 is SiLU: x * sigmoid(x) */
        set(b, pw, CUDNN_ATTR_POINTWISE_SWISH_BETA, CUDNN_TYPE_DOUBLE, 1, &beta, "swish beta");
    }
    finalize(b, pw, "pointwise descriptor finalize");
    desc op = make(b, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, "pointwise operation");
    set_desc(b, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw, "pointwise descriptor of the operation");
    set_desc(b, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x, "pointwise x");
    if (mode == CUDNN_POINTWISE_SWISH_BWD || mode == CUDNN_POINTWISE_RELU_BWD) {
        set_desc(b, op, CUDNN_ATTR_OPERATION_POINTWISE_DYDESC, second, "pointwise dy");
        set_desc(b, op, CUDNN_ATTR_OPERATION_POINTWISE_DXDESC, y, "pointwise dx");
    } else {
        if (second != NULL)
            set_desc(b, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, second, "pointwise b");
        set_desc(b, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y, "pointwise y");
    }
    finalize(b, op, "pointwise operation finalize");
    return op;
}

static desc genstats(builder *b, desc x, desc sum, desc sqsum)
{
    desc op = make(b, CUDNN_BACKEND_OPERATION_GEN_STATS_DESCRIPTOR, "genstats operation");
    cudnnGenStatsMode_t mode = CUDNN_GENSTATS_SUM_SQSUM;
    cudnnDataType_t prec = CUDNN_DATA_FLOAT;
    set(b, op, CUDNN_ATTR_OPERATION_GENSTATS_MODE, CUDNN_TYPE_GENSTATS_MODE, 1, &mode, "genstats mode");
    set(b, op, CUDNN_ATTR_OPERATION_GENSTATS_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec, "genstats precision");
    set_desc(b, op, CUDNN_ATTR_OPERATION_GENSTATS_XDESC, x, "genstats x");
    set_desc(b, op, CUDNN_ATTR_OPERATION_GENSTATS_SUMDESC, sum, "genstats sum");
    set_desc(b, op, CUDNN_ATTR_OPERATION_GENSTATS_SQSUMDESC, sqsum, "genstats sqsum");
    finalize(b, op, "genstats operation finalize");
    return op;
}

/* y (1, C, 1, 1) = the sum of x over N, H, W (the dims where y has size 1). */
static desc reduce_sum(builder *b, desc x, desc y)
{
    desc red = make(b, CUDNN_BACKEND_REDUCTION_DESCRIPTOR, "reduction descriptor");
    cudnnReduceTensorOp_t mode = CUDNN_REDUCE_TENSOR_ADD;
    cudnnDataType_t prec = CUDNN_DATA_FLOAT;
    set(b, red, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode, "reduction operator");
    set(b, red, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &prec, "reduction precision");
    finalize(b, red, "reduction descriptor finalize");
    desc op = make(b, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, "reduction operation");
    set_desc(b, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, red, "reduction descriptor of the operation");
    set_desc(b, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x, "reduction x");
    set_desc(b, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y, "reduction y");
    finalize(b, op, "reduction operation finalize");
    return op;
}

/* ---------------------------------------------------------------- the patterns */

typedef struct pattern_ctx {
    conv_shape s;
    cudnnDataType_t io;   /* the storage dtype of every non-statistic tensor */
} pattern_ctx;

#define MAX_OPS 12
typedef struct op_list {
    desc ops[MAX_OPS];
    int n;
} op_list;

static void add(op_list *l, desc op)
{
    if (l->n < MAX_OPS)
        l->ops[l->n++] = op;
}

/* v = scale*x + bias, then act(v) into a virtual tensor: the BN + activation prologue; returns the
 * activated virtual tensor. act: SWISH_FWD, RELU_FWD, or SIGMOID_FWD for v * sigmoid(v). */
static desc prologue(builder *b, op_list *l, cudnnPointwiseMode_t act, desc x, int64_t n, int64_t c, int64_t h,
                     int64_t w)
{
    desc scale = per_channel(b, c), bias = per_channel(b, c);
    desc u = virtual_like(b, n, c, h, w), v = virtual_like(b, n, c, h, w), a = virtual_like(b, n, c, h, w);
    add(l, pointwise(b, CUDNN_POINTWISE_MUL, x, scale, u));
    add(l, pointwise(b, CUDNN_POINTWISE_ADD, u, bias, v));
    if (act == CUDNN_POINTWISE_SIGMOID_FWD) {
        desc sg = virtual_like(b, n, c, h, w);
        add(l, pointwise(b, CUDNN_POINTWISE_SIGMOID_FWD, v, NULL, sg));
        add(l, pointwise(b, CUDNN_POINTWISE_MUL, v, sg, a));
    } else {
        add(l, pointwise(b, act, v, NULL, a));
    }
    return a;
}

typedef enum {
    P_CONV_FPROP, P_CONV_GENSTATS, P_CONV_REDUCTION, P_SSR_CONV, P_SSA_CONV, P_SSA_SIGMOID_CONV,
    P_SSA_CONV_GENSTATS, P_WGRAD, P_SSA_WGRAD, P_DGRAD, P_DGRAD_DSWISH, P_DGRAD_DSWISH_STATS, P_COUNT
} pattern_id;

static const char *const PATTERN_NAMES[P_COUNT] = {
    "conv_fprop", "conv_genstats", "conv_reduction", "ssr_conv", "ssa_conv", "ssa_sigmoid_conv",
    "ssa_conv_genstats", "wgrad", "ssa_wgrad", "dgrad", "dgrad_dswish", "dgrad_dswish_stats",
};

/* Forward patterns: [prologue] conv [statistics]. */
static void build_fprop(builder *b, const pattern_ctx *p, pattern_id id, op_list *l)
{
    const conv_shape *s = &p->s;
    desc x = tensor(b, p->io, s->N, s->C, s->H, s->W, 0);
    desc w = tensor(b, p->io, s->K, s->C, s->R, s->S, 0);
    desc y = tensor(b, p->io, s->N, s->K, s->Ho, s->Wo, 0);
    desc in = x;
    if (id == P_SSR_CONV)
        in = prologue(b, l, CUDNN_POINTWISE_RELU_FWD, x, s->N, s->C, s->H, s->W);
    else if (id == P_SSA_CONV || id == P_SSA_CONV_GENSTATS)
        in = prologue(b, l, CUDNN_POINTWISE_SWISH_FWD, x, s->N, s->C, s->H, s->W);
    else if (id == P_SSA_SIGMOID_CONV)
        in = prologue(b, l, CUDNN_POINTWISE_SIGMOID_FWD, x, s->N, s->C, s->H, s->W);
    add(l, conv_op(b, FPROP, s, in, w, y));
    if (id == P_CONV_GENSTATS || id == P_SSA_CONV_GENSTATS) {
        add(l, genstats(b, y, per_channel(b, s->K), per_channel(b, s->K)));
    } else if (id == P_CONV_REDUCTION) {
        desc y2 = virtual_like(b, s->N, s->K, s->Ho, s->Wo);
        add(l, reduce_sum(b, y, per_channel(b, s->K)));
        add(l, pointwise(b, CUDNN_POINTWISE_MUL, y, y, y2));
        add(l, reduce_sum(b, y2, per_channel(b, s->K)));
    }
}

static void build_wgrad(builder *b, const pattern_ctx *p, pattern_id id, op_list *l)
{
    const conv_shape *s = &p->s;
    desc x = tensor(b, p->io, s->N, s->C, s->H, s->W, 0);
    desc dw = tensor(b, p->io, s->K, s->C, s->R, s->S, 0);
    desc dy = tensor(b, p->io, s->N, s->K, s->Ho, s->Wo, 0);
    desc in = id == P_SSA_WGRAD ? prologue(b, l, CUDNN_POINTWISE_SWISH_FWD, x, s->N, s->C, s->H, s->W) : x;
    add(l, conv_op(b, WGRAD, s, in, dw, dy));
}

static void build_dgrad(builder *b, const pattern_ctx *p, pattern_id id, op_list *l)
{
    const conv_shape *s = &p->s;
    desc w = tensor(b, p->io, s->K, s->C, s->R, s->S, 0);
    desc dy = tensor(b, p->io, s->N, s->K, s->Ho, s->Wo, 0);
    if (id == P_DGRAD) {
        add(l, conv_op(b, DGRAD, s, tensor(b, p->io, s->N, s->C, s->H, s->W, 0), w, dy));
        return;
    }
    desc da = virtual_like(b, s->N, s->C, s->H, s->W);
    add(l, conv_op(b, DGRAD, s, da, w, dy));
    /* recompute the activation's input v = scale*z + bias from the stored pre-BN z, then dv = swish'(v) da */
    desc z = tensor(b, p->io, s->N, s->C, s->H, s->W, 0);
    desc scale = per_channel(b, s->C), bias = per_channel(b, s->C);
    desc u = virtual_like(b, s->N, s->C, s->H, s->W), v = virtual_like(b, s->N, s->C, s->H, s->W);
    desc dv = tensor(b, p->io, s->N, s->C, s->H, s->W, 0);
    add(l, pointwise(b, CUDNN_POINTWISE_MUL, z, scale, u));
    add(l, pointwise(b, CUDNN_POINTWISE_ADD, u, bias, v));
    add(l, pointwise(b, CUDNN_POINTWISE_SWISH_BWD, v, da, dv));
    if (id == P_DGRAD_DSWISH_STATS) {
        desc dvz = virtual_like(b, s->N, s->C, s->H, s->W);
        add(l, reduce_sum(b, dv, per_channel(b, s->C)));
        add(l, pointwise(b, CUDNN_POINTWISE_MUL, dv, z, dvz));
        add(l, reduce_sum(b, dvz, per_channel(b, s->C)));
    }
}

/* ---------------------------------------------------------------- heuristics and plans */

typedef struct pattern_result {
    int supported;
    char status[STATUS_LEN];
    int64_t engines;        /* engine configs the heuristics offered in the modes queried */
    int tried;              /* plans attempted */
    const char *mode;       /* "A", "FALLBACK" or NULL */
    int64_t workspace;      /* bytes, of the plan that finalized */
    double seconds;         /* host time to build the graph and find the plan (runtime compilation included) */
} pattern_result;

/* Try up to MAX_TRIES configs of one heuristics mode: 1 when a plan finalized (r filled); else 0 with the
 * first failure in `why`. Leaves b usable for the next mode (its descriptors are destroyed with b). */
static int try_mode(builder *b, desc graph, cudnnBackendHeurMode_t mode, const char *mode_name,
                    pattern_result *r, char why[STATUS_LEN])
{
    char step[64];
    PyOS_snprintf(step, sizeof(step), "heuristics %s", mode_name);
    desc heur = make(b, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, step);
    set_desc(b, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph, step);
    set(b, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, step);
    finalize(b, heur, step);
    int64_t count = 0;
    if (!b->failed) {
        cudnnStatus_t st = API.GetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                            0, &count, NULL);
        if (st != CUDNN_STATUS_SUCCESS)
            fail(b, step, st);
        else if (count == 0)
            fail_text(b, mode == CUDNN_HEUR_MODE_A ? "heuristics A: no engine config"
                                                   : "heuristics FALLBACK: no engine config");
    }
    r->engines += count;
    int64_t want = count < MAX_TRIES ? count : MAX_TRIES, got = 0;
    desc cfgs[MAX_TRIES];
    for (int64_t i = 0; i < want; i++)
        cfgs[i] = make(b, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "engine config");
    if (!b->failed) {
        cudnnStatus_t st = API.GetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                            want, &got, cfgs);
        if (st != CUDNN_STATUS_SUCCESS)
            fail(b, step, st);
    }
    why[0] = '\0';
    for (int64_t i = 0; !b->failed && i < got && i < want; i++) {
        PyOS_snprintf(step, sizeof(step), "execution plan (%s config %lld)", mode_name, (long long)i);
        desc plan = make(b, CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, step);
        set(b, plan, ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &b->handle, step);
        set_desc(b, plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfgs[i], step);
        finalize(b, plan, step);
        r->tried++;
        if (!b->failed) {
            int64_t ws = 0, n = 0;
            cudnnStatus_t st = API.GetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64,
                                                1, &n, &ws);
            if (st != CUDNN_STATUS_SUCCESS) {
                fail(b, "execution plan workspace size", st);
                break;
            }
            r->workspace = ws;
            r->mode = mode_name;
            return 1;
        }
        /* this config's plan did not finalize: keep the first reason, let the next config try */
        if (why[0] == '\0')
            memcpy(why, b->status, STATUS_LEN);
        b->failed = 0;
    }
    if (b->failed && why[0] == '\0')
        memcpy(why, b->status, STATUS_LEN);
    if (why[0] == '\0')
        PyOS_snprintf(why, STATUS_LEN, "heuristics %s: no engine config finalized", mode_name);
    b->failed = 0;
    return 0;
}

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void probe_one(cudnnHandle_t handle, const pattern_ctx *p, pattern_id id, pattern_result *r)
{
    double t0 = now_seconds();
    builder b;
    memset(&b, 0, sizeof(b));
    b.handle = handle;
    op_list l = {.n = 0};
    if (id <= P_SSA_CONV_GENSTATS)
        build_fprop(&b, p, id, &l);
    else if (id <= P_SSA_WGRAD)
        build_wgrad(&b, p, id, &l);
    else
        build_dgrad(&b, p, id, &l);
    if (l.n == MAX_OPS)
        fail_text(&b, "probe: too many operations (MAX_OPS)");
    desc graph = make(&b, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
    set(&b, graph, ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &b.handle, "operation graph handle");
    set(&b, graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, l.n, l.ops, "operation graph ops");
    finalize(&b, graph, "operation graph finalize");
    int ok = 0;
    if (!b.failed) {
        /* mode A first; FALLBACK only when no config of A finalized. Not supported: both modes' reasons. */
        char why_a[STATUS_LEN], why_fallback[STATUS_LEN];
        ok = try_mode(&b, graph, CUDNN_HEUR_MODE_A, "A", r, why_a)
             || try_mode(&b, graph, CUDNN_HEUR_MODE_FALLBACK, "FALLBACK", r, why_fallback);
        if (!ok)
            PyOS_snprintf(b.status, sizeof(b.status), "%.195s; %.195s", why_a, why_fallback);
    }
    r->supported = ok;
    PyOS_snprintf(r->status, sizeof(r->status), "%s", ok ? "ok" : b.status);
    destroy_all(&b);
    r->seconds = now_seconds() - t0;
}

/* The whole probe with the GIL released: a handle on `device`, every pattern, the handle destroyed.
 * Returns 0, or -1 with `error` filled when no handle could be made (nothing else is fatal). */
typedef struct probe_args {
    pattern_ctx ctx;
    int device;
    pattern_result results[P_COUNT];
    char error[STATUS_LEN];
} probe_args;

static int run_probe(probe_args *a)
{
    int prev = -1;
    cudaError_t cerr = (cudaError_t)yv_cuda_device_enter(a->device, &prev);
    if (cerr != cudaSuccess) {
        PyOS_snprintf(a->error, sizeof(a->error), "device %d: %s", a->device, cudaGetErrorString(cerr));
        return -1;
    }
    cudnnHandle_t handle = NULL;
    cudnnStatus_t st = API.Create(&handle);
    if (st != CUDNN_STATUS_SUCCESS) {
        PyOS_snprintf(a->error, sizeof(a->error), "cudnnCreate: %s", API.GetErrorString(st));
        yv_cuda_device_leave(prev);
        return -1;
    }
    for (int i = 0; i < P_COUNT; i++)
        probe_one(handle, &a->ctx, (pattern_id)i, &a->results[i]);
    (void)API.Destroy(handle);
    yv_cuda_device_leave(prev);
    return 0;
}

static PyObject *result_dict(const pattern_result *r)
{
    return Py_BuildValue("{s:O, s:s, s:L, s:i, s:z, s:L, s:d}", "supported", r->supported ? Py_True : Py_False,
                         "status", r->status, "engines", (long long)r->engines, "tried", r->tried, "mode",
                         r->mode, "workspace", (long long)r->workspace, "seconds", r->seconds);
}

#endif /* YV_WITH_CUDNN */

/* ---------------------------------------------------------------- the binding */

/* conv = (N, C, H, W, K, R, S, stride): ints in [1, 2^31]. */
static int parse_conv(PyObject *obj, int64_t out[8])
{
    PyObject *items[8];
    if (yv_parse_group(obj, OP, "conv", "(N, C, H, W, K, R, S, stride)", 8, items) < 0)
        return -1;
    static const char *const names[8] = {"N", "C", "H", "W", "K", "R", "S", "stride"};
    for (int i = 0; i < 8; i++) {
        if (!PyLong_Check(items[i]) || PyBool_Check(items[i])) {
            PyErr_Format(PyExc_TypeError, "%s: conv's %s must be an int, got %.80s", OP, names[i],
                         Py_TYPE(items[i])->tp_name);
            return -1;
        }
        long long v = PyLong_AsLongLong(items[i]);
        if (v == -1 && PyErr_Occurred())
            return -1;
        if (v < 1 || v > (1LL << 31)) {
            PyErr_Format(PyExc_ValueError, "%s: conv's %s must be in [1, 2^31], got %lld", OP, names[i], v);
            return -1;
        }
        out[i] = v;
    }
    return 0;
}

PyObject *yv_py_cudnn_fusion_probe(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (yv_check_nargs(OP, nargs, 3) < 0)
        return NULL;
    int64_t c[8];
    if (parse_conv(args[0], c) < 0)
        return NULL;
    long dtype = PyLong_Check(args[1]) ? PyLong_AsLong(args[1]) : -2;
    if (dtype == -1 && PyErr_Occurred())
        return NULL;
    if (dtype != YV_FLOAT16 && dtype != YV_BFLOAT16) {
        PyErr_Format(PyExc_ValueError, "%s: dtype_code must be DTYPE_FLOAT16 or DTYPE_BFLOAT16", OP);
        return NULL;
    }
    long device = PyLong_Check(args[2]) && !PyBool_Check(args[2]) ? PyLong_AsLong(args[2]) : -2;
    if (device == -1 && PyErr_Occurred())
        return NULL;
    if (device < 0) {
        PyErr_Format(PyExc_ValueError, "%s: device must be a CUDA device index (int >= 0)", OP);
        return NULL;
    }
#ifndef YV_WITH_CUDNN
    PyErr_Format(PyExc_RuntimeError, "%s: yolov9c._C was built without cuDNN (build_info()['cudnn'] is 'absent'); "
                 "rebuild with CUDA and cuDNN 9 headers (the nvidia-cudnn-cu* wheel of a CUDA torch, or "
                 "CUDNN_INCLUDE_DIR): pip install -e .", OP);
    return NULL;
#else
    if (load_cudnn() < 0)
        return NULL;
    /* padding R/2 makes H + 2*(R/2) >= R for every H >= 1: the output is never empty */
    int64_t ho = (c[2] + 2 * (c[5] / 2) - c[5]) / c[7] + 1, wo = (c[3] + 2 * (c[6] / 2) - c[6]) / c[7] + 1;
    probe_args *a = PyMem_Calloc(1, sizeof(probe_args));
    if (a == NULL)
        return PyErr_NoMemory();
    a->ctx.s = (conv_shape){c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], ho, wo};
    a->ctx.io = dtype == YV_FLOAT16 ? CUDNN_DATA_HALF : CUDNN_DATA_BFLOAT16;
    a->device = (int)device;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = run_probe(a);
    Py_END_ALLOW_THREADS
    PyObject *out = NULL;
    if (rc < 0) {
        yv_kernel_error(module, OP, a->error);
        goto exit;
    }
    out = PyDict_New();
    for (int i = 0; out != NULL && i < P_COUNT; i++) {
        PyObject *d = result_dict(&a->results[i]);
        if (d == NULL || PyDict_SetItemString(out, PATTERN_NAMES[i], d) < 0)
            Py_CLEAR(out);
        Py_XDECREF(d);
    }
exit:
    PyMem_Free(a);
    return out;
#endif
}
