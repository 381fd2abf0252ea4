/* A recursive-descent JSON reader (see json.h).
 *
 * Algorithm: 1. skip white space; 2. dispatch on the first character of a
 * value; 3. objects and arrays collect members into growing arrays;
 * 4. the first error stops parsing and reports its line and column.
 * Guarantees: never reads past the terminating NUL; depth is bounded (64)
 * so hostile input cannot overflow the stack; on error nothing leaks.
 */
#include "json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JSON_MAX_DEPTH 64

typedef struct json_parser {
    const char *text;  /* whole document */
    const char *at;    /* next character */
    char *err;         /* error message buffer */
    size_t errsize;    /* its size */
    int failed;        /* an error was reported */
} json_parser_t;

static void fail(json_parser_t *p, const char *what)
{
    if (p->failed)
        return;
    p->failed = 1;
    int line = 1, column = 1;
    for (const char *c = p->text; c < p->at; c++) {
        if (*c == '\n') {
            line++;
            column = 1;
        } else {
            column++;
        }
    }
    snprintf(p->err, p->errsize, "line %d, column %d: %s", line, column, what);
}

static void skip_space(json_parser_t *p)
{
    while (*p->at == ' ' || *p->at == '\t' || *p->at == '\n' || *p->at == '\r')
        p->at++;
}

static int parse_value(json_parser_t *p, json_value_t *v, int depth);

static void put_utf8(char *out, size_t *n, unsigned code)
{
    if (code < 0x80) {
        out[(*n)++] = (char)code;
    } else if (code < 0x800) {
        out[(*n)++] = (char)(0xC0 | (code >> 6));
        out[(*n)++] = (char)(0x80 | (code & 0x3F));
    } else {
        out[(*n)++] = (char)(0xE0 | (code >> 12));
        out[(*n)++] = (char)(0x80 | ((code >> 6) & 0x3F));
        out[(*n)++] = (char)(0x80 | (code & 0x3F));
    }
}

static char *parse_string(json_parser_t *p)
{
    if (*p->at != '"') {
        fail(p, "expected a string");
        return NULL;
    }
    p->at++;
    const char *start = p->at;
    size_t length = 0;
    while (*p->at && *p->at != '"') {
        if (*p->at == '\\' && p->at[1])
            p->at++;
        p->at++;
        length++;
    }
    if (*p->at != '"') {
        fail(p, "unterminated string");
        return NULL;
    }
    char *out = malloc(length * 3 + 1); /* \uXXXX -> at most 3 bytes */
    if (!out) {
        fail(p, "out of memory");
        return NULL;
    }
    size_t n = 0;
    for (const char *c = start; c < p->at; c++) {
        if (*c != '\\') {
            out[n++] = *c;
            continue;
        }
        c++;
        switch (*c) {
        case 'n': out[n++] = '\n'; break;
        case 't': out[n++] = '\t'; break;
        case 'r': out[n++] = '\r'; break;
        case 'b': out[n++] = '\b'; break;
        case 'f': out[n++] = '\f'; break;
        case 'u': {
            unsigned code = 0;
            int digits = 0;
            for (; digits < 4 && c[1]; digits++) {
                char h = *++c;
                code = code * 16 + (unsigned)(h >= '0' && h <= '9' ? h - '0'
                                              : h >= 'a' && h <= 'f' ? h - 'a' + 10
                                              : h >= 'A' && h <= 'F' ? h - 'A' + 10 : 0);
            }
            put_utf8(out, &n, code);
            break;
        }
        default: out[n++] = *c; break;
        }
    }
    out[n] = '\0';
    p->at++;
    return out;
}

static int add_item(json_parser_t *p, json_value_t *v, size_t *capacity, int with_keys)
{
    if (v->count < *capacity)
        return 0;
    size_t grown = *capacity ? *capacity * 2 : 8;
    json_value_t *items = realloc(v->items, grown * sizeof *items);
    if (!items) {
        fail(p, "out of memory");
        return -1;
    }
    v->items = items;
    if (with_keys) {
        char **keys = realloc(v->keys, grown * sizeof *keys);
        if (!keys) {
            fail(p, "out of memory");
            return -1;
        }
        v->keys = keys;
    }
    *capacity = grown;
    return 0;
}

static int parse_container(json_parser_t *p, json_value_t *v, int depth, int is_object)
{
    char close = is_object ? '}' : ']';
    v->type = is_object ? JSON_OBJECT : JSON_ARRAY;
    p->at++;
    skip_space(p);
    if (*p->at == close) {
        p->at++;
        return 0;
    }
    size_t capacity = 0;
    for (;;) {
        skip_space(p);
        if (add_item(p, v, &capacity, is_object) != 0)
            return -1;
        json_value_t *item = &v->items[v->count];
        memset(item, 0, sizeof *item);
        if (is_object) {
            char *key = parse_string(p);
            if (!key)
                return -1;
            v->keys[v->count] = key;
            skip_space(p);
            if (*p->at != ':') {
                v->count++; /* so the key is freed */
                fail(p, "expected ':'");
                return -1;
            }
            p->at++;
        }
        v->count++;
        if (parse_value(p, item, depth + 1) != 0)
            return -1;
        skip_space(p);
        if (*p->at == ',') {
            p->at++;
            continue;
        }
        if (*p->at == close) {
            p->at++;
            return 0;
        }
        fail(p, is_object ? "expected ',' or '}'" : "expected ',' or ']'");
        return -1;
    }
}

static int parse_value(json_parser_t *p, json_value_t *v, int depth)
{
    if (depth > JSON_MAX_DEPTH) {
        fail(p, "nested too deeply");
        return -1;
    }
    skip_space(p);
    char c = *p->at;
    if (c == '{' || c == '[')
        return parse_container(p, v, depth, c == '{');
    if (c == '"') {
        v->type = JSON_STRING;
        v->string = parse_string(p);
        return v->string ? 0 : -1;
    }
    if (!strncmp(p->at, "true", 4) || !strncmp(p->at, "false", 5)) {
        v->type = JSON_BOOL;
        v->boolean = c == 't';
        p->at += v->boolean ? 4 : 5;
        return 0;
    }
    if (!strncmp(p->at, "null", 4)) {
        v->type = JSON_NULL;
        p->at += 4;
        return 0;
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        char *end;
        v->type = JSON_NUMBER;
        v->number = strtod(p->at, &end);
        if (end == p->at) {
            fail(p, "bad number");
            return -1;
        }
        int integral = 1;
        for (const char *d = p->at; d < end; d++)
            if (*d < '0' || *d > '9')
                integral = 0;
        if (integral) {
            v->integer = strtoull(p->at, NULL, 10);
            v->is_integer = 1;
        } else if (v->number >= 0 && v->number < 1.8e19 && v->number == floor(v->number)) {
            v->integer = (uint64_t)v->number;
            v->is_integer = 1;
        }
        p->at = end;
        return 0;
    }
    fail(p, c ? "unexpected character" : "unexpected end of input");
    return -1;
}

static void free_members(json_value_t *v)
{
    for (size_t i = 0; i < v->count; i++) {
        free_members(&v->items[i]);
        if (v->keys)
            free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    free(v->string);
}

void json_free(json_value_t *value)
{
    if (!value)
        return;
    free_members(value);
    free(value);
}

int json_parse(const char *text, json_value_t **out, char *err, size_t errsize)
{
    json_parser_t p = {text, text, err, errsize, 0};
    json_value_t *root = calloc(1, sizeof *root);
    if (!root) {
        snprintf(err, errsize, "out of memory");
        return -1;
    }
    if (parse_value(&p, root, 0) == 0) {
        skip_space(&p);
        if (*p.at)
            fail(&p, "text after the JSON value");
    }
    if (p.failed) {
        json_free(root);
        return -1;
    }
    *out = root;
    return 0;
}

const json_value_t *json_get(const json_value_t *object, const char *key)
{
    if (!object || object->type != JSON_OBJECT)
        return NULL;
    for (size_t i = 0; i < object->count; i++)
        if (!strcmp(object->keys[i], key))
            return &object->items[i];
    return NULL;
}

const json_value_t *json_path(const json_value_t *object, const char *path)
{
    char key[128];
    while (object && *path) {
        const char *dot = strchr(path, '.');
        size_t n = dot ? (size_t)(dot - path) : strlen(path);
        if (n >= sizeof key)
            return NULL;
        memcpy(key, path, n);
        key[n] = '\0';
        object = json_get(object, key);
        path += n + (dot ? 1 : 0);
    }
    return object;
}

uint64_t json_u64(const json_value_t *object, const char *path, uint64_t fallback)
{
    const json_value_t *v = json_path(object, path);
    if (!v || v->type != JSON_NUMBER)
        return fallback;
    if (v->is_integer)
        return v->integer;
    return v->number <= 0 ? 0 : (uint64_t)v->number;
}

double json_double(const json_value_t *object, const char *path, double fallback)
{
    const json_value_t *v = json_path(object, path);
    return v && v->type == JSON_NUMBER ? v->number : fallback;
}

const char *json_str(const json_value_t *object, const char *path, const char *fallback)
{
    const json_value_t *v = json_path(object, path);
    return v && v->type == JSON_STRING ? v->string : fallback;
}
