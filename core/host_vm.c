/* Host virtual memory for the pinned pool's expandable range
 * (core/host_vm.h).
 *
 * Algorithm
 *  1. create: copy nothing from the device table but its pointer; the
 *     new table's ctx is this module's state, and each forwarded entry
 *     calls the device's entry with the device's ctx.
 *  2. vm_reserve(size): mmap size + granularity bytes PROT_NONE
 *     (MAP_NORESERVE: address space only), trim both ends so the range
 *     starts on a granularity boundary (pieces are granularity multiples,
 *     so every piece is too).
 *  3. vm_map(addr, size): replace [addr, addr + size) with a read/write
 *     anonymous mapping (MAP_FIXED), then host_register it; if that
 *     fails, put PROT_NONE back and return its error.
 *  4. vm_unmap(addr, size): host_unregister, then PROT_NONE over the
 *     piece with a fresh MAP_FIXED mapping (the pages are freed).
 *  5. vm_release: munmap of the whole range.
 * Guarantees: a piece is page-locked exactly while it is mapped; nothing
 * outside a mapped piece is accessible; the module keeps no per-piece
 * state (core/vm_range.c does).
 */
#include "host_vm.h"

#include <stdlib.h>
#include <sys/mman.h>

#define DEFAULT_GRANULARITY ((size_t)64 << 10)

typedef struct host_vm {
    ps_gpu_ops_t ops;            /* the table handed out (ops.ctx points here) */
    const ps_gpu_ops_t *device;  /* the device's table: fences, registration */
    unsigned flags;              /* PS_HOST_ALLOC_* every piece is registered with */
    size_t granularity;          /* smallest piece, and the range's alignment */
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
    size_t align = ((host_vm_t *)ctx)->granularity;
    size_t total = size + align;
    if (total < size)
        return PS_ENOMEM;
    void *p = mmap(NULL, total, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return PS_ENOMEM;
    uintptr_t base = ps_align_up((uintptr_t)p, align);
    if (base > (uintptr_t)p)
        munmap(p, base - (uintptr_t)p);
    uintptr_t end = (uintptr_t)p + total;
    if (end > base + size)
        munmap((void *)(base + size), end - (base + size));
    *out = (void *)base;
    return PS_OK;
}

static void vm_release(void *ctx, void *addr, size_t size)
{
    (void)ctx;
    munmap(addr, size);
}

/* Puts [addr, addr + size) back to reserved, inaccessible address space. */
static void close_pages(void *addr, size_t size)
{
    mmap(addr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
}

static int vm_map(void *ctx, void *addr, size_t size, uint64_t *handle)
{
    host_vm_t *vm = ctx;
    if (mmap(addr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED)
        return PS_ENOMEM;
    int status = vm->device->host_register(vm->device->ctx, addr, size, vm->flags);
    if (status != PS_OK) {
        close_pages(addr, size);
        return status;
    }
    *handle = 1;
    return PS_OK;
}

static int vm_unmap(void *ctx, void *addr, size_t size, uint64_t handle)
{
    host_vm_t *vm = ctx;
    (void)handle;
    int status = vm->device->host_unregister(vm->device->ctx, addr, size);
    if (status != PS_OK)
        return status;
    close_pages(addr, size);
    return PS_OK;
}

int ps_host_vm_create(const ps_gpu_ops_t *device, unsigned flags, size_t granularity, ps_gpu_ops_t **out)
{
    if (!device || !out)
        return PS_EINVAL;
    if (!device->host_register || !device->host_unregister || !device->fence_record)
        return PS_EUNSUPPORTED;
    if (!granularity)
        granularity = DEFAULT_GRANULARITY;
    if (!ps_is_pow2(granularity) || granularity < 4096)
        return PS_EINVAL;
    host_vm_t *vm = calloc(1, sizeof *vm);
    if (!vm)
        return PS_ENOMEM;
    vm->device = device;
    vm->flags = flags;
    vm->granularity = granularity;
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
