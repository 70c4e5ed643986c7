/*
 * fuzz_config.c - libFuzzer target for kcached's text inputs: the config file
 * (kcd_config_load_file), the command line and environment
 * (kcd_config_load), --listen addresses (kcd_parse_listen), the tokens file
 * (kcd_auth_load) and Authorization headers (kcd_auth_check).
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kc_fuzz.h"
#include "kcd_auth.h"
#include "kcd_config.h"

#define KNOWN_TOKEN "kcfuzz-known-token-7f3a"

static void write_file(const char *path, const void *a, size_t an, const void *b, size_t bn)
{
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(a, 1, an, f) != an || fwrite(b, 1, bn, f) != bn || fclose(f) != 0) {
        perror(path);
        abort();
    }
}

static char *print_config(const kcd_config *cfg)
{
    char *text = NULL;
    size_t n = 0;
    FILE *m = open_memstream(&text, &n);
    kcd_config_print(cfg, m);
    fclose(m);
    return text;
}

static void fuzz_config_file(const char *dir, const uint8_t *data, size_t len)
{
    char path[4096], again[4096];
    snprintf(path, sizeof path, "%s/kcached.conf", dir);
    snprintf(again, sizeof again, "%s/printed.conf", dir);
    write_file(path, data, len, "", 0);
    kcd_config cfg;
    kcd_config_defaults(&cfg);
    kc_err err = {0};
    kc_code rc = kcd_config_load_file(&cfg, path, &err);
    if (rc != KC_OK) {
        KC_FUZZ_CHECK(err.msg[0] != '\0', "config error without a message");
    } else {
        /* What --check-config prints must read back as a valid config. */
        char *text = print_config(&cfg);
        write_file(again, text, strlen(text), "", 0);
        kcd_config cfg2;
        kcd_config_defaults(&cfg2);
        kc_err e2 = {0};
        rc = kcd_config_load_file(&cfg2, again, &e2);
        KC_FUZZ_CHECK(rc == KC_OK, "printed config does not load: %s\n%s", e2.msg, text);
        char *text2 = print_config(&cfg2);
        /* Quotes are stripped once per load, so only compare unquoted text. */
        if (!strpbrk(text, "\"'"))
            KC_FUZZ_CHECK(strcmp(text, text2) == 0, "config print/load round trip differs");
        free(text2);
        free(text);
        kcd_config_free(&cfg2);
    }
    kcd_config_free(&cfg);
}

/* The input split at NUL bytes: argv words until an empty word, then envp. */
static void fuzz_command_line(const uint8_t *data, size_t len)
{
    /* --config/$KCACHED_CONFIG would read arbitrary paths (/dev/zero). */
    if (memmem(data, len, "onfig", 5) || memmem(data, len, "CONFIG", 6))
        return;
    char *copy = kc_fuzz_strndup(data, len);
    char *argv[64], *envp[64];
    int argc = 0, envc = 0;
    argv[argc++] = "kcached";
    bool in_env = false;
    for (char *p = copy; p < copy + len + 1 && argc < 63 && envc < 63;) {
        size_t n = strlen(p);
        if (n == 0 && !in_env)
            in_env = true;
        else if (in_env)
            envp[envc++] = p;
        else
            argv[argc++] = p;
        p += n + 1;
    }
    argv[argc] = NULL;
    envp[envc] = NULL;
    kcd_config cfg;
    memset(&cfg, 0, sizeof cfg);
    kcd_config_action action = KCD_RUN;
    kc_err err = {0};
    kc_code rc = kcd_config_load(&cfg, argc, argv, envp, &action, &err);
    if (rc != KC_OK)
        KC_FUZZ_CHECK(err.msg[0] != '\0', "command-line error without a message");
    kcd_config_free(&cfg);
    free(copy);
}

static void fuzz_listen(const uint8_t *data, size_t len)
{
    kc_fuzz_in in;
    kc_fuzz_in_init(&in, data, len);
    char *line = kc_fuzz_take_line(&in, 4096);
    char host[64];
    unsigned port = 99999;
    kc_err err = {0};
    if (kcd_parse_listen(line, host, sizeof host, &port, &err) == KC_OK) {
        KC_FUZZ_CHECK(port <= 65535, "port %u accepted", port);
        KC_FUZZ_CHECK(strlen(host) < sizeof host, "host overflow");
    } else {
        KC_FUZZ_CHECK(err.msg[0] != '\0', "listen error without a message");
    }
    free(line);
}

static void fuzz_tokens(const char *dir, const uint8_t *data, size_t len)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/tokens", dir);
    static const char known[] = KNOWN_TOKEN " admin known\n";
    write_file(path, known, sizeof known - 1, data, len);
    kcd_auth *a = NULL;
    kc_err err = {0};
    kc_code rc = kcd_auth_load(path, 0, &a, &err);
    if (rc != KC_OK) {
        KC_FUZZ_CHECK(err.msg[0] != '\0', "tokens error without a message");
        return;
    }
    KC_FUZZ_CHECK(kcd_auth_count(a) >= 1, "loaded tokens file without tokens");
    const char *who = NULL;
    KC_FUZZ_CHECK(kcd_auth_check(a, "Bearer " KNOWN_TOKEN, KCD_SCOPE_ADMIN, &who) == 0,
                  "the admin token in line 1 was refused");
    KC_FUZZ_CHECK(kcd_auth_check(a, NULL, KCD_SCOPE_READ, &who) == 401,
                  "anonymous read allowed with anonymous_read off");
    /* Each line of the input as an Authorization header. */
    kc_fuzz_in in;
    kc_fuzz_in_init(&in, data, len);
    for (int i = 0; i < 8 && kc_fuzz_remaining(&in); i++) {
        char *hdr = kc_fuzz_take_line(&in, 2048);
        for (unsigned need = KCD_SCOPE_READ; need <= KCD_SCOPE_ADMIN; need <<= 1) {
            int st = kcd_auth_check(a, hdr, need, &who);
            KC_FUZZ_CHECK(st == 0 || st == 401 || st == 403, "auth answered %d", st);
            KC_FUZZ_CHECK(who != NULL, "auth left who unset");
        }
        free(hdr);
    }
    kcd_auth_free(a);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len)
{
    const char *dir = kc_fuzz_tmpdir();
    fuzz_config_file(dir, data, len);
    fuzz_command_line(data, len);
    fuzz_listen(data, len);
    fuzz_tokens(dir, data, len);
    return 0;
}
