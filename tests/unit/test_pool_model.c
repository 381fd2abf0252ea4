/* The pool against a reference model: random operations, checked after
 * every step (no overlap, alignment, accounting, fence safety) and with
 * ps_pool_check at intervals; at the end everything must coalesce back
 * into whole chunks that trim gives back.
 * Seed: POOLSHIM_TEST_SEED, else the time; every failure prints it.
 * The 10^7-operation runs (pool_model/ten_million_*) only run with
 * POOLSHIM_TEST_LONG=1 (`make test-long`, part of `make test-all`); the
 * fast `make test` skips them. */
#include "pool_fixture.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct live_range {
    uintptr_t addr;     /* start */
    size_t size;        /* bytes as the pool rounds them */
    ps_stream_t stream; /* stream it will be freed on */
} live_range_t;

typedef struct freed_range {
    uintptr_t addr;         /* start */
    size_t size;            /* bytes */
    uint64_t fences_before; /* fences recorded when it was freed */
    ps_stream_t stream;     /* PS_STREAM_NONE: a cudaFree */
    uint64_t stream_waits;  /* stream waits when it was freed */
} freed_range_t;

typedef struct model {
    live_range_t *live;   /* sorted by address */
    size_t count;         /* live ranges */
    freed_range_t *freed; /* freed ranges not yet known safe */
    size_t freed_count;   /* how many */
    uint64_t bytes;       /* sum of live sizes */
    uint64_t rng;         /* xorshift state */
    unsigned long long seed; /* printed on failure */
} model_t;

static uint64_t next_random(model_t *m)
{
    m->rng ^= m->rng << 13;
    m->rng ^= m->rng >> 7;
    m->rng ^= m->rng << 17;
    return m->rng;
}

static unsigned long long test_seed(void)
{
    const char *env = getenv("POOLSHIM_TEST_SEED");
    if (env && *env)
        return strtoull(env, NULL, 0);
    return (unsigned long long)time(NULL) ^ ((unsigned long long)getpid() << 20);
}

/* 1 B .. max_size, skewed: the exponent is uniform, so small sizes are common. */
static size_t random_size(model_t *m, unsigned max_log2)
{
    unsigned e = (unsigned)(next_random(m) % (max_log2 + 1));
    return 1 + (size_t)(next_random(m) % ((uint64_t)1 << e));
}

typedef struct model_config {
    ps_free_sync_t policy; /* free_sync of the pool */
    long steps;            /* operations */
    long check_every;      /* ps_pool_check interval */
    int streams;           /* use stream-ordered calls on 3 streams too */
    int manual_fences;     /* fences complete at random steps (else auto) */
    size_t alignment;      /* pool alignment */
    unsigned max_log2;     /* largest request is 2^max_log2 */
    size_t max_live;       /* live blocks kept at most */
} model_config_t;

#define MODEL_ASSERT(cond, ...)                                                          \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            fprintf(stderr, "model failure, seed %llu (POOLSHIM_TEST_SEED=%llu), step %ld\n", \
                    m.seed, m.seed, step);                                               \
            cr_assert(cond, __VA_ARGS__);                                                \
        }                                                                                \
    } while (0)

static void run_model(const model_config_t *cfg)
{
    model_t m = {0};
    m.seed = test_seed();
    m.rng = m.seed * 2654435761u + 1;
    m.live = calloc(cfg->max_live + 1, sizeof *m.live);
    size_t freed_capacity = 1 << 16;
    m.freed = calloc(freed_capacity, sizeof *m.freed);
    cr_assert(m.live && m.freed);

    pool_fixture_t f;
    ps_pool_options_t o;
    ps_pool_options_default(&o);
    o.free_sync = cfg->policy;
    o.alignment = cfg->alignment;
    o.epoch_wait_ns = 0;
    fixture_open(&f, 0, 0, &o);
    if (!cfg->manual_fences)
        ps_fake_gpu_set_auto_complete(f.gpu, 1);
    const ps_stream_t streams[3] = {0x100, 0x200, 0x300};
    uint64_t completed = 0;

    long step, allocations = 0;
    for (step = 0; step < cfg->steps; step++) {
        int allocate = m.count < 16 || (m.count < cfg->max_live && (next_random(&m) & 1));
        if (cfg->manual_fences && next_random(&m) % 64 == 0) {
            completed = ps_fake_gpu_fences_recorded(f.gpu);
            ps_fake_gpu_complete_upto(f.gpu, completed);
            size_t kept = 0; /* forget ranges that are safe now */
            for (size_t i = 0; i < m.freed_count; i++)
                if (m.freed[i].fences_before >= completed)
                    m.freed[kept++] = m.freed[i];
            m.freed_count = kept;
        }
        if (allocate) {
            size_t size = random_size(&m, cfg->max_log2);
            ps_stream_t stream = cfg->streams && next_random(&m) % 2 ? streams[next_random(&m) % 3] : PS_STREAM_NONE;
            void *p;
            int status = ps_allocate(f.pool, size, stream, &p);
            MODEL_ASSERT(status == PS_OK, "allocate %zu: %s", size, ps_status_name(status));
            uintptr_t addr = (uintptr_t)p;
            size_t rounded = ps_align_up(size, cfg->alignment);
            MODEL_ASSERT(addr % cfg->alignment == 0, "pointer %#lx not aligned", (unsigned long)addr);
            /* insert sorted; the neighbours must not overlap */
            size_t lo = 0, hi = m.count;
            while (lo < hi) {
                size_t mid = (lo + hi) / 2;
                if (m.live[mid].addr < addr)
                    lo = mid + 1;
                else
                    hi = mid;
            }
            MODEL_ASSERT(lo == 0 || m.live[lo - 1].addr + m.live[lo - 1].size <= addr, "overlaps the block below");
            MODEL_ASSERT(lo == m.count || addr + rounded <= m.live[lo].addr, "overlaps the block above");
            /* fence safety: a range freed earlier may come back only when safe */
            for (size_t i = 0; i < m.freed_count; i++) {
                freed_range_t *r = &m.freed[i];
                if (r->addr >= addr + rounded || addr >= r->addr + r->size)
                    continue;
                if (r->stream == stream && stream != PS_STREAM_NONE)
                    continue; /* same stream: reuse at once is the contract */
                if (stream == PS_STREAM_NONE || r->stream == PS_STREAM_NONE)
                    MODEL_ASSERT(completed > r->fences_before,
                                 "range freed on %#lx before fence %llu handed to %#lx; completed %llu",
                                 (unsigned long)r->stream, (unsigned long long)r->fences_before + 1,
                                 (unsigned long)stream, (unsigned long long)completed);
                else
                    MODEL_ASSERT(completed > r->fences_before || ps_fake_gpu_stream_waits(f.gpu) > r->stream_waits,
                                 "range freed on one stream handed to another without a wait");
            }
            /* the handed-out part is live again: keep only the parts of freed ranges outside it */
            for (size_t i = 0; i < m.freed_count;) {
                freed_range_t r = m.freed[i];
                if (r.addr >= addr + rounded || addr >= r.addr + r.size) {
                    i++;
                    continue;
                }
                m.freed[i] = m.freed[--m.freed_count];
                if (m.freed_count + 2 > freed_capacity) {
                    freed_capacity *= 2;
                    m.freed = realloc(m.freed, freed_capacity * sizeof *m.freed);
                    cr_assert(m.freed);
                }
                if (r.addr < addr) {
                    freed_range_t left = r;
                    left.size = addr - r.addr;
                    m.freed[m.freed_count++] = left;
                }
                if (r.addr + r.size > addr + rounded) {
                    freed_range_t right = r;
                    right.addr = addr + rounded;
                    right.size = r.addr + r.size - right.addr;
                    m.freed[m.freed_count++] = right;
                }
            }
            memmove(&m.live[lo + 1], &m.live[lo], (m.count - lo) * sizeof *m.live);
            ps_stream_t free_stream = cfg->streams && next_random(&m) % 4 == 0 ? streams[next_random(&m) % 3] : stream;
            m.live[lo] = (live_range_t){addr, rounded, free_stream};
            m.count++;
            m.bytes += rounded;
            allocations++;
        } else {
            size_t i = (size_t)(next_random(&m) % m.count);
            live_range_t r = m.live[i];
            int status = ps_deallocate(f.pool, (void *)r.addr, r.size, r.stream);
            MODEL_ASSERT(status == PS_OK, "free: %s", ps_status_name(status));
            memmove(&m.live[i], &m.live[i + 1], (m.count - i - 1) * sizeof *m.live);
            m.count--;
            m.bytes -= r.size;
            if (cfg->manual_fences) {
                if (m.freed_count == freed_capacity) {
                    freed_capacity *= 2;
                    m.freed = realloc(m.freed, freed_capacity * sizeof *m.freed);
                    cr_assert(m.freed);
                }
                m.freed[m.freed_count++] = (freed_range_t){r.addr, r.size, ps_fake_gpu_fences_recorded(f.gpu),
                                                           r.stream, ps_fake_gpu_stream_waits(f.gpu)};
                if (cfg->policy != PS_FREE_SYNC_EVENT && r.stream == PS_STREAM_NONE)
                    m.freed_count--; /* none/device: reuse at once is the contract */
                if (cfg->policy == PS_FREE_SYNC_DEVICE && r.stream == PS_STREAM_NONE)
                    completed = ps_fake_gpu_fences_recorded(f.gpu); /* the free synchronized the device */
            }
        }
        ps_resource_info_t info = fixture_info(f.pool);
        MODEL_ASSERT(info.bytes_in_use == m.bytes, "pool says %llu in use, model %llu",
                     (unsigned long long)info.bytes_in_use, (unsigned long long)m.bytes);
        MODEL_ASSERT(info.bytes_reserved == info.bytes_in_use + info.bytes_free + info.bytes_pending,
                     "reserved != in use + free + pending");
        if (cfg->check_every && step % cfg->check_every == 0)
            MODEL_ASSERT(ps_pool_check(f.pool) == PS_OK, "ps_pool_check failed");
    }
    MODEL_ASSERT(allocations > cfg->steps / 3, "the workload allocated (%ld of %ld steps)", allocations, step);
    cr_log_info("seed %llu: %ld steps, %ld allocations, peak reserved %llu MiB, %llu chunks, %llu fences", m.seed,
                step, allocations, (unsigned long long)(fixture_info(f.pool).peak_bytes_reserved >> 20),
                (unsigned long long)fixture_info(f.pool).upstream_allocs,
                (unsigned long long)ps_fake_gpu_fences_recorded(f.gpu));
    if (cfg->manual_fences)
        MODEL_ASSERT(ps_fake_gpu_fence_waits(f.gpu) == 0, "no memory pressure here: no host waits");
    /* free everything: all must coalesce back into whole chunks */
    while (m.count) {
        live_range_t r = m.live[--m.count];
        MODEL_ASSERT(ps_deallocate(f.pool, (void *)r.addr, r.size, r.stream) == PS_OK, "final free");
    }
    MODEL_ASSERT(ps_pool_check(f.pool) == PS_OK, "ps_pool_check at the end");
    ps_resource_info_t info = fixture_info(f.pool);
    MODEL_ASSERT(info.bytes_in_use == 0, "nothing in use");
    if (cfg->policy != PS_FREE_SYNC_EVENT && !cfg->streams)
        MODEL_ASSERT(info.bytes_free == info.bytes_reserved, "everything free at once");
    MODEL_ASSERT(ps_trim(f.pool) == PS_OK, "trim");
    info = fixture_info(f.pool);
    MODEL_ASSERT(info.bytes_reserved == 0 && ps_fake_gpu_bytes_outstanding(f.gpu) == 0,
                 "trim gave back everything: every chunk coalesced whole (%llu left)",
                 (unsigned long long)info.bytes_reserved);
    MODEL_ASSERT(info.upstream_frees == info.upstream_allocs, "every chunk returned");
    MODEL_ASSERT(ps_pool_check(f.pool) == PS_OK, "ps_pool_check after trim");
    fixture_close(&f);
    free(m.live);
    free(m.freed);
}

Test(pool_model, one_million_random_operations_free_sync_none)
{
    model_config_t cfg = {PS_FREE_SYNC_NONE, 1000000, 20000, 0, 0, 256, 26, 256};
    run_model(&cfg);
}

Test(pool_model, random_operations_with_epochs_and_auto_fences)
{
    model_config_t cfg = {PS_FREE_SYNC_EVENT, 200000, 10000, 0, 0, 256, 26, 256};
    run_model(&cfg);
}

Test(pool_model, full_check_every_step_with_manual_fences_and_streams)
{
    model_config_t cfg = {PS_FREE_SYNC_EVENT, 20000, 1, 1, 1, 256, 24, 128};
    run_model(&cfg);
}

Test(pool_model, full_check_every_step_alignment_4096_device_policy)
{
    model_config_t cfg = {PS_FREE_SYNC_DEVICE, 20000, 1, 1, 1, 4096, 22, 128};
    run_model(&cfg);
}

Test(pool_model, random_streams_with_auto_fences)
{
    model_config_t cfg = {PS_FREE_SYNC_EVENT, 200000, 10000, 1, 0, 256, 26, 256};
    run_model(&cfg);
}

/* 10^7 operations: `make test-long` sets POOLSHIM_TEST_LONG=1;
 * elsewhere these are skipped (they take tens of seconds each). */
static void long_model(const model_config_t *cfg)
{
    const char *on = getenv("POOLSHIM_TEST_LONG");
    if (!on || strcmp(on, "1") != 0)
        cr_skip_test("10^7 operations: run with POOLSHIM_TEST_LONG=1 (make test-long)");
    run_model(cfg);
}

Test(pool_model, ten_million_random_operations_free_sync_none, .timeout = 900)
{
    model_config_t cfg = {PS_FREE_SYNC_NONE, 10000000, 200000, 0, 0, 256, 26, 256};
    long_model(&cfg);
}

Test(pool_model, ten_million_random_operations_streams_and_auto_fences, .timeout = 900)
{
    model_config_t cfg = {PS_FREE_SYNC_EVENT, 10000000, 100000, 1, 0, 256, 26, 256};
    long_model(&cfg);
}
