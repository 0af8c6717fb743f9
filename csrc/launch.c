/* launch.c — the one path from a checked binding to its computation (yv_launch: GIL, CUDA device guard,
 * YOLOV9C_SYNC=1 synchronisation, error mapping), and the small argument helpers every binding shares.
 * See module.h for the pattern.
 * Test: tests/ops/test_bindings.py, tests/ops/test_nms.py (arity and error cases),
 *       tests/ops/test_build.py (KernelError).
 */
#include "module.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensor.h"

#ifdef YV_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

int yv_check_nargs(const char *op, Py_ssize_t nargs, Py_ssize_t expected)
{
    if (nargs == expected)
        return 0;
    PyErr_Format(PyExc_TypeError, "%s() takes exactly %zd positional argument%s (%zd given)",
                 op, expected, expected == 1 ? "" : "s", nargs);
    return -1;
}

PyObject *yv_kernel_error(PyObject *module, const char *op, const char *message)
{
    yv_state *st = (yv_state *)PyModule_GetState(module);
    PyErr_Format(st && st->KernelError ? st->KernelError : PyExc_RuntimeError, "%s: %s", op, message);
    return NULL;
}

PyObject *yv_errorf(PyObject *type, const char *fmt, ...)
{
    /* C's vsnprintf, not PyErr_Format: the messages print doubles (%g), which PyErr_Format rejects on
     * Python 3.12+ (SystemError) and printed verbatim before. */
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    PyErr_SetString(type, buf);
    return NULL;
}

PyObject *yv_no_cuda_error(const char *op)
{
    PyErr_Format(PyExc_RuntimeError, "%s: got a CUDA tensor but yolov9c._C was built without CUDA; rebuild "
                 "with nvcc on PATH (or CUDA_HOME set): YOLOV9C_CUDA=1 pip install -e .", op);
    return NULL;
}

int yv_parse_group(PyObject *obj, const char *op, const char *arg, const char *what, Py_ssize_t n,
                   PyObject **items)
{
    if (!PyTuple_Check(obj) && !PyList_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s: %s must be a tuple %s, got %.80s", op, arg, what, Py_TYPE(obj)->tp_name);
        return -1;
    }
    if (PySequence_Fast_GET_SIZE(obj) != n) {
        PyErr_Format(PyExc_TypeError, "%s: %s must be a tuple of %zd %s, got %zd items", op, arg, n, what,
                     PySequence_Fast_GET_SIZE(obj));
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        items[i] = PySequence_Fast_GET_ITEM(obj, i);
    return 0;
}

int yv_parse_flag(PyObject *obj, const char *op, const char *arg, int *out)
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

static PyObject *launch_cpu(PyObject *module, const yv_op *op, uintptr_t stream, void *args)
{
    if (stream != 0) {
        PyErr_Format(PyExc_ValueError, "%s: stream must be 0 for CPU tensors", op->name);
        return NULL;
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = op->cpu(args);
    Py_END_ALLOW_THREADS
    if (rc == 0)
        Py_RETURN_NONE;
    if (rc == -1 && op->bad_input != NULL) {
        PyErr_Format(PyExc_ValueError, "%s: %s", op->name, op->bad_input);
        return NULL;
    }
    return yv_kernel_error(module, op->name, "CPU implementation failed");
}

#ifdef YV_WITH_CUDA
/* YOLOV9C_SYNC=1, read at every call (so it can be switched at run time); with the GIL held. */
static int sync_requested(void)
{
    const char *v = getenv("YOLOV9C_SYNC");
    return v != NULL && strcmp(v, "1") == 0;
}

/* Make `device` current, remembering the previous one (no runtime call to set it in the common case). */
static cudaError_t device_enter(int device, int *prev)
{
    cudaError_t err = cudaGetDevice(prev);
    if (err != cudaSuccess)
        return err;
    return *prev == device ? cudaSuccess : cudaSetDevice(device);
}

static void device_leave(int prev)
{
    int now = -1;
    if (cudaGetDevice(&now) == cudaSuccess && now != prev)
        (void)cudaSetDevice(prev);
}

static PyObject *launch_cuda(PyObject *module, const yv_op *op, int device, uintptr_t stream, void *args)
{
    int sync = sync_requested();
    cudaStream_t cs = (cudaStream_t)stream;
    cudaError_t err;
    Py_BEGIN_ALLOW_THREADS
    int prev = -1;
    err = device_enter(device, &prev);
    if (err == cudaSuccess) {
        cudaError_t launched = (cudaError_t)op->cuda(args, (void *)cs);
        /* cudaGetLastError also clears a non-sticky launch error so the next call starts clean. */
        cudaError_t last = cudaGetLastError();
        err = launched != cudaSuccess ? launched : last;
        if (err == cudaSuccess && sync)
            err = cudaStreamSynchronize(cs);
        device_leave(prev);
    }
    Py_END_ALLOW_THREADS
    if (err == cudaSuccess)
        Py_RETURN_NONE;
    char msg[512];
    PyOS_snprintf(msg, sizeof(msg), "%s: %s", cudaGetErrorName(err), cudaGetErrorString(err));
    return yv_kernel_error(module, op->name, msg);
}
#endif

PyObject *yv_launch(PyObject *module, const yv_op *op, int device, uintptr_t stream, void *args)
{
    if (device == YV_CPU)
        return launch_cpu(module, op, stream, args);
#ifdef YV_WITH_CUDA
    if (op->cuda != NULL)
        return launch_cuda(module, op, device, stream, args);
#endif
    return yv_no_cuda_error(op->name);
}
