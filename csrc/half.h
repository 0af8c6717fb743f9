/* half.h — float16 and bfloat16 to float32 in plain C (exact: every half and bfloat16 is a float), and
 * back with round-to-nearest-even (what torch's .half() / .bfloat16() and CUDA's __float2half_rn do).
 * The CUDA side uses __half2float / __bfloat162float, which give the same values.
 * Test: tests/test_nms.py runs float16 inputs through the C path against the torch reference;
 * tests/test_det_loss.py writes float16 gradients through yv_float_to_half.
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

static inline uint32_t yv_float_to_bits(float f)
{
    uint32_t bits;
    memcpy(&bits, &f, sizeof(bits));
    return bits;
}

/* float32 -> float16, round to nearest even; overflow gives inf, NaN stays NaN (quiet). */
static inline uint16_t yv_float_to_half(float f)
{
    uint32_t x = yv_float_to_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u)   /* inf / NaN */
        return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u | ((ax >> 13) & 0x3ffu) : 0u));
    if (ax >= 0x477ff000u)   /* >= 65520: rounds past the largest half, 65504 */
        return (uint16_t)(sign | 0x7c00u);
    if (ax < 0x38800000u) {  /* below 2^-14: a subnormal half (or zero), i.e. a multiple of 2^-24 */
        /* v * 2^24 is exact; nearbyintf rounds half to even in the default rounding mode. */
        float v = yv_bits_to_float(ax) * 16777216.0f;
        return (uint16_t)(sign | (uint16_t)nearbyintf(v));
    }
    uint32_t h = (ax - 0x38000000u) >> 13;   /* rebias 127 -> 15, keep 10 mantissa bits */
    uint32_t rest = ax & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u)))
        h++;   /* a carry into the exponent is the correct rounding up */
    return (uint16_t)(sign | h);
}

/* float32 -> bfloat16, round to nearest even; NaN stays NaN (quiet). */
static inline uint16_t yv_float_to_bfloat16(float f)
{
    uint32_t x = yv_float_to_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

#endif /* YV_HALF_H */
