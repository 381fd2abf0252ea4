/* STUB: placeholder so the tree links; replaced by the real implementation. */
#include "adaptors.h"

int ps_limit_create(const char *name, ps_resource_t *upstream, size_t limit_bytes, ps_resource_t **out)
{ return PS_EUNSUPPORTED; }

int ps_stats_create(const char *name, ps_resource_t *upstream, ps_resource_t **out)
{ return PS_EUNSUPPORTED; }

void ps_stats_get(ps_resource_t *stats_adaptor, ps_stats_t *out)
{ (void)stats_adaptor; (void)out; }

void ps_stats_write_text(FILE *f, int device, const ps_stats_t *s)
{ (void)f; (void)device; (void)s; }

void ps_stats_write_json(FILE *f, int device, const ps_stats_t *s)
{ (void)f; (void)device; (void)s; }

int ps_track_create(const char *name, ps_resource_t *upstream, unsigned stack_depth, ps_resource_t **out)
{ return PS_EUNSUPPORTED; }

size_t ps_track_report(ps_resource_t *track_adaptor, FILE *f)
{ (void)track_adaptor; (void)f; return 0; }

int ps_log_create(const char *name, ps_resource_t *upstream, const char *path, ps_resource_t **out)
{ return PS_EUNSUPPORTED; }

int ps_log_flush(ps_resource_t *log_adaptor)
{ (void)log_adaptor; return PS_EUNSUPPORTED; }

