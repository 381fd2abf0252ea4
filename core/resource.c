/* The resource counters' table (core/resource.h, PS_RESOURCE_COUNTERS) as
 * rows the reports walk: each row's words and where its value lies in a
 * ps_resource_info_t; and the start every adaptor's create shares. */
#include <stdlib.h>
#include <string.h>

#include "resource.h"

int ps_adaptor_start(size_t size, size_t align, const ps_resource_ops_t *ops, const char *name,
                     ps_resource_t *upstream, ps_resource_t **out, void **self)
{
    if (!upstream || !out)
        return PS_EINVAL;
    ps_resource_t *r = align ? aligned_alloc(align, size) : malloc(size);
    if (!r)
        return PS_ENOMEM;
    memset(r, 0, size);
    ps_resource_init(r, ops, name, upstream);
    *self = r;
    return PS_OK;
}

#define PS_SHOWN_ALWAYS true
#define PS_SHOWN_NONZERO false

const ps_resource_counter_t ps_resource_counters[PS_COUNTER_COUNT] = {
#define PS_COUNTER_ROW(field, unit, json, text, shown, prometheus, doc) \
    {#field, PS_UNIT_##unit, json, text, PS_SHOWN_##shown, prometheus, doc, offsetof(ps_resource_info_t, field)},
    PS_RESOURCE_COUNTERS(PS_COUNTER_ROW)
#undef PS_COUNTER_ROW
};
