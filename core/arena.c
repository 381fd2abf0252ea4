/* STUB: placeholder so the tree links; replaced by the real implementation. */
#include "arena.h"

void ps_arena_options_default(ps_arena_options_t *opts)
{ (void)opts; }

int ps_arena_create(const char *name, ps_resource_t *upstream, const ps_gpu_ops_t *gpu, const ps_arena_options_t *opts, ps_resource_t **out)
{ return PS_EUNSUPPORTED; }

