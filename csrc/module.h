/* module.h — what the bindings share with the module: its state, the binding prototypes, and the helpers
 * every binding calls around a computation (error mapping, CUDA device guard, YOLOV9C_SYNC).
 *
 * A binding's shape (see csrc/nms.c):
 *     parse + check every argument (tensor.h) into a struct  -> ValueError/TypeError naming op and argument
 *     return yv_launch(module, &OP, device, stream, &args)   -> the one path that releases the GIL, sets the
 *                                                               device, launches, syncs if YOLOV9C_SYNC=1
 *                                                               and maps errors to yolov9c._C.KernelError
 * Groups of related arguments cross as one tuple (a BN operand (z, mean, invstd, weight, bias), a loss's
 * targets), so no binding takes more than 12 arguments; every method's doc starts with its text signature.
 * Test: tests/ops/test_build.py, tests/ops/test_bindings.py, tests/ops/test_nms.py.
 */
#ifndef YV_MODULE_H
#define YV_MODULE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

typedef struct yv_state {
    PyObject *KernelError;   /* yolov9c._C.KernelError, a subclass of RuntimeError */
} yv_state;

/* --- bindings (METH_FASTCALL, positional-only); each lives in csrc/<op>.c --- */
PyObject *yv_py_augment_forward(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *yv_py_nms_forward(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *yv_py_nms_workspace_size(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *yv_py_bn_workspace_size(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *yv_py_bn_stats_forward(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *yv_py_bn_silu_forward(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *yv_py_bn_silu_backward(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *yv_py_det_loss_forward(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *yv_py_det_loss_backward(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *yv_py_det_loss_decode(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *yv_py_det_loss_workspace_size(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *yv_py_tal_assign_forward(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *yv_py_tal_assign_workspace_size(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *yv_py_avg_pool2x2_forward(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *yv_py_avg_pool2x2_backward(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *yv_py_upsample_nearest2x_forward(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *yv_py_upsample_nearest2x_backward(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *yv_py_max_pool2d_forward(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *yv_py_max_pool2d_backward(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

/* --- the one launch path (csrc/launch.c) ---
 * A binding parses and checks its arguments into a small struct of its own, then hands that struct to
 * yv_launch with the op's two implementations over it:
 *   cpu(args)           the plain-C implementation: 0, or -1 for an input error found while running
 *                       (ValueError with op->bad_input), any other value a KernelError
 *   cuda(args, stream)  the CUDA launcher on `stream` (a cudaStream_t): returns a cudaError_t
 * yv_launch runs the one for `device` with the GIL released: stream must be 0 for the CPU; for CUDA it makes
 * `device` current, launches, picks up the launch error, synchronises when YOLOV9C_SYNC=1, restores the
 * previous device and maps a nonzero status to KernelError("op: <cuda error>"). Returns None or NULL. */
typedef int (*yv_cpu_fn)(void *args);
typedef int (*yv_cuda_fn)(void *args, void *stream);

typedef struct yv_op {
    const char *name;         /* "bn_silu_forward": every message starts with it */
    yv_cpu_fn cpu;
    yv_cuda_fn cuda;          /* YV_CUDA_FN(f): NULL in a build without CUDA */
    const char *bad_input;    /* message for cpu() == -1, or NULL */
} yv_op;

#ifdef YV_WITH_CUDA
#define YV_CUDA_FN(f) (f)
#else
#define YV_CUDA_FN(f) NULL
#endif

PyObject *yv_launch(PyObject *module, const yv_op *op, int device, uintptr_t stream, void *args);

/* --- smaller helpers (csrc/launch.c) --- */
/* Arity check: "op() takes exactly N arguments (M given)" as TypeError. */
int yv_check_nargs(const char *op, Py_ssize_t nargs, Py_ssize_t expected);
/* Raise KernelError("op: message"); returns NULL for `return yv_kernel_error(...)`. */
PyObject *yv_kernel_error(PyObject *module, const char *op, const char *message);
/* RuntimeError telling how to build with CUDA; used when a CUDA tensor reaches a CPU-only build. */
PyObject *yv_no_cuda_error(const char *op);
/* Set `type` with a printf-formatted message (doubles allowed: %g); returns NULL. */
PyObject *yv_errorf(PyObject *type, const char *fmt, ...);
/* A tuple (or list) of exactly n items: its items in items[0..n-1] (borrowed); TypeError naming op and arg
 * with `what` ("(z, mean, invstd, weight, bias)") otherwise. */
int yv_parse_group(PyObject *obj, const char *op, const char *arg, const char *what, Py_ssize_t n,
                   PyObject **items);
/* A bool-like flag (bool or int): 0/1 in *out. */
int yv_parse_flag(PyObject *obj, const char *op, const char *arg, int *out);

#endif /* YV_MODULE_H */
