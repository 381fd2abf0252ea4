/* Replays every committed fuzz corpus file (tests/data/fuzz/config/ and
 * tests/data/fuzz/size/) through the fuzzing entry points, so inputs the
 * fuzzer once found interesting keep being checked on the CPU suite. An
 * entry point traps on a broken invariant, which fails the test. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../config/config_internal.h"

static int replay(const char *sub, int (*entry)(const uint8_t *, size_t))
{
    const char *data = getenv("POOLSHIM_TEST_DATA");
    cr_assert_not_null(data);
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/fuzz/%s", data, sub);
    DIR *d = opendir(dir);
    cr_assert_not_null(d, "cannot open %s", dir);
    struct dirent *e;
    int files = 0;
    ps_verbosity = -1;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char path[8192];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        FILE *f = fopen(path, "rb");
        cr_assert_not_null(f, "%s", path);
        static uint8_t buf[1 << 16];
        size_t n = fread(buf, 1, sizeof buf, f);
        fclose(f);
        cr_assert_eq(entry(buf, n), 0, "%s", path);
        files++;
    }
    closedir(d);
    return files;
}

Test(config_fuzz_corpus, every_config_corpus_file_replays_cleanly)
{
    cr_assert_geq(replay("config", ps_config_fuzz_ini), 30);
}

Test(config_fuzz_corpus, every_size_corpus_file_replays_cleanly)
{
    cr_assert_geq(replay("size", ps_config_fuzz_size), 10);
}
