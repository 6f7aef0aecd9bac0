/* libFuzzer harness: the checkpoint manifest parser and the shard-header check.

   Input: 4 bytes little-endian L, then L bytes of manifest, then the rest as the start of
   rank 0's shard file. The harness rewrites the trailing checksums (the manifest's, and the
   shard header's, which it also records as the manifest's header checksum) so that the
   fuzzer gets past them into the parsers; the checksum checks themselves are covered by
   tests/test_checkpoint.c. Build and run: make fuzz. */
#define ZERO_IMPLEMENTATION
#include "zero.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    zero_checkpoint *ck = NULL;
    unsigned char *man;
    size_t L;
    uint32_t c;
    if (size < 4) return 0;
    L = (size_t)data[0] | (size_t)data[1] << 8 | (size_t)data[2] << 16 | (size_t)data[3] << 24;
    if (L > size - 4 || L < 4) return 0;
    man = (unsigned char *)malloc(L);
    if (!man) return 0;
    memcpy(man, data + 4, L);
    c = zero_crc32c(0, man, L - 4);
    man[L - 4] = (unsigned char)c;
    man[L - 3] = (unsigned char)(c >> 8);
    man[L - 2] = (unsigned char)(c >> 16);
    man[L - 1] = (unsigned char)(c >> 24);
    if (zero__ck_parse_manifest(man, L, "fuzz.manifest", &ck) == ZERO_OK) {
        size_t rest = size - 4 - L;
        if (rest >= ck->header_bytes && ck->header_bytes >= 4) {
            unsigned char *h = (unsigned char *)malloc((size_t)ck->header_bytes);
            uint32_t *crcs = NULL;
            if (h) {
                memcpy(h, data + 4 + L, (size_t)ck->header_bytes);
                c = zero_crc32c(0, h, (size_t)ck->header_bytes - 4);
                memcpy(h + ck->header_bytes - 4, &c, 4);
                ck->file_hcrc[0] = c;
                if (zero__ck_check_shard_header(ck, h, "fuzz.shard", 0, &crcs) == ZERO_OK)
                    free(crcs);
                free(h);
            }
        }
        zero_checkpoint_close(ck);
    }
    free(man);
    return 0;
}
