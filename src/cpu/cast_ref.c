/* The scalar reference conversion kernel: one element at a time through the format traits.
 * It is the golden model every fast path is compared against. */
#include "core/philox.h"
#include "cpu.h"

static float load_elem(const void *src, lowp_format f, size_t i) {
    switch (f) {
    case LOWP_FORMAT_F32: return ((const float *) src)[i];
    case LOWP_FORMAT_BF16:
    case LOWP_FORMAT_F16: {
        const lowp_format_traits *t;
        lowp_format_get(f, &t);
        return t->decode(((const uint16_t *) src)[i]);
    }
    case LOWP_FORMAT_E2M1: {
        const lowp_format_traits *t;
        lowp_format_get(f, &t);
        return t->decode((((const uint8_t *) src)[i / 2] >> (4 * (i & 1))) & 0xF);
    }
    default: {
        const lowp_format_traits *t;
        lowp_format_get(f, &t);
        return t->decode(((const uint8_t *) src)[i]);
    }
    }
}

static void store_code(void *dst, lowp_format f, size_t i, uint32_t code) {
    switch (f) {
    case LOWP_FORMAT_F32: ((uint32_t *) dst)[i] = code; break;
    case LOWP_FORMAT_BF16:
    case LOWP_FORMAT_F16: ((uint16_t *) dst)[i] = (uint16_t) code; break;
    case LOWP_FORMAT_E2M1: {
        /* Elements are stored in ascending order: an even one sets its byte (so the pad
         * nibble after an odd-length row is 0), an odd one adds the high nibble. */
        uint8_t *b = (uint8_t *) dst + i / 2;
        if ((i & 1) == 0)
            *b = (uint8_t) (code & 0xF);
        else
            *b = (uint8_t) ((*b & 0xF) | ((code & 0xF) << 4));
        break;
    }
    default: ((uint8_t *) dst)[i] = (uint8_t) code; break;
    }
}

void lowp_cpu_cast_ref(const lowp_cast_piece *p) {
    const lowp_format_traits *dt;
    lowp_format_get(p->dst_format, &dt);
    const lowp_cast_cfg *cfg = p->cfg;
    int sr = cfg->rounding == LOWP_ROUNDING_SR;
    for (size_t i = 0; i < p->n; i++) {
        float x = load_elem(p->src, p->src_format, i);
        uint32_t code;
        if (sr)
            code = dt->encode_sr(x, lowp_philox_word(cfg->seed, cfg->offset + p->idx + i),
                                 cfg->overflow);
        else
            code = dt->encode(x, cfg->overflow);
        store_code(p->dst, p->dst_format, i, code);
    }
}
