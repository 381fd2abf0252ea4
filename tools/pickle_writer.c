/* Writer of Python pickles, protocol 2 (see pickle_writer.h).
 *
 * Algorithm:
 *   1. Containers are written open-ended: EMPTY_DICT / EMPTY_LIST, then
 *      MARK; their items follow as they come; SETITEMS / APPENDS closes
 *      them, adding everything above the mark. A container is never held
 *      in memory, so a snapshot of any size streams straight to the file.
 *   2. An integer takes the smallest form: BININT1 (0..255), BININT2
 *      (0..65535), BININT (signed 32 bits), else LONG1 with the fewest
 *      little-endian two's-complement bytes whose top bit is the sign
 *      (an unsigned value above INT64_MAX takes 9 bytes).
 * Guarantees: output is what Python's pickle.loads reads back to the same
 * value; errors are sticky and reported once, by pickle_end.
 */
#include "pickle_writer.h"

#include <string.h>

/* The opcodes written (pickletools' names), by what they make. */
enum {
    OP_PROTO = 0x80, OP_STOP = '.', OP_MARK = '(',                          /* framing */
    OP_NONE = 'N', OP_NEWTRUE = 0x88, OP_NEWFALSE = 0x89,                    /* constants */
    OP_BININT1 = 'K', OP_BININT2 = 'M', OP_BININT = 'J', OP_LONG1 = 0x8a,    /* integers (2.) */
    OP_BINFLOAT = 'G', OP_BINUNICODE = 'X',                                  /* a float, a string */
    OP_EMPTY_LIST = ']', OP_APPENDS = 'e', OP_EMPTY_DICT = '}', OP_SETITEMS = 'u', /* containers (1.) */
};

static void put(pickle_writer_t *w, const void *bytes, size_t n)
{
    if (!w->failed && fwrite(bytes, 1, n, w->file) != n)
        w->failed = 1;
}

static void put_byte(pickle_writer_t *w, unsigned byte)
{
    unsigned char b = (unsigned char)byte;
    put(w, &b, 1);
}

/* Little-endian, `n` bytes of `value`. */
static void put_le(pickle_writer_t *w, uint64_t value, unsigned n)
{
    unsigned char bytes[8];
    for (unsigned i = 0; i < n; i++)
        bytes[i] = (unsigned char)(value >> (8 * i));
    put(w, bytes, n);
}

void pickle_begin(pickle_writer_t *w, FILE *file)
{
    w->file = file;
    w->failed = 0;
    w->depth = 0;
    put_byte(w, OP_PROTO);
    put_byte(w, 2);
}

int pickle_end(pickle_writer_t *w)
{
    put_byte(w, OP_STOP);
    if (fflush(w->file) != 0 || ferror(w->file))
        w->failed = 1;
    return w->failed || w->depth ? -1 : 0;
}

void pickle_none(pickle_writer_t *w) { put_byte(w, OP_NONE); }

void pickle_bool(pickle_writer_t *w, int value) { put_byte(w, value ? OP_NEWTRUE : OP_NEWFALSE); }

/* Step 2: LONG1 of a 64-bit two's-complement value, with a 9th byte when
 * `unsigned_top` (an unsigned value whose top bit is set). */
static void put_long1(pickle_writer_t *w, uint64_t bits, int negative, int unsigned_top)
{
    unsigned n = 8;
    if (unsigned_top) {
        put_byte(w, OP_LONG1);
        put_byte(w, 9);
        put_le(w, bits, 8);
        put_byte(w, 0);
        return;
    }
    /* drop top bytes that only repeat the sign, keeping the sign bit in the last byte */
    while (n > 1) {
        unsigned top = (unsigned)(bits >> (8 * (n - 1))) & 0xff;
        unsigned next_sign = (unsigned)(bits >> (8 * (n - 1) - 1)) & 1;
        if ((negative && top == 0xff && next_sign) || (!negative && top == 0 && !next_sign))
            n--;
        else
            break;
    }
    put_byte(w, OP_LONG1);
    put_byte(w, n);
    put_le(w, bits, n);
}

void pickle_int(pickle_writer_t *w, int64_t value)
{
    if (value >= 0 && value <= 0xff) {
        put_byte(w, OP_BININT1);
        put_byte(w, (unsigned)value);
    } else if (value >= 0 && value <= 0xffff) {
        put_byte(w, OP_BININT2);
        put_le(w, (uint64_t)value, 2);
    } else if (value >= INT32_MIN && value <= INT32_MAX) {
        put_byte(w, OP_BININT);
        put_le(w, (uint64_t)value, 4);
    } else {
        put_long1(w, (uint64_t)value, value < 0, 0);
    }
}

void pickle_uint(pickle_writer_t *w, uint64_t value)
{
    if (value <= INT64_MAX)
        pickle_int(w, (int64_t)value);
    else
        put_long1(w, value, 0, 1);
}

void pickle_float(pickle_writer_t *w, double value)
{
    uint64_t bits;
    memcpy(&bits, &value, sizeof bits);
    unsigned char bytes[8];
    for (int i = 0; i < 8; i++)
        bytes[i] = (unsigned char)(bits >> (8 * (7 - i))); /* big-endian */
    put_byte(w, OP_BINFLOAT);
    put(w, bytes, 8);
}

void pickle_string_n(pickle_writer_t *w, const char *text, size_t length)
{
    if (length > UINT32_MAX) {
        w->failed = 1;
        return;
    }
    put_byte(w, OP_BINUNICODE);
    put_le(w, length, 4);
    put(w, text, length);
}

void pickle_string(pickle_writer_t *w, const char *text) { pickle_string_n(w, text, strlen(text)); }

void pickle_dict_begin(pickle_writer_t *w)
{
    put_byte(w, OP_EMPTY_DICT);
    put_byte(w, OP_MARK);
    w->depth++;
}

void pickle_list_begin(pickle_writer_t *w)
{
    put_byte(w, OP_EMPTY_LIST);
    put_byte(w, OP_MARK);
    w->depth++;
}

static void close_container(pickle_writer_t *w, unsigned opcode)
{
    if (w->depth == 0) {
        w->failed = 1; /* an end without its begin */
        return;
    }
    w->depth--;
    put_byte(w, opcode);
}

void pickle_dict_end(pickle_writer_t *w) { close_container(w, OP_SETITEMS); }
void pickle_list_end(pickle_writer_t *w) { close_container(w, OP_APPENDS); }

void pickle_key_int(pickle_writer_t *w, const char *key, int64_t value)
{
    pickle_string(w, key);
    pickle_int(w, value);
}

void pickle_key_uint(pickle_writer_t *w, const char *key, uint64_t value)
{
    pickle_string(w, key);
    pickle_uint(w, value);
}

void pickle_key_string(pickle_writer_t *w, const char *key, const char *value)
{
    pickle_string(w, key);
    pickle_string(w, value);
}

void pickle_key_bool(pickle_writer_t *w, const char *key, int value)
{
    pickle_string(w, key);
    pickle_bool(w, value);
}
