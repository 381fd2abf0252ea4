/* The GPU-ops table's virtual-memory entries (core/gpu_ops.h), over the
 * real CUDA driver; the rest of the table is shim/gpu_ops_cuda.c, the state
 * both share shim/gpu_ops_cuda_internal.h. Every entry that calls CUDA is
 * a live_ body behind a gated ops_ entry (the gate: 10. of gpu_ops_cuda.c).
 *
 * 5. vm_*: cuMemAddressReserve / cuMemCreate + cuMemMap + cuMemSetAccess /
 *    cuMemUnmap + cuMemRelease, pinned device memory at the device's
 *    recommended granularity; offered when the device supports virtual
 *    memory management and the driver has every entry point. A reserved
 *    range is one slab of the registry. Mapped memory is reachable only
 *    from the devices its mapping names, so every mapping names every other
 *    device in use that can reach this one; when some device of the
 *    process cannot, this device gets no virtual memory and its pool uses
 *    chunks (cuMemAlloc memory, which CUDA copies from any device). Peers
 *    then reach pooled memory as they reach cudaMalloc memory, or more,
 *    never less. Written out above device_in_use.
 * 8. ipc_* (shim/ipc.c): with global.ipc on and POSIX file descriptor
 *    handles supported, vm_map asks cuMemCreate for them (mapping without
 *    and offering no export where cuMemCreate refuses, as in some
 *    containers); ipc_export gives the descriptor of the piece holding an
 *    address, ipc_map imports and maps one with access for this device;
 *    imported ranges are no slab of ours.
 * 9. host_vm_* (the pinned pool's expandable range, core/host_vm.h):
 *    offered when virtual memory is (5.) and a HOST location has a
 *    granularity. host_vm_map = cuMemCreate (PINNED, location HOST) +
 *    cuMemMap + cuMemSetAccess for the host and every device of the
 *    process that accepts it (the table's own device must); the range
 *    comes from vm_reserve and pieces go back through vm_unmap, so
 *    ps_gpu_ops_cuda_release_vm gives them back before a reset too. Host
 *    pieces are no NVTX heaps (neither are pinned slabs).
 */
#include <stdlib.h>
#include <string.h>

#include "gpu_ops_cuda_internal.h"
#include "test_switches.h"

/* What the entries answer once the context died (10. of gpu_ops_cuda.c). */
static int dead_vm_map(void *vctx, void *addr, size_t size, uint64_t *handle) { return PS_EUPSTREAM; }
static int dead_vm_unmap(void *vctx, void *addr, size_t size, uint64_t handle) { return PS_OK; }

/* ---- virtual memory (5. above) ------------------------------------------------------------ */
static size_t ops_vm_granularity(void *vctx)
{
    return ((device_ops_t *)vctx)->vm_granularity;
}

static int live_vm_reserve(void *vctx, size_t size, void **out)
{
    device_ops_t *d = vctx;
    int pushed = enter_ctx(d);
    CUdeviceptr p = 0;
    CUresult r = ps_real.cuMemAddressReserve(&p, size, d->vm_granularity, 0, 0);
    leave_ctx(pushed);
    if (r != CUDA_SUCCESS)
        return status_of(r);
    ps_slab_add((uintptr_t)p, size, d->ops.device);
    pthread_mutex_lock(&d->vm_lock);
    if (ps_ptr_map_reserve(&d->vm_ranges, 1) == PS_OK)
        ps_ptr_map_put(&d->vm_ranges, (uintptr_t)p, size);
    pthread_mutex_unlock(&d->vm_lock);
    *out = (void *)(uintptr_t)p;
    return PS_OK;
}

static void live_vm_release(void *vctx, void *addr, size_t size)
{
    device_ops_t *d = vctx;
    uint64_t ignored;
    pthread_mutex_lock(&d->vm_lock);
    ps_ptr_map_remove(&d->vm_ranges, (uintptr_t)addr, &ignored);
    pthread_mutex_unlock(&d->vm_lock);
    ps_slab_remove((uintptr_t)addr);
    int pushed = enter_ctx(d);
    ps_real.cuMemAddressFree((CUdeviceptr)(uintptr_t)addr, size);
    leave_ctx(pushed);
}

/* The devices other than d's own that its mappings name now: those in use
 * that can reach it (copy_peers) and those granted peer access. */
static uint64_t named_peers(device_ops_t *d)
{
    return d->skip_peer_grant ? 0 : ps_gpu_ops_cuda_peers_of(d->device) | atomic_load(&d->copy_peers);
}

/* Gives the device and every device of named_peers read-write access to
 * [at, at + size), which may cover several mappings (context entered by
 * the caller); *named = the peers named (NULL: not wanted). */
static CUresult grant_access(device_ops_t *d, CUdeviceptr at, size_t size, uint64_t *named)
{
    CUmemAccessDesc access[PS_MAX_DEVICES];
    size_t access_count = 0;
    access[access_count++] = (CUmemAccessDesc){{CU_MEM_LOCATION_TYPE_DEVICE, d->device}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    uint64_t peers = named_peers(d);
    if (named)
        *named = peers;
    for (int p = 0; p < PS_MAX_DEVICES; p++)
        if ((peers >> p & 1) && p != d->device)
            access[access_count++] = (CUmemAccessDesc){{CU_MEM_LOCATION_TYPE_DEVICE, p}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    CUresult r = ps_real.cuMemSetAccess(at, size, access, access_count);
    if (r != CUDA_SUCCESS && access_count > 1 && (r = ps_real.cuMemSetAccess(at, size, access, 1)) == CUDA_SUCCESS) {
        /* a device that said it can reach this one refuses: granted one by
         * one, a refusing device is named once and asked no more */
        for (size_t i = 1; i < access_count; i++) {
            int p = access[i].location.id;
            CUresult one = ps_real.cuMemSetAccess(at, size, &access[i], 1);
            if (one != CUDA_SUCCESS && (atomic_fetch_and(&d->copy_peers, ~(1ull << p)) >> p & 1))
                ps_warning("device %d: device %d refuses access to its mapped memory (error %d): a copy of its "
                           "pooled memory made while device %d is current will fail",
                           d->device, p, one, p);
        }
    }
    return r;
}

/* Maps physical memory `h` at `addr`, with access (grant_access) unless
 * `bare` (context entered by the caller); *named = the peers named
 * (ALL_NAMED when bare: vm_access names them later). Nothing stays mapped
 * on error. */
#define ALL_NAMED UINT64_MAX
static CUresult map_with_access(device_ops_t *d, CUdeviceptr at, size_t size, CUmemGenericAllocationHandle h, bool bare,
                                uint64_t *named)
{
    *named = ALL_NAMED;
    CUresult r = ps_real.cuMemMap(at, size, 0, h, 0);
    if (r != CUDA_SUCCESS || bare)
        return r;
    r = grant_access(d, at, size, named);
    if (r != CUDA_SUCCESS)
        ps_real.cuMemUnmap(at, size);
    return r;
}

/* Marks a host piece in vm_sizes (sizes are granularity multiples: bit 0 is free). */
#define HOST_PIECE 1ull
#define PIECE_BYTES(value) ((value) & ~HOST_PIECE)

/* Grants `peers` access to the piece at `at` (context entered, vm_lock held). */
static void grant_piece_to(device_ops_t *d, CUdeviceptr at, size_t size, uint64_t peers)
{
    for (int p = 0; p < PS_MAX_DEVICES; p++) {
        CUmemAccessDesc access = {{CU_MEM_LOCATION_TYPE_DEVICE, p}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
        if ((peers >> p & 1) && p != d->device && ps_real.cuMemSetAccess(at, size, &access, 1) != CUDA_SUCCESS)
            ps_warning("device %d: could not give device %d access to a mapped piece of the pool", d->device, p);
    }
}

/* A piece is mapped at `addr`: remembered for IPC export, peer grants and
 * release before a reset. `device_piece`: device memory, announced to NVTX;
 * else a host piece (9.): every device has access already, it is no NVTX
 * heap (pinned slabs are none either) and never exported. `named`: the
 * peers its access named (ALL_NAMED: not to check); a device that came in
 * use since is granted here, under vm_lock: grant_mapped_to names it in
 * copy_peers before it takes vm_lock to walk the pieces noted so far, so
 * every piece is granted by one of the two (context entered by the caller). */
static void note_mapped(device_ops_t *d, void *addr, size_t size, uint64_t h, bool device_piece, uint64_t named)
{
    pthread_mutex_lock(&d->vm_lock);
    if (ps_ptr_map_reserve(&d->vm_handles, 1) == PS_OK && ps_ptr_map_reserve(&d->vm_sizes, 1) == PS_OK) {
        ps_ptr_map_put(&d->vm_handles, (uintptr_t)addr, h);
        ps_ptr_map_put(&d->vm_sizes, (uintptr_t)addr, size | (device_piece ? 0 : HOST_PIECE));
    }
    uint64_t late = device_piece && named != ALL_NAMED ? named_peers(d) & ~named : 0;
    if (late) {
        int pushed = enter_ctx(d);
        grant_piece_to(d, (CUdeviceptr)(uintptr_t)addr, size, late);
        leave_ctx(pushed);
    }
    pthread_mutex_unlock(&d->vm_lock);
    if (device_piece)
        ps_slab_mark_mapped((uintptr_t)addr); /* copies of it from other devices are ordered (copy_order.c) */
    if (device_piece && PS_UNLIKELY(ps_nvtx_on))
        ps_nvtx_heap_add(addr, size, d->ops.device);
}

static void note_unmapped(device_ops_t *d, void *addr)
{
    uint64_t ignored;
    pthread_mutex_lock(&d->vm_lock);
    ps_ptr_map_remove(&d->vm_handles, (uintptr_t)addr, &ignored);
    ps_ptr_map_remove(&d->vm_sizes, (uintptr_t)addr, &ignored);
    pthread_mutex_unlock(&d->vm_lock);
}

/* Properties of pinned physical memory at a location (a device, or the host). */
static CUmemAllocationProp pinned_prop(int type, int id) /* type: a CU_MEM_LOCATION_TYPE_* */
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = type;
    prop.location.id = id;
    return prop;
}

static CUresult grant_host_piece(device_ops_t *d, CUdeviceptr at, size_t size);

/* The kinds of piece map_new makes. */
typedef enum {
    PIECE_DEVICE,      /* device memory, with access (grant_access) */
    PIECE_DEVICE_BARE, /* device memory, access granted later (vm_access) */
    PIECE_HOST         /* pinned host memory (9.): the host and every device that accepts */
} piece_kind_t;

/* Physical memory for a new piece (context entered by the caller). A
 * device piece is exportable as a file descriptor while the table offers
 * IPC; a host piece never is. */
static CUresult create_piece(device_ops_t *d, piece_kind_t kind, size_t size, CUmemGenericAllocationHandle *h)
{
    if (kind == PIECE_HOST) {
        CUmemAllocationProp prop = pinned_prop(CU_MEM_LOCATION_TYPE_HOST, 0);
        return ps_real.cuMemCreate(h, size, &prop, 0);
    }
    CUmemAllocationProp prop = pinned_prop(CU_MEM_LOCATION_TYPE_DEVICE, d->device);
    if (atomic_load_explicit(&d->shareable, memory_order_relaxed))
        prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    CUresult r = ps_real.cuMemCreate(h, size, &prop, 0);
    if (r != CUDA_SUCCESS && r != CUDA_ERROR_OUT_OF_MEMORY && prop.requestedHandleTypes) {
        /* exportable memory refused (seen in containers): map plain memory,
         * and pooled blocks of this device are refused IPC from now on */
        prop.requestedHandleTypes = 0;
        r = ps_real.cuMemCreate(h, size, &prop, 0);
        if (r == CUDA_SUCCESS && atomic_exchange(&d->shareable, 0))
            ps_warning("device %d: cuMemCreate refused memory exportable as a file descriptor; the pool maps "
                       "plain memory, and cudaIpcGetMemHandle on its blocks is refused",
                       d->device);
    }
    return r;
}

/* Maps `h` at `at` with the access its kind asks for (context entered by
 * the caller). Nothing stays mapped on error. */
static CUresult map_piece(device_ops_t *d, piece_kind_t kind, CUdeviceptr at, size_t size,
                          CUmemGenericAllocationHandle h, uint64_t *named)
{
    *named = ALL_NAMED;
    if (kind != PIECE_HOST)
        return map_with_access(d, at, size, h, kind == PIECE_DEVICE_BARE, named);
    CUresult r = ps_real.cuMemMap(at, size, 0, h, 0);
    if (r == CUDA_SUCCESS && (r = grant_host_piece(d, at, size)) != CUDA_SUCCESS)
        ps_real.cuMemUnmap(at, size);
    return r;
}

/* A new piece of `kind` mapped at `addr`: physical memory, the mapping
 * and its access, the memory released again when a step fails. The piece
 * is noted (note_mapped) and its handle goes to *handle. */
static int map_new(device_ops_t *d, void *addr, size_t size, uint64_t *handle, piece_kind_t kind)
{
    CUdeviceptr at = (CUdeviceptr)(uintptr_t)addr;
    int pushed = enter_ctx(d);
    CUmemGenericAllocationHandle h = 0;
    uint64_t named = ALL_NAMED;
    CUresult r = create_piece(d, kind, size, &h);
    if (r == CUDA_SUCCESS && (r = map_piece(d, kind, at, size, h, &named)) != CUDA_SUCCESS)
        ps_real.cuMemRelease(h);
    leave_ctx(pushed);
    if (r != CUDA_SUCCESS)
        return status_of(r);
    note_mapped(d, addr, size, h, kind != PIECE_HOST, named);
    *handle = h;
    return PS_OK;
}

static int live_vm_map(void *vctx, void *addr, size_t size, uint64_t *handle)
{
    return map_new(vctx, addr, size, handle, PIECE_DEVICE);
}

static int live_vm_map_bare(void *vctx, void *addr, size_t size, uint64_t *handle)
{
    return map_new(vctx, addr, size, handle, PIECE_DEVICE_BARE);
}

static int map_kept(void *vctx, void *addr, size_t size, uint64_t handle, bool bare)
{
    device_ops_t *d = vctx;
    int pushed = enter_ctx(d);
    uint64_t named;
    CUresult r = map_with_access(d, (CUdeviceptr)(uintptr_t)addr, size, (CUmemGenericAllocationHandle)handle, bare,
                                 &named);
    leave_ctx(pushed);
    if (r != CUDA_SUCCESS)
        return status_of(r);
    note_mapped(d, addr, size, handle, true, named);
    return PS_OK;
}

static int live_vm_map_handle(void *vctx, void *addr, size_t size, uint64_t handle)
{
    return map_kept(vctx, addr, size, handle, false);
}

static int live_vm_map_handle_bare(void *vctx, void *addr, size_t size, uint64_t handle)
{
    return map_kept(vctx, addr, size, handle, true);
}

/* One cuMemSetAccess over several bare mappings (vm_access): a call costs
 * several times the mapping of one piece, plus a part of that for every
 * mapping it covers (tests/gpu/vmm_alias_probe.cu measures it). */
static int live_vm_access(void *vctx, void *addr, size_t size)
{
    device_ops_t *d = vctx;
    int pushed = enter_ctx(d);
    CUresult r = grant_access(d, (CUdeviceptr)(uintptr_t)addr, size, NULL);
    leave_ctx(pushed);
    return status_of(r);
}

/* ---- pinned host pieces (9. above) ------------------------------------------------------ */
static size_t ops_host_vm_granularity(void *vctx)
{
    return ((device_ops_t *)vctx)->host_vm_granularity;
}

/* Grants the host and every device that accepts access to a host piece
 * mapped at `at` (context entered by the caller). One cuMemSetAccess with
 * every descriptor; when that is refused, the host alone and then each
 * device alone, so a device that refuses is found, named once and left
 * out of later pieces. The table's own device must accept. */
static CUresult grant_host_piece(device_ops_t *d, CUdeviceptr at, size_t size)
{
    CUmemAccessDesc access[PS_MAX_DEVICES + 1];
    size_t count = 0;
    uint64_t refused = atomic_load_explicit(&d->host_access_refused, memory_order_relaxed);
    access[count++] = (CUmemAccessDesc){{CU_MEM_LOCATION_TYPE_HOST, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    for (int dev = 0; dev < d->device_count && dev < PS_MAX_DEVICES; dev++)
        if (!(refused >> dev & 1))
            access[count++] = (CUmemAccessDesc){{CU_MEM_LOCATION_TYPE_DEVICE, dev}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    CUresult r = ps_real.cuMemSetAccess(at, size, access, count);
    if (r == CUDA_SUCCESS)
        return r;
    if ((r = ps_real.cuMemSetAccess(at, size, &access[0], 1)) != CUDA_SUCCESS)
        return r; /* the host itself refused: no pinned piece here */
    for (size_t i = 1; i < count; i++) {
        int dev = access[i].location.id;
        CUresult one = ps_real.cuMemSetAccess(at, size, &access[i], 1);
        if (one == CUDA_SUCCESS)
            continue;
        if (dev == d->device)
            return one; /* the pool's own device must reach its pinned memory */
        if (!(atomic_fetch_or(&d->host_access_refused, 1ull << dev) >> dev & 1))
            ps_warning("device %d: device %d refuses access to pinned memory of the host range (error %d); "
                       "its kernels cannot use pooled pinned blocks of device %d through their pointer",
                       d->device, dev, (int)one, d->device);
    }
    return CUDA_SUCCESS;
}

static int live_host_vm_map(void *vctx, void *addr, size_t size, uint64_t *handle)
{
    return map_new(vctx, addr, size, handle, PIECE_HOST);
}

/* Devices in use in the process (ps_gpu_ops_cuda_device_in_use). */
static _Atomic uint64_t devices_in_use;

/* The async upstream's memory comes from the device's current memory pool,
 * reachable (like mapped memory, 5.) only from the
 * devices the pool names: a copy of it made while another device is
 * current fails. So at its first allocation the pool is opened to every
 * device in use that can reach this one (copy_peers), as cudaMalloc memory
 * is, and to each one that comes in use later (ps_gpu_ops_cuda_device_in_use;
 * the access covers the pool's earlier allocations too). The program then
 * sees that access on its pool. Context entered by the caller. */
void ps_gpu_ops_cuda_open_pool_to(device_ops_t *d, uint64_t peers)
{
    CUmemoryPool pool = NULL;
    if (!ps_real.cuDeviceGetMemPool || !ps_real.cuMemPoolSetAccess ||
        ps_real.cuDeviceGetMemPool(&pool, d->device) != CUDA_SUCCESS)
        return;
    CUmemAccessDesc access[PS_MAX_DEVICES];
    size_t count = 0;
    for (int p = 0; p < PS_MAX_DEVICES; p++)
        if (peers >> p & 1)
            access[count++] = (CUmemAccessDesc){{CU_MEM_LOCATION_TYPE_DEVICE, p}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    CUresult r = ps_real.cuMemPoolSetAccess(pool, access, count);
    if (r != CUDA_SUCCESS)
        ps_warning("device %d: its memory pool could not be opened to the other devices (error %d): a copy of the "
                   "async upstream's memory made while another device is current will fail",
                   d->device, r);
}

/* Gives device `peer` access to every piece of d mapped so far (its bit is
 * set in copy_peers or peer_access by the caller first: later mappings name
 * it, and note_mapped grants the ones that read the mask before), and
 * opens d's memory pool to it where the async upstream opened it before. */
static void grant_mapped_to(device_ops_t *d, int peer)
{
    if (!gate_enter(d))
        return;
    int pushed = enter_ctx(d);
    pthread_mutex_lock(&d->vm_lock);
    for (size_t i = 0; i < d->vm_sizes.capacity; i++)
        if (d->vm_sizes.slots[i].key != PS_PTR_MAP_EMPTY && !(d->vm_sizes.slots[i].value & HOST_PIECE))
            grant_piece_to(d, (CUdeviceptr)d->vm_sizes.slots[i].key, d->vm_sizes.slots[i].value, 1ull << peer);
    pthread_mutex_unlock(&d->vm_lock);
    uint64_t opened = atomic_load(&d->pool_shared);
    if (opened && !(opened >> peer & 1) && !(atomic_fetch_or(&d->pool_shared, 1ull << peer) >> peer & 1))
        ps_gpu_ops_cuda_open_pool_to(d, atomic_load(&d->pool_shared));
    leave_ctx(pushed);
    gate_leave(d);
}

/* Device `peer` may reach d's memory from now on, if it can (5.). */
static void grant_device(device_ops_t *d, int peer)
{
    if (!d || d->skip_peer_grant || !(d->reach_peers >> peer & 1) ||
        (atomic_fetch_or(&d->copy_peers, 1ull << peer) >> peer & 1))
        return;
    grant_mapped_to(d, peer);
}

static device_ops_t *table_of(int device)
{
    pthread_mutex_lock(&ps_cuda_streams_lock);
    device_ops_t *d = ps_cuda_device_tables[device];
    pthread_mutex_unlock(&ps_cuda_streams_lock);
    return d;
}

/* Peer access to mapped memory (5.). Mapped memory is reachable only from
 * the devices its mapping names (cuMemSetAccess): a copy of it made while
 * another device is current fails with "invalid value" (cudaMalloc memory:
 * works), and peer access (cuCtxEnablePeerAccess) does not open it. So
 * every mapping names every other device *in use* that can reach this one
 * (cuDeviceCanAccessPeer; probed once: reach_peers; those in use:
 * copy_peers). A device comes in use when the shim makes its table, copies
 * another device's pooled memory with it current (copy_order.c), enables
 * peer access or is given a memory pool's access
 * (ps_gpu_ops_cuda_device_in_use): it and the devices in use are then
 * granted each other's pieces mapped so far (grant_mapped_to) and named in
 * later mappings; a mapping that read the mask before is granted the rest
 * when it is noted (note_mapped). A program that uses one GPU of several
 * names no other: an access call that names a peer costs more
 * (docs/benchmarks.md: matrixMul on two GPUs). The grant lets the copy run;
 * ordering it as CUDA orders a copy of cudaMalloc memory is copy_order.c's.
 * Peer kernels can then reach the memory too, whether or not the program
 * enabled peer access or granted a memory pool's access. When the program
 * enables access from device D to device P, D is granted every piece of P
 * mapped so far (a device not in copy_peers, should the driver allow it)
 * and named in every later mapping of P. POOLSHIM_TEST_SKIP_PEER_GRANT=1
 * (tests only) grants nothing: the negative control of
 * tests/gpu/multi_gpu.cu, whose copies must then fail and whose peer
 * kernels must fault.
 *
 * `device` in use: it and every other device in use are granted each
 * other's mapped memory. `settle`: even when it was in use already (its
 * table was just made: a device that came in use while the table was
 * being made found no table to grant). */
static void device_in_use(int device, bool settle)
{
    if (device < 0 || device >= PS_MAX_DEVICES)
        return;
    bool known = atomic_fetch_or(&devices_in_use, 1ull << device) >> device & 1;
    if (known && !settle)
        return;
    uint64_t in_use = atomic_load(&devices_in_use);
    device_ops_t *own = table_of(device);
    for (int o = 0; o < PS_MAX_DEVICES; o++)
        if (o != device && (in_use >> o & 1)) {
            grant_device(table_of(o), device);
            grant_device(own, o);
        }
}

void ps_gpu_ops_cuda_device_in_use(int device)
{
    if (!(atomic_load_explicit(&devices_in_use, memory_order_relaxed) >> device & 1))
        device_in_use(device, false);
}

void ps_gpu_ops_cuda_table_in_use(int device) { device_in_use(device, true); }

void ps_gpu_ops_cuda_peer_access_enabled(CUcontext peer)
{
    if (ps_test.skip_peer_grant) { /* (warned here: the switch matters once a program enables peer access) */
        ps_warning("POOLSHIM_TEST_SKIP_PEER_GRANT=1: peer access to the pool's mapped memory is not granted "
                   "(a test switch: kernels of the peer will fault)");
        return;
    }
    CUdevice me = -1, owner = -1;
    if (ps_real.cuCtxGetDevice(&me) != CUDA_SUCCESS || me < 0 || me >= PS_MAX_DEVICES)
        return;
    if (ps_real.cuCtxPushCurrent_v2(peer) != CUDA_SUCCESS)
        return;
    CUresult r = ps_real.cuCtxGetDevice(&owner);
    CUcontext popped;
    ps_real.cuCtxPopCurrent_v2(&popped);
    if (r != CUDA_SUCCESS || owner < 0 || owner >= PS_MAX_DEVICES || owner == me)
        return;
    device_ops_t *d = ps_gpu_ops_cuda_grant_peer(owner, me); /* (later mappings of owner name me) */
    ps_gpu_ops_cuda_device_in_use(me); /* a program with peer access uses both */
    /* (after it: a device in use beside owner got owner's pieces there and
     * is in copy_peers; granting them again cost an access call per piece) */
    if (d && d->vm_granularity && !(atomic_load(&d->copy_peers) >> me & 1))
        grant_mapped_to(d, me);
}

static int live_vm_unmap_keep(void *vctx, void *addr, size_t size, uint64_t handle)
{
    device_ops_t *d = vctx;
    if (PS_UNLIKELY(ps_nvtx_on))
        ps_nvtx_heap_remove(addr);
    int pushed = enter_ctx(d);
    CUresult r = ps_real.cuMemUnmap((CUdeviceptr)(uintptr_t)addr, size);
    leave_ctx(pushed);
    if (r == CUDA_SUCCESS)
        note_unmapped(d, addr);
    return status_of(r);
}

static void live_vm_drop(void *vctx, uint64_t handle)
{
    device_ops_t *d = vctx;
    int pushed = enter_ctx(d);
    ps_real.cuMemRelease((CUmemGenericAllocationHandle)handle);
    leave_ctx(pushed);
}

static int live_vm_unmap(void *vctx, void *addr, size_t size, uint64_t handle)
{
    int status = live_vm_unmap_keep(vctx, addr, size, handle);
    if (status == PS_OK)
        live_vm_drop(vctx, handle);
    return status;
}

/* ---- sharing with other processes (8. above) ------------------------------------------ */
static int live_ipc_export(void *vctx, uintptr_t addr, uintptr_t *start, size_t *size, int *fd)
{
    device_ops_t *d = vctx;
    if (!atomic_load_explicit(&d->shareable, memory_order_relaxed))
        return PS_EUNSUPPORTED; /* cuMemCreate refused exportable memory once: pieces are mixed now */
    uint64_t piece_size = 0, handle = 0;
    uintptr_t piece = 0;
    pthread_mutex_lock(&d->vm_lock);
    if (ps_ptr_map_get(&d->vm_sizes, addr, &piece_size)) {
        piece = addr;
    } else {
        for (size_t i = 0; i < d->vm_sizes.capacity; i++) {
            uintptr_t key = d->vm_sizes.slots[i].key;
            if (key != PS_PTR_MAP_EMPTY && key <= addr && addr - key < PIECE_BYTES(d->vm_sizes.slots[i].value)) {
                piece = key;
                piece_size = d->vm_sizes.slots[i].value;
                break;
            }
        }
    }
    int found = piece && !(piece_size & HOST_PIECE) && ps_ptr_map_get(&d->vm_handles, piece, &handle);
    pthread_mutex_unlock(&d->vm_lock);
    if (!found)
        return PS_EINVAL;
    *start = piece;
    *size = (size_t)piece_size;
    if (!fd)
        return PS_OK;
    int exported = -1;
    int pushed = enter_ctx(d);
    CUresult r = ps_real.cuMemExportToShareableHandle(&exported, (CUmemGenericAllocationHandle)handle,
                                                      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    leave_ctx(pushed);
    if (r != CUDA_SUCCESS || exported < 0)
        return r == CUDA_SUCCESS ? PS_EUPSTREAM : status_of(r);
    *fd = exported;
    return PS_OK;
}

static int live_ipc_reserve(void *vctx, size_t size, void **out)
{
    device_ops_t *d = vctx;
    int pushed = enter_ctx(d);
    CUdeviceptr p = 0;
    CUresult r = ps_real.cuMemAddressReserve(&p, ps_align_up(size, d->vm_granularity), d->vm_granularity, 0, 0);
    leave_ctx(pushed);
    if (r != CUDA_SUCCESS)
        return status_of(r);
    *out = (void *)(uintptr_t)p;
    return PS_OK;
}

static void live_ipc_release(void *vctx, void *addr, size_t size)
{
    device_ops_t *d = vctx;
    int pushed = enter_ctx(d);
    ps_real.cuMemAddressFree((CUdeviceptr)(uintptr_t)addr, ps_align_up(size, d->vm_granularity));
    leave_ctx(pushed);
}

static int live_ipc_map(void *vctx, void *addr, size_t size, int fd, uint64_t *handle)
{
    device_ops_t *d = vctx;
    CUdeviceptr at = (CUdeviceptr)(uintptr_t)addr;
    CUmemAccessDesc access = {{CU_MEM_LOCATION_TYPE_DEVICE, d->device}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    CUmemGenericAllocationHandle h = 0;
    int pushed = enter_ctx(d);
    CUresult r = ps_real.cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    if (r == CUDA_SUCCESS) {
        r = ps_real.cuMemMap(at, size, 0, h, 0);
        if (r == CUDA_SUCCESS) {
            r = ps_real.cuMemSetAccess(at, size, &access, 1);
            if (r != CUDA_SUCCESS)
                ps_real.cuMemUnmap(at, size);
        }
        if (r != CUDA_SUCCESS)
            ps_real.cuMemRelease(h);
    }
    leave_ctx(pushed);
    if (r != CUDA_SUCCESS)
        return status_of(r);
    *handle = h;
    return PS_OK;
}

static int live_ipc_unmap(void *vctx, void *addr, size_t size, uint64_t handle)
{
    device_ops_t *d = vctx;
    int pushed = enter_ctx(d);
    CUresult r = ps_real.cuMemUnmap((CUdeviceptr)(uintptr_t)addr, size);
    if (r == CUDA_SUCCESS)
        r = ps_real.cuMemRelease((CUmemGenericAllocationHandle)handle);
    leave_ctx(pushed);
    return status_of(r);
}

/* Whether memory of `device` can be created exportable as a POSIX file
 * descriptor (and imported again). Needs the context current. */
static bool posix_fd_shareable(CUdevice device)
{
    if (!ps_global_config() || !ps_global_config()->ipc || !ps_real.cuMemExportToShareableHandle ||
        !ps_real.cuMemImportFromShareableHandle)
        return false;
    int supported = 0;
    return ps_real.cuDeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                                        device) == CUDA_SUCCESS &&
           supported;
}

/* Before a reset of the context (which is still alive): physical memory
 * from cuMemCreate and reserved address ranges belong to the process, not
 * to the context, so a reset would not free them (measured: +6 MiB per
 * reset of a pool stack). Wait for the device, unmap and release every
 * mapping and reservation of this table. Called with the table's gate
 * closed (no entry maps or unmaps meanwhile); it calls the driver, never
 * the table. Its pools must not be used again: the caller drops them.
 * Returns whether it had anything. */
bool ps_gpu_ops_cuda_release_vm(ps_gpu_ops_t *ops)
{
    device_ops_t *d = (device_ops_t *)ops;
    if (!d || !d->vm_granularity)
        return false;
    pthread_mutex_lock(&d->vm_lock);
    bool any = d->vm_ranges.count > 0;
    pthread_mutex_unlock(&d->vm_lock);
    if (!any)
        return false;
    int pushed = enter_ctx(d);
    ps_real.cuCtxSynchronize();
    pthread_mutex_lock(&d->vm_lock);
    for (size_t i = 0; i < d->vm_handles.capacity; i++) {
        uintptr_t addr = d->vm_handles.slots[i].key;
        uint64_t size = 0;
        if (addr == PS_PTR_MAP_EMPTY || !ps_ptr_map_get(&d->vm_sizes, addr, &size))
            continue;
        if (ps_real.cuMemUnmap((CUdeviceptr)addr, PIECE_BYTES(size)) != CUDA_SUCCESS)
            continue;
        /* a handle mapped at two addresses (the pool's remap lends memory)
         * is released once: at its last address in this table */
        uint64_t handle = d->vm_handles.slots[i].value;
        bool again = false;
        uint64_t other_size;
        for (size_t j = i + 1; j < d->vm_handles.capacity && !again; j++)
            again = d->vm_handles.slots[j].key != PS_PTR_MAP_EMPTY && d->vm_handles.slots[j].value == handle &&
                    ps_ptr_map_get(&d->vm_sizes, d->vm_handles.slots[j].key, &other_size);
        if (!again)
            ps_real.cuMemRelease(handle);
    }
    for (size_t i = 0; i < d->vm_ranges.capacity; i++)
        if (d->vm_ranges.slots[i].key != PS_PTR_MAP_EMPTY)
            ps_real.cuMemAddressFree((CUdeviceptr)d->vm_ranges.slots[i].key, d->vm_ranges.slots[i].value);
    ps_ptr_map_free(&d->vm_handles);
    ps_ptr_map_free(&d->vm_sizes);
    ps_ptr_map_free(&d->vm_ranges);
    ps_ptr_map_init(&d->vm_handles, 64);
    ps_ptr_map_init(&d->vm_sizes, 64);
    ps_ptr_map_init(&d->vm_ranges, 4);
    pthread_mutex_unlock(&d->vm_lock);
    leave_ctx(pushed);
    return true;
}

/* The device's mapping granularity when it and the driver support virtual
 * memory management, else 0. Needs the context current. */
static size_t vm_granularity_of(CUdevice device)
{
    if (!ps_real.cuDeviceGetAttribute || !ps_real.cuMemGetAllocationGranularity || !ps_real.cuMemAddressReserve ||
        !ps_real.cuMemAddressFree || !ps_real.cuMemCreate || !ps_real.cuMemRelease || !ps_real.cuMemMap ||
        !ps_real.cuMemUnmap || !ps_real.cuMemSetAccess)
        return 0;
    int supported = 0;
    if (ps_real.cuDeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, device) !=
            CUDA_SUCCESS ||
        !supported)
        return 0;
    CUmemAllocationProp prop = pinned_prop(CU_MEM_LOCATION_TYPE_DEVICE, device);
    size_t granularity = 0;
    if (ps_real.cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) !=
        CUDA_SUCCESS)
        return 0;
    return granularity;
}

/* Every other device of the process can reach `device`'s memory
 * (cuDeviceCanAccessPeer): true, with *mask = those devices; false when
 * one cannot (then copies of mapped memory made while it is current would
 * fail: the caller uses chunks). One device: true, mask 0. */
static bool other_devices_reach(CUdevice device, int count, uint64_t *mask)
{
    *mask = 0;
    for (int p = 0; p < count && p < PS_MAX_DEVICES; p++) {
        if (p == device)
            continue;
        int can = 0;
        if (!ps_real.cuDeviceCanAccessPeer || ps_real.cuDeviceCanAccessPeer(&can, p, device) != CUDA_SUCCESS || !can)
            return false;
        *mask |= 1ull << p;
    }
    return true;
}

/* The recommended granularity of pinned memory placed on the host by
 * cuMemCreate (host.expandable's probe, once per table), else 0: the
 * driver does not know host locations (before CUDA 12.2) or refuses them.
 * Needs the context current and virtual memory support (vm_granularity_of). */
static size_t host_vm_granularity_of(void)
{
    CUmemAllocationProp prop = pinned_prop(CU_MEM_LOCATION_TYPE_HOST, 0);
    size_t granularity = 0;
    if (ps_real.cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) !=
            CUDA_SUCCESS ||
        !ps_is_pow2(granularity))
        return 0;
    return granularity;
}

/* ---- the gate (10. of gpu_ops_cuda.c) ---- */
GATED(vm_reserve, (void *vctx, size_t size, void **out), (vctx, size, out), PS_EUPSTREAM)
GATED_VOID(vm_release, (void *vctx, void *addr, size_t size), (vctx, addr, size))
GATED_TIMED(vm_map, PS_OP_TIME_MAP, (void *vctx, void *addr, size_t size, uint64_t *handle), (vctx, addr, size, handle), dead_vm_map(vctx, addr, size, handle))
GATED_TIMED(vm_map_handle, PS_OP_TIME_MAP, (void *vctx, void *addr, size_t size, uint64_t handle), (vctx, addr, size, handle), PS_EUPSTREAM)
GATED_TIMED(vm_map_bare, PS_OP_TIME_MAP, (void *vctx, void *addr, size_t size, uint64_t *handle), (vctx, addr, size, handle), dead_vm_map(vctx, addr, size, handle))
GATED_TIMED(vm_map_handle_bare, PS_OP_TIME_MAP, (void *vctx, void *addr, size_t size, uint64_t handle), (vctx, addr, size, handle), PS_EUPSTREAM)
GATED_TIMED(vm_access, PS_OP_TIME_MAP, (void *vctx, void *addr, size_t size), (vctx, addr, size), PS_EUPSTREAM)
GATED_TIMED(host_vm_map, PS_OP_TIME_MAP, (void *vctx, void *addr, size_t size, uint64_t *handle), (vctx, addr, size, handle), dead_vm_map(vctx, addr, size, handle))
GATED_TIMED(vm_unmap_keep, PS_OP_TIME_UNMAP, (void *vctx, void *addr, size_t size, uint64_t handle), (vctx, addr, size, handle), PS_OK) /* (the context and its memory are gone; dead_vm_unmap says the same) */
GATED_VOID(vm_drop, (void *vctx, uint64_t handle), (vctx, handle))
GATED_TIMED(vm_unmap, PS_OP_TIME_UNMAP, (void *vctx, void *addr, size_t size, uint64_t handle), (vctx, addr, size, handle), dead_vm_unmap(vctx, addr, size, handle))
GATED(ipc_export, (void *vctx, uintptr_t addr, uintptr_t *start, size_t *size, int *fd), (vctx, addr, start, size, fd), PS_EUPSTREAM)
GATED(ipc_reserve, (void *vctx, size_t size, void **out), (vctx, size, out), PS_EUPSTREAM)
GATED_VOID(ipc_release, (void *vctx, void *addr, size_t size), (vctx, addr, size))
GATED(ipc_map, (void *vctx, void *addr, size_t size, int fd, uint64_t *handle), (vctx, addr, size, fd, handle), PS_EUPSTREAM)
GATED(ipc_unmap, (void *vctx, void *addr, size_t size, uint64_t handle), (vctx, addr, size, handle), PS_OK) /* went with the context */

/* Probes the device (virtual memory, host locations, file descriptor
 * export) and fills those entries of the table: only what it offers. */
void ps_gpu_ops_cuda_vm_attach(device_ops_t *d)
{
    CUdevice device = d->device;
    int pushed = enter_ctx(d);
    d->vm_granularity = vm_granularity_of(device);
    bool shareable = d->vm_granularity && posix_fd_shareable(device);
    d->host_vm_granularity = d->vm_granularity ? host_vm_granularity_of() : 0;
    if (!ps_real.cuDeviceGetCount || ps_real.cuDeviceGetCount(&d->device_count) != CUDA_SUCCESS)
        d->device_count = 0;
    d->skip_peer_grant = ps_test.skip_peer_grant;
    uint64_t reach = 0;
    bool all_reach = other_devices_reach(device, d->device_count, &reach);
    d->reach_peers = reach;
    atomic_store(&d->copy_peers, reach & atomic_load(&devices_in_use)); /* the others as they come (5.) */
    if (d->vm_granularity && !all_reach) {
        ps_info("device %d: another device of the process cannot reach its memory (no peer capability): its pool "
                "uses chunks (cuMemAlloc memory), since a copy of mapped memory made while that device is current "
                "would fail",
                device);
        d->vm_granularity = 0;
        d->host_vm_granularity = 0;
        shareable = false;
    }
    if (d->skip_peer_grant && reach)
        ps_warning("POOLSHIM_TEST_SKIP_PEER_GRANT=1: device %d's mapped memory names no other device (a test "
                   "switch: copies from other devices fail, their kernels fault)",
                   device);
    leave_ctx(pushed);
    if (d->vm_granularity) {
        d->ops.vm_granularity = ops_vm_granularity;
        d->ops.vm_reserve = ops_vm_reserve;
        d->ops.vm_release = ops_vm_release;
        d->ops.vm_map = ops_vm_map;
        d->ops.vm_unmap = ops_vm_unmap;
        d->ops.vm_unmap_keep = ops_vm_unmap_keep;
        d->ops.vm_map_handle = ops_vm_map_handle;
        d->ops.vm_drop = ops_vm_drop;
        d->ops.vm_map_bare = ops_vm_map_bare;
        d->ops.vm_map_handle_bare = ops_vm_map_handle_bare;
        d->ops.vm_access = ops_vm_access;
    }
    if (d->host_vm_granularity && d->device_count > 0) { /* host.expandable's pieces (9. above) */
        d->ops.host_vm_granularity = ops_host_vm_granularity;
        d->ops.host_vm_map = ops_host_vm_map;
    }
    if (shareable) {
        atomic_store(&d->shareable, 1);
        d->ops.ipc_export = ops_ipc_export;
        d->ops.ipc_reserve = ops_ipc_reserve;
        d->ops.ipc_release = ops_ipc_release;
        d->ops.ipc_map = ops_ipc_map;
        d->ops.ipc_unmap = ops_ipc_unmap;
    }
}
