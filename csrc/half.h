/* half.h — float16 and bfloat16 to float32 in plain C (exact: every half and bfloat16 is a float).
 * The CUDA side uses __half2float / __bfloat162float, which give the same values.
 * Test: tests/test_nms.py runs float16 inputs through the C path against the torch reference.
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

#endif /* YV_HALF_H */
