/* fork() while threads allocate, under the shim and the fake CUDA of
 * tests/shim, as a plain program so that it runs under TSan (Criterion's
 * forking runner cannot). The program re-executes itself with
 * LD_PRELOAD=libpoolshim.so. 4 threads allocate, fill, check and free (one
 * stream-ordered on a non-blocking stream) while the main thread forks 50
 * times; each child must find the shim passing through (cudaMalloc and a
 * stream destroy reach CUDA, which refuses in a forked child) and exit
 * within 10 s; the parent's blocks stay intact. */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../shim/prog_common.h"

extern cudaError_t cudaMalloc(void **, size_t);
extern cudaError_t cudaFree(void *);
extern cudaError_t cudaMallocAsync(void **, size_t, cudaStream_t);
extern cudaError_t cudaFreeAsync(void *, cudaStream_t);
extern cudaError_t cudaStreamCreateWithFlags(cudaStream_t *, unsigned int);
extern cudaError_t cudaStreamDestroy(cudaStream_t);

static atomic_int stop;
static atomic_int thread_failures;

static void *churn(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg;
    cudaStream_t s = NULL;
    if (seed == 1 && cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess)
        atomic_fetch_add(&thread_failures, 1);
    while (!atomic_load(&stop)) {
        void *p;
        size_t n = 1 + rand_r(&seed) % 50000;
        if ((s ? cudaMallocAsync(&p, n, s) : cudaMalloc(&p, n)) != cudaSuccess) {
            atomic_fetch_add(&thread_failures, 1);
            continue;
        }
        fill(p, n, seed);
        if (!intact(p, n, seed) || (s ? cudaFreeAsync(p, s) : cudaFree(p)) != cudaSuccess)
            atomic_fetch_add(&thread_failures, 1);
    }
    if (s)
        cudaStreamDestroy(s);
    return NULL;
}

/* In the child: the shim passes through, CUDA refuses, exit() is clean. */
static int child(void *parent_block)
{
    alarm(10);
    int bad = shim_active() ? 1 : 0;
    unsigned long before = fake()->child_calls;
    void *p;
    if (cudaMalloc(&p, 4096) != 3 || fake()->child_calls == before)
        bad |= 2;
    if (cudaFree(parent_block) != 3)
        bad |= 4;
    return bad;
}

int main(int argc, char **argv)
{
    (void)argc;
    if (!dlsym(RTLD_DEFAULT, "poolshim_active")) {
        setenv("LD_PRELOAD", PS_BUILD_DIR "/libpoolshim.so", 1);
        setenv("LD_LIBRARY_PATH", PS_BUILD_DIR "/fake", 1);
        execv("/proc/self/exe", argv);
        perror("execv");
        return 1;
    }
    if (!shim_active()) {
        fprintf(stderr, "fork_stress: the shim is not active\n");
        return 1;
    }
    void *warm;
    CHECK(cudaMalloc(&warm, 4096) == cudaSuccess, "cudaMalloc");
    fill(warm, 4096, 3);
    pthread_t t[4];
    for (uintptr_t i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, churn, (void *)(i + 1));
    for (int i = 0; i < 50; i++) {
        pid_t pid = fork();
        if (pid == 0)
            exit(child(warm));
        int status = 0;
        waitpid(pid, &status, 0);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child %d: status %#x", i, status);
        usleep(500);
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    CHECK(atomic_load(&thread_failures) == 0, "%d failures in the threads", atomic_load(&thread_failures));
    CHECK(intact(warm, 4096, 3) && cudaFree(warm) == cudaSuccess, "the parent's block");
    return finish("fork_stress");
}
