/* The shim's pointer registry under many threads (built with TSan by
 * `make test-all`): threads insert, find and remove their own pointers,
 * and pairs of threads race to remove the same pointer — exactly one may
 * win, as two threads calling cudaFree(p) at once must see. */
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
    int ok = atomic_load(&failures) == 0 && atomic_load(&wins) == PER_THREAD && ps_registry_count() == 0;
    printf("registry_thread_stress: %d failures, %d of %d racing removes won (want all, once each), %zu left\n",
           atomic_load(&failures), atomic_load(&wins), PER_THREAD, ps_registry_count());
    return ok ? 0 : 1;
}
