/* NVTX annotations (leaves: NVTX calls only, never CUDA):
 * shim/nvtx.c (debug.nvtx: chunks as NVTX heaps, blocks as regions, for
 * compute-sanitizer) and shim/nvtx_ranges.c (debug.nvtx_ranges: ranges
 * around a GPU-ops table's slow entries, for Nsight). */
#ifndef PS_SHIM_NVTX_H
#define PS_SHIM_NVTX_H

#include "common.h"

/* ---- nvtx.c: debug.nvtx ---- */
/* 1 when debug.nvtx is on; every caller tests it first (the option off
 * costs one branch). Set by the router at init, before any stack exists. */
extern int ps_nvtx_on;
void ps_nvtx_enable(void);
/* Device memory taken from CUDA (a chunk, a mapped piece) / given back. */
void ps_nvtx_heap_add(void *base, size_t size, int device);
void ps_nvtx_heap_remove(void *base);
/* A block handed to the program (`size` = the bytes asked for) / freed. */
void ps_nvtx_region_add(void *ptr, size_t size);
void ps_nvtx_region_remove(void *ptr, size_t size);
/* The device's context died: forget its heaps. */
void ps_nvtx_drop_device(int device);
/* Heaps registered now (tests). */
size_t ps_nvtx_heap_count(void);

/* ---- nvtx_ranges.c: debug.nvtx_ranges (wraps a GPU-ops table) ---- */
/* Replaces the slow entries of a device's freshly made table by wrappers
 * that push an NVTX range around each call (see the file's top). */
void ps_nvtx_ranges_wrap(ps_gpu_ops_t *gpu);

#endif
