/* The resource counters' table (core/resource.h, PS_RESOURCE_COUNTERS) as
 * rows the reports walk: each row's words and where its value lies in a
 * ps_resource_info_t. */
#include "resource.h"

#define PS_SHOWN_ALWAYS true
#define PS_SHOWN_NONZERO false

const ps_resource_counter_t ps_resource_counters[PS_COUNTER_COUNT] = {
#define PS_COUNTER_ROW(field, unit, json, text, shown, prometheus, doc) \
    {#field, PS_UNIT_##unit, json, text, PS_SHOWN_##shown, prometheus, doc, offsetof(ps_resource_info_t, field)},
    PS_RESOURCE_COUNTERS(PS_COUNTER_ROW)
#undef PS_COUNTER_ROW
};
