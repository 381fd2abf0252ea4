/* Test stand-in for core/host_ops.c + core/upstream.c (see the header).
 * Memory: backed = aligned_alloc, simulated = a bump counter of addresses
 * (never reused, never mapped). Fences carry a sequence number and complete
 * when the test says so (or at once with auto_complete); fence_wait
 * completes everything up to the waited fence, as a host wait would. */
#include "test_upstream_helper.h"

#include <pthread.h>
#include <stdlib.h>

struct ps_fence {
    uint64_t seq; /* 1, 2, 3... in recording order */
};

typedef struct helper_state {
    pthread_mutex_t lock;       /* guards everything below */
    ps_host_ops_options_t opts; /* as given (alignment defaulted) */
    uint64_t outstanding;       /* bytes handed out by mem_alloc */
    uint64_t next_address;      /* simulated address space cursor */
    uint64_t allocs;            /* successful mem_alloc calls */
    uint64_t fail_after;        /* successes left before injected failures */
    uint64_t fail_count;        /* injected failures left */
    uint64_t recorded;          /* fences recorded */
    uint64_t completed;         /* fences 1..completed are done */
    uint64_t stream_waits;      /* stream_wait_fence calls */
    uint64_t fence_waits;       /* fence_wait calls */
    uint64_t device_syncs;      /* device_synchronize calls */
    ps_gpu_ops_t ops;           /* the table handed out */
} helper_state_t;

static helper_state_t *state_of(ps_gpu_ops_t *ops) { return (helper_state_t *)ops->ctx; }

static int h_mem_alloc(void *ctx, size_t size, void **out)
{
    helper_state_t *s = ctx;
    pthread_mutex_lock(&s->lock);
    int status = PS_OK;
    size_t rounded = ps_align_up(size ? size : 1, s->opts.upstream_alignment);
    if (s->fail_count && s->fail_after == 0) {
        s->fail_count--;
        status = PS_ENOMEM;
    } else if (rounded == 0 ||
               (s->opts.capacity && s->outstanding + rounded > s->opts.capacity)) {
        status = PS_ENOMEM;
    } else {
        void *p;
        if (s->opts.backed) {
            p = aligned_alloc(s->opts.upstream_alignment, rounded);
        } else {
            p = (void *)(uintptr_t)s->next_address;
            s->next_address += rounded;
        }
        if (!p) {
            status = PS_ENOMEM;
        } else {
            if (s->fail_count && s->fail_after)
                s->fail_after--;
            s->outstanding += rounded;
            s->allocs++;
            *out = p;
        }
    }
    pthread_mutex_unlock(&s->lock);
    return status;
}

static int h_mem_free(void *ctx, void *ptr, size_t size)
{
    helper_state_t *s = ctx;
    pthread_mutex_lock(&s->lock);
    s->outstanding -= ps_align_up(size ? size : 1, s->opts.upstream_alignment);
    if (s->opts.backed)
        free(ptr);
    pthread_mutex_unlock(&s->lock);
    return PS_OK;
}

static int h_mem_get_info(void *ctx, size_t *free_bytes, size_t *total_bytes)
{
    helper_state_t *s = ctx;
    pthread_mutex_lock(&s->lock);
    size_t total = s->opts.capacity ? s->opts.capacity : (size_t)80 << 30;
    *total_bytes = total;
    *free_bytes = total - s->outstanding;
    pthread_mutex_unlock(&s->lock);
    return PS_OK;
}

static int h_fence_record(void *ctx, ps_stream_t stream, ps_fence_t **out)
{
    helper_state_t *s = ctx;
    ps_fence_t *f = malloc(sizeof *f);
    if (!f)
        return PS_ENOMEM;
    pthread_mutex_lock(&s->lock);
    f->seq = ++s->recorded;
    if (s->opts.auto_complete)
        s->completed = s->recorded;
    pthread_mutex_unlock(&s->lock);
    *out = f;
    return PS_OK;
}

static int h_fence_query(void *ctx, ps_fence_t *fence)
{
    helper_state_t *s = ctx;
    pthread_mutex_lock(&s->lock);
    int done = fence->seq <= s->completed;
    pthread_mutex_unlock(&s->lock);
    return done ? PS_OK : PS_ENOTREADY;
}

static int h_fence_wait(void *ctx, ps_fence_t *fence)
{
    helper_state_t *s = ctx;
    pthread_mutex_lock(&s->lock);
    s->fence_waits++;
    if (s->completed < fence->seq)
        s->completed = fence->seq;
    pthread_mutex_unlock(&s->lock);
    return PS_OK;
}

static void h_fence_release(void *ctx, ps_fence_t *fence) { free(fence); }

static int h_stream_wait_fence(void *ctx, ps_stream_t stream, ps_fence_t *fence)
{
    helper_state_t *s = ctx;
    pthread_mutex_lock(&s->lock);
    s->stream_waits++;
    pthread_mutex_unlock(&s->lock);
    return PS_OK;
}

static int h_device_synchronize(void *ctx)
{
    helper_state_t *s = ctx;
    pthread_mutex_lock(&s->lock);
    s->device_syncs++;
    s->completed = s->recorded;
    pthread_mutex_unlock(&s->lock);
    return PS_OK;
}

int test_host_ops_create(const ps_host_ops_options_t *opts, ps_gpu_ops_t **out)
{
    helper_state_t *s = calloc(1, sizeof *s);
    if (!s)
        return PS_ENOMEM;
    pthread_mutex_init(&s->lock, NULL);
    s->opts = *opts;
    if (!s->opts.upstream_alignment)
        s->opts.upstream_alignment = 2 * PS_MiB;
    s->next_address = (uint64_t)1 << 40; /* far from real host memory */
    s->ops = (ps_gpu_ops_t){
        .ctx = s,
        .device = -1,
        .mem_alloc = h_mem_alloc,
        .mem_free = h_mem_free,
        .mem_get_info = h_mem_get_info,
        .fence_record = h_fence_record,
        .fence_query = h_fence_query,
        .fence_wait = h_fence_wait,
        .fence_release = h_fence_release,
        .stream_wait_fence = h_stream_wait_fence,
        .device_synchronize = h_device_synchronize,
    };
    *out = &s->ops;
    return PS_OK;
}

void test_host_ops_destroy(ps_gpu_ops_t *ops)
{
    if (!ops)
        return;
    helper_state_t *s = state_of(ops);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

#define LOCKED_READ(ops, field)                                                \
    do {                                                                       \
        helper_state_t *s_ = state_of(ops);                                    \
        pthread_mutex_lock(&s_->lock);                                         \
        uint64_t v_ = s_->field;                                               \
        pthread_mutex_unlock(&s_->lock);                                       \
        return v_;                                                             \
    } while (0)

uint64_t test_host_ops_fences_recorded(ps_gpu_ops_t *ops) { LOCKED_READ(ops, recorded); }
uint64_t test_host_ops_stream_waits(ps_gpu_ops_t *ops) { LOCKED_READ(ops, stream_waits); }
uint64_t test_host_ops_fence_waits(ps_gpu_ops_t *ops) { LOCKED_READ(ops, fence_waits); }
uint64_t test_host_ops_device_syncs(ps_gpu_ops_t *ops) { LOCKED_READ(ops, device_syncs); }
uint64_t test_host_ops_bytes_outstanding(ps_gpu_ops_t *ops) { LOCKED_READ(ops, outstanding); }
uint64_t test_host_ops_upstream_allocs(ps_gpu_ops_t *ops) { LOCKED_READ(ops, allocs); }

void test_host_ops_complete_upto(ps_gpu_ops_t *ops, uint64_t seq)
{
    helper_state_t *s = state_of(ops);
    pthread_mutex_lock(&s->lock);
    if (s->completed < seq)
        s->completed = seq;
    pthread_mutex_unlock(&s->lock);
}

void test_host_ops_complete_all(ps_gpu_ops_t *ops)
{
    test_host_ops_complete_upto(ops, test_host_ops_fences_recorded(ops));
}

void test_host_ops_set_auto_complete(ps_gpu_ops_t *ops, int on)
{
    helper_state_t *s = state_of(ops);
    pthread_mutex_lock(&s->lock);
    s->opts.auto_complete = on;
    if (on)
        s->completed = s->recorded;
    pthread_mutex_unlock(&s->lock);
}

void test_host_ops_inject_failure(ps_gpu_ops_t *ops, uint64_t fail_after, uint64_t fail_count)
{
    helper_state_t *s = state_of(ops);
    pthread_mutex_lock(&s->lock);
    s->fail_after = fail_after;
    s->fail_count = fail_count;
    pthread_mutex_unlock(&s->lock);
}

/* ---- the `cuda` upstream ---- */
typedef struct test_upstream {
    ps_resource_t base;       /* vtable first */
    const ps_gpu_ops_t *gpu;  /* where memory comes from */
    pthread_mutex_t lock;     /* guards the counters */
    ps_resource_info_t info;  /* reserved == in use, counts of calls */
} test_upstream_t;

static int up_allocate(ps_resource_t *r, size_t size, ps_stream_t stream, void **out)
{
    test_upstream_t *u = (test_upstream_t *)r;
    void *p;
    int status = u->gpu->mem_alloc(u->gpu->ctx, size, &p);
    if (status != PS_OK)
        return status;
    pthread_mutex_lock(&u->lock);
    u->info.bytes_in_use += size;
    u->info.bytes_reserved += size;
    if (u->info.bytes_reserved > u->info.peak_bytes_reserved)
        u->info.peak_bytes_reserved = u->info.bytes_reserved;
    u->info.upstream_allocs++;
    pthread_mutex_unlock(&u->lock);
    *out = p;
    return PS_OK;
}

static int up_deallocate(ps_resource_t *r, void *ptr, size_t size, ps_stream_t stream)
{
    test_upstream_t *u = (test_upstream_t *)r;
    int status = u->gpu->mem_free(u->gpu->ctx, ptr, size);
    if (status != PS_OK)
        return status;
    pthread_mutex_lock(&u->lock);
    u->info.bytes_in_use -= size;
    u->info.bytes_reserved -= size;
    u->info.upstream_frees++;
    pthread_mutex_unlock(&u->lock);
    return PS_OK;
}

static void up_query(ps_resource_t *r, ps_resource_info_t *info)
{
    test_upstream_t *u = (test_upstream_t *)r;
    pthread_mutex_lock(&u->lock);
    *info = u->info;
    pthread_mutex_unlock(&u->lock);
}

static void up_destroy(ps_resource_t *r)
{
    test_upstream_t *u = (test_upstream_t *)r;
    pthread_mutex_destroy(&u->lock);
    free(u);
}

static const ps_resource_ops_t test_upstream_ops = {
    .type_name = "cuda",
    .allocate = up_allocate,
    .deallocate = up_deallocate,
    .query = up_query,
    .destroy = up_destroy,
};

int test_upstream_create(const char *name, const ps_gpu_ops_t *gpu, ps_resource_t **out)
{
    test_upstream_t *u = calloc(1, sizeof *u);
    if (!u)
        return PS_ENOMEM;
    u->base.ops = &test_upstream_ops;
    u->base.name = name ? name : "cuda";
    u->gpu = gpu;
    pthread_mutex_init(&u->lock, NULL);
    *out = &u->base;
    return PS_OK;
}
