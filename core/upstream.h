/* Upstream resources: the bottom of every stack. Each one takes memory
 * straight from the device through the GPU-ops table (core/gpu_ops.h):
 *   cuda     mem_alloc / mem_free          (cuMemAlloc_v2, the real one)
 *   async    mem_alloc_async / free_async  (CUDA's own stream-ordered pool)
 *   managed  mem_alloc_managed / mem_free  (cuMemAllocManaged)
 *   host     host_alloc / host_free        (cuMemHostAlloc: pinned host memory)
 * They cache nothing: every allocate is one upstream call. The `cuda`
 * upstream over tools/sim/fake_gpu.c is the host-memory upstream of the tests.
 */
#ifndef PS_UPSTREAM_H
#define PS_UPSTREAM_H

#include "gpu_ops.h"
#include "resource.h"

int ps_cuda_resource_create(const char *name, const ps_gpu_ops_t *gpu, ps_resource_t **out);

/* release_threshold: bytes CUDA's pool keeps cached (UINT64_MAX = keep all). */
int ps_async_resource_create(const char *name, const ps_gpu_ops_t *gpu,
                             uint64_t release_threshold, ps_resource_t **out);

int ps_managed_resource_create(const char *name, const ps_gpu_ops_t *gpu, ps_resource_t **out);

/* Frees every allocation still live in an async upstream (stream-ordered
 * on the legacy stream) and forgets it; returns how many. Used before a
 * context reset: memory of a CUDA memory pool is not freed by
 * cuDevicePrimaryCtxReset (measured: +2.7 MiB per reset; JuliaGPU/CUDA.jl
 * #1579 saw the same). Any other resource: 0, nothing changes. */
size_t ps_upstream_release_all(ps_resource_t *r);

/* Pinned host memory: every allocation is one host_alloc with `flags`
 * (PS_HOST_ALLOC_*); the upstream of the pinned host pool. */
int ps_host_resource_create(const char *name, const ps_gpu_ops_t *gpu, unsigned flags, ps_resource_t **out);

#endif
