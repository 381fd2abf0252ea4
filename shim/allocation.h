/* The record of one allocation handed out by the shim: what the registry
 * (shim/registry.c) keeps per pointer, and what the router answers about a
 * pooled block (ps_route_pooled_block). A type only. */
#ifndef PS_SHIM_ALLOCATION_H
#define PS_SHIM_ALLOCATION_H

#include "common.h"

typedef struct ps_allocation {
    uintptr_t ptr;      /* the device pointer handed out (key) */
    size_t size;        /* the size the program asked for */
    ps_stream_t stream; /* allocation stream, PS_STREAM_NONE for cudaMalloc */
    int16_t device;     /* device whose stack owns it */
    uint8_t door;       /* PS_DOOR_RUNTIME or PS_DOOR_DRIVER */
    uint8_t direct : 1; /* 1: went straight to CUDA (direct_min_size), not pooled */
    uint8_t host : 1;   /* 1: pinned host memory from the device's host pool (cudaFreeHost frees it) */
    uint32_t generation; /* the device's context generation when it was handed out */
} ps_allocation_t;

#endif
