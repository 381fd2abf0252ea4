/* The torch door (shim/hooks_torch.c) as PyTorch's CUDAPluggableAllocator
 * uses it: the program loads libpoolshim.so with dlopen (no LD_PRELOAD),
 * starts the runtime as PyTorch does, and calls the three functions by name.
 *   prog_torch LIB reuse      a tensor freed on its stream is reused by the
 *                             next one of its size on that stream, with no
 *                             CUDA call in between
 *   prog_torch LIB recorded   a tensor recorded on another stream: its free
 *                             joins that stream into the tensor's first
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

/* Every CUDA call of the fake driver that could order work or touch memory. */
static unsigned long cuda_calls(void)
{
    fake_cuda_counters_t *c = fake();
    return c->event_record + c->event_query + c->event_sync + c->stream_wait + c->stream_query + c->ctx_sync +
           c->mem_alloc + c->vm_created;
}

static void reuse(cudaStream_t s)
{
    for (ssize_t size = 256; size <= (ssize_t)(8 << 20); size *= 16) {
        void *a = door_alloc(size, 0, s);
        CHECK(a != NULL, "alloc %zd", size);
        fill(a, (size_t)size, 5);
        door_free(a, size, 0, s);
        unsigned long before = cuda_calls();
        void *b = door_alloc(size, 0, s);
        CHECK(b == a, "%zd bytes freed on the stream: reused at once (%p, then %p)", size, a, b);
        CHECK(cuda_calls() == before, "%zd bytes: %lu CUDA calls for the reuse", size, cuda_calls() - before);
        door_free(b, size, 0, s);
    }
    CHECK(door_alloc(0, 0, s) == NULL, "size 0: NULL, as PyTorch's own allocator");
}

static void recorded(cudaStream_t s, cudaStream_t other)
{
    size_t size = 1 << 20;
    void *a = door_alloc((ssize_t)size, 0, s);
    CHECK(a != NULL, "alloc");
    fill(a, size, 7);
    door_record(a, other);
    door_record(a, other); /* twice: one pair */
    unsigned long records = fake()->event_record, waits = fake()->stream_wait;
    door_free(a, (ssize_t)size, 0, s);
    CHECK(fake()->event_record == records + 1 && fake()->stream_wait == waits + 1,
          "the free joins the recorded stream into the block's (%lu records, %lu waits)",
          fake()->event_record - records, fake()->stream_wait - waits);
    void *b = door_alloc((ssize_t)size, 0, s);
    CHECK(b == a, "once joined, the block's stream reuses it at once");
    /* a record on the block's own stream, or of a foreign pointer, changes nothing */
    door_record(b, s);
    int local;
    door_record(&local, other);
    records = fake()->event_record;
    door_free(b, (ssize_t)size, 0, s);
    CHECK(fake()->event_record == records, "recorded on its own stream: nothing to join");
    CHECK(door_alloc((ssize_t)size, 0, s) == b, "and reused at once");
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
    } else if (!strcmp(argv[2], "recorded")) {
        recorded(s, other);
        recorded(NULL, other);
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
