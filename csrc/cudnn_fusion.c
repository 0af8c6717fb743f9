/* cudnn_fusion.c — fused GELAN convolution graphs in cuDNN 9: which ones plan on this GPU (cudnn_fusion_probe)
 * and how fast they run (cudnn_fusion_time); issue 12, deliverable 3.
 *
 * Each pattern below is a cuDNN backend operation graph over NHWC tensors (fp16 or bf16 in memory, fp32
 * accumulation and fp32 virtual intermediates). For each, cuDNN's heuristics (mode A, then FALLBACK when no
 * config of A finalizes) give engine configs and the first whose execution plan finalizes is taken. Shapes:
 * x (N, C, H, W), w (K, C, R, S), same padding R/2, S/2, one stride. `scale`/`bias` are per-channel (1, C, 1, 1)
 * fp32: BN folded into one multiply-add (scale = weight*invstd, bias = bias - mean*scale), so act(scale*z + bias)
 * is a Conv block's lazy activation (DESIGN.md).
 *
 *   conv_fprop              y = conv(x, w)                                   baseline: the graph code works
 *   conv_genstats           (a) y = conv(x, w); sum_c(y), sum_c(y^2) by GEN_STATS in the epilogue
 *   conv_reduction          (a) the same statistics by two REDUCTION(ADD) ops (y and y*y)
 *   ssr_conv                y = conv(relu(scale*x + bias), w): the MLPerf ResNet prologue, as a control
 *   ssa_conv                (b) y = conv(swish(scale*x + bias), w), SWISH_FWD with beta 1 = SiLU
 *   ssa_sigmoid_conv        (b) the same with SiLU spelled as v * sigmoid(v)
 *   ssa_conv_genstats       (a)+(b) the whole Conv block: prologue, conv, statistics of y
 *   ssr_conv_genstats_io    the documented ConvBNfprop pattern (scale, bias, ReLU, conv, genstats) with scale,
 *                           bias and relu(v) in the storage dtype: a control for the prologue's dtypes
 *   ssa_conv_io             (b) with swish(v), the conv's input, in the storage dtype (scale, bias fp32)
 *   ssa_conv_genstats_io    (a)+(b) likewise: the whole Conv block with one conv input dtype
 *   wgrad                   dw = wgrad(x, dy)                                baseline
 *   ssa_wgrad               (c) dw = wgrad(swish(scale*x + bias), dy)
 *   ssr_wgrad_io            the documented ConvBNwgrad pattern (scale, bias, ReLU, wgrad), storage-dtype s, b
 *   dgrad                   dx = dgrad(dy, w)                                baseline
 *   dgrad_dswish            (d) dv = swish'(scale*z + bias) * dgrad(dy, w): z (N, C, H, W) the producer's
 *                               pre-BN output, dv (N, C, H, W) the gradient at the BN output
 *   dgrad_dswish_stats      (d) plus sum_c(dv) and sum_c(dv*z), all a BN backward needs from the pass
 *
 * What cuDNN documents for the prologue (frontend developer guide, "Graph API": docs.nvidia.com/deeplearning/
 * cudnn/frontend/latest/developer/graph-api.html): the specialized ConvBNfprop / ConvBNwgrad engines take only
 * ReLU, FP16 x, s, b, and on compute capability >= 9.0 only the full patterns (scale+bias+ReLU+conv+genstats,
 * conv+genstats; scale+bias+ReLU+wgrad). The generic runtime-fusion engine's support surface 90 allows any
 * pointwise prologue (g1) on ConvolutionFwd with (1, C, 1, 1) operands and 16-byte aligned inputs, but none
 * on ConvolutionBwdFilter; surface 70 allows only MUL, ADD, RELU_FWD in that order, all HALF.
 *
 * libcudnn is not linked: it is opened with dlopen("libcudnn.so.9") on first use (torch has normally loaded
 * it; else the wheel's library found at build time, YV_CUDNN_LIBRARY) and the few functions used are looked
 * up with dlsym, so the module imports where cuDNN is absent. Every cuDNN failure becomes a status string
 * ("<step>: CUDNN_STATUS_...: <cuDNN's last message>"); every descriptor is destroyed. cudnn_fusion_time plans
 * with the same graph code as the probe, binds the caller's tensors (torch CUDA tensors' descriptors) and
 * workspace (a torch uint8 tensor) in a variant pack, runs on the caller's stream and times with CUDA events.
 * Arguments are checked before cuDNN is touched; built without CUDA or without cuDNN 9 headers (setup.py),
 * both bindings then raise RuntimeError saying so.
 *
 * Test: python -m pytest -q tests/test_cudnn_fusion.py (the CUDA cases need a GPU and a cuDNN build);
 * run: python benchmarks/probe_cudnn_fusion.py [--time]
 */
#include "module.h"

#include <string.h>

#include "tensor.h"

static const char OP[] = "cudnn_fusion_probe";
static const char OP_TIME[] = "cudnn_fusion_time";

/* ---------------------------------------------------------------- shapes, tensor roles, the pattern table */

typedef struct conv_shape {
    int64_t N, C, H, W, K, R, S, stride;
    int64_t Ho, Wo;   /* output size, from the above with padding R/2, S/2 */
} conv_shape;

/* The real tensors a pattern reads or writes. Their order in a pattern's table (PATTERNS below) is the order
 * of the `tensors` tuple of cudnn_fusion_time; shapes in torch's terms (NHWC memory = channels_last):
 *   X, DX, Z, DV: (N, C, H, W)   W, DW: (K, C, R, S)   Y, DY: (N, K, Ho, Wo)   storage dtype, channels-last
 *   SCALE, BIAS: (C,) fp32 (the storage dtype in ssr_*_io)   SUM, SQSUM: (K,) fp32
 *   DVSUM, DVZSUM: (C,) fp32 -- sum(dv) and sum(dv * z) over N, H, W */
typedef enum {
    R_X, R_W, R_Y, R_DY, R_DX, R_DW, R_Z, R_DV, R_SCALE, R_BIAS, R_SUM, R_SQSUM, R_DVSUM, R_DVZSUM, R_COUNT
} role;

static const char *const ROLE_NAMES[R_COUNT] = {
    "x", "w", "y", "dy", "dx", "dw", "z", "dv", "scale", "bias", "sum", "sqsum", "dv_sum", "dvz_sum",
};

typedef enum {
    P_CONV_FPROP, P_CONV_GENSTATS, P_CONV_REDUCTION, P_SSR_CONV, P_SSA_CONV, P_SSA_SIGMOID_CONV,
    P_SSA_CONV_GENSTATS, P_SSR_CONV_GENSTATS_IO, P_SSA_CONV_IO, P_SSA_CONV_GENSTATS_IO, P_WGRAD, P_SSA_WGRAD,
    P_SSR_WGRAD_IO, P_DGRAD, P_DGRAD_DSWISH, P_DGRAD_DSWISH_STATS, P_COUNT
} pattern_id;

typedef enum { K_FPROP, K_WGRAD, K_DGRAD } pattern_family;
/* the prologue act(scale*x + bias) before the conv / wgrad; ACT_SIGMOID spells SiLU as v * sigmoid(v) */
typedef enum { ACT_NONE, ACT_RELU, ACT_SWISH, ACT_SIGMOID } prologue_act;

#define MAX_ROLES 8
typedef struct pattern_info {
    const char *name;
    pattern_family family;
    prologue_act act;
    int affine_io;           /* the prologue's scale and bias in the storage dtype (else fp32) */
    int act_io;              /* act(v), the conv's virtual input, in the storage dtype (else fp32) */
    int n_roles;
    role roles[MAX_ROLES];   /* the tensors it binds, in the order cudnn_fusion_time takes them */
} pattern_info;

static const pattern_info PATTERNS[P_COUNT] = {
    {"conv_fprop", K_FPROP, ACT_NONE, 0, 0, 3, {R_X, R_W, R_Y}},
    {"conv_genstats", K_FPROP, ACT_NONE, 0, 0, 5, {R_X, R_W, R_Y, R_SUM, R_SQSUM}},
    {"conv_reduction", K_FPROP, ACT_NONE, 0, 0, 5, {R_X, R_W, R_Y, R_SUM, R_SQSUM}},
    {"ssr_conv", K_FPROP, ACT_RELU, 0, 0, 5, {R_X, R_SCALE, R_BIAS, R_W, R_Y}},
    {"ssa_conv", K_FPROP, ACT_SWISH, 0, 0, 5, {R_X, R_SCALE, R_BIAS, R_W, R_Y}},
    {"ssa_sigmoid_conv", K_FPROP, ACT_SIGMOID, 0, 0, 5, {R_X, R_SCALE, R_BIAS, R_W, R_Y}},
    {"ssa_conv_genstats", K_FPROP, ACT_SWISH, 0, 0, 7, {R_X, R_SCALE, R_BIAS, R_W, R_Y, R_SUM, R_SQSUM}},
    {"ssr_conv_genstats_io", K_FPROP, ACT_RELU, 1, 1, 7, {R_X, R_SCALE, R_BIAS, R_W, R_Y, R_SUM, R_SQSUM}},
    {"ssa_conv_io", K_FPROP, ACT_SWISH, 0, 1, 5, {R_X, R_SCALE, R_BIAS, R_W, R_Y}},
    {"ssa_conv_genstats_io", K_FPROP, ACT_SWISH, 0, 1, 7, {R_X, R_SCALE, R_BIAS, R_W, R_Y, R_SUM, R_SQSUM}},
    {"wgrad", K_WGRAD, ACT_NONE, 0, 0, 3, {R_X, R_DY, R_DW}},
    {"ssa_wgrad", K_WGRAD, ACT_SWISH, 0, 0, 5, {R_X, R_SCALE, R_BIAS, R_DY, R_DW}},
    {"ssr_wgrad_io", K_WGRAD, ACT_RELU, 1, 1, 5, {R_X, R_SCALE, R_BIAS, R_DY, R_DW}},
    {"dgrad", K_DGRAD, ACT_NONE, 0, 0, 3, {R_DY, R_W, R_DX}},
    {"dgrad_dswish", K_DGRAD, ACT_NONE, 0, 0, 6, {R_DY, R_W, R_Z, R_SCALE, R_BIAS, R_DV}},
    {"dgrad_dswish_stats", K_DGRAD, ACT_NONE, 0, 0, 8,
     {R_DY, R_W, R_Z, R_SCALE, R_BIAS, R_DV, R_DVSUM, R_DVZSUM}},
};

/* What cudnn_fusion_time checked and passes on: one pattern, its tensors' pointers, the launch context. */
typedef struct time_request {
    conv_shape s;
    long dtype;              /* YV_FLOAT16 or YV_BFLOAT16 */
    pattern_id id;
    int device;
    void *data[MAX_ROLES];   /* in PATTERNS[id].roles order */
    void *workspace;
    int64_t workspace_bytes;
    uintptr_t stream;
    int iters;
} time_request;

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
    __typeof__(&cudnnSetStream) SetStream;
    __typeof__(&cudnnBackendExecute) Execute;
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
static int load_cudnn(const char *op)
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
                     "first (it loads cuDNN) or install its nvidia-cudnn-cu* wheel", op, first);
        return -1;
    }
    if (LOOKUP(lib, GetVersion, "cudnnGetVersion") < 0 || LOOKUP(lib, GetErrorString, "cudnnGetErrorString") < 0
        || LOOKUP(lib, GetLastErrorString, "cudnnGetLastErrorString") < 0 || LOOKUP(lib, Create, "cudnnCreate") < 0
        || LOOKUP(lib, Destroy, "cudnnDestroy") < 0
        || LOOKUP(lib, CreateDescriptor, "cudnnBackendCreateDescriptor") < 0
        || LOOKUP(lib, DestroyDescriptor, "cudnnBackendDestroyDescriptor") < 0
        || LOOKUP(lib, Finalize, "cudnnBackendFinalize") < 0
        || LOOKUP(lib, SetAttribute, "cudnnBackendSetAttribute") < 0
        || LOOKUP(lib, GetAttribute, "cudnnBackendGetAttribute") < 0
        || LOOKUP(lib, SetStream, "cudnnSetStream") < 0 || LOOKUP(lib, Execute, "cudnnBackendExecute") < 0) {
        PyErr_Format(PyExc_RuntimeError, "%s: libcudnn.so.9 lacks a cuDNN 9 backend function (%s)", op, dlerror());
        dlclose(lib);
        return -1;
    }
    size_t version = API.GetVersion();
    if (version / 10000 != 9) {
        PyErr_Format(PyExc_RuntimeError, "%s: the loaded libcudnn is version %zu; cuDNN 9 is needed", op, version);
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

#define VIRTUAL_UID0 1000   /* virtual tensors' uids start here; a real tensor's uid is its role + 1 */

/* A 4-d tensor of logical dims (n, c, h, w) stored NHWC (channels innermost). uid 0: a virtual tensor (it lives
 * only inside a fused kernel), given the next free uid; else a real tensor bound by that uid at execution. */
static desc tensor(builder *b, cudnnDataType_t dtype, int64_t n, int64_t c, int64_t h, int64_t w, int64_t uid)
{
    desc t = make(b, CUDNN_BACKEND_TENSOR_DESCRIPTOR, "tensor");
    int64_t dims[4] = {n, c, h, w};
    int64_t strides[4] = {c * h * w, 1, w * c, c};
    int64_t align = 16;
    bool virt = uid == 0;
    if (virt)
        uid = VIRTUAL_UID0 + b->next_uid++;
    set(b, t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dtype, "tensor data type");
    set(b, t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims, "tensor dimensions");
    set(b, t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides, "tensor strides");
    set(b, t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, "tensor uid");
    set(b, t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, "tensor alignment");
    set(b, t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt, "tensor virtual flag");
    finalize(b, t, "tensor finalize");
    return t;
}

static int64_t uid_of(role r)
{
    return (int64_t)r + 1;
}

/* A per-channel (1, C, 1, 1) tensor: BN scale/bias (fp32, or the storage dtype), or an fp32 statistic. */
static desc per_channel(builder *b, role r, cudnnDataType_t dtype, int64_t c)
{
    return tensor(b, dtype, 1, c, 1, 1, uid_of(r));
}

static desc stat_tensor(builder *b, role r, int64_t c)
{
    return per_channel(b, r, CUDNN_DATA_FLOAT, c);
}

/* Virtual intermediates are fp32 (the accumulator's type) unless a pattern asks for the storage dtype. */
static desc virtual_like(builder *b, cudnnDataType_t dtype, int64_t n, int64_t c, int64_t h, int64_t w)
{
    return tensor(b, dtype, n, c, h, w, 0);
}

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

/* v = scale*x + bias, then act(v) into a virtual tensor: the BN + activation prologue; returns act(v).
 * affine_io: scale and bias in the storage dtype, as the ConvBNfprop / ConvBNwgrad engines document (FP16 s, b:
 * see the note at the top); act_io: act(v), the conv's own input, in the storage dtype like w (the conv then
 * has one input dtype; cuDNN spells mixed conv inputs as a Pointwise:Identity conversion in g1); else fp32. */
static desc prologue(builder *b, const pattern_ctx *p, op_list *l, const pattern_info *pi, desc x)
{
    const conv_shape *s = &p->s;
    cudnnDataType_t f = CUDNN_DATA_FLOAT, affine = pi->affine_io ? p->io : f, act = pi->act_io ? p->io : f;
    desc scale = per_channel(b, R_SCALE, affine, s->C), bias = per_channel(b, R_BIAS, affine, s->C);
    desc u = virtual_like(b, f, s->N, s->C, s->H, s->W), v = virtual_like(b, f, s->N, s->C, s->H, s->W);
    desc a = virtual_like(b, act, s->N, s->C, s->H, s->W);
    add(l, pointwise(b, CUDNN_POINTWISE_MUL, x, scale, u));
    add(l, pointwise(b, CUDNN_POINTWISE_ADD, u, bias, v));
    if (pi->act == ACT_SIGMOID) {
        desc sg = virtual_like(b, f, s->N, s->C, s->H, s->W);
        add(l, pointwise(b, CUDNN_POINTWISE_SIGMOID_FWD, v, NULL, sg));
        add(l, pointwise(b, CUDNN_POINTWISE_MUL, v, sg, a));
    } else {
        add(l, pointwise(b, pi->act == ACT_RELU ? CUDNN_POINTWISE_RELU_FWD : CUDNN_POINTWISE_SWISH_FWD, v, NULL, a));
    }
    return a;
}

static int pattern_has(const pattern_info *pi, role r)
{
    for (int i = 0; i < pi->n_roles; i++)
        if (pi->roles[i] == r)
            return 1;
    return 0;
}

/* Forward patterns: [prologue] conv [statistics]. */
static void build_fprop(builder *b, const pattern_ctx *p, const pattern_info *pi, op_list *l)
{
    const conv_shape *s = &p->s;
    desc x = tensor(b, p->io, s->N, s->C, s->H, s->W, uid_of(R_X));
    desc w = tensor(b, p->io, s->K, s->C, s->R, s->S, uid_of(R_W));
    desc y = tensor(b, p->io, s->N, s->K, s->Ho, s->Wo, uid_of(R_Y));
    desc in = pi->act != ACT_NONE ? prologue(b, p, l, pi, x) : x;
    add(l, conv_op(b, FPROP, s, in, w, y));
    if (!pattern_has(pi, R_SUM))
        return;
    if (pi != &PATTERNS[P_CONV_REDUCTION]) {
        add(l, genstats(b, y, stat_tensor(b, R_SUM, s->K), stat_tensor(b, R_SQSUM, s->K)));
        return;
    }
    desc y2 = virtual_like(b, CUDNN_DATA_FLOAT, s->N, s->K, s->Ho, s->Wo);
    add(l, reduce_sum(b, y, stat_tensor(b, R_SUM, s->K)));
    add(l, pointwise(b, CUDNN_POINTWISE_MUL, y, y, y2));
    add(l, reduce_sum(b, y2, stat_tensor(b, R_SQSUM, s->K)));
}

static void build_wgrad(builder *b, const pattern_ctx *p, const pattern_info *pi, op_list *l)
{
    const conv_shape *s = &p->s;
    desc x = tensor(b, p->io, s->N, s->C, s->H, s->W, uid_of(R_X));
    desc dw = tensor(b, p->io, s->K, s->C, s->R, s->S, uid_of(R_DW));
    desc dy = tensor(b, p->io, s->N, s->K, s->Ho, s->Wo, uid_of(R_DY));
    desc in = pi->act != ACT_NONE ? prologue(b, p, l, pi, x) : x;
    add(l, conv_op(b, WGRAD, s, in, dw, dy));
}

static void build_dgrad(builder *b, const pattern_ctx *p, const pattern_info *pi, op_list *l)
{
    const conv_shape *s = &p->s;
    cudnnDataType_t f = CUDNN_DATA_FLOAT;
    desc w = tensor(b, p->io, s->K, s->C, s->R, s->S, uid_of(R_W));
    desc dy = tensor(b, p->io, s->N, s->K, s->Ho, s->Wo, uid_of(R_DY));
    if (!pattern_has(pi, R_DV)) {
        add(l, conv_op(b, DGRAD, s, tensor(b, p->io, s->N, s->C, s->H, s->W, uid_of(R_DX)), w, dy));
        return;
    }
    desc da = virtual_like(b, f, s->N, s->C, s->H, s->W);
    add(l, conv_op(b, DGRAD, s, da, w, dy));
    /* recompute the activation's input v = scale*z + bias from the stored pre-BN z, then dv = swish'(v) da */
    desc z = tensor(b, p->io, s->N, s->C, s->H, s->W, uid_of(R_Z));
    desc scale = per_channel(b, R_SCALE, f, s->C), bias = per_channel(b, R_BIAS, f, s->C);
    desc u = virtual_like(b, f, s->N, s->C, s->H, s->W), v = virtual_like(b, f, s->N, s->C, s->H, s->W);
    desc dv = tensor(b, p->io, s->N, s->C, s->H, s->W, uid_of(R_DV));
    add(l, pointwise(b, CUDNN_POINTWISE_MUL, z, scale, u));
    add(l, pointwise(b, CUDNN_POINTWISE_ADD, u, bias, v));
    add(l, pointwise(b, CUDNN_POINTWISE_SWISH_BWD, v, da, dv));
    if (pattern_has(pi, R_DVSUM)) {
        desc dvz = virtual_like(b, f, s->N, s->C, s->H, s->W);
        add(l, reduce_sum(b, dv, stat_tensor(b, R_DVSUM, s->C)));
        add(l, pointwise(b, CUDNN_POINTWISE_MUL, dv, z, dvz));
        add(l, reduce_sum(b, dvz, stat_tensor(b, R_DVZSUM, s->C)));
    }
}

/* The finalized operation graph of pattern `id` (NULL, with b's status, on failure). */
static desc build_graph(builder *b, const pattern_ctx *p, pattern_id id)
{
    static void (*const builders[3])(builder *, const pattern_ctx *, const pattern_info *, op_list *) = {
        build_fprop, build_wgrad, build_dgrad,
    };
    const pattern_info *pi = &PATTERNS[id];
    op_list l = {.n = 0};
    builders[pi->family](b, p, pi, &l);
    if (l.n == MAX_OPS)
        fail_text(b, "graph: too many operations (MAX_OPS)");
    desc graph = make(b, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
    set(b, graph, ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &b->handle, "operation graph handle");
    set(b, graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, l.n, l.ops, "operation graph ops");
    finalize(b, graph, "operation graph finalize");
    return b->failed ? NULL : graph;
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

/* Try up to MAX_TRIES configs of one heuristics mode: the first plan that finalized (r filled), or NULL with
 * the first failure in `why`. Leaves b usable for the next mode (its descriptors are destroyed with b). */
static desc try_mode(builder *b, desc graph, cudnnBackendHeurMode_t mode, const char *mode_name,
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
            return plan;
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
    return NULL;
}

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Build pattern `id`'s graph and find an execution plan: mode A first, FALLBACK only when no config of A
 * finalized. Returns the plan (owned by b) or NULL; r holds the outcome ("ok" or both modes' reasons). */
static desc plan_pattern(builder *b, const pattern_ctx *p, pattern_id id, pattern_result *r)
{
    double t0 = now_seconds();
    desc graph = build_graph(b, p, id), plan = NULL;
    if (graph != NULL) {
        char why_a[STATUS_LEN], why_fallback[STATUS_LEN];
        plan = try_mode(b, graph, CUDNN_HEUR_MODE_A, "A", r, why_a);
        if (plan == NULL)
            plan = try_mode(b, graph, CUDNN_HEUR_MODE_FALLBACK, "FALLBACK", r, why_fallback);
        if (plan == NULL)
            PyOS_snprintf(b->status, sizeof(b->status), "%.195s; %.195s", why_a, why_fallback);
    }
    r->supported = plan != NULL;
    PyOS_snprintf(r->status, sizeof(r->status), "%s", plan != NULL ? "ok" : b->status);
    r->seconds = now_seconds() - t0;
    return plan;
}

/* A handle on `device` (made current, the previous device in *prev): 0, or -1 with `error` filled. */
static int open_handle(int device, int *prev, cudnnHandle_t *handle, char error[STATUS_LEN])
{
    cudaError_t cerr = (cudaError_t)yv_cuda_device_enter(device, prev);
    if (cerr != cudaSuccess) {
        PyOS_snprintf(error, STATUS_LEN, "device %d: %s", device, cudaGetErrorString(cerr));
        return -1;
    }
    cudnnStatus_t st = API.Create(handle);
    if (st != CUDNN_STATUS_SUCCESS) {
        PyOS_snprintf(error, STATUS_LEN, "cudnnCreate: %s", API.GetErrorString(st));
        yv_cuda_device_leave(*prev);
        return -1;
    }
    return 0;
}

static void close_handle(cudnnHandle_t handle, int prev)
{
    (void)API.Destroy(handle);
    yv_cuda_device_leave(prev);
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
    cudnnHandle_t handle = NULL;
    if (open_handle(a->device, &prev, &handle, a->error) < 0)
        return -1;
    for (int i = 0; i < P_COUNT; i++) {
        builder *b = PyMem_RawCalloc(1, sizeof(builder));
        if (b == NULL) {
            PyOS_snprintf(a->results[i].status, STATUS_LEN, "out of host memory");
            continue;
        }
        b->handle = handle;
        (void)plan_pattern(b, &a->ctx, (pattern_id)i, &a->results[i]);
        destroy_all(b);
        PyMem_RawFree(b);
    }
    close_handle(handle, prev);
    return 0;
}

static PyObject *result_dict(const pattern_result *r)
{
    return Py_BuildValue("{s:O, s:s, s:L, s:i, s:z, s:L, s:d}", "supported", r->supported ? Py_True : Py_False,
                         "status", r->status, "engines", (long long)r->engines, "tried", r->tried, "mode",
                         r->mode, "workspace", (long long)r->workspace, "seconds", r->seconds);
}

/* ---------------------------------------------------------------- execution and timing */

typedef struct time_args {
    time_request req;
    pattern_ctx ctx;
    pattern_result plan;     /* the planning outcome (status "ok" or why not) */
    double ms;               /* mean per execution; < 0 when not timed */
    char status[STATUS_LEN]; /* "ok", or the first failure */
} time_args;

/* The variant pack: every real tensor's uid and pointer, and the workspace. */
static desc variant_pack(builder *b, const time_args *a)
{
    const pattern_info *pi = &PATTERNS[a->req.id];
    int64_t uids[MAX_ROLES];
    for (int i = 0; i < pi->n_roles; i++)
        uids[i] = uid_of(pi->roles[i]);
    desc vp = make(b, CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, "variant pack");
    void *ptrs[MAX_ROLES];
    memcpy(ptrs, a->req.data, sizeof(ptrs));
    void *ws = a->req.workspace;
    set(b, vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, pi->n_roles, uids, "variant pack uids");
    set(b, vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, pi->n_roles, ptrs,
        "variant pack pointers");
    set(b, vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws, "variant pack workspace");
    finalize(b, vp, "variant pack finalize");
    return b->failed ? NULL : vp;
}

static int cuda_failed(builder *b, const char *step, cudaError_t err)
{
    if (err == cudaSuccess)
        return 0;
    char text[STATUS_LEN];
    PyOS_snprintf(text, sizeof(text), "%s: %s: %s", step, cudaGetErrorName(err), cudaGetErrorString(err));
    fail_text(b, text);
    return 1;
}

/* Execute `plan` once untimed (first-use costs), then `iters` times between two events on the stream. */
static void execute_timed(builder *b, desc plan, desc vp, time_args *a)
{
    cudaStream_t stream = (cudaStream_t)a->req.stream;
    cudnnStatus_t st = API.SetStream(b->handle, stream);
    if (st != CUDNN_STATUS_SUCCESS) {
        fail(b, "cudnnSetStream", st);
        return;
    }
    cudaEvent_t start = NULL, stop = NULL;
    if (cuda_failed(b, "cudaEventCreate", cudaEventCreate(&start))
        || cuda_failed(b, "cudaEventCreate", cudaEventCreate(&stop)))
        goto exit;
    for (int i = -1; i < a->req.iters && !b->failed; i++) {
        if (i == 0 && cuda_failed(b, "cudaEventRecord", cudaEventRecord(start, stream)))
            break;
        st = API.Execute(b->handle, plan, vp);
        if (st != CUDNN_STATUS_SUCCESS)
            fail(b, "execute", st);
    }
    float ms = 0.0f;
    if (!b->failed && !cuda_failed(b, "cudaEventRecord", cudaEventRecord(stop, stream))
        && !cuda_failed(b, "cudaEventSynchronize", cudaEventSynchronize(stop))
        && !cuda_failed(b, "cudaEventElapsedTime", cudaEventElapsedTime(&ms, start, stop)))
        a->ms = (double)ms / a->req.iters;
exit:
    if (start != NULL)
        (void)cudaEventDestroy(start);
    if (stop != NULL)
        (void)cudaEventDestroy(stop);
}

/* Plan, bind and time one pattern with the GIL released. Returns 0 (a->status says how it went), or -1 with
 * a->status filled when no handle could be made. */
static int run_time(time_args *a)
{
    int prev = -1;
    cudnnHandle_t handle = NULL;
    a->ms = -1.0;
    if (open_handle(a->req.device, &prev, &handle, a->status) < 0)
        return -1;
    builder *b = PyMem_RawCalloc(1, sizeof(builder));
    if (b == NULL) {
        PyOS_snprintf(a->status, STATUS_LEN, "out of host memory");
        close_handle(handle, prev);
        return 0;
    }
    b->handle = handle;
    desc plan = plan_pattern(b, &a->ctx, a->req.id, &a->plan);
    if (plan == NULL) {
        PyOS_snprintf(a->status, STATUS_LEN, "not supported: %s", a->plan.status);
    } else if (a->plan.workspace > a->req.workspace_bytes) {
        PyOS_snprintf(a->status, STATUS_LEN, "workspace: the plan needs %lld bytes, got %lld",
                      (long long)a->plan.workspace, (long long)a->req.workspace_bytes);
    } else {
        desc vp = variant_pack(b, a);
        if (vp != NULL)
            execute_timed(b, plan, vp, a);
        PyOS_snprintf(a->status, STATUS_LEN, "%s", b->failed ? b->status : "ok");
    }
    destroy_all(b);
    PyMem_RawFree(b);
    close_handle(handle, prev);
    return 0;
}

#endif /* YV_WITH_CUDNN */

/* ---------------------------------------------------------------- argument checks (also without cuDNN) */

/* conv = (N, C, H, W, K, R, S, stride): ints in [1, 2^31]; the output size from padding R/2, S/2. */
static int parse_conv(PyObject *obj, const char *op, conv_shape *out)
{
    PyObject *items[8];
    if (yv_parse_group(obj, op, "conv", "(N, C, H, W, K, R, S, stride)", 8, items) < 0)
        return -1;
    static const char *const names[8] = {"N", "C", "H", "W", "K", "R", "S", "stride"};
    int64_t v8[8];
    for (int i = 0; i < 8; i++) {
        if (!PyLong_Check(items[i]) || PyBool_Check(items[i])) {
            PyErr_Format(PyExc_TypeError, "%s: conv's %s must be an int, got %.80s", op, names[i],
                         Py_TYPE(items[i])->tp_name);
            return -1;
        }
        long long v = PyLong_AsLongLong(items[i]);
        if (v == -1 && PyErr_Occurred())
            return -1;
        if (v < 1 || v > (1LL << 31)) {
            PyErr_Format(PyExc_ValueError, "%s: conv's %s must be in [1, 2^31], got %lld", op, names[i], v);
            return -1;
        }
        v8[i] = v;
    }
    /* padding R/2 makes H + 2*(R/2) >= R for every H >= 1: the output is never empty */
    int64_t ho = (v8[2] + 2 * (v8[5] / 2) - v8[5]) / v8[7] + 1, wo = (v8[3] + 2 * (v8[6] / 2) - v8[6]) / v8[7] + 1;
    *out = (conv_shape){v8[0], v8[1], v8[2], v8[3], v8[4], v8[5], v8[6], v8[7], ho, wo};
    return 0;
}

static int parse_dtype(PyObject *obj, const char *op, long *dtype)
{
    long v = PyLong_Check(obj) && !PyBool_Check(obj) ? PyLong_AsLong(obj) : -2;
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (v != YV_FLOAT16 && v != YV_BFLOAT16) {
        PyErr_Format(PyExc_ValueError, "%s: dtype_code must be DTYPE_FLOAT16 or DTYPE_BFLOAT16", op);
        return -1;
    }
    *dtype = v;
    return 0;
}

#ifndef YV_WITH_CUDNN
static PyObject *no_cudnn_error(const char *op)
{
    PyErr_Format(PyExc_RuntimeError, "%s: yolov9c._C was built without cuDNN (build_info()['cudnn'] is 'absent'); "
                 "rebuild with CUDA and cuDNN 9 headers (the nvidia-cudnn-cu* wheel of a CUDA torch, or "
                 "CUDNN_INCLUDE_DIR): pip install -e .", op);
    return NULL;
}
#endif

/* ---------------------------------------------------------------- cudnn_fusion_probe */

PyObject *yv_py_cudnn_fusion_probe(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (yv_check_nargs(OP, nargs, 3) < 0)
        return NULL;
    conv_shape c;
    long dtype = 0;
    if (parse_conv(args[0], OP, &c) < 0 || parse_dtype(args[1], OP, &dtype) < 0)
        return NULL;
    long device = PyLong_Check(args[2]) && !PyBool_Check(args[2]) ? PyLong_AsLong(args[2]) : -2;
    if (device == -1 && PyErr_Occurred())
        return NULL;
    if (device < 0) {
        PyErr_Format(PyExc_ValueError, "%s: device must be a CUDA device index (int >= 0)", OP);
        return NULL;
    }
#ifndef YV_WITH_CUDNN
    return no_cudnn_error(OP);
#else
    if (load_cudnn(OP) < 0)
        return NULL;
    probe_args *a = PyMem_Calloc(1, sizeof(probe_args));
    if (a == NULL)
        return PyErr_NoMemory();
    a->ctx.s = c;
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
        if (d == NULL || PyDict_SetItemString(out, PATTERNS[i].name, d) < 0)
            Py_CLEAR(out);
        Py_XDECREF(d);
    }
exit:
    PyMem_Free(a);
    return out;
#endif
}

/* ---------------------------------------------------------------- cudnn_fusion_time */

static int parse_pattern(PyObject *obj, pattern_id *id)
{
    const char *name = PyUnicode_Check(obj) ? PyUnicode_AsUTF8(obj) : NULL;
    if (name == NULL && PyErr_Occurred())
        return -1;
    for (int i = 0; name != NULL && i < P_COUNT; i++) {
        if (strcmp(name, PATTERNS[i].name) == 0) {
            *id = (pattern_id)i;
            return 0;
        }
    }
    char names[512] = "";
    size_t used = 0;
    for (int i = 0; i < P_COUNT && used < sizeof(names); i++)
        used += (size_t)PyOS_snprintf(names + used, sizeof(names) - used, "%s%s", i ? ", " : "", PATTERNS[i].name);
    if (name == NULL)
        PyErr_Format(PyExc_TypeError, "%s: pattern must be a str (one of %s), got %.80s", OP_TIME, names,
                     Py_TYPE(obj)->tp_name);
    else
        PyErr_Format(PyExc_ValueError, "%s: unknown pattern '%.80s'; the patterns are %s", OP_TIME, name, names);
    return -1;
}

/* The dtype, logical dims and (for 4-d tensors) channels-last strides a role must have. */
typedef struct role_spec {
    yv_dtype dtype;
    int ndim;
    int64_t dims[4];
} role_spec;

static role_spec spec_of(role r, const pattern_info *pi, const conv_shape *s, yv_dtype io)
{
    switch (r) {
    case R_X: case R_DX: case R_Z: case R_DV:
        return (role_spec){io, 4, {s->N, s->C, s->H, s->W}};
    case R_W: case R_DW:
        return (role_spec){io, 4, {s->K, s->C, s->R, s->S}};
    case R_Y: case R_DY:
        return (role_spec){io, 4, {s->N, s->K, s->Ho, s->Wo}};
    case R_SCALE: case R_BIAS:
        return (role_spec){pi->affine_io ? io : YV_FLOAT32, 1, {s->C, 0, 0, 0}};
    case R_SUM: case R_SQSUM:
        return (role_spec){YV_FLOAT32, 1, {s->K, 0, 0, 0}};
    default:   /* R_DVSUM, R_DVZSUM */
        return (role_spec){YV_FLOAT32, 1, {s->C, 0, 0, 0}};
    }
}

/* A 4-d tensor must be dense channels-last: strides (C*H*W, 1, W*C, C) in elements (size-1 dims are free). */
static int check_channels_last(const yv_tensor *t)
{
    const int64_t *d = t->shape;
    int64_t want[4] = {d[1] * d[2] * d[3], 1, d[3] * d[1], d[1]};
    for (int i = 0; i < 4; i++) {
        if (d[i] != 1 && t->strides[i] != want[i]) {
            PyErr_Format(PyExc_ValueError, "%s: %s must be dense channels-last (strides (%lld, 1, %lld, %lld)), "
                         "got strides (%lld, %lld, %lld, %lld); use .contiguous(memory_format=torch.channels_last)",
                         t->op, t->arg, (long long)want[0], (long long)want[2], (long long)want[3],
                         (long long)t->strides[0], (long long)t->strides[1], (long long)t->strides[2],
                         (long long)t->strides[3]);
            return -1;
        }
    }
    return 0;
}

static int check_cuda(const yv_tensor *t, int device)
{
    if (t->device == YV_CPU) {
        PyErr_Format(PyExc_ValueError, "%s: %s must be a CUDA tensor, got a CPU array", t->op, t->arg);
        return -1;
    }
    if (device >= 0 && t->device != device) {
        PyErr_Format(PyExc_ValueError, "%s: %s is on cuda:%d but the first tensor is on cuda:%d; all tensors must "
                     "be on one device", t->op, t->arg, t->device, device);
        return -1;
    }
    return 0;
}

/* One tensor of the pattern: a CUDA descriptor of the role's dtype, dims and layout, 16-byte aligned. */
static int parse_role(PyObject *obj, role r, const role_spec *sp, int device, yv_tensor *t)
{
    if (yv_tensor_parse(obj, OP_TIME, ROLE_NAMES[r], 1, t) < 0 || check_cuda(t, device) < 0
        || yv_check_dtype(t, YV_DT(sp->dtype)) < 0 || yv_check_ndim(t, sp->ndim) < 0)
        return -1;
    for (int d = 0; d < sp->ndim; d++)
        if (yv_check_dim(t, d, sp->dims[d]) < 0)
            return -1;
    if ((sp->ndim == 4 ? check_channels_last(t) : yv_check_contiguous(t)) < 0)
        return -1;
    return yv_check_alignment(t, 16);   /* the tensors are declared 16-byte aligned to cuDNN */
}

static int parse_tensors(PyObject *obj, time_request *q)
{
    const pattern_info *pi = &PATTERNS[q->id];
    char what[160] = "(";
    size_t used = 1;
    for (int i = 0; i < pi->n_roles && used < sizeof(what); i++)
        used += (size_t)PyOS_snprintf(what + used, sizeof(what) - used, "%s%s", ROLE_NAMES[pi->roles[i]],
                                      i + 1 < pi->n_roles ? ", " : ")");
    PyObject *items[MAX_ROLES];
    if (yv_parse_group(obj, OP_TIME, "tensors", what, pi->n_roles, items) < 0)
        return -1;
    q->device = -1;
    for (int i = 0; i < pi->n_roles; i++) {
        role_spec sp = spec_of(pi->roles[i], pi, &q->s, (yv_dtype)q->dtype);
        yv_tensor t;
        if (parse_role(items[i], pi->roles[i], &sp, q->device, &t) < 0)
            return -1;
        q->device = t.device;
        q->data[i] = t.data;
    }
    return 0;
}

static int parse_workspace(PyObject *obj, time_request *q)
{
    yv_tensor t;
    if (yv_tensor_parse(obj, OP_TIME, "workspace", 1, &t) < 0 || check_cuda(&t, q->device) < 0
        || yv_check_dtype(&t, YV_DT(YV_UINT8)) < 0 || yv_check_ndim(&t, 1) < 0 || yv_check_contiguous(&t) < 0)
        return -1;
    q->workspace = t.data;
    q->workspace_bytes = t.numel;
    return 0;
}

static int parse_iters(PyObject *obj, int *iters)
{
    long v = PyLong_Check(obj) && !PyBool_Check(obj) ? PyLong_AsLong(obj) : -2;
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (v < 1 || v > 100000) {
        PyErr_Format(PyExc_ValueError, "%s: iters must be an int in [1, 100000]", OP_TIME);
        return -1;
    }
    *iters = (int)v;
    return 0;
}

#ifdef YV_WITH_CUDNN
static PyObject *time_dict(const time_args *a)
{
    PyObject *ms = a->ms >= 0.0 ? PyFloat_FromDouble(a->ms) : Py_NewRef(Py_None);
    if (ms == NULL)
        return NULL;
    PyObject *out = Py_BuildValue("{s:s, s:O, s:s, s:L, s:z, s:d}", "status", a->status, "ms", ms, "plan",
                                  a->plan.status, "workspace", (long long)a->plan.workspace, "mode", a->plan.mode,
                                  "seconds", a->plan.seconds);
    Py_DECREF(ms);
    return out;
}
#endif

PyObject *yv_py_cudnn_fusion_time(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (yv_check_nargs(OP_TIME, nargs, 7) < 0)
        return NULL;
    time_request q;
    memset(&q, 0, sizeof(q));
    if (parse_conv(args[0], OP_TIME, &q.s) < 0 || parse_dtype(args[1], OP_TIME, &q.dtype) < 0
        || parse_pattern(args[2], &q.id) < 0 || parse_tensors(args[3], &q) < 0 || parse_workspace(args[4], &q) < 0
        || yv_parse_stream(args[5], OP_TIME, &q.stream) < 0 || parse_iters(args[6], &q.iters) < 0)
        return NULL;
#ifndef YV_WITH_CUDNN
    return no_cudnn_error(OP_TIME);
#else
    if (load_cudnn(OP_TIME) < 0)
        return NULL;
    time_args *a = PyMem_Calloc(1, sizeof(time_args));
    if (a == NULL)
        return PyErr_NoMemory();
    a->req = q;
    a->ctx.s = q.s;
    a->ctx.io = q.dtype == YV_FLOAT16 ? CUDNN_DATA_HALF : CUDNN_DATA_BFLOAT16;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = run_time(a);
    Py_END_ALLOW_THREADS
    PyObject *out = rc < 0 ? yv_kernel_error(module, OP_TIME, a->status) : time_dict(a);
    PyMem_Free(a);
    return out;
#endif
}
