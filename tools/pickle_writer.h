/* A streaming writer of Python pickles (protocol 2), enough for data made of
 * dicts, lists, strings, integers, floats, booleans and None: what PyTorch's
 * memory_viz snapshot holds (tools/cmd_export.c).
 *
 * Opcodes used (Python's Lib/pickletools.py names them):
 *   PROTO 2 first, STOP last;
 *   EMPTY_DICT MARK key value ... SETITEMS   a dict
 *   EMPTY_LIST MARK item ... APPENDS         a list
 *   BININT1 / BININT2 / BININT               integers that fit in 8, 16, 32 bits (signed 32)
 *   LONG1                                    larger integers: length byte, little-endian
 *                                            two's complement, as few bytes as the sign allows
 *   BINUNICODE                               strings (UTF-8, 4-byte length)
 *   BINFLOAT                                 doubles, big-endian
 *   NONE, NEWTRUE, NEWFALSE
 * No memo: nothing is shared, so every object is written once. Both
 * Python's pickle and the unpickler in PyTorch's MemoryViz.js read these.
 *
 * Usage: pickle_begin, then one value (dicts and lists nest: begin, their
 * items, end; inside a dict, key and value alternate), then pickle_end.
 * Return rule: functions return nothing while writing; a write error or an
 * unbalanced begin/end is remembered and pickle_end returns -1 (else 0).
 */
#ifndef PS_TOOLS_PICKLE_WRITER_H
#define PS_TOOLS_PICKLE_WRITER_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct pickle_writer {
    FILE *file;     /* where the bytes go */
    int failed;     /* a write failed or begin/end did not pair */
    unsigned depth; /* dicts and lists open now */
} pickle_writer_t;

/* Writes PROTO 2. */
void pickle_begin(pickle_writer_t *w, FILE *file);
/* Writes STOP and flushes; 0, or -1 when anything failed or a dict or list
 * is still open. The file is not closed. */
int pickle_end(pickle_writer_t *w);

void pickle_none(pickle_writer_t *w);
void pickle_bool(pickle_writer_t *w, int value);
void pickle_int(pickle_writer_t *w, int64_t value);
void pickle_uint(pickle_writer_t *w, uint64_t value);
void pickle_float(pickle_writer_t *w, double value);
/* A UTF-8 string (NUL-terminated / of `length` bytes). */
void pickle_string(pickle_writer_t *w, const char *text);
void pickle_string_n(pickle_writer_t *w, const char *text, size_t length);

void pickle_dict_begin(pickle_writer_t *w);
void pickle_dict_end(pickle_writer_t *w);
void pickle_list_begin(pickle_writer_t *w);
void pickle_list_end(pickle_writer_t *w);

/* A dict's key and value in one call. */
void pickle_key_int(pickle_writer_t *w, const char *key, int64_t value);
void pickle_key_uint(pickle_writer_t *w, const char *key, uint64_t value);
void pickle_key_string(pickle_writer_t *w, const char *key, const char *value);
void pickle_key_bool(pickle_writer_t *w, const char *key, int value);

#endif
