/* STUB: placeholder so the tree links; replaced by the real implementation. */
#include "pool.h"

void ps_pool_options_default(ps_pool_options_t *opts)
{ (void)opts; }

int ps_pool_create(const char *name, ps_resource_t *upstream, const ps_gpu_ops_t *gpu, const ps_pool_options_t *opts, ps_resource_t **out)
{ return PS_EUNSUPPORTED; }

int ps_pool_check(ps_resource_t *pool)
{ (void)pool; return PS_EUNSUPPORTED; }

