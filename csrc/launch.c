/* launch.c — the helpers every binding calls around a computation: arity check, KernelError, the CUDA
 * device guard, YOLOV9C_SYNC=1 synchronisation and CUDA error mapping. See module.h for the pattern.
 * Test: tests/test_nms.py (arity and error cases), tests/test_build.py (KernelError).
 */
#include "module.h"

#include <stdlib.h>
#include <string.h>

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

int yv_sync_requested(void)
{
    const char *v = getenv("YOLOV9C_SYNC");
    return v != NULL && strcmp(v, "1") == 0;
}

PyObject *yv_no_cuda_error(const char *op)
{
    PyErr_Format(PyExc_RuntimeError, "%s: got a CUDA tensor but yolov9c._C was built without CUDA; rebuild "
                 "with nvcc on PATH (or CUDA_HOME set): YOLOV9C_CUDA=1 pip install -e .", op);
    return NULL;
}

#ifdef YV_WITH_CUDA
cudaError_t yv_device_enter(int device, int *prev)
{
    cudaError_t err = cudaGetDevice(prev);
    if (err != cudaSuccess)
        return err;
    return *prev == device ? cudaSuccess : cudaSetDevice(device);
}

void yv_device_leave(int prev)
{
    int now = -1;
    if (cudaGetDevice(&now) == cudaSuccess && now != prev)
        (void)cudaSetDevice(prev);
}

cudaError_t yv_launch_status(cudaError_t launched, cudaStream_t stream, int sync)
{
    /* cudaGetLastError also clears a non-sticky launch error so the next call starts clean. */
    cudaError_t last = cudaGetLastError();
    cudaError_t err = launched != cudaSuccess ? launched : last;
    if (err == cudaSuccess && sync)
        err = cudaStreamSynchronize(stream);
    return err;
}

PyObject *yv_cuda_error(PyObject *module, const char *op, cudaError_t err)
{
    char msg[512];
    PyOS_snprintf(msg, sizeof(msg), "%s: %s", cudaGetErrorName(err), cudaGetErrorString(err));
    return yv_kernel_error(module, op, msg);
}
#endif
