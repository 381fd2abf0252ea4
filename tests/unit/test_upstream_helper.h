/* A private stand-in for core/host_ops.c and the `cuda` upstream, so the
 * resource tests run before those land. Same functions as core/host_ops.h,
 * with a test_ prefix; the lead switches the tests to core/host_ops when
 * merging (rename test_host_ops_* -> ps_host_ops_*, test_upstream_create ->
 * ps_cuda_resource_create). */
#ifndef TEST_UPSTREAM_HELPER_H
#define TEST_UPSTREAM_HELPER_H

#include "../../core/host_ops.h"
#include "../../core/resource.h"

int test_host_ops_create(const ps_host_ops_options_t *opts, ps_gpu_ops_t **out);
void test_host_ops_destroy(ps_gpu_ops_t *ops);
uint64_t test_host_ops_fences_recorded(ps_gpu_ops_t *ops);
void test_host_ops_complete_upto(ps_gpu_ops_t *ops, uint64_t seq);
void test_host_ops_complete_all(ps_gpu_ops_t *ops);
void test_host_ops_set_auto_complete(ps_gpu_ops_t *ops, int on);
uint64_t test_host_ops_stream_waits(ps_gpu_ops_t *ops);
uint64_t test_host_ops_fence_waits(ps_gpu_ops_t *ops);
uint64_t test_host_ops_device_syncs(ps_gpu_ops_t *ops);
uint64_t test_host_ops_bytes_outstanding(ps_gpu_ops_t *ops);
uint64_t test_host_ops_upstream_allocs(ps_gpu_ops_t *ops);
void test_host_ops_inject_failure(ps_gpu_ops_t *ops, uint64_t fail_after, uint64_t fail_count);

/* The `cuda` upstream over a GPU-ops table: every allocate is one mem_alloc. */
int test_upstream_create(const char *name, const ps_gpu_ops_t *gpu, ps_resource_t **out);

#endif
