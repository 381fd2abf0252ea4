/* The GPU-ops table of core/ over the real driver (shim/gpu_ops_cuda.c,
 * gpu_ops_cuda_streams.c, gpu_ops_cuda_vm.c): made per device by the
 * router, told about streams, captures, peer access and context deaths.
 * It calls the registry, real.c, and the leaves (stats, nvtx). */
#ifndef PS_SHIM_GPU_OPS_CUDA_H
#define PS_SHIM_GPU_OPS_CUDA_H

#include "common.h"

/* Creates the GPU-ops table of `device`, whose primary context is `ctx`. */
int ps_gpu_ops_cuda_create(int device, CUcontext ctx, ps_gpu_ops_t **out);

/* Stream tracking: non-blocking streams need their own fence at a cudaFree
 * epoch (the legacy stream does not order them). */
void ps_gpu_ops_cuda_stream_created(CUstream stream, unsigned int flags);
void ps_gpu_ops_cuda_stream_destroyed(CUstream stream);
/* Around every real cuStreamBeginCapture*: no capture may begin while a
 * barrier is half-way (it checked that none was open). */
int ps_gpu_ops_cuda_capture_gate(void);
void ps_gpu_ops_cuda_capture_gate_end(void);
/* Global-mode captures (CUDA prohibits "unsafe" calls such as cudaMalloc
 * and cudaFree on every thread not in relaxed mode while one is open):
 * capture_begun remembers one (streams_lock held: inside the gate);
 * unsafe_call_prohibited answers, for a cudaMalloc/cudaFree the shim would
 * serve, what CUDA answers natively: 0 when the call is allowed (no global
 * capture open, this thread in relaxed mode: one atomic load while none
 * was ever begun), else the CUresult of a real unsafe call made as the
 * program's would have been (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, with
 * whatever that does to the capture natively). */
void ps_gpu_ops_cuda_capture_begun(CUstream stream, CUstreamCaptureMode mode);
CUresult ps_gpu_ops_cuda_unsafe_call_check(void);
/* The legacy stream of the current context may be recorded on and made to
 * wait (no blocking stream of it captures): true with the streams lock
 * held (no capture can begin; release it with legacy_leave), false without. */
bool ps_gpu_ops_cuda_legacy_enter(void);
void ps_gpu_ops_cuda_legacy_leave(void);
/* The out-of-memory retry's give-back on the device of `gpu` (oom.c, through give_back.c):
 * PS_OK when no stream capture is open in its context, and from then on
 * none can begin (every cuStreamBeginCapture* waits at the capture gate)
 * until ps_gpu_ops_cuda_give_back_leave; PS_EBUSY while one is open, or
 * PS_EUPSTREAM when the context died or CUDA cannot say (then nothing is
 * held). POOLSHIM_TEST_IGNORE_CAPTURES=1 answers PS_OK as if none were open. */
int ps_gpu_ops_cuda_give_back_enter(ps_gpu_ops_t *gpu);
void ps_gpu_ops_cuda_give_back_leave(void);
/* How many global-mode captures may be open (read without the streams lock;
 * 0 on the hot path, where unsafe_call_prohibited is then one load). */
extern atomic_int ps_gpu_ops_cuda_global_captures;
static inline CUresult ps_gpu_ops_cuda_unsafe_call_prohibited(void)
{
    if (PS_LIKELY(atomic_load_explicit(&ps_gpu_ops_cuda_global_captures, memory_order_relaxed) == 0))
        return CUDA_SUCCESS;
    return ps_gpu_ops_cuda_unsafe_call_check();
}
/* Context lifecycle (no CUDA call in either): forget the tracked streams
 * of a context that died; make every later call through `ops` a no-op
 * that fails (its context, events and memory are gone). */
void ps_gpu_ops_cuda_forget_context(CUcontext ctx);
void ps_gpu_ops_cuda_mark_dead(ps_gpu_ops_t *ops);
/* Around a call that may destroy the context of `ops` (its gate, 10. of
 * gpu_ops_cuda.c): close waits for every call inside the table and holds
 * new ones; mark the table dead before open if the context died. */
void ps_gpu_ops_cuda_close(ps_gpu_ops_t *ops);
void ps_gpu_ops_cuda_open(ps_gpu_ops_t *ops);
/* Before a reset, while the context lives and with the gate of `ops`
 * closed: unmap and release its virtual memory (it outlives the context
 * otherwise); its pools are dead. */
bool ps_gpu_ops_cuda_release_vm(ps_gpu_ops_t *ops);
/* fork(): the streams lock is taken before, released in the parent, reset
 * in the child (the child's stream hooks take it). */
void ps_gpu_ops_cuda_atfork_prepare(void);
void ps_gpu_ops_cuda_atfork_parent(void);
void ps_gpu_ops_cuda_atfork_child(void);
/* The current context was just given access to `peer`'s memory
 * (cuCtxEnablePeerAccess / cudaDeviceEnablePeerAccess): memory mapped with
 * cuMemMap is not covered by that, so every mapping of the peer device's
 * pools, and every later one, is made accessible to the current device. */
void ps_gpu_ops_cuda_peer_access_enabled(CUcontext peer);

/* 5. of gpu_ops_cuda_vm.c: device `device` is in use in the process (its
 * table was made, a copy of another device's pooled memory runs with it
 * current, peer access or a memory pool's access names it): it and the
 * other devices in use that can reach each other are granted each other's
 * mapped memory, now and in later mappings. Cheap once it is known. */
void ps_gpu_ops_cuda_device_in_use(int device);

#endif
