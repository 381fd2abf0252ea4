/* arena-specific behaviour: thread caches, defragmentation, the
 * fragmentation warning, free_sync EVENT with fake fences, streams. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../core/fixed_size.h"
#include "../../core/pool.h"
#include "arena_fixture.h"


/* An arena under free_sync `sync` over a fake device of `capacity` bytes. */
static void make_with(arena_fixture_t *f, size_t capacity, int auto_complete, ps_free_sync_t sync)
{
    ps_fake_gpu_options_t h = {.capacity = capacity, .auto_complete = auto_complete};
    ps_arena_options_t o;
    ps_arena_options_default(&o);
    o.free_sync = sync;
    arena_fixture_open(f, &h, &o);
}

/* The polled epoch (free_sync event): the tests of fences and epochs. */
static void make(arena_fixture_t *f, size_t capacity, int auto_complete)
{
    make_with(f, capacity, auto_complete, PS_FREE_SYNC_EVENT);
}

static void unmake(arena_fixture_t *f) { arena_fixture_close(f); }

/* Eight sizes of eight different size classes: one superblock each. */
static const size_t CLASS_SIZES[8] = {64 * PS_KiB, 80 * PS_KiB, 96 * PS_KiB, 112 * PS_KiB,
                                      128 * PS_KiB, 160 * PS_KiB, 192 * PS_KiB, 224 * PS_KiB};

/* ---- a thread that holds superblocks of several classes ---- */
typedef struct holder {
    ps_resource_t *arena;      /* shared */
    pthread_barrier_t *freed;  /* its blocks are freed, it still lives */
    pthread_barrier_t *go;     /* main thread checked: exit now */
    int classes;               /* size classes to touch */
    int keep_live;             /* keep one block of each class (don't free) */
    void *kept[16];            /* the kept blocks */
} holder_t;

static void *holder_body(void *p)
{
    holder_t *h = p;
    for (int c = 0; c < h->classes; c++) {
        void *b;
        size_t size = CLASS_SIZES[c];
        cr_assert_eq(ps_allocate(h->arena, size, PS_STREAM_NONE, &b), PS_OK);
        if (h->keep_live)
            h->kept[c] = b;
        else
            cr_assert_eq(ps_deallocate(h->arena, b, size, PS_STREAM_NONE), PS_OK);
    }
    pthread_barrier_wait(h->freed);
    pthread_barrier_wait(h->go);
    return NULL;
}

Test(arena_thread, caches_return_superblocks_when_the_thread_exits)
{
    arena_fixture_t f;
    make(&f, 0, 1);
    pthread_barrier_t freed, go;
    pthread_barrier_init(&freed, NULL, 2);
    pthread_barrier_init(&go, NULL, 2);
    holder_t h = {.arena = f.arena, .freed = &freed, .go = &go, .classes = 4};
    pthread_t t;
    pthread_create(&t, NULL, holder_body, &h);
    pthread_barrier_wait(&freed);
    ps_resource_info_t alive = arena_info(f.arena);
    cr_assert_eq(alive.bytes_in_use, 0);
    /* the thread keeps one empty superblock per class: 4 x 2 MiB not in the global arena */
    cr_assert_eq(alive.largest_free_block, alive.bytes_reserved - 4 * 2 * PS_MiB,
                 "largest %llu reserved %llu", (unsigned long long)alive.largest_free_block,
                 (unsigned long long)alive.bytes_reserved);
    pthread_barrier_wait(&go);
    pthread_join(t, NULL);
    ps_resource_info_t gone = arena_info(f.arena);
    cr_assert_eq(gone.largest_free_block, gone.bytes_reserved, "superblocks came back and coalesced");
    pthread_barrier_destroy(&freed);
    pthread_barrier_destroy(&go);
    unmake(&f);
}

Test(arena_thread, defragments_on_failure_then_succeeds)
{
    arena_fixture_t f;
    make(&f, 16 * PS_MiB, 0); /* fences complete only when waited for */
    pthread_barrier_t freed, go;
    pthread_barrier_init(&freed, NULL, 2);
    pthread_barrier_init(&go, NULL, 2);
    holder_t h = {.arena = f.arena, .freed = &freed, .go = &go, .classes = 8};
    pthread_t t;
    pthread_create(&t, NULL, holder_body, &h);
    pthread_barrier_wait(&freed);
    /* the other thread caches 8 empty superblocks = the whole 16 MiB device,
     * and its frees wait for a fence: only defragmenting makes room */
    ps_resource_info_t before = arena_info(f.arena);
    cr_assert_eq(before.bytes_reserved, 16 * PS_MiB);
    cr_assert_lt(before.largest_free_block, 16 * PS_MiB);
    void *big;
    cr_assert_eq(ps_allocate(f.arena, 16 * PS_MiB, PS_STREAM_NONE, &big), PS_OK);
    cr_assert_geq(ps_fake_gpu_fence_waits(f.gpu), 1, "pending frees were waited for under pressure");
    cr_assert_eq(ps_deallocate(f.arena, big, 16 * PS_MiB, PS_STREAM_NONE), PS_OK);
    pthread_barrier_wait(&go);
    pthread_join(t, NULL);
    pthread_barrier_destroy(&freed);
    pthread_barrier_destroy(&go);
    unmake(&f);
}

/* Reads what the message path wrote into a temp file. */
static void read_messages(FILE *tmp, char *buf, size_t size)
{
    fflush(tmp);
    rewind(tmp);
    size_t n = fread(buf, 1, size - 1, tmp);
    buf[n] = 0;
}

Test(arena, warns_with_the_fragmentation_when_out_of_memory)
{
    arena_fixture_t f;
    make(&f, 16 * PS_MiB, 1);
    /* one live block in each of the 8 superblocks (8 different classes) */
    void *p[8];
    size_t sizes[8];
    for (int c = 0; c < 8; c++) {
        sizes[c] = CLASS_SIZES[c];
        cr_assert_eq(ps_allocate(f.arena, sizes[c], PS_STREAM_NONE, &p[c]), PS_OK);
    }
    FILE *tmp = tmpfile();
    ps_message_set_fd(fileno(tmp));
    void *big;
    int status = ps_allocate(f.arena, 2 * PS_MiB + 1, PS_STREAM_NONE, &big);
    ps_message_set_fd(2);
    cr_assert_eq(status, PS_ENOMEM);
    char text[1024];
    read_messages(tmp, text, sizeof text);
    cr_assert(strstr(text, "poolshim: warning: arena 'arena': out of memory for 2.00 MiB"), "got: %s", text);
    cr_assert(strstr(text, "largest free run 0 B of"), "got: %s", text);
    cr_assert(strstr(text, "fragmented"), "got: %s", text);
    /* still usable */
    for (int c = 0; c < 8; c++)
        cr_assert_eq(ps_deallocate(f.arena, p[c], sizes[c], PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_allocate(f.arena, 2 * PS_MiB + 1, PS_STREAM_NONE, &big), PS_OK);
    fclose(tmp);
    unmake(&f);
}

Test(arena, event_free_is_not_reused_before_its_fence_completes)
{
    arena_fixture_t f;
    make(&f, 0, 0);
    /* 1 MiB blocks: two per superblock */
    void *a, *b, *c, *d;
    cr_assert_eq(ps_allocate(f.arena, PS_MiB, PS_STREAM_NONE, &a), PS_OK);
    cr_assert_eq(ps_allocate(f.arena, PS_MiB, PS_STREAM_NONE, &b), PS_OK);
    cr_assert_eq(ps_deallocate(f.arena, a, PS_MiB, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(arena_info(f.arena).bytes_pending, PS_MiB);
    uint64_t fences = ps_fake_gpu_fences_recorded(f.gpu);
    cr_assert_eq(ps_allocate(f.arena, PS_MiB, PS_STREAM_NONE, &c), PS_OK);
    cr_assert_neq(c, a, "reused before the fence completed");
    cr_assert_eq(ps_fake_gpu_fences_recorded(f.gpu), fences + 1, "the epoch was closed by one fence");
    cr_assert_eq(ps_fake_gpu_fence_waits(f.gpu), 0, "no host wait when it can grow");
    ps_fake_gpu_complete_all(f.gpu);
    /* c's superblock has one free block left; then a comes back */
    cr_assert_eq(ps_allocate(f.arena, PS_MiB, PS_STREAM_NONE, &d), PS_OK);
    void *e;
    cr_assert_eq(ps_allocate(f.arena, PS_MiB, PS_STREAM_NONE, &e), PS_OK);
    cr_assert(e == a || d == a, "a is reusable once its fence completed");
    cr_assert_eq(arena_info(f.arena).bytes_pending, 0);
    unmake(&f);
}

Test(arena, large_event_free_waits_for_its_fence_too)
{
    arena_fixture_t f;
    make(&f, 0, 0);
    void *a, *b;
    cr_assert_eq(ps_allocate(f.arena, 3 * PS_MiB, PS_STREAM_NONE, &a), PS_OK);
    cr_assert_eq(ps_deallocate(f.arena, a, 3 * PS_MiB, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_deallocate(f.arena, a, 3 * PS_MiB, PS_STREAM_NONE), PS_EINVAL, "double free while pending");
    cr_assert_eq(ps_allocate(f.arena, 3 * PS_MiB, PS_STREAM_NONE, &b), PS_OK);
    cr_assert_neq(b, a);
    cr_assert_eq(ps_deallocate(f.arena, b, 3 * PS_MiB, PS_STREAM_NONE), PS_OK);
    unmake(&f);
}

Test(arena, stream_frees_are_reused_at_once_on_their_stream)
{
    arena_fixture_t f;
    make(&f, 0, 0);
    ps_stream_t s1 = 0x1000, s2 = 0x2000;
    void *a, *b;
    cr_assert_eq(ps_allocate(f.arena, 1000, s1, &a), PS_OK);
    cr_assert_eq(ps_deallocate(f.arena, a, 1000, s1), PS_OK);
    cr_assert_eq(ps_allocate(f.arena, 1000, s1, &b), PS_OK);
    cr_assert_eq(b, a, "same stream: reused at once");
    cr_assert_eq(ps_fake_gpu_fences_recorded(f.gpu), 0);
    /* freed on another stream: the owner stream waits for it on the GPU */
    cr_assert_eq(ps_deallocate(f.arena, b, 1000, s2), PS_OK);
    cr_assert_eq(ps_fake_gpu_stream_waits(f.gpu), 1);
    cr_assert_eq(ps_fake_gpu_fence_waits(f.gpu), 0, "never a host wait");
    unmake(&f);
}

Test(arena, refuses_pointers_it_did_not_hand_out)
{
    arena_fixture_t f;
    make(&f, 0, 1);
    void *a;
    int local;
    cr_assert_eq(ps_allocate(f.arena, 1000, PS_STREAM_NONE, &a), PS_OK);
    cr_assert_eq(ps_deallocate(f.arena, (char *)a + 256, 1000, PS_STREAM_NONE), PS_EINVAL, "inside a block");
    cr_assert_eq(ps_deallocate(f.arena, &local, 4, PS_STREAM_NONE), PS_EINVAL, "foreign");
    cr_assert_eq(arena_info(f.arena).bytes_in_use, 1024, "state unchanged");
    cr_assert_eq(ps_deallocate(f.arena, a, 1000, PS_STREAM_NONE), PS_OK);
    unmake(&f);
}

/* The free path's checks, for each kind of span an address may lie in: a
 * large block (only its first byte is a block), a free run, a small
 * superblock (block starts handed out), and a superblock that went back to
 * the global arena and was taken again for another class. */
Test(arena, refuses_frees_that_name_no_block_handed_out)
{
    arena_fixture_t f;
    make_with(&f, 0, 1, PS_FREE_SYNC_NONE);
    void *big;
    cr_assert_eq(ps_allocate(f.arena, 3 * PS_MiB, PS_STREAM_NONE, &big), PS_OK);
    cr_assert_eq(ps_deallocate(f.arena, (char *)big + 256, 3 * PS_MiB, PS_STREAM_NONE), PS_EINVAL,
                 "inside a large block's first superblock");
    cr_assert_eq(ps_deallocate(f.arena, (char *)big + 2 * PS_MiB, 3 * PS_MiB, PS_STREAM_NONE), PS_EINVAL,
                 "a large block's second superblock");
    cr_assert_eq(ps_deallocate(f.arena, big, 3 * PS_MiB, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_deallocate(f.arena, big, 3 * PS_MiB, PS_STREAM_NONE), PS_EINVAL, "now in a free run");
    /* two superblocks of 512 KiB blocks (four each); the second, emptied, goes back */
    void *blocks[6], *other;
    for (int i = 0; i < 6; i++)
        cr_assert_eq(ps_allocate(f.arena, 512 * PS_KiB, PS_STREAM_NONE, &blocks[i]), PS_OK);
    cr_assert_eq(ps_deallocate(f.arena, blocks[0], 512 * PS_KiB, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_deallocate(f.arena, blocks[0], 512 * PS_KiB, PS_STREAM_NONE), PS_EINVAL, "double free");
    cr_assert_eq(ps_deallocate(f.arena, blocks[4], 512 * PS_KiB, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_deallocate(f.arena, blocks[5], 512 * PS_KiB, PS_STREAM_NONE), PS_OK);
    /* taken again for 1 KiB blocks: blocks[5]'s address is a block start of that class too,
     * not handed out */
    cr_assert_eq(ps_allocate(f.arena, 1000, PS_STREAM_NONE, &other), PS_OK);
    cr_assert_eq(other, blocks[4], "the emptied superblock was taken again, lowest block first");
    cr_assert_eq(ps_deallocate(f.arena, blocks[5], 512 * PS_KiB, PS_STREAM_NONE), PS_EINVAL,
                 "a block of the old class in a superblock taken again");
    cr_assert_eq(arena_info(f.arena).bytes_in_use, 3 * 512 * PS_KiB + 1024, "state unchanged");
    cr_assert_eq(ps_deallocate(f.arena, other, 1000, PS_STREAM_NONE), PS_OK);
    for (int i = 1; i < 4; i++)
        cr_assert_eq(ps_deallocate(f.arena, blocks[i], 512 * PS_KiB, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(arena_info(f.arena).bytes_in_use, 0);
    unmake(&f);
}

Test(arena, trim_gives_free_chunks_back)
{
    arena_fixture_t f;
    make(&f, 0, 1);
    void *a;
    cr_assert_eq(ps_allocate(f.arena, 5 * PS_MiB, PS_STREAM_NONE, &a), PS_OK);
    cr_assert_eq(ps_deallocate(f.arena, a, 5 * PS_MiB, PS_STREAM_NONE), PS_OK);
    cr_assert_gt(ps_fake_gpu_bytes_outstanding(f.gpu), 0);
    cr_assert_eq(ps_trim(f.arena), PS_OK);
    cr_assert_eq(ps_fake_gpu_bytes_outstanding(f.gpu), 0);
    cr_assert_eq(arena_info(f.arena).bytes_reserved, 0);
    unmake(&f);
}

/* ---- destroyed streams ---- */

/* An arena of 64 KiB superblocks: 32 KiB requests fit two per superblock. */
static void make_small(arena_fixture_t *f)
{
    ps_fake_gpu_options_t h = {0};
    cr_assert_eq(ps_fake_gpu_create(&h, &f->gpu), PS_OK);
    cr_assert_eq(ps_cuda_resource_create("cuda", f->gpu, &f->up), PS_OK);
    ps_arena_options_t o;
    ps_arena_options_default(&o);
    o.superblock_size = 64 * PS_KiB;
    o.free_sync = PS_FREE_SYNC_EVENT; /* these tests follow fences */
    cr_assert_eq(ps_arena_create("arena", f->up, f->gpu, &o, &f->arena), PS_OK);
}

Test(arena, destroyed_stream_blocks_wait_for_a_fence_then_become_ready)
{
    arena_fixture_t f;
    make_small(&f);
    const ps_stream_t s1 = 0x1000, s2 = 0x2000;
    const size_t size = 32 * PS_KiB;
    void *a[2], *b[4];
    for (int i = 0; i < 2; i++)
        cr_assert_eq(ps_allocate(f.arena, size, s1, &a[i]), PS_OK);
    for (int i = 0; i < 2; i++)
        cr_assert_eq(ps_deallocate(f.arena, a[i], size, s1), PS_OK);
    cr_assert_eq(ps_fake_gpu_fences_recorded(f.gpu), 0, "freed on their stream: no fence yet");
    ps_stream_destroyed(f.arena, s1);
    cr_assert_eq(ps_fake_gpu_fences_on_stream(f.gpu, s1), 1, "one fence on the stream at the destroy");
    cr_assert_eq(arena_info(f.arena).bytes_pending, 2 * size, "its free blocks are pending, not free");
    /* cudaMalloc must not get them before the fence, trim must not give them back */
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(ps_allocate(f.arena, size, PS_STREAM_NONE, &b[i]), PS_OK);
        cr_assert(b[i] != a[0] && b[i] != a[1], "block %d is a block of the dead stream before its fence", i);
    }
    cr_assert_eq(ps_trim(f.arena), PS_OK);
    cr_assert_eq(arena_info(f.arena).bytes_pending, 2 * size, "still pending after trim");
    /* a new stream inherits the retired arena: on the GPU it first waits
     * for the destroy's fence, then reuses the blocks */
    cr_assert_eq(ps_fake_gpu_waits_on_stream(f.gpu, s2), 0);
    void *c;
    cr_assert_eq(ps_allocate(f.arena, size, s2, &c), PS_OK);
    cr_assert_eq(ps_fake_gpu_waits_on_stream(f.gpu, s2), 1, "s2 waits for the fence recorded at the destroy");
    cr_assert(c == a[0] || c == a[1], "after that wait the dead stream's blocks are s2's");
    cr_assert_eq(arena_info(f.arena).bytes_pending, 0);
    cr_assert_eq(ps_fake_gpu_waits_on_stream(f.gpu, s1), 0, "nothing waits on the dead stream");
    cr_assert_eq(ps_fake_gpu_fences_on_stream(f.gpu, s1), 1, "no fence on the dead stream afterwards");
    cr_assert_eq(ps_deallocate(f.arena, c, size, s2), PS_OK);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(ps_deallocate(f.arena, b[i], size, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(arena_info(f.arena).bytes_in_use, 0);
    unmake(&f);
}

Test(arena, retired_arena_gives_superblocks_back_once_its_fence_completed)
{
    arena_fixture_t f;
    make_small(&f);
    const ps_stream_t s1 = 0x1000;
    void *a;
    cr_assert_eq(ps_allocate(f.arena, 1000, s1, &a), PS_OK);
    cr_assert_eq(ps_deallocate(f.arena, a, 1000, s1), PS_OK);
    ps_stream_destroyed(f.arena, s1);
    cr_assert_eq(ps_trim(f.arena), PS_OK);
    cr_assert_gt(arena_info(f.arena).bytes_reserved, 0, "kept while the fence is incomplete");
    ps_fake_gpu_complete_all(f.gpu);
    cr_assert_eq(ps_trim(f.arena), PS_OK);
    cr_assert_eq(arena_info(f.arena).bytes_reserved, 0, "given back after it completed");
    cr_assert_eq(arena_info(f.arena).bytes_pending, 0);
    cr_assert_eq(ps_fake_gpu_fences_on_stream(f.gpu, s1), 1);
    unmake(&f);
}

Test(arena, blocks_outliving_their_stream_are_freed_without_naming_it)
{
    arena_fixture_t f;
    make_small(&f);
    const ps_stream_t s1 = 0x1000, s2 = 0x2000;
    const size_t size = 32 * PS_KiB;
    void *a, *b, *c;
    cr_assert_eq(ps_allocate(f.arena, size, s1, &a), PS_OK);
    cr_assert_eq(ps_allocate(f.arena, size, s1, &b), PS_OK);
    ps_stream_destroyed(f.arena, s1);
    /* freed on another stream after the destroy: no wait of s1 on it */
    cr_assert_eq(ps_deallocate(f.arena, a, size, s2), PS_OK);
    cr_assert_eq(ps_deallocate(f.arena, b, size, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(arena_info(f.arena).bytes_pending, 2 * size, "pending until a fence");
    cr_assert_eq(ps_allocate(f.arena, size, s2, &c), PS_OK);
    cr_assert(c != a && c != b, "not reused before a fence completed");
    cr_assert_eq(ps_trim(f.arena), PS_OK);
    cr_assert_eq(ps_fake_gpu_fences_on_stream(f.gpu, s1), 0);
    cr_assert_eq(ps_fake_gpu_waits_on_stream(f.gpu, s1), 0);
    ps_deallocate(f.arena, c, size, s2);
    unmake(&f);
}

Test(arena, stream_churn_recycles_arenas)
{
    arena_fixture_t f;
    make(&f, 0, 1);
    uint64_t reserved = 0;
    for (uintptr_t i = 0; i < 100000; i++) {
        ps_stream_t s = 0x10000 + i * 64;
        void *p;
        cr_assert_eq(ps_allocate(f.arena, 4096, s, &p), PS_OK, "stream %lu", (unsigned long)i);
        cr_assert_eq(ps_deallocate(f.arena, p, 4096, s), PS_OK);
        ps_stream_destroyed(f.arena, s);
        if (i == 10)
            reserved = arena_info(f.arena).bytes_reserved;
    }
    cr_assert_eq(arena_info(f.arena).bytes_reserved, reserved, "what is reserved stays flat");
    cr_assert_eq(arena_info(f.arena).bytes_in_use, 0);
    unmake(&f);
}

Test(arena, a_new_stream_reusing_the_handle_waits_for_the_old_streams_superblocks)
{
    arena_fixture_t f;
    make_small(&f);
    const ps_stream_t s1 = 0x1000;
    const size_t size = 32 * PS_KiB;
    void *a, *b;
    cr_assert_eq(ps_allocate(f.arena, size, s1, &a), PS_OK);
    cr_assert_eq(ps_deallocate(f.arena, a, size, s1), PS_OK);
    cr_assert_eq(ps_trim(f.arena), PS_OK); /* the superblock leaves with a fence on s1 */
    cr_assert_eq(ps_fake_gpu_fences_on_stream(f.gpu, s1), 1);
    ps_stream_destroyed(f.arena, s1);
    /* the driver hands the same handle to a new stream: it is another
     * stream, so it must wait for the old one's fence before reusing */
    cr_assert_eq(ps_allocate(f.arena, size, s1, &b), PS_OK);
    cr_assert_eq(b, a, "the fenced superblock is reused");
    cr_assert_eq(ps_fake_gpu_waits_on_stream(f.gpu, s1), 1, "after a GPU-side wait for the old fence");
    cr_assert_eq(ps_deallocate(f.arena, b, size, s1), PS_OK);
    unmake(&f);
}

/* Each thread remembers which arena served a stream (no lock on the
 * stream-ordered path); the hint must not outlive the stream. The driver
 * reuses a destroyed stream's handle: the new stream must not take the
 * dead stream's free blocks before waiting for its last work, nor the
 * blocks another stream freed in the arena that now serves it. */
Test(arena, a_remembered_stream_arena_is_not_trusted_after_the_stream_died)
{
    arena_fixture_t f;
    make_small(&f);
    const ps_stream_t s1 = 0x1000, s2 = 0x2000;
    const size_t size = 32 * PS_KiB;
    void *a, *b, *c;
    cr_assert_eq(ps_allocate(f.arena, size, s1, &a), PS_OK); /* this thread remembers s1's arena */
    cr_assert_eq(ps_deallocate(f.arena, a, size, s1), PS_OK);
    ps_stream_destroyed(f.arena, s1);
    /* the handle comes back as a new stream: it waits on the GPU for the
     * fence of the destroy before it gets the dead stream's block */
    cr_assert_eq(ps_allocate(f.arena, size, s1, &b), PS_OK);
    cr_assert(b != a || ps_fake_gpu_waits_on_stream(f.gpu, s1) == 1,
              "the new s1 took the dead s1's block without waiting for its fence");
    cr_assert_eq(ps_deallocate(f.arena, b, size, s1), PS_OK);
    ps_stream_destroyed(f.arena, s1);
    ps_fake_gpu_complete_all(f.gpu);
    /* s2 inherits the retired arena and frees a block in it; the next s1
     * (the handle again) must not get that block: it is reusable on s2 only */
    cr_assert_eq(ps_allocate(f.arena, size, s2, &b), PS_OK);
    cr_assert_eq(ps_deallocate(f.arena, b, size, s2), PS_OK);
    uint64_t waits = ps_fake_gpu_waits_on_stream(f.gpu, s1);
    cr_assert_eq(ps_allocate(f.arena, size, s1, &c), PS_OK);
    cr_assert(c != b || ps_fake_gpu_waits_on_stream(f.gpu, s1) > waits,
              "s1 took the block s2 freed, with no wait for s2's work");
    cr_assert_eq(ps_deallocate(f.arena, c, size, s1), PS_OK);
    unmake(&f);
}

/* free_sync barrier (the default): a cudaFree alone never makes a block
 * reusable; only a barrier (core/reuse.c, when nothing else fits) or a
 * completed fence does. The GPU once found the arena and fixed_size
 * treating barrier as "none" (corruption in the hazard test); this is that
 * bug's CPU test (tests/unit/test_reuse.c covers the barrier itself and
 * its refusal). */
Test(arena, barrier_policy_falls_back_to_the_epoch_not_to_immediate_reuse)
{
    arena_fixture_t f;
    ps_fake_gpu_options_t h = {0};
    cr_assert_eq(ps_fake_gpu_create(&h, &f.gpu), PS_OK);
    cr_assert_eq(ps_cuda_resource_create("cuda", f.gpu, &f.up), PS_OK);
    ps_arena_options_t o;
    ps_arena_options_default(&o);
    o.free_sync = PS_FREE_SYNC_BARRIER;
    cr_assert_eq(ps_arena_create("arena", f.up, f.gpu, &o, &f.arena), PS_OK);
    void *a, *b;
    cr_assert_eq(ps_allocate(f.arena, PS_MiB, PS_STREAM_NONE, &a), PS_OK);
    cr_assert_eq(ps_deallocate(f.arena, a, PS_MiB, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(arena_info(f.arena).bytes_pending, PS_MiB, "the freed block waits");
    cr_assert_eq(ps_allocate(f.arena, PS_MiB, PS_STREAM_NONE, &b), PS_OK);
    cr_assert_neq(b, a, "reused before any fence completed");
    unmake(&f);

    ps_resource_t *fixed;
    cr_assert_eq(ps_fake_gpu_create(&h, &f.gpu), PS_OK);
    cr_assert_eq(ps_cuda_resource_create("cuda", f.gpu, &f.up), PS_OK);
    ps_fixed_size_options_t fo;
    ps_fixed_size_options_default(&fo);
    fo.free_sync = PS_FREE_SYNC_BARRIER;
    cr_assert_eq(ps_fixed_size_create("fixed", f.up, f.gpu, &fo, &fixed), PS_OK);
    cr_assert_eq(ps_allocate(fixed, 256, PS_STREAM_NONE, &a), PS_OK);
    cr_assert_eq(ps_deallocate(fixed, a, 256, PS_STREAM_NONE), PS_OK);
    for (int i = 0; i < 64; i++) {
        cr_assert_eq(ps_allocate(fixed, 256, PS_STREAM_NONE, &b), PS_OK);
        cr_assert_neq(b, a, "fixed_size reused a block before any fence completed");
    }
    ps_destroy(fixed);
    ps_destroy(f.up);
    ps_fake_gpu_destroy(f.gpu);
}

/* ---- one barrier for every thread (free_sync barrier) ---- */

/* Another thread's arena runs out of 1 MiB blocks (two per superblock)
 * with both freed: it issues one barrier (or, blocked, has it refused). */
static void *barrier_issuer(void *p)
{
    ps_resource_t *arena = p;
    void *b;
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(ps_allocate(arena, PS_MiB, PS_STREAM_NONE, &b), PS_OK);
        cr_assert_eq(ps_deallocate(arena, b, PS_MiB, PS_STREAM_NONE), PS_OK);
    }
    return NULL;
}

static void issue_from_another_thread(ps_resource_t *arena)
{
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, barrier_issuer, arena), 0);
    cr_assert_eq(pthread_join(t, NULL), 0);
}

/* This thread freed X, another thread's barrier began and was issued, this
 * thread freed Y: X is reusable without a barrier of its own (otherwise
 * each of 16 threads issues its own barriers, since the one open epoch
 * always holds a free younger than any barrier), Y only after a barrier
 * issued after its free. */
Test(arena, a_barrier_of_another_thread_releases_what_was_freed_before_it)
{
    arena_fixture_t f;
    make_with(&f, 0, 0, PS_FREE_SYNC_BARRIER);
    const size_t small = 256 * PS_KiB; /* 8 per superblock */
    void *x, *x2, *y, *p;
    cr_assert_eq(ps_allocate(f.arena, small, PS_STREAM_NONE, &y), PS_OK);
    cr_assert_eq(ps_allocate(f.arena, PS_MiB, PS_STREAM_NONE, &x), PS_OK);
    cr_assert_eq(ps_allocate(f.arena, PS_MiB, PS_STREAM_NONE, &x2), PS_OK); /* the superblock's other block */
    cr_assert_eq(ps_deallocate(f.arena, x, PS_MiB, PS_STREAM_NONE), PS_OK);
    issue_from_another_thread(f.arena);
    uint64_t barriers = ps_fake_gpu_barriers(f.gpu);
    cr_assert_gt(barriers, 0, "the other thread issued a barrier");
    cr_assert_eq(ps_deallocate(f.arena, y, small, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_allocate(f.arena, PS_MiB, PS_STREAM_NONE, &p), PS_OK);
    cr_assert_eq(p, x, "X, freed before the other thread's barrier, comes back");
    cr_assert_eq(ps_fake_gpu_barriers(f.gpu), barriers, "without a barrier of this thread's own");
    void *again[16];
    for (int i = 0; i < 16; i++) {
        cr_assert_eq(ps_allocate(f.arena, small, PS_STREAM_NONE, &again[i]), PS_OK);
        if (again[i] == y)
            cr_assert_gt(ps_fake_gpu_barriers(f.gpu), barriers, "Y came back before a barrier issued after its free");
    }
    for (int i = 0; i < 16; i++)
        cr_assert_eq(ps_deallocate(f.arena, again[i], small, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_deallocate(f.arena, p, PS_MiB, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_deallocate(f.arena, x2, PS_MiB, PS_STREAM_NONE), PS_OK);
    unmake(&f);
}

/* The same with the other thread's barrier refused (a stream capture
 * open): it began but covers nothing, so X waits for a fence. */
Test(arena, a_refused_barrier_of_another_thread_releases_nothing)
{
    arena_fixture_t f;
    make_with(&f, 0, 0, PS_FREE_SYNC_BARRIER);
    const size_t small = 256 * PS_KiB;
    void *x, *x2, *y, *p[4];
    cr_assert_eq(ps_allocate(f.arena, small, PS_STREAM_NONE, &y), PS_OK);
    cr_assert_eq(ps_allocate(f.arena, PS_MiB, PS_STREAM_NONE, &x), PS_OK);
    cr_assert_eq(ps_allocate(f.arena, PS_MiB, PS_STREAM_NONE, &x2), PS_OK);
    cr_assert_eq(ps_deallocate(f.arena, x, PS_MiB, PS_STREAM_NONE), PS_OK);
    ps_fake_gpu_block_barriers(f.gpu, 1);
    issue_from_another_thread(f.arena);
    cr_assert_eq(ps_fake_gpu_barriers(f.gpu), 0);
    cr_assert_eq(ps_deallocate(f.arena, y, small, PS_STREAM_NONE), PS_OK); /* the next segment */
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(ps_allocate(f.arena, PS_MiB, PS_STREAM_NONE, &p[i]), PS_OK);
        cr_assert_neq(p[i], x, "X came back with no barrier issued and no fence completed");
    }
    for (int i = 0; i < 4; i++)
        cr_assert_eq(ps_deallocate(f.arena, p[i], PS_MiB, PS_STREAM_NONE), PS_OK);
    cr_assert_eq(ps_deallocate(f.arena, x2, PS_MiB, PS_STREAM_NONE), PS_OK);
    unmake(&f);
}

/* Filled with 1 GiB blocks, the arena must hold as many as the pool and
 * native cudaMalloc (139 on an H200). A simulated device of the H200's
 * size (139.5 GiB free): the arena must reach the pool's count, and the
 * device's. */
static int fill_with_gib_blocks(ps_resource_t *r, void **blocks, int max)
{
    int n = 0;
    while (n < max && ps_allocate(r, PS_GiB, PS_STREAM_NONE, &blocks[n]) == PS_OK)
        n++;
    return n;
}

Test(arena, fills_the_device_with_1GiB_blocks_as_far_as_the_pool)
{
    enum { MAX = 200 };
    static void *blocks[MAX];
    const size_t capacity = 139 * PS_GiB + 512 * PS_MiB;
    ps_fake_gpu_options_t h = {.capacity = capacity};
    ps_gpu_ops_t *gpu;
    ps_resource_t *up, *pool, *arena;

    cr_assert_eq(ps_fake_gpu_create(&h, &gpu), PS_OK);
    cr_assert_eq(ps_cuda_resource_create("cuda", gpu, &up), PS_OK);
    int native = fill_with_gib_blocks(up, blocks, MAX);
    for (int i = 0; i < native; i++)
        ps_deallocate(up, blocks[i], PS_GiB, PS_STREAM_NONE);
    cr_assert_eq(native, 139, "the simulated device holds 139 blocks natively");

    ps_pool_options_t po;
    ps_pool_options_default(&po);
    po.expandable = 0;
    cr_assert_eq(ps_pool_create("pool", up, gpu, &po, &pool), PS_OK);
    int pooled = fill_with_gib_blocks(pool, blocks, MAX);
    ps_destroy(pool);

    cr_assert_eq(ps_arena_create("arena", up, gpu, NULL, &arena), PS_OK);
    int arena_count = fill_with_gib_blocks(arena, blocks, MAX);
    ps_resource_info_t info = arena_info(arena);
    cr_log_info("1 GiB blocks on a 139.5 GiB device: native %d, pool %d, arena %d (arena reserved %.1f GiB)",
                native, pooled, arena_count, (double)info.bytes_reserved / (double)PS_GiB);
    cr_assert_eq(pooled, native);
    cr_assert_eq(arena_count, pooled, "the arena reaches the pool's count (%d vs %d)", arena_count, pooled);
    for (int i = 0; i < arena_count; i++)
        cr_assert_eq(ps_deallocate(arena, blocks[i], PS_GiB, PS_STREAM_NONE), PS_OK);
    ps_destroy(arena);
    ps_destroy(up);
    ps_fake_gpu_destroy(gpu);
}
