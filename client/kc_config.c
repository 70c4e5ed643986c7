/*
 * kc_config.c - the client's settings (kc_config.h): one table of settings, four
 * sources in a fixed order (given, environment, file, default), and the one reader
 * of token files, shared by the kcache tool and the Python package.
 */
#include <kcache/kc_config.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <kcache/kc_log.h>
#include <kcache/kc_store.h>
#include <kcache/kc_util.h>

static const kc_setting_info settings[KC_SETTING_COUNT] = {
    [KC_SET_CACHE_DIR] = {"cache-dir", "KCACHE_DIR", "DIR",
                          "$XDG_CACHE_HOME/kcache, else ~/.cache/kcache",
                          "the local cache directory (kcache.db and its pack files)",
                          KC_SETTING_PATH},
    [KC_SET_REMOTE] = {"remote", "KCACHE_REMOTE", "URL[,URL...]", NULL,
                       "the kcached server; several comma-separated servers share the keys "
                       "by rendezvous hashing",
                       KC_SETTING_URLS},
    [KC_SET_TOKEN] = {"token", "KCACHE_TOKEN", "TOKEN", NULL,
                      "the bearer token sent to the server (on a command line every user "
                      "of the machine can read it: prefer token-file)",
                      KC_SETTING_SECRET},
    [KC_SET_TOKEN_FILE] = {"token-file", "KCACHE_TOKEN_FILE", "FILE", NULL,
                           "read the bearer token from the first line of FILE (keep it "
                           "chmod 600)",
                           KC_SETTING_PATH},
    [KC_SET_CA_FILE] = {"ca-file", "KCACHE_CA_FILE", "PEM", "the system's certificate authorities",
                        "extra certificate authorities for an https:// server", KC_SETTING_PATH},
    [KC_SET_CLIENT_CERT] = {"client-cert", "KCACHE_CLIENT_CERT", "PEM", NULL,
                            "client certificate for a server that requires one (kcached "
                            "--tls-client-ca)",
                            KC_SETTING_PATH},
    [KC_SET_CLIENT_KEY] = {"client-key", "KCACHE_CLIENT_KEY", "PEM", "in the client-cert file",
                           "the client certificate's private key", KC_SETTING_PATH},
    [KC_SET_SIGN_KEY] = {"sign-key", "KCACHE_SIGN_KEY", "PEM", NULL,
                         "sign every artifact uploaded or exported with this Ed25519 private "
                         "key",
                         KC_SETTING_PATH},
    [KC_SET_TRUSTED_KEYS] = {"trusted-keys", "KCACHE_TRUSTED_KEYS", "PEM", NULL,
                             "accept artifacts from a server or a bundle only when one of "
                             "these Ed25519 public keys signed them",
                             KC_SETTING_PATH},
    [KC_SET_MAX_SIZE] = {"max-size", "KCACHE_MAX_SIZE", "SIZE", "no limit",
                         "size limit of the local cache: every write evicts "
                         "least-recently-used entries to stay under it",
                         KC_SETTING_SIZE},
    [KC_SET_MAX_ARTIFACT] =
        {"max-artifact", "KCACHE_MAX_ARTIFACT", "SIZE|KIND=SIZE,...",
         "by kind: autotune 1M, cpu-so and spirv 32M, graph 64M, dir-manifest 128M, others 1G",
         "largest payload taken from a server, for every kind (SIZE) or "
         "per kind (cpu-so=128M,2G); a larger one is refused from its "
         "header, before its body is downloaded",
         KC_SETTING_LIMITS},
};

/* The sources, highest first. */
enum { L_GIVEN, L_ENV, L_FILE, L_DEFAULT, L_COUNT };
static const kc_source level_origin[L_COUNT] = {KC_SOURCE_GIVEN, KC_SOURCE_ENV, KC_SOURCE_FILE,
                                                KC_SOURCE_DEFAULT};

struct kc_config {
    char *value[KC_SETTING_COUNT][L_COUNT];
    char *where[KC_SETTING_COUNT][L_COUNT];
    uint64_t size[KC_SETTING_COUNT][L_COUNT];
    char *file;
    bool file_found;
    char *token;         /* the credential in effect, as sent */
    kc_setting token_by; /* KC_SET_TOKEN or KC_SET_TOKEN_FILE when token is set */
    char *token_from;    /* where token came from, with the file it was read from */
};

const kc_setting_info *kc_setting_describe(kc_setting s)
{
    return (unsigned)s < KC_SETTING_COUNT ? &settings[s] : NULL;
}

int kc_setting_find(const char *name)
{
    char norm[64];
    size_t n = strlen(name);
    if (n >= sizeof norm)
        return -1;
    for (size_t i = 0; i <= n; i++)
        norm[i] = name[i] == '_' ? '-' : name[i];
    for (int s = 0; s < KC_SETTING_COUNT; s++)
        if (strcmp(settings[s].name, norm) == 0)
            return s;
    return -1;
}

kc_config *kc_config_new(void)
{
    kc_config *c = calloc(1, sizeof *c);
    if (c)
        c->token_by = KC_SETTING_COUNT;
    return c;
}

static void wipe(char *s)
{
    if (s) {
        /* a volatile pointer, so the wipe of memory about to be freed stays */
        volatile char *v = s;
        while (*v)
            *v++ = 0;
    }
    free(s);
}

void kc_config_free(kc_config *c)
{
    if (!c)
        return;
    for (int s = 0; s < KC_SETTING_COUNT; s++)
        for (int l = 0; l < L_COUNT; l++) {
            if (settings[s].kind == KC_SETTING_SECRET)
                wipe(c->value[s][l]);
            else
                free(c->value[s][l]);
            free(c->where[s][l]);
        }
    free(c->file);
    wipe(c->token);
    free(c->token_from);
    free(c);
}

/* Checks value for s; the number of a size goes to *size. Messages start
 * with where. */
static kc_code check_value(kc_setting s, const char *value, const char *where, uint64_t *size,
                           kc_err *err)
{
    switch (settings[s].kind) {
    case KC_SETTING_SIZE:
        if (kc_parse_size(value, size, err) != KC_OK)
            return kc_err_prefix(err, "%s", where);
        return KC_OK;
    case KC_SETTING_LIMITS: {
        const char *kinds;
        if (kc_remote_parse_limits(value, size, &kinds, err) != KC_OK)
            return kc_err_prefix(err, "%s", where);
        return KC_OK;
    }
    case KC_SETTING_URLS:
        for (const char *p = value; *p;) {
            size_t n = strcspn(p, ",");
            if (n == 0 || !((n > 7 && strncmp(p, "http://", 7) == 0) ||
                            (n > 8 && strncmp(p, "https://", 8) == 0))) {
                char *shown = kc_remote_redact_url(value);
                kc_code rc = kc_err_set(err, KC_ERR_INVALID,
                                        "%s: '%s' is not a list of http:// or https:// URLs", where,
                                        shown ? shown : "");
                free(shown);
                return rc;
            }
            p += n + (p[n] == ',');
        }
        return KC_OK;
    case KC_SETTING_PATH:
    case KC_SETTING_SECRET:
        return KC_OK;
    }
    return KC_OK;
}

/* Checks value (messages start with named) and stores a copy at level l,
 * replacing what the level had; where says where it came from. */
static kc_code put(kc_config *c, kc_setting s, int l, const char *value, const char *where,
                   const char *named, kc_err *err)
{
    uint64_t size = 0;
    if (check_value(s, value, named, &size, err) != KC_OK)
        return err->code;
    char *v = strdup(value), *w = strdup(where);
    if (!v || !w) {
        free(v);
        free(w);
        return kc_err_set(err, KC_ERR_NOMEM, "%s: out of memory", where);
    }
    if (settings[s].kind == KC_SETTING_SECRET)
        wipe(c->value[s][l]);
    else
        free(c->value[s][l]);
    free(c->where[s][l]);
    c->value[s][l] = v;
    c->where[s][l] = w;
    c->size[s][l] = size;
    return KC_OK;
}

kc_code kc_config_give(kc_config *c, kc_setting s, const char *value, const char *as, kc_err *err)
{
    if ((unsigned)s >= KC_SETTING_COUNT)
        return kc_err_set(err, KC_ERR_INVALID, "%s: no such setting", as);
    if (!value || !*value)
        return KC_OK;
    return put(c, s, L_GIVEN, value, as, as, err);
}

char *kc_config_path(void)
{
    const char *base = getenv("XDG_CONFIG_HOME"), *suffix = "/kcache/config";
    if (!base || !*base) {
        base = getenv("HOME");
        suffix = "/.config/kcache/config";
    }
    if (!base || !*base)
        return NULL;
    size_t n = strlen(base) + strlen(suffix) + 1;
    char *p = malloc(n);
    if (p)
        snprintf(p, n, "%s%s", base, suffix);
    return p;
}

static char *trim(char *s)
{
    s += strspn(s, " \t\r\n");
    size_t n = strlen(s);
    while (n && strchr(" \t\r\n", s[n - 1]))
        s[--n] = '\0';
    return s;
}

/* A path from the file: absolute, or "~/..." under $HOME. malloc'd in *out. */
static kc_code file_path(const char *v, const char *where, char **out, kc_err *err)
{
    const char *home = getenv("HOME");
    if (v[0] == '~' && v[1] == '/' && home && *home) {
        size_t n = strlen(home) + strlen(v);
        if ((*out = malloc(n)))
            snprintf(*out, n, "%s%s", home, v + 1);
    } else if (v[0] == '/') {
        *out = strdup(v);
    } else {
        return kc_err_set(err, KC_ERR_INVALID,
                          "%s: '%s' is not an absolute path (give /... or ~/...)", where, v);
    }
    return *out ? KC_OK : kc_err_set(err, KC_ERR_NOMEM, "%s: out of memory", where);
}

/* One line of the file; lineno for messages. *secret set when it gives a token. */
static kc_code file_line(kc_config *c, char *line, unsigned lineno, bool *secret, kc_err *err)
{
    char where[4200];
    snprintf(where, sizeof where, "%s:%u", c->file, lineno);
    char *s = trim(line);
    if (!*s || *s == '#')
        return KC_OK;
    char *eq = strchr(s, '=');
    if (!eq)
        return kc_err_set(err, KC_ERR_INVALID, "%s: expected `key = value`, got '%.60s'", where, s);
    *eq = '\0';
    char *key = trim(s), *val = trim(eq + 1);
    int id = kc_setting_find(key);
    if (id < 0) {
        const char *near = kc_nearest(key, settings, KC_SETTING_COUNT, sizeof settings[0], 0);
        return kc_err_set(err, KC_ERR_INVALID, "%s: unknown setting '%.60s'%s%s%s", where, key,
                          near ? " (did you mean '" : "", near ? near : "", near ? "'?)" : "");
    }
    size_t vn = strlen(val);
    if (vn >= 2 && (val[0] == '"' || val[0] == '\'') && val[vn - 1] == val[0]) {
        val[vn - 1] = '\0';
        val++;
    }
    if (!*val)
        return kc_err_set(err, KC_ERR_INVALID, "%s: %s has no value", where, key);
    char named[4300];
    snprintf(named, sizeof named, "%s: %s", where, settings[id].name);
    *secret |= settings[id].kind == KC_SETTING_SECRET;
    if (settings[id].kind != KC_SETTING_PATH)
        return put(c, (kc_setting)id, L_FILE, val, where, named, err);
    char *path;
    if (file_path(val, named, &path, err) != KC_OK)
        return err->code;
    kc_code rc = put(c, (kc_setting)id, L_FILE, path, where, named, err);
    free(path);
    return rc;
}

static kc_code read_file(kc_config *c, kc_err *err)
{
    FILE *f = fopen(c->file, "r");
    if (!f) {
        if (errno == ENOENT || errno == ENOTDIR)
            return KC_OK;
        return kc_err_errno(err, KC_ERR_IO, errno, "cannot read configuration file %s", c->file);
    }
    c->file_found = true;
    char *line = NULL;
    size_t cap = 0;
    unsigned lineno = 0;
    bool secret = false;
    kc_code rc = KC_OK;
    while (rc == KC_OK && getline(&line, &cap, f) >= 0)
        rc = file_line(c, line, ++lineno, &secret, err);
    if (rc == KC_OK && ferror(f))
        rc = kc_err_errno(err, KC_ERR_IO, errno, "cannot read configuration file %s", c->file);
    struct stat st;
    if (rc == KC_OK && secret && fstat(fileno(f), &st) == 0 && (st.st_mode & 077))
        kc_log(KC_LOG_WARN,
               "configuration file %s holds a token and can be read by other users "
               "(mode %03o); chmod 600 it",
               c->file, (unsigned)(st.st_mode & 0777));
    free(line);
    fclose(f);
    return rc;
}

/* The token in a token file: its first line without surrounding blanks. A
 * file other users can read is used, with a warning. */
static char *read_token_file(const char *path, const char *where, kc_err *err)
{
    uint8_t *data;
    size_t len;
    if (kc_read_file(path, &data, &len, err) != KC_OK) {
        kc_err_prefix(err, "%s", where);
        return NULL;
    }
    char *t = (char *)data;
    t[strcspn(t, "\r\n")] = '\0';
    size_t a = strspn(t, " \t"), n = strlen(t + a);
    while (n > 0 && (t[a + n - 1] == ' ' || t[a + n - 1] == '\t'))
        n--;
    memmove(t, t + a, n);
    memset(t + n, 0, len - n); /* nothing of the file stays past the token */
    if (!*t) {
        free(t);
        kc_err_set(err, KC_ERR_INVALID, "%s: token file %s is empty", where, path);
        return NULL;
    }
    struct stat st;
    if (stat(path, &st) == 0 && (st.st_mode & 077))
        kc_log(KC_LOG_WARN, "token file %s can be read by other users (mode %03o); chmod 600 it",
               path, (unsigned)(st.st_mode & 0777));
    return t;
}

/* The highest source that has s, or L_COUNT. */
static int level_of(const kc_config *c, kc_setting s)
{
    int l = 0;
    while (l < L_COUNT && !c->value[s][l])
        l++;
    return l;
}

/* Of token and token-file, the higher source gives the credential; within
 * one source the token. */
kc_code kc_config_read_token(kc_config *c, kc_err *err)
{
    wipe(c->token);
    c->token = NULL;
    free(c->token_from);
    c->token_from = NULL;
    c->token_by = KC_SETTING_COUNT;
    int lt = level_of(c, KC_SET_TOKEN), lf = level_of(c, KC_SET_TOKEN_FILE);
    if (lt == L_COUNT && lf == L_COUNT)
        return KC_OK;
    if (lt <= lf) {
        c->token_by = KC_SET_TOKEN;
        c->token = strdup(c->value[KC_SET_TOKEN][lt]);
        c->token_from = strdup(c->where[KC_SET_TOKEN][lt]);
    } else {
        /* "--token-file /etc/t", "$KCACHE_TOKEN_FILE (/etc/t)": which file, and who named it */
        const char *path = c->value[KC_SET_TOKEN_FILE][lf], *by = c->where[KC_SET_TOKEN_FILE][lf];
        c->token_by = KC_SET_TOKEN_FILE;
        if (!(c->token = read_token_file(path, by, err)))
            return err->code;
        size_t cap = strlen(path) + strlen(by) + 4;
        if ((c->token_from = malloc(cap)))
            snprintf(c->token_from, cap, by[0] == '-' ? "%s %s" : "%s (%s)", by, path);
    }
    return c->token && c->token_from ? KC_OK : kc_err_set(err, KC_ERR_NOMEM, "out of memory");
}

kc_code kc_config_load(kc_config *c, kc_err *err)
{
    for (int s = 0; s < KC_SETTING_COUNT; s++) {
        const char *v = getenv(settings[s].env);
        char where[64];
        snprintf(where, sizeof where, "$%s", settings[s].env);
        if (v && *v && put(c, (kc_setting)s, L_ENV, v, where, where, err) != KC_OK)
            return err->code;
    }
    free(c->file);
    c->file = kc_config_path();
    c->file_found = false;
    kc_code rc = c->file ? read_file(c, err) : KC_OK;
    if (rc != KC_OK)
        return rc;
    if (level_of(c, KC_SET_CACHE_DIR) == L_COUNT) {
        char *d = kc_store_default_dir();
        if (d)
            rc = put(c, KC_SET_CACHE_DIR, L_DEFAULT, d, "default", "default", err);
        free(d);
    }
    return rc;
}

const char *kc_config_file(const kc_config *c, bool *found)
{
    if (found)
        *found = c->file_found;
    return c->file;
}

const char *kc_config_get(const kc_config *c, kc_setting s)
{
    if ((unsigned)s >= KC_SETTING_COUNT)
        return NULL;
    int l = level_of(c, s);
    return l < L_COUNT ? c->value[s][l] : NULL;
}

kc_source kc_config_origin(const kc_config *c, kc_setting s, const char **where)
{
    int l = (unsigned)s < KC_SETTING_COUNT ? level_of(c, s) : L_COUNT;
    if (where)
        *where = l < L_COUNT ? c->where[s][l] : NULL;
    return l < L_COUNT ? level_origin[l] : KC_SOURCE_NONE;
}

uint64_t kc_config_size(const kc_config *c, kc_setting s)
{
    int l = (unsigned)s < KC_SETTING_COUNT ? level_of(c, s) : L_COUNT;
    return l < L_COUNT ? c->size[s][l] : 0;
}

bool kc_config_used(const kc_config *c, kc_setting s)
{
    if (s != KC_SET_TOKEN && s != KC_SET_TOKEN_FILE)
        return true;
    int lt = level_of(c, KC_SET_TOKEN), lf = level_of(c, KC_SET_TOKEN_FILE);
    return !kc_config_get(c, s) || (s == KC_SET_TOKEN ? lt <= lf : lf < lt);
}

const char *kc_config_token(const kc_config *c, const char **where)
{
    if (where)
        *where = c->token_from;
    return c->token;
}

void kc_config_remote_opts(const kc_config *c, kc_remote_opts *o)
{
    o->token = c->token;
    o->token_source = c->token_from;
    o->ca_file = kc_config_get(c, KC_SET_CA_FILE);
    o->client_cert = kc_config_get(c, KC_SET_CLIENT_CERT);
    o->client_key = kc_config_get(c, KC_SET_CLIENT_KEY);
    o->max_artifact = kc_config_size(c, KC_SET_MAX_ARTIFACT);
    const char *limits = kc_config_get(c, KC_SET_MAX_ARTIFACT);
    o->kind_limits = limits && strchr(limits, '=') ? limits : NULL;
}
