/* STUB: placeholder so the tree links; replaced by the real implementation. */
#include "binning.h"

int ps_binning_create(const char *name, const ps_bin_t *bins, size_t bin_count, ps_resource_t *fallback, ps_resource_t **out)
{ return PS_EUNSUPPORTED; }

