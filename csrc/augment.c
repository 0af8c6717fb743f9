/* augment.c — binding of the augment op: augment_forward (one training batch's pixels from a host-drawn plan).
 *
 * Checks every argument (ValueError/TypeError naming "augment_forward" and the argument), then releases the
 * GIL and runs csrc/augment_ref.c (CPU, which also checks that every tile reads inside src and every paste list
 * fits its row) or
 * kernels/augment.cu (CUDA, on the caller's stream; a bad tile reads grey there, never out of bounds).
 * The Python entry point is yolov9c/ops/augment.py; the maths is at the top of kernels/augment_pixel.h.
 * Test: python -m pytest -q tests/ops/test_augment.py
 */
#include "augment_pixel.h"
#include "module.h"
#include "tensor.h"
#include "yv_refs.h"
#ifdef YV_WITH_CUDA
#include "yv_kernels.h"
#endif

#define OP "augment_forward"

typedef struct augment_call {
    uint8_t *out;
    int64_t B, H, W;
    const uint8_t *src;
    int64_t src_n;
    const int64_t *tiles;
    const float *warp, *mix;
    const int64_t *flags;
    const uint8_t *luts;
    const int32_t *paste;
    int64_t L;
} augment_call;

static int augment_cpu(void *p)
{
    augment_call *c = (augment_call *)p;
    return yv_augment_forward_ref(c->out, c->B, c->H, c->W, c->src, c->src_n, c->tiles, c->warp, c->mix, c->flags,
                                  c->luts, c->paste, c->L);
}

#ifdef YV_WITH_CUDA
static int augment_cuda(void *p, void *stream)
{
    augment_call *c = (augment_call *)p;
    return (int)yv_augment_forward(c->out, c->B, c->H, c->W, c->src, c->src_n, c->tiles, c->warp, c->mix, c->flags,
                                   c->luts, c->paste, c->L, (cudaStream_t)stream);
}
#endif

static const yv_op AUGMENT = {OP, augment_cpu, YV_CUDA_FN(augment_cuda),
                              "a layer count is not 1 or 2, a tile reads outside src or outside its image, or a "
                              "paste list does not fit its row"};

/* A plan array: `dtype`, contiguous, on out's device, shape (B, d1[, d2[, d3]]) (0 ends the list). */
static int check_plan(const yv_tensor *t, const yv_tensor *out, yv_dtype dtype, int64_t d1, int64_t d2,
                      int64_t d3)
{
    int nd = 2 + (d2 > 0) + (d3 > 0);
    if (yv_check_ndim(t, nd) < 0 || yv_check_dim(t, 0, out->shape[0]) < 0 || yv_check_dim(t, 1, d1) < 0
        || (d2 > 0 && yv_check_dim(t, 2, d2) < 0) || (d3 > 0 && yv_check_dim(t, 3, d3) < 0)
        || yv_check_dtype(t, YV_DT(dtype)) < 0 || yv_check_same_device(t, out) < 0 || yv_check_contiguous(t) < 0)
        return -1;
    return 0;
}

PyObject *yv_py_augment_forward(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    yv_tensor out, src, tiles, warp, mix, flags, luts, paste;
    uintptr_t stream = 0;

    if (yv_check_nargs(OP, nargs, 9) < 0)
        return NULL;
    if (yv_tensor_parse(args[0], OP, "out", 1, &out) < 0 || yv_tensor_parse(args[1], OP, "src", 0, &src) < 0
        || yv_tensor_parse(args[2], OP, "tiles", 0, &tiles) < 0 || yv_tensor_parse(args[3], OP, "warp", 0, &warp) < 0
        || yv_tensor_parse(args[4], OP, "mix", 0, &mix) < 0 || yv_tensor_parse(args[5], OP, "flags", 0, &flags) < 0
        || yv_tensor_parse(args[6], OP, "luts", 0, &luts) < 0 || yv_tensor_parse(args[7], OP, "paste", 0, &paste) < 0
        || yv_parse_stream(args[8], OP, &stream) < 0)
        return NULL;
    if (yv_check_ndim(&out, 4) < 0 || yv_check_dim(&out, 1, 3) < 0 || yv_check_dtype(&out, YV_DT(YV_UINT8)) < 0
        || yv_check_contiguous(&out) < 0)
        return NULL;
    if (yv_check_ndim(&src, 1) < 0 || yv_check_dtype(&src, YV_DT(YV_UINT8)) < 0
        || yv_check_same_device(&src, &out) < 0 || yv_check_contiguous(&src) < 0)
        return NULL;
    if (check_plan(&tiles, &out, YV_INT64, 2, 4, 9) < 0 || check_plan(&warp, &out, YV_FLOAT32, 2, 9, 0) < 0
        || check_plan(&mix, &out, YV_FLOAT32, 2, 0, 0) < 0 || check_plan(&flags, &out, YV_INT64, 4, 0, 0) < 0
        || check_plan(&luts, &out, YV_UINT8, 3, 256, 0) < 0 || yv_check_ndim(&paste, 3) < 0)
        return NULL;
    if (paste.shape[2] < YA_PASTE_HEAD) {
        PyErr_Format(PyExc_ValueError, "%s: paste rows hold %lld values, at least %d needed (polygon count, mirror)",
                     OP, (long long)paste.shape[2], YA_PASTE_HEAD);
        return NULL;
    }
    if (check_plan(&paste, &out, YV_INT32, 2, paste.shape[2], 0) < 0)
        return NULL;
    if (out.shape[2] > (1 << 18) || out.shape[3] > (1 << 18)) { /* the kernel's grid: H*W/256 blocks */
        PyErr_Format(PyExc_ValueError, "%s: out is %lld x %lld pixels, at most 2^18 a side", OP,
                     (long long)out.shape[2], (long long)out.shape[3]);
        return NULL;
    }
#ifndef YV_WITH_CUDA
    if (out.device != YV_CPU)
        return yv_no_cuda_error(OP);
#endif
    augment_call c = {(uint8_t *)out.data, out.shape[0], out.shape[2], out.shape[3], (const uint8_t *)src.data,
                      src.numel, (const int64_t *)tiles.data, (const float *)warp.data, (const float *)mix.data,
                      (const int64_t *)flags.data, (const uint8_t *)luts.data, (const int32_t *)paste.data,
                      paste.shape[2]};
    if (out.numel == 0)
        Py_RETURN_NONE;
    return yv_launch(module, &AUGMENT, out.device, stream, &c);
}
