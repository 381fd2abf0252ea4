/* Host virtual memory for the pinned pool's expandable range
 * (core/host_vm.h).
 *
 * Algorithm
 *  1. create: copy nothing from the device table but its pointer; the
 *     new table's ctx is this module's state, and each forwarded entry
 *     calls the device's entry with the device's ctx.
 *  2. vm_granularity: the device's host granularity (the pool rounds its
 *     pieces up to it).
 *  3. vm_reserve / vm_release: the device's (address space is address
 *     space: the same cuMemAddressReserve serves host and device pieces).
 *  4. vm_map(addr, size): the device's host_vm_map (physical memory on the
 *     host, mapped, host and devices granted access); nothing is left on
 *     error.
 *  5. vm_unmap: the device's vm_unmap (unmap, release the memory).
 * Guarantees: a piece is page-locked host memory exactly while it is
 * mapped; nothing outside a mapped piece is accessible; the module keeps
 * no per-piece state (core/vm_range.c does).
 */
#include "host_vm.h"

#include <stdlib.h>

typedef struct host_vm {
    ps_gpu_ops_t ops;            /* the table handed out (ops.ctx points here) */
    const ps_gpu_ops_t *device;  /* the device's table: fences, address space, host pieces */
    size_t granularity;          /* smallest piece: the device's host granularity */
} host_vm_t;

static const ps_gpu_ops_t *dev_of(void *ctx)
{
    return ((host_vm_t *)ctx)->device;
}

static int fwd_mem_get_info(void *ctx, size_t *free_bytes, size_t *total_bytes)
{
    const ps_gpu_ops_t *d = dev_of(ctx);
    return d->mem_get_info ? d->mem_get_info(d->ctx, free_bytes, total_bytes) : PS_EUNSUPPORTED;
}
static int fwd_fence_record(void *ctx, ps_stream_t stream, ps_fence_t **out)
{
    const ps_gpu_ops_t *d = dev_of(ctx);
    return d->fence_record(d->ctx, stream, out);
}
static int fwd_fence_query(void *ctx, ps_fence_t *fence)
{
    const ps_gpu_ops_t *d = dev_of(ctx);
    return d->fence_query(d->ctx, fence);
}
static int fwd_fence_wait(void *ctx, ps_fence_t *fence)
{
    const ps_gpu_ops_t *d = dev_of(ctx);
    return d->fence_wait(d->ctx, fence);
}
static void fwd_fence_release(void *ctx, ps_fence_t *fence)
{
    const ps_gpu_ops_t *d = dev_of(ctx);
    d->fence_release(d->ctx, fence);
}
static int fwd_stream_wait_fence(void *ctx, ps_stream_t stream, ps_fence_t *fence)
{
    const ps_gpu_ops_t *d = dev_of(ctx);
    return d->stream_wait_fence(d->ctx, stream, fence);
}
static int fwd_device_synchronize(void *ctx)
{
    const ps_gpu_ops_t *d = dev_of(ctx);
    return d->device_synchronize(d->ctx);
}
static int fwd_barrier(void *ctx)
{
    const ps_gpu_ops_t *d = dev_of(ctx);
    return d->barrier(d->ctx);
}

static size_t vm_granularity(void *ctx)
{
    return ((host_vm_t *)ctx)->granularity;
}

static int vm_reserve(void *ctx, size_t size, void **out)
{
    const ps_gpu_ops_t *d = dev_of(ctx);
    return d->vm_reserve(d->ctx, size, out);
}

static void vm_release(void *ctx, void *addr, size_t size)
{
    const ps_gpu_ops_t *d = dev_of(ctx);
    d->vm_release(d->ctx, addr, size);
}

static int vm_map(void *ctx, void *addr, size_t size, uint64_t *handle)
{
    const ps_gpu_ops_t *d = dev_of(ctx);
    return d->host_vm_map(d->ctx, addr, size, handle);
}

static int vm_unmap(void *ctx, void *addr, size_t size, uint64_t handle)
{
    const ps_gpu_ops_t *d = dev_of(ctx);
    return d->vm_unmap(d->ctx, addr, size, handle);
}

bool ps_host_vm_supported(const ps_gpu_ops_t *device)
{
    if (!device || !device->vm_reserve || !device->vm_release || !device->vm_unmap || !device->vm_granularity ||
        !device->host_vm_granularity || !device->host_vm_map || !device->fence_record)
        return 0;
    size_t host = device->host_vm_granularity(device->ctx), align = device->vm_granularity(device->ctx);
    return host && ps_is_pow2(host) && align && align % host == 0;
}

int ps_host_vm_create(const ps_gpu_ops_t *device, ps_gpu_ops_t **out)
{
    if (!device || !out)
        return PS_EINVAL;
    if (!ps_host_vm_supported(device))
        return PS_EUNSUPPORTED;
    host_vm_t *vm = calloc(1, sizeof *vm);
    if (!vm)
        return PS_ENOMEM;
    vm->device = device;
    vm->granularity = device->host_vm_granularity(device->ctx);
    vm->ops = (ps_gpu_ops_t){
        .ctx = vm,
        .device = device->device,
        .mem_get_info = device->mem_get_info ? fwd_mem_get_info : NULL,
        .fence_record = fwd_fence_record,
        .fence_query = device->fence_query ? fwd_fence_query : NULL,
        .fence_wait = device->fence_wait ? fwd_fence_wait : NULL,
        .fence_release = device->fence_release ? fwd_fence_release : NULL,
        .stream_wait_fence = device->stream_wait_fence ? fwd_stream_wait_fence : NULL,
        .device_synchronize = device->device_synchronize ? fwd_device_synchronize : NULL,
        .barrier = device->barrier ? fwd_barrier : NULL,
        .vm_granularity = vm_granularity,
        .vm_reserve = vm_reserve,
        .vm_release = vm_release,
        .vm_map = vm_map,
        .vm_unmap = vm_unmap,
    };
    *out = &vm->ops;
    return PS_OK;
}

void ps_host_vm_destroy(ps_gpu_ops_t *ops)
{
    free(ops ? ops->ctx : NULL);
}
