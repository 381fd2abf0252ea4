/* A small hash map from a pointer-sized key to a 64-bit value, used where
 * core/ must find something by address: the pool's in-use blocks, the
 * upstreams' live pointers, the fake device's allocations, stream tables.
 *
 * Algorithm:
 *  1. Open addressing with linear probing in a power-of-two table of
 *     (key, value) pairs; a key hashes by Fibonacci multiplication, so
 *     256-byte-aligned addresses still spread over the table.
 *  2. The table stays at most half full: ps_ptr_map_reserve grows it
 *     (doubling, rehashing) *before* an insert, so an insert never fails
 *     and a failed grow leaves the map unchanged (PS_ENOMEM).
 *  3. Removal shifts the following entries of the probe run back
 *     (no tombstones), so look-ups stay short after many removals.
 *  PS_PTR_MAP_EMPTY (UINTPTR_MAX, which is also PS_STREAM_NONE) marks an
 *  empty slot and can never be a key.
 * Not thread-safe: the owner holds its own lock.
 */
#ifndef PS_PTR_MAP_H
#define PS_PTR_MAP_H

#include "common.h"

#include <stdlib.h>

#define PS_PTR_MAP_EMPTY UINTPTR_MAX

typedef struct ps_ptr_map_slot {
    uintptr_t key;  /* the pointer/handle, or PS_PTR_MAP_EMPTY */
    uint64_t value; /* what the owner stores for it */
} ps_ptr_map_slot_t;

typedef struct ps_ptr_map {
    ps_ptr_map_slot_t *slots; /* capacity slots */
    size_t capacity;          /* a power of two */
    size_t count;             /* slots in use */
    unsigned shift;           /* 64 - log2(capacity): the hash keeps the top bits */
} ps_ptr_map_t;

static inline size_t ps_ptr_map_home(const ps_ptr_map_t *map, uintptr_t key)
{
    return (size_t)(((uint64_t)key * 0x9E3779B97F4A7C15ull) >> map->shift);
}

/* Allocates a table of `capacity` slots (rounded up to a power of two, >= 16). */
static inline int ps_ptr_map_init(ps_ptr_map_t *map, size_t capacity)
{
    size_t cap = 16;
    unsigned log2cap = 4;
    while (cap < capacity) {
        cap <<= 1;
        log2cap++;
    }
    ps_ptr_map_slot_t *slots = malloc(cap * sizeof *slots);
    if (!slots)
        return PS_ENOMEM;
    for (size_t i = 0; i < cap; i++)
        slots[i].key = PS_PTR_MAP_EMPTY;
    map->slots = slots;
    map->capacity = cap;
    map->count = 0;
    map->shift = 64 - log2cap;
    return PS_OK;
}

static inline void ps_ptr_map_free(ps_ptr_map_t *map)
{
    free(map->slots);
    map->slots = NULL;
    map->capacity = map->count = 0;
}

/* Inserts or overwrites; the caller has made room with ps_ptr_map_reserve. */
static inline void ps_ptr_map_put(ps_ptr_map_t *map, uintptr_t key, uint64_t value)
{
    size_t mask = map->capacity - 1;
    size_t i = ps_ptr_map_home(map, key);
    while (map->slots[i].key != PS_PTR_MAP_EMPTY && map->slots[i].key != key)
        i = (i + 1) & mask;
    if (map->slots[i].key == PS_PTR_MAP_EMPTY)
        map->count++;
    map->slots[i].key = key;
    map->slots[i].value = value;
}

/* Makes room for `extra` more keys (the table stays at most half full).
 * Returns PS_ENOMEM, with the map unchanged, if the bigger table cannot
 * be allocated. */
static inline int ps_ptr_map_reserve(ps_ptr_map_t *map, size_t extra)
{
    if ((map->count + extra) * 2 <= map->capacity)
        return PS_OK;
    ps_ptr_map_t bigger;
    size_t want = map->capacity * 2;
    while ((map->count + extra) * 2 > want)
        want *= 2;
    if (ps_ptr_map_init(&bigger, want) != PS_OK)
        return PS_ENOMEM;
    for (size_t i = 0; i < map->capacity; i++)
        if (map->slots[i].key != PS_PTR_MAP_EMPTY)
            ps_ptr_map_put(&bigger, map->slots[i].key, map->slots[i].value);
    free(map->slots);
    *map = bigger;
    return PS_OK;
}

/* True, with *value set, when `key` is present. */
static inline bool ps_ptr_map_get(const ps_ptr_map_t *map, uintptr_t key, uint64_t *value)
{
    size_t mask = map->capacity - 1;
    for (size_t i = ps_ptr_map_home(map, key);; i = (i + 1) & mask) {
        if (map->slots[i].key == key) {
            *value = map->slots[i].value;
            return 1;
        }
        if (map->slots[i].key == PS_PTR_MAP_EMPTY)
            return 0;
    }
}

/* Removes `key`; true, with *value set (if non-NULL), when it was there. */
static inline bool ps_ptr_map_remove(ps_ptr_map_t *map, uintptr_t key, uint64_t *value)
{
    size_t mask = map->capacity - 1;
    size_t hole = ps_ptr_map_home(map, key);
    while (map->slots[hole].key != key) {
        if (map->slots[hole].key == PS_PTR_MAP_EMPTY)
            return 0;
        hole = (hole + 1) & mask;
    }
    if (value)
        *value = map->slots[hole].value;
    /* backward shift: move later entries of the run into the hole when
     * their home position is not cyclically inside (hole, next] */
    for (size_t next = (hole + 1) & mask; map->slots[next].key != PS_PTR_MAP_EMPTY;
         next = (next + 1) & mask) {
        size_t home = ps_ptr_map_home(map, map->slots[next].key);
        int stays = hole <= next ? (home > hole && home <= next) : (home > hole || home <= next);
        if (!stays) {
            map->slots[hole] = map->slots[next];
            hole = next;
        }
    }
    map->slots[hole].key = PS_PTR_MAP_EMPTY;
    map->count--;
    return 1;
}

#endif
