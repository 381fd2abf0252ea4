/* A small JSON reader for the tools: the shim's statistics, the CUPTI
 * library's report and saved `ab --json` results. Not a general library:
 * whole documents in memory, numbers as double (and exact uint64 when they
 * are non-negative integers), strings UTF-8 with \uXXXX decoded for BMP.
 * Return rule: 0 or -1 (with a message in err).
 */
#ifndef PS_TOOLS_JSON_H
#define PS_TOOLS_JSON_H

#include <stddef.h>
#include <stdint.h>

typedef enum { JSON_NULL, JSON_BOOL, JSON_NUMBER, JSON_STRING, JSON_ARRAY, JSON_OBJECT } json_type_t;

typedef struct json_value json_value_t;
struct json_value {
    json_type_t type;       /* which of the fields below mean something */
    int boolean;            /* JSON_BOOL */
    double number;          /* JSON_NUMBER */
    uint64_t integer;       /* JSON_NUMBER that is a non-negative integer (exact) */
    int is_integer;         /* 1 when `integer` holds the exact value */
    char *string;           /* JSON_STRING (NUL-terminated) */
    json_value_t *items;    /* JSON_ARRAY elements / JSON_OBJECT values */
    char **keys;            /* JSON_OBJECT keys, parallel to items */
    size_t count;           /* elements or members */
};

/* Parses `text` (NUL-terminated). On error writes "line L, column C: what"
 * into err and returns -1. */
int json_parse(const char *text, json_value_t **out, char *err, size_t errsize);
void json_free(json_value_t *value);

/* Member of an object by key, or NULL. */
const json_value_t *json_get(const json_value_t *object, const char *key);
/* Member by dotted path ("bytes.reserved_peak"), or NULL. */
const json_value_t *json_path(const json_value_t *object, const char *path);
/* Number at path as uint64 / double, or `fallback` when absent or not a number. */
uint64_t json_u64(const json_value_t *object, const char *path, uint64_t fallback);
double json_double(const json_value_t *object, const char *path, double fallback);
/* String at path, or `fallback`. */
const char *json_str(const json_value_t *object, const char *path, const char *fallback);

#endif
