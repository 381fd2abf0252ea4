/* STUB: placeholder so the tree links; replaced by the real implementation. */
#include "upstream.h"

int ps_cuda_resource_create(const char *name, const ps_gpu_ops_t *gpu, ps_resource_t **out)
{ return PS_EUNSUPPORTED; }

int ps_async_resource_create(const char *name, const ps_gpu_ops_t *gpu, uint64_t release_threshold, ps_resource_t **out)
{ return PS_EUNSUPPORTED; }

int ps_managed_resource_create(const char *name, const ps_gpu_ops_t *gpu, ps_resource_t **out)
{ return PS_EUNSUPPORTED; }

