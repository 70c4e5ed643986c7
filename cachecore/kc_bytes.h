/*
 * kc_bytes.h - little-endian integer encoding shared by the envelope and
 * bundle formats (internal to cachecore). Byte by byte, so the wire formats
 * are the same on every host and unaligned buffers are fine.
 */
#ifndef KC_BYTES_H
#define KC_BYTES_H

#include <stdint.h>

static inline void kc_put_le(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint64_t kc_get_le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static inline void kc_put_u16(uint8_t *p, uint16_t v)
{
    kc_put_le(p, v, 2);
}
static inline void kc_put_u32(uint8_t *p, uint32_t v)
{
    kc_put_le(p, v, 4);
}
static inline void kc_put_u64(uint8_t *p, uint64_t v)
{
    kc_put_le(p, v, 8);
}
static inline uint16_t kc_get_u16(const uint8_t *p)
{
    return (uint16_t)kc_get_le(p, 2);
}
static inline uint32_t kc_get_u32(const uint8_t *p)
{
    return (uint32_t)kc_get_le(p, 4);
}
static inline uint64_t kc_get_u64(const uint8_t *p)
{
    return kc_get_le(p, 8);
}

#endif
