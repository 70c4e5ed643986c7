/*
 * fuzz_manifest.c - libFuzzer target for the directory-snapshot manifest
 * parser (kc_snap_manifest_parse), the gate every file a server sends must
 * pass before a restore writes anything. On success every entry must obey
 * the rules the restore relies on (relative, no "." or "..", no empty
 * component, permission bits only, sorted and unique, no path below a file),
 * and encoding then parsing again must give the same entries.
 */
#include <string.h>

#include "kc_fuzz.h"
#include <kcache/kc_snapshot.h>

static void check_path(const char *p)
{
    size_t n = strlen(p);
    KC_FUZZ_CHECK(n > 0 && n <= KC_SNAP_PATH_MAX, "path length %zu", n);
    KC_FUZZ_CHECK(p[0] != '/', "absolute path '%.80s'", p);
    const char *c = p;
    for (;;) {
        const char *slash = strchr(c, '/');
        size_t len = slash ? (size_t)(slash - c) : strlen(c);
        KC_FUZZ_CHECK(len > 0 && len <= KC_SNAP_NAME_MAX, "component of '%.80s'", p);
        KC_FUZZ_CHECK(!(len == 1 && c[0] == '.') && !(len == 2 && c[0] == '.' && c[1] == '.'),
                      "dot component in '%.80s'", p);
        if (!slash)
            break;
        c = slash + 1;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len)
{
    kc_snap_manifest m;
    kc_err err = {0};
    if (kc_snap_manifest_parse(data, len, &m, &err) != KC_OK) {
        KC_FUZZ_CHECK(err.msg[0] != '\0', "refusal without a message");
        return 0;
    }
    for (size_t i = 0; i < m.n; i++) {
        check_path(m.e[i].path);
        KC_FUZZ_CHECK(m.e[i].mode <= 0777, "mode 0%o", m.e[i].mode);
        KC_FUZZ_CHECK(i == 0 || strcmp(m.e[i - 1].path, m.e[i].path) < 0, "not sorted/unique");
    }
    char *text;
    size_t tlen;
    KC_FUZZ_CHECK(kc_snap_manifest_encode(&m, &text, &tlen, &err) == KC_OK, "encode: %s", err.msg);
    kc_snap_manifest m2;
    KC_FUZZ_CHECK(kc_snap_manifest_parse(text, tlen, &m2, &err) == KC_OK, "reparse: %s", err.msg);
    KC_FUZZ_CHECK(m2.n == m.n, "entry count %zu != %zu", m2.n, m.n);
    for (size_t i = 0; i < m.n; i++)
        KC_FUZZ_CHECK(!strcmp(m.e[i].path, m2.e[i].path) && m.e[i].mode == m2.e[i].mode &&
                          m.e[i].type == m2.e[i].type && m.e[i].size == m2.e[i].size &&
                          !strcmp(m.e[i].key, m2.e[i].key),
                      "entry %zu differs after a round trip", i);
    free(text);
    kc_snap_manifest_free(&m);
    kc_snap_manifest_free(&m2);
    return 0;
}
