/* What crosses the process boundary in IPC of pooled memory (shim/ipc.c):
 * the handle inside cudaIpcMemHandle_t, the request an importer sends and
 * the replies that carry the pieces, with the checks that everything read
 * from another process passes before it is used (shim/ipc_wire.c). No
 * dependency on the rest of the shim: the fuzz targets (shim/fuzz/) and
 * the unit tests build it alone. */
#ifndef PS_SHIM_IPC_WIRE_H
#define PS_SHIM_IPC_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define PS_IPC_MAGIC "PSHMIPC\x02"   /* 8 bytes: ours, format 2 */
#define PS_IPC_BATCH 64              /* descriptors per reply */
#define PS_IPC_PIECE_MIN 4096        /* the smallest piece: pieces * PS_IPC_PIECE_MIN <= mapped */
#define PS_IPC_PIECES_MAX (1u << 20) /* pieces of one block (2 TiB of 2 MiB pieces) */
#define PS_IPC_MAPPED_MAX (1ull << 48) /* bytes of one block's pieces (the GPU's virtual address space) */

/* The handle inside the opaque 64 bytes of cudaIpcMemHandle_t. */
typedef struct ps_ipc_handle {
    char magic[8];   /* PS_IPC_MAGIC */
    uint32_t pid;    /* exporter's pid (in its pid namespace) */
    uint32_t pieces; /* physical pieces behind the block */
    uint64_t id;     /* export id: fresh per exported block, never reused by the exporter */
    uint64_t token;  /* random secret the exporter asks for */
    uint64_t size;   /* the block's bytes */
    uint64_t offset; /* block start - start of its first piece */
    uint64_t mapped; /* bytes of all its pieces */
    uint32_t name;   /* random: the exporter's socket is @poolshim-ipc.<pid>.<name, 8 hex digits> */
    uint32_t check;  /* FNV-1a of the bytes before it: a damaged handle is refused */
} ps_ipc_handle_t;
_Static_assert(sizeof(ps_ipc_handle_t) == 64, "the handle fills cudaIpcMemHandle_t exactly");

/* The request an importer sends: one message. */
typedef struct ps_ipc_request {
    char magic[8];  /* PS_IPC_MAGIC */
    uint64_t id;    /* export id */
    uint64_t token; /* its token */
} ps_ipc_request_t;

enum { PS_IPC_REPLY_OK = 0, PS_IPC_REPLY_STALE, PS_IPC_REPLY_BAD_TOKEN, PS_IPC_REPLY_EXPORT_FAILED,
       PS_IPC_REPLY_EXITING };

/* Each reply message; PS_IPC_REPLY_OK ones carry `count` descriptors. */
typedef struct ps_ipc_reply {
    int32_t status;               /* PS_IPC_REPLY_* */
    uint32_t first;               /* index of the first piece in this message */
    uint32_t count;               /* descriptors attached */
    uint32_t total;               /* pieces in all */
    uint64_t sizes[PS_IPC_BATCH]; /* bytes of each attached piece */
} ps_ipc_reply_t;

/* Where a receive stands: what the handle promised and what came so far. */
typedef struct ps_ipc_receive {
    uint32_t pieces; /* the handle's pieces */
    uint32_t have;   /* pieces received */
    uint64_t mapped; /* the handle's bytes of all pieces */
    uint64_t cursor; /* bytes received */
} ps_ipc_receive_t;

/* FNV-1a of the bytes before `check`. */
uint32_t ps_ipc_checksum(const ps_ipc_handle_t *h);
/* Whether the 64 bytes at `bytes` are a handle of ours (our magic). */
bool ps_ipc_is_ours(const void *bytes);
/* The 64 bytes at `bytes` as a handle in *h, checked: its checksum, and
 * every field in bounds without overflow (pid > 0; 1 <= pieces <=
 * PS_IPC_PIECES_MAX; pieces * PS_IPC_PIECE_MIN <= mapped <=
 * PS_IPC_MAPPED_MAX; 1 <= size <= mapped; offset <= mapped - size). NULL
 * when it may be used, else why not. */
const char *ps_ipc_handle_read(const void *bytes, ps_ipc_handle_t *h);
/* A message of `size` bytes as a request in *q: true when it is one (its
 * size and magic). */
bool ps_ipc_request_read(const void *bytes, size_t size, ps_ipc_request_t *q);
/* A reply of `size` bytes with `fds` descriptors, checked against the
 * receive so far: its status OK, the next pieces in order, as many
 * descriptors as it says (1 to PS_IPC_BATCH), none past the handle's
 * pieces, each size at least PS_IPC_PIECE_MIN and all within the mapped
 * bytes left, without overflow. NULL when its pieces may be mapped, else
 * why not; *status the reply's status (-1 when the message is no reply). */
const char *ps_ipc_reply_check(const ps_ipc_receive_t *state, const ps_ipc_reply_t *r, ssize_t size, int fds,
                               int *status);
/* Why the exporter refused (a reply's status). */
const char *ps_ipc_reply_text(int status);

#endif
