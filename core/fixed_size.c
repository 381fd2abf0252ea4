/* fixed_size: a suballocator of one block size (core/fixed_size.h).
 *
 * Algorithm:
 *  1. Memory comes from the upstream in batches of blocks_per_batch blocks,
 *     one upstream call per batch. Batches are kept sorted by address, each
 *     with a bitmap of the blocks handed out (host memory only: device
 *     memory is never read or written, so there are no in-band links).
 *  2. Free blocks safe for every stream sit on a LIFO stack of addresses
 *     ("clean"): allocate pops, free pushes, O(1).
 *  3. A block freed on stream s (cudaFreeAsync) goes to s's own stack and is
 *     reused at once by allocations on s. Another stream t takes it only
 *     under memory pressure, after core/reuse.c's handoff from s to t (t
 *     waits for a fence recorded on s; a cudaMalloc host-waits). The
 *     per-thread default stream is one handle for a stream per thread: its
 *     blocks go as with PS_STREAM_NONE (ps_reuse_list_stream).
 *  4. A block freed with PS_STREAM_NONE (cudaFree) follows free_sync:
 *     NONE    pushed on the clean stack at once;
 *     DEVICE  device_synchronize, then the clean stack;
 *     BARRIER (default) and EVENT: deferred to core/reuse.c, which owns
 *             the rule and hands blocks back to the clean stack. An
 *             allocation that finds nothing on its stream's stack or the
 *             clean stack reclaims (ps_reuse_reclaim: completed epochs,
 *             then one barrier, or a fence closed and polled when the
 *             barrier is refused or under EVENT). Still nothing clean: it
 *             grows; only when the upstream is out of memory does it
 *             host-wait the oldest fence.
 *  5. stream_destroyed(s): s's free list becomes a closed epoch under one
 *     fence recorded on s while the handle is valid (on failure: a device
 *     synchronize), and s's entry goes, so no fence or wait ever names s
 *     again and the stream table holds only live streams.
 *  6. Out of memory: PS_ENOMEM with the state unchanged (besides epochs
 *     that completed, which only makes blocks reusable).
 * Guarantees: every pointer aligned to `alignment`; O(1) allocate and free
 * (O(log batches) to validate a free); no block freed under BARRIER or
 * EVENT is reused before a barrier issued after its free, or a fence
 * recorded after its free completed; bad and double frees return PS_EINVAL
 * and change nothing. One mutex: thread-safe.
 */
#include "fixed_size.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* A growable array of block addresses. */
typedef struct block_list {
    void **items;    /* addresses */
    size_t count;    /* used entries */
    size_t capacity; /* allocated entries */
} block_list_t;

/* One upstream allocation of blocks_per_batch blocks. */
typedef struct batch {
    uintptr_t base;     /* first block's address */
    uint64_t *in_use;   /* bit i set: block i is handed out */
    size_t free_blocks; /* blocks of this batch that are not handed out (free or pending) */
} batch_t;

/* Blocks freed on one stream, reusable at once on that stream. */
typedef struct stream_list {
    ps_stream_t stream; /* the stream the blocks were freed on */
    block_list_t blocks;/* LIFO */
} stream_list_t;

typedef struct fixed_size {
    ps_resource_t base;          /* vtable first */
    const ps_gpu_ops_t *gpu;     /* fences and device sync */
    ps_fixed_size_options_t opts;/* effective options (block_size rounded) */
    pthread_mutex_t lock;        /* guards everything below */
    batch_t *batches;            /* sorted by base */
    size_t batch_count;          /* entries in batches */
    size_t batch_capacity;       /* allocated entries */
    block_list_t clean;          /* free and safe for every stream (capacity: every block) */
    stream_list_t *streams;      /* per-stream free lists */
    size_t stream_count;         /* entries in streams */
    ps_reuse_t reuse;            /* cudaFree'd blocks until a barrier or fence (core/reuse.c) */
    ps_resource_info_t info;     /* counters for query */
} fixed_size_t;

void ps_fixed_size_options_default(ps_fixed_size_options_t *opts)
{
    memset(opts, 0, sizeof *opts);
    opts->block_size = 256;
    opts->blocks_per_batch = 128;
    opts->alignment = 256;
    opts->free_sync = PS_FREE_SYNC_BARRIER;
}

static size_t batch_bytes(const fixed_size_t *fs) { return fs->opts.block_size * fs->opts.blocks_per_batch; }

/* Grows the list so that `extra` more entries fit. */
static int list_reserve(block_list_t *l, size_t extra)
{
    if (l->count + extra <= l->capacity)
        return PS_OK;
    size_t cap = l->capacity ? l->capacity : 16;
    while (cap < l->count + extra)
        cap *= 2;
    void **items = realloc(l->items, cap * sizeof *items);
    if (!items)
        return PS_ENOMEM;
    l->items = items;
    l->capacity = cap;
    return PS_OK;
}

/* Finds the batch holding `p`, or NULL. Lock held. */
static batch_t *find_batch(fixed_size_t *fs, uintptr_t p)
{
    size_t lo = 0, hi = fs->batch_count;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (p < fs->batches[mid].base)
            hi = mid;
        else if (p >= fs->batches[mid].base + batch_bytes(fs))
            lo = mid + 1;
        else
            return &fs->batches[mid];
    }
    return NULL;
}

enum { MARK_FREE = 0, MARK_IN_USE = 1 }; /* mark's states */

static void mark(fixed_size_t *fs, void *p, int state)
{
    batch_t *b = find_batch(fs, (uintptr_t)p);
    size_t i = ((uintptr_t)p - b->base) / fs->opts.block_size;
    if (state == MARK_IN_USE) {
        b->in_use[i / 64] |= (uint64_t)1 << (i % 64);
        b->free_blocks--;
    } else {
        b->in_use[i / 64] &= ~((uint64_t)1 << (i % 64));
        b->free_blocks++;
    }
}

/* Takes one batch from the upstream. Lock held. */
static int grow(fixed_size_t *fs)
{
    size_t n = fs->opts.blocks_per_batch;
    /* room on the clean stack for every block, so releasing never fails */
    if (list_reserve(&fs->clean, (fs->batch_count + 1) * n - fs->clean.count) != PS_OK)
        return PS_ENOMEM;
    if (fs->batch_count == fs->batch_capacity) {
        size_t cap = fs->batch_capacity ? fs->batch_capacity * 2 : 8;
        batch_t *nb = realloc(fs->batches, cap * sizeof *nb);
        if (!nb)
            return PS_ENOMEM;
        fs->batches = nb;
        fs->batch_capacity = cap;
    }
    uint64_t *bits = calloc((n + 63) / 64, sizeof *bits);
    if (!bits)
        return PS_ENOMEM;
    void *mem;
    int status = ps_allocate(fs->base.upstream, batch_bytes(fs), PS_STREAM_NONE, &mem);
    if (status != PS_OK) {
        free(bits);
        return status;
    }
    uintptr_t base = (uintptr_t)mem;
    if (base % fs->opts.alignment) {
        ps_error("fixed_size '%s': the upstream returned %p, not aligned to %zu", fs->base.name, mem,
                 fs->opts.alignment);
        ps_deallocate(fs->base.upstream, mem, batch_bytes(fs), PS_STREAM_NONE);
        free(bits);
        return PS_EUPSTREAM;
    }
    size_t at = 0;
    while (at < fs->batch_count && fs->batches[at].base < base)
        at++;
    memmove(&fs->batches[at + 1], &fs->batches[at], (fs->batch_count - at) * sizeof *fs->batches);
    fs->batches[at] = (batch_t){.base = base, .in_use = bits, .free_blocks = n};
    fs->batch_count++;
    /* push in reverse so the lowest address is handed out first */
    for (size_t i = n; i-- > 0;)
        fs->clean.items[fs->clean.count++] = (void *)(base + i * fs->opts.block_size);
    fs->info.upstream_allocs++;
    fs->info.bytes_reserved += batch_bytes(fs);
    if (fs->info.bytes_reserved > fs->info.peak_bytes_reserved)
        fs->info.peak_bytes_reserved = fs->info.bytes_reserved;
    return PS_OK;
}

/* The reuse state's release callback: a barrier or fence covers the
 * block; it goes on the clean stack (which has room for every block). */
static void release_clean(void *owner, uint64_t item)
{
    fixed_size_t *fs = owner;
    fs->clean.items[fs->clean.count++] = (void *)(uintptr_t)item;
}

static stream_list_t *find_stream(fixed_size_t *fs, ps_stream_t stream)
{
    for (size_t i = 0; i < fs->stream_count; i++)
        if (fs->streams[i].stream == stream)
            return &fs->streams[i];
    return NULL;
}

/* Under memory pressure: makes the blocks freed on another stream usable
 * by `stream`, through reuse's handoff (a fence on that stream;
 * PS_STREAM_NONE: host wait; else a GPU-side stream wait; refused or
 * failed, the next stream is tried). Returns 1 if any block moved. Lock
 * held. */
static int steal_from_streams(fixed_size_t *fs, ps_stream_t stream, block_list_t *into)
{
    for (size_t i = 0; i < fs->stream_count; i++) {
        stream_list_t *sl = &fs->streams[i];
        if (sl->stream == stream || sl->blocks.count == 0)
            continue;
        if (list_reserve(into, sl->blocks.count) != PS_OK)
            return 0;
        /* without a device table (free_sync none) no ordering is asked for */
        if (fs->gpu && ps_reuse_stream_handoff(fs->gpu, sl->stream, stream, &fs->info.fences_recorded,
                                               &fs->info.fence_waits) != PS_OK)
            continue;
        memcpy(&into->items[into->count], sl->blocks.items, sl->blocks.count * sizeof(void *));
        into->count += sl->blocks.count;
        sl->blocks.count = 0;
        return 1;
    }
    return 0;
}

static int fs_allocate(ps_resource_t *r, size_t size, ps_stream_t stream, void **out)
{
    fixed_size_t *fs = (fixed_size_t *)r;
    stream = ps_reuse_list_stream(stream); /* (the per-thread default stream: the cudaFree way) */
    if (size > fs->opts.block_size)
        return PS_EINVAL;
    pthread_mutex_lock(&fs->lock);
    block_list_t *from = NULL;
    stream_list_t *own = stream == PS_STREAM_NONE ? NULL : find_stream(fs, stream);
    if (own && own->blocks.count)
        from = &own->blocks;
    else if (fs->clean.count)
        from = &fs->clean;
    if (!from && fs->reuse.bytes_pending && ps_reuse_reclaim(&fs->reuse) && fs->clean.count)
        from = &fs->clean; /* a barrier, or epochs that completed */
    int status = PS_OK;
    if (!from) {
        status = grow(fs);
        if (status == PS_OK)
            from = &fs->clean;
    }
    if (!from && status == PS_ENOMEM) {
        /* memory pressure: wait for fences, oldest first */
        while (!fs->clean.count && ps_reuse_wait_oldest(&fs->reuse))
            ps_reuse_poll(&fs->reuse);
        if (fs->clean.count)
            from = &fs->clean;
        else {
            block_list_t *into = own ? &own->blocks : &fs->clean;
            if (steal_from_streams(fs, stream, into))
                from = into;
        }
    }
    if (from) {
        void *p = from->items[--from->count];
        mark(fs, p, MARK_IN_USE);
        fs->info.bytes_in_use += fs->opts.block_size;
        *out = p;
        status = PS_OK;
    }
    pthread_mutex_unlock(&fs->lock);
    return status;
}

static int fs_deallocate(ps_resource_t *r, void *ptr, size_t size, ps_stream_t stream)
{
    fixed_size_t *fs = (fixed_size_t *)r;
    stream = ps_reuse_list_stream(stream);
    pthread_mutex_lock(&fs->lock);
    batch_t *b = find_batch(fs, (uintptr_t)ptr);
    size_t offset = b ? (uintptr_t)ptr - b->base : 1;
    size_t i = offset / fs->opts.block_size;
    if (!b || offset % fs->opts.block_size || !(b->in_use[i / 64] & ((uint64_t)1 << (i % 64)))) {
        pthread_mutex_unlock(&fs->lock);
        return PS_EINVAL;
    }
    block_list_t *to = NULL; /* NULL: deferred to the reuse state */
    if (stream != PS_STREAM_NONE) {
        stream_list_t *sl = find_stream(fs, stream);
        if (!sl) {
            stream_list_t *ns = realloc(fs->streams, (fs->stream_count + 1) * sizeof *ns);
            if (!ns) {
                pthread_mutex_unlock(&fs->lock);
                return PS_ENOMEM;
            }
            fs->streams = ns;
            sl = &fs->streams[fs->stream_count++];
            *sl = (stream_list_t){.stream = stream};
        }
        to = &sl->blocks;
    } else if (!ps_reuse_defers(&fs->reuse)) {
        to = &fs->clean;
    }
    if (to && list_reserve(to, 1) != PS_OK) {
        pthread_mutex_unlock(&fs->lock);
        return PS_ENOMEM;
    }
    if (stream == PS_STREAM_NONE && fs->opts.free_sync == PS_FREE_SYNC_DEVICE) {
        int status = fs->gpu->device_synchronize(fs->gpu->ctx);
        if (status == PS_EBUSY) {
            to = NULL; /* a stream capture is open: the block waits in the reuse state instead */
        } else if (status != PS_OK) {
            pthread_mutex_unlock(&fs->lock);
            return status;
        }
    }
    if (to) {
        to->items[to->count++] = ptr;
    } else if (ps_reuse_defer(&fs->reuse, (uintptr_t)ptr, fs->opts.block_size) != PS_OK) {
        pthread_mutex_unlock(&fs->lock);
        return PS_ENOMEM;
    }
    mark(fs, ptr, MARK_FREE);
    fs->info.bytes_in_use -= fs->opts.block_size;
    pthread_mutex_unlock(&fs->lock);
    return PS_OK;
}

/* Removes from `l` every address inside [base, base+bytes). */
static void list_remove_range(block_list_t *l, uintptr_t base, size_t bytes)
{
    size_t kept = 0;
    for (size_t i = 0; i < l->count; i++)
        if ((uintptr_t)l->items[i] - base >= bytes)
            l->items[kept++] = l->items[i];
    l->count = kept;
}

/* Gives every batch whose blocks are all clean back to the upstream. */
static int fs_trim(ps_resource_t *r)
{
    fixed_size_t *fs = (fixed_size_t *)r;
    pthread_mutex_lock(&fs->lock);
    ps_reuse_poll(&fs->reuse);
    size_t n = fs->opts.blocks_per_batch;
    for (size_t b = 0; b < fs->batch_count;) {
        batch_t *bt = &fs->batches[b];
        size_t clean_here = 0;
        for (size_t i = 0; i < fs->clean.count; i++)
            clean_here += (uintptr_t)fs->clean.items[i] - bt->base < batch_bytes(fs);
        if (bt->free_blocks != n || clean_here != n) {
            b++;
            continue;
        }
        if (ps_deallocate(fs->base.upstream, (void *)bt->base, batch_bytes(fs), PS_STREAM_NONE) != PS_OK) {
            b++;
            continue;
        }
        list_remove_range(&fs->clean, bt->base, batch_bytes(fs));
        free(bt->in_use);
        memmove(bt, bt + 1, (fs->batch_count - b - 1) * sizeof *bt);
        fs->batch_count--;
        fs->info.upstream_frees++;
        fs->info.bytes_reserved -= batch_bytes(fs);
    }
    pthread_mutex_unlock(&fs->lock);
    return PS_OK;
}

static void fs_query(ps_resource_t *r, ps_resource_info_t *info)
{
    fixed_size_t *fs = (fixed_size_t *)r;
    pthread_mutex_lock(&fs->lock);
    *info = fs->info;
    info->bytes_pending = fs->reuse.bytes_pending;
    info->fences_recorded += fs->reuse.fences_recorded;
    info->fence_waits += fs->reuse.fence_waits;
    info->barriers += fs->reuse.barriers;
    info->bytes_free = info->bytes_reserved - info->bytes_in_use - info->bytes_pending;
    info->largest_free_block = fs->clean.count ? fs->opts.block_size : 0;
    pthread_mutex_unlock(&fs->lock);
}

static void fs_destroy(ps_resource_t *r)
{
    fixed_size_t *fs = (fixed_size_t *)r;
    ps_reuse_destroy(&fs->reuse);
    for (size_t b = 0; b < fs->batch_count; b++) {
        ps_deallocate(fs->base.upstream, (void *)fs->batches[b].base, batch_bytes(fs), PS_STREAM_NONE);
        free(fs->batches[b].in_use);
    }
    for (size_t s = 0; s < fs->stream_count; s++)
        free(fs->streams[s].blocks.items);
    free(fs->streams);
    free(fs->batches);
    free(fs->clean.items);
    pthread_mutex_destroy(&fs->lock);
    free(fs);
}

/* The program is about to destroy `stream`: its free list is retired as a
 * closed epoch under a fence recorded on it now, and its entry goes. */
static void fs_stream_destroyed(ps_resource_t *r, ps_stream_t stream)
{
    fixed_size_t *fs = (fixed_size_t *)r;
    if (!ps_reuse_stream_ordered(stream)) /* no list of its own */
        return;
    pthread_mutex_lock(&fs->lock);
    stream_list_t *sl = find_stream(fs, stream);
    if (!sl) {
        pthread_mutex_unlock(&fs->lock);
        return;
    }
    block_list_t blocks = sl->blocks;
    ps_reuse_list_t retired = {0};
    for (size_t i = 0; i < blocks.count; i++)
        if (ps_reuse_list_push(&retired, (uintptr_t)blocks.items[i], fs->opts.block_size) != PS_OK) {
            /* no host memory for the list: wait for the whole device, then
             * every block is safe as it is */
            if (fs->gpu)
                fs->gpu->device_synchronize(fs->gpu->ctx);
            for (size_t j = 0; j < blocks.count; j++)
                fs->clean.items[fs->clean.count++] = blocks.items[j];
            free(retired.items);
            retired = (ps_reuse_list_t){0};
            break;
        }
    /* a closed epoch under a fence on the stream (device sync without one) */
    ps_reuse_retire(&fs->reuse, &retired, stream);
    free(blocks.items);
    *sl = fs->streams[--fs->stream_count];
    if (fs->stream_count == 0) {
        free(fs->streams);
        fs->streams = NULL;
    }
    pthread_mutex_unlock(&fs->lock);
}

static const ps_resource_ops_t fixed_size_ops = {
    .type_name = "fixed_size",
    .allocate = fs_allocate,
    .deallocate = fs_deallocate,
    .trim = fs_trim,
    .query = fs_query,
    .destroy = fs_destroy,
    .stream_destroyed = fs_stream_destroyed,
};

int ps_fixed_size_create(const char *name, ps_resource_t *upstream, const ps_gpu_ops_t *gpu,
                         const ps_fixed_size_options_t *opts, ps_resource_t **out)
{
    ps_fixed_size_options_t o;
    if (opts)
        o = *opts;
    else
        ps_fixed_size_options_default(&o);
    if (!upstream || !out || !ps_is_pow2(o.alignment) || o.alignment < 256 ||
        o.blocks_per_batch == 0 || o.block_size == 0) {
        ps_error("fixed_size: invalid options (alignment must be a power of two >= 256, "
                 "block_size and blocks_per_batch > 0)");
        return PS_EINVAL;
    }
    if (!gpu && o.free_sync != PS_FREE_SYNC_NONE) {
        ps_error("fixed_size: free_sync other than none needs a GPU-ops table");
        return PS_EINVAL;
    }
    o.block_size = ps_align_up(o.block_size, o.alignment);
    if (o.block_size == 0 || o.blocks_per_batch > SIZE_MAX / o.block_size)
        return PS_EINVAL;
    fixed_size_t *fs = calloc(1, sizeof *fs);
    if (!fs)
        return PS_ENOMEM;
    fs->base.ops = &fixed_size_ops;
    fs->base.name = name ? name : "fixed_size";
    fs->base.upstream = upstream;
    fs->gpu = gpu;
    fs->opts = o;
    ps_reuse_init(&fs->reuse, gpu, o.free_sync, 0, NULL, release_clean, fs);
    pthread_mutex_init(&fs->lock, NULL);
    *out = &fs->base;
    return PS_OK;
}
