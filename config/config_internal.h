/* Internals shared by the files of config/ (not part of the contract the
 * shim consumes; config.h is).
 *
 *   keys.def          every key, one row each: name, section and types,
 *                     kind, bounds, default, short form, help, field
 *   parse.c           value parsers: sizes, percentages, booleans, integers,
 *                     enum words, file-name patterns; nearest-word suggestions
 *   keys.c            the schema made from keys.def: names, which keys a type
 *                     takes, each key's row; the checks only one key has
 *   store.c           the settings store (every raw value with its origin),
 *                     allocation helpers, interned strings, the error list
 *   source_ini.c      an INI file (or default.ini) into the store, over libinih
 *   source_options.c  POOLSHIM_OPTIONS into the store
 *   validate.c        the store -> [global], resource and device definitions,
 *                     checking every key and size (collects every error)
 *   resolve.c         names -> definitions, required references, cycles
 *   config.c          ps_config_load: the sources in their order, the short
 *                     environment forms (embeds default.ini)
 *   build.c           ps_config_build_stack: definitions -> resources, bottom-up
 *   print.c           ps_config_print: the effective stack as a tree with origins
 *   doc.c             docs/config.md's key tables, from keys.def
 */
#ifndef PS_CONFIG_INTERNAL_H
#define PS_CONFIG_INTERNAL_H

#include <stdint.h>

#include "../core/adaptors.h"
#include "../core/arena.h"
#include "../core/binning.h"
#include "../core/fixed_size.h"
#include "../core/upstream.h"
#include "config.h"

/* ---- origins ------------------------------------------------------------ */
typedef enum ps_origin_kind {
    PS_ORIGIN_NONE = 0, /* not set anywhere: the built-in default of the key */
    PS_ORIGIN_EMBEDDED, /* the embedded config/default.ini, at `line` */
    PS_ORIGIN_FILE,     /* a user INI file `source`, at `line` */
    PS_ORIGIN_ENV       /* environment variable `source` (item `line` of POOLSHIM_OPTIONS, else 0) */
} ps_origin_kind_t;

typedef struct ps_origin {
    ps_origin_kind_t kind; /* where the value came from */
    const char *source;    /* file path or variable name (owned by the config), or NULL */
    int line;              /* line in the file, item of POOLSHIM_OPTIONS, or 0 */
} ps_origin_t;

/* Formats an origin: "default", "default.ini:4", "x.ini:12",
 * "POOLSHIM_OPTIONS item 2", "POOLSHIM_STATS". Returns buf. */
char *ps_origin_format(const ps_origin_t *origin, char *buf, size_t size);

/* Layers, in order of precedence (a later layer wins). */
enum {
    PS_LAYER_EMBEDDED = 0, /* config/default.ini */
    PS_LAYER_FILE = 1,     /* POOLSHIM_CONFIG or the XDG file */
    PS_LAYER_OPTIONS = 2,  /* POOLSHIM_OPTIONS */
    PS_LAYER_SHORT = 3     /* POOLSHIM_RESOURCE, POOLSHIM_STATS, ... */
};

/* ---- value parsers (parse.c) -------------------------------------------- */
/* Sizes: "4096", "64KiB", "1.5 G", "50%". On failure returns PS_EINVAL and
 * writes why (without the value) into `why`. With allow_percent == 0 a
 * percentage is an error. *is_percent tells which of bytes/percent is set. */
int ps_parse_size_ex(const char *text, int allow_percent, uint64_t *bytes, double *percent,
                     int *is_percent, char *why, size_t why_size);
/* Non-negative decimal integer no larger than max. */
int ps_parse_uint(const char *text, uint64_t max, uint64_t *value, char *why, size_t why_size);
/* Index of `text` in the NULL-terminated `words`, case-insensitive, or -1. */
int ps_parse_word(const char *text, const char *const *words);
/* Checks a file-name pattern: only %p, %r, %j, %s, %h, %d (when allow_device) and %%. */
int ps_check_path_pattern(const char *pattern, int allow_device, char *why, size_t why_size);
/* ps_expand_path with the environment read through `lookup` (NULL = getenv). */
typedef const char *(*ps_env_lookup_t)(void *ctx, const char *name);
int ps_expand_path_env(const char *pattern, int device, ps_env_lookup_t lookup, void *ctx,
                       char *out, size_t outsize);
/* ps_job_place with the environment read through `lookup` (NULL = getenv). */
void ps_job_place_env(ps_env_lookup_t lookup, void *ctx, ps_job_place_t *out);

/* Nearest word to `text` among `words` (NULL-terminated), or NULL when none
 * is close. Edit distance, where a prefix of a candidate also counts (so
 * "intial" finds "initial_size"). */
const char *ps_nearest_word(const char *text, const char *const *words);
/* The word of `words` at the smallest edit distance from text, however far. */
const char *ps_closest_word(const char *text, const char *const *words);

/* Lower-case copy helpers and trimming used by the parsers. */
char *ps_trim_blanks(char *s);

/* ---- resource types and keys -------------------------------------------- */
typedef enum ps_resource_type {
    PS_TYPE_POOL = 0,
    PS_TYPE_ARENA,
    PS_TYPE_FIXED_SIZE,
    PS_TYPE_BINNING,
    PS_TYPE_CUDA,
    PS_TYPE_ASYNC,
    PS_TYPE_MANAGED,
    PS_TYPE_LIMIT,
    PS_TYPE_STATS,
    PS_TYPE_TRACK,
    PS_TYPE_LOG,
    PS_TYPE_COUNT
} ps_resource_type_t;

extern const char *const ps_type_names[PS_TYPE_COUNT + 1]; /* NULL-terminated */

/* The types that take a key (the `types` of its row in config/keys.def). */
#define PS_T(type) (1u << PS_TYPE_##type)
#define PS_T_SUBALLOCATORS (PS_T(POOL) | PS_T(ARENA) | PS_T(FIXED_SIZE))
#define PS_T_ADAPTORS (PS_T(LIMIT) | PS_T(STATS) | PS_T(TRACK) | PS_T(LOG))
#define PS_T_ALL ((1u << PS_TYPE_COUNT) - 1)

/* The keys of [resource.NAME], in the order of config/keys.def. */
typedef enum ps_key {
#define PS_RESOURCE_KEY(id, ...) PS_KEY_##id,
#include "keys.def"
    PS_KEY_COUNT
} ps_key_t;

extern const char *const ps_key_names[PS_KEY_COUNT + 1]; /* NULL-terminated */

/* ---- keys.c: the schema, from config/keys.def --------------------------- */
/* A set of resource keys: bit i = ps_key_t i. */
typedef uint64_t ps_key_mask_t;
#define PS_KEY_BIT(k) ((ps_key_mask_t)1 << (k))
_Static_assert(PS_KEY_COUNT <= 64, "ps_key_mask_t has one bit per resource key: more keys need a wider mask");
/* Which keys a type accepts. */
ps_key_mask_t ps_type_keys(ps_resource_type_t type);
/* Leaves take memory from the device and have no upstream. */
int ps_type_is_leaf(ps_resource_type_t type);
/* Adaptors wrap an upstream they must be given. */
int ps_type_is_adaptor(ps_resource_type_t type);

/* How a key's text is read (config/keys.def says which key takes what). */
typedef enum ps_value_kind {
    PS_VALUE_NAME,           /* a resource name */
    PS_VALUE_SIZE,           /* bytes */
    PS_VALUE_SIZE_PCT,       /* bytes or % of device memory */
    PS_VALUE_ALIGN,          /* bytes, a power of two >= 256 */
    PS_VALUE_NUMBER,         /* whole number up to the key's max */
    PS_VALUE_FREE_SYNC,      /* event|device|none|barrier */
    PS_VALUE_BINS,           /* list of SIZE or NAME:SIZE */
    PS_VALUE_PATH,           /* file-name pattern with %p %r %d */
    PS_VALUE_THRESHOLD,      /* size, % or max */
    PS_VALUE_TYPE,           /* a type name */
    PS_VALUE_PATH_NO_DEVICE, /* file-name pattern with %p %r */
    PS_VALUE_BOOL,           /* 1/0, true/false, yes/no, on/off */
    PS_VALUE_BOOL_AUTO,      /* a boolean that may stay unset (-1: decided at run time) */
    PS_VALUE_WORD,           /* one of the key's words (the value: its index) */
    PS_VALUE_WORD_OR_NUMBER, /* one of the words, or an index up to max */
    PS_VALUE_WORD_OR_BOOL    /* one of the words, or a boolean (words 0 and 1) */
} ps_value_kind_t;

/* Where a value lands in a struct. */
typedef struct ps_field {
    uint32_t offset; /* offsetof the field */
    uint32_t size;   /* sizeof the field (a number: 4 or 8; a file name: its array); 0 = nowhere */
    uint32_t scale;  /* the field holds the value times this (epoch_wait_us -> epoch_wait_ns) */
} ps_field_t;
/* Stores `value` times field->scale into that field of `base`. */
void ps_field_store(void *base, const ps_field_t *field, uint64_t value);
/* The value in that field of `base`, divided by field->scale; a 4-byte
 * field is read signed (-1 stays -1). */
uint64_t ps_field_load(const void *base, const ps_field_t *field);

/* What a resource key accepts: one row of config/keys.def. */
typedef struct ps_key_info {
    const char *name;       /* the key */
    uint32_t types;         /* PS_T() of the types that take it */
    ps_value_kind_t kind;   /* how to read it */
    int nonzero;            /* 1: zero is not allowed */
    uint64_t max;           /* PS_VALUE_NUMBER: the largest value */
    ps_field_t pool;        /* where it lands in ps_pool_options_t (size 0: nowhere) */
    ps_field_t arena;       /* ... in ps_arena_options_t */
    ps_field_t fixed_size;  /* ... in ps_fixed_size_options_t */
    uint64_t default_value; /* the value of an unset key */
    const char *shown;      /* how a value prints where the number says too little (keys.def) */
    const char *expect;     /* what a good value looks like, for messages */
    const char *help;       /* one line for the docs */
} ps_key_info_t;

extern const ps_key_info_t ps_key_info[PS_KEY_COUNT]; /* by ps_key_t */
/* Where key `key` lands in the options of `type` (pool, arena, fixed_size), or NULL. */
const ps_field_t *ps_key_field(int key, ps_resource_type_t type);

/* The words of the enumerated values (NULL-terminated, index = enum value). */
extern const char *const ps_free_sync_words[];  /* ps_free_sync_t */
extern const char *const ps_verbosity_words[];  /* [global] verbosity 0-3 */
extern const char *const ps_stats_words[];      /* ps_stats_mode_t */
extern const char *const ps_meminfo_words[];    /* ps_meminfo_t */
extern const char *const ps_on_error_words[];   /* ps_on_error_t */
extern const char *const ps_no_yes_words[];     /* how a boolean prints: no, yes */
extern const char *const ps_off_on_words[];     /* ... or off, on */
/* What a boolean accepts, in the words of "bad value" messages. */
#define PS_EXPECT_BOOL "1, true, yes, on, 0, false, no or off"

/* The sections of process-wide settings; their keys land in ps_global_config_t. */
typedef enum ps_section {
    PS_SECTION_GLOBAL = 0, /* [global] */
    PS_SECTION_HOST,       /* [host] */
    PS_SECTION_DEBUG,      /* [debug] */
    PS_SECTION_COUNT
} ps_section_t;

/* A key's own check beyond its kind: returns why `value` is refused (NULL:
 * it is fine), and may point *expect at another expected text. */
typedef const char *(*ps_check_t)(uint64_t value, const char **expect);

/* What a key of [global], [host] or [debug] accepts: one row of keys.def. */
typedef struct ps_setting_info {
    const char *name;          /* the key */
    ps_value_kind_t kind;      /* how to read it */
    ps_field_t field;          /* where it lands in ps_global_config_t */
    uint64_t default_value;    /* when no source sets it ((uint64_t)-1: an unset BOOL_AUTO) */
    uint64_t max;              /* NUMBER, WORD_OR_NUMBER: the largest number */
    const char *const *words;  /* word kinds: the words; BOOL: how 0 and 1 print */
    const char *why;           /* a value that is none of the words: the reason */
    ps_check_t check;          /* NULL, or the key's own check */
    const char *env;           /* its short form (POOLSHIM_*), or NULL */
    const char *shown;         /* how the special value prints (keys.def) */
    const char *expect;        /* what a good value looks like, for messages */
    const char *help;          /* one line for the docs */
} ps_setting_info_t;

/* One section: its name and its rows. */
typedef struct ps_section_info {
    const char *name;              /* "global", "host", "debug" */
    const ps_setting_info_t *keys; /* its rows, by key */
    const char *const *names;      /* the keys' names, NULL-terminated */
    int count;                     /* rows */
} ps_section_info_t;

extern const ps_section_info_t ps_sections[PS_SECTION_COUNT];

/* One parsed value of a resource key. */
typedef struct ps_value {
    int set;            /* 1 when some source set it */
    ps_origin_t origin; /* where */
    const char *text;   /* the raw text (owned by the config) */
    uint64_t number;    /* bytes / count / enum index */
    double percent;     /* when is_percent: percent of the device's total memory */
    int is_percent;     /* 1: `percent` holds the value, resolved at build time */
} ps_value_t;

/* One bin of a binning resource. */
typedef struct ps_bin_def {
    uint64_t max_size; /* requests up to this many bytes */
    int resource;      /* index of the named resource serving it, or -1: an implicit fixed_size */
    char *name;        /* the name as written ("" for implicit bins) */
} ps_bin_def_t;

/* A resource as the config describes it (validated). */
typedef struct ps_resource_def {
    char *name;                   /* the NAME of [resource.NAME] */
    ps_resource_type_t type;      /* its type */
    int predefined;               /* 1: cuda/async/managed that need no section */
    ps_origin_t origin;           /* where it was first defined */
    ps_value_t values[PS_KEY_COUNT]; /* every key, set or not */
    int upstream;                 /* index of the upstream def, or -1 */
    int fallback;                 /* binning: index of the fallback def, or -1 */
    ps_bin_def_t *bins;           /* binning: the bins, sorted */
    size_t bin_count;             /* entries in bins */
} ps_resource_def_t;

/* One [device.N] or [device.*] section. */
typedef struct ps_device_def {
    int device;         /* N, or -1 for [device.*] */
    int resource;       /* index of the def, or -1 when the name is unknown */
    ps_origin_t origin; /* where `resource =` was set */
} ps_device_def_t;

/* A raw setting as read from a source. */
typedef struct ps_setting {
    char *section;      /* "global", "resource.main", "device.0" */
    char *key;          /* "initial_size" */
    char *value;        /* the text after '=', trimmed */
    ps_origin_t origin; /* where */
    int layer;          /* PS_LAYER_* */
} ps_setting_t;

/* The keys of [global], [host] and [debug], in the order of config/keys.def. */
typedef enum ps_global_key {
#define PS_GLOBAL_KEY(id, ...) PS_GKEY_##id,
#include "keys.def"
    PS_GKEY_COUNT
} ps_global_key_t;
typedef enum ps_host_key {
#define PS_HOST_KEY(id, ...) PS_HKEY_##id,
#include "keys.def"
    PS_HKEY_COUNT
} ps_host_key_t;
typedef enum ps_debug_key {
#define PS_DEBUG_KEY(id, ...) PS_DKEY_##id,
#include "keys.def"
    PS_DKEY_COUNT
} ps_debug_key_t;
extern const char *const ps_global_key_names[PS_GKEY_COUNT + 1]; /* NULL-terminated */
extern const char *const ps_host_key_names[PS_HKEY_COUNT + 1];
extern const char *const ps_debug_key_names[PS_DKEY_COUNT + 1];

struct ps_config {
    ps_global_config_t global;           /* the validated [global] */
    ps_origin_t global_origin[PS_GKEY_COUNT]; /* where each [global] value came from */
    ps_origin_t host_origin[PS_HKEY_COUNT];   /* ... each [host] value */
    ps_origin_t debug_origin[PS_DKEY_COUNT];  /* ... each [debug] value */
    ps_setting_t *settings;              /* raw settings, merged (one per section+key) */
    size_t setting_count, setting_cap;   /* entries used / allocated */
    ps_resource_def_t *defs;             /* resources */
    size_t def_count, def_cap;           /* entries used / allocated */
    ps_device_def_t *devices;            /* device sections */
    size_t device_count, device_cap;     /* entries used / allocated */
    char **errors;                       /* "WHERE: MESSAGE" */
    uint64_t *error_order;               /* per error: source kind and line, to sort them */
    size_t error_count, error_cap;       /* entries used / allocated */
    ps_setting_t *headers;               /* every [section] header of the files (key and value "") */
    size_t header_count, header_cap;     /* entries used / allocated */
    char **strings;                      /* interned strings (origins' sources) */
    size_t string_count, string_cap;     /* entries used / allocated */
    char *file_path;                     /* the user file read, or NULL */
    char **warnings;                     /* "MESSAGE" (unknown POOLSHIM_* variables, a bad disable) */
    size_t warning_count;                /* entries used */
    int out_of_memory;                   /* 1: an allocation failed while loading */
};

/* Where each value of `section` came from, by key (unset: PS_ORIGIN_NONE). */
static inline ps_origin_t *ps_section_origins(ps_config_t *cfg, ps_section_t section)
{
    return section == PS_SECTION_HOST ? cfg->host_origin : section == PS_SECTION_DEBUG ? cfg->debug_origin
                                                                                      : cfg->global_origin;
}

/* ---- config.c ---------------------------------------------------------- */
/* ps_config_load with INI text standing for the user file, shown as `name`
 * in messages (tests, fuzzing); `in` supplies options and environment. */
int ps_config_load_text(const char *text, const char *name, const ps_config_input_t *in,
                        ps_config_t **out);

/* ---- store.c -------------------------------------------------------------- */
/* Grows `array` (of `elem`-byte entries, *cap allocated) so that entry
 * `count` fits; returns the array (maybe moved, *cap updated), or NULL with
 * cfg->out_of_memory set and the old array untouched. */
void *ps_config_grow(ps_config_t *cfg, void *array, size_t *cap, size_t count, size_t elem);
/* strdup (NULL counts as ""); NULL with cfg->out_of_memory set on failure. */
char *ps_config_strdup(ps_config_t *cfg, const char *s);
/* Records an error "WHERE: MESSAGE" (WHERE from origin; NULL = no place). */
void ps_config_add_error(ps_config_t *cfg, const ps_origin_t *origin, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Records a warning "MESSAGE" (printed as "poolshim: warning: MESSAGE"). */
void ps_config_add_warning(ps_config_t *cfg, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Keeps a copy of s for the life of the config. */
const char *ps_config_intern(ps_config_t *cfg, const char *s);
/* Sets one value in the store; a later layer replaces an earlier one. */
void ps_config_set(ps_config_t *cfg, const char *section, const char *key, const char *value,
                   const ps_origin_t *origin, int layer);
/* Finds a raw setting, or NULL. */
const ps_setting_t *ps_config_find(const ps_config_t *cfg, const char *section, const char *key);
/* Where section `section` was opened: its header in the most important
 * source that has one, else `fallback`. */
const ps_origin_t *ps_config_section_origin(const ps_config_t *cfg, const char *section,
                                            const ps_origin_t *fallback);

/* ---- source_ini.c --------------------------------------------------------- */
/* Reads `len` bytes of INI text into the store at `layer`; origin.kind
 * and origin.source say which file it is. Syntax errors are recorded; a
 * NUL byte inside the text is one (file:line), never the end of the text. */
void ps_config_read_ini(ps_config_t *cfg, const char *text, size_t len, ps_origin_kind_t kind,
                        const char *source, int layer);

/* ---- source_options.c ----------------------------------------------------- */
/* Reads POOLSHIM_OPTIONS text into the store (layer OPTIONS). */
void ps_config_read_options(ps_config_t *cfg, const char *text);

/* ---- resolve.c ------------------------------------------------------------ */
/* Index of a def by name, or -1. */
int ps_config_def_index(const ps_config_t *cfg, const char *name);
/* The def serving `device` ([device.N], else [device.*]), or NULL. */
const ps_device_def_t *ps_config_device(const ps_config_t *cfg, int device);
/* Resolves upstream, fallback and bin names into def indices and reports
 * missing names and the references a type needs but lacks. */
void ps_config_resolve_references(ps_config_t *cfg);
/* Reports every cycle of the resource graph (upstream, fallback, bins). */
void ps_config_find_cycles(ps_config_t *cfg);

/* ---- validate.c ----------------------------------------------------------- */
/* Turns the merged store into global + defs + devices, recording every error. */
void ps_config_validate(ps_config_t *cfg);
/* A size value resolved against the device's total memory. */
uint64_t ps_value_bytes(const ps_value_t *v, uint64_t total_bytes);

/* Checks limit adaptors against the initial sizes of pools/arenas in the
 * same chain. With total_bytes == 0 (loading) it compares values of one
 * kind (bytes with bytes, % with %); with the device's total (building) it
 * compares the mixed ones. `only` (NULL = all) marks the limits to check,
 * by def index. Each problem goes to report(); returns how many. */
typedef void (*ps_config_report_t)(void *ctx, const ps_origin_t *origin, const char *message);
int ps_config_check_limits(const ps_config_t *cfg, uint64_t total_bytes, const char *only,
                           ps_config_report_t report, void *ctx);

/* ---- build.c ------------------------------------------------------------- */
/* The constructors the builder calls: the core's by default; tests
 * substitute fakes to watch the order and the options. */
typedef struct ps_config_constructors {
    int (*pool)(const char *name, ps_resource_t *upstream, const ps_gpu_ops_t *gpu,
                const ps_pool_options_t *opts, ps_resource_t **out);
    int (*arena)(const char *name, ps_resource_t *upstream, const ps_gpu_ops_t *gpu,
                 const ps_arena_options_t *opts, ps_resource_t **out);
    int (*fixed_size)(const char *name, ps_resource_t *upstream, const ps_gpu_ops_t *gpu,
                      const ps_fixed_size_options_t *opts, ps_resource_t **out);
    int (*binning)(const char *name, const ps_bin_t *bins, size_t bin_count,
                   ps_resource_t *fallback, ps_resource_t **out);
    int (*cuda)(const char *name, const ps_gpu_ops_t *gpu, ps_resource_t **out);
    int (*async)(const char *name, const ps_gpu_ops_t *gpu, uint64_t release_threshold,
                 ps_resource_t **out);
    int (*managed)(const char *name, const ps_gpu_ops_t *gpu, ps_resource_t **out);
    int (*limit)(const char *name, ps_resource_t *upstream, size_t limit_bytes,
                 ps_resource_t **out);
    int (*stats)(const char *name, ps_resource_t *upstream, ps_resource_t **out);
    int (*track)(const char *name, ps_resource_t *upstream, unsigned stack_depth,
                 ps_resource_t **out);
    int (*log)(const char *name, ps_resource_t *upstream, const char *path, ps_resource_t **out);
    /* debug.guard; NULL in a test's table: the core's ps_guard_create */
    int (*guard)(const char *name, ps_resource_t *upstream, const ps_gpu_ops_t *gpu, size_t bytes,
                 ps_resource_t *track, ps_resource_t **out);
} ps_config_constructors_t;

extern const ps_config_constructors_t ps_core_constructors;

int ps_config_build_stack_with(const ps_config_t *cfg, int device, const ps_gpu_ops_t *gpu,
                               const ps_config_constructors_t *ctors, ps_stack_t **out);

/* Options of a pool/arena/fixed_size def with the defaults filled in and
 * percentages resolved against total_bytes (0 = leave percentages as 0). */
void ps_config_pool_options(const ps_config_t *cfg, const ps_resource_def_t *def,
                            uint64_t total_bytes, ps_pool_options_t *opts);
void ps_config_arena_options(const ps_config_t *cfg, const ps_resource_def_t *def,
                             uint64_t total_bytes, ps_arena_options_t *opts);
void ps_config_fixed_size_options(const ps_config_t *cfg, const ps_resource_def_t *def,
                                  ps_fixed_size_options_t *opts);

/* ---- print.c ------------------------------------------------------------- */
/* The text of `value`, a value of a key of `kind` (config/keys.def): its
 * word, size, number or file name (`text`), with `shown` for the special
 * value or around every value. doc = 1: sizes as docs/config.md writes
 * them (2MiB), else as `poolshim config` prints them (2.00 MiB). Returns buf. */
char *ps_value_text(ps_value_kind_t kind, uint64_t value, const char *text, const char *const *words,
                    const char *shown, int doc, char *buf, size_t size);

/* ---- doc.c --------------------------------------------------------------- */
/* A key's default as docs/config.md's tables write it ("`2MiB`", "`0` (off)",
 * "none"). */
char *ps_doc_setting_default(const ps_setting_info_t *info, char *buf, size_t size);
char *ps_doc_key_default(const ps_key_info_t *info, char *buf, size_t size);
/* The table of every resource key, as docs/config.md holds it between its
 * PS_DOC_BEGIN and PS_DOC_END lines (test_config_keys.c compares them). */
void ps_doc_resource_table(FILE *f);
#define PS_DOC_BEGIN "<!-- generated from config/keys.def by `make config-doc`: do not edit by hand -->"
#define PS_DOC_END "<!-- end of the generated table -->"
/* Every key table of docs/config.md from keys.def: [global], [host] and
 * [debug] (key, default, short form, one-line help) and the resource keys. */
void ps_doc_tables(FILE *f);

/* ---- fuzz_entry.c ----------------------------------------------------------- */
/* What the libFuzzer targets and the corpus replay test run; return 0, or
 * trap when an invariant breaks. */
int ps_config_fuzz_ini(const uint8_t *data, size_t size);
int ps_config_fuzz_size(const uint8_t *data, size_t size);

#endif
