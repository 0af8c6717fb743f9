/* module.c — yolov9c._C: multi-phase module init, module state, the method table, KernelError, build_info.
 *
 * The ops themselves live one per file (csrc/<op>.c binding, csrc/<op>_ref.c CPU implementation,
 * kernels/<op>.cu CUDA kernels). Python reaches them through yolov9c/ops/<op>.py.
 * Test: python -m pytest -q tests/test_build.py
 */
#include <string.h>

#include "module.h"
#include "tensor.h"

#ifndef YV_VERSION
#error "setup.py passes YV_VERSION"
#endif

int yv_numpy_import(void);   /* tensor.c */

PyDoc_STRVAR(build_info_doc,
"build_info() -> dict\n\n"
"How this module was built: version (str), cuda (bool), cuda_version (str such as '13.0', or None),\n"
"archs (list of str such as 'sm_90': the GPU code compiled in), ptx (str such as 'compute_90', or None).");

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

PyDoc_STRVAR(nms_forward_doc,
"nms_forward(boxes, scores, classes, iou_thres, workspace, keep, count, stream, /) -> None\n\n"
"Class-aware greedy NMS. boxes (N, 4) xyxy and scores (N,): float32/float16 (bfloat16 on CUDA), one dtype;\n"
"classes (N,) int32/int64 or None; iou_thres float (suppress when IoU > iou_thres, computed in float32);\n"
"workspace uint8 (nms_workspace_size(N, cuda) bytes); keep (N,) int64 out: kept indices by score\n"
"descending, ties by lower index; count (1,) int64 out: how many of keep are valid; stream: the CUDA\n"
"stream handle (int, 0 for CPU). Arrays are NumPy arrays (CPU) or CUDA descriptor tuples, contiguous,\n"
"all on one device.");

PyDoc_STRVAR(nms_workspace_size_doc,
"nms_workspace_size(n, cuda, /) -> int\n\nBytes of uint8 workspace nms_forward needs for n boxes on the CPU "
"(cuda false) or a GPU (cuda true).");

PyDoc_STRVAR(bn_workspace_size_doc,
"bn_workspace_size(B, C, H, W, cuda, /) -> int\n\nBytes of uint8 workspace bn_stats_forward and bn_silu_backward\n"
"need for z of shape (B, C, H, W) on a GPU (cuda true); 0 on the CPU.");

PyDoc_STRVAR(bn_stats_forward_doc,
"bn_stats_forward(z, running_mean, running_var, momentum, eps, mean, invstd, workspace, stream, /) -> None\n\n"
"Per-channel batch statistics of z (B, C, H, W), any strides, float32/float16 (bfloat16 on CUDA):\n"
"mean and invstd = 1/sqrt(biased_var + eps) written to float32 (C,) arrays; running_mean/running_var\n"
"(float32 (C,) or None) updated in place like torch's training BatchNorm. B*H*W must exceed 1.\n"
"workspace: uint8, bn_workspace_size bytes, 256-byte aligned (None on the CPU).");

PyDoc_STRVAR(bn_silu_forward_doc,
"bn_silu_forward(z1, mean1, invstd1, weight1, bias1, z2, mean2, invstd2, weight2, bias2, residual, act,\n"
"                out, stream, /) -> None\n\n"
"out = act(BN1(z1) [+ BN2(z2)]) [+ residual], BN(z) = (z - mean)*invstd*weight + bias. 4-D operands share\n"
"z1's shape, any strides and storage dtype; (C,) operands float32 contiguous. z2..bias2 and residual may\n"
"be None; act 'silu' or 'identity' ('silu' with z2).");

PyDoc_STRVAR(bn_silu_backward_doc,
"bn_silu_backward(z1, mean1, invstd1, weight1, bias1, z2, mean2, invstd2, weight2, bias2, grad_out, act,\n"
"                 batch_stats, dz1, dz2, accumulate, dweight1, dbias1, dweight2, dbias2, workspace,\n"
"                 stream, /) -> None\n\n"
"Full training BatchNorm backward of bn_silu_forward (without residual): dz1/dz2 (z's dtype or float32,\n"
"any strides, or None to skip) written or, with accumulate, added to; dweight/dbias float32 (C,) written\n"
"(dweight2/dbias2 None without z2). batch_stats false drops the statistics' terms (eval statistics).");

static PyMethodDef module_methods[] = {
    {"build_info", build_info, METH_NOARGS, build_info_doc},
    {"nms_forward", (PyCFunction)(void (*)(void))yv_py_nms_forward, METH_FASTCALL, nms_forward_doc},
    {"nms_workspace_size", (PyCFunction)(void (*)(void))yv_py_nms_workspace_size, METH_FASTCALL,
     nms_workspace_size_doc},
    {"bn_workspace_size", (PyCFunction)(void (*)(void))yv_py_bn_workspace_size, METH_FASTCALL,
     bn_workspace_size_doc},
    {"bn_stats_forward", (PyCFunction)(void (*)(void))yv_py_bn_stats_forward, METH_FASTCALL, bn_stats_forward_doc},
    {"bn_silu_forward", (PyCFunction)(void (*)(void))yv_py_bn_silu_forward, METH_FASTCALL, bn_silu_forward_doc},
    {"bn_silu_backward", (PyCFunction)(void (*)(void))yv_py_bn_silu_backward, METH_FASTCALL,
     bn_silu_backward_doc},
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
