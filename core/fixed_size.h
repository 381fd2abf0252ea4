/* fixed_size: one block size, O(1) allocate and free from a free list,
 * grows by a batch of blocks taken from the upstream in one call.
 * Requests larger than block_size return PS_EINVAL (use binning). */
#ifndef PS_FIXED_SIZE_H
#define PS_FIXED_SIZE_H

#include "gpu_ops.h"
#include "reuse.h" /* ps_free_sync_t */
#include "resource.h"

typedef struct ps_fixed_size_options {
    size_t block_size;       /* bytes per block (rounded up to alignment) */
    size_t blocks_per_batch; /* blocks taken from upstream per growth (default 128) */
    size_t alignment;        /* power of two >= 256 (default 256) */
    ps_free_sync_t free_sync;/* as the pool's */
} ps_fixed_size_options_t;

void ps_fixed_size_options_default(ps_fixed_size_options_t *opts);
int ps_fixed_size_create(const char *name, ps_resource_t *upstream, const ps_gpu_ops_t *gpu,
                         const ps_fixed_size_options_t *opts, ps_resource_t **out);
#endif
