/* Replays a committed fuzz corpus, tests/data/fuzz/SUB/ (POOLSHIM_TEST_DATA),
 * through a fuzzing entry point: every file must return 0, and an entry
 * point traps on a broken invariant, which fails the test. Returns how many
 * files were replayed. */
#ifndef PS_TEST_FUZZ_CORPUS_H
#define PS_TEST_FUZZ_CORPUS_H

#include <criterion/criterion.h>
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static inline int fuzz_corpus_replay(const char *sub, int (*entry)(const uint8_t *, size_t))
{
    const char *data = getenv("POOLSHIM_TEST_DATA");
    cr_assert_not_null(data);
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/fuzz/%s", data, sub);
    DIR *d = opendir(dir);
    cr_assert_not_null(d, "cannot open %s", dir);
    int files = 0;
    for (struct dirent *e; (e = readdir(d));) {
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

#endif
