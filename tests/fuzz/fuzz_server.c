/*
 * fuzz_server.c - libFuzzer target for kcached's request handling, called
 * in-process without a socket (kcd_exchange_* from server/kcd_routes.h).
 *
 * Input: "METHOD\nPATH[?query]\nName: value\n...\n\nBODY". The body is fed in
 * chunks of pseudo-random sizes. Properties: no crash, every request gets a
 * response with a known status, never a 500, an artifact served with 200 is
 * a valid envelope for the key asked, and the store behind the server always
 * verifies. Also checks kcd_ccache_path_valid against a reference.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <kcache/kc_envelope.h>
#include "kc_fuzz.h"
#include <kcache/kc_store.h>
#include "kcd_config.h"
#include "kcd_log.h"
#include "kcd_routes.h"

#define MAX_KV 32

typedef struct kv_list {
    kcd_kv kv[MAX_KV];
    size_t n;
} kv_list;

static kcd_ctx *ctx;
static char data_dir[4096];
static unsigned inputs;

static const char *lookup(void *cls, const char *name)
{
    kv_list *l = cls;
    for (size_t i = 0; i < l->n; i++)
        if (strcasecmp(l->kv[i].name, name) == 0)
            return l->kv[i].value;
    return NULL;
}

static void setup(void)
{
    if (ctx)
        return;
    const char *dir = kc_fuzz_tmpdir();
    char tokens[4096];
    snprintf(tokens, sizeof tokens, "%s/tokens", dir);
    snprintf(data_dir, sizeof data_dir, "%s/data", dir);
    FILE *f = fopen(tokens, "w");
    fputs("tok-read-fuzz-0001 read reader\ntok-write-fuzz-0001 read,write "
          "writer\ntok-admin-fuzz-0001 admin ops\n",
          f);
    fclose(f);
    kcd_config cfg;
    kcd_config_defaults(&cfg);
    kc_err err = {0};
    if (kcd_config_set(&cfg, "data", data_dir, "fuzz", &err) != KC_OK ||
        kcd_config_set(&cfg, "tokens", tokens, "fuzz", &err) != KC_OK ||
        kcd_config_set(&cfg, "max-blob", "1M", "fuzz", &err) != KC_OK ||
        kcd_config_set(&cfg, "max-size", "64M", "fuzz", &err) != KC_OK ||
        kcd_ctx_new(&cfg, &ctx, &err) != KC_OK) {
        fprintf(stderr, "fuzz_server: setup: %s\n", err.msg);
        abort();
    }
    kcd_config_free(&cfg);
    kcd_log_set_level(KCD_LOG_ERROR);
}

/* Reference for kcd_ccache_path_valid: 1..512 characters of [A-Za-z0-9_.-/],
 * components non-empty and not ".", and no ".." anywhere. */
static bool ref_ccache_valid(const char *p)
{
    size_t n = strlen(p);
    if (n == 0 || n > KCD_CCACHE_PATH_MAX || strstr(p, ".."))
        return false;
    const char *ok = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-/";
    if (strspn(p, ok) != n)
        return false;
    const char *c = p;
    for (;;) {
        const char *e = strchr(c, '/');
        size_t len = e ? (size_t)(e - c) : strlen(c);
        if (len == 0 || (len == 1 && c[0] == '.'))
            return false;
        if (!e)
            return true;
        c = e + 1;
    }
}

static void split_query(char *path, kv_list *args)
{
    char *q = strchr(path, '?');
    if (!q)
        return;
    *q++ = '\0';
    char *save = NULL;
    for (char *t = strtok_r(q, "&", &save); t && args->n < MAX_KV; t = strtok_r(NULL, "&", &save)) {
        char *eq = strchr(t, '=');
        if (eq)
            *eq++ = '\0';
        args->kv[args->n].name = t;
        args->kv[args->n].value = eq ? eq : "";
        args->n++;
    }
}

static void verify_store(void)
{
    kc_store *s = NULL;
    kc_err err = {0};
    if (kc_store_open(data_dir, NULL, &s, &err) != KC_OK) {
        fprintf(stderr, "fuzz_server: reopen %s: %s\n", data_dir, err.msg);
        abort();
    }
    uint64_t checked = 0, bad = 0;
    kc_code rc = kc_store_verify(s, NULL, NULL, &checked, &bad, &err);
    KC_FUZZ_CHECK(rc == KC_OK && bad == 0, "server store damaged: %s (%llu bad of %llu)", err.msg,
                  (unsigned long long)bad, (unsigned long long)checked);
    kc_store_close(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len)
{
    setup();
    kc_fuzz_in in;
    kc_fuzz_in_init(&in, data, len);
    char *method = kc_fuzz_take_line(&in, 16);
    char *path = kc_fuzz_take_line(&in, 2048);
    char *lines[MAX_KV];
    size_t nlines = 0;
    kv_list headers = {.n = 0}, args = {.n = 0};
    while (kc_fuzz_remaining(&in) && nlines < MAX_KV) {
        char *l = kc_fuzz_take_line(&in, 8192);
        if (!*l) {
            free(l);
            break;
        }
        lines[nlines++] = l;
        char *colon = strchr(l, ':');
        if (!colon)
            continue;
        *colon = '\0';
        const char *v = colon + 1;
        while (*v == ' ')
            v++;
        headers.kv[headers.n].name = l;
        headers.kv[headers.n].value = v;
        headers.n++;
    }
    size_t body_len = kc_fuzz_remaining(&in);
    const uint8_t *body = in.data + in.pos;

    /* Path validators first: the part after /ccache/ against the reference. */
    char *full_path = strdup(path);
    split_query(path, &args);
    if (!strncmp(path, "/ccache/", 8))
        KC_FUZZ_CHECK(kcd_ccache_path_valid(path + 8) == ref_ccache_valid(path + 8),
                      "kcd_ccache_path_valid(\"%.100s\") = %d", path + 8,
                      kcd_ccache_path_valid(path + 8));

    kcd_request req = {.method = method,
                       .path = path,
                       .header = lookup,
                       .header_cls = &headers,
                       .arg = lookup,
                       .arg_cls = &args,
                       .remote = "fuzz"};
    kcd_exchange *x = kcd_exchange_begin(ctx, &req);
    KC_FUZZ_CHECK(x != NULL, "no exchange");
    kcd_response *r = kcd_exchange_response(x);
    if (!r) {
        uint64_t seed = body_len * 2654435761u + 1;
        size_t off = 0;
        bool more = true;
        while (off < body_len && more) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            size_t n = 1 + (seed >> 33) % ((seed & 1) ? 97 : 65536);
            if (n > body_len - off)
                n = body_len - off;
            uint8_t *chunk = malloc(n);
            memcpy(chunk, body + off, n);
            more = kcd_exchange_feed(x, chunk, n);
            free(chunk);
            off += n;
        }
        if (more)
            kcd_exchange_end(x);
        r = kcd_exchange_response(x);
    }
    KC_FUZZ_CHECK(r != NULL, "%s %s: no response after the body", method, path);
    static const int known[] = {200, 201, 204, 400, 401, 403, 404, 405, 406,
                                409, 411, 413, 414, 415, 416, 422, 507};
    bool ok = false;
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        ok |= r->status == known[i];
    KC_FUZZ_CHECK(ok, "%s %s: status %d", method, full_path, r->status);

    if (r->status == 200 && !strcmp(method, "GET") && !strncmp(path, "/v1/artifacts/", 14) &&
        strlen(path) == 14 + KC_KEY_HEX_LEN && !r->content_encoding && !r->stream) {
        kc_artifact a;
        kc_err err = {0};
        KC_FUZZ_CHECK(kc_envelope_decode(r->body, r->body_len, &a, &err) == KC_OK,
                      "served a bad envelope: %s", err.msg);
        KC_FUZZ_CHECK(strcmp(a.key, path + 14) == 0, "served the envelope of another key");
        kc_artifact_free(&a);
    }
    if (r->stream) {
        uint8_t buf[65536];
        size_t total = 0;
        ssize_t n;
        while (total < (64u << 20) && (n = kcd_stream_read(r->stream, buf, sizeof buf)) > 0)
            total += (size_t)n;
    }
    kcd_exchange_finish(x, true);

    if (++inputs % 512 == 0)
        verify_store();
    for (size_t i = 0; i < nlines; i++)
        free(lines[i]);
    free(full_path);
    free(path);
    free(method);
    return 0;
}
