/* IPC of pooled memory between two processes, over the fake CUDA (whose
 * virtual memory, FAKE_CUDA_VMM=1, is memfd-backed: an exported piece
 * really is the same memory in both processes). argv[1] picks the role;
 * exit 0 = passed.
 *
 *   share    (the exporter; run under the shim with FAKE_CUDA_VMM=1)
 *     1. cudaMalloc a block spanning several pieces and a small one, write
 *        a pattern; cudaIpcGetMemHandle: our format (magic, pid, size), the
 *        same handle for the block again and for a pointer inside it, a
 *        different id for the other block;
 *     2. fork+exec `open` (under the shim: LD_PRELOAD is inherited), which
 *        opens the handle, checks the pattern and cuMemGetAddressRange,
 *        writes its own pattern, opens again (same pointer), closes twice;
 *        the exporter sees the child's pattern in its block;
 *     3. its own handle in this process and a damaged handle are refused
 *        without reaching the driver; a handle of the fake driver's own
 *        format and a garbage one pass through to the driver unchanged;
 *     4. the block is freed (and a new block of the same size made, with a
 *        new id): `open_stale` must be refused with the stale-handle error.
 *   refused  cudaIpcGetMemHandle of a pooled block is refused (chunked pool,
 *            global.ipc=0, a device without POSIX fd handles), and a
 *            direct allocation (global.direct_min_size) still exports natively.
 *   export DIR   (tests/shim/test_security.c) with DIR/wait_go, waits for
 *            DIR/go first; then exports a block of BIG bytes with the
 *            exporter's pattern, writes its handle in hex to DIR/handle and
 *            creates DIR/ready; idles until DIR/release (at most 30 s), then
 *            checks the importers' pattern when DIR/written exists.
 *   open_refused HEX SIZE   opening the handle must be refused (invalid value).
 */
#include <sys/stat.h>
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

#include "prog_common.h"

extern cudaError_t cudaMalloc(void **, size_t);
extern cudaError_t cudaFree(void *);
extern cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *, void *);
extern cudaError_t cudaIpcOpenMemHandle(void **, cudaIpcMemHandle_t, unsigned int);
extern cudaError_t cudaIpcCloseMemHandle(void *);

#define BIG ((size_t)17 << 20) + 4096 /* spans at least three 8 MiB pieces (the default) */
#define SMALL ((size_t)4096)

static void to_hex(const cudaIpcMemHandle_t *h, char *out)
{
    for (int i = 0; i < 64; i++)
        sprintf(out + 2 * i, "%02x", (unsigned char)h->reserved[i]);
}

static int from_hex(const char *s, cudaIpcMemHandle_t *h)
{
    if (strlen(s) != 128)
        return -1;
    for (int i = 0; i < 64; i++) {
        unsigned v;
        if (sscanf(s + 2 * i, "%2x", &v) != 1)
            return -1;
        h->reserved[i] = (char)v;
    }
    return 0;
}

/* Runs this program again as `role HEX SIZE`; returns its exit status. */
static int spawn(const char *self, const char *role, const cudaIpcMemHandle_t *h, size_t size)
{
    char hex[129], sz[32];
    to_hex(h, hex);
    snprintf(sz, sizeof sz, "%zu", size);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        execl(self, self, role, hex, sz, (char *)NULL);
        _exit(127);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void share(const char *self)
{
    CHECK(shim_active(), "this scenario runs under the shim");
    void *big = NULL, *small = NULL;
    CHECK(cudaMalloc(&big, BIG) == cudaSuccess && cudaMalloc(&small, SMALL) == cudaSuccess, "cudaMalloc");
    if (!big || !small)
        return;
    fill(big, BIG, 1);
    unsigned long shareable = fake()->vm_created_shareable;
    CHECK(shareable > 0, "the expandable pool created exportable memory (%lu pieces)", shareable);

    /* 1. the handle */
    cudaIpcMemHandle_t h, again, inner, other;
    CHECK(cudaIpcGetMemHandle(&h, big) == cudaSuccess, "cudaIpcGetMemHandle of a pooled block");
    CHECK(memcmp(h.reserved, "PSHMIPC\x02", 8) == 0, "our magic");
    uint32_t pid;
    uint64_t id, other_id, size;
    memcpy(&pid, h.reserved + 8, 4);
    memcpy(&id, h.reserved + 16, 8);
    memcpy(&size, h.reserved + 32, 8);
    CHECK(pid == (uint32_t)getpid(), "the exporter's pid (%u)", pid);
    CHECK(size == BIG, "the block's size (%llu)", (unsigned long long)size);
    CHECK(cudaIpcGetMemHandle(&again, big) == cudaSuccess && !memcmp(&again, &h, sizeof h), "same block, same handle");
    CHECK(cudaIpcGetMemHandle(&inner, (char *)big + 12345) == cudaSuccess && !memcmp(&inner, &h, sizeof h),
          "a pointer inside the block gives the block's handle");
    CHECK(cudaIpcGetMemHandle(&other, small) == cudaSuccess, "second block");
    memcpy(&other_id, other.reserved + 16, 8);
    CHECK(other_id != id, "another block, another id");

    /* 2. another process opens it, checks, writes back */
    int rc = spawn(self, "open", &h, BIG);
    CHECK(rc == 0, "the importing process failed (%d)", rc);
    CHECK(intact(big, BIG, 2), "the importer's writes are in the exporter's block");

    /* 3. refused here, or passed through */
    unsigned long native = fake()->ipc_open_native;
    void *q = NULL;
    CHECK(cudaIpcOpenMemHandle(&q, other, 1) == cudaErrorInvalidValue, "a process cannot open its own handle");
    cudaIpcMemHandle_t damaged = h;
    damaged.reserved[40] ^= 1;
    CHECK(cudaIpcOpenMemHandle(&q, damaged, 1) == cudaErrorInvalidValue, "a damaged handle is refused");
    CHECK(fake()->ipc_open_native == native, "handles of ours never reach the driver");
    cudaIpcMemHandle_t foreign;
    memset(&foreign, 0, sizeof foreign);
    uintptr_t marker = 0x7e57000;
    memcpy(foreign.reserved, &marker, sizeof marker);
    memcpy(foreign.reserved + 8, "FAKEIPC", 8);
    q = NULL;
    CHECK(cudaIpcOpenMemHandle(&q, foreign, 1) == cudaSuccess && (uintptr_t)q == marker,
          "a driver handle passes through unchanged (got %p)", q);
    memset(foreign.reserved + 8, 'x', 8);
    CHECK(cudaIpcOpenMemHandle(&q, foreign, 1) == cudaErrorInvalidValue, "garbage: the driver's own answer");
    CHECK(fake()->ipc_open_native == native + 2, "both foreign handles reached the driver (%lu)",
          fake()->ipc_open_native - native);

    /* 4. freed: the handle is stale, a new block gets a new id */
    CHECK(cudaFree(big) == cudaSuccess, "free");
    void *reused = NULL;
    CHECK(cudaMalloc(&reused, BIG) == cudaSuccess, "cudaMalloc again");
    cudaIpcMemHandle_t fresh;
    uint64_t fresh_id = id;
    CHECK(cudaIpcGetMemHandle(&fresh, reused) == cudaSuccess, "handle of the new block");
    memcpy(&fresh_id, fresh.reserved + 16, 8);
    CHECK(fresh_id != id && fresh_id != other_id, "a new block (at %s address) gets a new id",
          reused == big ? "the same" : "another");
    rc = spawn(self, "open_stale", &h, BIG);
    CHECK(rc == 0, "the stale handle was not refused as such (%d)", rc);
    CHECK(cudaFree(reused) == cudaSuccess && cudaFree(small) == cudaSuccess, "free");
}

static void open_role(const char *hex, size_t size, int stale)
{
    cudaIpcMemHandle_t h;
    CHECK(from_hex(hex, &h) == 0, "handle argument");
    CHECK(shim_active(), "the importer runs under the shim too");
    void *p = NULL;
    cudaError_t e = cudaIpcOpenMemHandle(&p, h, 1);
    if (stale) {
        CHECK(e == cudaErrorInvalidValue, "the handle must be refused (got %d)", e);
        return;
    }
    CHECK(e == cudaSuccess && p, "cudaIpcOpenMemHandle (%d)", e);
    if (e != cudaSuccess)
        return;
    CHECK(intact(p, size, 1), "the exporter's pattern");
    CUresult (*range)(CUdeviceptr *, size_t *, CUdeviceptr) =
        (CUresult(*)(CUdeviceptr *, size_t *, CUdeviceptr))dlsym(RTLD_DEFAULT, "cuMemGetAddressRange_v2");
    CUdeviceptr base = 0;
    size_t bytes = 0;
    CHECK(range && range(&base, &bytes, (CUdeviceptr)(uintptr_t)p + 100) == CUDA_SUCCESS &&
              base == (CUdeviceptr)(uintptr_t)p && bytes == size,
          "cuMemGetAddressRange of an opened block answers the block (%llx, %zu)", base, bytes);
    fill(p, size, 2);
    void *p2 = NULL;
    CHECK(cudaIpcOpenMemHandle(&p2, h, 1) == cudaSuccess && p2 == p, "opened again: the same pointer");
    unsigned long native = fake()->ipc_close_native;
    CHECK(cudaIpcCloseMemHandle(p2) == cudaSuccess && cudaIpcCloseMemHandle(p) == cudaSuccess, "close twice");
    CHECK(fake()->ipc_close_native == native, "closing our imports never reaches the driver");
    CHECK(fake()->vm_imported > 0 && fake()->vm_released >= fake()->vm_imported, "every import released (%lu/%lu)",
          fake()->vm_released, fake()->vm_imported);
    cudaIpcCloseMemHandle(p);
    CHECK(fake()->ipc_close_native == native + 1, "a pointer no longer ours passes through to the driver");
}

static int exists(const char *dir, const char *name)
{
    char path[512];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return stat(path, &st) == 0;
}

/* Waits up to `seconds` for dir/name; 1 when it came. */
static int wait_for(const char *dir, const char *name, int seconds)
{
    for (int i = 0; i < seconds * 100; i++) {
        if (exists(dir, name))
            return 1;
        usleep(10000);
    }
    return 0;
}

static void export_and_wait(const char *dir)
{
    if (exists(dir, "wait_go"))
        CHECK(wait_for(dir, "go", 10), "export: no go within 10 s");
    void *big = NULL;
    cudaIpcMemHandle_t h;
    CHECK(cudaMalloc(&big, BIG) == cudaSuccess, "cudaMalloc");
    if (!big)
        return;
    fill(big, BIG, 1);
    cudaError_t e = cudaIpcGetMemHandle(&h, big);
    CHECK(e == cudaSuccess, "cudaIpcGetMemHandle (%d)", e);
    char hex[129], path[512], temporary[512];
    to_hex(&h, hex);
    snprintf(path, sizeof path, "%s/handle", dir);
    snprintf(temporary, sizeof temporary, "%s/handle.new", dir);
    FILE *f = fopen(temporary, "w");
    CHECK(f, "cannot write %s", temporary);
    if (f) {
        fprintf(f, "%s\n", hex);
        fclose(f);
        rename(temporary, path);
    }
    snprintf(path, sizeof path, "%s/ready", dir);
    f = fopen(path, "w");
    if (f)
        fclose(f);
    CHECK(wait_for(dir, "release", 30), "export: no release within 30 s");
    if (exists(dir, "written"))
        CHECK(intact(big, BIG, 2), "the importer's writes are in the exporter's block");
    CHECK(cudaFree(big) == cudaSuccess, "free");
}

static void refused(void)
{
    const char *options = getenv("POOLSHIM_OPTIONS");
    int direct = options && strstr(options, "direct_min_size");
    void *p = NULL;
    cudaIpcMemHandle_t h;
    CHECK(cudaMalloc(&p, BIG) == cudaSuccess, "cudaMalloc");
    cudaError_t e = cudaIpcGetMemHandle(&h, p);
    if (!shim_active() || direct) {
        CHECK(e == cudaSuccess && !memcmp(h.reserved + 8, "FAKEIPC", 8), "a whole CUDA allocation: the driver's handle (%d)", e);
    } else {
        CHECK(e == cudaErrorInvalidValue, "IPC of a pooled block that cannot be exported is refused (%d)", e);
        CHECK(fake()->vm_created_shareable == 0, "no exportable memory was created (%lu)", fake()->vm_created_shareable);
    }
    cudaFree(p);
}

int main(int argc, char **argv)
{
    const char *what = argc > 1 ? argv[1] : "share";
    if (!strcmp(what, "share")) share("/proc/self/exe");
    else if (!strcmp(what, "open") && argc == 4) open_role(argv[2], strtoull(argv[3], NULL, 0), 0);
    else if (!strcmp(what, "open_stale") && argc == 4) open_role(argv[2], strtoull(argv[3], NULL, 0), 1);
    else if (!strcmp(what, "open_refused") && argc == 4) open_role(argv[2], strtoull(argv[3], NULL, 0), 1);
    else if (!strcmp(what, "export") && argc == 3) export_and_wait(argv[2]);
    else if (!strcmp(what, "refused")) refused();
    else { fprintf(stderr, "unknown scenario %s\n", what); return 2; }
    return finish(what);
}
