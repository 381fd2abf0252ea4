/* IPC of pooled memory between processes under the shim (shim/ipc.c):
 * the export table, the service thread, imports. It calls the GPU-ops
 * table it is given, and reads whether exit began (process.h); nothing else of the shim. */
#ifndef PS_SHIM_IPC_H
#define PS_SHIM_IPC_H

#include "common.h"

/* Live exported blocks (ipc.c keeps the count; read through
 * ps_ipc_exporting): the router calls ps_ipc_forget at a free while any is. */
extern atomic_int ps_ipc_exports;
static inline bool ps_ipc_exporting(void) { return atomic_load_explicit(&ps_ipc_exports, memory_order_relaxed) != 0; }
/* Whether the 64 bytes at `handle` are a handle of ours (our magic). */
bool ps_ipc_is_ours(const void *handle);
/* Exports the live block [block, block + size) of the device whose table is
 * `gpu` into the 64 bytes at `handle` (the same handle again for the same
 * block). PS_EUNSUPPORTED: its memory cannot be exported (the caller
 * refuses); PS_EUPSTREAM: the service socket or thread failed (printed). */
int ps_ipc_export(const ps_gpu_ops_t *gpu, uintptr_t block, size_t size, void *handle);
/* The block is being freed: its export, if any, goes (a handle made for it
 * is stale from now on). */
void ps_ipc_forget(uintptr_t block);
/* Opens a handle of ours through `gpu` (NULL: this process cannot import);
 * *out = the exported block mapped here. Errors are printed, naming `api`:
 * PS_EINVAL (damaged, stale, our own), PS_EUNSUPPORTED, PS_EUPSTREAM, PS_ENOMEM. */
int ps_ipc_open(const char *api, const ps_gpu_ops_t *gpu, const void *handle, void **out);
/* cudaIpcCloseMemHandle of `ptr`: false when it is no pointer we opened;
 * else *status PS_OK and one reference goes (the last unmaps). */
bool ps_ipc_close(uintptr_t ptr, int *status);
/* The opened block containing `addr` (cuMemGetAddressRange), if any. */
bool ps_ipc_import_range(uintptr_t addr, uintptr_t *base, size_t *size);
void ps_ipc_atfork_child(void);

#endif
