/* track adaptor: remembers every outstanding allocation (core/adaptors.h).
 *
 * Algorithm:
 *  1. allocate forwards, then records {pointer, size, stream, time, up to
 *     stack_depth return addresses from backtrace()} in a chained hash table
 *     keyed by pointer (mutex; the table doubles when it is full).
 *  2. deallocate removes the record (a pointer it does not know is
 *     forwarded anyway: the upstream decides whether it is bad).
 *  3. ps_track_report groups what is left by call stack, largest first,
 *     and resolves each frame with dladdr at report time (function name,
 *     offset, object); our own frames (ps_*, poolshim*) are skipped, so the
 *     first line shown is the program's call site. It reads memory only.
 *  4. ps_track_write_site writes one live record's frames the same way
 *     (the guard adaptor names the allocation site of an overwritten block).
 * Guarantees: thread-safe; costs one backtrace() per allocation when
 * stack_depth > 0. Executables need -rdynamic for dladdr to name their
 * functions (shared libraries are named without it).
 */
#include "adaptors.h"

#include <dlfcn.h>
#include <execinfo.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define TRACK_MAX_DEPTH 64 /* frames kept at most */

typedef struct record {
    void *ptr;            /* the allocation */
    size_t size;          /* bytes asked */
    ps_stream_t stream;   /* its stream (PS_STREAM_NONE for cudaMalloc) */
    uint64_t time_ns;     /* ps_now_ns() at allocation */
    unsigned depth;       /* entries in frames */
    struct record *next;  /* hash chain */
    void *frames[];       /* return addresses, innermost first */
} record_t;

typedef struct track {
    ps_resource_t base;     /* vtable first */
    unsigned stack_depth;   /* frames per record */
    pthread_mutex_t lock;   /* guards the table */
    record_t **buckets;     /* chains */
    size_t bucket_count;    /* power of two */
    size_t count;           /* records */
} track_t;

static size_t bucket_of(const track_t *t, const void *p)
{
    uint64_t h = (uint64_t)(uintptr_t)p * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 32) & (t->bucket_count - 1);
}

/* Doubles the table. Lock held. */
static void rehash(track_t *t)
{
    size_t n = t->bucket_count * 2;
    record_t **nb = calloc(n, sizeof *nb);
    if (!nb)
        return; /* keep the longer chains */
    record_t **old = t->buckets;
    size_t old_n = t->bucket_count;
    t->buckets = nb;
    t->bucket_count = n;
    for (size_t i = 0; i < old_n; i++) {
        for (record_t *r = old[i]; r;) {
            record_t *next = r->next;
            size_t b = bucket_of(t, r->ptr);
            r->next = nb[b];
            nb[b] = r;
            r = next;
        }
    }
    free(old);
}

static int track_allocate(ps_resource_t *r, size_t size, ps_stream_t stream, void **out)
{
    track_t *t = (track_t *)r;
    record_t *rec = malloc(sizeof *rec + t->stack_depth * sizeof(void *));
    if (!rec)
        return PS_ENOMEM;
    rec->depth = 0;
    if (t->stack_depth) {
        void *frames[TRACK_MAX_DEPTH + 1];
        int n = backtrace(frames, (int)t->stack_depth + 1);
        /* drop frame 0: this function */
        for (int i = 1; i < n; i++)
            rec->frames[rec->depth++] = frames[i];
    }
    int status = ps_allocate(r->upstream, size, stream, out);
    if (status != PS_OK) {
        free(rec);
        return status;
    }
    rec->ptr = *out;
    rec->size = size;
    rec->stream = stream;
    rec->time_ns = ps_now_ns();
    pthread_mutex_lock(&t->lock);
    if (t->count >= t->bucket_count)
        rehash(t);
    size_t b = bucket_of(t, rec->ptr);
    rec->next = t->buckets[b];
    t->buckets[b] = rec;
    t->count++;
    pthread_mutex_unlock(&t->lock);
    return PS_OK;
}

static int track_deallocate(ps_resource_t *r, void *ptr, size_t size, ps_stream_t stream)
{
    track_t *t = (track_t *)r;
    int status = ps_deallocate(r->upstream, ptr, size, stream);
    if (status != PS_OK)
        return status;
    pthread_mutex_lock(&t->lock);
    record_t **link = &t->buckets[bucket_of(t, ptr)];
    while (*link && (*link)->ptr != ptr)
        link = &(*link)->next;
    record_t *found = *link;
    if (found) {
        *link = found->next;
        t->count--;
    }
    pthread_mutex_unlock(&t->lock);
    free(found);
    return PS_OK;
}

static void track_destroy(ps_resource_t *r)
{
    track_t *t = (track_t *)r;
    for (size_t i = 0; i < t->bucket_count; i++)
        for (record_t *rec = t->buckets[i]; rec;) {
            record_t *next = rec->next;
            free(rec);
            rec = next;
        }
    free(t->buckets);
    pthread_mutex_destroy(&t->lock);
    free(t);
}

static const ps_resource_ops_t track_ops = PS_ADAPTOR_OPS("track", track_allocate, track_deallocate, track_destroy);

int ps_track_create(const char *name, ps_resource_t *upstream, unsigned stack_depth,
                    ps_resource_t **out)
{
    track_t *t = NULL;
    int status = ps_adaptor_start(sizeof *t, 0, &track_ops, name, upstream, out, (void **)&t);
    if (status != PS_OK)
        return status;
    t->bucket_count = 1024;
    t->buckets = calloc(t->bucket_count, sizeof *t->buckets);
    if (!t->buckets) {
        free(t);
        return PS_ENOMEM;
    }
    t->stack_depth = stack_depth > TRACK_MAX_DEPTH ? TRACK_MAX_DEPTH : stack_depth;
    pthread_mutex_init(&t->lock, NULL);
    *out = &t->base;
    return PS_OK;
}

/* ---- the report ---- */

/* One call site: records with the same frames. */
typedef struct site {
    const record_t *first; /* a record with these frames */
    size_t count;          /* allocations */
    uint64_t bytes;        /* bytes */
} site_t;

static int same_frames(const record_t *a, const record_t *b)
{
    return a->depth == b->depth && memcmp(a->frames, b->frames, a->depth * sizeof(void *)) == 0;
}

static int by_bytes_desc(const void *x, const void *y)
{
    const site_t *a = x, *b = y;
    return a->bytes < b->bytes ? 1 : a->bytes > b->bytes ? -1 : 0;
}

/* Frames of poolshim itself are not the program's call site: our named
 * functions, anything in libpoolshim, and unnamed (static or inlined-
 * elsewhere) code of the object poolshim's core is linked into. */
static int is_own_frame(const Dl_info *info)
{
    Dl_info self;
    if (!info->dli_sname && dladdr((void *)ps_track_report, &self) && self.dli_fbase == info->dli_fbase)
        return 1;
    if (info->dli_sname &&
        (strncmp(info->dli_sname, "ps_", 3) == 0 || strncmp(info->dli_sname, "poolshim", 8) == 0))
        return 1;
    return info->dli_fname && strstr(info->dli_fname, "libpoolshim") != NULL;
}

static void write_frames(FILE *f, const record_t *rec)
{
    if (rec->depth == 0) {
        fprintf(f, "    (no call stack: track.stack_depth = 0)\n");
        return;
    }
    int shown = 0;
    for (unsigned i = 0; i < rec->depth; i++) {
        void *pc = rec->frames[i];
        Dl_info info;
        int known = dladdr(pc, &info) != 0;
        if (known && !shown && is_own_frame(&info))
            continue;
        shown++;
        if (known && info.dli_sname)
            fprintf(f, "    #%d %s+0x%lx (%s)\n", shown - 1, info.dli_sname,
                    (unsigned long)((uintptr_t)pc - (uintptr_t)info.dli_saddr),
                    info.dli_fname ? info.dli_fname : "?");
        else if (known)
            fprintf(f, "    #%d %p (%s+0x%lx)\n", shown - 1, pc, info.dli_fname ? info.dli_fname : "?",
                    (unsigned long)((uintptr_t)pc - (uintptr_t)info.dli_fbase));
        else
            fprintf(f, "    #%d %p\n", shown - 1, pc);
    }
}

static void write_site(FILE *f, const site_t *s)
{
    char b[32];
    fprintf(f, "  %zu allocation%s, %s, at:\n", s->count, s->count == 1 ? "" : "s",
            ps_format_bytes(b, sizeof b, s->bytes));
    write_frames(f, s->first);
}

bool ps_track_write_site(ps_resource_t *track_adaptor, const void *ptr, FILE *f)
{
    track_t *t = (track_t *)track_adaptor;
    pthread_mutex_lock(&t->lock);
    const record_t *rec = t->buckets[bucket_of(t, ptr)];
    while (rec && rec->ptr != ptr)
        rec = rec->next;
    if (rec)
        write_frames(f, rec);
    pthread_mutex_unlock(&t->lock);
    return rec != NULL;
}

size_t ps_track_report(ps_resource_t *track_adaptor, FILE *f)
{
    track_t *t = (track_t *)track_adaptor;
    pthread_mutex_lock(&t->lock);
    size_t leaks = t->count;
    site_t *sites = leaks ? calloc(leaks, sizeof *sites) : NULL;
    size_t site_count = 0;
    uint64_t bytes = 0;
    for (size_t i = 0; i < t->bucket_count && (sites || !leaks); i++) {
        for (const record_t *rec = t->buckets[i]; rec; rec = rec->next) {
            bytes += rec->size;
            size_t s = 0;
            while (s < site_count && !same_frames(sites[s].first, rec))
                s++;
            if (s == site_count)
                sites[site_count++].first = rec;
            sites[s].count++;
            sites[s].bytes += rec->size;
        }
    }
    if (leaks == 0) {
        fprintf(f, "poolshim: track '%s': no leaks\n", track_adaptor->name);
    } else if (!sites) {
        fprintf(f, "poolshim: track '%s': %zu allocations never freed (no memory to group them)\n",
                track_adaptor->name, leaks);
    } else {
        char b[32];
        qsort(sites, site_count, sizeof *sites, by_bytes_desc);
        fprintf(f, "poolshim: track '%s': %zu allocation%s (%s) never freed, from %zu call site%s\n",
                track_adaptor->name, leaks, leaks == 1 ? "" : "s", ps_format_bytes(b, sizeof b, bytes),
                site_count, site_count == 1 ? "" : "s");
        for (size_t s = 0; s < site_count; s++)
            write_site(f, &sites[s]);
    }
    pthread_mutex_unlock(&t->lock);
    free(sites);
    return leaks;
}
