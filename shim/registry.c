/* The pointer registry: device pointer -> who owns it (device, size,
 * stream, door). Every free asks it first, so it is on the hot path.
 *
 * 1. 256 shards, chosen by a multiplicative hash of the pointer; each shard
 *    is an open-addressing table (linear probing, backward-shift deletion,
 *    no tombstones) behind its own spinlock. Threads freeing different
 *    pointers rarely meet on one shard: no global lock. A shard's header
 *    (lock, table pointer) is one cache line and its table whole lines of
 *    two 32-byte slots, so shards share no line, and an insert or remove
 *    touches the header's line and the slot's (a remove also reads the
 *    next slot, in the same line half the time).
 * 2. A shard grows (doubles) at 70% load, under its lock; the old array is
 *    freed at once (readers also take the lock, so nobody still reads it).
 * 3. Insert and remove, on every allocation and free, first try the usual
 *    case without a call (lock free at the first try, room, nothing to
 *    shift back); anything else is done whole by a slow twin.
 * 4. Slabs (the big pieces the shim took from CUDA) are kept apart in a
 *    small sorted array behind a mutex: it answers "is this address inside
 *    our memory?" on the rare path of a pointer that is not registered
 *    (bad pointer vs foreign pointer), never on the hot path.
 * 5. When a device's context dies, its entries and slabs are dropped by a
 *    sweep of every shard under its lock (rare: resets), no CUDA call.
 * Lookups are O(1) expected; remove is atomic, so of two threads freeing
 * one pointer exactly one succeeds.
 */
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"

#define SHARD_BITS 8 /* 256 shards: at 16 threads, 64 shards collided enough to cost ~15% (H200, arena stack) */
#define SHARD_COUNT (1u << SHARD_BITS)
#define INITIAL_SLOTS 16 /* small: 64 shards of it stay in L1, the common live set is small */

typedef struct shard {
    atomic_int lock;          /* 0 free, 1 held (spinlock) */
    size_t mask;              /* slots - 1 (slots is a power of two), 0 before first insert */
    size_t count;             /* live entries */
    size_t grow_at;           /* count at which the table doubles (70% load; 0 before first insert) */
    ps_allocation_t *slots;   /* the table; ptr == 0 marks an empty slot */
} __attribute__((aligned(64))) shard_t;

static shard_t shards[SHARD_COUNT];
_Static_assert(64 % sizeof(ps_allocation_t) == 0, "a slot never straddles two cache lines");

typedef struct slab {
    uintptr_t base; /* first byte */
    size_t size;    /* bytes */
    int device;     /* whose stack took it */
} slab_t;
static pthread_mutex_t slab_lock = PTHREAD_MUTEX_INITIALIZER;
static slab_t *slabs;        /* sorted by base */
static size_t slab_count;    /* entries used */
static size_t slab_capacity; /* entries allocated */

static inline uint64_t hash_ptr(uintptr_t p)
{
    return (uint64_t)(p >> 8) * 0x9E3779B97F4A7C15ull;
}

static inline bool shard_try_lock(shard_t *s)
{
    return !atomic_exchange_explicit(&s->lock, 1, memory_order_acquire);
}

/* Spins, then yields, until the lock is ours. */
static void shard_lock(shard_t *s)
{
    while (!shard_try_lock(s))
        for (int spins = 0; atomic_load_explicit(&s->lock, memory_order_relaxed); spins++)
            if (spins > 64)
                sched_yield();
}
static inline void shard_unlock(shard_t *s) { atomic_store_explicit(&s->lock, 0, memory_order_release); }

static inline shard_t *shard_of(uint64_t h) { return &shards[h >> (64 - SHARD_BITS)]; }
static inline size_t slot_of(uint64_t h, size_t mask) { return (size_t)(h >> 16) & mask; }

void ps_registry_init(void) {}

/* Requires the shard lock. Doubles the table (or makes the first one). */
static int shard_grow(shard_t *s)
{
    size_t slots = s->mask ? (s->mask + 1) * 2 : INITIAL_SLOTS;
    /* whole cache lines: two shards' tables never share one (threads on
     * different shards would slow each other down through it) */
    ps_allocation_t *fresh = aligned_alloc(64, slots * sizeof *fresh);
    if (!fresh)
        return PS_ENOMEM;
    memset(fresh, 0, slots * sizeof *fresh);
    size_t mask = slots - 1;
    if (s->slots) {
        for (size_t i = 0; i <= s->mask; i++) {
            if (!s->slots[i].ptr)
                continue;
            size_t j = slot_of(hash_ptr(s->slots[i].ptr), mask);
            while (fresh[j].ptr)
                j = (j + 1) & mask;
            fresh[j] = s->slots[i];
        }
        free(s->slots);
    }
    s->slots = fresh;
    s->mask = mask;
    s->grow_at = slots * 7 / 10;
    return PS_OK;
}

/* Requires the shard lock and room (count < grow_at). */
static inline void shard_put(shard_t *s, uint64_t h, const ps_allocation_t *a)
{
    size_t i = slot_of(h, s->mask);
    while (s->slots[i].ptr && s->slots[i].ptr != a->ptr)
        i = (i + 1) & s->mask;
    if (!s->slots[i].ptr)
        s->count++;
    s->slots[i] = *a;
}

/* Requires the shard lock. Returns the slot index of ptr or SIZE_MAX. */
static inline size_t shard_find(shard_t *s, uint64_t h, uintptr_t ptr)
{
    if (!s->slots)
        return SIZE_MAX;
    for (size_t i = slot_of(h, s->mask);; i = (i + 1) & s->mask) {
        if (s->slots[i].ptr == ptr)
            return i;
        if (!s->slots[i].ptr)
            return SIZE_MAX;
    }
}

/* Requires the shard lock. Empties slot i, which has a successor in its
 * probe chain: backward-shift deletion keeps every chain unbroken (an
 * entry after i may move into slot i). */
static void shard_shift_out(shard_t *s, size_t i)
{
    size_t hole = i;
    for (size_t j = (i + 1) & s->mask; s->slots[j].ptr; j = (j + 1) & s->mask) {
        size_t home = slot_of(hash_ptr(s->slots[j].ptr), s->mask);
        /* move j into the hole unless its home lies cyclically in (hole, j] */
        int stays = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
        if (!stays) {
            s->slots[hole] = s->slots[j];
            hole = j;
        }
    }
    s->slots[hole].ptr = 0;
    s->count--;
}

/* Requires the shard lock. Empties slot i. */
static inline void shard_remove_slot(shard_t *s, size_t i)
{
    if (s->slots[(i + 1) & s->mask].ptr) {
        shard_shift_out(s, i);
        return;
    }
    s->slots[i].ptr = 0; /* the usual end of a short chain: nothing moves */
    s->count--;
}

/* Requires the shard lock. Removes ptr, copying its record to *out. */
static inline int shard_take(shard_t *s, uint64_t h, uintptr_t ptr, ps_allocation_t *out)
{
    size_t i = shard_find(s, h, ptr);
    if (i == SIZE_MAX)
        return PS_EINVAL;
    if (out)
        *out = s->slots[i];
    shard_remove_slot(s, i);
    return PS_OK;
}

/* Insert and remove are on every allocation and free. Each tries the
 * common case first: the lock free at the first try, no growth, no entry
 * to shift back. That path calls nothing, so it keeps no registers to
 * save; a held lock or a full table goes to the _slow twin, which does the
 * same thing with waiting, growth and shifting. (Out of line but not
 * PS_COLD: a held lock is common enough under many threads to be compiled
 * for speed.) */
static __attribute__((noinline)) int insert_slow(const ps_allocation_t *a)
{
    uint64_t h = hash_ptr(a->ptr);
    shard_t *s = shard_of(h);
    shard_lock(s);
    if (s->count >= s->grow_at && shard_grow(s) != PS_OK) {
        shard_unlock(s);
        return PS_ENOMEM;
    }
    shard_put(s, h, a);
    shard_unlock(s);
    return PS_OK;
}

int ps_registry_insert(const ps_allocation_t *a)
{
    uint64_t h = hash_ptr(a->ptr);
    shard_t *s = shard_of(h);
    if (PS_UNLIKELY(!shard_try_lock(s)))
        return insert_slow(a);
    if (PS_UNLIKELY(s->count >= s->grow_at)) {
        shard_unlock(s);
        return insert_slow(a);
    }
    shard_put(s, h, a);
    shard_unlock(s);
    return PS_OK;
}

static __attribute__((noinline)) int remove_slow(uintptr_t ptr, ps_allocation_t *out)
{
    uint64_t h = hash_ptr(ptr);
    shard_t *s = shard_of(h);
    shard_lock(s);
    int rc = shard_take(s, h, ptr, out);
    shard_unlock(s);
    return rc;
}

int ps_registry_remove(uintptr_t ptr, ps_allocation_t *out)
{
    if (!ptr)
        return PS_EINVAL;
    uint64_t h = hash_ptr(ptr);
    shard_t *s = shard_of(h);
    if (PS_UNLIKELY(!shard_try_lock(s)))
        return remove_slow(ptr, out);
    size_t i = shard_find(s, h, ptr);
    if (PS_UNLIKELY(i == SIZE_MAX)) {
        shard_unlock(s);
        return PS_EINVAL; /* a foreign or bad pointer */
    }
    if (PS_UNLIKELY(s->slots[(i + 1) & s->mask].ptr)) {
        shard_unlock(s); /* others to shift back: the slow twin does it whole */
        return remove_slow(ptr, out);
    }
    if (out)
        *out = s->slots[i];
    s->slots[i].ptr = 0;
    s->count--;
    shard_unlock(s);
    return PS_OK;
}

void ps_registry_drop_device(int device, uint64_t *count, uint64_t *bytes)
{
    for (unsigned k = 0; k < SHARD_COUNT; k++) {
        shard_t *s = &shards[k];
        shard_lock(s);
        /* an entry shifted into slot i is looked at again; one shifted in
         * from a wrapped-around slot was already looked at and kept */
        for (size_t i = 0; s->slots && i <= s->mask;) {
            if (s->slots[i].ptr && s->slots[i].device == device) {
                *count += 1;
                *bytes += s->slots[i].size;
                shard_remove_slot(s, i);
            } else {
                i++;
            }
        }
        shard_unlock(s);
    }
}

int ps_registry_find(uintptr_t ptr, ps_allocation_t *out)
{
    uint64_t h = hash_ptr(ptr);
    shard_t *s = shard_of(h);
    shard_lock(s);
    size_t i = shard_find(s, h, ptr);
    if (i != SIZE_MAX && out)
        *out = s->slots[i];
    shard_unlock(s);
    return i == SIZE_MAX ? PS_EINVAL : PS_OK;
}

int ps_registry_find_containing(uintptr_t addr, ps_allocation_t *out)
{
    int found = PS_EINVAL;
    for (unsigned k = 0; k < SHARD_COUNT && found != PS_OK; k++) {
        shard_t *s = &shards[k];
        shard_lock(s);
        for (size_t i = 0; s->slots && i <= s->mask; i++) {
            const ps_allocation_t *a = &s->slots[i];
            size_t extent = a->size ? a->size : 1;
            if (a->ptr && addr >= a->ptr && addr - a->ptr < extent) {
                *out = *a;
                found = PS_OK;
                break;
            }
        }
        shard_unlock(s);
    }
    return found;
}

size_t ps_registry_count(void)
{
    size_t n = 0;
    for (unsigned k = 0; k < SHARD_COUNT; k++) {
        shard_lock(&shards[k]);
        n += shards[k].count;
        shard_unlock(&shards[k]);
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
    slabs[i] = (slab_t){base, size, device};
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

bool ps_slab_contains(uintptr_t addr)
{
    pthread_mutex_lock(&slab_lock);
    size_t lo = 0, hi = slab_count; /* first slab with base > addr */
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (slabs[mid].base <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    bool inside = lo > 0 && addr - slabs[lo - 1].base < slabs[lo - 1].size;
    pthread_mutex_unlock(&slab_lock);
    return inside;
}

void ps_registry_atfork_prepare(void)
{
    pthread_mutex_lock(&slab_lock);
    for (unsigned k = 0; k < SHARD_COUNT; k++)
        shard_lock(&shards[k]);
}

void ps_registry_atfork_parent(void)
{
    for (unsigned k = 0; k < SHARD_COUNT; k++)
        shard_unlock(&shards[k]);
    pthread_mutex_unlock(&slab_lock);
}

void ps_registry_atfork_child(void)
{
    for (unsigned k = 0; k < SHARD_COUNT; k++)
        atomic_store(&shards[k].lock, 0);
    pthread_mutex_init(&slab_lock, NULL);
}
