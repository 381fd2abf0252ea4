/* The IPC wire format's checks (shim/ipc_wire.c): a handle is refused
 * unless every field is in bounds without overflow, a request unless it is
 * exactly one, a reply unless its pieces follow in order within the bytes
 * the handle promised; and the committed fuzz corpora replay cleanly
 * through the fuzzing entry points (shim/fuzz/ipc_fuzz_entry.c). The
 * shim's files are built into this test directly: they depend on nothing
 * else of the shim. */
#include "../../shim/fuzz/ipc_fuzz_entry.c"
#include "../../shim/ipc_wire.c"

#include "fuzz_corpus.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>

#define MiB (1ull << 20)

/* A handle as an exporter makes it: one piece of 2 MiB, a 1 MiB block at 4 KiB. */
static ps_ipc_handle_t good_handle(void)
{
    ps_ipc_handle_t h = {.pid = 1234, .pieces = 1, .id = 7, .token = 0x1122334455667788ull, .size = MiB,
                         .offset = 4096, .mapped = 2 * MiB, .name = 0x5eed5eed};
    memcpy(h.magic, PS_IPC_MAGIC, 8);
    h.check = ps_ipc_checksum(&h);
    return h;
}

/* `h` with its checksum made right, as read. */
static const char *read_fixed(ps_ipc_handle_t h)
{
    h.check = ps_ipc_checksum(&h);
    ps_ipc_handle_t out;
    return ps_ipc_handle_read(&h, &out);
}

Test(ipc_wire, a_handle_as_made_is_read_back)
{
    ps_ipc_handle_t h = good_handle(), out;
    cr_assert_null(ps_ipc_handle_read(&h, &out));
    cr_expect_eq(memcmp(&h, &out, sizeof h), 0);
    cr_expect(ps_ipc_is_ours(&h));
}

/* offset + size wraps around 2^64 to 0: an addition would pass it. */
Test(ipc_wire, an_offset_and_size_that_wrap_are_refused)
{
    ps_ipc_handle_t h = good_handle();
    h.offset = 0 - h.size;
    cr_expect(h.offset + h.size <= h.mapped, "(the sum wraps: the check it defeats)");
    const char *why = read_fixed(h);
    cr_expect(why && strstr(why, "offset and size"), "%s", why ? why : "accepted");
    h.offset = h.mapped - h.size + 1;
    cr_expect_not_null(read_fixed(h), "one byte past the pieces");
    h.offset = h.mapped - h.size;
    cr_expect_null(read_fixed(h), "the block ends with the pieces");
}

Test(ipc_wire, every_field_out_of_bounds_is_refused)
{
    ps_ipc_handle_t h = good_handle();
    h.size = 0;
    cr_expect_not_null(read_fixed(h), "size 0");
    h = good_handle();
    h.size = h.mapped + 1;
    h.offset = 0;
    cr_expect_not_null(read_fixed(h), "size above mapped");
    h = good_handle();
    h.pieces = 0;
    cr_expect_not_null(read_fixed(h), "no piece");
    h = good_handle();
    h.pieces = PS_IPC_PIECES_MAX + 1;
    h.mapped = PS_IPC_MAPPED_MAX;
    cr_expect_not_null(read_fixed(h), "too many pieces (the importer allocates per piece)");
    h = good_handle();
    h.pieces = (uint32_t)(h.mapped / PS_IPC_PIECE_MIN) + 1;
    cr_expect_not_null(read_fixed(h), "pieces smaller than a page");
    h = good_handle();
    h.mapped = UINT64_MAX;
    cr_expect_not_null(read_fixed(h), "more bytes than an address space");
    h = good_handle();
    h.pid = 0;
    cr_expect_not_null(read_fixed(h), "no exporter");
    h = good_handle();
    h.token ^= 1; /* checksum not made right */
    ps_ipc_handle_t out;
    const char *why = ps_ipc_handle_read(&h, &out);
    cr_expect(why && strstr(why, "checksum"), "%s", why ? why : "accepted");
    h = good_handle();
    memcpy(h.magic, "PSHMIPC\x01", 8); /* format 1 */
    cr_expect_not_null(read_fixed(h));
    cr_expect(!ps_ipc_is_ours(&h));
}

Test(ipc_wire, a_request_is_exactly_one_request)
{
    ps_ipc_request_t q = {.id = 3, .token = 9}, out;
    memcpy(q.magic, PS_IPC_MAGIC, 8);
    unsigned char bytes[64] = {0};
    memcpy(bytes, &q, sizeof q);
    cr_expect(ps_ipc_request_read(bytes, sizeof q, &out) && out.id == 3 && out.token == 9);
    cr_expect(!ps_ipc_request_read(bytes, sizeof q - 1, &out), "short");
    cr_expect(!ps_ipc_request_read(bytes, sizeof q + 1, &out), "long");
    bytes[7] = 1;
    cr_expect(!ps_ipc_request_read(bytes, sizeof q, &out), "another magic");
}

static ps_ipc_reply_t reply(uint32_t first, uint32_t count, uint32_t total, uint64_t size)
{
    ps_ipc_reply_t r = {.status = PS_IPC_REPLY_OK, .first = first, .count = count, .total = total};
    for (uint32_t i = 0; i < count && i < PS_IPC_BATCH; i++)
        r.sizes[i] = size;
    return r;
}

Test(ipc_wire, replies_must_follow_the_handle)
{
    ps_ipc_receive_t s = {.pieces = 3, .mapped = 6 * MiB};
    int status;
    ps_ipc_reply_t r = reply(0, 3, 3, 2 * MiB);
    cr_expect_null(ps_ipc_reply_check(&s, &r, sizeof r, 3, &status));
    cr_expect_not_null(ps_ipc_reply_check(&s, &r, sizeof r - 1, 3, &status), "short message");
    cr_expect_not_null(ps_ipc_reply_check(&s, &r, sizeof r, 2, &status), "fewer descriptors than said");
    r = reply(1, 2, 3, 2 * MiB);
    cr_expect_not_null(ps_ipc_reply_check(&s, &r, sizeof r, 2, &status), "out of order");
    r = reply(0, 2, 3, 2 * MiB);
    r.sizes[0] = UINT64_MAX - 4095; /* the two sum to 2 MiB - 4 KiB + ... wrapped */
    r.sizes[1] = 2 * MiB + 4096;
    cr_expect_not_null(ps_ipc_reply_check(&s, &r, sizeof r, 2, &status), "sizes that wrap");
    r = reply(0, 3, 3, 2 * MiB);
    r.sizes[2] = MiB;
    cr_expect_not_null(ps_ipc_reply_check(&s, &r, sizeof r, 3, &status), "the last piece short of the handle");
    r = reply(0, 1, 3, 1024);
    cr_expect_not_null(ps_ipc_reply_check(&s, &r, sizeof r, 1, &status), "a piece smaller than a page");
    s.have = 3;
    r = reply(3, 1, 3, 2 * MiB);
    cr_expect_not_null(ps_ipc_reply_check(&s, &r, sizeof r, 1, &status), "more pieces than the handle");
    s.have = 0;
    r = reply(0, 0, 3, 0);
    r.status = PS_IPC_REPLY_STALE;
    const char *why = ps_ipc_reply_check(&s, &r, sizeof r, 0, &status);
    cr_expect(why && strstr(why, "stale") && status == PS_IPC_REPLY_STALE, "%s", why ? why : "accepted");
}

/* ---- the committed corpora ---------------------------------------------------------- */
Test(ipc_wire, every_handle_corpus_file_replays_cleanly)
{
    cr_assert_geq(fuzz_corpus_replay("ipc_handle", ps_ipc_fuzz_handle), 20);
}

Test(ipc_wire, every_request_corpus_file_replays_cleanly)
{
    cr_assert_geq(fuzz_corpus_replay("ipc_request", ps_ipc_fuzz_request), 6);
}

/* The seeds mean what their names say: the valid ones get through every
 * check (so the fuzzer starts past them), the others are refused. */
Test(ipc_wire, the_handle_seeds_are_refused_or_accepted_as_named)
{
    const char *data = getenv("POOLSHIM_TEST_DATA");
    const char *names[] = {"valid_one_piece", "valid_three_pieces", "valid_two_batches", "offset_and_size_wrap",
                           "size_zero", "pieces_huge", "mapped_huge", "bad_checksum"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char path[4200];
        unsigned char buf[4096] = {0};
        snprintf(path, sizeof path, "%s/fuzz/ipc_handle/%s", data, names[i]);
        FILE *f = fopen(path, "rb");
        cr_assert_not_null(f, "%s", path);
        size_t n = fread(buf, 1, sizeof buf, f);
        fclose(f);
        cr_assert_geq(n, 64);
        ps_ipc_handle_t h;
        bool valid = !strncmp(names[i], "valid", 5);
        cr_expect_eq(ps_ipc_handle_read(buf, &h) == NULL, valid, "%s", names[i]);
    }
}
