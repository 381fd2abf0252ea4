/* limit adaptor: caps the bytes outstanding through it (core/adaptors.h).
 *
 * Algorithm:
 *  1. allocate reserves `size` bytes against the limit with one
 *     compare-and-swap loop on an atomic counter; past the limit it returns
 *     PS_ENOMEM and prints one warning naming the limit, without calling
 *     the upstream.
 *  2. Otherwise it forwards; if the upstream fails, the reservation is
 *     undone. deallocate forwards and gives the bytes back on success.
 * Guarantees: bytes outstanding never exceed the limit, even under races
 * (the reservation happens before the upstream call); exactly `limit`
 * bytes fit. Counts requested sizes (not the upstream's rounding).
 */
#include "adaptors.h"

#include <stdatomic.h>
#include <stdlib.h>

typedef struct limit {
    ps_resource_t base;          /* vtable first */
    uint64_t limit_bytes;        /* the cap */
    _Atomic uint64_t outstanding;/* bytes allocated and not freed */
} limit_t;

static int limit_allocate(ps_resource_t *r, size_t size, ps_stream_t stream, void **out)
{
    limit_t *l = (limit_t *)r;
    uint64_t now = atomic_load_explicit(&l->outstanding, memory_order_relaxed);
    do {
        if (size > l->limit_bytes || now > l->limit_bytes - size) {
            char b1[32], b2[32];
            ps_warning("limit '%s': allocation of %zu bytes refused: %s outstanding, limit %s "
                       "(%llu bytes)",
                       r->name, size, ps_format_bytes(b1, sizeof b1, now),
                       ps_format_bytes(b2, sizeof b2, l->limit_bytes),
                       (unsigned long long)l->limit_bytes);
            return PS_ENOMEM;
        }
    } while (!atomic_compare_exchange_weak_explicit(&l->outstanding, &now, now + size,
                                                    memory_order_relaxed, memory_order_relaxed));
    int status = ps_allocate(r->upstream, size, stream, out);
    if (status != PS_OK)
        atomic_fetch_sub_explicit(&l->outstanding, size, memory_order_relaxed);
    return status;
}

static int limit_deallocate(ps_resource_t *r, void *ptr, size_t size, ps_stream_t stream)
{
    limit_t *l = (limit_t *)r;
    int status = ps_deallocate(r->upstream, ptr, size, stream);
    if (status == PS_OK)
        atomic_fetch_sub_explicit(&l->outstanding, size, memory_order_relaxed);
    return status;
}

static void limit_destroy(ps_resource_t *r) { free(r); }

static const ps_resource_ops_t limit_ops = PS_ADAPTOR_OPS("limit", limit_allocate, limit_deallocate, limit_destroy);

int ps_limit_create(const char *name, ps_resource_t *upstream, size_t limit_bytes,
                    ps_resource_t **out)
{
    limit_t *l = NULL;
    int status = ps_adaptor_start(sizeof *l, 0, &limit_ops, name, upstream, out, (void **)&l);
    if (status == PS_OK) {
        l->limit_bytes = limit_bytes;
        *out = &l->base;
    }
    return status;
}
