/* The shim's pointer registry under many threads (built with TSan by
 * `make test-all`): threads insert, find and remove their own pointers;
 * pairs of threads race to remove the same pointer — exactly one may win,
 * as two threads calling cudaFree(p) at once must see; and threads free
 * what other threads allocated, some of which have exited (their tables
 * adopted by the threads that come after them) meanwhile. */
#include <pthread.h>
#include <stdio.h>

#include "../../shim/registry.c"

#define THREADS 8
#define PER_THREAD 20000

static atomic_int failures;
static atomic_int wins;
static uintptr_t shared_ptrs[PER_THREAD];

static void *own_pointers(void *arg)
{
    uintptr_t base = ((uintptr_t)arg + 1) << 36;
    for (int round = 0; round < 3; round++) {
        for (uintptr_t i = 0; i < PER_THREAD; i++) {
            ps_allocation_t a = {.ptr = base + i * 256, .size = i + 1, .device = 0};
            if (ps_registry_insert(&a) != PS_OK)
                atomic_fetch_add(&failures, 1);
        }
        for (uintptr_t i = 0; i < PER_THREAD; i++) {
            ps_allocation_t out;
            if (ps_registry_find(base + i * 256, &out) != PS_OK || out.size != i + 1)
                atomic_fetch_add(&failures, 1);
        }
        for (uintptr_t i = 0; i < PER_THREAD; i++) {
            ps_allocation_t out;
            if (ps_registry_remove(base + i * 256, &out) != PS_OK || out.size != i + 1)
                atomic_fetch_add(&failures, 1);
        }
    }
    return NULL;
}

static void *race_remove(void *arg)
{
    (void)arg;
    for (int i = 0; i < PER_THREAD; i++)
        if (ps_registry_remove(shared_ptrs[i], NULL) == PS_OK)
            atomic_fetch_add(&wins, 1);
    return NULL;
}

/* Allocates PER_THREAD pointers of its own range, then exits with them live. */
static void *allocate_and_exit(void *arg)
{
    uintptr_t base = ((uintptr_t)arg + 0x100) << 36;
    for (uintptr_t i = 0; i < PER_THREAD; i++) {
        ps_allocation_t a = {.ptr = base + i * 256, .size = i + 7};
        if (ps_registry_insert(&a) != PS_OK)
            atomic_fetch_add(&failures, 1);
    }
    return NULL;
}

/* Frees the pointers of thread `arg` of allocate_and_exit (while allocating
 * and freeing its own in between, so its table is adopted and busy). */
static void *free_anothers(void *arg)
{
    uintptr_t base = ((uintptr_t)arg + 0x100) << 36, own = ((uintptr_t)arg + 0x200) << 36;
    for (uintptr_t i = 0; i < PER_THREAD; i++) {
        ps_allocation_t a = {.ptr = own + i * 256, .size = 1}, out;
        if (ps_registry_insert(&a) != PS_OK)
            atomic_fetch_add(&failures, 1);
        if (ps_registry_remove(base + i * 256, &out) != PS_OK || out.size != i + 7)
            atomic_fetch_add(&failures, 1);
        if (ps_registry_remove(own + i * 256, NULL) != PS_OK)
            atomic_fetch_add(&failures, 1);
    }
    return NULL;
}

int main(void)
{
    pthread_t t[THREADS];
    for (uintptr_t i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, own_pointers, (void *)i);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < PER_THREAD; i++) {
        shared_ptrs[i] = ((uintptr_t)0x7f << 40) + (uintptr_t)i * 512;
        ps_allocation_t a = {.ptr = shared_ptrs[i], .size = 1};
        ps_registry_insert(&a);
    }
    for (int i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, race_remove, NULL);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    /* producers exit with live pointers; the consumers adopt their tables
     * and free each other's producer's pointers, crossing tables */
    for (uintptr_t i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, allocate_and_exit, (void *)i);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    size_t left_by_producers = ps_registry_count();
    for (uintptr_t i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, free_anothers, (void *)((i + 3) % THREADS));
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    if (left_by_producers != (size_t)THREADS * PER_THREAD)
        atomic_fetch_add(&failures, 1);
    int ok = atomic_load(&failures) == 0 && atomic_load(&wins) == PER_THREAD && ps_registry_count() == 0;
    printf("registry_thread_stress: %d failures, %d of %d racing removes won (want all, once each), %zu left\n",
           atomic_load(&failures), atomic_load(&wins), PER_THREAD, ps_registry_count());
    return ok ? 0 : 1;
}
