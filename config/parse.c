/* Value parsers of the configuration: sizes, percentages, booleans,
 * integers, enum words, file-name patterns, and the "did you mean"
 * suggestion.
 *
 * Sizes, step by step:
 *   1. skip blanks; a '-' is an error ("negative");
 *   2. read the integer digits, then an optional '.' and fraction digits
 *      (at most 18), keeping both as integers (no floating point, so
 *      "1.5GiB" is exact);
 *   3. skip blanks and read the unit: none or B (bytes), K/KB/KiB,
 *      M/MB/MiB, G/GB/GiB, T/TB/TiB, case-insensitive, ALL BINARY (1 KB =
 *      1024 B: GPU memory is counted in powers of two, as nvidia-smi does);
 *      or '%' (percent of the device's total memory, when allowed);
 *   4. bytes = integer * unit + fraction * unit / 10^digits, each step
 *      checked for overflow; a fraction of a byte is rounded down; a
 *      fraction without a unit ("1.5") is an error;
 *   5. nothing may follow but blanks.
 * Guarantees: never reads past the NUL, never overflows, on error leaves
 * the outputs untouched and says why in one short phrase.
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config_internal.h"

char *ps_trim_blanks(char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    size_t n = strlen(s);
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r' || s[n - 1] == '\n'))
        s[--n] = '\0';
    return s;
}

static void set_why(char *why, size_t why_size, const char *text)
{
    if (why && why_size)
        snprintf(why, why_size, "%s", text);
}

/* Unit suffix -> multiplier (binary). Returns 0 when unknown. */
static uint64_t unit_multiplier(const char *unit, size_t len)
{
    static const struct {
        const char *name; /* lower-case spelling */
        uint64_t shift;   /* power of two */
    } units[] = {
        {"", 0},     {"b", 0},     {"k", 10},    {"kb", 10},   {"kib", 10},
        {"m", 20},   {"mb", 20},   {"mib", 20},  {"g", 30},    {"gb", 30},
        {"gib", 30}, {"t", 40},    {"tb", 40},   {"tib", 40},
    };
    char lower[8];
    if (len >= sizeof lower)
        return 0;
    for (size_t i = 0; i < len; i++)
        lower[i] = (char)tolower((unsigned char)unit[i]);
    lower[len] = '\0';
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (strcmp(lower, units[i].name) == 0)
            return (uint64_t)1 << units[i].shift;
    return 0;
}

int ps_parse_size_ex(const char *text, int allow_percent, uint64_t *bytes, double *percent,
                     int *is_percent, char *why, size_t why_size)
{
    if (!text) {
        set_why(why, why_size, "no value");
        return PS_EINVAL;
    }
    const char *p = text;
    while (*p == ' ' || *p == '\t')
        p++;
    if (*p == '-') {
        set_why(why, why_size, "sizes cannot be negative");
        return PS_EINVAL;
    }
    if (*p == '+')
        p++;
    if (!isdigit((unsigned char)*p) && !(*p == '.' && isdigit((unsigned char)p[1]))) {
        set_why(why, why_size, *p ? "not a number" : "empty value");
        return PS_EINVAL;
    }
    uint64_t whole = 0;
    int overflow = 0;
    for (; isdigit((unsigned char)*p); p++) {
        if (__builtin_mul_overflow(whole, 10, &whole) ||
            __builtin_add_overflow(whole, (uint64_t)(*p - '0'), &whole))
            overflow = 1;
    }
    uint64_t frac = 0, frac_scale = 1;
    int has_frac = 0;
    if (*p == '.') {
        p++;
        if (!isdigit((unsigned char)*p)) {
            set_why(why, why_size, "a '.' must be followed by digits");
            return PS_EINVAL;
        }
        has_frac = 1;
        for (int digits = 0; isdigit((unsigned char)*p); p++, digits++) {
            if (digits < 18) { /* further digits cannot change a 64-bit byte count */
                frac = frac * 10 + (uint64_t)(*p - '0');
                frac_scale *= 10;
            }
        }
    }
    while (*p == ' ' || *p == '\t')
        p++;
    const char *unit = p;
    while (isalpha((unsigned char)*p) || *p == '%')
        p++;
    size_t unit_len = (size_t)(p - unit);
    while (*p == ' ' || *p == '\t')
        p++;
    if (*p) {
        set_why(why, why_size, "unexpected characters after the size");
        return PS_EINVAL;
    }
    if (unit_len == 1 && unit[0] == '%') {
        if (!allow_percent) {
            set_why(why, why_size, "a percentage is not allowed here");
            return PS_EINVAL;
        }
        if (overflow || whole > 100 || (whole == 100 && frac > 0)) {
            set_why(why, why_size, "a percentage cannot be over 100%");
            return PS_EINVAL;
        }
        double pct = (double)whole + (double)frac / (double)frac_scale;
        *percent = pct;
        *is_percent = 1;
        return PS_OK;
    }
    uint64_t mult = unit_multiplier(unit, unit_len);
    if (mult == 0) {
        set_why(why, why_size, "unknown unit (expected B, KiB, MiB, GiB, TiB, K, M, G, T or %)");
        return PS_EINVAL;
    }
    if (has_frac && unit_len == 0) {
        set_why(why, why_size, "a fraction needs a unit (e.g. 1.5GiB)");
        return PS_EINVAL;
    }
    uint64_t result;
    if (overflow || __builtin_mul_overflow(whole, mult, &result)) {
        set_why(why, why_size, "too large (the maximum is 16 EiB - 1)");
        return PS_EINVAL;
    }
    if (has_frac) {
        /* frac < frac_scale <= 10^18 and mult <= 2^40: the product fits 128 bits */
        uint64_t add = (uint64_t)((unsigned __int128)frac * mult / frac_scale);
        if (__builtin_add_overflow(result, add, &result)) {
            set_why(why, why_size, "too large (the maximum is 16 EiB - 1)");
            return PS_EINVAL;
        }
    }
    *bytes = result;
    *is_percent = 0;
    return PS_OK;
}

int ps_parse_size(const char *text, size_t *bytes, double *percent)
{
    uint64_t b = 0;
    double pct = 0;
    int is_pct = 0;
    int rc = ps_parse_size_ex(text, percent != NULL, &b, &pct, &is_pct, NULL, 0);
    if (rc != PS_OK)
        return rc;
    if (is_pct) {
        *percent = pct;
        return PS_OK;
    }
    if (b > SIZE_MAX)
        return PS_EINVAL;
    *bytes = (size_t)b;
    if (percent)
        *percent = -1.0; /* not a percentage */
    return PS_OK;
}

int ps_parse_bool(const char *text, int *value)
{
    static const char *const truths[] = {"1", "true", "yes", "on", NULL};
    static const char *const lies[] = {"0", "false", "no", "off", NULL};
    if (!text)
        return PS_EINVAL;
    char buf[16];
    snprintf(buf, sizeof buf, "%s", text);
    char *t = ps_trim_blanks(buf);
    if (strlen(text) >= sizeof buf)
        return PS_EINVAL;
    if (ps_parse_word(t, truths) >= 0) {
        *value = 1;
        return PS_OK;
    }
    if (ps_parse_word(t, lies) >= 0) {
        *value = 0;
        return PS_OK;
    }
    return PS_EINVAL;
}

int ps_parse_uint(const char *text, uint64_t max, uint64_t *value, char *why, size_t why_size)
{
    const char *p = text;
    while (*p == ' ' || *p == '\t')
        p++;
    if (*p == '-') {
        set_why(why, why_size, "cannot be negative");
        return PS_EINVAL;
    }
    if (!isdigit((unsigned char)*p)) {
        set_why(why, why_size, *p ? "not a whole number" : "empty value");
        return PS_EINVAL;
    }
    uint64_t v = 0;
    int overflow = 0;
    for (; isdigit((unsigned char)*p); p++)
        if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, (uint64_t)(*p - '0'), &v))
            overflow = 1;
    while (*p == ' ' || *p == '\t')
        p++;
    if (*p) {
        set_why(why, why_size, "not a whole number");
        return PS_EINVAL;
    }
    if (overflow || v > max) {
        char msg[64];
        snprintf(msg, sizeof msg, "too large (at most %llu)", (unsigned long long)max);
        set_why(why, why_size, msg);
        return PS_EINVAL;
    }
    *value = v;
    return PS_OK;
}

int ps_env_bool(const char *name, int report, int *value)
{
    const char *v = getenv(name);
    *value = 0;
    if (!v || !*v)
        return PS_OK;
    int b;
    if (ps_parse_bool(v, &b) == PS_OK) {
        *value = b;
        return PS_OK;
    }
    if (report)
        ps_error("%s=%s: expected " PS_BOOL_EXPECTED, name, v);
    return PS_EINVAL;
}

int ps_parse_word(const char *text, const char *const *words)
{
    for (int i = 0; words[i]; i++)
        if (strcasecmp(text, words[i]) == 0)
            return i;
    return -1;
}

int ps_check_path_pattern(const char *pattern, int allow_device, char *why, size_t why_size)
{
    for (const char *p = pattern; *p; p++) {
        if (*p != '%')
            continue;
        char c = p[1];
        if ((c && strchr("prjsh%", c)) || (c == 'd' && allow_device)) {
            p++;
            continue;
        }
        char msg[96];
        if (c == 'd')
            snprintf(msg, sizeof msg, "`%%d` (device) is not available in this file name");
        else if (c == '\0')
            snprintf(msg, sizeof msg, "a lone `%%` at the end (write %%%% for a percent sign)");
        else
            snprintf(msg, sizeof msg, "unknown `%%%c` (expected %%p, %%r, %%j, %%s, %%h%s or %%%%)", c,
                     allow_device ? ", %d" : "");
        set_why(why, why_size, msg);
        return PS_EINVAL;
    }
    return PS_OK;
}

static const char *process_env(void *ctx, const char *name)
{
    (void)ctx;
    return getenv(name);
}

/* The launchers' variables, each list in the order it is trusted:
 * torchrun's, then Open MPI's, then Slurm's, then MPICH's. */
static const char *const rank_vars[] = {"RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "PMI_RANK", "LOCAL_RANK",
                                        NULL};
static const char *const local_rank_vars[] = {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID",
                                              "MPI_LOCALRANKID", NULL};
static const char *const node_vars[] = {"GROUP_RANK", "SLURM_NODEID", NULL};

static const char *first_set(ps_env_lookup_t lookup, void *ctx, const char *const *names)
{
    for (int i = 0; names[i]; i++) {
        const char *v = lookup(ctx, names[i]);
        if (v && *v)
            return v;
    }
    return NULL;
}

static const char *rank_from(ps_env_lookup_t lookup, void *ctx) { return first_set(lookup, ctx, rank_vars); }

const char *ps_env_rank(void) { return rank_from(process_env, NULL); }

/* Copies `text` as one safe word of a file name or JSON string: letters,
 * digits, '.', '_', '+' and '-' kept, any other byte '_'; "" for NULL. */
static void copy_word(char *out, size_t size, const char *text)
{
    size_t n = 0;
    for (; text && text[n] && n + 1 < size; n++) {
        unsigned char c = (unsigned char)text[n];
        out[n] = (char)(isalnum(c) || c == '.' || c == '_' || c == '+' || c == '-' ? c : '_');
    }
    out[n] = '\0';
}

void ps_job_place_env(ps_env_lookup_t lookup, void *ctx, ps_job_place_t *out)
{
    if (!lookup)
        lookup = process_env;
    copy_word(out->rank, sizeof out->rank, rank_from(lookup, ctx));
    copy_word(out->local_rank, sizeof out->local_rank, first_set(lookup, ctx, local_rank_vars));
    copy_word(out->node, sizeof out->node, first_set(lookup, ctx, node_vars));
    copy_word(out->job, sizeof out->job, lookup(ctx, "SLURM_JOB_ID"));
    const char *step = lookup(ctx, "SLURM_STEP_ID");
    copy_word(out->step, sizeof out->step, step && *step ? step : out->job[0] ? "batch" : NULL);
    const char *node_name = lookup(ctx, "SLURMD_NODENAME");
    char host[256] = "";
    if (!node_name || !*node_name) {
        if (gethostname(host, sizeof host - 1) == 0)
            host[strcspn(host, ".")] = '\0';
        node_name = host;
    }
    copy_word(out->host, sizeof out->host, node_name);
}

void ps_job_place(ps_job_place_t *out) { ps_job_place_env(process_env, NULL, out); }

int ps_expand_path_env(const char *pattern, int device, ps_env_lookup_t lookup, void *ctx,
                       char *out, size_t outsize)
{
    if (!pattern || !out || outsize == 0)
        return PS_EINVAL;
    if (!lookup)
        lookup = process_env;
    ps_job_place_t place;
    int placed = 0;
    size_t n = 0;
    for (const char *p = pattern; *p; p++) {
        char piece[32];
        const char *add = piece;
        if (*p != '%') {
            piece[0] = *p;
            piece[1] = '\0';
        } else {
            if (p[1] && strchr("rjsh", p[1]) && !placed) {
                ps_job_place_env(lookup, ctx, &place);
                placed = 1;
            }
            switch (p[1]) {
            case 'p': snprintf(piece, sizeof piece, "%ld", (long)getpid()); break;
            case 'd':
                if (device < 0)
                    return PS_EINVAL;
                snprintf(piece, sizeof piece, "%d", device);
                break;
            case 'r':
                add = rank_from(lookup, ctx);
                if (!add)
                    add = "0";
                break;
            case 'j': add = place.job[0] ? place.job : "0"; break;
            case 's': add = place.step[0] ? place.step : "0"; break;
            case 'h': add = place.host[0] ? place.host : "localhost"; break;
            case '%': snprintf(piece, sizeof piece, "%%"); break;
            default: return PS_EINVAL;
            }
            p++;
        }
        size_t len = strlen(add);
        if (n + len >= outsize)
            return PS_EINVAL;
        memcpy(out + n, add, len);
        n += len;
    }
    out[n] = '\0';
    return PS_OK;
}

int ps_expand_path(const char *pattern, int device, char *out, size_t outsize)
{
    return ps_expand_path_env(pattern, device, NULL, NULL, out, outsize);
}

/* Levenshtein distance between a and b; with prefix, the best distance
 * between a and any prefix of b. Case-insensitive. Lengths are capped. */
static size_t edit_distance(const char *a, const char *b, int prefix)
{
    enum { MAX = 64 };
    size_t la = strlen(a), lb = strlen(b);
    if (la > MAX || lb > MAX)
        return (size_t)-1;
    size_t row[MAX + 1], prev[MAX + 1];
    /* rows follow b, columns follow a: row[j] = distance(a[0..j), b[0..i)) */
    for (size_t j = 0; j <= la; j++)
        prev[j] = j;
    size_t best = prefix ? prev[la] : (size_t)-1;
    for (size_t i = 1; i <= lb; i++) {
        row[0] = i;
        for (size_t j = 1; j <= la; j++) {
            size_t cost = tolower((unsigned char)a[j - 1]) == tolower((unsigned char)b[i - 1]) ? 0 : 1;
            size_t v = prev[j - 1] + cost;
            if (prev[j] + 1 < v)
                v = prev[j] + 1;
            if (row[j - 1] + 1 < v)
                v = row[j - 1] + 1;
            row[j] = v;
        }
        if (prefix && row[la] < best)
            best = row[la];
        memcpy(prev, row, (la + 1) * sizeof row[0]);
    }
    return prefix ? best : prev[la];
}

const char *ps_closest_word(const char *text, const char *const *words)
{
    const char *best = NULL;
    size_t best_score = (size_t)-1;
    for (int i = 0; words[i]; i++) {
        size_t score = edit_distance(text, words[i], 0);
        if (score < best_score) {
            best_score = score;
            best = words[i];
        }
    }
    return best;
}

const char *ps_nearest_word(const char *text, const char *const *words)
{
    size_t len = strlen(text);
    if (len == 0)
        return NULL;
    size_t limit = len / 3 > 1 ? len / 3 : 1;
    const char *best = NULL;
    size_t best_score = (size_t)-1;
    for (int i = 0; words[i]; i++) {
        size_t score = edit_distance(text, words[i], 0);
        if (len >= 3) {
            size_t pre = edit_distance(text, words[i], 1);
            if (pre != (size_t)-1 && pre + 1 < score)
                score = pre + 1; /* a prefix match costs one more than a full match */
        }
        if (score < best_score) {
            best_score = score;
            best = words[i];
        }
    }
    return best_score <= limit ? best : NULL;
}
