/* The fake GPU: a GPU-ops table (core/gpu_ops.h) over host memory or a
 * simulated address space, with fences the test completes by hand.
 *
 * Algorithm:
 *  1. mem_alloc rounds the size up to `upstream_alignment` (at least 256),
 *     checks the injected-failure plan and the capacity, then either takes
 *     real memory (aligned_alloc, `backed`) or the next addresses of a
 *     simulated address space (a bump pointer starting at SIMULATED_BASE,
 *     never dereferenced; a range freed at the top of the space is reused).
 *     Every live block is kept in a map address -> rounded size, so a free
 *     of an unknown pointer is PS_EINVAL and the bytes outstanding are exact.
 *  2. fence_record gives fence number 1, 2, 3... (recycled fence structs);
 *     a fence is complete when its number is <= the completed mark
 *     (ps_fake_gpu_complete_upto), when it was waited on, or at once in
 *     auto-complete mode. With a lag (options.lag_ns > 0) a fence also
 *     stores the simulated clock at recording and is complete once the
 *     clock (ps_fake_gpu_set_clock, monotonic) reaches that time + lag:
 *     fences recorded later complete later, as on a GPU that runs lag_ns
 *     behind the host. Queue mode (ps_fake_gpu_set_gpu_busy_until: the
 *     time at which the GPU finishes the work queued so far) also makes a
 *     fence due no earlier than that time, as a CUDA event recorded after
 *     all queued work; a fence is complete once the clock reaches its due
 *     time. fence_wait on an incomplete fence completes that fence (the
 *     host waited for it) and counts a wait; with waits_move_clock it also
 *     moves the clock to the fence's due time (the host's wait took that
 *     long). device_synchronize completes every fence recorded so far
 *     (waits_move_clock: the clock moves to when the GPU is idle).
 *     Real-time model (options.event_latency_ns, for timing a pool's fence
 *     costs on the CPU): a fence completes once ps_now_ns() passes its
 *     recording time + the latency; fence_wait spins until then (counted
 *     when it spun), fence_record and fence_query spin event_record_ns /
 *     event_query_ns first, as the CUDA calls cost. The reuse judge
 *     (ps_fake_gpu_passed_since) remembers the newest fence that
 *     fence_query or fence_wait answered passed.
 *  3. stream_wait_fence, fence_wait and device_synchronize only count;
 *     fences and stream waits are also counted per stream (a map keyed by
 *     stream + 1, since the map's empty key is PS_STREAM_NONE's value), so
 *     tests can check that nothing names a destroyed stream.
 *  4. barrier counts (or fails with PS_EBUSY while blocked): it
 *     completes no fence, so a test sees what a lagging GPU does. Barriers
 *     are numbered 1, 2, 3... and pass like fences: at once in
 *     auto-complete mode, by the completed mark
 *     (ps_fake_gpu_complete_barriers_upto, complete_all, device_synchronize),
 *     or, timed, once the clock reaches the time it was issued + lag (no
 *     earlier than the GPU queue's end). barrier_passed remembers the
 *     newest PS_BARRIER_RING, as the real table does. barrier_wait marks
 *     the barrier (an older one than the ring: the oldest remembered)
 *     and every earlier one passed, and (timed, waits_move_clock) moves
 *     the clock to when it passes; it counts (ps_fake_gpu_barrier_waits).
 *     barrier_joined answers what the test set (ps_fake_gpu_set_barrier_joins;
 *     0 by default: the fake has no busy non-blocking stream to join).
 *  5. Virtual memory (virtual_memory = 1): vm_reserve takes address space
 *     (simulated addresses, or an mmap with no access when backed);
 *     vm_map checks the failure plan and the capacity like mem_alloc and
 *     (backed) opens the pages; vm_unmap closes and discards them. Each
 *     mapping is kept in a map address -> size, so an unmap of something
 *     not mapped is PS_EINVAL. Physical memory is kept per handle
 *     (vm_handles: its size and how many mappings it has now): vm_unmap_keep
 *     keeps it, vm_map_handle maps it again, or a second time while it is
 *     still mapped elsewhere (an alias: counted once), and it is freed once
 *     released (vm_unmap, vm_drop) with no mapping left, as the driver
 *     does. host_vm_map (unless no_host_vm) is vm_map
 *     for "host" pieces: the same memory and capacity, its own counters
 *     and fault site, and pinning costs clock (charge_pinning) when a
 *     host piece is mapped or unmapped.
 *     Shareable (options.shareable, backed): each vm_map piece is a memfd
 *     mapped shared at its address (kept in a map address -> fd);
 *     ipc_export finds the piece holding an address (exact start, else a
 *     scan) and gives a dup of its memfd; ipc_reserve takes address space
 *     like vm_reserve; ipc_map maps a descriptor shared at an address
 *     (its file must be at least that big); ipc_unmap makes the range
 *     inaccessible again. So two tables, even in two processes, see the
 *     same bytes, as two processes do on a GPU.
 *  6. Fault plan (ps_fake_gpu_fail_call): every entry that can fail first
 *     counts its call (per entry and in total) and asks the plan whether
 *     this call number fails; a failing call returns at once, having done
 *     nothing. Fences and reserved ranges still live are counted, so a
 *     test sees what a failure path forgot to release.
 * Guarantees: thread-safe (one mutex); bytes outstanding never exceed the
 * capacity; destroy frees every host allocation still live.
 */
#include "fake_gpu.h"

#include "../../core/ptr_map.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Start of the simulated address space (64 TiB; user space ends at 128 TiB). */
#define SIMULATED_BASE ((uintptr_t)0x400000000000ull)
/* End of the simulated address space. */
#define SIMULATED_END ((uintptr_t)0x7f0000000000ull)

struct ps_fence {
    uint64_t sequence;        /* 1, 2, 3... in recording order */
    uint64_t recorded_ns;     /* simulated clock when recorded (lag mode) */
    uint64_t due_ns;          /* timed mode: complete once the clock reaches this */
    uint64_t real_due_ns;     /* event_latency_ns: complete once ps_now_ns() reaches this */
    int waited;               /* 1: fence_wait completed it */
    ps_stream_t stream;       /* the stream it was recorded on */
    struct ps_fence *next;    /* recycled-list link */
    struct ps_fence *all_next; /* list of every fence struct, for destroy */
};

/* One entry of the fault plan (ps_fake_gpu_fail_call). */
typedef struct fake_fault {
    ps_fake_op_t op; /* the entry, or PS_FAKE_OP_ANY */
    uint64_t nth;    /* the call number that fails (0: slot unused) */
    int status;      /* what it returns */
} fake_fault_t;

/* The fault plan and what it has done; lives in fake_device_t. */
typedef struct fake_faults {
    uint64_t calls[PS_FAKE_OP_COUNT + 1];     /* calls per entry; [PS_FAKE_OP_ANY]: all */
    fake_fault_t plan[PS_FAKE_FAULTS_MAX];    /* pending entries */
    uint64_t fired;                           /* calls failed by the plan */
    ps_fake_op_t last_op;                     /* the last failed call's entry */
    uint64_t last_call;                       /* its number among that entry's calls */
    uint64_t live_fences;                     /* fence_record successes - fence_release calls */
    uint64_t live_vm_ranges;                  /* vm_reserve successes - vm_release calls */
} fake_faults_t;

typedef struct fake_device {
    ps_gpu_ops_t ops;              /* the table handed out (ops.ctx points here) */
    pthread_mutex_t lock;          /* guards every field below */
    ps_fake_gpu_options_t options; /* as given at create, defaults filled in */
    ps_ptr_map_t live;             /* address -> rounded size of each live block */
    uintptr_t simulated_next;      /* bump pointer of the simulated address space */
    uint64_t bytes_outstanding;    /* sum of rounded sizes of live blocks */
    uint64_t upstream_allocs;      /* successful allocations */
    uint64_t fail_after;           /* injected failures: allocations that still succeed */
    uint64_t fail_count;           /* injected failures: how many then fail */
    uint64_t fences_recorded;      /* highest fence number given out */
    uint64_t completed_upto;       /* fences 1..completed_upto are complete */
    int auto_complete;             /* fences complete as soon as recorded */
    uint64_t clock_ns;             /* simulated clock (lag mode), never decreasing */
    uint64_t last_recorded_ns;     /* recorded_ns of the newest fence */
    int timed;                     /* fences complete by the clock: lag_ns > 0 or a GPU queue set */
    uint64_t gpu_busy_until_ns;    /* queue mode: the GPU finishes the work queued so far at this time */
    uint64_t last_due_ns;          /* latest due_ns of any fence recorded */
    struct ps_fence *recycled;     /* released fence structs */
    struct ps_fence *all_fences;   /* every fence struct ever created */
    uint64_t stream_waits;         /* stream_wait_fence calls */
    uint64_t fence_waits;          /* fence_wait calls on incomplete fences */
    uint64_t device_syncs;         /* device_synchronize calls */
    uint64_t newest_answered;      /* highest fence number fence_query/fence_wait answered passed */
    ps_ptr_map_t host_mapped;      /* address -> size of each live host_vm_map piece */
    uint64_t host_vm_maps;         /* successful host_vm_map calls */
    uint64_t host_vm_unmaps;       /* vm_unmap calls that unmapped a host piece */
    ps_ptr_map_t fences_by_stream; /* stream + 1 -> fences recorded on it */
    ps_ptr_map_t waits_by_stream;  /* stream + 1 -> stream_wait_fence calls on it */
    uint64_t barriers;             /* barrier calls that succeeded = the newest barrier's number */
    uint64_t barriers_completed_upto; /* barriers 1..this have passed (completed mark, device sync) */
    uint64_t barrier_waits;        /* barrier_wait calls that waited (PS_OK) */
    uint64_t barrier_wait_ns;      /* timed: simulated time the host spent in barrier_wait */
    uint64_t wait_instead_sync_ns; /* timed: what a device synchronize at each barrier_wait would have spent */
    uint64_t device_sync_ns;       /* timed: simulated time the host spent in device_synchronize */
    uint64_t barrier_due_ns[PS_BARRIER_RING]; /* timed: barrier n passes when the clock reaches [n % ring] */
    uint64_t barrier_last_due_ns;  /* latest of those (device_synchronize waits for it) */
    int barriers_assume_passed;    /* test hook: barrier_passed answers passed always */
    int noting_frees;              /* 1: ps_fake_gpu_note_free was called: unmaps are judged per granule */
    uint64_t waited_all_upto;      /* newest all-streams fence the host waited for (fence_wait): the
                                      GPU finished everything issued before it */
    ps_ptr_map_t freed_at;         /* granule address -> index into free_positions of its last noted free */
    struct free_position {         /* where the GPU's queue stood when a block was freed */
        uint64_t fences;           /* fences recorded by then */
        uint64_t barriers;         /* barriers issued by then */
        uint64_t clock_ns;         /* the simulated clock then */
        uint64_t syncs;            /* device_synchronize calls by then */
    } *free_positions;
    size_t free_positions_count, free_positions_capacity; /* entries used / allocated */
    int barriers_blocked;          /* 1: barrier answers PS_EBUSY */
    unsigned barrier_joins;        /* what barrier_joined answers (busy streams the newest barrier joined) */
    ps_ptr_map_t vm_mapped;        /* address -> size of each live vm_map */
    uint64_t vm_maps;              /* successful vm_map calls */
    uint64_t vm_unmaps;            /* successful vm_unmap calls */
    uint64_t unsafe_unmaps;        /* vm_unmap while a fence was incomplete */
    uint64_t next_handle;          /* vm_map handles: 1, 2, 3... */
    ps_ptr_map_t vm_kept;          /* handle -> size of physical memory unmapped and kept (vm_unmap_keep) */
    ps_ptr_map_t vm_bare;          /* address -> size of each mapping not yet made accessible (vm_map_bare) */
    uint64_t vm_bare_bytes;        /* their bytes */
    uint64_t vm_access_calls;      /* successful vm_access calls */
    uint64_t vm_keeps;             /* successful vm_unmap_keep calls */
    uint64_t vm_maps_kept;         /* successful vm_map_handle calls */
    ps_ptr_map_t vm_handles;       /* handle -> size | mappings now << 48 | released: its memory until freed
                                      (a handle mapped twice: the pool's remap lends memory, 5. above) */
    uint64_t vm_aliases;           /* vm_map_handle of a handle mapped elsewhere (a second mapping) */
    ps_ptr_map_t vm_fds;           /* shareable: address -> memfd of each live vm_map */
    ps_ptr_map_t ipc_mapped;       /* address -> size of each live ipc_map */
    fake_faults_t faults;          /* the fault plan and the per-entry call counters */
} fake_device_t;

/* vm_handles' values: the size, the mappings now, and whether the owner
 * released the handle (its memory is freed once no mapping is left). */
#define HANDLE_SIZE(v) ((v) & ((1ull << 48) - 1))
#define HANDLE_MAPPINGS(v) (((v) >> 48) & 0x7fff)
#define HANDLE_RELEASED (1ull << 63)
#define HANDLE_VALUE(size, mappings, released) \
    ((uint64_t)(size) | (uint64_t)(mappings) << 48 | ((released) ? HANDLE_RELEASED : 0))

/* Adds one to `stream`'s entry of `map` (silently skipped without memory).
 * Lock held. */
static void count_on_stream(ps_ptr_map_t *map, ps_stream_t stream)
{
    uintptr_t key = (uintptr_t)stream + 1;
    uint64_t value = 0;
    if (key == PS_PTR_MAP_EMPTY || ps_ptr_map_reserve(map, 1) != PS_OK)
        return;
    ps_ptr_map_get(map, key, &value);
    ps_ptr_map_put(map, key, value + 1);
}

/* `stream`'s entry of `map`. Lock held. */
static uint64_t count_of_stream(const ps_ptr_map_t *map, ps_stream_t stream)
{
    uintptr_t key = (uintptr_t)stream + 1;
    uint64_t value = 0;
    if (key != PS_PTR_MAP_EMPTY)
        ps_ptr_map_get(map, key, &value);
    return value;
}

static int fence_is_complete_locked(fake_device_t *dev, const struct ps_fence *fence)
{
    return fence->waited || fence->sequence <= dev->completed_upto || (dev->timed && dev->clock_ns >= fence->due_ns) ||
           (dev->options.event_latency_ns && ps_now_ns() >= fence->real_due_ns);
}

/* event_latency_ns: a call's own cost, spent outside the lock. */
static void spin_ns(uint64_t ns)
{
    if (!ns)
        return;
    uint64_t until = ps_now_ns() + ns;
    while (ps_now_ns() < until)
        ;
}

/* Is every fence recorded so far complete (waited fences aside)? Lock held. */
static int all_fences_complete_locked(const fake_device_t *dev)
{
    return dev->completed_upto >= dev->fences_recorded || (dev->timed && dev->clock_ns >= dev->last_due_ns);
}

static const char *const OP_NAMES[PS_FAKE_OP_COUNT + 1] = {
    "mem_alloc", "mem_free", "mem_alloc_async", "mem_free_async", "mem_alloc_managed", "mem_get_info",
    "fence_record", "fence_query", "fence_wait", "stream_wait_fence", "device_synchronize", "barrier",
    "vm_reserve", "vm_map", "vm_unmap", "host_alloc", "memset_d8", "copy_to_host", "ipc_export", "ipc_map",
    "host_vm_map", "barrier_passed", "barrier_wait", "any",
};

/* Counts one call of `op` and asks the fault plan: PS_OK with the lock
 * held, or the planned error with it released (the call must then do
 * nothing else). Every entry that can fail starts here. */
static int enter(fake_device_t *dev, ps_fake_op_t op)
{
    pthread_mutex_lock(&dev->lock);
    fake_faults_t *f = &dev->faults;
    uint64_t mine = ++f->calls[op], any = ++f->calls[PS_FAKE_OP_ANY];
    int status = PS_OK;
    for (int i = 0; i < PS_FAKE_FAULTS_MAX && status == PS_OK; i++) {
        fake_fault_t *entry = &f->plan[i];
        if (entry->nth && ((entry->op == op && entry->nth == mine) || (entry->op == PS_FAKE_OP_ANY && entry->nth == any))) {
            status = entry->status;
            entry->nth = 0;
            f->fired++;
            f->last_op = op;
            f->last_call = mine;
        }
    }
    if (status != PS_OK)
        pthread_mutex_unlock(&dev->lock);
    return status;
}

/* count_call: as enter, for entries that do their work outside the lock. */
static int count_call(fake_device_t *dev, ps_fake_op_t op)
{
    int status = enter(dev, op);
    if (status == PS_OK)
        pthread_mutex_unlock(&dev->lock);
    return status;
}

/* The failure plan and the capacity: may `rounded` more bytes be taken?
 * Lock held. */
static int admit_locked(fake_device_t *dev, size_t rounded)
{
    if (dev->fail_count) {
        if (dev->fail_after)
            dev->fail_after--;
        else {
            dev->fail_count--;
            return PS_ENOMEM;
        }
    }
    if (dev->options.capacity && rounded > dev->options.capacity - dev->bytes_outstanding)
        return PS_ENOMEM;
    return PS_OK;
}

static int fake_alloc(fake_device_t *dev, ps_fake_op_t op, size_t size, void **out)
{
    int fault = count_call(dev, op);
    if (fault != PS_OK)
        return fault;
    size_t rounded = ps_align_up(size ? size : 1, dev->options.upstream_alignment);
    if (!rounded)
        return PS_ENOMEM;
    pthread_mutex_lock(&dev->lock);
    int status = admit_locked(dev, rounded);
    if (status == PS_OK)
        status = ps_ptr_map_reserve(&dev->live, 1);
    void *ptr = NULL;
    if (status == PS_OK) {
        if (dev->options.backed) {
            ptr = aligned_alloc(dev->options.upstream_alignment, rounded);
            if (!ptr)
                status = PS_ENOMEM;
        } else if (rounded > SIMULATED_END - dev->simulated_next) {
            status = PS_ENOMEM;
        } else {
            ptr = (void *)dev->simulated_next;
            dev->simulated_next += rounded;
        }
    }
    if (status == PS_OK) {
        ps_ptr_map_put(&dev->live, (uintptr_t)ptr, rounded);
        dev->bytes_outstanding += rounded;
        dev->upstream_allocs++;
        *out = ptr;
    }
    pthread_mutex_unlock(&dev->lock);
    return status;
}

static int fake_mem_alloc(void *ctx, size_t size, void **out)
{
    return fake_alloc(ctx, PS_FAKE_OP_MEM_ALLOC, size, out);
}

/* mem_free and mem_free_async, once the call is counted. */
static int fake_free(fake_device_t *dev, void *ptr)
{
    uint64_t rounded;
    pthread_mutex_lock(&dev->lock);
    if (!ps_ptr_map_remove(&dev->live, (uintptr_t)ptr, &rounded)) {
        pthread_mutex_unlock(&dev->lock);
        return PS_EINVAL;
    }
    dev->bytes_outstanding -= rounded;
    if (dev->options.backed)
        free(ptr);
    else if ((uintptr_t)ptr + rounded == dev->simulated_next)
        dev->simulated_next = (uintptr_t)ptr; /* the top range is reused */
    pthread_mutex_unlock(&dev->lock);
    return PS_OK;
}

static int fake_mem_free(void *ctx, void *ptr, size_t size)
{
    int fault = count_call(ctx, PS_FAKE_OP_MEM_FREE);
    return fault != PS_OK ? fault : fake_free(ctx, ptr);
}

static int fake_mem_alloc_async(void *ctx, size_t size, ps_stream_t stream, void **out)
{
    return fake_alloc(ctx, PS_FAKE_OP_MEM_ALLOC_ASYNC, size, out);
}

static int fake_mem_free_async(void *ctx, void *ptr, ps_stream_t stream)
{
    int fault = count_call(ctx, PS_FAKE_OP_MEM_FREE_ASYNC);
    return fault != PS_OK ? fault : fake_free(ctx, ptr);
}

static int fake_mem_alloc_managed(void *ctx, size_t size, void **out)
{
    return fake_alloc(ctx, PS_FAKE_OP_MEM_ALLOC_MANAGED, size, out);
}

/* With waits_move_clock: pinning `size` bytes costs pin_ns + pin_ns_per_mib
 * per MiB of clock; unpinning (`unpin`) first waits until the GPU is idle
 * when unpin_synchronizes is set. */
static void charge_pinning(fake_device_t *dev, size_t size, int unpin)
{
    pthread_mutex_lock(&dev->lock);
    if (dev->timed && dev->options.waits_move_clock) {
        if (unpin && dev->options.unpin_synchronizes) {
            uint64_t idle = dev->gpu_busy_until_ns > dev->last_due_ns ? dev->gpu_busy_until_ns : dev->last_due_ns;
            if (idle > dev->clock_ns)
                dev->clock_ns = idle;
            dev->completed_upto = dev->fences_recorded;
            dev->barriers_completed_upto = dev->barriers;
        }
        if (!unpin)
            dev->clock_ns += dev->options.pin_ns + (uint64_t)((double)size / 1048576.0 * dev->options.pin_ns_per_mib);
    }
    pthread_mutex_unlock(&dev->lock);
}

/* Pinned host memory: the fake has no pinning, so it is the same host
 * memory (or simulated addresses) as mem_alloc, under the same capacity;
 * the flags are not checked. */
static int fake_host_alloc(void *ctx, size_t size, unsigned flags, void **out)
{
    (void)flags;
    int status = fake_alloc(ctx, PS_FAKE_OP_HOST_ALLOC, size, out);
    if (status == PS_OK)
        charge_pinning(ctx, size, 0);
    return status;
}

static int fake_host_free(void *ctx, void *ptr, size_t size)
{
    int status = fake_mem_free(ctx, ptr, size);
    if (status == PS_OK)
        charge_pinning(ctx, 0, 1);
    return status;
}

static int fake_mem_get_info(void *ctx, size_t *free_bytes, size_t *total_bytes)
{
    fake_device_t *dev = ctx;
    int fault = enter(dev, PS_FAKE_OP_MEM_GET_INFO);
    if (fault != PS_OK)
        return fault;
    size_t total = dev->options.capacity ? dev->options.capacity : (size_t)(SIMULATED_END - SIMULATED_BASE);
    *free_bytes = total - (size_t)dev->bytes_outstanding;
    *total_bytes = total;
    pthread_mutex_unlock(&dev->lock);
    return PS_OK;
}

static int fake_fence_record(void *ctx, ps_stream_t stream, ps_fence_t **out)
{
    fake_device_t *dev = ctx;
    int fault = enter(dev, PS_FAKE_OP_FENCE_RECORD);
    if (fault != PS_OK)
        return fault;
    struct ps_fence *fence = dev->recycled;
    if (fence) {
        dev->recycled = fence->next;
    } else {
        fence = calloc(1, sizeof *fence);
        if (!fence) {
            pthread_mutex_unlock(&dev->lock);
            return PS_ENOMEM;
        }
        fence->all_next = dev->all_fences;
        dev->all_fences = fence;
    }
    fence->sequence = ++dev->fences_recorded;
    fence->waited = 0;
    fence->stream = stream;
    fence->next = NULL;
    fence->recorded_ns = dev->clock_ns;
    dev->last_recorded_ns = dev->clock_ns;
    fence->due_ns = dev->clock_ns + dev->options.lag_ns;
    fence->real_due_ns = dev->options.event_latency_ns ? ps_now_ns() + dev->options.event_latency_ns : 0;
    if (fence->due_ns < dev->gpu_busy_until_ns)
        fence->due_ns = dev->gpu_busy_until_ns;
    if (fence->due_ns > dev->last_due_ns)
        dev->last_due_ns = fence->due_ns;
    count_on_stream(&dev->fences_by_stream, stream);
    dev->faults.live_fences++;
    if (dev->auto_complete && !dev->timed)
        dev->completed_upto = fence->sequence;
    pthread_mutex_unlock(&dev->lock);
    spin_ns(dev->options.event_record_ns);
    *out = fence;
    return PS_OK;
}

static int fake_fence_query(void *ctx, ps_fence_t *fence)
{
    fake_device_t *dev = ctx;
    int fault = count_call(dev, PS_FAKE_OP_FENCE_QUERY);
    if (fault != PS_OK)
        return fault;
    spin_ns(dev->options.event_query_ns);
    pthread_mutex_lock(&dev->lock);
    int done = fence_is_complete_locked(dev, fence);
    if (done && fence->sequence > dev->newest_answered)
        dev->newest_answered = fence->sequence;
    pthread_mutex_unlock(&dev->lock);
    return done ? PS_OK : PS_ENOTREADY;
}

static int fake_fence_wait(void *ctx, ps_fence_t *fence)
{
    fake_device_t *dev = ctx;
    int fault = count_call(dev, PS_FAKE_OP_FENCE_WAIT);
    if (fault != PS_OK)
        return fault;
    int spun = 0;
    if (dev->options.event_latency_ns) /* the real-time model: the host waits until the GPU got there */
        while (ps_now_ns() < fence->real_due_ns)
            spun = 1;
    pthread_mutex_lock(&dev->lock);
    if (fence->sequence > dev->newest_answered)
        dev->newest_answered = fence->sequence;
    if (spun)
        dev->fence_waits++;
    if (!fence_is_complete_locked(dev, fence)) {
        fence->waited = 1; /* the host waited until the GPU got there */
        dev->fence_waits++;
        if (fence->stream == PS_STREAM_NONE && fence->sequence > dev->waited_all_upto)
            dev->waited_all_upto = fence->sequence; /* every stream got past what was issued before it */
        if (dev->timed && dev->options.waits_move_clock && fence->due_ns > dev->clock_ns)
            dev->clock_ns = fence->due_ns;
    }
    pthread_mutex_unlock(&dev->lock);
    return PS_OK;
}

static void fake_fence_release(void *ctx, ps_fence_t *fence)
{
    fake_device_t *dev = ctx;
    if (!fence)
        return;
    pthread_mutex_lock(&dev->lock);
    fence->next = dev->recycled;
    dev->recycled = fence;
    dev->faults.live_fences--;
    pthread_mutex_unlock(&dev->lock);
}

static int fake_stream_wait_fence(void *ctx, ps_stream_t stream, ps_fence_t *fence)
{
    fake_device_t *dev = ctx;
    int fault = enter(dev, PS_FAKE_OP_STREAM_WAIT_FENCE);
    if (fault != PS_OK)
        return fault;
    dev->stream_waits++;
    count_on_stream(&dev->waits_by_stream, stream);
    pthread_mutex_unlock(&dev->lock);
    return PS_OK;
}

/* Guard mode over real host memory (backed only): the "device" bytes are
 * host bytes, and nothing runs behind the host's back. */
static int fake_memset_d8(void *ctx, void *ptr, uint8_t value, size_t bytes, ps_stream_t stream)
{
    int fault = count_call(ctx, PS_FAKE_OP_MEMSET_D8);
    if (fault != PS_OK)
        return fault;
    memset(ptr, value, bytes);
    return PS_OK;
}

static int fake_copy_to_host(void *ctx, void *dst, const void *src, size_t bytes, ps_stream_t stream)
{
    int fault = count_call(ctx, PS_FAKE_OP_COPY_TO_HOST);
    if (fault != PS_OK)
        return fault;
    memcpy(dst, src, bytes);
    return PS_OK;
}

/* Timed: when the GPU has finished everything issued so far. Lock held. */
static uint64_t idle_at_locked(const fake_device_t *dev)
{
    uint64_t idle = dev->gpu_busy_until_ns > dev->last_due_ns ? dev->gpu_busy_until_ns : dev->last_due_ns;
    return dev->barrier_last_due_ns > idle ? dev->barrier_last_due_ns : idle;
}

static int fake_device_synchronize(void *ctx)
{
    fake_device_t *dev = ctx;
    int fault = enter(dev, PS_FAKE_OP_DEVICE_SYNCHRONIZE);
    if (fault != PS_OK)
        return fault;
    dev->device_syncs++;
    dev->completed_upto = dev->fences_recorded;
    dev->barriers_completed_upto = dev->barriers;
    if (dev->timed) {
        uint64_t idle = idle_at_locked(dev);
        if (idle > dev->clock_ns) {
            dev->device_sync_ns += idle - dev->clock_ns;
            if (dev->options.waits_move_clock)
                dev->clock_ns = idle;
        }
    }
    pthread_mutex_unlock(&dev->lock);
    return PS_OK;
}

static int fake_barrier(void *ctx)
{
    fake_device_t *dev = ctx;
    int fault = enter(dev, PS_FAKE_OP_BARRIER);
    if (fault != PS_OK)
        return fault;
    int status = dev->barriers_blocked ? PS_EBUSY : PS_OK;
    if (status == PS_OK) {
        uint64_t number = ++dev->barriers;
        uint64_t due = dev->clock_ns + dev->options.lag_ns; /* like a fence recorded now */
        if (due < dev->gpu_busy_until_ns)
            due = dev->gpu_busy_until_ns;
        dev->barrier_due_ns[number % PS_BARRIER_RING] = due;
        if (due > dev->barrier_last_due_ns)
            dev->barrier_last_due_ns = due;
        if (dev->auto_complete && !dev->timed)
            dev->barriers_completed_upto = number;
    }
    pthread_mutex_unlock(&dev->lock);
    return status;
}

static unsigned fake_barrier_joined(void *ctx)
{
    fake_device_t *dev = ctx;
    pthread_mutex_lock(&dev->lock);
    unsigned joins = dev->barrier_joins;
    pthread_mutex_unlock(&dev->lock);
    return joins;
}

static uint64_t fake_barrier_generation(void *ctx)
{
    fake_device_t *dev = ctx;
    pthread_mutex_lock(&dev->lock);
    uint64_t newest = dev->barriers;
    pthread_mutex_unlock(&dev->lock);
    return newest;
}

/* Barrier `generation` has passed (4.): by the completed mark, by the
 * clock (timed), or by the test's say-so; older than the ring: when the
 * oldest remembered one has, as on the GPU. */
static int fake_barrier_passed(void *ctx, uint64_t generation)
{
    fake_device_t *dev = ctx;
    int fault = enter(dev, PS_FAKE_OP_BARRIER_PASSED);
    if (fault != PS_OK)
        return fault;
    int status = PS_ENOTREADY;
    if (generation > dev->barriers)
        status = PS_EINVAL; /* never issued */
    else if (generation == 0 || dev->barriers_assume_passed || generation <= dev->barriers_completed_upto)
        status = PS_OK;
    else {
        generation = ps_barrier_remembered(dev->barriers, generation);
        if (dev->timed && dev->clock_ns >= dev->barrier_due_ns[generation % PS_BARRIER_RING])
            status = PS_OK;
    }
    pthread_mutex_unlock(&dev->lock);
    return status;
}

/* Barrier `generation` and every earlier one have passed once this
 * returns (4.): the completed mark moves; timed, the clock moves to the
 * time the barrier passes. */
static int fake_barrier_wait(void *ctx, uint64_t generation)
{
    fake_device_t *dev = ctx;
    int fault = enter(dev, PS_FAKE_OP_BARRIER_WAIT);
    if (fault != PS_OK)
        return fault;
    int status = PS_OK;
    if (generation > dev->barriers) {
        status = PS_EINVAL; /* never issued */
    } else if (generation > dev->barriers_completed_upto) {
        generation = ps_barrier_remembered(dev->barriers, generation);
        if (dev->timed) {
            uint64_t due = dev->barrier_due_ns[generation % PS_BARRIER_RING], idle = idle_at_locked(dev);
            if (due > dev->clock_ns)
                dev->barrier_wait_ns += due - dev->clock_ns;
            if (idle > dev->clock_ns)
                dev->wait_instead_sync_ns += idle - dev->clock_ns;
            if (dev->options.waits_move_clock && due > dev->clock_ns)
                dev->clock_ns = due;
        }
        dev->barriers_completed_upto = generation;
    }
    if (status == PS_OK)
        dev->barrier_waits++;
    pthread_mutex_unlock(&dev->lock);
    return status;
}

/* ---- virtual memory ---------------------------------------------------- */

static size_t fake_vm_granularity(void *ctx)
{
    return ((fake_device_t *)ctx)->options.vm_granularity;
}

static int fake_vm_reserve(void *ctx, size_t size, void **out)
{
    fake_device_t *dev = ctx;
    size_t g = dev->options.vm_granularity;
    int fault = count_call(dev, PS_FAKE_OP_VM_RESERVE);
    if (fault != PS_OK)
        return fault;
    if (!size || size % g)
        return PS_EINVAL;
    if (dev->options.backed) {
        void *p = mmap(NULL, size + g, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED)
            return PS_ENOMEM;
        uintptr_t aligned = ps_align_up((uintptr_t)p, g); /* trim to a granule-aligned range */
        if (aligned > (uintptr_t)p)
            munmap(p, aligned - (uintptr_t)p);
        munmap((void *)(aligned + size), (uintptr_t)p + g - aligned);
        pthread_mutex_lock(&dev->lock);
        dev->faults.live_vm_ranges++;
        pthread_mutex_unlock(&dev->lock);
        *out = (void *)aligned;
        return PS_OK;
    }
    pthread_mutex_lock(&dev->lock);
    uintptr_t start = ps_align_up(dev->simulated_next, g);
    int status = start >= dev->simulated_next && size <= SIMULATED_END - start ? PS_OK : PS_ENOMEM;
    if (status == PS_OK) {
        dev->simulated_next = start + size;
        dev->faults.live_vm_ranges++;
        *out = (void *)start;
    }
    pthread_mutex_unlock(&dev->lock);
    return status;
}

static void fake_vm_release(void *ctx, void *addr, size_t size)
{
    fake_device_t *dev = ctx;
    pthread_mutex_lock(&dev->lock);
    dev->faults.live_vm_ranges--;
    pthread_mutex_unlock(&dev->lock);
    if (dev->options.backed)
        munmap(addr, size);
    /* simulated address space is not reused: ranges are few and large */
}

/* Makes [addr, addr + size) usable (backed or shareable); lock held. */
static int place_locked(fake_device_t *dev, void *addr, size_t size)
{
    int status = ps_ptr_map_reserve(&dev->vm_mapped, 1);
    if (status == PS_OK && dev->options.shareable)
        status = ps_ptr_map_reserve(&dev->vm_fds, 1);
    int fd = -1;
    if (status == PS_OK && dev->options.shareable) {
        fd = memfd_create("poolshim_fake_gpu", MFD_CLOEXEC);
        if (fd < 0 || ftruncate(fd, (off_t)size) != 0 ||
            mmap(addr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
            if (fd >= 0)
                close(fd);
            status = PS_ENOMEM;
        }
    } else if (status == PS_OK && dev->options.backed && mprotect(addr, size, PROT_READ | PROT_WRITE) != 0)
        status = PS_ENOMEM;
    if (status == PS_OK) {
        if (fd >= 0)
            ps_ptr_map_put(&dev->vm_fds, (uintptr_t)addr, (uint64_t)fd);
        ps_ptr_map_put(&dev->vm_mapped, (uintptr_t)addr, size);
    }
    return status;
}

/* Whether [addr, addr + size) is whole granules. */
static bool whole_granules(const void *addr, size_t size, size_t granule)
{
    return size && size % granule == 0 && (uintptr_t)addr % granule == 0;
}

/* vm_map and host_vm_map: new memory, admitted like mem_alloc's, placed at
 * `addr`. A host piece (PS_FAKE_OP_HOST_VM_MAP) is also kept in
 * host_mapped, and pinning it costs clock. */
static int map_new(fake_device_t *dev, ps_fake_op_t op, void *addr, size_t size, uint64_t *handle)
{
    bool host = op == PS_FAKE_OP_HOST_VM_MAP;
    int status = enter(dev, op);
    if (status != PS_OK)
        return status;
    size_t granule = host ? dev->options.host_vm_granularity : dev->options.vm_granularity;
    status = whole_granules(addr, size, granule) ? admit_locked(dev, size) : PS_EINVAL;
    if (status == PS_OK && host)
        status = ps_ptr_map_reserve(&dev->host_mapped, 1);
    if (status == PS_OK)
        status = ps_ptr_map_reserve(&dev->vm_handles, 1);
    if (status == PS_OK)
        status = place_locked(dev, addr, size);
    if (status == PS_OK) {
        if (host) {
            ps_ptr_map_put(&dev->host_mapped, (uintptr_t)addr, size);
            dev->host_vm_maps++;
        }
        dev->bytes_outstanding += size;
        dev->vm_maps++;
        *handle = ++dev->next_handle;
        ps_ptr_map_put(&dev->vm_handles, *handle, HANDLE_VALUE(size, 1, 0));
    }
    pthread_mutex_unlock(&dev->lock);
    if (status == PS_OK && host)
        charge_pinning(dev, size, 0);
    return status;
}

static int fake_vm_map(void *ctx, void *addr, size_t size, uint64_t *handle)
{
    return map_new(ctx, PS_FAKE_OP_VM_MAP, addr, size, handle);
}

static size_t fake_host_vm_granularity(void *ctx)
{
    return ((fake_device_t *)ctx)->options.host_vm_granularity;
}

/* host_vm_map: a piece of "page-locked host memory" mapped into a reserved
 * range. The fake has one kind of memory: like vm_map (same capacity,
 * same placing), but counted as a host piece, and pinning costs clock. */
static int fake_host_vm_map(void *ctx, void *addr, size_t size, uint64_t *handle)
{
    return map_new(ctx, PS_FAKE_OP_HOST_VM_MAP, addr, size, handle);
}

/* vm_map_handle: the kept physical memory is placed again, or memory
 * still mapped elsewhere gets a second mapping (an alias: the pool's remap
 * lends it); no admission (it is still counted). Faults as vm_map. */
static int fake_vm_map_handle(void *ctx, void *addr, size_t size, uint64_t handle)
{
    fake_device_t *dev = ctx;
    int status = enter(dev, PS_FAKE_OP_VM_MAP);
    if (status != PS_OK)
        return status;
    uint64_t kept, value = 0;
    int known = ps_ptr_map_get(&dev->vm_handles, handle, &value);
    int alias = known && HANDLE_MAPPINGS(value) > 0;
    if (!whole_granules(addr, size, dev->options.vm_granularity))
        status = PS_EINVAL;
    else if (alias && dev->options.no_vm_alias)
        status = PS_EUPSTREAM;
    else if (alias ? HANDLE_SIZE(value) != size || (value & HANDLE_RELEASED)
                   : !ps_ptr_map_get(&dev->vm_kept, handle, &kept) || kept != size)
        status = PS_EINVAL;
    if (status == PS_OK)
        status = place_locked(dev, addr, size);
    if (status == PS_OK) {
        if (!alias)
            ps_ptr_map_remove(&dev->vm_kept, handle, &kept);
        if (known)
            ps_ptr_map_put(&dev->vm_handles, handle, HANDLE_VALUE(size, HANDLE_MAPPINGS(value) + 1, 0));
        dev->vm_maps++;
        if (alias)
            dev->vm_aliases++;
        else
            dev->vm_maps_kept++;
    }
    pthread_mutex_unlock(&dev->lock);
    return status;
}

static int fake_vm_unmap(void *ctx, void *addr, size_t size, uint64_t handle);
static int fake_vm_unmap_keep(void *ctx, void *addr, size_t size, uint64_t handle);

/* vm_map_bare / vm_map_handle_bare: mapped as vm_map / vm_map_handle, but
 * not accessible (backed memory is PROT_NONE) until vm_access covers it. */
static int note_bare(fake_device_t *dev, void *addr, size_t size)
{
    pthread_mutex_lock(&dev->lock);
    int status = ps_ptr_map_reserve(&dev->vm_bare, 1);
    if (status == PS_OK) {
        ps_ptr_map_put(&dev->vm_bare, (uintptr_t)addr, size);
        dev->vm_bare_bytes += size;
        if (dev->options.backed || dev->options.shareable)
            mprotect(addr, size, PROT_NONE);
    }
    pthread_mutex_unlock(&dev->lock);
    return status;
}

static int fake_vm_map_bare(void *ctx, void *addr, size_t size, uint64_t *handle)
{
    int status = fake_vm_map(ctx, addr, size, handle);
    if (status == PS_OK && note_bare(ctx, addr, size) != PS_OK) {
        fake_vm_unmap(ctx, addr, size, *handle);
        status = PS_ENOMEM;
    }
    return status;
}

static int fake_vm_map_handle_bare(void *ctx, void *addr, size_t size, uint64_t handle)
{
    int status = fake_vm_map_handle(ctx, addr, size, handle);
    if (status == PS_OK && note_bare(ctx, addr, size) != PS_OK) {
        fake_vm_unmap_keep(ctx, addr, size, handle);
        status = PS_ENOMEM;
    }
    return status;
}

/* vm_access: the span must be whole mappings, end to end (as
 * cuMemSetAccess wants a fully mapped range). */
static int fake_vm_access(void *ctx, void *addr, size_t size)
{
    fake_device_t *dev = ctx;
    int fault = enter(dev, PS_FAKE_OP_VM_MAP);
    if (fault != PS_OK)
        return fault;
    uintptr_t at = (uintptr_t)addr, end = at + size;
    uint64_t mapped = 0;
    while (at < end && ps_ptr_map_get(&dev->vm_mapped, at, &mapped) && mapped)
        at += mapped;
    if (at != end || !size) {
        pthread_mutex_unlock(&dev->lock);
        return PS_EINVAL;
    }
    for (at = (uintptr_t)addr; at < end; at += mapped) {
        ps_ptr_map_get(&dev->vm_mapped, at, &mapped);
        uint64_t bare;
        if (ps_ptr_map_remove(&dev->vm_bare, at, &bare))
            dev->vm_bare_bytes -= bare;
    }
    if (dev->options.backed || dev->options.shareable)
        mprotect(addr, size, PROT_READ | PROT_WRITE);
    dev->vm_access_calls++;
    pthread_mutex_unlock(&dev->lock);
    return PS_OK;
}

static void fake_vm_drop(void *ctx, uint64_t handle)
{
    fake_device_t *dev = ctx;
    pthread_mutex_lock(&dev->lock);
    uint64_t kept, value;
    if (ps_ptr_map_remove(&dev->vm_kept, handle, &kept)) {
        dev->bytes_outstanding -= kept;
        ps_ptr_map_remove(&dev->vm_handles, handle, &value);
    } else if (ps_ptr_map_get(&dev->vm_handles, handle, &value) && HANDLE_MAPPINGS(value)) {
        /* still mapped elsewhere: freed with its last mapping */
        ps_ptr_map_put(&dev->vm_handles, handle, value | HANDLE_RELEASED);
    }
    pthread_mutex_unlock(&dev->lock);
}

/* Whether the GPU can no longer touch [addr, addr + size). Without noted
 * frees: every fence recorded so far has completed (the GPU is idle as far
 * as the fake knows). With them (ps_fake_gpu_note_free): every granule's
 * last noted free lies behind the GPU: a fence or barrier recorded after
 * it has truly completed (the completed marks, a host wait on an
 * all-streams fence, a device synchronize, or the clock; never the
 * assume_barriers_passed hook), or nothing was noted there. Removes the
 * granules' notes. Lock held. */
static int unmap_is_safe_locked(fake_device_t *dev, uintptr_t addr, size_t size)
{
    if (!dev->noting_frees)
        return all_fences_complete_locked(dev);
    size_t granule = dev->options.vm_granularity;
    int safe = 1;
    for (uintptr_t g = addr / granule * granule; g < addr + size; g += granule) {
        uint64_t index;
        if (!ps_ptr_map_remove(&dev->freed_at, g, &index))
            continue;
        const struct free_position *at = &dev->free_positions[index];
        /* timed: the GPU finishes work lag_ns after it was issued */
        int passed = dev->completed_upto > at->fences || dev->waited_all_upto > at->fences || dev->device_syncs > at->syncs ||
                     dev->barriers_completed_upto > at->barriers ||
                     (dev->timed && dev->clock_ns >= at->clock_ns + dev->options.lag_ns);
        safe = safe && passed;
    }
    return safe;
}

/* Unmaps [addr, addr + size); `keep`: its physical memory stays counted
 * under `handle` (vm_unmap_keep). Memory that is still mapped elsewhere
 * (an alias) stays counted either way: it is freed with its last mapping
 * once released (vm_unmap or vm_drop), as the driver does. */
static int vm_unmap_as(fake_device_t *dev, void *addr, size_t size, uint64_t handle, int keep)
{
    int fault = enter(dev, PS_FAKE_OP_VM_UNMAP);
    if (fault != PS_OK)
        return fault;
    uint64_t mapped;
    if (!ps_ptr_map_get(&dev->vm_mapped, (uintptr_t)addr, &mapped) || mapped != size ||
        (keep && ps_ptr_map_reserve(&dev->vm_kept, 1) != PS_OK)) {
        pthread_mutex_unlock(&dev->lock);
        return PS_EINVAL;
    }
    ps_ptr_map_remove(&dev->vm_mapped, (uintptr_t)addr, &mapped);
    uint64_t bare;
    if (ps_ptr_map_remove(&dev->vm_bare, (uintptr_t)addr, &bare))
        dev->vm_bare_bytes -= bare;
    uint64_t host_piece = 0;
    int unpinned = ps_ptr_map_remove(&dev->host_mapped, (uintptr_t)addr, &host_piece);
    if (unpinned)
        dev->host_vm_unmaps++;
    uint64_t fd;
    if (ps_ptr_map_remove(&dev->vm_fds, (uintptr_t)addr, &fd)) {
        mmap(addr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
        close((int)fd);
    } else if (dev->options.backed) {
        madvise(addr, size, MADV_DONTNEED);
        mprotect(addr, size, PROT_NONE);
    }
    if (!unmap_is_safe_locked(dev, (uintptr_t)addr, size))
        dev->unsafe_unmaps++;
    uint64_t value;
    if (ps_ptr_map_get(&dev->vm_handles, handle, &value) && HANDLE_MAPPINGS(value) > 1) {
        /* an alias goes: the memory stays under its other mappings */
        int released = (value & HANDLE_RELEASED) || !keep;
        ps_ptr_map_put(&dev->vm_handles, handle, HANDLE_VALUE(size, HANDLE_MAPPINGS(value) - 1, released));
        if (keep)
            dev->vm_keeps++;
    } else if (keep && !(ps_ptr_map_get(&dev->vm_handles, handle, &value) && (value & HANDLE_RELEASED))) {
        ps_ptr_map_put(&dev->vm_kept, handle, size);
        if (ps_ptr_map_get(&dev->vm_handles, handle, &value))
            ps_ptr_map_put(&dev->vm_handles, handle, HANDLE_VALUE(size, 0, 0));
        dev->vm_keeps++;
    } else {
        dev->bytes_outstanding -= size;
        ps_ptr_map_remove(&dev->vm_handles, handle, &value);
    }
    dev->vm_unmaps++;
    pthread_mutex_unlock(&dev->lock);
    if (unpinned)
        charge_pinning(dev, 0, 1);
    return PS_OK;
}

static int fake_vm_unmap(void *ctx, void *addr, size_t size, uint64_t handle)
{
    return vm_unmap_as(ctx, addr, size, handle, 0);
}

static int fake_vm_unmap_keep(void *ctx, void *addr, size_t size, uint64_t handle)
{
    return vm_unmap_as(ctx, addr, size, handle, 1);
}

/* ---- sharing (shareable) ---------------------------------------------- */

static int fake_ipc_export(void *ctx, uintptr_t addr, uintptr_t *start, size_t *size, int *fd)
{
    fake_device_t *dev = ctx;
    int fault = enter(dev, PS_FAKE_OP_IPC_EXPORT);
    if (fault != PS_OK)
        return fault;
    uintptr_t piece = 0;
    uint64_t piece_size = 0, memfd = 0;
    if (ps_ptr_map_get(&dev->vm_mapped, addr, &piece_size))
        piece = addr;
    else
        for (size_t i = 0; i < dev->vm_mapped.capacity && !piece; i++) {
            uintptr_t key = dev->vm_mapped.slots[i].key;
            if (key != PS_PTR_MAP_EMPTY && key <= addr && addr - key < dev->vm_mapped.slots[i].value) {
                piece = key;
                piece_size = dev->vm_mapped.slots[i].value;
            }
        }
    int status = piece && ps_ptr_map_get(&dev->vm_fds, piece, &memfd) ? PS_OK : PS_EINVAL;
    if (status == PS_OK && fd && (*fd = fcntl((int)memfd, F_DUPFD_CLOEXEC, 0)) < 0)
        status = PS_EUPSTREAM;
    pthread_mutex_unlock(&dev->lock);
    if (status == PS_OK) {
        *start = piece;
        *size = (size_t)piece_size;
    }
    return status;
}

static int fake_ipc_map(void *ctx, void *addr, size_t size, int fd, uint64_t *handle)
{
    fake_device_t *dev = ctx;
    int status = enter(dev, PS_FAKE_OP_IPC_MAP);
    if (status != PS_OK)
        return status;
    struct stat st;
    if (fstat(fd, &st) != 0 || (uint64_t)st.st_size < size || (uintptr_t)addr % dev->options.vm_granularity)
        status = PS_EINVAL;
    if (status == PS_OK)
        status = ps_ptr_map_reserve(&dev->ipc_mapped, 1);
    if (status == PS_OK && mmap(addr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED)
        status = PS_EUPSTREAM;
    if (status == PS_OK) {
        ps_ptr_map_put(&dev->ipc_mapped, (uintptr_t)addr, size);
        *handle = ++dev->next_handle;
    }
    pthread_mutex_unlock(&dev->lock);
    return status;
}

static int fake_ipc_unmap(void *ctx, void *addr, size_t size, uint64_t handle)
{
    fake_device_t *dev = ctx;
    pthread_mutex_lock(&dev->lock);
    uint64_t mapped;
    int status = ps_ptr_map_get(&dev->ipc_mapped, (uintptr_t)addr, &mapped) && mapped == size ? PS_OK : PS_EINVAL;
    if (status == PS_OK) {
        ps_ptr_map_remove(&dev->ipc_mapped, (uintptr_t)addr, &mapped);
        mmap(addr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    }
    pthread_mutex_unlock(&dev->lock);
    return status;
}

/* The device's maps (freed_at is made by ps_fake_gpu_note_free). */
#define DEVICE_MAPS(dev)                                                                                 \
    {&(dev)->live, &(dev)->fences_by_stream, &(dev)->waits_by_stream, &(dev)->vm_mapped, &(dev)->vm_fds, \
     &(dev)->ipc_mapped, &(dev)->host_mapped, &(dev)->vm_kept, &(dev)->vm_handles, &(dev)->vm_bare}

/* Fills the table the options ask for. */
static void fill_table(fake_device_t *dev, const ps_fake_gpu_options_t *options)
{
    dev->ops = (ps_gpu_ops_t){
        .ctx = dev,
        .device = -1,
        .mem_alloc = fake_mem_alloc,
        .mem_free = fake_mem_free,
        .mem_alloc_async = fake_mem_alloc_async,
        .mem_free_async = fake_mem_free_async,
        .mem_alloc_managed = fake_mem_alloc_managed,
        .mem_get_info = fake_mem_get_info,
        .fence_record = fake_fence_record,
        .fence_query = fake_fence_query,
        .fence_wait = fake_fence_wait,
        .fence_release = fake_fence_release,
        .stream_wait_fence = fake_stream_wait_fence,
        .device_synchronize = fake_device_synchronize,
        .barrier = fake_barrier,
        .barrier_generation = fake_barrier_generation,
        .barrier_passed = fake_barrier_passed,
        .barrier_wait = fake_barrier_wait,
        .barrier_joined = fake_barrier_joined,
        .host_alloc = fake_host_alloc,
        .host_free = fake_host_free,
    };
    if (options->backed) {
        dev->ops.memset_d8 = fake_memset_d8;
        dev->ops.copy_to_host = fake_copy_to_host;
    }
    if (options->virtual_memory) {
        dev->ops.vm_granularity = fake_vm_granularity;
        dev->ops.vm_reserve = fake_vm_reserve;
        dev->ops.vm_release = fake_vm_release;
        dev->ops.vm_map = fake_vm_map;
        dev->ops.vm_unmap = fake_vm_unmap;
        if (!options->no_vm_keep) {
            dev->ops.vm_unmap_keep = fake_vm_unmap_keep;
            dev->ops.vm_map_handle = fake_vm_map_handle;
            dev->ops.vm_drop = fake_vm_drop;
        }
        if (!options->no_vm_access && !options->no_vm_keep) {
            dev->ops.vm_map_bare = fake_vm_map_bare;
            dev->ops.vm_map_handle_bare = fake_vm_map_handle_bare;
            dev->ops.vm_access = fake_vm_access;
        }
        if (!options->no_host_vm) {
            dev->ops.host_vm_granularity = fake_host_vm_granularity;
            dev->ops.host_vm_map = fake_host_vm_map;
        }
    }
    if (options->virtual_memory && options->backed && options->shareable) {
        dev->ops.ipc_export = fake_ipc_export;
        dev->ops.ipc_reserve = fake_vm_reserve;
        dev->ops.ipc_release = fake_vm_release;
        dev->ops.ipc_map = fake_ipc_map;
        dev->ops.ipc_unmap = fake_ipc_unmap;
    }
}

/* The options with their defaults filled in; PS_EINVAL (said) for bad granularities. */
static int complete_options(const ps_fake_gpu_options_t *opts, ps_fake_gpu_options_t *options)
{
    *options = opts ? *opts : (ps_fake_gpu_options_t){0};
    if (!options->upstream_alignment)
        options->upstream_alignment = 2 * PS_MiB;
    if (!options->vm_granularity)
        options->vm_granularity = 2 * PS_MiB;
    if (!options->host_vm_granularity)
        options->host_vm_granularity = options->vm_granularity;
    if (!ps_is_pow2(options->vm_granularity) || options->vm_granularity < 4096) {
        ps_error("fake GPU: vm_granularity %zu is not a power of two >= 4096", options->vm_granularity);
        return PS_EINVAL;
    }
    if (!ps_is_pow2(options->upstream_alignment) || options->upstream_alignment < 256) {
        ps_error("fake GPU: upstream_alignment %zu is not a power of two >= 256", options->upstream_alignment);
        return PS_EINVAL;
    }
    return PS_OK;
}

int ps_fake_gpu_create(const ps_fake_gpu_options_t *opts, ps_gpu_ops_t **out)
{
    ps_fake_gpu_options_t options;
    int status = complete_options(opts, &options);
    if (status != PS_OK)
        return status;
    fake_device_t *dev = calloc(1, sizeof *dev);
    if (!dev)
        return PS_ENOMEM;
    ps_ptr_map_t *maps[] = DEVICE_MAPS(dev);
    size_t made = 0, count = sizeof maps / sizeof maps[0];
    while (made < count && ps_ptr_map_init(maps[made], made ? 16 : 64) == PS_OK)
        made++;
    if (made < count) {
        while (made)
            ps_ptr_map_free(maps[--made]);
        free(dev);
        return PS_ENOMEM;
    }
    pthread_mutex_init(&dev->lock, NULL);
    dev->options = options;
    dev->barrier_joins = options.barrier_joins;
    dev->auto_complete = options.auto_complete;
    dev->timed = options.lag_ns > 0;
    dev->simulated_next = SIMULATED_BASE;
    fill_table(dev, &options);
    *out = &dev->ops;
    return PS_OK;
}

void ps_fake_gpu_destroy(ps_gpu_ops_t *ops)
{
    if (!ops)
        return;
    fake_device_t *dev = ops->ctx;
    if (dev->options.backed)
        for (size_t i = 0; i < dev->live.capacity; i++)
            if (dev->live.slots[i].key != PS_PTR_MAP_EMPTY)
                free((void *)dev->live.slots[i].key);
    for (size_t i = 0; i < dev->vm_fds.capacity; i++)
        if (dev->vm_fds.slots[i].key != PS_PTR_MAP_EMPTY)
            close((int)dev->vm_fds.slots[i].value);
    ps_ptr_map_t *maps[] = DEVICE_MAPS(dev);
    for (size_t m = 0; m < sizeof maps / sizeof maps[0]; m++)
        ps_ptr_map_free(maps[m]);
    if (dev->noting_frees)
        ps_ptr_map_free(&dev->freed_at);
    free(dev->free_positions);
    for (struct ps_fence *fence = dev->all_fences, *next; fence; fence = next) {
        next = fence->all_next;
        free(fence);
    }
    pthread_mutex_destroy(&dev->lock);
    free(dev);
}

/* Reads one counter under the lock. */
#define FAKE_READ(ops, field)                                    \
    do {                                                         \
        fake_device_t *dev_ = (ops)->ctx;                        \
        pthread_mutex_lock(&dev_->lock);                         \
        uint64_t value_ = dev_->field;                           \
        pthread_mutex_unlock(&dev_->lock);                       \
        return value_;                                           \
    } while (0)

#define FAKE_READER(name, field) \
    uint64_t ps_fake_gpu_##name(ps_gpu_ops_t *ops) { FAKE_READ(ops, field); }
PS_FAKE_GPU_COUNTERS(FAKE_READER)
#undef FAKE_READER

ps_fake_gpu_mark_t ps_fake_gpu_mark(ps_gpu_ops_t *ops)
{
    fake_device_t *dev = ops->ctx;
    pthread_mutex_lock(&dev->lock);
    ps_fake_gpu_mark_t mark = {dev->fences_recorded, dev->device_syncs};
    pthread_mutex_unlock(&dev->lock);
    return mark;
}

int ps_fake_gpu_passed_since(ps_gpu_ops_t *ops, ps_fake_gpu_mark_t mark)
{
    fake_device_t *dev = ops->ctx;
    pthread_mutex_lock(&dev->lock);
    int passed = dev->newest_answered > mark.fences || dev->device_syncs > mark.syncs;
    pthread_mutex_unlock(&dev->lock);
    return passed;
}
void ps_fake_gpu_block_barriers(ps_gpu_ops_t *ops, int blocked)
{
    fake_device_t *dev = ops->ctx;
    pthread_mutex_lock(&dev->lock);
    dev->barriers_blocked = blocked;
    pthread_mutex_unlock(&dev->lock);
}

void ps_fake_gpu_set_barrier_joins(ps_gpu_ops_t *ops, unsigned joins)
{
    fake_device_t *dev = ops->ctx;
    pthread_mutex_lock(&dev->lock);
    dev->barrier_joins = joins;
    pthread_mutex_unlock(&dev->lock);
}

uint64_t ps_fake_gpu_fences_on_stream(ps_gpu_ops_t *ops, ps_stream_t stream)
{
    fake_device_t *dev = ops->ctx;
    pthread_mutex_lock(&dev->lock);
    uint64_t value = count_of_stream(&dev->fences_by_stream, stream);
    pthread_mutex_unlock(&dev->lock);
    return value;
}

uint64_t ps_fake_gpu_waits_on_stream(ps_gpu_ops_t *ops, ps_stream_t stream)
{
    fake_device_t *dev = ops->ctx;
    pthread_mutex_lock(&dev->lock);
    uint64_t value = count_of_stream(&dev->waits_by_stream, stream);
    pthread_mutex_unlock(&dev->lock);
    return value;
}

void ps_fake_gpu_complete_upto(ps_gpu_ops_t *ops, uint64_t seq)
{
    fake_device_t *dev = ops->ctx;
    pthread_mutex_lock(&dev->lock);
    if (seq > dev->fences_recorded)
        seq = dev->fences_recorded;
    if (seq > dev->completed_upto)
        dev->completed_upto = seq;
    pthread_mutex_unlock(&dev->lock);
}

void ps_fake_gpu_complete_all(ps_gpu_ops_t *ops)
{
    fake_device_t *dev = ops->ctx;
    pthread_mutex_lock(&dev->lock);
    dev->completed_upto = dev->fences_recorded;
    dev->barriers_completed_upto = dev->barriers;
    pthread_mutex_unlock(&dev->lock);
}

void ps_fake_gpu_complete_barriers_upto(ps_gpu_ops_t *ops, uint64_t generation)
{
    fake_device_t *dev = ops->ctx;
    pthread_mutex_lock(&dev->lock);
    if (generation > dev->barriers)
        generation = dev->barriers;
    if (generation > dev->barriers_completed_upto)
        dev->barriers_completed_upto = generation;
    pthread_mutex_unlock(&dev->lock);
}

int ps_fake_gpu_note_free(ps_gpu_ops_t *ops, const void *ptr, size_t size)
{
    fake_device_t *dev = ops->ctx;
    size_t granule = dev->options.vm_granularity;
    if (!granule || !size)
        return PS_OK;
    uintptr_t first = (uintptr_t)ptr / granule * granule, end = (uintptr_t)ptr + size;
    pthread_mutex_lock(&dev->lock);
    int status = PS_OK;
    if (!dev->noting_frees) {
        status = ps_ptr_map_init(&dev->freed_at, 64);
        dev->noting_frees = status == PS_OK;
    }
    if (status == PS_OK && dev->free_positions_count == dev->free_positions_capacity) {
        size_t capacity = dev->free_positions_capacity ? dev->free_positions_capacity * 2 : 256;
        struct free_position *bigger = realloc(dev->free_positions, capacity * sizeof *bigger);
        if (bigger) {
            dev->free_positions = bigger;
            dev->free_positions_capacity = capacity;
        } else {
            status = PS_ENOMEM;
        }
    }
    uint64_t index = dev->free_positions_count;
    if (status == PS_OK)
        status = ps_ptr_map_reserve(&dev->freed_at, (end - first) / granule + 1);
    if (status == PS_OK) {
        dev->free_positions[dev->free_positions_count++] =
            (struct free_position){dev->fences_recorded, dev->barriers, dev->clock_ns, dev->device_syncs};
        for (uintptr_t g = first; g < end; g += granule)
            ps_ptr_map_put(&dev->freed_at, g, index);
    }
    pthread_mutex_unlock(&dev->lock);
    return status;
}

void ps_fake_gpu_assume_barriers_passed(ps_gpu_ops_t *ops, int on)
{
    fake_device_t *dev = ops->ctx;
    pthread_mutex_lock(&dev->lock);
    dev->barriers_assume_passed = on;
    pthread_mutex_unlock(&dev->lock);
}

void ps_fake_gpu_set_auto_complete(ps_gpu_ops_t *ops, int on)
{
    fake_device_t *dev = ops->ctx;
    pthread_mutex_lock(&dev->lock);
    dev->auto_complete = on;
    if (on) {
        dev->completed_upto = dev->fences_recorded;
        dev->barriers_completed_upto = dev->barriers;
    }
    pthread_mutex_unlock(&dev->lock);
}

void ps_fake_gpu_set_clock(ps_gpu_ops_t *ops, uint64_t now_ns)
{
    fake_device_t *dev = ops->ctx;
    pthread_mutex_lock(&dev->lock);
    if (now_ns > dev->clock_ns)
        dev->clock_ns = now_ns;
    pthread_mutex_unlock(&dev->lock);
}

void ps_fake_gpu_set_gpu_busy_until(ps_gpu_ops_t *ops, uint64_t busy_until_ns)
{
    fake_device_t *dev = ops->ctx;
    pthread_mutex_lock(&dev->lock);
    dev->timed = 1;
    dev->gpu_busy_until_ns = busy_until_ns;
    pthread_mutex_unlock(&dev->lock);
}

void ps_fake_gpu_inject_failure(ps_gpu_ops_t *ops, uint64_t fail_after, uint64_t fail_count)
{
    fake_device_t *dev = ops->ctx;
    pthread_mutex_lock(&dev->lock);
    dev->fail_after = fail_after;
    dev->fail_count = fail_count;
    pthread_mutex_unlock(&dev->lock);
}

/* ---- fault plan ---------------------------------------------------------- */

const char *ps_fake_gpu_op_name(ps_fake_op_t op)
{
    return (unsigned)op <= PS_FAKE_OP_ANY ? OP_NAMES[op] : "?";
}

/* The natural error of a failing `op`. */
static int natural_error(ps_fake_op_t op)
{
    switch (op) {
    case PS_FAKE_OP_MEM_ALLOC:
    case PS_FAKE_OP_MEM_ALLOC_ASYNC:
    case PS_FAKE_OP_MEM_ALLOC_MANAGED:
    case PS_FAKE_OP_VM_RESERVE:
    case PS_FAKE_OP_VM_MAP:
    case PS_FAKE_OP_HOST_VM_MAP:
    case PS_FAKE_OP_HOST_ALLOC: return PS_ENOMEM;
    default: return PS_EUPSTREAM;
    }
}

uint64_t ps_fake_gpu_calls(ps_gpu_ops_t *ops, ps_fake_op_t op)
{
    if ((unsigned)op > PS_FAKE_OP_ANY)
        return 0;
    FAKE_READ(ops, faults.calls[op]);
}

int ps_fake_gpu_fail_call(ps_gpu_ops_t *ops, ps_fake_op_t op, uint64_t nth, int status)
{
    if ((unsigned)op > PS_FAKE_OP_ANY || !nth || status > 0 || status == PS_ENOTREADY)
        return PS_EINVAL;
    fake_device_t *dev = ops->ctx;
    pthread_mutex_lock(&dev->lock);
    int result = PS_ENOMEM;
    for (int i = 0; i < PS_FAKE_FAULTS_MAX; i++)
        if (!dev->faults.plan[i].nth) {
            dev->faults.plan[i] = (fake_fault_t){op, nth, status ? status : natural_error(op)};
            result = PS_OK;
            break;
        }
    pthread_mutex_unlock(&dev->lock);
    return result;
}

void ps_fake_gpu_clear_faults(ps_gpu_ops_t *ops)
{
    fake_device_t *dev = ops->ctx;
    pthread_mutex_lock(&dev->lock);
    memset(dev->faults.plan, 0, sizeof dev->faults.plan);
    pthread_mutex_unlock(&dev->lock);
}

uint64_t ps_fake_gpu_faults_fired(ps_gpu_ops_t *ops, ps_fake_op_t *op, uint64_t *call)
{
    fake_device_t *dev = ops->ctx;
    pthread_mutex_lock(&dev->lock);
    uint64_t fired = dev->faults.fired;
    if (op)
        *op = dev->faults.last_op;
    if (call)
        *call = dev->faults.last_call;
    pthread_mutex_unlock(&dev->lock);
    return fired;
}

