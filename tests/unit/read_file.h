/* A whole file as one NUL-ended string (caller frees), or NULL when it
 * cannot be opened: for tests that compare a file with what they expect. */
#ifndef PS_TEST_READ_FILE_H
#define PS_TEST_READ_FILE_H

#include <stdio.h>
#include <stdlib.h>

static inline char *read_whole_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *text = NULL;
    size_t size = 0;
    FILE *m = open_memstream(&text, &size);
    char chunk[4096];
    size_t got;
    while ((got = fread(chunk, 1, sizeof chunk, f)) > 0)
        fwrite(chunk, 1, got, m);
    fclose(f);
    fclose(m);
    return text;
}

#endif
