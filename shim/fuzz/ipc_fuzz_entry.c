/* The fuzzing entry points of the IPC wire format (shim/ipc_wire.c): the
 * libFuzzer targets beside this file call them (make fuzz-ipc), and the
 * CPU suite replays the committed corpora (tests/data/fuzz/ipc_handle/,
 * tests/data/fuzz/ipc_request/) through them (tests/unit/test_ipc_wire.c).
 *
 * ps_ipc_fuzz_handle, step by step:
 *   1. the first 64 bytes (zeros after a short input) are a handle; when
 *      bit 0 of byte 64 is set its checksum is made right first, so the
 *      fuzzer reaches the field checks;
 *   2. a handle ps_ipc_handle_read accepts must keep every bound, computed
 *      in 128 bits: 1 <= pieces <= PS_IPC_PIECES_MAX, mapped <=
 *      PS_IPC_MAPPED_MAX, 1 <= size, offset + size <= mapped;
 *   3. the bytes after byte 64 are replies, each a descriptor count (one
 *      byte) and a ps_ipc_reply_t, checked against the receive as the
 *      importer does; an accepted one must keep its pieces in order and
 *      within the mapped bytes, and a receive that completes must have
 *      received exactly the mapped bytes.
 * ps_ipc_fuzz_request: a request ps_ipc_request_read accepts is exactly
 * one request's size with the magic.
 * Both return 0; a broken invariant calls __builtin_trap(). */
#include <stdint.h>
#include <string.h>

#include "../ipc_wire.h"

int ps_ipc_fuzz_handle(const uint8_t *data, size_t size);
int ps_ipc_fuzz_request(const uint8_t *data, size_t size);

#define EXPECT(x)                \
    do {                         \
        if (!(x))                \
            __builtin_trap();    \
    } while (0)

int ps_ipc_fuzz_handle(const uint8_t *data, size_t size)
{
    unsigned char bytes[64] = {0};
    memcpy(bytes, data, size < 64 ? size : 64);
    if (size > 64 && (data[64] & 1)) {
        ps_ipc_handle_t fixed;
        memcpy(&fixed, bytes, 64);
        fixed.check = ps_ipc_checksum(&fixed);
        memcpy(bytes, &fixed, 64);
    }
    ps_ipc_handle_t h;
    if (ps_ipc_handle_read(bytes, &h))
        return 0;
    EXPECT(h.pid && h.pieces >= 1 && h.pieces <= PS_IPC_PIECES_MAX && h.mapped <= PS_IPC_MAPPED_MAX && h.size >= 1);
    EXPECT((unsigned __int128)h.offset + h.size <= h.mapped);
    EXPECT((unsigned __int128)h.pieces * PS_IPC_PIECE_MIN <= h.mapped);
    ps_ipc_receive_t state = {.pieces = h.pieces, .mapped = h.mapped};
    unsigned __int128 total = 0;
    for (size_t at = 65; at + 1 + sizeof(ps_ipc_reply_t) <= size && state.have < state.pieces;
         at += 1 + sizeof(ps_ipc_reply_t)) {
        ps_ipc_reply_t r;
        memcpy(&r, data + at + 1, sizeof r);
        int fds = data[at] % (PS_IPC_BATCH + 2), status;
        if (ps_ipc_reply_check(&state, &r, (ssize_t)sizeof r, fds, &status))
            break;
        EXPECT(status == PS_IPC_REPLY_OK && r.first == state.have && r.count == (uint32_t)fds && fds >= 1 &&
               fds <= PS_IPC_BATCH && state.have + r.count <= state.pieces);
        for (int i = 0; i < fds; i++) {
            EXPECT(r.sizes[i] >= PS_IPC_PIECE_MIN);
            total += r.sizes[i];
            state.cursor += r.sizes[i];
            state.have++;
        }
        EXPECT(total <= h.mapped && total == state.cursor);
    }
    if (state.have == state.pieces)
        EXPECT(state.cursor == h.mapped);
    return 0;
}

int ps_ipc_fuzz_request(const uint8_t *data, size_t size)
{
    ps_ipc_request_t q;
    if (!ps_ipc_request_read(data, size, &q))
        return 0;
    EXPECT(size == sizeof q && memcmp(data, PS_IPC_MAGIC, 8) == 0 && memcmp(&q, data, sizeof q) == 0);
    return 0;
}
