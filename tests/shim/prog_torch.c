/* The torch door (shim/hooks_torch.c) as PyTorch's CUDAPluggableAllocator
 * uses it: the program loads libpoolshim.so with dlopen (no LD_PRELOAD),
 * starts the runtime as PyTorch does, and calls the three functions by name.
 *   prog_torch LIB reuse      a freed tensor's block comes back after a
 *                             barrier (run with barrier_floor = 0)
 *   prog_torch LIB streams    streams named by an allocation or by
 *                             record_stream wait at the barrier; others not
 *   prog_torch LIB counts     the statistics count the door's calls
 *   prog_torch LIB thread     a thread the runtime never touched (autograd's)
 *                             allocates and frees
 */
#include <dlfcn.h>
#include <pthread.h>
#include <sys/types.h>

#include "prog_common.h"

extern cudaError_t cudaFree(void *);
extern CUresult cuCtxGetCurrent(CUcontext *); /* the fake driver's, loaded with the runtime */
extern cudaError_t cudaStreamCreateWithFlags(cudaStream_t *, unsigned int);

typedef void *(*alloc_fn)(ssize_t, int, cudaStream_t);
typedef void (*free_fn)(void *, ssize_t, int, cudaStream_t);
typedef void (*record_fn)(void *, cudaStream_t);
static alloc_fn door_alloc;
static free_fn door_free;
static record_fn door_record;
static void *lib;

/* The test runs a pool whose misses issue a barrier and that keeps no
 * slack (barrier_floor 0, no thread cache, no piece mapped ahead): a block
 * of one 8 MiB piece fills the pool, and a freed one comes back after one
 * barrier. */
#define PIECE ((ssize_t)8 << 20)
static void reuse(cudaStream_t s)
{
    for (ssize_t size = PIECE; size <= PIECE; size++) {
        void *a = door_alloc(size, 0, s);
        CHECK(a != NULL, "alloc %zd", size);
        fill(a, (size_t)size, 5);
        door_free(a, size, 0, s);
        unsigned long records = fake()->event_record;
        void *b = door_alloc(size, 0, s);
        CHECK(b == a, "%zd bytes: the freed block comes back (%p, then %p)", size, a, b);
        CHECK(fake()->event_record > records, "%zd bytes: after a barrier", size);
        door_free(b, size, 0, s);
    }
    CHECK(door_alloc(0, 0, s) == NULL, "size 0: NULL, as PyTorch's own allocator");
}

/* A stream the door was told of (an allocation on it, or record_stream)
 * waits at the next barrier; one it was not told of is not touched. */
static void streams(cudaStream_t side, cudaStream_t recorded, cudaStream_t unknown)
{
    size_t size = (size_t)PIECE;
    void *a = door_alloc((ssize_t)size, 0, NULL);
    void *c = door_alloc((ssize_t)size, 0, side); /* side: told by an allocation */
    CHECK(a && c, "alloc");
    door_record(a, recorded);                    /* recorded: told by record_stream */
    door_free(a, (ssize_t)size, 0, NULL);
    unsigned long waits = fake()->stream_wait;
    void *b = door_alloc((ssize_t)size, 0, NULL); /* a miss: one barrier */
    unsigned long barrier_waits = fake()->stream_wait - waits;
    CHECK(b == a, "the recorded block comes back after the barrier");
    CHECK(barrier_waits == 2, "the barrier made the side and the recorded stream wait (%lu waits)", barrier_waits);
    (void)unknown;
    door_free(b, (ssize_t)size, 0, NULL);
    door_free(c, (ssize_t)size, 0, side);
}

static void counts(cudaStream_t s)
{
    for (int i = 0; i < 10; i++) {
        void *p = door_alloc(4096, 0, s);
        door_free(p, 4096, 0, s);
    }
    long (*stats)(char *, size_t) = (long (*)(char *, size_t))dlsym(lib, "poolshim_stats_json");
    static char json[1 << 16];
    CHECK(stats && stats(json, sizeof json) > 0, "poolshim_stats_json");
    CHECK(strstr(json, "\"cuMemAllocAsync\": 10") || strstr(json, "\"cuMemAllocAsync\":10"),
          "ten allocations counted as cuMemAllocAsync in: %.600s", json);
}

static void *thread_main(void *stream)
{
    CUcontext none = (CUcontext)1;
    cuCtxGetCurrent(&none);
    CHECK(none == NULL, "the new thread starts with no current context");
    void *p = door_alloc(1 << 20, 0, (cudaStream_t)stream);
    CHECK(p != NULL, "allocated on a thread with no current context");
    if (p) {
        fill(p, 1 << 20, 3);
        CHECK(intact(p, 1 << 20, 3), "data");
        door_free(p, 1 << 20, 0, (cudaStream_t)stream);
    }
    return NULL;
}

static void other_thread(cudaStream_t s)
{
    pthread_t t;
    CHECK(pthread_create(&t, NULL, thread_main, (void *)s) == 0, "thread");
    pthread_join(t, NULL);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: prog_torch LIB reuse|recorded|counts\n");
        return 2;
    }
    CHECK(cudaFree(NULL) == cudaSuccess, "the runtime starts (PyTorch's lazy init)");
    lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL); /* as ctypes.CDLL */
    if (!lib) {
        fprintf(stderr, "dlopen %s: %s\n", argv[1], dlerror());
        return 1;
    }
    door_alloc = (alloc_fn)dlsym(lib, "poolshim_torch_alloc");
    door_free = (free_fn)dlsym(lib, "poolshim_torch_free");
    door_record = (record_fn)dlsym(lib, "poolshim_torch_record_stream");
    CHECK(door_alloc && door_free && door_record, "the three functions are exported");
    if (failures)
        return finish(argv[2]);
    cudaStream_t s, other;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "stream");
    CHECK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking) == cudaSuccess, "other stream");
    if (!strcmp(argv[2], "reuse")) {
        reuse(s);
        reuse(NULL); /* PyTorch's default stream: the legacy one */
    } else if (!strcmp(argv[2], "streams")) {
        cudaStream_t unknown;
        CHECK(cudaStreamCreateWithFlags(&unknown, cudaStreamNonBlocking) == cudaSuccess, "third stream");
        streams(s, other, unknown);
    } else if (!strcmp(argv[2], "counts")) {
        counts(s);
    } else if (!strcmp(argv[2], "thread")) {
        other_thread(s);
        other_thread(NULL);
    } else {
        fprintf(stderr, "unknown case %s\n", argv[2]);
        return 2;
    }
    int (*active)(void) = (int (*)(void))dlsym(lib, "poolshim_active");
    if (failures) {
        fprintf(stderr, "FAILED %s (%d checks)\n", argv[2], failures);
        return 1;
    }
    printf("OK %s (door %s)\n", argv[2], active && active() ? "active" : "inactive");
    return 0;
}
