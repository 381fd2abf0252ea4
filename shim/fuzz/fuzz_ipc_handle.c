/* libFuzzer target: the IPC handle and the replies an importer checks (make fuzz-ipc). */
#include <stddef.h>
#include <stdint.h>

int ps_ipc_fuzz_handle(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return ps_ipc_fuzz_handle(data, size); }
