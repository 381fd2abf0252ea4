/* STUB: placeholder so the tree links; replaced by the real implementation. */
#include "fixed_size.h"

void ps_fixed_size_options_default(ps_fixed_size_options_t *opts)
{ (void)opts; }

int ps_fixed_size_create(const char *name, ps_resource_t *upstream, const ps_gpu_ops_t *gpu, const ps_fixed_size_options_t *opts, ps_resource_t **out)
{ return PS_EUNSUPPORTED; }

