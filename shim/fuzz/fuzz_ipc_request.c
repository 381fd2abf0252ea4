/* libFuzzer target: the request an IPC exporter reads (make fuzz-ipc). */
#include <stddef.h>
#include <stdint.h>

int ps_ipc_fuzz_request(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return ps_ipc_fuzz_request(data, size); }
