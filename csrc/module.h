/* module.h — what the bindings share with the module: its state, the binding prototypes, and the helpers
 * every binding calls around a computation (error mapping, CUDA device guard, YOLOV9C_SYNC).
 *
 * A binding's shape (see csrc/nms.c):
 *     parse + check every argument (tensor.h)        -> ValueError/TypeError naming op and argument
 *     release the GIL, set the device, launch, sync if YOLOV9C_SYNC=1, restore the device, take the GIL
 *     nonzero status                                 -> yolov9c._C.KernelError("op: ...")
 * Test: tests/test_build.py, tests/test_nms.py.
 */
#ifndef YV_MODULE_H
#define YV_MODULE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#ifdef YV_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

typedef struct yv_state {
    PyObject *KernelError;   /* yolov9c._C.KernelError, a subclass of RuntimeError */
} yv_state;

/* --- bindings (METH_FASTCALL, positional-only); each lives in csrc/<op>.c --- */
PyObject *yv_py_nms_forward(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *yv_py_nms_workspace_size(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *yv_py_bn_workspace_size(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *yv_py_bn_stats_forward(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *yv_py_bn_silu_forward(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *yv_py_bn_silu_backward(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

/* --- helpers (csrc/launch.c) --- */
/* Arity check: "op() takes exactly N arguments (M given)" as TypeError. */
int yv_check_nargs(const char *op, Py_ssize_t nargs, Py_ssize_t expected);
/* Raise KernelError("op: message"); returns NULL for `return yv_kernel_error(...)`. */
PyObject *yv_kernel_error(PyObject *module, const char *op, const char *message);
/* 1 when YOLOV9C_SYNC=1 (read at every call, so it can be switched at run time). Call with the GIL. */
int yv_sync_requested(void);
/* RuntimeError telling how to build with CUDA; used when a CUDA tensor reaches a CPU-only build. */
PyObject *yv_no_cuda_error(const char *op);

#ifdef YV_WITH_CUDA
/* Make `device` current (remembering the previous one in *prev) — callable without the GIL. */
cudaError_t yv_device_enter(int device, int *prev);
void yv_device_leave(int prev);
/* After a launch: pick up a launch error, synchronise `stream` when `sync`, and return the first error. */
cudaError_t yv_launch_status(cudaError_t launched, cudaStream_t stream, int sync);
/* Raise KernelError("op: <cuda error name>: <description>"); returns NULL. */
PyObject *yv_cuda_error(PyObject *module, const char *op, cudaError_t err);
#endif

#endif /* YV_MODULE_H */
