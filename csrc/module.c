/* module.c — yolov9c._C: multi-phase module init, module state, the method table, KernelError, build_info.
 *
 * The ops themselves live one per file (csrc/<op>.c binding, csrc/<op>_ref.c CPU implementation,
 * kernels/<op>.cu CUDA kernels). Python reaches them through yolov9c/ops/<op>.py.
 * Test: python -m pytest -q tests/ops/test_build.py
 */
#include <string.h>

#include "module.h"
#include "tensor.h"

#ifdef YV_WITH_CUDA
#include <cuda_runtime_api.h>   /* CUDART_VERSION */
#endif

#ifndef YV_VERSION
#error "setup.py passes YV_VERSION"
#endif

int yv_numpy_import(void);   /* tensor.c */

PyDoc_STRVAR(build_info_doc,
"build_info($module, /)\n--\n\n"
"How this module was built, as a dict: version (str), cuda (bool), cuda_version (str such as '13.0', or\n"
"None), archs (list of str such as 'sm_90': the GPU code compiled in), ptx (str such as 'compute_90', or None).");

static PyObject *build_info(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    PyObject *archs = PyList_New(0);
    if (archs == NULL)
        return NULL;
    PyObject *cuda_version = Py_None, *ptx = Py_None;
    Py_INCREF(Py_None);
    Py_INCREF(Py_None);
    int cuda = 0;
#ifdef YV_WITH_CUDA
    cuda = 1;
    Py_DECREF(cuda_version);
    cuda_version = PyUnicode_FromFormat("%d.%d", CUDART_VERSION / 1000, (CUDART_VERSION % 1000) / 10);
    /* YV_CUDA_ARCHS is "75,80,86,89,90" (setup.py); PTX is emitted for the last, the highest. */
    const char *p = YV_CUDA_ARCHS;
    const char *last = p;
    while (cuda_version != NULL && *p) {
        const char *end = p;
        while (*end && *end != ',')
            end++;
        char name[32];
        PyOS_snprintf(name, sizeof(name), "sm_%.*s", (int)(end - p), p);
        PyObject *s = PyUnicode_FromString(name);
        if (s == NULL || PyList_Append(archs, s) < 0) {
            Py_XDECREF(s);
            goto fail;
        }
        Py_DECREF(s);
        last = p;
        p = *end ? end + 1 : end;
    }
    if (cuda_version == NULL)
        goto fail;
    Py_DECREF(ptx);
    char ptx_name[32];
    PyOS_snprintf(ptx_name, sizeof(ptx_name), "compute_%.*s", (int)strcspn(last, ","), last);
    ptx = PyUnicode_FromString(ptx_name);
    if (ptx == NULL)
        goto fail;
#endif
    PyObject *info = Py_BuildValue("{s:s, s:O, s:O, s:O, s:O}", "version", YV_VERSION,
                                   "cuda", cuda ? Py_True : Py_False, "cuda_version", cuda_version,
                                   "archs", archs, "ptx", ptx);
    Py_DECREF(archs);
    Py_DECREF(cuda_version);
    Py_DECREF(ptx);
    return info;
#ifdef YV_WITH_CUDA
fail:
    Py_DECREF(archs);
    Py_XDECREF(cuda_version);
    Py_XDECREF(ptx);
    return NULL;
#endif
}

/* Every doc starts with the text signature ("name($module, a, b, /)\n--\n\n"), so inspect.signature and
 * help() show the positional parameters; tests/ops/test_bindings.py checks that no binding takes more than 12. */
PyDoc_STRVAR(augment_forward_doc,
"augment_forward($module, out, src, tiles, warp, mix, flags, luts, paste, stream, /)\n--\n\n"
"One training batch's pixels from decoded images and a host-drawn plan (mosaic tiles, copy-paste, warp,\n"
"mixup, flips, HSV). out (B, 3, H, W) uint8 RGB, written; src (N,) uint8 the source images (h x w x 3 BGR\n"
"each); tiles (B, 2, 4, 9) int64; warp (B, 2, 9) float32 inverse maps; mix (B, 2) float32; flags (B, 4)\n"
"int64; luts (B, 3, 256) uint8; paste (B, 2, L) int32 pasted polygons, L >= 2 (layouts:\n"
"kernels/augment_pixel.h); stream: CUDA stream handle (0 for CPU).\n"
"Returns None.");

PyDoc_STRVAR(nms_forward_doc,
"nms_forward($module, boxes, scores, classes, iou_thres, workspace, keep, count, stream, /)\n--\n\n"
"Class-aware greedy NMS. boxes (N, 4) xyxy and scores (N,): float32/float16 (bfloat16 on CUDA), one dtype;\n"
"classes (N,) int32/int64 or None; iou_thres float (suppress when IoU > iou_thres, computed in float32);\n"
"workspace uint8 (nms_workspace_size(N, cuda) bytes); keep (N,) int64 out: kept indices by score\n"
"descending, ties by lower index; count (1,) int64 out: how many of keep are valid; stream: the CUDA\n"
"stream handle (int, 0 for CPU). Tensors (csrc/tensor.h's forms) are contiguous, all on one device.\n"
"Returns None.");

PyDoc_STRVAR(nms_workspace_size_doc,
"nms_workspace_size($module, n, cuda, /)\n--\n\nBytes (int) of uint8 workspace nms_forward needs for n boxes "
"on the CPU (cuda false) or a GPU (cuda true).");

PyDoc_STRVAR(bn_workspace_size_doc,
"bn_workspace_size($module, shape, cuda, /)\n--\n\nBytes (int) of uint8 workspace bn_stats_forward and\n"
"bn_silu_backward need for z of shape (B, C, H, W) on a GPU (cuda true); 0 on the CPU.");

PyDoc_STRVAR(bn_stats_forward_doc,
"bn_stats_forward($module, z, running_mean, running_var, momentum, eps, mean, invstd, workspace, stream, /)\n"
"--\n\n"
"Per-channel batch statistics of z (B, C, H, W), any strides, float32/float16 (bfloat16 on CUDA):\n"
"mean and invstd = 1/sqrt(biased_var + eps) written to float32 (C,) arrays; running_mean/running_var\n"
"(float32 (C,) or None) updated in place like torch's training BatchNorm. B*H*W must exceed 1.\n"
"workspace: uint8, bn_workspace_size bytes, 256-byte aligned (None on the CPU). Returns None.");

PyDoc_STRVAR(bn_silu_forward_doc,
"bn_silu_forward($module, bn1, bn2, residual, act, out, stream, /)\n--\n\n"
"out = act(BN1(z1) [+ BN2(z2)]) [+ residual], BN(z) = (z - mean)*invstd*weight + bias. A BN operand is the\n"
"tuple (z, mean, invstd, weight, bias); bn2 None for one BN (its fields are then named z, mean, ...).\n"
"4-D operands share z's shape, any strides and storage dtype; (C,) operands float32 contiguous. residual\n"
"may be None; act 'silu' or 'identity' ('silu' with bn2). Returns None.");

PyDoc_STRVAR(bn_silu_backward_doc,
"bn_silu_backward($module, bn1, bn2, grad_out, act, batch_stats, grads1, grads2, accumulate, workspace,\n"
"                 stream, /)\n--\n\n"
"Full training BatchNorm backward of bn_silu_forward (without residual). grads1/grads2: tuples\n"
"(dz, dweight, dbias): dz of z's dtype or float32, any strides, or None to skip, written or (accumulate)\n"
"added to; dweight/dbias float32 (C,) written; grads2 None without bn2. batch_stats false drops the\n"
"statistics' terms (eval statistics). Returns None.");

PyDoc_STRVAR(det_loss_forward_doc,
"det_loss_forward($module, maps, strides, reg_max, targets, label_smoothing, pos_weight, max_dist,\n"
"                 workspace, out, stream, /)\n--\n\n"
"The loss terms of one detection head branch (maths: csrc/det_loss_ref.c). maps: tuple of nl level maps\n"
"(B, 4*reg_max + NC, H, W), one dtype (float32/float16; bfloat16 on CUDA, float64 on the CPU), any strides;\n"
"strides: nl floats (pixels per cell); targets: the tuple (target_labels (B, A) int32/int64, target_boxes\n"
"(B, A, 4) xyxy pixels and target_norm (B, A): float32 (float64 too on the CPU), fg_mask (B, A) bool,\n"
"target_scores_sum (1,)); label_smoothing, pos_weight, max_dist: floats; workspace uint8\n"
"(det_loss_workspace_size(B, A, cuda) bytes); out (3,) float32 (float64 allowed on the CPU) = (box, cls, dfl)\n"
"/ target_scores_sum; stream: the CUDA stream handle (0 for CPU). Returns None.");

PyDoc_STRVAR(det_loss_backward_doc,
"det_loss_backward($module, maps, strides, reg_max, targets, label_smoothing, pos_weight, max_dist,\n"
"                  grad_out, grads, stream, /)\n--\n\n"
"Gradients of det_loss_forward's (3,) output w.r.t. the maps, recomputed from the maps and targets: grad_out\n"
"(3,) float32/float64 (float32 on CUDA); grads: tuple of nl tensors shaped and typed like the maps (own\n"
"strides, no zero strides), every element written. Returns None.");

PyDoc_STRVAR(det_loss_decode_doc,
"det_loss_decode($module, maps, strides, reg_max, boxes, stream, /)\n--\n\n"
"DFL expectation of every anchor -> boxes (B, A, 4) float32 xyxy in pixels (what the assigner reads).");

PyDoc_STRVAR(det_loss_workspace_size_doc,
"det_loss_workspace_size($module, B, A, cuda, /)\n--\n\nBytes (int) of uint8 workspace det_loss_forward needs "
"(0 on the CPU).");

PyDoc_STRVAR(tal_assign_forward_doc,
"tal_assign_forward($module, scores, pred_boxes, points, gt, params, logits, round_dtype, workspace,\n"
"                   targets, stream, /)\n--\n\n"
"Task-aligned label assignment without (B, M, A) arrays (maths: csrc/tal_assign_ref.c). scores (B, A, NC)\n"
"float32/float16 (bfloat16 on CUDA, float64 on the CPU), any strides; pred_boxes (B, A, 4), points (A, 2)\n"
"float32; gt: the tuple (gt_labels (B, M) int64, gt_boxes (B, M, 4) float32, gt_mask (B, M) bool), M >= 1;\n"
"params: the tuple (topk int (<= 32 on CUDA), alpha, beta, eps floats); logits bool (sigmoid on read);\n"
"round_dtype: DTYPE_* code of the scores' dtype (DTYPE_BFLOAT16 for bfloat16 scores upcast on the CPU);\n"
"workspace uint8 (tal_assign_workspace_size bytes); targets (written): the tuple (target_labels (B, A) int64,\n"
"target_boxes (B, A, 4) float32, target_norm (B, A) float32 (float64 for float64 scores), fg_mask (B, A)\n"
"bool, target_gt_idx (B, A) int64); stream: the CUDA stream handle (0 for CPU). All contiguous except\n"
"scores, on one device. Returns None.");

PyDoc_STRVAR(tal_assign_workspace_size_doc,
"tal_assign_workspace_size($module, B, M, A, topk, cuda, /)\n--\n\nBytes (int) of uint8 workspace "
"tal_assign_forward needs on the CPU (cuda false) or a GPU (cuda true): O(A + M + topk) on the CPU, "
"O(B·A + B·M·topk) on a GPU.");

PyDoc_STRVAR(avg_pool2x2_forward_doc,
"avg_pool2x2_forward($module, x, out, stream, /)\n--\n\n"
"ADown's F.avg_pool2d(x, 2, 1, 0, False, True): out[b,c,y,x] = 0.25*(((x[y,x] + x[y,x+1]) + x[y+1,x]) +\n"
"x[y+1,x+1]) in float32 (maths: kernels/pool.cu). x (B, C, H, W), H, W >= 2, float32/float16 (bfloat16 on\n"
"CUDA), any strides; out (B, C, H-1, W-1) of x's dtype and device, any strides, not overlapping x, written;\n"
"stream: the CUDA stream handle (0 for CPU). Returns None.");

PyDoc_STRVAR(avg_pool2x2_backward_doc,
"avg_pool2x2_backward($module, grad_out, grad_in, stream, /)\n--\n\n"
"Input gradient of avg_pool2x2_forward from grad_out alone: grad_in[y,x] = 0.25 * the sum of grad_out over\n"
"the (up to 4) windows covering (y, x). grad_out (B, C, H-1, W-1), grad_in (B, C, H, W) written (=), one\n"
"dtype and device, any strides, not overlapping. Returns None.");

PyDoc_STRVAR(upsample_nearest2x_forward_doc,
"upsample_nearest2x_forward($module, x, out, stream, /)\n--\n\n"
"nn.Upsample(scale_factor=2, mode='nearest'): out[b,c,y,x] = x[b,c,y/2,x/2] (a copy of the bits; maths:\n"
"kernels/pool.cu). x (B, C, H, W) float32/float16 (bfloat16 on CUDA), any strides; out (B, C, 2H, 2W) of x's\n"
"dtype and device, any strides, not overlapping x, written; stream: the CUDA stream handle (0 for CPU).\n"
"Returns None.");

PyDoc_STRVAR(upsample_nearest2x_backward_doc,
"upsample_nearest2x_backward($module, grad_out, grad_in, stream, /)\n--\n\n"
"Input gradient of upsample_nearest2x_forward from grad_out alone: grad_in[i,j] = ((g[2i,2j] + g[2i,2j+1]) +\n"
"g[2i+1,2j]) + g[2i+1,2j+1] in float32, rounded once (torch's bits). grad_out (B, C, 2H, 2W), grad_in\n"
"(B, C, H, W) written (=), one dtype and device, any strides, not overlapping. Returns None.");

PyDoc_STRVAR(max_pool2d_forward_doc,
"max_pool2d_forward($module, x, out, k, s, p, stream, /)\n--\n\n"
"F.max_pool2d(x, k, s, p) (dilation 1, floor mode; maths: kernels/pool.cu): out[y,x] = the maximum of the\n"
"k x k window at (y*s - p, x*s - p), padding never picked; torch's argmax rule (first maximum, a NaN window\n"
"its last NaN). x (B, C, H, W) float32/float16 (bfloat16 on CUDA), any strides; k >= 1, s >= 1, 0 <= p <= k/2;\n"
"out (B, C, (H+2p-k)/s+1, (W+2p-k)/s+1) of x's dtype and device, not overlapping x, written. Returns None.");

PyDoc_STRVAR(max_pool2d_backward_doc,
"max_pool2d_backward($module, x, grad_out, index, grad_in, k, s, p, stream, /)\n--\n\n"
"Input gradient of max_pool2d_forward from x and grad_out (nothing saved but x): grad_in[y,x] = the float32\n"
"sum of grad_out over the windows whose argmax (y, x) is, in row-major output order. Two phases through the\n"
"scratch index (B, C, Ho, Wo) uint8 on x's device, any strides (best: grad_out's memory format), written\n"
"first with each window's argmax dy*k + dx (so k*k <= 255), then gathered. x, grad_in (B, C, H, W), grad_out\n"
"(B, C, Ho, Wo), one dtype and device, any strides; grad_in written (=); no output overlaps another operand.\n"
"Returns None.");

static PyMethodDef module_methods[] = {
    {"build_info", build_info, METH_NOARGS, build_info_doc},
    {"augment_forward", (PyCFunction)(void (*)(void))yv_py_augment_forward, METH_FASTCALL, augment_forward_doc},
    {"nms_forward", (PyCFunction)(void (*)(void))yv_py_nms_forward, METH_FASTCALL, nms_forward_doc},
    {"nms_workspace_size", (PyCFunction)(void (*)(void))yv_py_nms_workspace_size, METH_FASTCALL,
     nms_workspace_size_doc},
    {"bn_workspace_size", (PyCFunction)(void (*)(void))yv_py_bn_workspace_size, METH_FASTCALL,
     bn_workspace_size_doc},
    {"bn_stats_forward", (PyCFunction)(void (*)(void))yv_py_bn_stats_forward, METH_FASTCALL, bn_stats_forward_doc},
    {"bn_silu_forward", (PyCFunction)(void (*)(void))yv_py_bn_silu_forward, METH_FASTCALL, bn_silu_forward_doc},
    {"bn_silu_backward", (PyCFunction)(void (*)(void))yv_py_bn_silu_backward, METH_FASTCALL,
     bn_silu_backward_doc},
    {"det_loss_forward", (PyCFunction)(void (*)(void))yv_py_det_loss_forward, METH_FASTCALL, det_loss_forward_doc},
    {"det_loss_backward", (PyCFunction)(void (*)(void))yv_py_det_loss_backward, METH_FASTCALL,
     det_loss_backward_doc},
    {"det_loss_decode", (PyCFunction)(void (*)(void))yv_py_det_loss_decode, METH_FASTCALL, det_loss_decode_doc},
    {"det_loss_workspace_size", (PyCFunction)(void (*)(void))yv_py_det_loss_workspace_size, METH_FASTCALL,
     det_loss_workspace_size_doc},
    {"tal_assign_forward", (PyCFunction)(void (*)(void))yv_py_tal_assign_forward, METH_FASTCALL,
     tal_assign_forward_doc},
    {"tal_assign_workspace_size", (PyCFunction)(void (*)(void))yv_py_tal_assign_workspace_size, METH_FASTCALL,
     tal_assign_workspace_size_doc},
    {"avg_pool2x2_forward", (PyCFunction)(void (*)(void))yv_py_avg_pool2x2_forward, METH_FASTCALL,
     avg_pool2x2_forward_doc},
    {"avg_pool2x2_backward", (PyCFunction)(void (*)(void))yv_py_avg_pool2x2_backward, METH_FASTCALL,
     avg_pool2x2_backward_doc},
    {"upsample_nearest2x_forward", (PyCFunction)(void (*)(void))yv_py_upsample_nearest2x_forward, METH_FASTCALL,
     upsample_nearest2x_forward_doc},
    {"upsample_nearest2x_backward", (PyCFunction)(void (*)(void))yv_py_upsample_nearest2x_backward, METH_FASTCALL,
     upsample_nearest2x_backward_doc},
    {"max_pool2d_forward", (PyCFunction)(void (*)(void))yv_py_max_pool2d_forward, METH_FASTCALL,
     max_pool2d_forward_doc},
    {"max_pool2d_backward", (PyCFunction)(void (*)(void))yv_py_max_pool2d_backward, METH_FASTCALL,
     max_pool2d_backward_doc},
    {NULL, NULL, 0, NULL},
};

static int module_exec(PyObject *module)
{
    yv_state *st = (yv_state *)PyModule_GetState(module);
    if (yv_numpy_import() < 0)
        return -1;
    st->KernelError = PyErr_NewExceptionWithDoc(
        "yolov9c._C.KernelError",
        "A kernel launch or a CUDA call failed; the message starts with the op's name.",
        PyExc_RuntimeError, NULL);
    if (st->KernelError == NULL)
        return -1;
    /* PyModule_AddObject steals a reference only on success; keep ours in the state. */
    Py_INCREF(st->KernelError);
    if (PyModule_AddObject(module, "KernelError", st->KernelError) < 0) {
        Py_DECREF(st->KernelError);
        return -1;
    }
    if (yv_add_dtype_constants(module) < 0)
        return -1;
    if (PyModule_AddStringConstant(module, "__version__", YV_VERSION) < 0)
        return -1;
    return 0;
}

static int module_traverse(PyObject *module, visitproc visit, void *arg)
{
    yv_state *st = (yv_state *)PyModule_GetState(module);
    if (st)
        Py_VISIT(st->KernelError);
    return 0;
}

static int module_clear(PyObject *module)
{
    yv_state *st = (yv_state *)PyModule_GetState(module);
    if (st)
        Py_CLEAR(st->KernelError);
    return 0;
}

static void module_free(void *module)
{
    module_clear((PyObject *)module);
}

static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, (void *)module_exec},
    {0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "yolov9c._C",
    .m_doc = "yolov9c's C/CUDA ops. Use them through yolov9c.ops; build_info() says how it was built.",
    .m_size = sizeof(yv_state),
    .m_methods = module_methods,
    .m_slots = module_slots,
    .m_traverse = module_traverse,
    .m_clear = module_clear,
    .m_free = module_free,
};

PyMODINIT_FUNC PyInit__C(void)
{
    return PyModuleDef_Init(&module_def);
}
