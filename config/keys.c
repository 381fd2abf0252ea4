/* The schema of the configuration, made from config/keys.def: the names of
 * the resource types and of every key, which keys each type accepts, and
 * each key's row (how its text is read, its bounds, default, field, words
 * for messages). The tables only, and the few checks that belong to one
 * key; validate.c reads values against them.
 */
#include <stddef.h>
#include <string.h>

#include "config_internal.h"

/* ---- names ------------------------------------------------------------- */
const char *const ps_type_names[PS_TYPE_COUNT + 1] = {
    "pool", "arena", "fixed_size", "binning", "cuda", "async", "managed",
    "limit", "stats", "track", "log", NULL};

const char *const ps_key_names[PS_KEY_COUNT + 1] = {
#define PS_RESOURCE_KEY(id, name, ...) name,
#include "keys.def"
    NULL};

const char *const ps_global_key_names[PS_GKEY_COUNT + 1] = {
#define PS_GLOBAL_KEY(id, name, ...) name,
#include "keys.def"
    NULL};

const char *const ps_host_key_names[PS_HKEY_COUNT + 1] = {
#define PS_HOST_KEY(id, name, ...) name,
#include "keys.def"
    NULL};

const char *const ps_debug_key_names[PS_DKEY_COUNT + 1] = {
#define PS_DEBUG_KEY(id, name, ...) name,
#include "keys.def"
    NULL};

const char *const ps_free_sync_words[] = {"event", "device", "none", "barrier", NULL};
const char *const ps_verbosity_words[] = {"error", "warning", "info", "debug", NULL};
const char *const ps_stats_words[] = {"off", "text", "json", NULL};
const char *const ps_meminfo_words[] = {"pool", "device", NULL};
const char *const ps_on_error_words[] = {"exit", "passthrough", NULL};
const char *const ps_no_yes_words[] = {"no", "yes", NULL};
const char *const ps_off_on_words[] = {"off", "on", NULL};

/* ---- which keys a type takes ------------------------------------------- */
ps_key_mask_t ps_type_keys(ps_resource_type_t type)
{
    ps_key_mask_t keys = 0;
    for (int k = 0; k < PS_KEY_COUNT && type < PS_TYPE_COUNT; k++)
        if (ps_key_info[k].types & (1u << type))
            keys |= PS_KEY_BIT(k);
    return keys;
}

int ps_type_is_leaf(ps_resource_type_t type)
{
    return type == PS_TYPE_CUDA || type == PS_TYPE_ASYNC || type == PS_TYPE_MANAGED;
}

int ps_type_is_adaptor(ps_resource_type_t type)
{
    return type == PS_TYPE_LIMIT || type == PS_TYPE_STATS || type == PS_TYPE_TRACK ||
           type == PS_TYPE_LOG;
}

/* ---- fields ------------------------------------------------------------ */
void ps_field_store(void *base, const ps_field_t *field, uint64_t value)
{
    char *at = (char *)base + field->offset;
    value *= field->scale;
    if (field->size == sizeof(uint32_t)) {
        uint32_t v = (uint32_t)value;
        memcpy(at, &v, sizeof v);
    } else if (field->size == sizeof(uint64_t)) {
        memcpy(at, &value, sizeof value);
    }
}

uint64_t ps_field_load(const void *base, const ps_field_t *field)
{
    const char *at = (const char *)base + field->offset;
    uint64_t value = 0;
    if (field->size == sizeof(int32_t)) {
        int32_t v;
        memcpy(&v, at, sizeof v);
        value = (uint64_t)(int64_t)v;
    } else if (field->size == sizeof(uint64_t)) {
        memcpy(&value, at, sizeof value);
    }
    return field->scale > 1 ? value / field->scale : value;
}

const ps_field_t *ps_key_field(int key, ps_resource_type_t type)
{
    const ps_key_info_t *info = &ps_key_info[key];
    const ps_field_t *field = type == PS_TYPE_POOL         ? &info->pool
                              : type == PS_TYPE_ARENA      ? &info->arena
                              : type == PS_TYPE_FIXED_SIZE ? &info->fixed_size
                                                           : NULL;
    return field && field->size ? field : NULL;
}

/* ---- the checks only one key has (named in its row) ------------------------ */
/* [host] min_chunk, max_chunk. */
static const char *check_size_above_zero(uint64_t bytes, const char **expect)
{
    *expect = "a size above zero such as 32MiB";
    return bytes ? NULL : "zero";
}

/* [host] free_sync: a barrier orders GPU work, not the host's writes. */
static const char *check_pinned_free_sync(uint64_t policy, const char **expect)
{
    if (policy == PS_FREE_SYNC_EVENT || policy == PS_FREE_SYNC_DEVICE)
        return NULL;
    return "not a policy for pinned memory (the host writes a reused block at once: a GPU barrier does not "
           "protect it)";
}

/* [host] expandable_piece: whole host pages of the slab granule, at most 1 GiB. */
static const char *check_host_piece(uint64_t bytes, const char **expect)
{
    if (bytes && bytes % PS_HOST_CHUNK_GRANULE == 0 && bytes <= PS_GiB)
        return NULL;
    *expect = "a size such as 2MiB";
    return "not a multiple of 64KiB from 64KiB to 1GiB";
}

/* [host] grow_budget_percent: off, or a budget of at least what is in use. */
static const char *check_off_or_at_least_100(uint64_t percent, const char **expect)
{
    return percent && percent < 100 ? "below 100" : NULL;
}

/* [debug] guard. */
static const char *check_guard_bytes(uint64_t bytes, const char **expect)
{
    return bytes > PS_GUARD_MAX ? "larger than 1MiB" : NULL;
}

/* ---- the rows ------------------------------------------------------------ */
#define PS_FIELD(type, member, factor) {offsetof(type, member), sizeof(((type *)0)->member), factor}
#define PS_IN_POOL(member) .pool = PS_FIELD(ps_pool_options_t, member, 1),
#define PS_IN_POOL_SCALED(member, factor) .pool = PS_FIELD(ps_pool_options_t, member, factor),
#define PS_IN_ARENA(member) .arena = PS_FIELD(ps_arena_options_t, member, 1),
#define PS_IN_FIXED_SIZE(member) .fixed_size = PS_FIELD(ps_fixed_size_options_t, member, 1),
#define PS_NOWHERE

const ps_key_info_t ps_key_info[PS_KEY_COUNT] = {
#define PS_RESOURCE_KEY(id, name_, types_, kind_, nonzero_, max_, lands, default_, shown_, expect_, help_) \
    [PS_KEY_##id] = {.name = name_, .types = types_, .kind = PS_VALUE_##kind_, .nonzero = nonzero_,    \
                     .max = max_, lands.default_value = default_, .shown = shown_, .expect = expect_,  \
                     .help = help_},
#include "keys.def"
};

#define PS_SETTING_ROW(prefix, id, name_, kind_, member, default_, max_, words_, why_, check_, env_, shown_,  \
                       expect_, help_)                                                                       \
    [prefix##id] = {.name = name_, .kind = PS_VALUE_##kind_, .field = PS_FIELD(ps_global_config_t, member, 1), \
                    .default_value = (uint64_t)(default_), .max = max_, .words = words_, .why = why_,         \
                    .check = check_, .env = env_, .shown = shown_, .expect = expect_, .help = help_},

static const ps_setting_info_t global_keys[PS_GKEY_COUNT] = {
#define PS_GLOBAL_KEY(...) PS_SETTING_ROW(PS_GKEY_, __VA_ARGS__)
#include "keys.def"
};
static const ps_setting_info_t host_keys[PS_HKEY_COUNT] = {
#define PS_HOST_KEY(...) PS_SETTING_ROW(PS_HKEY_, __VA_ARGS__)
#include "keys.def"
};
static const ps_setting_info_t debug_keys[PS_DKEY_COUNT] = {
#define PS_DEBUG_KEY(...) PS_SETTING_ROW(PS_DKEY_, __VA_ARGS__)
#include "keys.def"
};

const ps_section_info_t ps_sections[PS_SECTION_COUNT] = {
    [PS_SECTION_GLOBAL] = {"global", global_keys, ps_global_key_names, PS_GKEY_COUNT},
    [PS_SECTION_HOST] = {"host", host_keys, ps_host_key_names, PS_HKEY_COUNT},
    [PS_SECTION_DEBUG] = {"debug", debug_keys, ps_debug_key_names, PS_DKEY_COUNT},
};
