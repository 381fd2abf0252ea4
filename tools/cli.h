/* The poolshim CLI's subcommands, one function each (tools/cmd_*.c);
 * main() in tools/poolshim.c dispatches to them. Each returns the process
 * exit status. */
#ifndef PS_CLI_H
#define PS_CLI_H

/* `poolshim config [--file F] [--options S] [--check] [--device N]`:
 * argv[0] is "config". */
int ps_cmd_config(int argc, char **argv);

#endif
