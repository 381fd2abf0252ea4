/* The schema of the configuration: the names of the resource types, of
 * their keys and of the [global] keys; which keys each type accepts; how
 * each key's text is read and what a good value looks like (the words
 * of the messages). The tables only; validate.c checks values against them.
 */
#include "config_internal.h"

/* ---- names ------------------------------------------------------------- */
const char *const ps_type_names[PS_TYPE_COUNT + 1] = {
    "pool", "arena", "fixed_size", "binning", "cuda", "async", "managed",
    "limit", "stats", "track", "log", NULL};

const char *const ps_key_names[PS_KEY_COUNT + 1] = {
    "type", "upstream", "initial_size", "maximum_size", "min_chunk", "max_chunk",
    "growth_percent", "alignment", "free_sync", "epoch_wait_us", "superblock_size",
    "block_size", "blocks_per_batch", "bins", "fallback", "release_threshold", "limit",
    "stack_depth", "file", "expandable", "expandable_reserve", "expandable_piece", "expandable_run_min",
    "barrier_pending_percent",
    "small_from_back", "thread_cache", "remap", "remap_turnover_percent", "remap_slack_percent", "remap_lend", "barrier_floor", "thread_floor", NULL};

const char *const ps_global_key_names[PS_GKEY_COUNT + 1] = {
    "verbosity", "stats", "stats_file", "log_file", "free_sync", "meminfo", "on_error",
    "direct_min_size", "disable", "ipc", "oom_retry", "decay_ms", "neighbour_release", "neighbour_wait_ms", NULL};

const char *const ps_host_key_names[PS_HKEY_COUNT + 1] = {
    "enable", "min_chunk", "max_chunk", "growth_percent", "maximum_size", "pending_wait_bytes",
    "pending_wait_percent", "free_sync", "epoch_wait_us", "release_before_grow", "limit", "track", "stack_depth", "log_file", "expandable",
    "expandable_piece", "grow_budget_percent", "grow_budget_min", NULL};

const char *const ps_debug_key_names[PS_DKEY_COUNT + 1] = {"nvtx", "guard", "nvtx_ranges", NULL};

const char *const ps_free_sync_words[] = {"event", "device", "none", "barrier", NULL};
const char *const ps_verbosity_words[] = {"error", "warning", "info", "debug", NULL};
const char *const ps_stats_words[] = {"off", "text", "json", NULL};
const char *const ps_meminfo_words[] = {"pool", "device", NULL};
const char *const ps_on_error_words[] = {"exit", "passthrough", NULL};

/* ---- which keys a type takes ------------------------------------------- */
uint32_t ps_type_keys(ps_resource_type_t type)
{
    /* the keys every suballocator takes */
    const uint32_t sub = PS_KEY_BIT(PS_KEY_TYPE) | PS_KEY_BIT(PS_KEY_UPSTREAM) |
                         PS_KEY_BIT(PS_KEY_ALIGNMENT) | PS_KEY_BIT(PS_KEY_FREE_SYNC);
    const uint32_t adaptor = PS_KEY_BIT(PS_KEY_TYPE) | PS_KEY_BIT(PS_KEY_UPSTREAM);
    switch (type) {
    case PS_TYPE_POOL:
        return sub | PS_KEY_BIT(PS_KEY_INITIAL_SIZE) | PS_KEY_BIT(PS_KEY_MAXIMUM_SIZE) |
               PS_KEY_BIT(PS_KEY_MIN_CHUNK) | PS_KEY_BIT(PS_KEY_MAX_CHUNK) |
               PS_KEY_BIT(PS_KEY_GROWTH_PERCENT) | PS_KEY_BIT(PS_KEY_EPOCH_WAIT_US) |
               PS_KEY_BIT(PS_KEY_EXPANDABLE) | PS_KEY_BIT(PS_KEY_EXPANDABLE_RESERVE) |
               PS_KEY_BIT(PS_KEY_EXPANDABLE_PIECE) | PS_KEY_BIT(PS_KEY_EXPANDABLE_RUN_MIN) |
               PS_KEY_BIT(PS_KEY_BARRIER_PENDING_PERCENT) |
               PS_KEY_BIT(PS_KEY_SMALL_FROM_BACK) | PS_KEY_BIT(PS_KEY_RELEASE_THRESHOLD) |
               PS_KEY_BIT(PS_KEY_THREAD_CACHE) | PS_KEY_BIT(PS_KEY_REMAP) |
               PS_KEY_BIT(PS_KEY_REMAP_TURNOVER_PERCENT) | PS_KEY_BIT(PS_KEY_REMAP_SLACK_PERCENT) | PS_KEY_BIT(PS_KEY_REMAP_LEND) |
               PS_KEY_BIT(PS_KEY_BARRIER_FLOOR);
    case PS_TYPE_ARENA:
        return sub | PS_KEY_BIT(PS_KEY_INITIAL_SIZE) | PS_KEY_BIT(PS_KEY_MAXIMUM_SIZE) |
               PS_KEY_BIT(PS_KEY_SUPERBLOCK_SIZE) | PS_KEY_BIT(PS_KEY_THREAD_FLOOR);
    case PS_TYPE_FIXED_SIZE:
        return sub | PS_KEY_BIT(PS_KEY_BLOCK_SIZE) | PS_KEY_BIT(PS_KEY_BLOCKS_PER_BATCH);
    case PS_TYPE_BINNING:
        return PS_KEY_BIT(PS_KEY_TYPE) | PS_KEY_BIT(PS_KEY_UPSTREAM) | PS_KEY_BIT(PS_KEY_BINS) |
               PS_KEY_BIT(PS_KEY_FALLBACK) | PS_KEY_BIT(PS_KEY_BLOCKS_PER_BATCH) |
               PS_KEY_BIT(PS_KEY_FREE_SYNC);
    case PS_TYPE_CUDA:
    case PS_TYPE_MANAGED: return PS_KEY_BIT(PS_KEY_TYPE);
    case PS_TYPE_ASYNC: return PS_KEY_BIT(PS_KEY_TYPE) | PS_KEY_BIT(PS_KEY_RELEASE_THRESHOLD);
    case PS_TYPE_LIMIT: return adaptor | PS_KEY_BIT(PS_KEY_LIMIT);
    case PS_TYPE_STATS: return adaptor;
    case PS_TYPE_TRACK: return adaptor | PS_KEY_BIT(PS_KEY_STACK_DEPTH);
    case PS_TYPE_LOG: return adaptor | PS_KEY_BIT(PS_KEY_FILE);
    default: return 0;
    }
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

/* ---- how each key is read ---------------------------------------------- */
_Static_assert(PS_KEY_COUNT <= 32, "ps_type_keys' mask is a uint32_t: a 33rd key needs a wider one");

const ps_key_info_t ps_key_info[PS_KEY_COUNT] = {
    [PS_KEY_TYPE] = {PS_VALUE_TYPE, 0, 0, "pool, arena, fixed_size, binning, cuda, async, managed, limit, stats, track or log"},
    [PS_KEY_UPSTREAM] = {PS_VALUE_NAME, 0, 0, "the NAME of a [resource.NAME] section, or cuda, async, managed"},
    [PS_KEY_INITIAL_SIZE] = {PS_VALUE_SIZE_PCT, 0, 0, "a size such as 1GiB, or a percentage of device memory such as 50%"},
    [PS_KEY_MAXIMUM_SIZE] = {PS_VALUE_SIZE_PCT, 0, 0, "a size such as 64GiB, or a percentage of device memory such as 90%; 0 = no cap"},
    [PS_KEY_MIN_CHUNK] = {PS_VALUE_SIZE, 1, 0, "a size above zero such as 32MiB"},
    [PS_KEY_MAX_CHUNK] = {PS_VALUE_SIZE, 1, 0, "a size above zero such as 1GiB"},
    [PS_KEY_GROWTH_PERCENT] = {PS_VALUE_NUMBER, 0, 1000, "a whole number of percent from 0 to 1000"},
    [PS_KEY_ALIGNMENT] = {PS_VALUE_ALIGN, 1, 0, "a power of two of at least 256 bytes"},
    [PS_KEY_FREE_SYNC] = {PS_VALUE_FREE_SYNC, 0, 0, "barrier, event, device or none"},
    [PS_KEY_EPOCH_WAIT_US] = {PS_VALUE_NUMBER, 0, 10000000, "a whole number of microseconds from 0 to 10000000"},
    [PS_KEY_SUPERBLOCK_SIZE] = {PS_VALUE_SIZE, 1, 0, "a size above zero such as 2MiB"},
    [PS_KEY_BLOCK_SIZE] = {PS_VALUE_SIZE, 1, 0, "a size above zero such as 4KiB"},
    [PS_KEY_BLOCKS_PER_BATCH] = {PS_VALUE_NUMBER, 1, 1u << 24, "a whole number from 1 to 16777216"},
    [PS_KEY_BINS] = {PS_VALUE_BINS, 1, 0, "a comma list of sizes (256, 1KiB, 4KiB) or NAME:SIZE pairs"},
    [PS_KEY_FALLBACK] = {PS_VALUE_NAME, 0, 0, "the NAME of a [resource.NAME] section"},
    [PS_KEY_RELEASE_THRESHOLD] = {PS_VALUE_THRESHOLD, 0, 0, "a size, a percentage of device memory, or max"},
    [PS_KEY_LIMIT] = {PS_VALUE_SIZE_PCT, 1, 0, "a size above zero such as 8GiB, or a percentage of device memory such as 50%"},
    [PS_KEY_STACK_DEPTH] = {PS_VALUE_NUMBER, 0, 64, "a whole number of frames from 0 to 64"},
    [PS_KEY_FILE] = {PS_VALUE_PATH, 1, 0, "a file name; %p = pid, %r = rank, %d = device, %% = %"},
    [PS_KEY_EXPANDABLE] = {PS_VALUE_NUMBER, 0, 1, "1 (one virtual-memory range, when the device has it) or 0 (chunks)"},
    [PS_KEY_EXPANDABLE_RESERVE] = {PS_VALUE_SIZE, 0, 0, "a size of address space such as 256GiB; 0 = twice the device"},
    [PS_KEY_EXPANDABLE_PIECE] = {PS_VALUE_SIZE, 1, 0, "a size above zero such as 2MiB (rounded up to the device's granularity)"},
    [PS_KEY_EXPANDABLE_RUN_MIN] = {PS_VALUE_SIZE, 0, 0, "a size such as 1GiB: a growth of at least this many bytes maps one physical allocation (a run); 0 = always piece by piece"},
    [PS_KEY_SMALL_FROM_BACK] = {PS_VALUE_SIZE, 0, 0, "a size such as 1MiB: requests up to it are cut from the back of a free block; 0 = all from the front"},
    [PS_KEY_THREAD_CACHE] = {PS_VALUE_SIZE, 0, 0, "a size such as 1MiB: freed blocks each thread keeps in front of the pool; 0 = off"},
    [PS_KEY_BARRIER_PENDING_PERCENT] = {PS_VALUE_NUMBER, 0, 100, "a whole number of percent from 0 to 100 (0 = a barrier only when nothing fits)"},
    [PS_KEY_REMAP] = {PS_VALUE_NUMBER, 0, 1, "1 (a growth first moves whole free pieces, after a device synchronize) or 0 (off)"},
    [PS_KEY_REMAP_TURNOVER_PERCENT] = {PS_VALUE_NUMBER, 0, 10000, "a whole number of percent from 0 to 10000 (remap only once barriers released that share of reserved bytes since the last)"},
    [PS_KEY_REMAP_SLACK_PERCENT] = {PS_VALUE_NUMBER, 0, 100, "a whole number of percent from 0 to 100 (a remap that would wait for the GPU grows instead while reserved stays within that share above the most bytes in use at a growth; 0 = always wait)"},
    [PS_KEY_REMAP_LEND] = {PS_VALUE_NUMBER, 0, 1, "1 (a remap maps the memory of free pieces a kernel may still use a second time at once, and unmaps the old addresses once they are idle) or 0 (it waits on the host for them first)"},
    [PS_KEY_BARRIER_FLOOR] = {PS_VALUE_SIZE, 0, 0, "a size such as 32MiB: below it the pool grows instead of issuing a barrier; 0 = off"},
    [PS_KEY_THREAD_FLOOR] = {PS_VALUE_SIZE, 0, 0, "a size such as 16MiB: while threads allocate at once, each thread's arena takes new superblocks instead of issuing a barrier until its cudaFree'd bytes reach it; 0 = off"},
};
