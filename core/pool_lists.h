/* The pool's bottom layer: block descriptors, the chunks they tile, and
 * the TLSF free lists of each owner (core/pool_lists.c). It calls nothing
 * of the pool above it; every other pool layer uses it. Every function
 * expects the pool's lock held. What every allocation and free runs is
 * inline here.
 *
 * Words: a *block* is a host-side descriptor (address, size, physical
 * neighbours, list links, state, owner, chunk) in one array addressed by
 * 32-bit index; a *chunk* is memory the pool holds in one piece (from the
 * upstream, or an expandable range), tiled exactly by its blocks; an
 * *owner* is one set of TLSF lists: owner 0 (OWNER_READY) is the ready
 * list, the stream layer (core/pool_streams.h) adds one per stream. */
#ifndef POOLSHIM_POOL_LISTS_H
#define POOLSHIM_POOL_LISTS_H

#include "common.h"
#include "ptr_map.h"
#include "reuse.h" /* PS_REUSE_IDLE_NOW, PS_REUSE_IDLE_NEVER */
#include "vm_range.h"

#include <stdbool.h>
#include <stdint.h>

#define SL_LOG2 5                      /* second level: 2^5 classes per power of two */
#define SL_COUNT (1u << SL_LOG2)
#define FL_COUNT 64                    /* first level: one per bit of a size */
#define NIL UINT32_MAX                 /* "no block" */
#define OWNER_READY 0                  /* the ready list's owner index */
#define MAX_OWNERS 65535               /* owner indices fit 16 bits */
#define IDLE_NOW PS_REUSE_IDLE_NOW     /* idle_gen: nothing issued before can still touch it */
#define IDLE_NEVER PS_REUSE_IDLE_NEVER /* idle_gen: unknown, only a device synchronize makes it idle */

typedef enum block_state {
    BLOCK_UNUSED = 0, /* descriptor on the recycle list */
    BLOCK_FREE,       /* in its owner's TLSF lists */
    BLOCK_USED,       /* handed out, in the in-use map */
    BLOCK_PENDING,    /* freed by cudaFree, waiting in an epoch (core/pool_streams.h) */
    BLOCK_CACHED,     /* free, parked in the quick cache or the size stack (core/pool_caches.h) */
    BLOCK_UNMAPPED,   /* part of an expandable range with no memory behind it (core/pool_expandable.h) */
    BLOCK_LENT        /* expandable: still mapped, its memory lent to a growth elsewhere (remap_lend);
                         unmapped once barrier idle_gen passed */
} block_state_t;

typedef struct pool_block {
    uintptr_t addr;      /* device address */
    size_t size;         /* bytes, a multiple of the alignment */
    uint64_t free_stamp; /* free counter when it joined a stream list (0 in the ready list) */
    uint64_t idle_gen;   /* free: once barrier number idle_gen has passed, no GPU work can touch it
                            (IDLE_NOW: idle now; IDLE_NEVER: unknown) */
    uint32_t prev_phys;  /* block just below in the chunk, or NIL */
    uint32_t next_phys;  /* block just above in the chunk, or NIL */
    uint32_t prev_free;  /* list links of whichever list holds it (next_free also links the recycle list) */
    uint32_t next_free;
    uint32_t chunk;      /* index of its chunk */
    uint16_t owner;      /* owner whose lists hold it (when free) */
    uint8_t state;       /* block_state_t */
} pool_block_t;

typedef struct pool_chunk {
    void *base;           /* pointer from the upstream (NULL: slot unused) */
    size_t base_size;     /* bytes asked from the upstream */
    uintptr_t addr;       /* first usable (aligned) address */
    size_t size;          /* usable bytes (expandable: the whole range, mapped or not) */
    uint32_t first_block; /* block at addr */
    ps_vm_range_t *range; /* expandable: the range behind the chunk; NULL: an upstream chunk */
} pool_chunk_t;

/* One owner's TLSF lists. */
typedef struct pool_owner {
    uint64_t fl_bitmap;                 /* bit f: some list of first level f is non-empty */
    uint32_t sl_bitmap[FL_COUNT];       /* bit s of [f]: list (f, s) is non-empty */
    uint32_t heads[FL_COUNT][SL_COUNT]; /* list heads */
    uint64_t free_bytes;                /* bytes in these lists */
    uint64_t free_blocks;               /* blocks in these lists */
} pool_owner_t;

typedef struct pool_lists {
    pool_block_t *blocks;     /* descriptor array */
    uint32_t blocks_capacity; /* its length */
    uint32_t blocks_used;     /* descriptors ever handed out (high-water mark) */
    uint32_t recycled_head;   /* recycled descriptors, linked by next_free */
    uint32_t recycled_count;  /* how many */

    pool_chunk_t *chunks;     /* chunk table (slots with base NULL are unused) */
    uint32_t chunks_capacity; /* its length */
    uint32_t chunks_count;    /* slots ever used (high-water mark) */

    pool_owner_t **owners;    /* owners[0] = the ready list, then one per stream */
    uint32_t owners_count;    /* owners made */
    uint32_t owners_capacity; /* length of owners[] */

    ps_ptr_map_t in_use;      /* address -> descriptor index of every used block */
    size_t alignment;         /* every address and size is a multiple of it */
    size_t small_from_back;   /* requests of at most this many bytes are cut off a block's back */

    uint64_t bytes_in_use;    /* sum of used block sizes */
    uint64_t bytes_free;      /* sum of free block sizes, parked ones included (all owners) */
    uint64_t bytes_reserved;  /* bytes with memory behind them: in use + free + pending */
    uint64_t peak_bytes_reserved; /* maximum of bytes_reserved */
    uint64_t upstream_allocs; /* chunks taken and pieces mapped */
    uint64_t upstream_frees;  /* chunks given back and pieces unmapped */
    uint64_t blocks_taken;    /* blocks handed out so far (the decay's count of allocations) */
} pool_lists_t;

/* ---- pool_lists.c ------------------------------------------------------ */

/* Empty lists with the ready list (owner 0) and room for the in-use map;
 * PS_ENOMEM when the host has no memory (pool_lists_destroy still frees
 * what was made). */
int pool_lists_init(pool_lists_t *lists, size_t alignment, size_t small_from_back);
void pool_lists_destroy(pool_lists_t *lists);
/* Makes sure `count` descriptors can be taken without allocating. */
int pool_lists_reserve_descriptors(pool_lists_t *lists, uint32_t count);
/* A free slot of the chunk table (grown when full), in *slot. */
int pool_lists_chunk_slot(pool_lists_t *lists, uint32_t *slot);
/* Puts `chunk` in table slot `slot` with one block over [addr, addr + size)
 * (fresh: idle now, in no list yet); returns that block. Needs one
 * reserved descriptor. */
uint32_t pool_lists_add_chunk(pool_lists_t *lists, uint32_t slot, const pool_chunk_t *chunk);
/* Empties slot `slot` of a chunk that is one ready free block (its
 * memory went back): the block leaves the lists. */
void pool_lists_drop_chunk(pool_lists_t *lists, uint32_t slot);
/* The chunk table's count drops past unused slots at its end. */
void pool_lists_trim_chunks(pool_lists_t *lists);
/* A new empty owner, its index in *out. */
int pool_lists_add_owner(pool_lists_t *lists, uint32_t *out);
/* Puts block `index` (in no list) into `owner_index`'s lists with stamp
 * `stamp` and idle generation `idle`, merged with free physical neighbours
 * of the same owner (a neighbour absorbs it in place, keeping the newest
 * stamp and the highest idle generation); returns the block that holds it. */
uint32_t pool_lists_release(pool_lists_t *lists, uint32_t index, uint32_t owner_index, uint64_t stamp,
                            uint64_t idle);
/* Cuts block `index` (in no list) at `at` (inside it): `index` keeps the
 * front, the returned new block the back (same state, chunk, owner and
 * idle generation). Needs one reserved descriptor. */
uint32_t pool_lists_split(pool_lists_t *lists, uint32_t index, uintptr_t at);
/* The bytes of the run of ready or parked blocks that `index` belongs to. */
uint64_t pool_lists_ready_run(const pool_lists_t *lists, uint32_t index);
/* The largest listed free block of any owner. */
uint64_t pool_lists_largest_listed(const pool_lists_t *lists);

/* ---- inline: what every allocation and free runs ----------------------- */

/* TLSF classes of a key: first level floor(log2), second the next SL_LOG2 bits. */
static inline void key_class(size_t key, unsigned *fl, unsigned *sl)
{
    unsigned f = 63u - (unsigned)__builtin_clzll(key); /* key >= 255 */
    *fl = f;
    *sl = (unsigned)(key >> (f - SL_LOG2)) & (SL_COUNT - 1);
}

/* A free block is listed by the class of size - 1, so a class holds sizes
 * (lo, hi]: a whole power-of-two chunk and that chunk less a small block
 * share a class, and the hot split/merge cycle leaves the lists alone. */
static inline void size_class(size_t size, unsigned *fl, unsigned *sl)
{
    key_class(size - 1, fl, sl);
}

/* A block that joins a run when parked blocks are merged. */
static inline bool ready_or_parked(const pool_block_t *b)
{
    return b->state == BLOCK_CACHED || (b->state == BLOCK_FREE && b->owner == OWNER_READY);
}

/* Lists free block `index` in owner `owner_index`'s TLSF lists (state FREE). */
static inline void pool_lists_insert(pool_lists_t *lists, uint32_t owner_index, uint32_t index)
{
    pool_owner_t *owner = lists->owners[owner_index];
    pool_block_t *b = &lists->blocks[index];
    unsigned fl, sl;
    size_class(b->size, &fl, &sl);
    uint32_t head = owner->heads[fl][sl];
    b->state = BLOCK_FREE;
    b->owner = (uint16_t)owner_index;
    b->prev_free = NIL;
    b->next_free = head;
    if (head != NIL)
        lists->blocks[head].prev_free = index;
    owner->heads[fl][sl] = index;
    owner->sl_bitmap[fl] |= 1u << sl;
    owner->fl_bitmap |= 1ull << fl;
    owner->free_bytes += b->size;
    owner->free_blocks++;
    lists->bytes_free += b->size;
}

/* Unlists free block `index` from its owner's lists. */
static inline void pool_lists_remove(pool_lists_t *lists, uint32_t index)
{
    pool_block_t *b = &lists->blocks[index];
    pool_owner_t *owner = lists->owners[b->owner];
    if (b->prev_free != NIL)
        lists->blocks[b->prev_free].next_free = b->next_free;
    else {
        unsigned fl, sl;
        size_class(b->size, &fl, &sl);
        owner->heads[fl][sl] = b->next_free;
        if (b->next_free == NIL) {
            owner->sl_bitmap[fl] &= ~(1u << sl);
            if (!owner->sl_bitmap[fl])
                owner->fl_bitmap &= ~(1ull << fl);
        }
    }
    if (b->next_free != NIL)
        lists->blocks[b->next_free].prev_free = b->prev_free;
    owner->free_bytes -= b->size;
    owner->free_blocks--;
    lists->bytes_free -= b->size;
}

/* A descriptor from the recycle list, or the next never used one (reserved beforehand). */
static inline uint32_t pool_lists_take_descriptor(pool_lists_t *lists)
{
    uint32_t index = lists->recycled_head;
    if (index != NIL) {
        lists->recycled_head = lists->blocks[index].next_free;
        lists->recycled_count--;
    } else {
        index = lists->blocks_used++;
    }
    return index;
}

/* Descriptor `index` goes back to the recycle list. */
static inline void pool_lists_recycle_descriptor(pool_lists_t *lists, uint32_t index)
{
    lists->blocks[index].state = BLOCK_UNUSED;
    lists->blocks[index].next_free = lists->recycled_head;
    lists->recycled_head = index;
    lists->recycled_count++;
}

/* Good fit: a free block of `owner` with size >= `size`, or NIL. */
static inline uint32_t pool_lists_find(const pool_lists_t *lists, const pool_owner_t *owner, size_t size)
{
    unsigned fl, sl;
    size_t key = size - 1;
    key_class(key, &fl, &sl);
    uint32_t head = owner->heads[fl][sl];
    if (head != NIL && lists->blocks[head].size >= size)
        return head;
    /* the first class whose every block is >= size: keys from `rounded` up */
    size_t rounded = key + ((size_t)1 << (fl - SL_LOG2)) - 1;
    if (rounded < key)
        return NIL;
    key_class(rounded, &fl, &sl);
    uint32_t sl_map = owner->sl_bitmap[fl] & (~0u << sl);
    if (!sl_map) {
        uint64_t fl_map = fl + 1 < FL_COUNT ? owner->fl_bitmap & (~0ull << (fl + 1)) : 0;
        if (!fl_map)
            return NIL;
        fl = (unsigned)__builtin_ctzll(fl_map);
        sl_map = owner->sl_bitmap[fl];
    }
    return owner->heads[fl][(unsigned)__builtin_ctz(sl_map)];
}

/* Good fit in the ready list. */
static inline uint32_t pool_lists_find_ready(const pool_lists_t *lists, size_t size)
{
    return pool_lists_find(lists, lists->owners[OWNER_READY], size);
}

/* Moves/resizes free block `index` in place; its lists change only when
 * its size class does (the common case on the hot path: they do not). */
static inline void pool_lists_resize(pool_lists_t *lists, uint32_t index, uintptr_t addr, size_t size)
{
    pool_block_t *b = &lists->blocks[index];
    unsigned old_fl, old_sl, new_fl, new_sl;
    size_class(b->size, &old_fl, &old_sl);
    size_class(size, &new_fl, &new_sl);
    if (old_fl == new_fl && old_sl == new_sl) {
        pool_owner_t *owner = lists->owners[b->owner];
        owner->free_bytes = owner->free_bytes - b->size + size;
        lists->bytes_free = lists->bytes_free - b->size + size;
        b->addr = addr;
        b->size = size;
    } else {
        uint32_t owner_index = b->owner;
        pool_lists_remove(lists, index);
        b->addr = addr;
        b->size = size;
        pool_lists_insert(lists, owner_index, index);
    }
}

/* Used block `index`: counted in use and found by its address. */
static inline void pool_lists_mark_used(pool_lists_t *lists, uint32_t index)
{
    pool_block_t *used = &lists->blocks[index];
    used->state = BLOCK_USED;
    lists->bytes_in_use += used->size;
    lists->blocks_taken++;
    ps_ptr_map_put(&lists->in_use, used->addr, index);
}

/* A new used block of `size` bytes at `addr` cut from free block `index`,
 * placed before (prev_phys) or after it. */
static inline uint32_t pool_lists_cut(pool_lists_t *lists, uint32_t index, uintptr_t addr, size_t size,
                                      bool before)
{
    uint32_t used_index = pool_lists_take_descriptor(lists);
    pool_block_t *f = &lists->blocks[index];
    pool_block_t *used = &lists->blocks[used_index];
    used->addr = addr;
    used->size = size;
    used->free_stamp = 0;
    used->idle_gen = f->idle_gen; /* splitting keeps it (a thread cache's refill gives it back) */
    used->chunk = f->chunk;
    used->owner = f->owner;
    if (before) {
        used->prev_phys = f->prev_phys;
        used->next_phys = index;
        if (f->prev_phys != NIL)
            lists->blocks[f->prev_phys].next_phys = used_index;
        else
            lists->chunks[f->chunk].first_block = used_index;
        f->prev_phys = used_index;
    } else {
        used->prev_phys = index;
        used->next_phys = f->next_phys;
        if (f->next_phys != NIL)
            lists->blocks[f->next_phys].prev_phys = used_index;
        f->next_phys = used_index;
    }
    return used_index;
}

/* Takes free block `index` for a request of `size` bytes and returns the
 * used block's index: the front is cut off as a new used block (the free
 * rest keeps its descriptor and, usually, its list position) unless less
 * than one alignment unit would be left; a request of at most
 * small_from_back bytes is cut off the back instead. The used block is
 * mapped. Needs one reserved descriptor and one reserved in-use map slot. */
static inline uint32_t pool_lists_take(pool_lists_t *lists, uint32_t index, size_t size)
{
    pool_block_t *f = &lists->blocks[index];
    uint32_t used_index = index;
    uintptr_t addr = f->addr;
    size_t rest = f->size - size;
    if (size <= lists->small_from_back && rest >= lists->alignment) {
        used_index = pool_lists_cut(lists, index, addr + rest, size, false);
        pool_lists_resize(lists, index, addr, rest);
    } else if (rest >= lists->alignment) {
        used_index = pool_lists_cut(lists, index, addr, size, true);
        pool_lists_resize(lists, index, addr + size, rest);
    } else {
        pool_lists_remove(lists, index);
    }
    pool_lists_mark_used(lists, used_index);
    return used_index;
}

/* Parked block `index` (free, in no list) taken as used. Needs a reserved
 * in-use map slot. */
static inline void pool_lists_take_parked(pool_lists_t *lists, uint32_t index)
{
    lists->bytes_free -= lists->blocks[index].size;
    pool_lists_mark_used(lists, index);
}

/* Block `index` (in no list) parked: free in every count, held unmerged
 * by the layer that parked it, idle at `idle`. */
static inline void pool_lists_park(pool_lists_t *lists, uint32_t index, uint64_t idle)
{
    pool_block_t *b = &lists->blocks[index];
    b->state = BLOCK_CACHED;
    b->owner = OWNER_READY;
    b->free_stamp = 0;
    b->idle_gen = idle;
    lists->bytes_free += b->size;
}

/* Parked block `index` joins the ready list, merged with its neighbours. */
static inline void pool_lists_unpark(pool_lists_t *lists, uint32_t index)
{
    lists->bytes_free -= lists->blocks[index].size;
    pool_lists_release(lists, index, OWNER_READY, 0, lists->blocks[index].idle_gen);
}

/* The used block at `addr` is freed: it leaves the in-use map and the
 * in-use count; *index = its descriptor. false: no used block there. */
static inline bool pool_lists_unuse(pool_lists_t *lists, uintptr_t addr, uint32_t *index)
{
    uint64_t found;
    if (!ps_ptr_map_remove(&lists->in_use, addr, &found))
        return false;
    *index = (uint32_t)found;
    lists->bytes_in_use -= lists->blocks[*index].size;
    return true;
}

/* Undoes pool_lists_unuse(addr) of block `index` (a free that failed). */
static inline void pool_lists_reuse(pool_lists_t *lists, uintptr_t addr, uint32_t index)
{
    ps_ptr_map_put(&lists->in_use, addr, index);
    lists->bytes_in_use += lists->blocks[index].size;
}

/* `bytes` more have memory behind them, from `maps` new upstream calls. */
static inline void pool_lists_count_growth(pool_lists_t *lists, uint64_t bytes, uint64_t maps)
{
    lists->bytes_reserved += bytes;
    if (lists->bytes_reserved > lists->peak_bytes_reserved)
        lists->peak_bytes_reserved = lists->bytes_reserved;
    lists->upstream_allocs += maps;
}

/* `bytes` no longer have memory behind them here, after `unmaps` upstream calls. */
static inline void pool_lists_count_return(pool_lists_t *lists, uint64_t bytes, uint64_t unmaps)
{
    lists->bytes_reserved -= bytes;
    lists->upstream_frees += unmaps;
}

#endif
