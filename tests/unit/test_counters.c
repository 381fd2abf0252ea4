/* The resource counters' table (core/resource.h): every row is one member
 * of ps_resource_info_t, and its report words are well formed. */
#include "../../core/resource.h"

#include <criterion/criterion.h>
#include <string.h>

Test(counters, each_row_is_one_member_of_the_info)
{
    cr_assert_eq(sizeof(ps_resource_info_t), PS_COUNTER_COUNT * sizeof(uint64_t), "a member without a row");
    ps_resource_info_t info;
    memset(&info, 0, sizeof info);
    info.remaps_lent = 7;
    info.bytes_reserved = 5;
    cr_expect_eq(ps_resource_counter_value(&info, &ps_resource_counters[PS_COUNTER_remaps_lent]), 7);
    cr_expect_eq(ps_resource_counter_value(&info, &ps_resource_counters[PS_COUNTER_bytes_reserved]), 5);
    cr_expect_str_eq(ps_resource_counters[PS_COUNTER_remaps_lent].field, "remaps_lent");
    for (int a = 0; a < PS_COUNTER_COUNT; a++)
        for (int b = a + 1; b < PS_COUNTER_COUNT; b++) {
            cr_expect_neq(ps_resource_counters[a].offset, ps_resource_counters[b].offset, "%s", ps_resource_counters[b].field);
            if (ps_resource_counters[a].json && ps_resource_counters[b].json)
                cr_expect_str_neq(ps_resource_counters[a].json, ps_resource_counters[b].json);
        }
}

Test(counters, report_words_are_well_formed)
{
    for (int c = 0; c < PS_COUNTER_COUNT; c++) {
        const ps_resource_counter_t *row = &ps_resource_counters[c];
        cr_expect(row->doc && row->doc[0], "%s has no doc", row->field);
        if (row->json) { /* "key" or "group.key", one level: the report's writer nests once */
            const char *dot = strchr(row->json, '.');
            cr_expect(!dot || (dot != row->json && dot[1] && !strchr(dot + 1, '.')), "%s: %s", row->field, row->json);
        }
        if (row->prometheus) { /* a counter's name ends in _total, a gauge's does not */
            size_t n = strlen(row->prometheus);
            int total = n > 6 && !strcmp(row->prometheus + n - 6, "_total");
            cr_expect_eq(total, row->unit == PS_UNIT_COUNT, "%s: %s", row->field, row->prometheus);
            cr_expect(!strncmp(row->prometheus, "poolshim_", 9), "%s", row->prometheus);
        }
        cr_expect(row->shown_always || row->text, "%s: shown when not 0, but on no line", row->field);
    }
}
