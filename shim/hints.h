/* Hints at exit (shim/hints.c). */
#ifndef PS_SHIM_HINTS_H
#define PS_SHIM_HINTS_H

/* At exit, after the report (when ps_stats_report_at_exit says this is the
 * process's own exit): one warning when PyTorch's caching allocator or
 * CuPy's pool kept the framework's memory away from the shim. Reads memory
 * and the loaded objects' names only. */
void ps_hints_at_exit(void);

#endif
