/* Test switches (shim/test_switches.c): the POOLSHIM_TEST_* variables that
 * make the shim deliberately wrong or odd, for negative controls and
 * measurements, never for real work. Read once, when the library is
 * loaded; the code reads ps_test. Each switch is on when its variable is
 * "1" (a string for NEIGHBOURS_DIR); each warns where it takes effect,
 * with the text its field's comment quotes. */
#ifndef PS_SHIM_TEST_SWITCHES_H
#define PS_SHIM_TEST_SWITCHES_H

typedef struct ps_test_switches {
    int skip_host_wait;  /* POOLSHIM_TEST_SKIP_HOST_WAIT: freed pinned blocks are reused at once (the router's host
                            pool, free_sync none; tests/gpu/pinned.cu). Warns "freed pinned blocks are reused at
                            once, while copies may still read them" at each pinned pool built */
    int ipc_skew;        /* POOLSHIM_TEST_IPC_SKEW: an opened IPC block's piece i is mapped where piece i + 1
                            belongs (ipc.c). Warns "opened IPC blocks get their pieces in the wrong order" at each
                            open of a block of several pieces */
    int ignore_captures; /* POOLSHIM_TEST_IGNORE_CAPTURES: behave as if no stream capture were ever open
                            (gpu_ops_cuda_streams.c; tests/gpu/capture_threads.cu, the out-of-memory retry's capture
                            test). No warning */
    int skip_barrier;    /* POOLSHIM_TEST_SKIP_BARRIER: barriers order nothing (gpu_ops_cuda.c). Warns "barriers
                            order nothing; freed memory may be reused while kernels still use it" at each table */
    int assume_idle;     /* POOLSHIM_TEST_ASSUME_IDLE: every barrier counts as passed (gpu_ops_cuda.c;
                            tests/gpu/remap_idle.cu). Warns "every barrier counts as passed; remap may unmap memory
                            a kernel still uses" at each table */
    int wait_returns;    /* POOLSHIM_TEST_WAIT_RETURNS: waits for a barrier return at once (gpu_ops_cuda.c). Warns
                            "waits for a barrier return at once; remap may unmap memory a kernel still uses" at
                            each table */
    int return_lent;     /* POOLSHIM_TEST_RETURN_LENT: remap unmaps lent pieces' old addresses at once (the router
                            sets the pool's test hook when it builds a stack). Warns "remap unmaps lent pieces' old
                            addresses at once, under kernels that may still use them" at each stack */
    int barrier_no_join; /* POOLSHIM_TEST_BARRIER_NO_JOIN (a measurement): a barrier does not make the legacy
                            stream wait for busy non-blocking streams (gpu_ops_cuda.c). Warns "barriers do not
                            wait for non-blocking streams; memory they still use may be reused" at each table */
    int skip_peer_grant; /* POOLSHIM_TEST_SKIP_PEER_GRANT: mappings name their own device only, and peer access
                            the program enables is not extended to mapped memory (gpu_ops_cuda_vm.c). Warns
                            "device D's mapped memory names no other device" at each table with peers, and "peer
                            access to the pool's mapped memory is not granted" at each peer access enabled */
    int skip_copy_order; /* POOLSHIM_TEST_SKIP_COPY_ORDER: copies of pooled memory across devices are not ordered
                            (copy_order.c). Warns "copies of pooled memory across devices are not ordered" at the
                            first copy hook */
    int torch_no_join;   /* POOLSHIM_TEST_TORCH_NO_JOIN: the torch door keeps no record_stream pairs, so a free
                            joins no other stream (hooks_torch.c; tests/gpu/torch_door.py). Warns "record_stream
                            is ignored; memory another stream still uses may be reused" at the first record */
    int neighbours_one_attempt; /* POOLSHIM_TEST_NEIGHBOURS_ONE_ATTEMPT: a neighbour's request gets one give-back
                                   (neighbours.c, 5.). Warns "a neighbour's request gets one give-back, memory
                                   behind a barrier the GPU has not passed yet stays" when the registry is joined */
    const char *ipc_name;       /* POOLSHIM_TEST_IPC_NAME: 8 hex digits, the first name the IPC service tries
                                   for its socket, @poolshim-ipc.<pid>.<name> (ipc.c; a test binds it first and
                                   the service must take another). NULL: unset. No warning */
    const char *neighbours_dir; /* POOLSHIM_TEST_NEIGHBOURS_DIR: the neighbours' registry directory instead of
                                   /dev/shm/poolshim-<uid> (neighbours.c; a private one per test). NULL: unset.
                                   No warning */
} ps_test_switches_t;

/* Read by a constructor of test_switches.c before any other code of the shim runs. */
extern ps_test_switches_t ps_test;

#endif
