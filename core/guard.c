/* guard adaptor: red zones after every block (debug.guard, core/adaptors.h).
 *
 * A kernel that writes past the end of its block writes into the next
 * block of the pool, which CUDA cannot see (the chunk is one allocation).
 * Guard mode makes such writes visible at the block's free:
 *
 * 1. allocate(size) takes size + G bytes from the upstream (G = the guard
 *    size) and fills the G bytes just after the program's `size` bytes with
 *    PS_GUARD_BYTE through the GPU-ops table (gpu->memset_d8, i.e.
 *    cuMemsetD8Async). For cudaMalloc the fill goes on the legacy stream
 *    and the host waits for it (so any kernel launched later, on any
 *    stream, finds the zone filled); for cudaMallocAsync it goes on the
 *    allocation's stream, in order, without a host wait.
 * 2. deallocate(ptr, size) copies the red zone back (gpu->copy_to_host:
 *    the device, or for a stream-ordered free that stream, is synchronized
 *    first, so every kernel that could still write it has finished) and
 *    compares it with the pattern. A difference is reported through
 *    ps_error with the block's address, size and stream, how many bytes
 *    changed and the first changed offset, and, when the stack has a track
 *    adaptor below the guard, the block's allocation site (its call
 *    stack). The block is then freed as usual: the report does not change
 *    what the program sees.
 * 3. A zone that cannot be filled fails the allocation (nothing is kept);
 *    a zone that cannot be read back (a capture is open, a sticky error)
 *    is counted as unchecked, never reported as overwritten.
 *
 * Cost: one memset per allocation plus, for cudaMalloc, a host wait on the
 * legacy stream; one device (or stream) synchronization and one G-byte
 * copy per free. That removes what cudaFree's asynchrony gave: a debugging
 * mode, not for production. Adaptors below the guard see every request
 * grown by G bytes. The pattern is one byte value, so a write of exactly
 * that value goes unseen.
 */
#include "adaptors.h"

#include <stdlib.h>
#include <string.h>

#include "gpu_ops.h"

typedef struct guard {
    ps_resource_t base;        /* vtable first */
    const ps_gpu_ops_t *gpu;   /* memset_d8 / copy_to_host */
    size_t bytes;              /* red-zone size after each block */
    ps_resource_t *track;      /* a track adaptor below us (allocation sites), or NULL */
    _Atomic uint64_t checked;  /* frees whose zone was compared */
    _Atomic uint64_t overwritten; /* of those, zones found changed */
    _Atomic uint64_t unchecked;   /* frees whose zone could not be read */
} guard_t;

static int guard_allocate(ps_resource_t *r, size_t size, ps_stream_t stream, void **out)
{
    guard_t *g = (guard_t *)r;
    if (size > SIZE_MAX - g->bytes)
        return PS_ENOMEM;
    void *p = NULL;
    int rc = ps_allocate(r->upstream, size + g->bytes, stream, &p);
    if (rc != PS_OK)
        return rc;
    rc = g->gpu->memset_d8(g->gpu->ctx, (char *)p + size, PS_GUARD_BYTE, g->bytes, stream);
    if (rc != PS_OK) {
        ps_deallocate(r->upstream, p, size + g->bytes, stream);
        return rc;
    }
    *out = p;
    return PS_OK;
}

/* Writes the report of an overwritten zone (2. above). */
static void report(guard_t *g, void *ptr, size_t size, ps_stream_t stream, size_t changed, size_t first)
{
    char *site = NULL;
    size_t site_size = 0;
    FILE *f = g->track ? open_memstream(&site, &site_size) : NULL;
    int found = 0;
    if (f) {
        found = ps_track_write_site(g->track, ptr, f);
        fclose(f);
    }
    char how[48];
    if (stream == PS_STREAM_NONE)
        snprintf(how, sizeof how, "cudaMalloc");
    else
        snprintf(how, sizeof how, "stream 0x%lx", (unsigned long)stream);
    ps_error("guard: block %p (%zu bytes, %s): %zu of the %zu red-zone bytes after it were overwritten, "
             "the first at +%zu past its end (block offset %zu)%s%s",
             ptr, size, how, changed, g->bytes, first, size + first,
             found ? "; allocated at:\n"
             : g->track ? "; allocation site unknown"
                        : " (a track adaptor in the stack would show where it was allocated)",
             found && site ? site : "");
    free(site);
}

static int guard_deallocate(ps_resource_t *r, void *ptr, size_t size, ps_stream_t stream)
{
    guard_t *g = (guard_t *)r;
    unsigned char small[4096];
    unsigned char *zone = g->bytes <= sizeof small ? small : malloc(g->bytes);
    int rc = zone ? g->gpu->copy_to_host(g->gpu->ctx, zone, (char *)ptr + size, g->bytes, stream) : PS_ENOMEM;
    if (rc == PS_OK) {
        size_t changed = 0, first = 0;
        for (size_t i = 0; i < g->bytes; i++)
            if (zone[i] != PS_GUARD_BYTE && changed++ == 0)
                first = i;
        g->checked++;
        if (changed) {
            g->overwritten++;
            report(g, ptr, size, stream, changed, first);
        }
    } else {
        g->unchecked++;
    }
    if (zone != small)
        free(zone);
    return ps_deallocate(r->upstream, ptr, size + g->bytes, stream);
}

static void guard_destroy(ps_resource_t *r) { free(r); }

static const ps_resource_ops_t guard_ops = PS_ADAPTOR_OPS("guard", guard_allocate, guard_deallocate, guard_destroy);

int ps_guard_create(const char *name, ps_resource_t *upstream, const ps_gpu_ops_t *gpu, size_t bytes,
                    ps_resource_t *track, ps_resource_t **out)
{
    if (!upstream || !gpu || !out || !bytes)
        return PS_EINVAL;
    if (!gpu->memset_d8 || !gpu->copy_to_host)
        return PS_EUNSUPPORTED;
    guard_t *g = NULL;
    int status = ps_adaptor_start(sizeof *g, 0, &guard_ops, name, upstream, out, (void **)&g);
    if (status == PS_OK) {
        g->gpu = gpu;
        g->bytes = bytes;
        g->track = track;
        *out = &g->base;
    }
    return status;
}

void ps_guard_get(ps_resource_t *guard_adaptor, ps_guard_counts_t *out)
{
    guard_t *g = (guard_t *)guard_adaptor;
    out->checked = g->checked;
    out->overwritten = g->overwritten;
    out->unchecked = g->unchecked;
}
