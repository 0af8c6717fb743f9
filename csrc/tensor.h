/* tensor.h — the tensor descriptor every binding parses its array arguments into, and the checks on it.
 *
 * A tensor crosses the Python/C boundary in one of three forms, all parsed into a yv_tensor:
 *   torch.Tensor (torch.nn.Parameter too), on the CPU or a CUDA device: what yolov9c/ops passes. Read
 *         through its dtype, shape, stride(), data_ptr() and is_cuda / is_cpu / get_device(); a tensor on
 *         another device (meta, ...) is refused. The conjugate and negative view bits are not read: such
 *         views (conj()/imag() of complex tensors, _neg_view()) would be read as their raw memory.
 *   CPU:  a NumPy array (the raw-binding tests). Must be aligned and in native byte order; outputs must be
 *         writeable.
 *   CUDA: a tuple of plain ints (the raw-binding tests):
 *             (data_ptr, dtype_code, shape_tuple, strides_tuple, device_index)
 *         strides in elements, device_index >= 0.
 * The stream travels as a separate int argument of the op. Every check below sets a Python exception whose
 * message names the op and the argument ("nms_forward: boxes must have 2 dimensions, got 3") and returns -1;
 * 0 means OK.
 *
 * Test: tests/ops/test_nms.py (the raw-binding cases feed bad descriptors and arrays through nms_forward),
 * tests/ops/test_bindings.py (torch tensors straight to the bindings).
 */
#ifndef YV_TENSOR_H
#define YV_TENSOR_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "yv_dtype.h"

#define YV_MAX_DIMS 8
#define YV_CPU (-1)

typedef struct yv_tensor {
    void *data;                     /* first element; NULL only when numel == 0 or the argument was None */
    yv_dtype dtype;
    int ndim;                       /* -1 for an absent optional argument (None) */
    int device;                     /* YV_CPU or a CUDA device index */
    int64_t shape[YV_MAX_DIMS];
    int64_t strides[YV_MAX_DIMS];   /* in elements, not bytes */
    int64_t numel;
    const char *op;                 /* for messages: the op's name ... */
    const char *arg;                /* ... and the argument's */
} yv_tensor;

/* Parse `obj` (torch tensor, NumPy array or CUDA descriptor tuple). `writable` != 0 demands a writeable
 * NumPy array (a torch tensor always is). */
int yv_tensor_parse(PyObject *obj, const char *op, const char *arg, int writable, yv_tensor *t);
/* Same, but None gives an absent tensor (ndim == -1, data == NULL). */
int yv_tensor_parse_optional(PyObject *obj, const char *op, const char *arg, int writable, yv_tensor *t);

int yv_check_ndim(const yv_tensor *t, int ndim);
int yv_check_dim(const yv_tensor *t, int dim, int64_t size);            /* shape[dim] == size */
int yv_check_dtype(const yv_tensor *t, unsigned allowed);               /* allowed: YV_DT(..) | ... */
int yv_check_contiguous(const yv_tensor *t);                            /* row-major, no gaps */
int yv_check_same_dtype(const yv_tensor *t, const yv_tensor *ref);
int yv_check_same_shape(const yv_tensor *t, const yv_tensor *ref);    /* "out must have the shape of z (..)" */
int yv_check_same_device(const yv_tensor *t, const yv_tensor *ref);
int yv_check_alignment(const yv_tensor *t, size_t bytes);               /* data pointer multiple of bytes */

const char *yv_dtype_name(yv_dtype dtype);
size_t yv_dtype_size(yv_dtype dtype);

/* The module's constants DTYPE_FLOAT32 ... so that Python reads the codes instead of repeating them. */
int yv_add_dtype_constants(PyObject *module);

/* Scalar arguments shared by every binding (TypeError/ValueError naming op and argument on failure). */
int yv_parse_stream(PyObject *obj, const char *op, uintptr_t *stream);  /* CUDA stream handle, 0 for CPU */
int yv_parse_finite(PyObject *obj, const char *op, const char *arg, double *out);  /* float or int, not bool */

#endif /* YV_TENSOR_H */
