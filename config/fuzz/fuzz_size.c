/* libFuzzer target: the value parsers (make fuzz-config). */
#include <stddef.h>
#include <stdint.h>

int ps_config_fuzz_size(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return ps_config_fuzz_size(data, size); }
