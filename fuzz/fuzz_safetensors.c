/* libFuzzer harness: the safetensors header parser (JSON, dtypes, shapes, offsets tiling
   the data). Input: a whole .safetensors file. Build and run: make fuzz. */
#define ZERO_IMPLEMENTATION
#include "zero.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    zero__st_file f;
    uint64_t hn = 0;
    int i;
    if (size < 8) return 0;
    for (i = 0; i < 8; i++) hn |= (uint64_t)data[i] << (8 * i);
    if (hn > size - 8) return 0;
    if (zero__st_parse(data + 8, (size_t)hn, (uint64_t)(size - 8 - hn), "fuzz.safetensors", &f) == ZERO_OK)
        zero__st_free(&f);
    return 0;
}
