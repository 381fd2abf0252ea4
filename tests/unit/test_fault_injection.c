/* Fault injection over every GPU call site: for each stack, one scripted
 * workload runs clean and counts its GPU-op calls (N, stack creation
 * included, destruction not); then it runs again once for each call number
 * n in 1..N (or an even sample of SAMPLE of them), with call n failing
 * (the fake GPU's fault plan, tools/sim/fake_gpu.h). After every step:
 *   a. a step that returned an error had the injected failure fire during
 *      it, and the error is the injected one or PS_ENOMEM (a failed growth);
 *      a failure that no caller reports is a best-effort site (listed below);
 *   b. the stack is consistent: ps_pool_check on every pool, in use <=
 *      reserved, and what the resource over the device says it reserved is
 *      what the fake device has outstanding; no vm_unmap while a fence
 *      was incomplete;
 *   d. the step is retried at once when it failed, and must then succeed
 *      (the plan fails one call only): the workload goes on.
 * At the end (c): everything freed and trimmed, the stack destroyed, the
 * fake device has no bytes outstanding, no live fence, no reserved range.
 *
 * The workload (workload_step): ~300 deterministic steps of allocate (sizes
 * 0 .. max_request over orders of magnitude) and free (on the block's own
 * stream, sometimes on the other stream or with cudaFree), cudaMalloc-style
 * and stream-ordered on two fake streams; the device's fences complete
 * only when the script says (every COMPLETE_EVERY steps: a lagging GPU);
 * stream A is destroyed midway (its live blocks are freed later on B or
 * with cudaFree, a third stream C takes its place); a trim at the end. The
 * device has a capacity, so the memory-pressure paths run in the clean run.
 *
 * Call sites covered (core/): the calls each stack makes in this workload,
 * per the per-entry counters (printed with POOLSHIM_FAULTS_VERBOSE=1):
 *   upstream.c  mem_alloc (allocate), mem_free (deallocate, destroy not)
 *   pool*.c     fence_record (close epoch, stream lists and steal in
 *               pool_streams.c), fence_query
 *               (poll epochs and stream lists), fence_wait (pressure),
 *               stream_wait_fence (steal), device_synchronize (unmap, trim,
 *               stream_destroyed, free_sync device), barrier (free_sync
 *               barrier, eager and when nothing fits), barrier_passed
 *               (remap's idle check), barrier_wait (remap of pieces a
 *               barrier released that has not passed: a failure falls back
 *               to device_synchronize), mem_get_info and vm_reserve (expandable
 *               range), vm_map/vm_unmap (vm_range.c), vm_unmap_keep and
 *               vm_map_handle (remap moving kept memory: the fake counts them
 *               as vm_unmap and vm_map calls; vm_drop cannot fail)
 *   host_vm.c   host_vm_map (the pinned pool's host range: its pieces; the
 *               range's vm_reserve and vm_unmap are the device's, counted
 *               as above), under the pool's expandable mode with event
 *               free_sync and grow_budget_percent (fit_budget_locked, core/pool.c)
 *   arena.c     fence_record/query/wait, stream_wait_fence, device_synchronize
 *   fixed_size.c fence_record/query/wait, stream_wait_fence, device_synchronize
 * Best effort (a failure is absorbed, never reported; the workload goes
 * on): fence_query (counts as "not yet"), barrier (falls back to fences),
 * stream_wait_fence and fence_wait in steals and retirements (fall back to
 * a host wait or keep the block pending), device_synchronize before an
 * unmap (nothing is unmapped), every call of trim and stream_destroyed.
 * Not covered: calls made while destroying a stack (destroy cannot report).
 * Each barrier of the clean run (up to SAMPLE / 4) is also made to answer
 * PS_EBUSY (a stream capture is open) instead of PS_EUPSTREAM.
 * POOLSHIM_FAULTS_ALL=1 runs every n instead of the sample;
 * POOLSHIM_FAULTS_SEED=k runs another script (default 12345).
 */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../core/adaptors.h"
#include "../../core/arena.h"
#include "../../core/binning.h"
#include "../../core/fixed_size.h"
#include "../../tools/sim/fake_gpu.h"
#include "../../core/host_vm.h"
#include "../../core/pool.h"
#include "../../core/upstream.h"

enum {
    STEPS = 600,          /* workload steps (allocate or free) */
    DESTROY_AT = 300,     /* stream A is destroyed before this step */
    COMPLETE_EVERY = 37,  /* the GPU catches up every this many steps */
    MAX_LIVE = 48,        /* live blocks at most */
    SAMPLE = 300,         /* injected failures per stack at most */
    MAX_OWNED = 8,        /* resources in one stack */
};

static const ps_stream_t STREAM_A = 0x5000, STREAM_B = 0x6000, STREAM_C = 0x7000;

typedef struct stack {
    ps_gpu_ops_t *gpu;               /* the fake device */
    ps_resource_t *owned[MAX_OWNED]; /* upstream first; destroyed in reverse */
    size_t owned_count;              /* entries in owned */
    ps_resource_t *pools[4];         /* the pools in the stack (ps_pool_check) */
    size_t pool_count;               /* entries in pools */
    ps_resource_t *base;             /* the resource over the upstream (its reserved == the device's) */
    ps_resource_t *top;              /* the stack under test */
    ps_gpu_ops_t *host_range;        /* pinned_expandable: the host range's table (core/host_vm.h) */
    int unordered_only;              /* 1: every allocate and free is cudaMalloc-style (PS_STREAM_NONE), as
                                        cudaHostAlloc/cudaFreeHost are: the pinned pool sees nothing else.
                                        (With stream-ordered frees the fake's judge would call an unmap
                                        after a host wait on a one-stream fence unsafe: it credits only
                                        all-streams fences, while the stream-ordered contract makes such
                                        a block idle once its stream's fence passed.) */
    size_t max_request;              /* largest size the stack serves */
} stack_t;

/* Keeps *r (made with `status`) in the stack. */
static int own(stack_t *s, int status, ps_resource_t **r)
{
    if (status == PS_OK) {
        s->owned[s->owned_count++] = *r;
        s->top = *r;
    }
    return status;
}

static int make_upstream(stack_t *s)
{
    ps_resource_t *r;
    return own(s, ps_cuda_resource_create("cuda", s->gpu, &r), &r);
}

static ps_pool_options_t pool_options(ps_free_sync_t policy)
{
    ps_pool_options_t o;
    ps_pool_options_default(&o);
    o.free_sync = policy;
    o.min_chunk = 2 * PS_MiB;
    o.max_chunk = 16 * PS_MiB;
    o.epoch_wait_ns = 0; /* no time-bounded polling: the run is deterministic */
    o.expandable_reserve = 256 * PS_MiB;
    return o;
}

/* A pool over what is on top of the stack. */
static int add_pool(stack_t *s, ps_free_sync_t policy, int mem_get_info)
{
    ps_pool_options_t o = pool_options(policy);
    if (mem_get_info)
        o.expandable_reserve = 0; /* sized from mem_get_info */
    ps_resource_t *r;
    int status = own(s, ps_pool_create("pool", s->top, s->gpu, &o, &r), &r);
    if (status == PS_OK)
        s->pools[s->pool_count++] = s->base = r;
    return status;
}

static int make_pool_chunked(stack_t *s)
{
    int status = make_upstream(s);
    s->max_request = 5 * PS_MiB;
    return status ? status : add_pool(s, PS_FREE_SYNC_BARRIER, 0);
}

static int make_pool_expandable(stack_t *s) /* the device has virtual memory */
{
    int status = make_upstream(s);
    s->max_request = 5 * PS_MiB;
    return status ? status : add_pool(s, PS_FREE_SYNC_BARRIER, 1);
}

static int make_pool_event(stack_t *s)
{
    int status = make_upstream(s);
    s->max_request = 5 * PS_MiB;
    return status ? status : add_pool(s, PS_FREE_SYNC_EVENT, 0);
}

static int make_pool_device(stack_t *s)
{
    int status = make_upstream(s);
    s->max_request = 5 * PS_MiB;
    return status ? status : add_pool(s, PS_FREE_SYNC_DEVICE, 0);
}

/* The pinned pool's default stack where the driver maps host pieces: a
 * pool in expandable mode over the host range's table, event free_sync,
 * the growth bound and budget of [host] (cuMemHostAlloc slabs unused). */
static int make_pinned_expandable(stack_t *s)
{
    ps_resource_t *r;
    s->max_request = 5 * PS_MiB;
    s->unordered_only = 1;
    int status = own(s, ps_host_resource_create("pinned", s->gpu, PS_HOST_ALLOC_PORTABLE | PS_HOST_ALLOC_MAPPED, &r),
                     &r);
    if (status == PS_OK && !s->host_range)
        status = ps_host_vm_create(s->gpu, &s->host_range);
    if (status)
        return status;
    ps_pool_options_t o = pool_options(PS_FREE_SYNC_EVENT);
    o.expandable = 1;
    o.grow_budget_percent = 110;
    o.pending_wait_bytes = 4 * PS_MiB;
    o.pending_wait_percent = 10;
    o.thread_cache = 0;
    status = own(s, ps_pool_create("host", s->top, s->host_range, &o, &r), &r);
    if (status == PS_OK)
        s->pools[s->pool_count++] = s->base = r;
    return status;
}

static int make_arena(stack_t *s)
{
    int status = make_upstream(s);
    s->max_request = 5 * PS_MiB;
    if (status)
        return status;
    ps_arena_options_t o;
    ps_arena_options_default(&o);
    ps_resource_t *r;
    status = own(s, ps_arena_create("arena", s->top, s->gpu, &o, &r), &r);
    s->base = s->top;
    return status;
}

static int make_fixed_size(stack_t *s)
{
    int status = make_upstream(s);
    s->max_request = 4096;
    if (status)
        return status;
    ps_fixed_size_options_t o;
    ps_fixed_size_options_default(&o);
    o.block_size = 4096;
    o.blocks_per_batch = 64;
    ps_resource_t *r;
    status = own(s, ps_fixed_size_create("fixed", s->top, s->gpu, &o, &r), &r);
    s->base = s->top;
    return status;
}

static int make_binning_over_pool(stack_t *s)
{
    int status = make_upstream(s);
    s->max_request = 3 * PS_MiB;
    if (status || (status = add_pool(s, PS_FREE_SYNC_BARRIER, 0)))
        return status;
    ps_resource_t *pool = s->top;
    ps_bin_t bins[2];
    size_t sizes[2] = {512, 8192};
    for (int i = 0; i < 2; i++) {
        ps_fixed_size_options_t o;
        ps_fixed_size_options_default(&o);
        o.block_size = sizes[i];
        o.blocks_per_batch = 32;
        bins[i].max_size = sizes[i];
        if ((status = own(s, ps_fixed_size_create("bin", pool, s->gpu, &o, &bins[i].resource), &bins[i].resource)))
            return status;
    }
    ps_resource_t *r;
    return own(s, ps_binning_create("binning", bins, 2, pool, &r), &r);
}

static int make_adaptors_over_pool(stack_t *s) /* track over stats over limit over a pool */
{
    int status = make_upstream(s);
    s->max_request = 5 * PS_MiB;
    if (status || (status = add_pool(s, PS_FREE_SYNC_BARRIER, 0)))
        return status;
    ps_resource_t *r;
    if ((status = own(s, ps_limit_create("limit", s->top, (size_t)1 << 40, &r), &r)) ||
        (status = own(s, ps_stats_create("stats", s->top, &r), &r)))
        return status;
    return own(s, ps_track_create("track", s->top, 0, &r), &r);
}

typedef struct stack_kind {
    const char *name;           /* row name */
    int (*make)(stack_t *s);    /* builds the stack on s->gpu; an error leaves what was built in s */
    int virtual_memory;         /* the device offers vm_* */
    size_t capacity;            /* device bytes: tight enough for the pressure paths */
} stack_kind_t;

#ifndef CAP
#define CAP (128 * PS_MiB)
#endif
static const stack_kind_t KINDS[] = {
    {"pool_chunked", make_pool_chunked, 0, CAP},
    {"pool_expandable", make_pool_expandable, 1, CAP},
    {"pinned_expandable", make_pinned_expandable, 1, CAP},
    {"pool_event", make_pool_event, 0, CAP},
    {"pool_device", make_pool_device, 0, CAP},
    {"arena", make_arena, 0, 2 * CAP},
    {"fixed_size", make_fixed_size, 0, CAP},
    {"binning_over_pool", make_binning_over_pool, 0, CAP},
    {"adaptors_over_pool", make_adaptors_over_pool, 0, CAP},
};
#define KIND_COUNT (sizeof KINDS / sizeof KINDS[0])

static void stack_destroy(stack_t *s)
{
    while (s->owned_count)
        ps_destroy(s->owned[--s->owned_count]);
    ps_host_vm_destroy(s->host_range); /* after the pool over it */
    s->host_range = NULL;
    s->pool_count = 0;
    s->base = s->top = NULL;
}

/* One run of the workload; `fail_at` 0 = clean. */
typedef struct run {
    const stack_kind_t *kind; /* the stack */
    uint64_t fail_at;         /* the call number that fails (0: none) */
    stack_t s;                /* the stack */
    struct {
        void *ptr;            /* block */
        size_t size;          /* bytes asked */
        ps_stream_t stream;   /* stream it was allocated on */
    } live[MAX_LIVE];         /* live blocks */
    size_t live_count;        /* entries in live */
    unsigned seed;            /* the script's random state */
    uint64_t fired;           /* failures the plan fired so far */
    uint64_t errors;          /* steps that returned an error */
    uint64_t unsafe_excused;  /* unsafe unmaps that were a failed vm_map's undo */
} run_t;

static const char *where(const run_t *r, int step)
{
    static char text[160];
    ps_fake_op_t op = PS_FAKE_OP_ANY;
    uint64_t call = 0;
    uint64_t fired = ps_fake_gpu_faults_fired(r->s.gpu, &op, &call);
    snprintf(text, sizeof text, "%s, call %llu failing (%s #%llu, fired %llu), step %d", r->kind->name,
             (unsigned long long)r->fail_at, fired ? ps_fake_gpu_op_name(op) : "-", (unsigned long long)call,
             (unsigned long long)fired, step);
    return text;
}

/* b: the stack's metadata and accounting. */
static void check_consistent(run_t *r, int step)
{
    stack_t *s = &r->s;
    for (size_t i = 0; i < s->pool_count; i++)
        cr_assert_eq(ps_pool_check(s->pools[i]), PS_OK, "%s: ps_pool_check", where(r, step));
    ps_resource_info_t top = {0}, base = {0};
    ps_query(s->top, &top);
    ps_query(s->base, &base);
    cr_assert_leq(top.bytes_in_use, top.bytes_reserved, "%s: in use %llu > reserved %llu", where(r, step),
                  (unsigned long long)top.bytes_in_use, (unsigned long long)top.bytes_reserved);
    cr_assert_eq(base.bytes_reserved, ps_fake_gpu_bytes_outstanding(s->gpu),
                 "%s: %s says %llu bytes reserved, the device has %llu outstanding", where(r, step), s->base->name,
                 (unsigned long long)base.bytes_reserved, (unsigned long long)ps_fake_gpu_bytes_outstanding(s->gpu));
    cr_assert_leq(ps_fake_gpu_unsafe_unmaps(s->gpu), r->unsafe_excused,
                  "%s: unmapped while a fence was incomplete", where(r, step));
}

/* a: a step that failed had the injected failure fire during it. Returns
 * 1 for a genuine out-of-memory instead: once a failure changed the
 * stack's layout (a smaller growth step, say), the device may really be
 * full (within one largest request of its capacity) where the clean run
 * just fit; such a step is skipped, not retried. */
static int check_status(run_t *r, int step, int status, uint64_t fired_before)
{
    uint64_t fired = ps_fake_gpu_faults_fired(r->s.gpu, NULL, NULL);
    if (status == PS_OK)
        return 0;
    r->errors++;
    uint64_t outstanding = ps_fake_gpu_bytes_outstanding(r->s.gpu);
    if (status == PS_ENOMEM && fired == fired_before && fired && outstanding + r->s.max_request > r->kind->capacity)
        return 1;
    ps_resource_info_t info = {0};
    ps_query(r->s.top, &info);
    cr_assert_neq(fired, fired_before, "%s: error %d with no injected failure (in use %llu, reserved %llu, device %llu)",
                  where(r, step), status, (unsigned long long)info.bytes_in_use, (unsigned long long)info.bytes_reserved,
                  (unsigned long long)outstanding);
    cr_assert(status == PS_ENOMEM || status == PS_EUPSTREAM || status == PS_EBUSY,
              "%s: error %d is neither the injected one nor ENOMEM", where(r, step), status);
    return 0;
}

/* Sizes over orders of magnitude, up to max, multiples of 256 often. */
static size_t script_size(unsigned *seed, size_t max)
{
    if (rand_r(seed) % 4 == 0) /* a quarter are large: the device fills up */
        return max / 2 + (size_t)rand_r(seed) % (max / 2 + 1);
    unsigned bits = (unsigned)(rand_r(seed) % 16 == 0 ? 0 : 1 + rand_r(seed) % 23);
    size_t size = bits ? (size_t)rand_r(seed) % ((size_t)1 << bits) : 0;
    return size > max ? max : size;
}

/* Performs one operation; retried as is when it fails (d). */
typedef struct action {
    int kind;          /* 0 allocate, 1 free, 2 trim */
    size_t size;       /* allocate/free: bytes */
    ps_stream_t stream;/* allocate/free: stream */
    size_t index;      /* free: index in live */
} action_t;

static int perform(run_t *r, const action_t *a)
{
    stack_t *s = &r->s;
    switch (a->kind) {
    case 0: {
        void *p;
        int status = ps_allocate(s->top, a->size, a->stream, &p);
        if (status == PS_OK) {
            r->live[r->live_count].ptr = p;
            r->live[r->live_count].size = a->size;
            r->live[r->live_count].stream = a->stream;
            r->live_count++;
        }
        return status;
    }
    case 1: {
        /* the fake judges each unmap by when its granules were freed */
        ps_fake_gpu_note_free(s->gpu, r->live[a->index].ptr, r->live[a->index].size);
        int status = ps_deallocate(s->top, r->live[a->index].ptr, r->live[a->index].size, a->stream);
        if (status == PS_OK)
            r->live[a->index] = r->live[--r->live_count];
        return status;
    }
    default: return ps_trim(s->top);
    }
}

/* Does `a`, checks, and retries it once if it failed. */
static void step(run_t *r, int number, const action_t *a)
{
    uint64_t before = ps_fake_gpu_faults_fired(r->s.gpu, NULL, NULL);
    int status = perform(r, a);
    if (check_status(r, number, status, before))
        return; /* the device is full: the script goes on without this block */
    ps_fake_op_t op;
    if (ps_fake_gpu_faults_fired(r->s.gpu, &op, NULL) != before && (op == PS_FAKE_OP_VM_MAP || op == PS_FAKE_OP_HOST_VM_MAP))
        /* a failed vm_map undoes the pieces its ps_vm_range_map_kept mapped, which
         * no kernel has seen: the fake device counts those unmaps as unsafe
         * (a fence is incomplete), but they are not */
        r->unsafe_excused = ps_fake_gpu_unsafe_unmaps(r->s.gpu);
    check_consistent(r, number);
    if (status != PS_OK) {
        status = perform(r, a);
        cr_assert_eq(status, PS_OK, "%s: the retry failed too (%d)", where(r, number), status);
        check_consistent(r, number);
    }
}

/* The stream a block allocated on `stream` is freed on (A is dead after
 * DESTROY_AT). */
static ps_stream_t free_stream(run_t *r, ps_stream_t stream, int number)
{
    unsigned pick = (unsigned)rand_r(&r->seed) % 8;
    if (stream == PS_STREAM_NONE)
        return PS_STREAM_NONE;
    if (stream == STREAM_A && number >= DESTROY_AT)
        return pick % 2 ? STREAM_B : PS_STREAM_NONE;
    if (pick == 0)
        return stream == STREAM_B ? (number >= DESTROY_AT ? STREAM_C : STREAM_A) : STREAM_B; /* the other stream */
    return stream;
}

static void workload(run_t *r)
{
    stack_t *s = &r->s;
    r->seed = getenv("POOLSHIM_FAULTS_SEED") ? (unsigned)atoi(getenv("POOLSHIM_FAULTS_SEED")) : 12345;
    for (int number = 0; number < STEPS; number++) {
        if (number == DESTROY_AT)
            ps_stream_destroyed(s->top, STREAM_A);
        if (number % COMPLETE_EVERY == COMPLETE_EVERY - 1)
            ps_fake_gpu_complete_all(s->gpu);
        action_t a = {0};
        unsigned pick = (unsigned)rand_r(&r->seed);
        if (r->live_count < 4 || (r->live_count < MAX_LIVE && pick % 100 < 55)) {
            a.kind = 0;
            a.size = script_size(&r->seed, s->max_request);
            unsigned which = (unsigned)rand_r(&r->seed) % 3;
            ps_stream_t second = number >= DESTROY_AT ? STREAM_C : STREAM_A;
            a.stream = which == 0 || s->unordered_only ? PS_STREAM_NONE : which == 1 ? second : STREAM_B;
        } else {
            a.kind = 1;
            a.index = (size_t)rand_r(&r->seed) % r->live_count;
            a.stream = free_stream(r, r->live[a.index].stream, number);
        }
        step(r, number, &a);
        if (number == DESTROY_AT)
            check_consistent(r, number);
    }
    for (int number = STEPS; r->live_count; number++) {
        action_t a = {.kind = 1, .index = r->live_count - 1};
        a.stream = free_stream(r, r->live[a.index].stream, STEPS);
        step(r, number, &a);
    }
    action_t trim = {.kind = 2};
    step(r, STEPS + MAX_LIVE, &trim);
    ps_resource_info_t info = {0};
    ps_query(s->top, &info);
    cr_assert_eq(info.bytes_in_use, 0, "%s: bytes in use after freeing everything", where(r, -1));
}

static uint64_t clean_barrier_calls; /* barrier calls of the last clean run */
static uint64_t runs_with_errors; /* faulted runs where a step reported the failure */

/* One run: build (within the counted calls), work, destroy, check leaks;
 * call `fail_at` of `fail_op` fails with `fail_status` (fail_at 0: a clean
 * run). Returns the calls made before destruction. */
static uint64_t one_run(const stack_kind_t *kind, ps_fake_op_t fail_op, uint64_t fail_at, int fail_status)
{
    run_t *r = calloc(1, sizeof *r);
    r->kind = kind;
    r->fail_at = fail_at;
    ps_fake_gpu_options_t h = {.capacity = kind->capacity, .virtual_memory = kind->virtual_memory,
                               .upstream_alignment = 256};
    cr_assert_eq(ps_fake_gpu_create(&h, &r->s.gpu), PS_OK);
    if (fail_at)
        cr_assert_eq(ps_fake_gpu_fail_call(r->s.gpu, fail_op, fail_at, fail_status), PS_OK);
    int status = kind->make(&r->s);
    if (status != PS_OK) {
        /* creation failed: nothing leaks, and a second try succeeds */
        check_status(r, -1, status, 0);
        stack_destroy(&r->s);
        cr_assert_eq(ps_fake_gpu_bytes_outstanding(r->s.gpu), 0, "%s: failed creation leaked", where(r, -1));
        cr_assert_eq(ps_fake_gpu_live_fences(r->s.gpu), 0, "%s: failed creation leaked a fence", where(r, -1));
        cr_assert_eq(ps_fake_gpu_live_vm_ranges(r->s.gpu), 0, "%s: failed creation leaked a range", where(r, -1));
        cr_assert_eq(kind->make(&r->s), PS_OK, "%s: creation failed twice", where(r, -1));
    }
    check_consistent(r, -1);
    workload(r);
    uint64_t calls = ps_fake_gpu_calls(r->s.gpu, PS_FAKE_OP_ANY);
    if (!fail_at)
        clean_barrier_calls = ps_fake_gpu_calls(r->s.gpu, PS_FAKE_OP_BARRIER);
    if (!fail_at && getenv("POOLSHIM_FAULTS_VERBOSE")) {
        fprintf(stderr, "%s: %llu calls:", kind->name, (unsigned long long)calls);
        for (int op = 0; op < PS_FAKE_OP_COUNT; op++)
            if (ps_fake_gpu_calls(r->s.gpu, op))
                fprintf(stderr, " %s %llu", ps_fake_gpu_op_name(op), (unsigned long long)ps_fake_gpu_calls(r->s.gpu, op));
        fprintf(stderr, "\n");
    }
    runs_with_errors += r->errors != 0;
    if (fail_at)
        cr_assert_eq(ps_fake_gpu_faults_fired(r->s.gpu, NULL, NULL), 1, "%s: the failure never fired", where(r, -1));
    else
        cr_assert_eq(r->errors, 0, "%s: the clean run had errors", where(r, -1));
    /* c: nothing leaks */
    ps_fake_gpu_clear_faults(r->s.gpu);
    stack_destroy(&r->s);
    cr_assert_eq(ps_fake_gpu_bytes_outstanding(r->s.gpu), 0, "%s: %llu bytes leaked", where(r, -1),
                 (unsigned long long)ps_fake_gpu_bytes_outstanding(r->s.gpu));
    cr_assert_eq(ps_fake_gpu_live_fences(r->s.gpu), 0, "%s: %llu fences never released", where(r, -1),
                 (unsigned long long)ps_fake_gpu_live_fences(r->s.gpu));
    cr_assert_eq(ps_fake_gpu_live_vm_ranges(r->s.gpu), 0, "%s: a reserved range was never released", where(r, -1));
    ps_fake_gpu_destroy(r->s.gpu);
    free(r);
    return calls;
}

static void fail_every_call(const stack_kind_t *kind)
{
    ps_verbosity = PS_MSG_ERROR - 1; /* failures are expected: no messages */
    uint64_t calls = one_run(kind, PS_FAKE_OP_ANY, 0, 0);
    cr_assert_gt(calls, 0, "%s made no GPU call", kind->name);
    uint64_t runs = calls <= SAMPLE || getenv("POOLSHIM_FAULTS_ALL") ? calls : SAMPLE;
    for (uint64_t i = 0; i < runs; i++)
        one_run(kind, PS_FAKE_OP_ANY, 1 + i * calls / runs, 0);
    /* a barrier that cannot be issued now (a stream capture is open) */
    uint64_t barriers = clean_barrier_calls;
    for (uint64_t n = 1; n <= barriers && n <= SAMPLE / 4; n++)
        one_run(kind, PS_FAKE_OP_BARRIER, n, PS_EBUSY);
    if (getenv("POOLSHIM_FAULTS_VERBOSE"))
        fprintf(stderr, "%s: %llu of %llu calls failed in turn, %llu runs saw an error\n", kind->name,
                (unsigned long long)runs, (unsigned long long)calls, (unsigned long long)runs_with_errors);
}

static size_t *kind_rows(void)
{
    size_t *rows = cr_malloc(KIND_COUNT * sizeof *rows);
    for (size_t i = 0; i < KIND_COUNT; i++)
        rows[i] = i;
    return rows;
}

ParameterizedTestParameters(fault_injection, every_call_can_fail)
{
    return cr_make_param_array(size_t, kind_rows(), KIND_COUNT);
}

ParameterizedTest(size_t *row, fault_injection, every_call_can_fail)
{
    fail_every_call(&KINDS[*row]);
}
