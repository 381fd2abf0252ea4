/* ps_config_load: the sources of the configuration, in their order.
 *
 * Steps:
 *   1. the embedded config/default.ini (compiled in as ps_default_ini);
 *   2. the user's INI file: ps_config_input_t.file, else $POOLSHIM_CONFIG,
 *      else $XDG_CONFIG_HOME/poolshim/poolshim.ini (or
 *      $HOME/.config/poolshim/poolshim.ini) when it exists. A file that is
 *      named but cannot be read is an error; ./poolshim.ini is never read
 *      implicitly (a program's working directory should not change how its
 *      memory is managed behind its back);
 *   3. POOLSHIM_OPTIONS="section.key=value,...";
 *   4. the short forms, each of which sets one key: POOLSHIM_RESOURCE (the
 *      type of the resource [device.*] uses), then the `env` of every row
 *      of config/keys.def (POOLSHIM_STATS -> global.stats, POOLSHIM_NVTX ->
 *      debug.nvtx, ...), in the order of the rows;
 *   5. validation (validate.c), which records every error.
 * A later step wins over an earlier one, key by key.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config_internal.h"
#include "default_ini.h"

extern char **environ;

/* Where the short forms and POOLSHIM_* come from. */
typedef struct env_source {
    char *const *environ; /* explicit environment, or NULL */
    int use_process;      /* 1: read the process environment */
} env_source_t;

static const char *env_lookup(void *ctx, const char *name)
{
    const env_source_t *src = ctx;
    char *const *env = src->environ ? src->environ : (src->use_process ? environ : NULL);
    if (!env)
        return NULL;
    size_t len = strlen(name);
    for (size_t i = 0; env[i]; i++)
        if (strncmp(env[i], name, len) == 0 && env[i][len] == '=')
            return env[i] + len + 1;
    return NULL;
}

/* Reads a whole file (its length in *len: it may hold NUL bytes); returns
 * NULL and sets errno on failure. */
static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    struct stat st;
    if (fstat(fileno(f), &st) != 0) {
        int e = errno;
        fclose(f);
        errno = e;
        return NULL;
    }
    if (S_ISDIR(st.st_mode)) {
        fclose(f);
        errno = EISDIR;
        return NULL;
    }
    /* a pipe (/dev/stdin) or a device has no size: read until its end */
    size_t cap = (S_ISREG(st.st_mode) ? (size_t)st.st_size : 0) + 4096, n = 0;
    char *buf = malloc(cap);
    if (!buf) {
        fclose(f);
        errno = ENOMEM;
        return NULL;
    }
    size_t got;
    while ((got = fread(buf + n, 1, cap - 1 - n, f)) > 0) {
        n += got;
        if (n == cap - 1) { /* the file grew since fstat */
            char *bigger = realloc(buf, cap * 2);
            if (!bigger) {
                free(buf);
                fclose(f);
                errno = ENOMEM;
                return NULL;
            }
            buf = bigger;
            cap *= 2;
        }
    }
    int failed = ferror(f);
    fclose(f);
    if (failed) {
        free(buf);
        errno = EIO;
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

/* Picks and reads the user's file. */
static void read_user_file(ps_config_t *cfg, const ps_config_input_t *in, env_source_t *env)
{
    const char *path = in ? in->file : NULL;
    ps_origin_t where = {PS_ORIGIN_FILE, NULL, 0};
    char xdg[PS_PATH_MAX];
    if (path) {
        where.source = ps_config_intern(cfg, path);
    } else if ((path = env_lookup(env, "POOLSHIM_CONFIG")) && *path) {
        where = (ps_origin_t){PS_ORIGIN_ENV, ps_config_intern(cfg, "POOLSHIM_CONFIG"), 0};
    } else {
        const char *base = env_lookup(env, "XDG_CONFIG_HOME");
        const char *home = env_lookup(env, "HOME");
        if (base && *base)
            snprintf(xdg, sizeof xdg, "%s/poolshim/poolshim.ini", base);
        else if (home && *home)
            snprintf(xdg, sizeof xdg, "%s/.config/poolshim/poolshim.ini", home);
        else
            return;
        if (access(xdg, F_OK) != 0)
            return; /* no personal file: fine */
        path = xdg;
        where.source = ps_config_intern(cfg, path);
    }
    size_t len = 0;
    char *text = read_file(path, &len);
    if (!text) {
        if (where.kind == PS_ORIGIN_ENV)
            ps_config_add_error(cfg, &where, "cannot read the configuration file `%s`: %s", path,
                                strerror(errno));
        else
            ps_config_add_error(cfg, &where, "cannot read the configuration file: %s", strerror(errno));
        return;
    }
    cfg->file_path = strdup(path);
    if (!cfg->file_path)
        cfg->out_of_memory = 1;
    ps_config_read_ini(cfg, text, len, PS_ORIGIN_FILE, path, PS_LAYER_FILE);
    free(text);
}

/* POOLSHIM_RESOURCE: the type of the resource [device.*] uses. */
static void read_resource_short_form(ps_config_t *cfg, env_source_t *env)
{
    const char *value = env_lookup(env, "POOLSHIM_RESOURCE");
    if (!value)
        return;
    ps_origin_t o = {PS_ORIGIN_ENV, ps_config_intern(cfg, "POOLSHIM_RESOURCE"), 0};
    const ps_setting_t *dev = ps_config_find(cfg, "device.*", "resource");
    char section[128];
    snprintf(section, sizeof section, "resource.%s", dev ? dev->value : "main");
    ps_config_set(cfg, section, "type", value, &o, PS_LAYER_SHORT);
    if (strcmp(value, "binning") == 0) {
        /* one word must give a working stack: power-of-two bins of
         * fixed_size blocks from 256 B to 64 KiB, a pool for the rest */
        if (!ps_config_find(cfg, section, "bins"))
            ps_config_set(cfg, section, "bins", "256B,512B,1KiB,2KiB,4KiB,8KiB,16KiB,32KiB,64KiB", &o,
                          PS_LAYER_SHORT);
        if (!ps_config_find(cfg, section, "fallback")) {
            ps_config_set(cfg, "resource.binning_fallback", "type", "pool", &o, PS_LAYER_SHORT);
            ps_config_set(cfg, section, "fallback", "binning_fallback", &o, PS_LAYER_SHORT);
        }
    }
}

/* The short forms: POOLSHIM_RESOURCE, then every key of config/keys.def
 * with an `env`, in the order of its rows. */
static void read_short_forms(ps_config_t *cfg, env_source_t *env)
{
    read_resource_short_form(cfg, env);
    for (int section = 0; section < PS_SECTION_COUNT; section++) {
        const ps_section_info_t *sec = &ps_sections[section];
        for (int k = 0; k < sec->count; k++) {
            const char *variable = sec->keys[k].env;
            const char *value = variable ? env_lookup(env, variable) : NULL;
            if (!value)
                continue;
            ps_origin_t o = {PS_ORIGIN_ENV, ps_config_intern(cfg, variable), 0};
            ps_config_set(cfg, sec->name, sec->keys[k].name, value, &o, PS_LAYER_SHORT);
        }
    }
}

/* Room for every POOLSHIM_* variable a user sets: the sources and what the
 * shim and the CLI read (8), at most one short form per key, the NULL. */
#define USER_VARIABLES_MAX (8 + PS_GKEY_COUNT + PS_HKEY_COUNT + PS_DKEY_COUNT + 1)

/* The POOLSHIM_* variables a user sets (the did-you-mean candidates): the
 * sources, the short forms of keys.def, and what the shim and the CLI read
 * beside the configuration. Fills `names` (NULL-terminated). */
static void user_variables(const char *names[USER_VARIABLES_MAX])
{
    static const char *const sources[] = {"POOLSHIM_CONFIG", "POOLSHIM_OPTIONS", "POOLSHIM_RESOURCE", NULL};
    static const char *const others[] = {"POOLSHIM_TRACE_LOOKUPS", "POOLSHIM_LIB", "POOLSHIM_CUPTI_LIB",
                                         "POOLSHIM_CUPTI_OUT", "POOLSHIM_SANITIZER", NULL};
    size_t n = 0;
    for (size_t i = 0; sources[i]; i++)
        names[n++] = sources[i];
    for (int section = 0; section < PS_SECTION_COUNT; section++)
        for (int k = 0; k < ps_sections[section].count; k++)
            if (ps_sections[section].keys[k].env)
                names[n++] = ps_sections[section].keys[k].env;
    for (size_t i = 0; others[i]; i++)
        names[n++] = others[i];
    names[n] = NULL;
}

/* Other POOLSHIM_* variables something in this repository reads: the test
 * harness (make test), the fault-injection tests, the benchmark and GPU
 * scripts. POOLSHIM_TEST_* (test-only switches) are all allowed. */
static const char *const other_variables[] = {
    "POOLSHIM_BUILD", "POOLSHIM_CLI", "POOLSHIM_PRELOAD_PREFIX", "POOLSHIM_FAULTS_SEED",
    "POOLSHIM_FAULTS_VERBOSE", "POOLSHIM_FAULTS_ALL", "POOLSHIM_VARIANTS", "POOLSHIM_TORCH_IPC_CACHE", NULL};

static int is_one_of(const char *name, const char *const *names)
{
    for (size_t i = 0; names[i]; i++)
        if (strcmp(name, names[i]) == 0)
            return 1;
    return 0;
}

/* One warning per POOLSHIM_* variable none of the above names. */
static void warn_unknown_variables(ps_config_t *cfg, env_source_t *src)
{
    char *const *env = src->environ ? src->environ : (src->use_process ? environ : NULL);
    const char *known[USER_VARIABLES_MAX];
    user_variables(known);
    for (size_t i = 0; env && env[i]; i++) {
        const char *v = env[i], *eq = strchr(v, '=');
        if (strncmp(v, "POOLSHIM_", 9) != 0 || !eq || strncmp(v, "POOLSHIM_TEST_", 14) == 0)
            continue;
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)(eq - v), v);
        if (is_one_of(name, known) || is_one_of(name, other_variables))
            continue;
        ps_config_add_warning(cfg, "%s: not a poolshim variable, ignored (did you mean %s?)", name,
                              ps_closest_word(name, known));
        if (cfg->out_of_memory)
            return;
    }
}

/* The steps of the file comment; `text`, when not NULL, stands for the
 * user file (named `text_name`). */
static int load(const ps_config_input_t *in, const char *text, const char *text_name, ps_config_t **out)
{
    if (!out)
        return PS_EINVAL;
    ps_config_t *cfg = calloc(1, sizeof *cfg);
    if (!cfg)
        return PS_ENOMEM;
    env_source_t env = {in ? in->environ : NULL, !(in && in->no_env)};

    ps_config_read_ini(cfg, ps_default_ini, strlen(ps_default_ini), PS_ORIGIN_EMBEDDED, "default.ini",
                       PS_LAYER_EMBEDDED);
    if (text)
        ps_config_read_ini(cfg, text, strlen(text), PS_ORIGIN_FILE, text_name, PS_LAYER_FILE);
    else
        read_user_file(cfg, in, &env);
    const char *options = in && in->options ? in->options : env_lookup(&env, "POOLSHIM_OPTIONS");
    if (options)
        ps_config_read_options(cfg, options);
    read_short_forms(cfg, &env);
    warn_unknown_variables(cfg, &env);
    ps_config_validate(cfg);

    *out = cfg;
    return cfg->error_count ? PS_ECONFIG : PS_OK;
}

int ps_config_load(const ps_config_input_t *in, ps_config_t **out)
{
    return load(in, NULL, NULL, out);
}

int ps_config_load_text(const char *text, const char *name, const ps_config_input_t *in,
                        ps_config_t **out)
{
    if (!text)
        return PS_EINVAL;
    return load(in, text, name ? name : "<text>", out);
}

void ps_config_free(ps_config_t *cfg)
{
    if (!cfg)
        return;
    for (size_t i = 0; i < cfg->setting_count; i++) {
        free(cfg->settings[i].section);
        free(cfg->settings[i].key);
        free(cfg->settings[i].value);
    }
    free(cfg->settings);
    for (size_t i = 0; i < cfg->def_count; i++) {
        for (size_t b = 0; b < cfg->defs[i].bin_count; b++)
            free(cfg->defs[i].bins[b].name);
        free(cfg->defs[i].bins);
        free(cfg->defs[i].name);
    }
    free(cfg->defs);
    free(cfg->devices);
    for (size_t i = 0; i < cfg->error_count; i++)
        free(cfg->errors[i]);
    for (size_t i = 0; i < cfg->warning_count; i++)
        free(cfg->warnings[i]);
    free(cfg->warnings);
    free(cfg->errors);
    free(cfg->error_order);
    for (size_t i = 0; i < cfg->header_count; i++)
        free(cfg->headers[i].section);
    free(cfg->headers);
    for (size_t i = 0; i < cfg->string_count; i++)
        free(cfg->strings[i]);
    free(cfg->strings);
    free(cfg->file_path);
    free(cfg);
}

const ps_global_config_t *ps_config_global(const ps_config_t *cfg) { return &cfg->global; }

size_t ps_config_error_count(const ps_config_t *cfg) { return cfg ? cfg->error_count : 0; }

const char *ps_config_error(const ps_config_t *cfg, size_t index)
{
    return cfg && index < cfg->error_count ? cfg->errors[index] : NULL;
}

void ps_config_print_errors(const ps_config_t *cfg, FILE *f)
{
    for (size_t i = 0; cfg && i < cfg->error_count; i++)
        fprintf(f, "poolshim: error: %s\n", cfg->errors[i]);
}

size_t ps_config_warning_count(const ps_config_t *cfg) { return cfg ? cfg->warning_count : 0; }

const char *ps_config_warning(const ps_config_t *cfg, size_t index)
{
    return cfg && index < cfg->warning_count ? cfg->warnings[index] : NULL;
}

void ps_config_print_warnings(const ps_config_t *cfg, FILE *f)
{
    if (!cfg || cfg->global.verbosity < 1)
        return;
    for (size_t i = 0; i < cfg->warning_count; i++)
        fprintf(f, "poolshim: warning: %s\n", cfg->warnings[i]);
}

const char *ps_config_file_path(const ps_config_t *cfg) { return cfg ? cfg->file_path : NULL; }
