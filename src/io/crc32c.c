/* CRC-32C, table-driven, one byte at a time (crc32c.h). A checkpoint of the small
 * configuration is a few MB: the table version checks it in milliseconds. */
#include "crc32c.h"

static uint32_t g_table[256];
static int g_ready;

static void make_table(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
        g_table[i] = c;
    }
    g_ready = 1;
}

uint32_t lowp_crc32c(uint32_t crc, const void *p, size_t n) {
    /* Racing first calls write the same values: the table is a pure function of its index. */
    if (!g_ready) make_table();
    const unsigned char *b = p;
    crc = ~crc;
    for (size_t i = 0; i < n; i++) crc = g_table[(crc ^ b[i]) & 0xFF] ^ (crc >> 8);
    return ~crc;
}
