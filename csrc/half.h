/* half.h — float16 and bfloat16 to and from float32 in plain C. Widening is exact (every half and bfloat16 is
 * a float); narrowing rounds to nearest, ties to even, as torch's .half() / .bfloat16() and CUDA's
 * __float2half_rn / __float2bfloat16_rn do (overflow to inf, NaN stays NaN).
 * Test: tests/ops/test_nms.py runs float16 inputs through the C path against the torch reference.
 */
#ifndef YV_HALF_H
#define YV_HALF_H

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline float yv_bits_to_float(uint32_t bits)
{
    float f;
    memcpy(&f, &bits, sizeof(f));
    return f;
}

static inline float yv_half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0) {
        /* zero or subnormal: man * 2^-24, exact in float */
        float mag = ldexpf((float)man, -24);
        return sign ? -mag : mag;
    }
    if (exp == 31)   /* inf / NaN (payload kept) */
        return yv_bits_to_float(sign | 0x7f800000u | (man << 13));
    return yv_bits_to_float(sign | ((exp + 112u) << 23) | (man << 13));   /* rebias 15 -> 127 */
}

static inline float yv_bfloat16_to_float(uint16_t b)
{
    return yv_bits_to_float((uint32_t)b << 16);
}

static inline uint16_t yv_float_to_half(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof(x));
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u)                  /* NaN: a quiet NaN of the same sign */
        return (uint16_t)(sign | 0x7e00u);
    if (ax >= 0x477ff000u)                 /* >= 65520 rounds to inf (65504 is the largest half) */
        return (uint16_t)(sign | 0x7c00u);
    if (ax < 0x38800000u) {                /* below 2^-14: a subnormal half (or the smallest normal) */
        float a;
        memcpy(&a, &ax, sizeof(a));
        /* a * 2^24 is exact; rintf rounds ties to even in the default rounding mode. */
        return (uint16_t)(sign | (uint16_t)rintf(a * 16777216.0f));
    }
    uint32_t h = ((ax >> 23) - 112u) << 10 | ((ax >> 13) & 0x3ffu);
    uint32_t rest = ax & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u)))
        h++;                               /* a mantissa carry correctly bumps the exponent */
    return (uint16_t)(sign | h);
}

static inline uint16_t yv_float_to_bfloat16(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof(x));
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

#endif /* YV_HALF_H */
