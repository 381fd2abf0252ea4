/* Copies of pooled mapped memory across devices (shim/copy_order.c; the
 * hooks are hooks_copy.c): a copy or memset of memory of another device
 * than the current one is ordered as CUDA orders cudaMalloc memory. */
#ifndef PS_SHIM_COPY_ORDER_H
#define PS_SHIM_COPY_ORDER_H

#include "common.h"

/* What ps_copy_order_begin did, for ps_copy_order_end. */
typedef struct ps_copy_order {
    uint64_t devices; /* bit D: the copy touches mapped memory of device D, not the current one, and the copy's
                         stream was made to wait for D's legacy stream */
    CUstream stream;  /* the copy's stream as a handle the real driver reads (CU_STREAM_LEGACY/PER_THREAD) */
    CUcontext ctx;    /* the current context at the copy */
    int device;       /* its device */
} ps_copy_order_t;
/* Before a copy or memset that touches `dst` and `src` (0: none) on `stream`
 * (NULL: the default stream, per-thread when `per_thread`): true when it
 * touches mapped memory of another device than the current one, and the
 * copy's stream now waits for that device's legacy stream (then call
 * ps_copy_order_end after the real call); false, with nothing done, in the
 * common case (one atomic load when no device has mapped memory). */
bool ps_copy_order_begin(ps_copy_order_t *o, uintptr_t dst, uintptr_t src, CUstream stream, bool per_thread);
/* After the real call (result r): each device of o waits on its legacy
 * stream for the copy. */
void ps_copy_order_end(ps_copy_order_t *o, CUresult r);

#endif
