/* binning routing and fixed_size behaviour (binning's default bin). */
#include <criterion/criterion.h>
#include <stdlib.h>

#include "../../core/binning.h"
#include "../../core/fixed_size.h"
#include "../../tools/sim/fake_gpu.h"
#include "../../core/upstream.h"

/* ---- a resource that counts what reaches it ---- */
typedef struct counting {
    ps_resource_t base;   /* vtable first */
    int allocs;           /* allocate calls */
    int frees;            /* deallocate calls */
    size_t last_size;     /* size of the last call */
    uintptr_t next;       /* next fake address */
} counting_t;

static int c_alloc(ps_resource_t *r, size_t size, ps_stream_t s, void **out)
{
    counting_t *c = (counting_t *)r;
    c->allocs++;
    c->last_size = size;
    *out = (void *)(c->next += 4096);
    return PS_OK;
}
static int c_free(ps_resource_t *r, void *p, size_t size, ps_stream_t s)
{
    counting_t *c = (counting_t *)r;
    c->frees++;
    c->last_size = size;
    return PS_OK;
}
static void c_destroy(ps_resource_t *r) { (void)r; }
static const ps_resource_ops_t counting_ops = {"counting", c_alloc, c_free, NULL, NULL, c_destroy};

static void counting_init(counting_t *c, uintptr_t base)
{
    *c = (counting_t){.base = {.ops = &counting_ops, .name = "counting"}, .next = base};
}

Test(binning, routes_by_size_at_exact_boundaries)
{
    counting_t small, medium, fallback;
    counting_init(&small, 0x10000000);
    counting_init(&medium, 0x20000000);
    counting_init(&fallback, 0x30000000);
    ps_bin_t bins[] = {{256, &small.base}, {1024, &medium.base}};
    ps_resource_t *b;
    cr_assert_eq(ps_binning_create("bins", bins, 2, &fallback.base, &b), PS_OK);
    struct { size_t size; counting_t *to; } cases[] = {
        {0, &small}, {1, &small}, {256, &small}, {257, &medium},
        {1024, &medium}, {1025, &fallback}, {(size_t)1 << 40, &fallback},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int before = cases[i].to->allocs;
        void *p;
        cr_assert_eq(ps_allocate(b, cases[i].size, PS_STREAM_NONE, &p), PS_OK);
        cr_assert_eq(cases[i].to->allocs, before + 1, "size %zu went elsewhere", cases[i].size);
        cr_assert_eq(cases[i].to->last_size, cases[i].size);
        int frees = cases[i].to->frees;
        cr_assert_eq(ps_deallocate(b, p, cases[i].size, PS_STREAM_NONE), PS_OK);
        cr_assert_eq(cases[i].to->frees, frees + 1, "free of size %zu went elsewhere", cases[i].size);
    }
    cr_assert_eq(small.allocs + medium.allocs + fallback.allocs, 7);
    ps_destroy(b);
}

Test(binning, without_fallback_refuses_large_requests)
{
    counting_t small;
    counting_init(&small, 0x10000000);
    ps_bin_t bins[] = {{256, &small.base}};
    ps_resource_t *b;
    cr_assert_eq(ps_binning_create("bins", bins, 1, NULL, &b), PS_OK);
    void *p;
    cr_assert_eq(ps_allocate(b, 257, PS_STREAM_NONE, &p), PS_EINVAL);
    cr_assert_eq(small.allocs, 0);
    ps_destroy(b);
}

Test(binning, rejects_unsorted_bins)
{
    counting_t x, y;
    counting_init(&x, 0x1000);
    counting_init(&y, 0x2000);
    ps_bin_t bins[] = {{1024, &x.base}, {1024, &y.base}};
    ps_resource_t *b = NULL;
    ps_verbosity = -1;
    cr_assert_eq(ps_binning_create("bins", bins, 2, NULL, &b), PS_EINVAL);
    cr_assert_null(b);
}

/* ---- fixed_size ---- */
typedef struct fs_fixture {
    ps_gpu_ops_t *gpu;  /* fake device */
    ps_resource_t *up;  /* `cuda` upstream */
    ps_resource_t *fs;  /* under test */
} fs_fixture_t;

static void fs_make(fs_fixture_t *f, size_t block, size_t per_batch, ps_free_sync_t sync,
                    size_t capacity, int auto_complete)
{
    ps_fake_gpu_options_t h = {.capacity = capacity, .auto_complete = auto_complete};
    cr_assert_eq(ps_fake_gpu_create(&h, &f->gpu), PS_OK);
    cr_assert_eq(ps_cuda_resource_create("cuda", f->gpu, &f->up), PS_OK);
    ps_fixed_size_options_t o;
    ps_fixed_size_options_default(&o);
    o.block_size = block;
    o.blocks_per_batch = per_batch;
    o.free_sync = sync;
    cr_assert_eq(ps_fixed_size_create("fixed", f->up, f->gpu, &o, &f->fs), PS_OK);
}

static void fs_unmake(fs_fixture_t *f)
{
    ps_destroy(f->fs);
    ps_destroy(f->up);
    ps_fake_gpu_destroy(f->gpu);
}

Test(fixed_size, grows_by_one_upstream_call_per_batch)
{
    fs_fixture_t f;
    fs_make(&f, 1000, 16, PS_FREE_SYNC_EVENT, 0, 1);
    void *p[33];
    for (int i = 0; i < 33; i++) {
        cr_assert_eq(ps_allocate(f.fs, 1000, PS_STREAM_NONE, &p[i]), PS_OK);
        cr_assert_eq(ps_fake_gpu_upstream_allocs(f.gpu), (uint64_t)(i / 16 + 1), "after %d blocks", i + 1);
    }
    ps_resource_info_t info = {0};
    ps_query(f.fs, &info);
    cr_assert_eq(info.bytes_reserved, 3 * 16 * 1024, "blocks rounded up to 1024");
    cr_assert_eq(info.bytes_in_use, 33 * 1024);
    cr_assert_eq((uintptr_t)p[1] - (uintptr_t)p[0], 1024);
    for (int i = 0; i < 33; i++)
        cr_assert_eq(ps_deallocate(f.fs, p[i], 1000, PS_STREAM_NONE), PS_OK);
    fs_unmake(&f);
}

Test(fixed_size, refuses_requests_larger_than_a_block)
{
    fs_fixture_t f;
    fs_make(&f, 4096, 4, PS_FREE_SYNC_EVENT, 0, 1);
    void *p;
    cr_assert_eq(ps_allocate(f.fs, 4097, PS_STREAM_NONE, &p), PS_EINVAL);
    cr_assert_eq(ps_fake_gpu_upstream_allocs(f.gpu), 0);
    cr_assert_eq(ps_allocate(f.fs, 4096, PS_STREAM_NONE, &p), PS_OK);
    fs_unmake(&f);
}

Test(fixed_size, event_free_is_not_reused_before_its_fence_completes)
{
    fs_fixture_t f;
    fs_make(&f, 256, 2, PS_FREE_SYNC_EVENT, 0, 0);
    void *a, *b, *c, *d, *e;
    cr_assert_eq(ps_allocate(f.fs, 256, PS_STREAM_NONE, &a), PS_OK);
    cr_assert_eq(ps_allocate(f.fs, 256, PS_STREAM_NONE, &b), PS_OK);
    cr_assert_eq(ps_deallocate(f.fs, a, 256, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_deallocate(f.fs, a, 256, PS_STREAM_NONE), PS_EINVAL, "double free while pending");
    cr_assert_eq(ps_allocate(f.fs, 256, PS_STREAM_NONE, &c), PS_OK);
    cr_assert_neq(c, a, "reused before its fence completed");
    cr_assert_eq(ps_fake_gpu_fences_recorded(f.gpu), 1, "one fence closed the epoch");
    cr_assert_eq(ps_fake_gpu_upstream_allocs(f.gpu), 2, "grew rather than waited");
    cr_assert_eq(ps_fake_gpu_fence_waits(f.gpu), 0);
    ps_fake_gpu_complete_all(f.gpu);
    cr_assert_eq(ps_allocate(f.fs, 256, PS_STREAM_NONE, &d), PS_OK); /* rest of batch 2 */
    cr_assert_eq(ps_allocate(f.fs, 256, PS_STREAM_NONE, &e), PS_OK);
    cr_assert_eq(e, a, "reusable once the fence completed");
    cr_assert_eq(ps_fake_gpu_upstream_allocs(f.gpu), 2);
    fs_unmake(&f);
}

Test(fixed_size, waits_for_the_oldest_fence_only_when_out_of_memory)
{
    fs_fixture_t f;
    fs_make(&f, PS_MiB, 2, PS_FREE_SYNC_EVENT, 2 * PS_MiB, 0);
    void *a, *b, *c;
    cr_assert_eq(ps_allocate(f.fs, PS_MiB, PS_STREAM_NONE, &a), PS_OK);
    cr_assert_eq(ps_allocate(f.fs, PS_MiB, PS_STREAM_NONE, &b), PS_OK);
    cr_assert_eq(ps_deallocate(f.fs, a, PS_MiB, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_allocate(f.fs, PS_MiB, PS_STREAM_NONE, &c), PS_OK);
    cr_assert_eq(c, a);
    cr_assert_eq(ps_fake_gpu_fence_waits(f.gpu), 1);
    /* nothing pending, nothing left: out of memory, state intact */
    cr_assert_eq(ps_allocate(f.fs, PS_MiB, PS_STREAM_NONE, &a), PS_ENOMEM);
    cr_assert_eq(ps_deallocate(f.fs, b, PS_MiB, PS_STREAM_NONE), PS_OK);
    fs_unmake(&f);
}

Test(fixed_size, device_policy_synchronizes_at_free_and_reuses_at_once)
{
    fs_fixture_t f;
    fs_make(&f, 256, 4, PS_FREE_SYNC_DEVICE, 0, 0);
    void *a, *b;
    cr_assert_eq(ps_allocate(f.fs, 256, PS_STREAM_NONE, &a), PS_OK);
    cr_assert_eq(ps_deallocate(f.fs, a, 256, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_fake_gpu_device_syncs(f.gpu), 1);
    cr_assert_eq(ps_allocate(f.fs, 256, PS_STREAM_NONE, &b), PS_OK);
    cr_assert_eq(b, a);
    cr_assert_eq(ps_fake_gpu_fences_recorded(f.gpu), 0);
    fs_unmake(&f);
}

Test(fixed_size, stream_free_is_reused_at_once_on_its_stream_only)
{
    fs_fixture_t f;
    fs_make(&f, 256, 1, PS_FREE_SYNC_EVENT, 4 * PS_MiB, 0); /* two upstream calls (2 MiB granule) */
    ps_stream_t s1 = 0x1000, s2 = 0x2000;
    void *a, *b, *c;
    cr_assert_eq(ps_allocate(f.fs, 256, s1, &a), PS_OK);
    cr_assert_eq(ps_deallocate(f.fs, a, 256, s1), PS_OK);
    cr_assert_eq(ps_allocate(f.fs, 256, s1, &b), PS_OK);
    cr_assert_eq(b, a, "same stream: at once");
    cr_assert_eq(ps_deallocate(f.fs, b, 256, s1), PS_OK);
    cr_assert_eq(ps_allocate(f.fs, 256, s2, &c), PS_OK);
    cr_assert_neq(c, a, "another stream grows first");
    /* out of memory now: s2 may take s1's block after a GPU-side wait */
    void *d;
    cr_assert_eq(ps_allocate(f.fs, 256, s2, &d), PS_OK);
    cr_assert_eq(d, a);
    cr_assert_eq(ps_fake_gpu_stream_waits(f.gpu), 1);
    cr_assert_eq(ps_fake_gpu_fence_waits(f.gpu), 0);
    fs_unmake(&f);
}

Test(fixed_size, trim_returns_wholly_free_batches)
{
    fs_fixture_t f;
    fs_make(&f, 256, 4, PS_FREE_SYNC_NONE, 0, 0);
    void *p[8];
    for (int i = 0; i < 8; i++)
        cr_assert_eq(ps_allocate(f.fs, 256, PS_STREAM_NONE, &p[i]), PS_OK);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(ps_deallocate(f.fs, p[i], 256, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_trim(f.fs), PS_OK);
    ps_resource_info_t info = {0};
    ps_query(f.fs, &info);
    cr_assert_eq(info.bytes_reserved, 4 * 256);
    cr_assert_eq(info.upstream_frees, 1);
    for (int i = 4; i < 8; i++)
        cr_assert_eq(ps_deallocate(f.fs, p[i], 256, PS_STREAM_NONE), PS_OK);
    fs_unmake(&f);
}

Test(fixed_size, destroyed_stream_blocks_wait_for_a_fence_then_become_ready)
{
    fs_fixture_t f;
    fs_make(&f, 1024, 2, PS_FREE_SYNC_EVENT, 0, 0);
    const ps_stream_t s1 = 0x1000, s2 = 0x2000;
    void *a[2], *b, *x, *c;
    for (int i = 0; i < 2; i++)
        cr_assert_eq(ps_allocate(f.fs, 1024, s1, &a[i]), PS_OK);
    for (int i = 0; i < 2; i++)
        cr_assert_eq(ps_deallocate(f.fs, a[i], 1024, s1), PS_OK);
    ps_stream_destroyed(f.fs, s1);
    cr_assert_eq(ps_fake_gpu_fences_recorded(f.gpu), 1);
    cr_assert_eq(ps_fake_gpu_fences_on_stream(f.gpu, s1), 1, "one fence on the stream at the destroy");
    ps_resource_info_t info = {0};
    ps_query(f.fs, &info);
    cr_assert_eq(info.bytes_pending, 2048, "its blocks are pending, not free");
    cr_assert_eq(ps_allocate(f.fs, 1024, s2, &b), PS_OK);
    cr_assert(b != a[0] && b != a[1], "s2 must not take a block of the dead stream before the fence");
    cr_assert_eq(ps_allocate(f.fs, 1024, PS_STREAM_NONE, &x), PS_OK);
    cr_assert(x != a[0] && x != a[1]);
    cr_assert_eq(ps_fake_gpu_waits_on_stream(f.gpu, s1), 0, "nothing waits on the dead stream");
    ps_fake_gpu_complete_all(f.gpu);
    cr_assert_eq(ps_allocate(f.fs, 1024, PS_STREAM_NONE, &c), PS_OK);
    cr_assert(c == a[0] || c == a[1], "after the fence the blocks are clean");
    cr_assert_eq(ps_fake_gpu_fences_on_stream(f.gpu, s1), 1);
    ps_deallocate(f.fs, b, 1024, s2);
    ps_deallocate(f.fs, x, 1024, PS_STREAM_NONE);
    ps_deallocate(f.fs, c, 1024, PS_STREAM_NONE);
    fs_unmake(&f);
}

Test(fixed_size, pressure_never_steals_through_a_dead_stream)
{
    fs_fixture_t f;
    fs_make(&f, 1024, 2, PS_FREE_SYNC_EVENT, 2 * PS_MiB, 0); /* room for one batch */
    const ps_stream_t s1 = 0x1000, s2 = 0x2000;
    void *a[2], *b[2];
    for (int i = 0; i < 2; i++)
        cr_assert_eq(ps_allocate(f.fs, 1024, s1, &a[i]), PS_OK);
    for (int i = 0; i < 2; i++)
        cr_assert_eq(ps_deallocate(f.fs, a[i], 1024, s1), PS_OK);
    ps_stream_destroyed(f.fs, s1);
    uint64_t fences = ps_fake_gpu_fences_on_stream(f.gpu, s1);
    /* the device is full: s2 gets the blocks after a host wait on the
     * destroy's fence, never through a new fence or wait on s1 */
    for (int i = 0; i < 2; i++)
        cr_assert_eq(ps_allocate(f.fs, 1024, s2, &b[i]), PS_OK);
    cr_assert_eq(ps_fake_gpu_fence_waits(f.gpu), 1);
    cr_assert_eq(ps_fake_gpu_fences_on_stream(f.gpu, s1), fences);
    cr_assert_eq(ps_fake_gpu_waits_on_stream(f.gpu, s1), 0);
    for (int i = 0; i < 2; i++)
        ps_deallocate(f.fs, b[i], 1024, s2);
    fs_unmake(&f);
}

Test(fixed_size, stream_churn_recycles_stream_lists)
{
    fs_fixture_t f;
    fs_make(&f, 1024, 16, PS_FREE_SYNC_EVENT, 0, 1);
    for (uintptr_t i = 0; i < 100000; i++) {
        ps_stream_t s = 0x10000 + i * 64;
        void *p;
        cr_assert_eq(ps_allocate(f.fs, 1024, s, &p), PS_OK, "stream %lu", (unsigned long)i);
        cr_assert_eq(ps_deallocate(f.fs, p, 1024, s), PS_OK);
        ps_stream_destroyed(f.fs, s);
    }
    ps_resource_info_t info = {0};
    ps_query(f.fs, &info);
    cr_assert_eq(info.upstream_allocs, 1, "one batch serves every stream in turn");
    cr_assert_eq(info.bytes_in_use, 0);
    fs_unmake(&f);
}

Test(fixed_size, without_a_device_table_streams_are_retired_and_stolen_safely)
{
    ps_gpu_ops_t *gpu;
    ps_resource_t *up, *fs;
    ps_fake_gpu_options_t h = {.capacity = 2 * PS_MiB};
    cr_assert_eq(ps_fake_gpu_create(&h, &gpu), PS_OK);
    cr_assert_eq(ps_cuda_resource_create("cuda", gpu, &up), PS_OK);
    ps_fixed_size_options_t o;
    ps_fixed_size_options_default(&o);
    o.block_size = 1024;
    o.blocks_per_batch = 2;
    o.free_sync = PS_FREE_SYNC_NONE;
    cr_assert_eq(ps_fixed_size_create("fixed", up, NULL, &o, &fs), PS_OK);
    void *a[2], *b[2];
    for (int i = 0; i < 2; i++)
        cr_assert_eq(ps_allocate(fs, 1024, 0x1000, &a[i]), PS_OK);
    cr_assert_eq(ps_deallocate(fs, a[0], 1024, 0x1000), PS_OK);
    cr_assert_eq(ps_deallocate(fs, a[1], 1024, 0x2000), PS_OK);
    ps_stream_destroyed(fs, 0x1000); /* no fence possible: its block is clean */
    cr_assert_eq(ps_allocate(fs, 1024, PS_STREAM_NONE, &b[0]), PS_OK);
    cr_assert_eq(b[0], a[0]);
    /* the device is full: 0x2000's block is taken without a fence */
    cr_assert_eq(ps_allocate(fs, 1024, PS_STREAM_NONE, &b[1]), PS_OK);
    cr_assert_eq(b[1], a[1]);
    for (int i = 0; i < 2; i++)
        cr_assert_eq(ps_deallocate(fs, b[i], 1024, PS_STREAM_NONE), PS_OK);
    ps_destroy(fs);
    ps_destroy(up);
    ps_fake_gpu_destroy(gpu);
}
