/* tensor.c — parse torch tensors, NumPy arrays and CUDA descriptor tuples into yv_tensor, and the shared
 * argument checks.
 *
 * This is the only file that touches the NumPy C API (its function table is private to this file and is
 * loaded by yv_numpy_import(), called from the module's exec slot) and the only one that reads torch tensors
 * (through their Python attributes: no torch headers, so one build serves every torch version).
 * Test: tests/ops/test_nms.py::test_raw_binding_* drive every check through nms_forward.
 */
#include "tensor.h"

#include <string.h>

#include <numpy/arrayobject.h>

int yv_numpy_import(void);

int yv_numpy_import(void)
{
    /* _import_array() works with NumPy 1.x and 2.x headers alike and sets ImportError on failure. */
    return _import_array() < 0 ? -1 : 0;
}

static const char *const DTYPE_NAMES[YV_NUM_DTYPES] = {
    "float32", "float16", "bfloat16", "float64", "int8", "int16", "int32", "int64", "uint8", "bool",
};
static const size_t DTYPE_SIZES[YV_NUM_DTYPES] = {4, 2, 2, 8, 1, 2, 4, 8, 1, 1};
static const char *const DTYPE_CONSTANTS[YV_NUM_DTYPES] = {
    "DTYPE_FLOAT32", "DTYPE_FLOAT16", "DTYPE_BFLOAT16", "DTYPE_FLOAT64", "DTYPE_INT8",
    "DTYPE_INT16", "DTYPE_INT32", "DTYPE_INT64", "DTYPE_UINT8", "DTYPE_BOOL",
};

const char *yv_dtype_name(yv_dtype dtype)
{
    return (unsigned)dtype < YV_NUM_DTYPES ? DTYPE_NAMES[dtype] : "unknown";
}

size_t yv_dtype_size(yv_dtype dtype)
{
    return (unsigned)dtype < YV_NUM_DTYPES ? DTYPE_SIZES[dtype] : 0;
}

int yv_add_dtype_constants(PyObject *module)
{
    for (int i = 0; i < YV_NUM_DTYPES; i++) {
        if (PyModule_AddIntConstant(module, DTYPE_CONSTANTS[i], i) < 0)
            return -1;
    }
    return 0;
}

/* NumPy type -> our code; -1 when the array's type has no code. */
static int numpy_dtype(PyArrayObject *a)
{
    switch (PyArray_TYPE(a)) {
    case NPY_FLOAT32: return YV_FLOAT32;
    case NPY_FLOAT16: return YV_FLOAT16;
    case NPY_FLOAT64: return YV_FLOAT64;
    case NPY_BOOL: return YV_BOOL;
    case NPY_UINT8: return YV_UINT8;
    case NPY_INT8: return YV_INT8;
    default: break;
    }
    /* int32/int64 have several type numbers (int, long, longlong) depending on the platform. */
    if (PyArray_ISINTEGER(a) && PyArray_ISSIGNED(a)) {
        switch (PyArray_ITEMSIZE(a)) {
        case 2: return YV_INT16;
        case 4: return YV_INT32;
        case 8: return YV_INT64;
        default: break;
        }
    }
    return -1;
}

static int finish_numel(yv_tensor *t)
{
    int64_t numel = 1;
    for (int d = 0; d < t->ndim; d++) {
        if (t->shape[d] < 0) {
            PyErr_Format(PyExc_ValueError, "%s: %s has a negative size %lld in dimension %d",
                         t->op, t->arg, (long long)t->shape[d], d);
            return -1;
        }
        if (t->shape[d] != 0 && numel > INT64_MAX / t->shape[d]) {
            PyErr_Format(PyExc_ValueError, "%s: %s has more elements than int64 can count", t->op, t->arg);
            return -1;
        }
        numel *= t->shape[d];
    }
    t->numel = numel;
    return 0;
}

/* The element count, then a data pointer that is set (unless there is nothing to read) and aligned to the
 * item size: the checks of a pointer that came as an int. */
static int finish_pointer(yv_tensor *t)
{
    if (finish_numel(t) < 0)
        return -1;
    if (t->numel > 0 && t->data == NULL) {
        PyErr_Format(PyExc_ValueError, "%s: %s has a null data pointer", t->op, t->arg);
        return -1;
    }
    return yv_check_alignment(t, yv_dtype_size(t->dtype));
}

static int parse_numpy(PyArrayObject *a, int writable, yv_tensor *t)
{
    int code = numpy_dtype(a);
    if (code < 0) {
        PyErr_Format(PyExc_TypeError, "%s: %s has NumPy dtype %R, which no op accepts",
                     t->op, t->arg, (PyObject *)PyArray_DESCR(a));
        return -1;
    }
    int ndim = PyArray_NDIM(a);
    if (ndim > YV_MAX_DIMS) {
        PyErr_Format(PyExc_ValueError, "%s: %s has %d dimensions, at most %d are supported",
                     t->op, t->arg, ndim, YV_MAX_DIMS);
        return -1;
    }
    if (!PyArray_ISNOTSWAPPED(a)) {
        PyErr_Format(PyExc_ValueError, "%s: %s is not in native byte order", t->op, t->arg);
        return -1;
    }
    if (!PyArray_ISALIGNED(a)) {
        PyErr_Format(PyExc_ValueError, "%s: %s is not aligned to its item size", t->op, t->arg);
        return -1;
    }
    if (writable && !PyArray_ISWRITEABLE(a)) {
        PyErr_Format(PyExc_ValueError, "%s: %s is an output and must be writeable", t->op, t->arg);
        return -1;
    }
    t->dtype = (yv_dtype)code;
    t->ndim = ndim;
    t->device = YV_CPU;
    t->data = PyArray_DATA(a);
    npy_intp itemsize = PyArray_ITEMSIZE(a);
    for (int d = 0; d < ndim; d++) {
        npy_intp stride = PyArray_STRIDE(a, d);
        if (stride % itemsize != 0) {
            PyErr_Format(PyExc_ValueError, "%s: %s has a stride of %zd bytes in dimension %d, not a multiple "
                         "of its item size %zd", t->op, t->arg, (Py_ssize_t)stride, d, (Py_ssize_t)itemsize);
            return -1;
        }
        t->shape[d] = PyArray_DIM(a, d);
        t->strides[d] = stride / itemsize;
    }
    return finish_numel(t);
}

/* A tuple of ints of length n into out[]; -1 with an exception naming what ("descriptor's shape"). */
static int int_tuple(PyObject *obj, int64_t *out, Py_ssize_t n, const yv_tensor *t, const char *what)
{
    if (!PyTuple_Check(obj) || PyTuple_GET_SIZE(obj) != n) {
        PyErr_Format(PyExc_TypeError, "%s: %s %s must be a tuple of %zd ints", t->op, t->arg, what, n);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyTuple_GET_ITEM(obj, i);
        if (!PyLong_Check(item)) {
            PyErr_Format(PyExc_TypeError, "%s: %s %s must hold ints, got %.50s",
                         t->op, t->arg, what, Py_TYPE(item)->tp_name);
            return -1;
        }
        long long v = PyLong_AsLongLong(item);
        if (v == -1 && PyErr_Occurred())
            return -1;
        out[i] = (int64_t)v;
    }
    return 0;
}

static int parse_descriptor(PyObject *tup, yv_tensor *t)
{
    if (PyTuple_GET_SIZE(tup) != 5) {
        PyErr_Format(PyExc_TypeError, "%s: %s descriptor must be (data_ptr, dtype, shape, strides, device), "
                     "a tuple of 5, got %zd items", t->op, t->arg, PyTuple_GET_SIZE(tup));
        return -1;
    }
    PyObject *ptr = PyTuple_GET_ITEM(tup, 0), *dtype = PyTuple_GET_ITEM(tup, 1);
    PyObject *shape = PyTuple_GET_ITEM(tup, 2), *strides = PyTuple_GET_ITEM(tup, 3);
    PyObject *device = PyTuple_GET_ITEM(tup, 4);
    if (!PyLong_Check(ptr) || !PyLong_Check(dtype) || !PyLong_Check(device)) {
        PyErr_Format(PyExc_TypeError, "%s: %s descriptor's data_ptr, dtype and device must be ints",
                     t->op, t->arg);
        return -1;
    }
    unsigned long long addr = PyLong_AsUnsignedLongLong(ptr);
    if (PyErr_Occurred())
        return -1;
    long code = PyLong_AsLong(dtype);
    if (code == -1 && PyErr_Occurred())
        return -1;
    if (code < 0 || code >= YV_NUM_DTYPES) {
        PyErr_Format(PyExc_TypeError, "%s: %s descriptor has unknown dtype code %ld", t->op, t->arg, code);
        return -1;
    }
    long dev = PyLong_AsLong(device);
    if (dev == -1 && PyErr_Occurred())
        return -1;
    if (dev < 0 || dev > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "%s: %s descriptor's device must be a CUDA device index >= 0 (got %ld);"
                     " pass a CPU tensor itself or as a NumPy array", t->op, t->arg, dev);
        return -1;
    }
    if (!PyTuple_Check(shape)) {
        PyErr_Format(PyExc_TypeError, "%s: %s descriptor's shape must be a tuple", t->op, t->arg);
        return -1;
    }
    Py_ssize_t ndim = PyTuple_GET_SIZE(shape);
    if (ndim > YV_MAX_DIMS) {
        PyErr_Format(PyExc_ValueError, "%s: %s has %zd dimensions, at most %d are supported",
                     t->op, t->arg, ndim, YV_MAX_DIMS);
        return -1;
    }
    t->ndim = (int)ndim;
    if (int_tuple(shape, t->shape, ndim, t, "descriptor's shape") < 0
        || int_tuple(strides, t->strides, ndim, t, "descriptor's strides") < 0)
        return -1;
    t->dtype = (yv_dtype)code;
    t->device = (int)dev;
    t->data = (void *)(uintptr_t)addr;
    return finish_pointer(t);
}

/* ---- torch.Tensor, read through the Python attributes every torch version has: dtype, shape, stride(),
 * data_ptr(), is_cuda / is_cpu, get_device(). The objects compared against (torch.Tensor, the dtypes) are
 * looked up once, in sys.modules["torch"], the first time an argument is neither a NumPy array nor a tuple
 * while they are unknown: a torch tensor cannot exist before torch is imported, and this module does not
 * import torch itself. Process-wide like NumPy's function table (torch supports one interpreter); the
 * references are kept for the life of the process. */
static struct {
    PyTypeObject *tensor;                       /* torch.Tensor (torch.nn.Parameter is a subclass) */
    PyObject *dtypes[YV_NUM_DTYPES];            /* torch.float32, ... in the order of the codes */
    PyObject *dtype, *shape, *stride, *data_ptr, *is_cuda, *is_cpu, *get_device, *device;   /* names */
} torch_api;

static const char *const TORCH_NAMES[8] = {
    "dtype", "shape", "stride", "data_ptr", "is_cuda", "is_cpu", "get_device", "device",
};

/* 1 when torch is imported and torch_api is filled, 0 when torch is not imported, -1 with an exception. */
static int load_torch(void)
{
    if (torch_api.tensor != NULL)
        return 1;
    PyObject *torch = NULL, *tensor = NULL, *dtypes[YV_NUM_DTYPES] = {NULL}, *names[8] = {NULL};
    int status = -1;
    PyObject *key = PyUnicode_FromString("torch");
    if (key == NULL)
        return -1;
    torch = PyImport_GetModule(key);   /* NULL without an exception when not imported */
    Py_DECREF(key);
    if (torch == NULL || torch == Py_None) {
        status = PyErr_Occurred() ? -1 : 0;
        goto exit;
    }
    tensor = PyObject_GetAttrString(torch, "Tensor");
    if (tensor == NULL)
        goto exit;
    if (!PyType_Check(tensor)) {
        PyErr_SetString(PyExc_TypeError, "yolov9c._C: torch.Tensor is not a type");
        goto exit;
    }
    for (int i = 0; i < YV_NUM_DTYPES; i++) {
        /* torch names its dtypes as DTYPE_NAMES does (torch.float32, ..., torch.bool) */
        if ((dtypes[i] = PyObject_GetAttrString(torch, DTYPE_NAMES[i])) == NULL)
            goto exit;
    }
    for (int i = 0; i < 8; i++) {
        if ((names[i] = PyUnicode_InternFromString(TORCH_NAMES[i])) == NULL)
            goto exit;
    }
    /* every lookup succeeded: the references move into torch_api for good */
    torch_api.tensor = (PyTypeObject *)tensor;
    memcpy(torch_api.dtypes, dtypes, sizeof(dtypes));
    torch_api.dtype = names[0];
    torch_api.shape = names[1];
    torch_api.stride = names[2];
    torch_api.data_ptr = names[3];
    torch_api.is_cuda = names[4];
    torch_api.is_cpu = names[5];
    torch_api.get_device = names[6];
    torch_api.device = names[7];
    tensor = NULL;
    memset(dtypes, 0, sizeof(dtypes));
    memset(names, 0, sizeof(names));
    status = 1;
exit:
    for (int i = 0; i < 8; i++)
        Py_XDECREF(names[i]);
    for (int i = 0; i < YV_NUM_DTYPES; i++)
        Py_XDECREF(dtypes[i]);
    Py_XDECREF(tensor);
    Py_XDECREF(torch);
    return status;
}

static int is_torch_tensor(PyObject *obj)
{
    return torch_api.tensor != NULL && PyObject_TypeCheck(obj, torch_api.tensor);
}

/* The int a method of obj returns (data_ptr(), get_device()); -1 with an exception. */
static int call_for_int(PyObject *obj, PyObject *name, const yv_tensor *t, unsigned long long *out)
{
    PyObject *r = PyObject_CallMethodNoArgs(obj, name);
    if (r == NULL)
        return -1;
    if (!PyLong_Check(r)) {
        PyErr_Format(PyExc_TypeError, "%s: %s.%U() returned %.50s, not an int", t->op, t->arg, name,
                     Py_TYPE(r)->tp_name);
        Py_DECREF(r);
        return -1;
    }
    *out = PyLong_AsUnsignedLongLong(r);
    Py_DECREF(r);
    return PyErr_Occurred() ? -1 : 0;
}

/* obj.<name> is True: 1, 0 or -1 with an exception. */
static int attr_is_true(PyObject *obj, PyObject *name)
{
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL)
        return -1;
    int r = PyObject_IsTrue(v);
    Py_DECREF(v);
    return r;
}

/* A CPU tensor fills t as its NumPy view would (its memory, element strides, YV_CPU); a CUDA tensor as its
 * descriptor would. Torch tensors are always in native byte order and writeable. */
static int parse_torch(PyObject *obj, yv_tensor *t)
{
    /* The device first: a tensor elsewhere (meta, ...) has no memory to read. */
    int cuda = attr_is_true(obj, torch_api.is_cuda);
    if (cuda < 0)
        return -1;
    if (cuda) {
        unsigned long long index;
        if (call_for_int(obj, torch_api.get_device, t, &index) < 0)
            return -1;
        if (index > INT32_MAX) {
            PyErr_Format(PyExc_ValueError, "%s: %s has CUDA device index %llu", t->op, t->arg, index);
            return -1;
        }
        t->device = (int)index;
    } else {
        int cpu = attr_is_true(obj, torch_api.is_cpu);
        if (cpu < 0)
            return -1;
        if (!cpu) {
            PyObject *device = PyObject_GetAttr(obj, torch_api.device);
            if (device != NULL) {
                PyErr_Format(PyExc_ValueError, "%s: %s is on %S; yolov9c._C takes CPU or CUDA tensors",
                             t->op, t->arg, device);
                Py_DECREF(device);
            }
            return -1;
        }
        t->device = YV_CPU;
    }
    PyObject *dtype = PyObject_GetAttr(obj, torch_api.dtype);
    if (dtype == NULL)
        return -1;
    int code = -1;
    for (int i = 0; i < YV_NUM_DTYPES && code < 0; i++)
        code = dtype == torch_api.dtypes[i] ? i : -1;
    if (code < 0) {
        PyErr_Format(PyExc_TypeError, "%s: %s has torch dtype %S, which no op accepts", t->op, t->arg, dtype);
        Py_DECREF(dtype);
        return -1;
    }
    Py_DECREF(dtype);
    t->dtype = (yv_dtype)code;

    PyObject *shape = PyObject_GetAttr(obj, torch_api.shape);   /* a torch.Size: a tuple */
    if (shape == NULL)
        return -1;
    Py_ssize_t ndim = PyTuple_Check(shape) ? PyTuple_GET_SIZE(shape) : 0;
    if (ndim > YV_MAX_DIMS) {
        PyErr_Format(PyExc_ValueError, "%s: %s has %zd dimensions, at most %d are supported",
                     t->op, t->arg, ndim, YV_MAX_DIMS);
        Py_DECREF(shape);
        return -1;
    }
    t->ndim = (int)ndim;
    int bad = int_tuple(shape, t->shape, ndim, t, "tensor's shape");
    Py_DECREF(shape);
    if (bad < 0)
        return -1;
    PyObject *strides = PyObject_CallMethodNoArgs(obj, torch_api.stride);   /* a tuple, in elements */
    if (strides == NULL)
        return -1;
    bad = int_tuple(strides, t->strides, ndim, t, "tensor's stride()");
    Py_DECREF(strides);
    if (bad < 0)
        return -1;
    unsigned long long addr;
    if (call_for_int(obj, torch_api.data_ptr, t, &addr) < 0)
        return -1;
    t->data = (void *)(uintptr_t)addr;
    return finish_pointer(t);
}

int yv_tensor_parse(PyObject *obj, const char *op, const char *arg, int writable, yv_tensor *t)
{
    memset(t, 0, sizeof(*t));
    t->op = op;
    t->arg = arg;
    if (is_torch_tensor(obj))   /* the ops' own path: first */
        return parse_torch(obj, t);
    if (PyArray_Check(obj))
        return parse_numpy((PyArrayObject *)obj, writable, t);
    if (PyTuple_Check(obj))
        return parse_descriptor(obj, t);
    int torch = load_torch();
    if (torch < 0)
        return -1;
    if (torch && is_torch_tensor(obj))
        return parse_torch(obj, t);
    PyErr_Format(PyExc_TypeError, "%s: %s must be a torch.Tensor (CPU or CUDA), a NumPy array or a CUDA tensor "
                 "descriptor tuple, got %.80s", op, arg, Py_TYPE(obj)->tp_name);
    return -1;
}

int yv_tensor_parse_optional(PyObject *obj, const char *op, const char *arg, int writable, yv_tensor *t)
{
    if (obj == Py_None) {
        memset(t, 0, sizeof(*t));
        t->op = op;
        t->arg = arg;
        t->ndim = -1;
        t->device = YV_CPU;
        return 0;
    }
    return yv_tensor_parse(obj, op, arg, writable, t);
}

static void format_shape(const yv_tensor *t, char *buf, size_t len)
{
    size_t used = (size_t)PyOS_snprintf(buf, len, "(");
    for (int d = 0; d < t->ndim && used < len; d++)
        used += (size_t)PyOS_snprintf(buf + used, len - used, d ? ", %lld" : "%lld", (long long)t->shape[d]);
    if (used < len)
        PyOS_snprintf(buf + used, len - used, t->ndim == 1 ? ",)" : ")");
}

int yv_check_ndim(const yv_tensor *t, int ndim)
{
    if (t->ndim == ndim)
        return 0;
    char shape[160];
    format_shape(t, shape, sizeof(shape));
    PyErr_Format(PyExc_ValueError, "%s: %s must have %d dimension%s, got %d (shape %s)",
                 t->op, t->arg, ndim, ndim == 1 ? "" : "s", t->ndim, shape);
    return -1;
}

int yv_check_dim(const yv_tensor *t, int dim, int64_t size)
{
    if (dim < t->ndim && t->shape[dim] == size)
        return 0;
    char shape[160];
    format_shape(t, shape, sizeof(shape));
    PyErr_Format(PyExc_ValueError, "%s: %s must have size %lld in dimension %d, got shape %s",
                 t->op, t->arg, (long long)size, dim, shape);
    return -1;
}

int yv_check_dtype(const yv_tensor *t, unsigned allowed)
{
    if (allowed & YV_DT(t->dtype))
        return 0;
    char names[200];
    size_t used = 0;
    names[0] = '\0';
    for (int i = 0; i < YV_NUM_DTYPES && used < sizeof(names); i++) {
        if (allowed & YV_DT(i))
            used += (size_t)PyOS_snprintf(names + used, sizeof(names) - used, used ? ", %s" : "%s",
                                          DTYPE_NAMES[i]);
    }
    PyErr_Format(PyExc_TypeError, "%s: %s must be %s, got %s", t->op, t->arg, names, yv_dtype_name(t->dtype));
    return -1;
}

int yv_check_contiguous(const yv_tensor *t)
{
    if (t->numel == 0)   /* no element is ever addressed */
        return 0;
    int64_t expect = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        /* A dimension of size 1 can have any stride without changing the layout. */
        if (t->shape[d] != 1 && t->strides[d] != expect) {
            PyErr_Format(PyExc_ValueError, "%s: %s must be contiguous (row-major); it has stride %lld in "
                         "dimension %d where %lld is needed (call .contiguous())",
                         t->op, t->arg, (long long)t->strides[d], d, (long long)expect);
            return -1;
        }
        expect *= t->shape[d];
    }
    return 0;
}

int yv_check_same_shape(const yv_tensor *t, const yv_tensor *ref)
{
    int same = t->ndim == ref->ndim;
    for (int d = 0; same && d < t->ndim; d++)
        same = t->shape[d] == ref->shape[d];
    if (same)
        return 0;
    char want[160], got[160];
    format_shape(ref, want, sizeof(want));
    format_shape(t, got, sizeof(got));
    PyErr_Format(PyExc_ValueError, "%s: %s must have the shape of %s %s, got %s", t->op, t->arg, ref->arg, want,
                 got);
    return -1;
}

int yv_check_same_dtype(const yv_tensor *t, const yv_tensor *ref)
{
    if (t->dtype == ref->dtype)
        return 0;
    PyErr_Format(PyExc_TypeError, "%s: %s must have the dtype of %s (%s), got %s", t->op, t->arg, ref->arg,
                 yv_dtype_name(ref->dtype), yv_dtype_name(t->dtype));
    return -1;
}

static void device_name(int device, char *buf, size_t len)
{
    if (device == YV_CPU)
        PyOS_snprintf(buf, len, "cpu");
    else
        PyOS_snprintf(buf, len, "cuda:%d", device);
}

int yv_check_same_device(const yv_tensor *t, const yv_tensor *ref)
{
    if (t->device == ref->device)
        return 0;
    char a[32], b[32];
    device_name(t->device, a, sizeof(a));
    device_name(ref->device, b, sizeof(b));
    PyErr_Format(PyExc_ValueError, "%s: %s is on %s but %s is on %s; all tensors must be on one device",
                 t->op, t->arg, a, ref->arg, b);
    return -1;
}

int yv_check_alignment(const yv_tensor *t, size_t bytes)
{
    if (bytes <= 1 || ((uintptr_t)t->data % bytes) == 0)
        return 0;
    PyErr_Format(PyExc_ValueError, "%s: %s data pointer is not aligned to %zu bytes", t->op, t->arg, bytes);
    return -1;
}

int yv_parse_stream(PyObject *obj, const char *op, uintptr_t *stream)
{
    if (!PyLong_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s: stream must be an int (a CUDA stream handle, 0 for CPU), got %.80s",
                     op, Py_TYPE(obj)->tp_name);
        return -1;
    }
    unsigned long long v = PyLong_AsUnsignedLongLong(obj);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s: stream must be a non-negative handle", op);
        return -1;
    }
    *stream = (uintptr_t)v;
    return 0;
}

int yv_parse_finite(PyObject *obj, const char *op, const char *arg, double *out)
{
    if (PyBool_Check(obj) || !(PyFloat_Check(obj) || PyLong_Check(obj))) {
        PyErr_Format(PyExc_TypeError, "%s: %s must be a float, got %.80s", op, arg, Py_TYPE(obj)->tp_name);
        return -1;
    }
    double v = PyFloat_AsDouble(obj);
    if (v == -1.0 && PyErr_Occurred())
        return -1;
    if (!isfinite(v)) {
        PyErr_Format(PyExc_ValueError, "%s: %s must be finite, got %R", op, arg, obj);
        return -1;
    }
    *out = v;
    return 0;
}
