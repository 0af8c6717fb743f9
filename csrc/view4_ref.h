/* view4_ref.h — element access to a host yv_view4 (kernels/bn_silu.h) for the plain-C references: float32
 * values in and out whatever the storage dtype (float16 / bfloat16 rounded to nearest even on store).
 * Used by csrc/bn_silu_ref.c and csrc/pool_ref.c.
 */
#ifndef YV_VIEW4_REF_H
#define YV_VIEW4_REF_H

#include <stdint.h>

#include "bn_silu.h"
#include "half.h"

static inline float yv_view_load(const yv_view4 *v, int64_t off)
{
    if (v->dtype == YV_FLOAT16)
        return yv_half_to_float(((const uint16_t *)v->data)[off]);
    if (v->dtype == YV_BFLOAT16)
        return yv_bfloat16_to_float(((const uint16_t *)v->data)[off]);
    return ((const float *)v->data)[off];
}

static inline void yv_view_store(const yv_view4 *v, int64_t off, float x)
{
    if (v->dtype == YV_FLOAT16)
        ((uint16_t *)v->data)[off] = yv_float_to_half(x);
    else if (v->dtype == YV_BFLOAT16)
        ((uint16_t *)v->data)[off] = yv_float_to_bfloat16(x);
    else
        ((float *)v->data)[off] = x;
}

#endif
