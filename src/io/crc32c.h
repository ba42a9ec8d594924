/* CRC-32C (Castagnoli, reflected polynomial 0x82F63B78, initial value and final XOR
 * 0xFFFFFFFF: the checksum of iSCSI, ext4 and of "crc32c" libraries; "123456789" gives
 * 0xE3069283). Used by the training checkpoints (src/trainer/checkpoint_check.c). */
#ifndef LOWP_IO_CRC32C_H
#define LOWP_IO_CRC32C_H

#include <stddef.h>
#include <stdint.h>

#include "core/internal.h"

/* The CRC of p[0 .. n-1] continued from `crc` (0 to start): crc32c(crc32c(0, a), b) is the CRC
 * of a followed by b. */
LOWP_HIDDEN uint32_t lowp_crc32c(uint32_t crc, const void *p, size_t n);

#endif
