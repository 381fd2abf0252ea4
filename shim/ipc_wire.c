/* The IPC wire format's checks (shim/ipc_wire.h): everything another
 * process sends or hands over is checked here before shim/ipc.c uses it.
 * Bounds are compared by subtraction from a checked larger value, never by
 * adding two untrusted ones, so no check can wrap around. */
#include "ipc_wire.h"

#include <string.h>

uint32_t ps_ipc_checksum(const ps_ipc_handle_t *h)
{
    const unsigned char *p = (const unsigned char *)h;
    uint32_t x = 2166136261u;
    for (size_t i = 0; i < offsetof(ps_ipc_handle_t, check); i++)
        x = (x ^ p[i]) * 16777619u;
    return x;
}

bool ps_ipc_is_ours(const void *bytes)
{
    return bytes && memcmp(bytes, PS_IPC_MAGIC, 8) == 0;
}

const char *ps_ipc_handle_read(const void *bytes, ps_ipc_handle_t *h)
{
    memcpy(h, bytes, sizeof *h);
    if (memcmp(h->magic, PS_IPC_MAGIC, 8) != 0)
        return "not a poolshim handle of this format";
    if (h->check != ps_ipc_checksum(h))
        return "its checksum does not match (a damaged handle)";
    if (!h->pid)
        return "it names no exporting process";
    if (!h->pieces || h->pieces > PS_IPC_PIECES_MAX)
        return "its number of pieces is out of bounds";
    if (h->mapped > PS_IPC_MAPPED_MAX || h->mapped / PS_IPC_PIECE_MIN < h->pieces)
        return "its pieces' bytes are out of bounds";
    if (!h->size || h->size > h->mapped || h->offset > h->mapped - h->size)
        return "its block does not lie within its pieces (offset and size)";
    return NULL;
}

bool ps_ipc_request_read(const void *bytes, size_t size, ps_ipc_request_t *q)
{
    if (size != sizeof *q)
        return false;
    memcpy(q, bytes, sizeof *q);
    return memcmp(q->magic, PS_IPC_MAGIC, 8) == 0;
}

const char *ps_ipc_reply_check(const ps_ipc_receive_t *state, const ps_ipc_reply_t *r, ssize_t size, int fds,
                               int *status)
{
    *status = -1;
    if (size != (ssize_t)sizeof *r)
        return "the exporter's answer is not a reply";
    *status = r->status;
    if (r->status != PS_IPC_REPLY_OK)
        return ps_ipc_reply_text(r->status);
    if (state->have >= state->pieces || r->first != state->have || r->total != state->pieces || fds < 1 ||
        fds > PS_IPC_BATCH || r->count != (uint32_t)fds || r->count > state->pieces - state->have)
        return "the exporter's pieces do not match the handle";
    uint64_t left = state->cursor <= state->mapped ? state->mapped - state->cursor : 0;
    for (uint32_t i = 0; i < r->count; i++) {
        if (r->sizes[i] < PS_IPC_PIECE_MIN || r->sizes[i] > left)
            return "the exporter's pieces are larger than the handle says";
        left -= r->sizes[i];
    }
    if (state->have + r->count == state->pieces && left)
        return "the exporter's pieces do not add up to the handle's size";
    return NULL;
}

const char *ps_ipc_reply_text(int status)
{
    switch (status) {
    case PS_IPC_REPLY_STALE: return "the exporter no longer has this block (it was freed since the handle was made, "
                                    "perhaps reused: a stale handle)";
    case PS_IPC_REPLY_BAD_TOKEN: return "the handle's token does not match the exporter's (a damaged or forged handle)";
    case PS_IPC_REPLY_EXPORT_FAILED: return "the exporter could not export the block's memory";
    case PS_IPC_REPLY_EXITING: return "the exporter is exiting";
    default: return "the exporter answered something unexpected";
    }
}
