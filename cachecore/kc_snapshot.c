/*
 * kc_snapshot.c - directory snapshots: key recipes, the manifest (JSON via
 * jansson) and its validation. A manifest comes from a server that may be
 * hostile, so parsing is where every path and mode is judged; the walk and
 * the restore (kc_snapshot_fs.c) act only on a validated manifest.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#include <jansson.h>

#include <kcache/kc_snapshot.h>

/* ---- keys ---------------------------------------------------------------- */

/* The "kcache-key/1" text every key recipe hashes (compiler_stub's
 * kc_artifact_key writes the same fields for kernels). */
static void recipe(const char *kind, const char *subject, const char *device, const char *options,
                   char out[KC_KEY_HEX_LEN + 1])
{
    kc_sha256_ctx *c = kc_sha256_new();
    uint8_t d[KC_SHA256_LEN];
    const char *parts[] = {
        "kcache-key/1\nkind=",   kind,    "\nsubject=", subject, "\ndevice=", device,
        "\ncompiler=\noptions=", options, "\n"};
    if (!c) { /* out of memory: a one-shot digest over the same text */
        char buf[1024];
        int n = snprintf(buf, sizeof buf, "%s%s%s%s%s%s%s%s%s", parts[0], parts[1], parts[2],
                         parts[3], parts[4], parts[5], parts[6], parts[7], parts[8]);
        kc_sha256_hex(buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1, out);
        return;
    }
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
        kc_sha256_update(c, parts[i], strlen(parts[i]));
    kc_sha256_final(c, d);
    kc_sha256_free(c);
    kc_hex_encode(d, KC_SHA256_LEN, out);
}

void kc_snapshot_key(const char *name, const char *device, const char *version,
                     char out[KC_KEY_HEX_LEN + 1])
{
    /* the version key goes into "options"; name, device and version are
     * checked by kc_snapshot_check_ident and hold no newline */
    recipe("dir-snapshot", name, device, version, out);
}

void kc_snapshot_manifest_key(const char *slot, const uint8_t manifest_sha[KC_SHA256_LEN],
                              char out[KC_KEY_HEX_LEN + 1])
{
    char hex[KC_KEY_HEX_LEN + 1];
    kc_hex_encode(manifest_sha, KC_SHA256_LEN, hex);
    recipe(KC_SNAP_KIND_MANIFEST, hex, slot, "", out);
}

void kc_snapshot_file_key(const char *content_sha_hex, char out[KC_KEY_HEX_LEN + 1])
{
    recipe(KC_SNAP_KIND_FILE, content_sha_hex, "", "", out);
}

kc_code kc_snapshot_check_ident(const char *what, const char *s, bool is_name, kc_err *err)
{
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n > KC_SNAP_IDENT_MAX)
        return kc_err_set(err, KC_ERR_INVALID, "%s must be 1..%d characters", what,
                          KC_SNAP_IDENT_MAX);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c > 0x7e || (is_name && (c == ' ' || c == '/' || c == ',')))
            return kc_err_set(err, KC_ERR_INVALID, "%s '%.80s': character %zu is not allowed%s",
                              what, s, i + 1, is_name ? " (no spaces, '/' or ',')" : "");
    }
    return KC_OK;
}

/* ---- manifest ------------------------------------------------------------ */

void kc_snap_manifest_free(kc_snap_manifest *m)
{
    if (!m)
        return;
    for (size_t i = 0; i < m->n; i++)
        free(m->e[i].path);
    free(m->e);
    free(m->name);
    free(m->device);
    free(m->version);
    memset(m, 0, sizeof *m);
}

static int entry_cmp(const void *a, const void *b)
{
    return strcmp(((const kc_snap_entry *)a)->path, ((const kc_snap_entry *)b)->path);
}

kc_code kc_snap_manifest_encode(const kc_snap_manifest *m, char **json, size_t *len, kc_err *err)
{
    *json = NULL;
    json_t *root =
        json_pack("{s:s,s:s,s:s,s:s,s:I}", "format", KC_SNAP_FORMAT, "name", m->name ? m->name : "",
                  "device", m->device ? m->device : "", "version", m->version ? m->version : "",
                  "created_us", (json_int_t)m->created_us);
    json_t *arr = json_array();
    bool ok = root && arr;
    for (size_t i = 0; ok && i < m->n; i++) {
        const kc_snap_entry *e = &m->e[i];
        json_t *o =
            e->type == KC_SNAP_DIR
                ? json_pack("{s:s,s:s,s:i}", "path", e->path, "type", "dir", "mode", (int)e->mode)
                : json_pack("{s:s,s:s,s:i,s:I,s:s,s:s}", "path", e->path, "type", "file", "mode",
                            (int)e->mode, "size", (json_int_t)e->size, "sha256", e->sha, "key",
                            e->key);
        ok = o && json_array_append_new(arr, o) == 0;
    }
    if (ok)
        ok = json_object_set_new(root, "entries", arr) == 0;
    else
        json_decref(arr);
    char *text = ok ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    if (!text)
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory encoding the manifest of '%s'",
                          m->name ? m->name : "");
    *json = text;
    *len = strlen(text);
    return KC_OK;
}

/* Why a relative path must not be used, or NULL when it is fine. */
static const char *path_problem(const char *p, size_t len)
{
    if (len == 0)
        return "an empty path";
    if (strlen(p) != len)
        return "a NUL byte in the path";
    if (len > KC_SNAP_PATH_MAX)
        return "a path longer than 1024 bytes";
    if (p[0] == '/')
        return "an absolute path";
    const char *c = p;
    while (*c) {
        const char *slash = strchr(c, '/');
        size_t n = slash ? (size_t)(slash - c) : strlen(c);
        if (n == 0)
            return "an empty path component ('//' or a trailing '/')";
        if ((n == 1 && c[0] == '.') || (n == 2 && c[0] == '.' && c[1] == '.'))
            return "a '.' or '..' component";
        if (n > KC_SNAP_NAME_MAX)
            return "a path component longer than 255 bytes";
        for (size_t i = 0; i < n; i++)
            if ((unsigned char)c[i] < 0x20 || c[i] == 0x7f)
                return "a control character in the path";
        if (!slash)
            break;
        if (!slash[1])
            return "an empty path component ('//' or a trailing '/')";
        c = slash + 1;
    }
    return NULL;
}

static bool grow(kc_snap_manifest *m)
{
    if (m->n < m->cap)
        return true;
    size_t cap = m->cap ? m->cap * 2 : 64;
    kc_snap_entry *e = realloc(m->e, cap * sizeof *e);
    if (!e)
        return false;
    m->e = e;
    m->cap = cap;
    return true;
}

static char *dup_string(json_t *o, const char *name)
{
    const char *v = json_string_value(json_object_get(o, name));
    return strdup(v ? v : "");
}

/* One entry of "entries"; i names it in errors. */
static kc_code parse_entry(json_t *o, size_t i, kc_snap_manifest *m, kc_err *err)
{
    json_t *jp = json_object_get(o, "path");
    const char *path = json_string_value(jp);
    if (!json_is_object(o) || !path)
        return kc_err_set(err, KC_ERR_INVALID, "manifest entry %zu has no path", i);
    const char *why = path_problem(path, json_string_length(jp));
    if (why)
        return kc_err_set(err, KC_ERR_INVALID, "manifest entry %zu ('%.200s'): refused: %s", i,
                          path, why);
    const char *type = json_string_value(json_object_get(o, "type"));
    kc_snap_entry e = {0};
    if (type && strcmp(type, "file") == 0)
        e.type = KC_SNAP_FILE;
    else if (type && strcmp(type, "dir") == 0)
        e.type = KC_SNAP_DIR;
    else
        return kc_err_set(err, KC_ERR_INVALID,
                          "manifest entry '%.200s': refused: type '%.40s' (only files and "
                          "directories are restored; no symlinks, devices or FIFOs)",
                          path, type ? type : "(none)");
    json_t *jm = json_object_get(o, "mode");
    if (!json_is_integer(jm) || json_integer_value(jm) < 0)
        return kc_err_set(err, KC_ERR_INVALID, "manifest entry '%.200s': no mode", path);
    json_int_t mode = json_integer_value(jm);
    if (mode & ~(json_int_t)0777)
        return kc_err_set(err, KC_ERR_INVALID,
                          "manifest entry '%.200s': refused: mode 0%llo has bits beyond 0777 "
                          "(setuid, setgid, sticky or file type)",
                          path, (unsigned long long)mode);
    e.mode = (unsigned)mode;
    if (e.type == KC_SNAP_FILE) {
        json_t *js = json_object_get(o, "size");
        const char *sha = json_string_value(json_object_get(o, "sha256"));
        const char *key = json_string_value(json_object_get(o, "key"));
        if (!json_is_integer(js) || json_integer_value(js) < 0 ||
            (uint64_t)json_integer_value(js) > KC_PAYLOAD_MAX)
            return kc_err_set(err, KC_ERR_INVALID, "manifest entry '%.200s': bad size", path);
        if (!sha || !kc_key_valid(sha) || !key)
            return kc_err_set(err, KC_ERR_INVALID, "manifest entry '%.200s': bad sha256", path);
        e.size = (uint64_t)json_integer_value(js);
        memcpy(e.sha, sha, sizeof e.sha);
        kc_snapshot_file_key(sha, e.key);
        if (strcmp(key, e.key) != 0)
            return kc_err_set(err, KC_ERR_INVALID,
                              "manifest entry '%.200s': key %.70s is not the key of its sha256",
                              path, key);
    }
    if (!grow(m) || !(e.path = strdup(path)))
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory reading a manifest");
    m->e[m->n++] = e;
    if (e.type == KC_SNAP_FILE) {
        m->nfiles++;
        m->bytes += e.size;
    }
    return KC_OK;
}

/* Duplicates and paths below a file, on sorted entries. */
static kc_code check_tree(const kc_snap_manifest *m, kc_err *err)
{
    for (size_t i = 0; i < m->n; i++) {
        const char *p = m->e[i].path;
        if (i > 0 && strcmp(m->e[i - 1].path, p) == 0)
            return kc_err_set(err, KC_ERR_INVALID, "manifest: refused: '%.200s' appears twice", p);
        char parent[KC_SNAP_PATH_MAX + 1];
        snprintf(parent, sizeof parent, "%s", p);
        for (char *slash = strrchr(parent, '/'); slash; slash = strrchr(parent, '/')) {
            *slash = '\0';
            kc_snap_entry k = {.path = parent};
            const kc_snap_entry *hit = bsearch(&k, m->e, m->n, sizeof *m->e, entry_cmp);
            if (hit && hit->type == KC_SNAP_FILE)
                return kc_err_set(err, KC_ERR_INVALID,
                                  "manifest: refused: '%.200s' lies below the file '%.200s'", p,
                                  parent);
            if (hit)
                break; /* a listed directory: its own ancestors were checked */
        }
    }
    return KC_OK;
}

kc_code kc_snap_manifest_parse(const void *json, size_t len, kc_snap_manifest *m, kc_err *err)
{
    memset(m, 0, sizeof *m);
    json_error_t je;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return kc_err_set(err, KC_ERR_INVALID, "manifest is not JSON: %s (line %d)", je.text,
                          je.line);
    kc_code rc = KC_OK;
    const char *format = json_string_value(json_object_get(root, "format"));
    json_t *entries = json_object_get(root, "entries");
    if (!format || strcmp(format, KC_SNAP_FORMAT) != 0) {
        rc = kc_err_set(err, KC_ERR_VERSION, "manifest format '%.40s' (want %s)",
                        format ? format : "(none)", KC_SNAP_FORMAT);
    } else if (!json_is_array(entries) || json_array_size(entries) > KC_SNAP_ENTRIES_MAX) {
        rc = kc_err_set(err, KC_ERR_INVALID, "manifest has no entries array of at most %d",
                        KC_SNAP_ENTRIES_MAX);
    } else {
        m->name = dup_string(root, "name");
        m->device = dup_string(root, "device");
        m->version = dup_string(root, "version");
        m->created_us = (int64_t)json_integer_value(json_object_get(root, "created_us"));
        if (!m->name || !m->device || !m->version)
            rc = kc_err_set(err, KC_ERR_NOMEM, "out of memory reading a manifest");
        size_t i;
        json_t *o;
        json_array_foreach(entries, i, o)
        {
            if (rc != KC_OK)
                break;
            rc = parse_entry(o, i, m, err);
        }
    }
    json_decref(root);
    if (rc == KC_OK && m->n) {
        qsort(m->e, m->n, sizeof *m->e, entry_cmp);
        rc = check_tree(m, err);
    }
    if (rc != KC_OK)
        kc_snap_manifest_free(m);
    return rc;
}

kc_code kc_snap_manifest_store(kc_store *s, const kc_snap_manifest *m, char key[KC_KEY_HEX_LEN + 1],
                               bool *created, kc_err *err)
{
    char *text;
    size_t len;
    kc_code rc = kc_snap_manifest_encode(m, &text, &len, err);
    if (rc != KC_OK)
        return rc;
    char slot[KC_KEY_HEX_LEN + 1];
    kc_snapshot_key(m->name, m->device, m->version, slot);
    uint8_t sha[KC_SHA256_LEN];
    kc_sha256(text, len, sha);
    kc_snapshot_manifest_key(slot, sha, key);
    char tag[KC_SNAP_IDENT_MAX + 8];
    snprintf(tag, sizeof tag, "dir:%s", m->name);
    json_t *meta = json_pack("{s:s,s:s,s:I,s:s,s:s,s:s}", "device", slot, "tag", tag, "created",
                             (json_int_t)(m->created_us / 1000000), "snapshot", m->name, "version",
                             m->version, "device_key", m->device);
    char *mtext = meta ? json_dumps(meta, JSON_COMPACT) : NULL;
    json_decref(meta);
    kc_artifact a = {.meta = mtext, .payload = (uint8_t *)text, .payload_len = len};
    memcpy(a.key, key, KC_KEY_HEX_LEN + 1);
    snprintf(a.kind, sizeof a.kind, "%s", KC_SNAP_KIND_MANIFEST);
    memcpy(a.payload_sha, sha, sizeof sha);
    rc = mtext ? kc_store_put(s, &a, created, err)
               : kc_err_set(err, KC_ERR_NOMEM, "out of memory storing a manifest");
    free(mtext);
    free(text);
    return rc;
}

kc_code kc_snap_manifest_find(kc_store *s, const char *slot, kc_snap_manifest *m,
                              char key[KC_KEY_HEX_LEN + 1], kc_err *err)
{
    memset(m, 0, sizeof *m);
    char(*keys)[KC_KEY_HEX_LEN + 1] = NULL;
    size_t nkeys = 0;
    kc_filter f = {.kind = KC_SNAP_KIND_MANIFEST, .device = slot};
    kc_code rc = kc_store_list_keys(s, &f, &keys, &nkeys, err);
    if (rc != KC_OK)
        kc_err_prefix(err, "snapshot %s: manifests", slot);
    kc_artifact best = {0};
    int64_t best_t = 0;
    size_t untrusted = 0;
    kc_err terr = {0};
    for (size_t i = 0; rc == KC_OK && i < nkeys; i++) {
        kc_artifact a;
        kc_err e = {0};
        if (kc_store_get(s, keys[i], &a, &e) != KC_OK)
            continue; /* evicted or quarantined meanwhile */
        if (kc_store_trusts(s, &a, &terr) != KC_OK) {
            untrusted++;
            kc_artifact_free(&a);
            continue;
        }
        json_t *j = json_loadb((const char *)a.payload, a.payload_len, 0, NULL);
        int64_t t = j ? (int64_t)json_integer_value(json_object_get(j, "created_us")) : 0;
        json_decref(j);
        if (!best.payload || t > best_t || (t == best_t && strcmp(a.key, best.key) > 0)) {
            kc_artifact_free(&best);
            best = a;
            best_t = t;
        } else {
            kc_artifact_free(&a);
        }
    }
    free(keys);
    if (rc != KC_OK)
        return rc;
    if (!best.payload) {
        if (untrusted) {
            if (err)
                *err = terr;
            kc_err_prefix(err, "snapshot %s: %zu manifest(s), none signed by a trusted key", slot,
                          untrusted);
            return terr.code; /* kc_err_prefix answers KC_OK for a NULL err */
        }
        return kc_err_set(err, KC_ERR_NOT_FOUND, "no manifest for snapshot %s", slot);
    }
    rc = kc_snap_manifest_parse(best.payload, best.payload_len, m, err);
    if (rc != KC_OK)
        kc_err_prefix(err, "manifest %s", best.key);
    else if (key)
        memcpy(key, best.key, KC_KEY_HEX_LEN + 1);
    kc_artifact_free(&best);
    return rc;
}
