/* poolshim's public API: what a program (or a benchmark) can call when
 * libpoolshim.so is loaded, usually found with dlsym(RTLD_DEFAULT, ...).
 * Unmodified programs need none of it. Return rule: 0 on success, a
 * negative code otherwise (-1 out of memory, -2 invalid argument,
 * -6 the shim is not active). */
#ifndef POOLSHIM_H
#define POOLSHIM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when the shim interposes allocations, 0 in passthrough mode. */
int poolshim_active(void);
/* Allocates from the current device's stack, like cudaMalloc (stream
 * UINTPTR_MAX) or cudaMallocAsync (stream = the cudaStream_t), without the
 * hooks' overhead. */
int poolshim_allocate(void **ptr, size_t size, uintptr_t stream);
/* Frees a pointer from poolshim_allocate or an intercepted allocation. */
int poolshim_deallocate(void *ptr, uintptr_t stream);
/* Flushes the event logs to their files. */
int poolshim_flush(void);
/* The statistics as of now: the JSON object that POOLSHIM_STATS=json writes
 * at exit (the same keys; the CUDA time by kind, requested bytes and call
 * times only with statistics on), NUL-terminated into buf, at most size
 * bytes with the NUL. Returns the object's length without the NUL, as
 * snprintf does: a result >= size means it was cut (call again with a buffer
 * of result + 1 bytes; buf NULL and size 0 ask for the length alone), -1
 * when memory for it ran out. A loop can read it between steps: it takes
 * each stack's lock for a moment and makes no CUDA call. */
long poolshim_stats_json(char *buf, size_t size);
/* The version of this libpoolshim.so, e.g. "0.9.0" (semantic versioning);
 * a static string, valid whether or not the shim is active. */
const char *poolshim_version(void);

#ifdef __cplusplus
}
#endif
#endif
