/* A stand-in for libnvidia-ml.so.1, to test nvml_peak.py and run.sh on a machine
 * without a GPU (selftest/run.sh builds it). GPU 0 "uses" 1 GiB plus the number of
 * bytes written, in decimal, in the file $FAKE_NVML_FILE (a workload can change it
 * as it runs); one compute process, pid 4242, holds that amount above 1 GiB. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int pid; unsigned long long usedGpuMemory; unsigned int gpuInstanceId, computeInstanceId; } nvmlProcessInfo_t;

static int inited;
static unsigned long long extra(void)
{
    const char *path = getenv("FAKE_NVML_FILE");
    unsigned long long v = 0;
    FILE *f = path ? fopen(path, "r") : NULL;
    if (f) {
        if (fscanf(f, "%llu", &v) != 1)
            v = 0;
        fclose(f);
    }
    return v;
}

int nvmlInit_v2(void) { inited = 1; return 0; }
int nvmlShutdown(void) { inited = 0; return 0; }
const char *nvmlErrorString(int code) { return code == 2 ? "Invalid Argument" : code == 1 ? "Uninitialized" : "Unknown Error"; }
int nvmlDeviceGetHandleByIndex_v2(unsigned int index, void **handle)
{
    if (!inited) return 1;
    if (index != 0) return 2;
    *handle = (void *)0x1234;
    return 0;
}
int nvmlDeviceGetName(void *handle, char *name, unsigned int length)
{
    if (handle != (void *)0x1234) return 2;
    snprintf(name, length, "Fake GPU");
    return 0;
}
int nvmlDeviceGetMemoryInfo(void *handle, nvmlMemory_t *m)
{
    if (!inited) return 1;
    if (handle != (void *)0x1234) return 2;
    m->total = 80ULL << 30;
    m->used = (1ULL << 30) + extra();
    m->free = m->total - m->used;
    return 0;
}
int nvmlDeviceGetComputeRunningProcesses_v3(void *handle, unsigned int *count, nvmlProcessInfo_t *infos)
{
    if (handle != (void *)0x1234) return 2;
    unsigned long long e = extra();
    if (!e) { *count = 0; return 0; }
    if (*count < 1) { *count = 1; return 7; }
    memset(infos, 0, sizeof *infos);
    infos[0].pid = 4242;
    infos[0].usedGpuMemory = e;
    *count = 1;
    return 0;
}
