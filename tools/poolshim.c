/* STUB: the poolshim CLI (replaced by the tools work). A tiny dispatch so
 * `poolshim config ...` works until then. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "config") == 0)
        return ps_cmd_config(argc - 1, argv + 1);
    fprintf(stderr, "poolshim: not built yet (only `poolshim config` works)\n");
    return 2;
}
