/* bn_silu_ref.c — fused training-mode BatchNorm + SiLU on the CPU, plain loops: batch statistics, forward
 * (bn_silu, bn_silu_add, bn2_silu in one function) and the full BN backward.
 *
 * Maths (the same in kernels/bn_silu.cuh and yolov9c/ops/bn_silu.py; n = B·H·W):
 *   stats     mean = Σz/n, var = Σ(z - mean)²/n (two passes, float64), invstd = 1/sqrt(var + eps);
 *             running_mean = (1-m)·rm + m·mean, running_var = (1-m)·rv + m·var·n/(n-1)
 *   forward   x̂ = (z - mean)·invstd, u = x̂·γ + β [+ x̂2·γ2 + β2], y = act(u) [+ residual]
 *   backward  g = dy·act'(u), act'(u) = s·(1 + u·(1 - s)) with s = sigmoid(u) for SiLU, 1 for identity;
 *             dβ = Σg, dγ = Σg·x̂ (float64 sums);
 *             dz = γ·invstd·(g - Σg/n - x̂·Σ(g·x̂)/n) with batch statistics, γ·invstd·g without
 * Per-element arithmetic is float32 like the kernels; every sum over B·H·W is float64. Loops run channel by
 * channel so no workspace is needed. dz is written (=) or accumulated (+=); dγ, dβ are written.
 * Test: python -m pytest -q tests/ops/test_bn_silu.py
 */
#include <math.h>
#include <stddef.h>

#include "half.h"
#include "view4_ref.h"
#include "yv_refs.h"

static inline void store(const yv_view4 *v, int64_t off, float x, int accumulate)
{
    yv_view_store(v, off, accumulate ? yv_view_load(v, off) + x : x);
}

static inline int64_t offset(const yv_view4 *v, int64_t b, int64_t c, int64_t h, int64_t w)
{
    return b * v->stride[0] + c * v->stride[1] + h * v->stride[2] + w * v->stride[3];
}

static inline float sigmoidf(float u)
{
    return 1.0f / (1.0f + expf(-u));
}

/* u of one element for channel c: u1 (+ u2 when z2 is present); x̂1, x̂2 are returned for the backward. */
static inline float bn_u(const yv_view4 *z1, const yv_bn_params *p1, const yv_view4 *z2, const yv_bn_params *p2,
                         int64_t b, int64_t c, int64_t h, int64_t w, float *xh1, float *xh2)
{
    float x1 = (yv_view_load(z1, offset(z1, b, c, h, w)) - p1->mean[c]) * p1->invstd[c];
    float u = x1 * p1->weight[c] + p1->bias[c];
    *xh1 = x1;
    if (z2->data != NULL) {
        float x2 = (yv_view_load(z2, offset(z2, b, c, h, w)) - p2->mean[c]) * p2->invstd[c];
        u = u + (x2 * p2->weight[c] + p2->bias[c]);
        *xh2 = x2;
    }
    return u;
}

int yv_bn_stats_forward_ref(yv_bn_shape s, yv_view4 z, float *running_mean, float *running_var, double momentum,
                            double eps, float *mean, float *invstd)
{
    int64_t n = s.B * s.H * s.W;
    if (n < 2)
        return -1;
    for (int64_t c = 0; c < s.C; c++) {
        double sum = 0.0, sq = 0.0;
        for (int64_t b = 0; b < s.B; b++)
            for (int64_t h = 0; h < s.H; h++)
                for (int64_t w = 0; w < s.W; w++)
                    sum += yv_view_load(&z, offset(&z, b, c, h, w));
        double m = sum / (double)n;
        for (int64_t b = 0; b < s.B; b++)
            for (int64_t h = 0; h < s.H; h++)
                for (int64_t w = 0; w < s.W; w++) {
                    double d = yv_view_load(&z, offset(&z, b, c, h, w)) - m;
                    sq += d * d;
                }
        double var = sq / (double)n;
        mean[c] = (float)m;
        invstd[c] = (float)(1.0 / sqrt(var + eps));
        if (running_mean != NULL)
            running_mean[c] = (float)((1.0 - momentum) * running_mean[c] + momentum * m);
        if (running_var != NULL)
            running_var[c] = (float)((1.0 - momentum) * running_var[c] + momentum * var * (double)n / (double)(n - 1));
    }
    return 0;
}

int yv_bn_silu_forward_ref(yv_bn_shape s, yv_view4 z1, yv_bn_params p1, yv_view4 z2, yv_bn_params p2,
                           yv_view4 residual, int silu, yv_view4 out)
{
    float xh1, xh2;
    for (int64_t c = 0; c < s.C; c++)
        for (int64_t b = 0; b < s.B; b++)
            for (int64_t h = 0; h < s.H; h++)
                for (int64_t w = 0; w < s.W; w++) {
                    float u = bn_u(&z1, &p1, &z2, &p2, b, c, h, w, &xh1, &xh2);
                    float y = silu ? u * sigmoidf(u) : u;
                    if (residual.data != NULL)
                        y = yv_view_load(&residual, offset(&residual, b, c, h, w)) + y;
                    store(&out, offset(&out, b, c, h, w), y, 0);
                }
    return 0;
}

/* g = dy·act'(u) of one element (also gives x̂1, x̂2). */
static inline float bn_g(const yv_view4 *z1, const yv_bn_params *p1, const yv_view4 *z2, const yv_bn_params *p2,
                         const yv_view4 *gy, int silu, int64_t b, int64_t c, int64_t h, int64_t w, float *xh1,
                         float *xh2)
{
    float u = bn_u(z1, p1, z2, p2, b, c, h, w, xh1, xh2);
    float dy = yv_view_load(gy, offset(gy, b, c, h, w));
    if (!silu)
        return dy;
    float sg = sigmoidf(u);
    return dy * (sg * (1.0f + u * (1.0f - sg)));
}

int yv_bn_silu_backward_ref(yv_bn_shape s, yv_view4 z1, yv_bn_params p1, yv_view4 z2, yv_bn_params p2,
                            yv_view4 grad_out, int silu, int batch_stats, yv_view4 dz1, yv_view4 dz2, int accumulate,
                            float *dweight1, float *dbias1, float *dweight2, float *dbias2)
{
    int64_t n = s.B * s.H * s.W;
    int two = z2.data != NULL;
    float xh1 = 0.0f, xh2 = 0.0f;
    for (int64_t c = 0; c < s.C; c++) {
        double sg = 0.0, sgx1 = 0.0, sgx2 = 0.0;
        for (int64_t b = 0; b < s.B; b++)
            for (int64_t h = 0; h < s.H; h++)
                for (int64_t w = 0; w < s.W; w++) {
                    float g = bn_g(&z1, &p1, &z2, &p2, &grad_out, silu, b, c, h, w, &xh1, &xh2);
                    sg += g;
                    sgx1 += (double)g * xh1;
                    if (two)
                        sgx2 += (double)g * xh2;
                }
        dbias1[c] = (float)sg;
        dweight1[c] = (float)sgx1;
        if (two) {
            dbias2[c] = (float)sg;
            dweight2[c] = (float)sgx2;
        }
        if (dz1.data == NULL && dz2.data == NULL)
            continue;
        /* The statistics' terms, as float32 coefficients like the kernels use them. */
        float k1 = batch_stats ? (float)(sg / (double)n) : 0.0f;
        float k21 = batch_stats ? (float)(sgx1 / (double)n) : 0.0f;
        float k22 = batch_stats ? (float)(sgx2 / (double)n) : 0.0f;
        float a1 = p1.weight[c] * p1.invstd[c];
        float a2 = two ? p2.weight[c] * p2.invstd[c] : 0.0f;
        for (int64_t b = 0; b < s.B; b++)
            for (int64_t h = 0; h < s.H; h++)
                for (int64_t w = 0; w < s.W; w++) {
                    float g = bn_g(&z1, &p1, &z2, &p2, &grad_out, silu, b, c, h, w, &xh1, &xh2);
                    if (dz1.data != NULL)
                        store(&dz1, offset(&dz1, b, c, h, w), a1 * ((g - k1) - xh1 * k21), accumulate);
                    if (two && dz2.data != NULL)
                        store(&dz2, offset(&dz2, b, c, h, w), a2 * ((g - k1) - xh2 * k22), accumulate);
                }
    }
    return 0;
}
