/* `poolshim config`: shows the effective configuration, or checks it.
 *
 *   poolshim config [--file F | F] [--options S] [--device N|*] [--check]
 *
 * The file may be given positionally (`poolshim config --check my.ini`), as
 * people type it, or with --file; giving it twice is a usage error.
 *
 * Steps: 1. read the options; 2. load the configuration the way the shim
 * would (embedded default, the file — --file, else POOLSHIM_CONFIG, else
 * the XDG file —, POOLSHIM_OPTIONS or --options, the short forms); 3. with
 * errors: print all of them, exit 1; 4. else with --check print one line
 * and exit 0, without it print the device's stack as a tree with the
 * origin of every value. Needs no GPU: percentages stay percentages.
 * Exit status: 0 valid, 1 invalid configuration, 2 bad usage.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../config/config.h"
#include "cli.h"

static int usage(FILE *f)
{
    fprintf(f, "usage: poolshim config [--file F | F] [--options S] [--device N|*] [--check]\n"
               "  --file F, F   read F instead of $POOLSHIM_CONFIG / the XDG file\n"
               "  --options S   use S instead of $POOLSHIM_OPTIONS (section.key=value,...)\n"
               "  --device N    show the stack of device N (default: [device.*])\n"
               "  --check       only validate: exit 0 if valid, 1 printing every error\n");
    return f == stdout ? 0 : 2;
}

static int file_given_twice(const char *first, const char *second)
{
    fprintf(stderr, "poolshim: error: config: one configuration file only (`%s`, then `%s`)\n", first, second);
    return usage(stderr);
}

int ps_cmd_config(int argc, char **argv)
{
    ps_config_input_t in = {0};
    int check = 0, device = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--check") == 0) {
            check = 1;
        } else if ((strcmp(a, "--file") == 0 || strcmp(a, "-f") == 0) && i + 1 < argc) {
            if (in.file)
                return file_given_twice(in.file, argv[i + 1]);
            in.file = argv[++i];
        } else if (strcmp(a, "--options") == 0 && i + 1 < argc) {
            in.options = argv[++i];
        } else if (strcmp(a, "--device") == 0 && i + 1 < argc) {
            const char *d = argv[++i];
            long n;
            if (strcmp(d, "*") == 0)
                device = -1;
            else if (cli_parse_int(d, 0, 1023, &n) == 0)
                device = (int)n;
            else {
                fprintf(stderr, "poolshim: error: --device `%s`: expected a device number or *\n", d);
                return 2;
            }
        } else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            return usage(stdout);
        } else if (a[0] != '-') {
            if (in.file)
                return file_given_twice(in.file, a);
            in.file = a;
        } else {
            fprintf(stderr, "poolshim: error: config: unknown or incomplete argument `%s`\n", a);
            return usage(stderr);
        }
    }
    ps_config_t *cfg = NULL;
    int rc = ps_config_load(&in, &cfg);
    if (!cfg) {
        fprintf(stderr, "poolshim: error: cannot load the configuration: %s\n", ps_status_name(rc));
        return 1;
    }
    ps_config_print_warnings(cfg, stderr);
    if (rc != PS_OK) {
        ps_config_print_errors(cfg, stderr);
        fprintf(stderr, "poolshim: %zu error(s) in the configuration\n", ps_config_error_count(cfg));
        ps_config_free(cfg);
        return 1;
    }
    if (check) {
        const char *path = ps_config_file_path(cfg);
        printf("poolshim: configuration is valid (%s)\n", path ? path : "embedded default only");
    } else {
        ps_config_print(cfg, stdout, device);
    }
    ps_config_free(cfg);
    return 0;
}
