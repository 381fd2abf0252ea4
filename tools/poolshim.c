/* poolshim: the command-line tool.
 *
 *   poolshim run    [options] -- CMD ARGS...   run CMD with the shim preloaded
 *   poolshim ab     [options] -- CMD ARGS...   A/B: CMD without and with the shim
 *   poolshim replay LOG.csv [options]          replay an allocation log against stacks
 *   poolshim plot   LOG.csv -o memory.svg      memory over time as an SVG
 *   poolshim stats  FILE|DIR...                merge the statistics of a job's processes
 *   poolshim config [options]                  the effective configuration
 *   poolshim top    [--once|--json|--prometheus] live figures of every process under the shim
 *   poolshim export LOG.csv --memory-viz F     a log for PyTorch memory_viz / Perfetto
 *   poolshim --version                         the version (the file VERSION)
 *
 * Algorithm: 1. find the subcommand (argv[1]); 2. hand it argv from its
 * name on; 3. return its exit code (tools/cli.h lists them).
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "replay_gpu.h"

#ifndef POOLSHIM_VERSION
#error "POOLSHIM_VERSION is not defined: build with make (mk/version.mk reads the file VERSION)"
#endif

static const char usage_text[] =
    "usage: poolshim <command> [options]\n"
    "\n"
    "Cheap cudaMalloc/cudaFree for unmodified CUDA programs (LD_PRELOAD pool allocator).\n"
    "\n"
    "commands:\n"
    "  run     run a program with the shim preloaded        poolshim run -- ./app args\n"
    "  ab      time a program without and with the shim     poolshim ab --runs 3 -- ./app\n"
    "  replay  replay an allocation log against stacks      poolshim replay log.csv --simulate 80GiB\n"
    "  plot    draw memory over time from a log (SVG)       poolshim plot log.csv -o memory.svg\n"
    "  stats   merge the statistics of a job's processes    poolshim stats out/stats_*.json\n"
    "  config  show or check the effective configuration    poolshim config --help\n"
    "  top     live figures of each process under the shim  poolshim top --once\n"
    "  export  a log for PyTorch memory_viz or Perfetto     poolshim export log.csv --perfetto t.json\n"
    "  version print the version (also --version)           poolshim --version\n"
    "\n"
    "'poolshim <command> --help' describes each command; 'man poolshim' all of them,\n"
    "'man 7 poolshim' the environment and the configuration.\n";

typedef struct subcommand {
    const char *name;                  /* as typed */
    int (*run)(int argc, char **argv); /* entry point */
} subcommand_t;

int main(int argc, char **argv)
{
    if (argc < 2) {
        fputs(usage_text, stderr);
        return CLI_EXIT_USAGE;
    }
    const char *name = argv[1];
    if (!strcmp(name, "--help") || !strcmp(name, "-h") || !strcmp(name, "help")) {
        fputs(usage_text, stdout);
        return CLI_EXIT_OK;
    }
    if (!strcmp(name, "--version") || !strcmp(name, "-V") || !strcmp(name, "version")) {
        puts("poolshim " POOLSHIM_VERSION);
        return CLI_EXIT_OK;
    }
    const subcommand_t subcommands[] = {
        {"run", ps_cmd_run},
        {"ab", ps_cmd_ab},
        {"replay", ps_cmd_replay},
        {"plot", ps_cmd_plot},
        {"stats", ps_cmd_stats},
        {"config", ps_cmd_config},
        {"top", ps_cmd_top},
        {"export", ps_cmd_export},
        {"replay-gpu-driver", replay_gpu_driver_main}, /* internal: what `replay` runs under the shim */
    };
    for (size_t i = 0; i < sizeof subcommands / sizeof subcommands[0]; i++) {
        if (strcmp(name, subcommands[i].name) != 0)
            continue;
        return subcommands[i].run(argc - 1, argv + 1);
    }
    fprintf(stderr, "poolshim: error: unknown command '%s'\n\n%s", name, usage_text);
    return CLI_EXIT_USAGE;
}
