/* binning: routes each request by size to the first bin whose upper bound
 * fits it; requests above the last bin go to the fallback resource. The
 * shim's registry passes the size back at free, so the free is routed the
 * same way. Bins must be sorted by max_size, strictly increasing. */
#ifndef PS_BINNING_H
#define PS_BINNING_H

#include "resource.h"

typedef struct ps_bin {
    size_t max_size;        /* requests of at most this many bytes go here */
    ps_resource_t *resource;/* the bin's resource (fixed_size by default) */
} ps_bin_t;

/* Copies `bins`; the resources stay owned by the caller (the stack). */
int ps_binning_create(const char *name, const ps_bin_t *bins, size_t bin_count,
                      ps_resource_t *fallback, ps_resource_t **out);
#endif
