/* The pointer registry: device pointer -> who owns it (device, size,
 * stream, door). Every allocation writes it and every free asks it first,
 * so it is on the hot path.
 *
 * 1. Each thread that allocates owns a *table*: an open-addressing table
 *    (linear probing, backward-shift deletion, no tombstones) behind its
 *    own spinlock. An allocation is recorded in the table of the thread
 *    that made it, so a thread writes only its own cache lines: with one
 *    global table in 256 hashed shards, at 16 threads nearly every insert
 *    had to fetch a shard line that another core wrote last (a thread cache
 *    cycles through hundreds of blocks between barriers), and inserts
 *    dominated psbench's threads workload.
 * 2. A free looks in the freeing thread's own table first (the usual case:
 *    the thread that allocated frees), then in the table where this thread
 *    last found a pointer of another thread (PyTorch's autograd thread
 *    frees what the main thread allocated: one table, every time), then
 *    walks every table. An entry lives in exactly one table and never
 *    moves, and a remove happens under that table's lock, so of two
 *    threads freeing one pointer exactly one succeeds.
 * 3. Tables are never freed. A thread's exit gives its table up (pthread
 *    key destructor); the entries stay where they are, still found by the
 *    walk, and the next thread that allocates adopts the table. The list of
 *    tables only grows (a push at its head), so the walk needs no lock; its
 *    length is the most threads that ever allocated at the same time.
 * 4. A table doubles at 70% load, under its lock; the old array is freed
 *    at once (every reader takes the lock).
 * 5. Insert and remove first try the usual case without a call: their own
 *    table, its lock free at the first try, room, nothing to shift back;
 *    anything else goes to a slow twin that does the whole job.
 * 6. Slabs (the big pieces the shim took from CUDA) are kept apart in a
 *    small sorted array behind a mutex: it answers "is this address inside
 *    our memory?" on the rare path of a pointer that is not registered
 *    (bad pointer vs foreign pointer), never on the hot path.
 * 7. When a device's context dies, its entries and slabs are dropped by a
 *    sweep of every table under its lock (rare: resets), no CUDA call.
 * Costs: insert and a same-thread remove O(1) expected, touching the
 * thread's own lines; a pointer that is in no table (foreign or bad) walks
 * every table.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "registry.h"

#define INITIAL_SLOTS 64 /* 2 KiB: a thread's live set is often small; it doubles at 70% */
/* initial-exec TLS, as the rest of the shim (it is preloaded, never dlopened late) */
#define REG_TLS __thread __attribute__((tls_model("initial-exec")))

typedef struct table {
    ps_spin_t lock;           /* its thread takes it on every insert and free */
    atomic_int owned;         /* 1 while a live thread allocates into it */
    size_t mask;              /* slots - 1 (slots is a power of two), 0 before first insert */
    size_t count;             /* live entries */
    size_t grow_at;           /* count at which the table doubles (70% load; 0 before first insert) */
    ps_allocation_t *slots;   /* the table; ptr == 0 marks an empty slot */
    struct table *next;       /* the next older table of the list (fixed once published) */
} __attribute__((aligned(64))) table_t;

_Static_assert(64 % sizeof(ps_allocation_t) == 0, "a slot never straddles two cache lines");

static _Atomic(table_t *) tables;      /* every table, newest first; only grows */
static pthread_mutex_t adopt_lock = PTHREAD_MUTEX_INITIALIZER; /* serializes adopt/create (and fork) */
static pthread_once_t key_once = PTHREAD_ONCE_INIT;
static pthread_key_t thread_key;       /* destructor: give_up_table */
static REG_TLS table_t *tls_table;     /* this thread's table (NULL before its first insert) */
static REG_TLS table_t *tls_hint;      /* where this thread last found another thread's pointer */

typedef struct slab {
    uintptr_t base; /* first byte */
    size_t size;    /* bytes */
    int device;     /* whose stack took it */
    bool mapped;    /* device memory was mapped into it (cuMemMap): a copy of it from another device needs
                       ordering (copy_order.c) */
} slab_t;
static pthread_mutex_t slab_lock = PTHREAD_MUTEX_INITIALIZER;
static slab_t *slabs;        /* sorted by base */
static size_t slab_count;    /* entries used */
static size_t slab_capacity; /* entries allocated */

static inline uint64_t hash_ptr(uintptr_t p)
{
    return (uint64_t)(p >> 8) * 0x9E3779B97F4A7C15ull;
}

static inline bool table_try_lock(table_t *t) { return ps_spin_try(&t->lock); }
static inline void table_lock(table_t *t) { ps_spin_lock(&t->lock); }
static inline void table_unlock(table_t *t) { ps_spin_unlock(&t->lock); }

static inline size_t slot_of(uint64_t h, size_t mask) { return (size_t)(h >> 32) & mask; }
static inline table_t *first_table(void) { return atomic_load_explicit(&tables, memory_order_acquire); }

void ps_registry_init(void) {}

/* ---- owning a table --------------------------------------------------------- */

/* pthread key destructor: the exiting thread's table can be adopted (its
 * entries stay in it). */
static void give_up_table(void *arg)
{
    table_t *t = arg;
    if (tls_table == t)
        tls_table = NULL;
    tls_hint = NULL;
    atomic_store_explicit(&t->owned, 0, memory_order_release);
}

static void key_init(void) { pthread_key_create(&thread_key, give_up_table); }

/* The calling thread's table: adopts one given up by an exited thread, or
 * makes a new one. NULL when out of host memory. */
static PS_COLD table_t *own_table(void)
{
    if (tls_table)
        return tls_table;
    pthread_once(&key_once, key_init);
    pthread_mutex_lock(&adopt_lock);
    table_t *t = first_table();
    int expected = 0;
    while (t && !atomic_compare_exchange_strong(&t->owned, &expected, 1)) {
        expected = 0;
        t = t->next;
    }
    if (!t) {
        t = aligned_alloc(64, sizeof *t);
        if (t) {
            memset(t, 0, sizeof *t);
            atomic_init(&t->owned, 1);
            t->next = first_table();
            atomic_store_explicit(&tables, t, memory_order_release);
        }
    }
    pthread_mutex_unlock(&adopt_lock);
    if (t && pthread_setspecific(thread_key, t) != 0) {
        atomic_store(&t->owned, 0); /* no destructor could give it up: do not keep it */
        return NULL;
    }
    tls_table = t;
    return t;
}

/* ---- one table (its lock held) --------------------------------------------- */

/* Doubles the table (or makes the first one). */
static int table_grow(table_t *t)
{
    size_t slots = t->mask ? (t->mask + 1) * 2 : INITIAL_SLOTS;
    ps_allocation_t *fresh = aligned_alloc(64, slots * sizeof *fresh);
    if (!fresh)
        return PS_ENOMEM;
    memset(fresh, 0, slots * sizeof *fresh);
    size_t mask = slots - 1;
    if (t->slots) {
        for (size_t i = 0; i <= t->mask; i++) {
            if (!t->slots[i].ptr)
                continue;
            size_t j = slot_of(hash_ptr(t->slots[i].ptr), mask);
            while (fresh[j].ptr)
                j = (j + 1) & mask;
            fresh[j] = t->slots[i];
        }
        free(t->slots);
    }
    t->slots = fresh;
    t->mask = mask;
    t->grow_at = slots * 7 / 10;
    return PS_OK;
}

/* Requires room (count < grow_at). */
static inline void table_put(table_t *t, uint64_t h, const ps_allocation_t *a)
{
    size_t i = slot_of(h, t->mask);
    while (t->slots[i].ptr && t->slots[i].ptr != a->ptr)
        i = (i + 1) & t->mask;
    if (!t->slots[i].ptr)
        t->count++;
    t->slots[i] = *a;
}

/* Returns the slot index of ptr or SIZE_MAX. */
static inline size_t table_find(const table_t *t, uint64_t h, uintptr_t ptr)
{
    if (!t->slots)
        return SIZE_MAX;
    for (size_t i = slot_of(h, t->mask);; i = (i + 1) & t->mask) {
        if (t->slots[i].ptr == ptr)
            return i;
        if (!t->slots[i].ptr)
            return SIZE_MAX;
    }
}

/* Empties slot i, which has a successor in its probe chain: backward-shift
 * deletion keeps every chain unbroken (an entry after i may move into i). */
static void table_shift_out(table_t *t, size_t i)
{
    size_t hole = i;
    for (size_t j = (i + 1) & t->mask; t->slots[j].ptr; j = (j + 1) & t->mask) {
        size_t home = slot_of(hash_ptr(t->slots[j].ptr), t->mask);
        /* move j into the hole unless its home lies cyclically in (hole, j] */
        int stays = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
        if (!stays) {
            t->slots[hole] = t->slots[j];
            hole = j;
        }
    }
    t->slots[hole].ptr = 0;
    t->count--;
}

/* Empties slot i. */
static inline void table_remove_slot(table_t *t, size_t i)
{
    if (t->slots[(i + 1) & t->mask].ptr) {
        table_shift_out(t, i);
        return;
    }
    t->slots[i].ptr = 0; /* the usual end of a short chain: nothing moves */
    t->count--;
}

/* ---- looking in one table, or in all (takes the locks) ----------------------- */

/* Looks for ptr in t under its lock; copies its record to *out (if
 * non-NULL) and, when `take`, removes it. */
static bool table_lookup(table_t *t, uint64_t h, uintptr_t ptr, ps_allocation_t *out, bool take)
{
    table_lock(t);
    size_t i = table_find(t, h, ptr);
    if (i != SIZE_MAX) {
        if (out)
            *out = t->slots[i];
        if (take)
            table_remove_slot(t, i);
    }
    table_unlock(t);
    return i != SIZE_MAX;
}

/* The whole search: own table (unless the caller just looked there), the
 * hint, then every table. */
static int lookup_everywhere(uintptr_t ptr, ps_allocation_t *out, bool take, bool own_looked_at)
{
    uint64_t h = hash_ptr(ptr);
    table_t *own = tls_table, *hint = tls_hint;
    if (own && !own_looked_at && table_lookup(own, h, ptr, out, take))
        return PS_OK;
    if (hint && hint != own && table_lookup(hint, h, ptr, out, take))
        return PS_OK;
    for (table_t *t = first_table(); t; t = t->next) {
        if (t == own || t == hint)
            continue;
        if (table_lookup(t, h, ptr, out, take)) {
            tls_hint = t;
            return PS_OK;
        }
    }
    return PS_EINVAL;
}

/* ---- the hot path ------------------------------------------------------------ */

/* Insert and remove are on every allocation and free. Each tries the
 * usual case first: the thread's own table, its lock free at the first
 * try, no growth, no entry to shift back. That path calls nothing, so it
 * keeps no registers to save; anything else goes to the _slow twin.
 * (Out of line but not PS_COLD: a held lock is common enough under many
 * threads to be compiled for speed.) */
static __attribute__((noinline)) int insert_slow(const ps_allocation_t *a)
{
    table_t *t = own_table();
    if (!t)
        return PS_ENOMEM;
    table_lock(t);
    if (t->count >= t->grow_at && table_grow(t) != PS_OK) {
        table_unlock(t);
        return PS_ENOMEM;
    }
    table_put(t, hash_ptr(a->ptr), a);
    table_unlock(t);
    return PS_OK;
}

int ps_registry_insert(const ps_allocation_t *a)
{
    table_t *t = tls_table;
    if (PS_UNLIKELY(!t || !table_try_lock(t)))
        return insert_slow(a);
    if (PS_UNLIKELY(t->count >= t->grow_at)) {
        table_unlock(t);
        return insert_slow(a);
    }
    table_put(t, hash_ptr(a->ptr), a);
    table_unlock(t);
    return PS_OK;
}

static __attribute__((noinline)) int remove_slow(uintptr_t ptr, ps_allocation_t *out, bool own_looked_at)
{
    return lookup_everywhere(ptr, out, true, own_looked_at);
}

int ps_registry_remove(uintptr_t ptr, ps_allocation_t *out)
{
    if (!ptr)
        return PS_EINVAL;
    table_t *t = tls_table;
    if (PS_UNLIKELY(!t || !table_try_lock(t)))
        return remove_slow(ptr, out, false);
    size_t i = table_find(t, hash_ptr(ptr), ptr);
    if (PS_UNLIKELY(i == SIZE_MAX)) {
        table_unlock(t);
        return remove_slow(ptr, out, true); /* another thread's pointer (or a bad one) */
    }
    if (PS_UNLIKELY(t->slots[(i + 1) & t->mask].ptr)) {
        table_unlock(t); /* entries to shift back: the slow twin does it whole */
        return remove_slow(ptr, out, false);
    }
    if (out)
        *out = t->slots[i];
    t->slots[i].ptr = 0;
    t->count--;
    table_unlock(t);
    return PS_OK;
}

int ps_registry_find(uintptr_t ptr, ps_allocation_t *out)
{
    return lookup_everywhere(ptr, out, false, false);
}

/* ---- sweeps (rare: resets, interior pointers, counts, fork) --------------------- */

void ps_registry_drop_device(int device, uint64_t *count, uint64_t *bytes)
{
    for (table_t *t = first_table(); t; t = t->next) {
        table_lock(t);
        /* an entry shifted into slot i is looked at again; one shifted in
         * from a wrapped-around slot was already looked at and kept */
        for (size_t i = 0; t->slots && i <= t->mask;) {
            if (t->slots[i].ptr && t->slots[i].device == device) {
                *count += 1;
                *bytes += t->slots[i].size;
                table_remove_slot(t, i);
            } else {
                i++;
            }
        }
        table_unlock(t);
    }
}

int ps_registry_find_containing(uintptr_t addr, ps_allocation_t *out)
{
    int found = PS_EINVAL;
    for (table_t *t = first_table(); t && found != PS_OK; t = t->next) {
        table_lock(t);
        for (size_t i = 0; t->slots && i <= t->mask; i++) {
            const ps_allocation_t *a = &t->slots[i];
            size_t extent = a->size ? a->size : 1;
            if (a->ptr && addr >= a->ptr && addr - a->ptr < extent) {
                *out = *a;
                found = PS_OK;
                break;
            }
        }
        table_unlock(t);
    }
    return found;
}

size_t ps_registry_count(void)
{
    size_t n = 0;
    for (table_t *t = first_table(); t; t = t->next) {
        table_lock(t);
        n += t->count;
        table_unlock(t);
    }
    return n;
}

void ps_slab_add(uintptr_t base, size_t size, int device)
{
    pthread_mutex_lock(&slab_lock);
    if (slab_count == slab_capacity) {
        size_t cap = slab_capacity ? slab_capacity * 2 : 64;
        slab_t *grown = realloc(slabs, cap * sizeof *grown);
        if (!grown) {
            pthread_mutex_unlock(&slab_lock);
            ps_warning("out of host memory recording a slab: bad-pointer checks weakened");
            return;
        }
        slabs = grown;
        slab_capacity = cap;
    }
    size_t i = slab_count;
    while (i > 0 && slabs[i - 1].base > base) {
        slabs[i] = slabs[i - 1];
        i--;
    }
    slabs[i] = (slab_t){base, size, device, false};
    slab_count++;
    pthread_mutex_unlock(&slab_lock);
}

void ps_slab_remove(uintptr_t base)
{
    pthread_mutex_lock(&slab_lock);
    for (size_t i = 0; i < slab_count; i++) {
        if (slabs[i].base == base) {
            memmove(&slabs[i], &slabs[i + 1], (slab_count - i - 1) * sizeof *slabs);
            slab_count--;
            break;
        }
    }
    pthread_mutex_unlock(&slab_lock);
}

void ps_slab_drop_device(int device)
{
    pthread_mutex_lock(&slab_lock);
    size_t kept = 0;
    for (size_t i = 0; i < slab_count; i++)
        if (slabs[i].device != device)
            slabs[kept++] = slabs[i];
    slab_count = kept;
    pthread_mutex_unlock(&slab_lock);
}

/* The slab holding addr, or NULL. slab_lock held. */
static slab_t *slab_holding_locked(uintptr_t addr)
{
    size_t lo = 0, hi = slab_count; /* first slab with base > addr */
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (slabs[mid].base <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo > 0 && addr - slabs[lo - 1].base < slabs[lo - 1].size ? &slabs[lo - 1] : NULL;
}

bool ps_slab_contains(uintptr_t addr)
{
    pthread_mutex_lock(&slab_lock);
    bool inside = slab_holding_locked(addr) != NULL;
    pthread_mutex_unlock(&slab_lock);
    return inside;
}

static _Atomic uint64_t mapped_devices; /* bit D: a slab of device D holds mapped memory */

uint64_t ps_slab_mapped_devices(void) { return atomic_load_explicit(&mapped_devices, memory_order_relaxed); }

void ps_slab_mark_mapped(uintptr_t addr)
{
    pthread_mutex_lock(&slab_lock);
    slab_t *s = slab_holding_locked(addr);
    if (s && !s->mapped) {
        s->mapped = true;
        if (s->device >= 0 && s->device < 64)
            atomic_fetch_or(&mapped_devices, 1ull << s->device);
    }
    pthread_mutex_unlock(&slab_lock);
}

int ps_slab_mapped_device(uintptr_t addr)
{
    pthread_mutex_lock(&slab_lock);
    slab_t *s = slab_holding_locked(addr);
    int device = s && s->mapped ? s->device : -1;
    pthread_mutex_unlock(&slab_lock);
    return device;
}

/* fork(): no table is created and none changes while the child is made;
 * the child keeps the forking thread's table, and the others (their
 * threads do not exist there) can be adopted. */
void ps_registry_atfork_prepare(void)
{
    pthread_mutex_lock(&adopt_lock);
    pthread_mutex_lock(&slab_lock);
    for (table_t *t = first_table(); t; t = t->next)
        table_lock(t);
}

void ps_registry_atfork_parent(void)
{
    for (table_t *t = first_table(); t; t = t->next)
        table_unlock(t);
    pthread_mutex_unlock(&slab_lock);
    pthread_mutex_unlock(&adopt_lock);
}

void ps_registry_atfork_child(void)
{
    for (table_t *t = first_table(); t; t = t->next) {
        t->lock = (ps_spin_t)PS_SPIN_INIT;
        if (t != tls_table)
            atomic_store(&t->owned, 0);
    }
    pthread_mutex_init(&slab_lock, NULL);
    pthread_mutex_init(&adopt_lock, NULL);
}
