/* What reached the fake driver (tests/shim/fake_cuda.c). */
#ifndef FAKE_CUDA_H
#define FAKE_CUDA_H
typedef struct fake_cuda_counters {
    unsigned long mem_alloc;            /* successful allocations of any kind */
    unsigned long mem_free;             /* successful frees */
    unsigned long bad_free;             /* frees of unknown pointers */
    unsigned long mem_alloc_async;      /* cuMemAllocAsync calls */
    unsigned long mem_alloc_async_ptsz; /* cuMemAllocAsync_ptsz calls */
    unsigned long unsafe_refused;   /* unsafe calls refused during a global capture (each would
                                       invalidate a capture on the calling thread, in CUDA) */
    unsigned long event_record, event_query, event_sync, stream_wait, stream_create, stream_query;
    unsigned long ctx_push, ctx_sync, get_proc_address;
    unsigned long sync_in_capture;      /* cuCtxSynchronize calls while a stream of the context was capturing
                                           (each would invalidate that capture, in CUDA) */
    unsigned long wait_in_capture;      /* cuStreamWaitEvent calls that made a capturing stream wait (the fake
                                           records no event inside a capture: each waits on outside work,
                                           which would invalidate the capture, in CUDA) */
    unsigned long dead_calls;           /* calls on an object of a destroyed context */
    unsigned long ctx_destroyed;        /* contexts destroyed (reset, last release, cuCtxDestroy) */
    unsigned long ctx_reset, ctx_release; /* cuDevicePrimaryCtxReset / Release calls */
    unsigned long bytes_outstanding;    /* device bytes allocated now */
    unsigned long host_alloc;           /* cuMemHostAlloc / cuMemAllocHost_v2 calls that succeeded */
    unsigned long host_free;            /* cuMemFreeHost calls that succeeded */
    unsigned long host_alloc_flags;     /* the flags of the last cuMemHostAlloc */
    unsigned long host_register;        /* cuMemHostRegister_v2 calls that succeeded */
    unsigned long host_unregister;      /* cuMemHostUnregister calls that succeeded */
    unsigned long host_register_flags;  /* the flags of the last cuMemHostRegister_v2 */
    unsigned long host_queries;         /* cuMemHostGetFlags / cuMemHostGetDevicePointer_v2 calls */
    unsigned long calls_after_teardown; /* entry-point calls after the runtime's exit teardown */
    unsigned long child_calls;          /* calls in a fork() child (answered CUDA_ERROR_NOT_INITIALIZED) */
    unsigned long vm_created;           /* cuMemCreate successes (FAKE_CUDA_VMM=1) */
    unsigned long vm_created_shareable; /* ... of them with the POSIX file descriptor handle type */
    unsigned long vm_created_host;      /* ... of them placed on the host (location HOST: pinned pieces) */
    unsigned long vm_access_host;       /* cuMemSetAccess descriptors naming the host that were applied */
    unsigned long vm_access_device;     /* ... naming a device */
    unsigned long vm_access_other;      /* ... naming a device other than the current context's */
    unsigned long vm_exported;          /* cuMemExportToShareableHandle successes */
    unsigned long vm_imported;          /* cuMemImportFromShareableHandle successes */
    unsigned long vm_released;          /* cuMemRelease successes (created and imported) */
    unsigned long vm_unmapped;          /* cuMemUnmap successes */
    unsigned long ipc_open_native;      /* cuIpcOpenMemHandle(_v2) calls that reached the driver */
    unsigned long ipc_close_native;     /* cuIpcCloseMemHandle calls that reached the driver */
    unsigned long copies;               /* copies that ran (cuMemcpy, cuMemcpyHtoD/DtoH/DtoD_v2, cuMemcpyAsync) */
    unsigned long copy_refused;         /* copies refused: the current device could not reach mapped memory */
    unsigned long lifecycle_delays;     /* FAKE_CUDA_LIFECYCLE_DELAY_US sleeps begun (a test waits for one) */
} fake_cuda_counters_t;
#endif
