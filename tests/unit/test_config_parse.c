/* Value parsers of the configuration: sizes, percentages, booleans,
 * integers, file-name patterns and their expansion, suggestions. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "../../config/config_internal.h"

static uint64_t size_of(const char *text)
{
    uint64_t bytes = 0;
    double pct = 0;
    int is_pct = -1;
    char why[128];
    int rc = ps_parse_size_ex(text, 1, &bytes, &pct, &is_pct, why, sizeof why);
    cr_assert_eq(rc, PS_OK, "`%s` should parse, got: %s", text, why);
    cr_assert_eq(is_pct, 0, "`%s` is not a percentage", text);
    return bytes;
}

static const char *why_rejected(const char *text, int allow_percent)
{
    static char why[128];
    uint64_t bytes = 12345;
    double pct = 0;
    int is_pct = 7;
    why[0] = '\0';
    int rc = ps_parse_size_ex(text, allow_percent, &bytes, &pct, &is_pct, why, sizeof why);
    cr_assert_eq(rc, PS_EINVAL, "`%s` should be rejected", text);
    cr_assert_eq(bytes, 12345, "outputs stay untouched on error");
    cr_assert_eq(is_pct, 7, "outputs stay untouched on error");
    return why;
}

Test(config_parse, sizes_accept_plain_bytes_and_binary_units)
{
    cr_assert_eq(size_of("0"), 0);
    cr_assert_eq(size_of("4096"), 4096);
    cr_assert_eq(size_of("4096B"), 4096);
    cr_assert_eq(size_of("64KiB"), 64 * 1024);
    cr_assert_eq(size_of("64 KiB"), 64 * 1024);
    cr_assert_eq(size_of(" 2MiB "), 2u << 20);
    cr_assert_eq(size_of("3GiB"), 3ull << 30);
    cr_assert_eq(size_of("2TiB"), 2ull << 40);
}

Test(config_parse, sizes_treat_k_kb_kib_alike_as_binary)
{
    cr_assert_eq(size_of("1K"), 1024);
    cr_assert_eq(size_of("1KB"), 1024);
    cr_assert_eq(size_of("1kib"), 1024);
    cr_assert_eq(size_of("5M"), size_of("5MB"));
    cr_assert_eq(size_of("5MB"), size_of("5MiB"));
    cr_assert_eq(size_of("1g"), 1ull << 30);
    cr_assert_eq(size_of("1T"), 1ull << 40);
}

Test(config_parse, sizes_accept_exact_fractions_with_a_unit)
{
    cr_assert_eq(size_of("1.5GiB"), 3ull << 29);
    cr_assert_eq(size_of("0.5K"), 512);
    cr_assert_eq(size_of(".25MiB"), 256 * 1024);
    cr_assert_eq(size_of("0.3KiB"), 307, "a fraction of a byte rounds down");
    cr_assert_eq(size_of("1.000000000000000000001KiB"), 1024, "digits past 18 are ignored");
}

Test(config_parse, sizes_reject_malformed_text_with_a_reason)
{
    cr_assert_str_eq(why_rejected("", 1), "empty value");
    cr_assert_str_eq(why_rejected("lots", 1), "not a number");
    cr_assert_str_eq(why_rejected("-1GiB", 1), "sizes cannot be negative");
    cr_assert_str_eq(why_rejected("1.5", 1), "a fraction needs a unit (e.g. 1.5GiB)");
    cr_assert_str_eq(why_rejected("1.", 1), "a '.' must be followed by digits");
    cr_assert(strstr(why_rejected("12XB", 1), "unknown unit") != NULL);
    cr_assert(strstr(why_rejected("1 2", 1), "unexpected characters") != NULL);
    cr_assert(strstr(why_rejected("1GiB x", 1), "unexpected characters") != NULL);
    cr_assert(strstr(why_rejected("1KiBB", 1), "unknown unit") != NULL);
}

Test(config_parse, sizes_detect_overflow)
{
    cr_assert_eq(size_of("18446744073709551615"), UINT64_MAX);
    cr_assert(strstr(why_rejected("18446744073709551616", 1), "too large") != NULL);
    cr_assert(strstr(why_rejected("16777216TiB", 1), "too large") != NULL); /* 2^64 */
    cr_assert_eq(size_of("16777215TiB"), (16777215ull) << 40);
    cr_assert_eq(size_of("16777215.5TiB"), (16777215ull << 40) + (1ull << 39), "a fraction just below the top");
}

Test(config_parse, percentages_parse_when_allowed)
{
    uint64_t bytes = 0;
    double pct = 0;
    int is_pct = 0;
    cr_assert_eq(ps_parse_size_ex("50%", 1, &bytes, &pct, &is_pct, NULL, 0), PS_OK);
    cr_assert_eq(is_pct, 1);
    cr_assert_float_eq(pct, 50.0, 1e-9);
    cr_assert_eq(ps_parse_size_ex("12.5 %", 1, &bytes, &pct, &is_pct, NULL, 0), PS_OK);
    cr_assert_float_eq(pct, 12.5, 1e-9);
    cr_assert_eq(ps_parse_size_ex("100%", 1, &bytes, &pct, &is_pct, NULL, 0), PS_OK);
    cr_assert_float_eq(pct, 100.0, 1e-9);
    cr_assert_str_eq(why_rejected("100.5%", 1), "a percentage cannot be over 100%");
    cr_assert_str_eq(why_rejected("150%", 1), "a percentage cannot be over 100%");
    cr_assert_str_eq(why_rejected("99999999999999999999999%", 1), "a percentage cannot be over 100%");
    cr_assert_str_eq(why_rejected("50%", 0), "a percentage is not allowed here");
    cr_assert_str_eq(why_rejected("-5%", 1), "sizes cannot be negative");
    cr_assert_str_eq(why_rejected("%50", 1), "not a number");
}

Test(config_parse, public_size_parser_reports_percent_only_when_asked)
{
    size_t bytes = 1;
    double pct = 0;
    cr_assert_eq(ps_parse_size("2MiB", &bytes, &pct), PS_OK);
    cr_assert_eq(bytes, 2u << 20);
    cr_assert_lt(pct, 0.0, "not a percentage: *percent < 0");
    bytes = 7;
    cr_assert_eq(ps_parse_size("25%", &bytes, &pct), PS_OK);
    cr_assert_eq(bytes, 7, "bytes untouched for a percentage");
    cr_assert_float_eq(pct, 25.0, 1e-9);
    cr_assert_eq(ps_parse_size("25%", &bytes, NULL), PS_EINVAL);
    cr_assert_eq(ps_parse_size("garbage", &bytes, NULL), PS_EINVAL);
    cr_assert_eq(ps_parse_size(NULL, &bytes, NULL), PS_EINVAL);
}

Test(config_parse, booleans_accept_the_usual_words)
{
    const char *truths[] = {"1", "true", "yes", "on", "TRUE", " On "};
    const char *lies[] = {"0", "false", "no", "off", "OFF", "No"};
    for (size_t i = 0; i < 6; i++) {
        int v = -1;
        cr_assert_eq(ps_parse_bool(truths[i], &v), PS_OK, "%s", truths[i]);
        cr_assert_eq(v, 1, "%s", truths[i]);
        v = -1;
        cr_assert_eq(ps_parse_bool(lies[i], &v), PS_OK, "%s", lies[i]);
        cr_assert_eq(v, 0, "%s", lies[i]);
    }
    int v = 5;
    cr_assert_eq(ps_parse_bool("maybe", &v), PS_EINVAL);
    cr_assert_eq(ps_parse_bool("2", &v), PS_EINVAL);
    cr_assert_eq(ps_parse_bool("", &v), PS_EINVAL);
    cr_assert_eq(ps_parse_bool("truetruetruetrue", &v), PS_EINVAL);
    cr_assert_eq(v, 5, "untouched on error");
}

Test(config_parse, whole_numbers_have_bounds)
{
    uint64_t v = 0;
    char why[64];
    cr_assert_eq(ps_parse_uint("42", 100, &v, why, sizeof why), PS_OK);
    cr_assert_eq(v, 42);
    cr_assert_eq(ps_parse_uint("101", 100, &v, why, sizeof why), PS_EINVAL);
    cr_assert_str_eq(why, "too large (at most 100)");
    cr_assert_eq(ps_parse_uint("99999999999999999999999", UINT64_MAX, &v, why, sizeof why), PS_EINVAL);
    cr_assert_eq(ps_parse_uint("-3", 100, &v, why, sizeof why), PS_EINVAL);
    cr_assert_str_eq(why, "cannot be negative");
    cr_assert_eq(ps_parse_uint("4.5", 100, &v, why, sizeof why), PS_EINVAL);
    cr_assert_eq(v, 42, "untouched on error");
}

static const char *array_lookup(void *ctx, const char *name)
{
    char **env = ctx;
    size_t len = strlen(name);
    for (size_t i = 0; env[i]; i++)
        if (strncmp(env[i], name, len) == 0 && env[i][len] == '=')
            return env[i] + len + 1;
    return NULL;
}

Test(config_parse, rank_comes_from_the_first_rank_variable_set)
{
    char out[64];
    char *slurm[] = {"SLURM_PROCID=7", NULL};
    char *both[] = {"OMPI_COMM_WORLD_RANK=3", "PMI_RANK=9", NULL};
    char *rank_first[] = {"PMI_RANK=9", "RANK=1", NULL};
    char *none[] = {NULL};
    cr_assert_eq(ps_expand_path_env("r%r", 0, array_lookup, slurm, out, sizeof out), PS_OK);
    cr_assert_str_eq(out, "r7");
    cr_assert_eq(ps_expand_path_env("r%r", 0, array_lookup, both, out, sizeof out), PS_OK);
    cr_assert_str_eq(out, "r3");
    cr_assert_eq(ps_expand_path_env("r%r", 0, array_lookup, rank_first, out, sizeof out), PS_OK);
    cr_assert_str_eq(out, "r1");
    cr_assert_eq(ps_expand_path_env("r%r.%d%%", 12, array_lookup, none, out, sizeof out), PS_OK);
    cr_assert_str_eq(out, "r0.12%");
}

Test(config_parse, path_patterns_expand_pid_rank_and_device)
{
    char out[256], want[256];
    char *env[] = {"SLURM_PROCID=7", NULL};
    cr_assert_eq(ps_expand_path_env("log-%p-%r-%d.csv", 3, array_lookup, env, out, sizeof out), PS_OK);
    snprintf(want, sizeof want, "log-%ld-7-3.csv", (long)getpid());
    cr_assert_str_eq(out, want);
}

Test(config_parse, slurm_job_step_and_host_expand)
{
    char out[256], want[256], host[256] = "";
    char *job[] = {"SLURM_JOB_ID=4242", "SLURM_STEP_ID=3", "SLURMD_NODENAME=gpu-node7", "SLURM_PROCID=5", NULL};
    cr_assert_eq(ps_expand_path_env("s_%j.%s_%h_rank%r.json", -1, array_lookup, job, out, sizeof out), PS_OK);
    cr_expect_str_eq(out, "s_4242.3_gpu-node7_rank5.json");
    /* the batch script of a job has no step: "batch" */
    char *batch[] = {"SLURM_JOB_ID=9", "SLURM_PROCID=0", "SLURMD_NODENAME=n1", NULL};
    cr_assert_eq(ps_expand_path_env("%j.%s", -1, array_lookup, batch, out, sizeof out), PS_OK);
    cr_expect_str_eq(out, "9.batch");
    /* outside Slurm: 0, 0 and the host name up to its first dot */
    char *none[] = {NULL};
    cr_assert_eq(gethostname(host, sizeof host - 1), 0);
    host[strcspn(host, ".")] = 0;
    cr_assert_eq(ps_expand_path_env("%j.%s.%h", -1, array_lookup, none, out, sizeof out), PS_OK);
    snprintf(want, sizeof want, "0.0.%s", host);
    cr_expect_str_eq(out, want);
    /* a value that would leave the directory is made one safe word */
    char *odd[] = {"SLURMD_NODENAME=../a b", "SLURM_JOB_ID=1/2", NULL};
    cr_assert_eq(ps_expand_path_env("%h-%j", -1, array_lookup, odd, out, sizeof out), PS_OK);
    cr_expect_str_eq(out, ".._a_b-1_2");
}

Test(config_parse, job_place_reads_each_launchers_variables)
{
    ps_job_place_t p;
    char *slurm[] = {"SLURM_PROCID=5", "SLURM_LOCALID=1", "SLURM_NODEID=2", "SLURM_JOB_ID=77", "SLURM_STEP_ID=0",
                     "SLURMD_NODENAME=n2", NULL};
    ps_job_place_env(array_lookup, slurm, &p);
    cr_expect_str_eq(p.rank, "5");
    cr_expect_str_eq(p.local_rank, "1");
    cr_expect_str_eq(p.node, "2");
    cr_expect_str_eq(p.job, "77");
    cr_expect_str_eq(p.step, "0");
    cr_expect_str_eq(p.host, "n2");
    /* torchrun started by srun: torchrun's own variables come first */
    char *torchrun[] = {"SLURM_PROCID=1", "SLURM_LOCALID=0", "SLURM_NODEID=1", "RANK=6", "LOCAL_RANK=2",
                        "GROUP_RANK=1", NULL};
    ps_job_place_env(array_lookup, torchrun, &p);
    cr_expect_str_eq(p.rank, "6");
    cr_expect_str_eq(p.local_rank, "2");
    cr_expect_str_eq(p.node, "1");
    char *mpi[] = {"OMPI_COMM_WORLD_RANK=3", "OMPI_COMM_WORLD_LOCAL_RANK=1", NULL};
    ps_job_place_env(array_lookup, mpi, &p);
    cr_expect_str_eq(p.rank, "3");
    cr_expect_str_eq(p.local_rank, "1");
    cr_expect_str_eq(p.node, "");
    cr_expect_str_eq(p.job, "");
    cr_expect_str_eq(p.step, "", "no job, no step");
    cr_expect(p.host[0], "the host is always known");
}

Test(config_parse, path_expansion_fails_cleanly)
{
    char out[8];
    char *none[] = {NULL};
    cr_assert_eq(ps_expand_path_env("%d", -1, array_lookup, none, out, sizeof out), PS_EINVAL,
                 "no device to put in");
    cr_assert_eq(ps_expand_path_env("%q", 0, array_lookup, none, out, sizeof out), PS_EINVAL);
    cr_assert_eq(ps_expand_path_env("much-too-long", 0, array_lookup, none, out, sizeof out), PS_EINVAL);
    cr_assert_eq(ps_expand_path_env("1234567", 0, array_lookup, none, out, sizeof out), PS_OK);
    cr_assert_str_eq(out, "1234567");
}

Test(config_parse, path_patterns_are_checked)
{
    char why[128];
    cr_assert_eq(ps_check_path_pattern("a-%p-%r-%d-%%.csv", 1, why, sizeof why), PS_OK);
    cr_assert_eq(ps_check_path_pattern("s_%j.%s_%h_rank%r.json", 0, why, sizeof why), PS_OK);
    cr_assert_eq(ps_check_path_pattern("a-%d", 0, why, sizeof why), PS_EINVAL);
    cr_assert(strstr(why, "%d") != NULL);
    cr_assert_eq(ps_check_path_pattern("a-%x", 1, why, sizeof why), PS_EINVAL);
    cr_assert(strstr(why, "unknown `%x`") != NULL, "%s", why);
    cr_assert_eq(ps_check_path_pattern("a-%", 1, why, sizeof why), PS_EINVAL);
}

Test(config_parse, nearest_word_finds_typos_and_prefixes)
{
    const char *keys[] = {"initial_size", "maximum_size", "min_chunk", "max_chunk", "alignment", NULL};
    cr_assert_str_eq(ps_nearest_word("intial", keys), "initial_size");
    cr_assert_str_eq(ps_nearest_word("initial", keys), "initial_size");
    cr_assert_str_eq(ps_nearest_word("max_chunks", keys), "max_chunk");
    cr_assert_str_eq(ps_nearest_word("Alignment", keys), "alignment");
    cr_assert_str_eq(ps_nearest_word("alignmnet", keys), "alignment");
    cr_assert_null(ps_nearest_word("frobnicate", keys));
    cr_assert_null(ps_nearest_word("", keys));
    cr_assert_null(ps_nearest_word("x", keys));
}
