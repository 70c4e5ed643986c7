/*
 * fuzz_resp.c - libFuzzer target for kcached's RESP request parser
 * (server/kcd_resp.h), which every byte a Redis client sends goes through.
 * Properties: it never reads outside the buffer (ASan), every argument lies
 * inside its command, an error always has a message, and the commands found
 * do not depend on how the bytes were split into reads.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kc_fuzz.h"
#include "kcd_resp.h"

#define MAX_CMDS 64

typedef struct parsed {
    size_t ncmd;
    size_t argc[MAX_CMDS];
    uint64_t digest[MAX_CMDS]; /* FNV-1a over the arguments and their lengths */
    bool error;
    size_t consumed;
} parsed;

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

/* Parses buf, making it visible `step(i)` bytes at a time (chunks from the
 * fuzzer) or all at once (chunks == NULL). */
static void run(const uint8_t *input, size_t len, const kcd_resp_limits *lim, kc_fuzz_in *chunks,
                parsed *out)
{
    memset(out, 0, sizeof *out);
    /* inline arguments are unquoted in place: each run parses its own copy */
    uint8_t *buf = malloc(len ? len : 1);
    if (len)
        memcpy(buf, input, len);
    kcd_resp_parser p;
    kcd_resp_parser_init(&p);
    size_t start = 0, visible = chunks ? 0 : len;
    while (out->ncmd < MAX_CMDS) {
        size_t used = 0;
        kcd_resp_status st = kcd_resp_parse(&p, buf + start, visible - start, lim, &used);
        if (st == KCD_RESP_ERROR) {
            KC_FUZZ_CHECK(p.error && p.error[0], "an error without a message");
            out->error = true;
            break;
        }
        if (st == KCD_RESP_MORE) {
            if (visible == len)
                break;
            size_t step = chunks ? 1 + kc_fuzz_take_u8(chunks) % 64 : len;
            visible = visible + step > len ? len : visible + step;
            continue;
        }
        KC_FUZZ_CHECK(used > 0 && used <= visible - start, "used %zu of %zu", used,
                      visible - start);
        uint64_t h = 1469598103934665603ull;
        for (size_t i = 0; i < p.argc; i++) {
            KC_FUZZ_CHECK(p.off[i] + p.len[i] <= used, "argument %zu outside its command", i);
            h = fnv(h, &p.len[i], sizeof p.len[i]);
            h = fnv(h, buf + start + p.off[i], p.len[i]);
        }
        out->argc[out->ncmd] = p.argc;
        out->digest[out->ncmd] = h;
        out->ncmd++;
        start += used;
    }
    out->consumed = start;
    kcd_resp_parser_free(&p);
    free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len)
{
    kc_fuzz_in in;
    kc_fuzz_in_init(&in, data, len);
    kcd_resp_limits lim = {kc_fuzz_take_range(&in, 0, 4096), kc_fuzz_take_range(&in, 1, 64)};
    size_t n = kc_fuzz_remaining(&in);
    /* the first half of what remains is the stream, the rest the chunk sizes */
    size_t blen = n / 2 + (n & 1);
    uint8_t *buf = malloc(blen ? blen : 1);
    for (size_t i = 0; i < blen; i++)
        buf[i] = kc_fuzz_take_u8(&in);
    parsed whole, split;
    run(buf, blen, &lim, NULL, &whole);
    run(buf, blen, &lim, &in, &split);
    KC_FUZZ_CHECK(whole.ncmd == split.ncmd && whole.error == split.error &&
                      whole.consumed == split.consumed,
                  "split reads changed the result: %zu/%zu commands, error %d/%d", whole.ncmd,
                  split.ncmd, whole.error, split.error);
    for (size_t i = 0; i < whole.ncmd; i++)
        KC_FUZZ_CHECK(whole.argc[i] == split.argc[i] && whole.digest[i] == split.digest[i],
                      "command %zu differs between whole and split reads", i);
    free(buf);
    return 0;
}
