/* gen_config_doc: docs/config.md's key tables from config/keys.def.
 *
 *   gen_config_doc            prints every key table: [global], [host] and
 *                             [debug] (key, default, short form, one-line
 *                             help) and the table of every resource key
 *   gen_config_doc FILE.md    rewrites FILE.md's generated resource key
 *                             table (between its PS_DOC_BEGIN and PS_DOC_END
 *                             lines) in place
 *
 * `make config-doc` runs the second on docs/config.md, `make config-doc-print`
 * the first. tests/unit/test_config_keys.c fails when docs/config.md and
 * keys.def disagree. Returns 0, or 1 with a message on stderr.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../config/config_internal.h"

static char *read_all(const char *path)
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

static int rewrite(const char *path)
{
    char *text = read_all(path);
    if (!text) {
        fprintf(stderr, "gen_config_doc: cannot read %s\n", path);
        return 1;
    }
    char *begin = strstr(text, PS_DOC_BEGIN);
    char *end = begin ? strstr(begin, PS_DOC_END) : NULL;
    if (!end) {
        fprintf(stderr, "gen_config_doc: %s has no lines\n  %s\n  ...\n  %s\n", path, PS_DOC_BEGIN, PS_DOC_END);
        free(text);
        return 1;
    }
    end += strlen(PS_DOC_END);
    if (*end == '\n')
        end++;
    FILE *f = fopen(path, "wb");
    if (!f) {
        fprintf(stderr, "gen_config_doc: cannot write %s\n", path);
        free(text);
        return 1;
    }
    fwrite(text, 1, (size_t)(begin - text), f);
    ps_doc_resource_table(f);
    fputs(end, f);
    int failed = fclose(f) != 0;
    free(text);
    if (failed)
        fprintf(stderr, "gen_config_doc: cannot write %s\n", path);
    return failed;
}

int main(int argc, char **argv)
{
    if (argc > 2 || (argc == 2 && argv[1][0] == '-')) {
        fprintf(stderr, "usage: gen_config_doc [FILE.md]\n");
        return 1;
    }
    if (argc == 2)
        return rewrite(argv[1]);
    ps_doc_tables(stdout);
    return 0;
}
