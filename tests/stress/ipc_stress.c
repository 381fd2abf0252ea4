/* IPC under load, as a plain program so that it runs under TSan: the
 * exporter's threads export and free while its service thread answers, and
 * the importer's threads open and close at once. Over the shim and the fake
 * CUDA of tests/shim with FAKE_CUDA_VMM=1 (memfd-backed pieces: the two
 * processes share the bytes). The program re-executes itself under the shim.
 *   exporter: 4 threads, 100 rounds each: cudaMalloc (4 KiB..256 KiB), fill,
 *     cudaIpcGetMemHandle, send {handle, size, seed, kept} down a pipe; half
 *     the blocks are kept until the importer is done, half are freed at once
 *     (their handles race with the free: opened or refused, never a crash).
 *   importer (fork+exec of this program, under the shim): 2 threads read the
 *     pipe, open each handle, check the bytes of kept blocks, close.
 * Exit 0 when every kept block was opened and intact and nothing failed. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../shim/prog_common.h"

extern cudaError_t cudaMalloc(void **, size_t);
extern cudaError_t cudaFree(void *);
extern cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *, void *);
extern cudaError_t cudaIpcOpenMemHandle(void **, cudaIpcMemHandle_t, unsigned int);
extern cudaError_t cudaIpcCloseMemHandle(void *);

#define THREADS 4
#define ROUNDS 100

typedef struct message {
    cudaIpcMemHandle_t handle; /* the block's handle */
    uint32_t size;             /* its bytes */
    uint32_t seed;             /* its pattern */
    uint32_t kept;             /* 1: alive until the importer is done */
} message_t;
_Static_assert(sizeof(message_t) <= 512, "a pipe write of one message is atomic");

static int pipe_write_end;
static atomic_int failures_seen;
static void *kept_blocks[THREADS][ROUNDS];

static void *exporter(void *arg)
{
    unsigned t = (unsigned)(uintptr_t)arg, seed = t * 7919 + 1;
    for (int i = 0; i < ROUNDS; i++) {
        message_t m = {.size = 4096 + rand_r(&seed) % (256 << 10), .seed = t * 1000 + (unsigned)i, .kept = i % 2};
        void *p;
        if (cudaMalloc(&p, m.size) != cudaSuccess) {
            atomic_fetch_add(&failures_seen, 1);
            continue;
        }
        fill(p, m.size, m.seed);
        if (cudaIpcGetMemHandle(&m.handle, p) != cudaSuccess) {
            atomic_fetch_add(&failures_seen, 1);
            cudaFree(p);
            continue;
        }
        if (write(pipe_write_end, &m, sizeof m) != (ssize_t)sizeof m)
            atomic_fetch_add(&failures_seen, 1);
        if (m.kept)
            kept_blocks[t][i] = p;
        else if (cudaFree(p) != cudaSuccess) /* races with the importer's open */
            atomic_fetch_add(&failures_seen, 1);
    }
    return NULL;
}

static int pipe_read_end;
static atomic_int opened, refused;

static void *importer(void *arg)
{
    (void)arg;
    message_t m;
    while (read(pipe_read_end, &m, sizeof m) == (ssize_t)sizeof m) {
        void *p = NULL;
        cudaError_t e = cudaIpcOpenMemHandle(&p, m.handle, 1);
        if (e != cudaSuccess) {
            atomic_fetch_add(&refused, 1);
            if (m.kept) {
                fprintf(stderr, "ipc_stress: a kept block was refused (%d)\n", e);
                atomic_fetch_add(&failures_seen, 1);
            }
            continue;
        }
        atomic_fetch_add(&opened, 1);
        if (m.kept && !intact(p, m.size, m.seed)) {
            fprintf(stderr, "ipc_stress: a kept block's bytes differ\n");
            atomic_fetch_add(&failures_seen, 1);
        }
        if (cudaIpcCloseMemHandle(p) != cudaSuccess)
            atomic_fetch_add(&failures_seen, 1);
    }
    return NULL;
}

static int import_all(int fd)
{
    alarm(120);
    pipe_read_end = fd;
    CHECK(shim_active(), "the importer runs under the shim");
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&t[i], NULL, importer, NULL);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    CHECK(atomic_load(&failures_seen) == 0, "%d failures in the importer", atomic_load(&failures_seen));
    CHECK(atomic_load(&opened) >= THREADS * ROUNDS / 2, "every kept block opened (%d opened, %d refused)",
          atomic_load(&opened), atomic_load(&refused));
    printf("ipc_stress importer: %d opened, %d refused (freed before they were opened)\n", atomic_load(&opened),
           atomic_load(&refused));
    return finish("ipc_stress importer");
}

int main(int argc, char **argv)
{
    if (!dlsym(RTLD_DEFAULT, "poolshim_active")) {
        setenv("LD_PRELOAD", PS_BUILD_DIR "/libpoolshim.so", 1);
        setenv("LD_LIBRARY_PATH", PS_BUILD_DIR "/fake", 1);
        setenv("FAKE_CUDA_VMM", "1", 1);
        execv("/proc/self/exe", argv);
        perror("execv");
        return 1;
    }
    if (argc == 3 && !strcmp(argv[1], "import"))
        return import_all(atoi(argv[2]));
    alarm(120);
    CHECK(shim_active(), "the exporter runs under the shim");
    int fds[2];
    if (pipe(fds) != 0)
        return 1;
    pipe_write_end = fds[1];
    char fd_text[16];
    snprintf(fd_text, sizeof fd_text, "%d", fds[0]);
    void *warm;
    CHECK(cudaMalloc(&warm, 4096) == cudaSuccess, "cudaMalloc"); /* CUDA starts before the fork */
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[1]);
        execl("/proc/self/exe", argv[0], "import", fd_text, (char *)NULL);
        _exit(127);
    }
    close(fds[0]);
    pthread_t t[THREADS];
    for (uintptr_t i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, exporter, (void *)i);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    close(fds[1]); /* the importer reads to the end, then exits */
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the importer: status %#x", status);
    CHECK(atomic_load(&failures_seen) == 0, "%d failures in the exporter", atomic_load(&failures_seen));
    for (int i = 0; i < THREADS; i++)
        for (int j = 0; j < ROUNDS; j++)
            if (kept_blocks[i][j])
                CHECK(cudaFree(kept_blocks[i][j]) == cudaSuccess, "free");
    CHECK(cudaFree(warm) == cudaSuccess, "free");
    return finish("ipc_stress");
}
