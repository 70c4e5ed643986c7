/*
 * kcd_config.c - merges kcached's settings from defaults, a config file, the
 * environment and the command line, in that order of increasing precedence.
 * One option table drives all four sources so they cannot drift apart.
 */
#include "kcd_config.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "kc_sign.h"
#include "kc_util.h"
#include "kcd_auth.h"
#include "kcd_log.h"

typedef enum { OPT_STR, OPT_SIZE, OPT_UINT, OPT_BOOL, OPT_LEVEL } opt_type;

typedef struct opt_def {
    const char *name;
    opt_type type;
    size_t off;
    const char *help;
} opt_def;

#define OFF(f) offsetof(kcd_config, f)
static const opt_def kcd_opts[] = {
    {"listen", OPT_STR, OFF(listen), "HOST:PORT to listen on (port 0 = any free port)"},
    {"data", OPT_STR, OFF(data), "store directory"},
    {"max-size", OPT_SIZE, OFF(max_size), "store size limit, LRU eviction (0 = unlimited)"},
    {"max-blob", OPT_SIZE, OFF(max_blob),
     "largest accepted upload and bundle artifact (413 above)"},
    {"upload-memory", OPT_SIZE, OFF(upload_memory),
     "request-body bytes buffered by all uploads at once (503 above)"},
    {"memory-cache", OPT_SIZE, OFF(memory_cache), "memory for hot artifacts (0 = off)"},
    {"tokens", OPT_STR, OFF(tokens), "tokens file: `TOKEN SCOPES [NAME]` per line"},
    {"anonymous-read", OPT_BOOL, OFF(anonymous_read), "allow reads without a token"},
    {"insecure-no-auth", OPT_BOOL, OFF(insecure_no_auth),
     "allow a non-loopback --listen without --tokens"},
    {"tls-cert", OPT_STR, OFF(tls_cert), "PEM certificate: serve HTTPS"},
    {"tls-key", OPT_STR, OFF(tls_key), "PEM private key for --tls-cert"},
    {"tls-priorities", OPT_STR, OFF(tls_priorities),
     "GnuTLS priority string (default: TLS 1.2 and 1.3 only)"},
    {"tls-client-ca", OPT_STR, OFF(tls_client_ca),
     "PEM CA: require a client certificate it signed (mTLS; `cert:SUBJECT` lines in --tokens)"},
    {"trusted-keys", OPT_STR, OFF(trusted_keys),
     "PEM Ed25519 public keys: refuse uploads not signed by one (422)"},
    {"threads", OPT_UINT, OFF(threads), "worker threads (0 = one per CPU)"},
    {"timeout", OPT_UINT, OFF(timeout), "idle connection timeout, seconds"},
    {"max-connections", OPT_UINT, OFF(max_connections), "concurrent connection limit"},
    {"per-ip-connections", OPT_UINT, OFF(per_ip_connections),
     "concurrent connections from one client address"},
    {"header-timeout", OPT_UINT, OFF(header_timeout),
     "seconds a new connection may stay idle before its request head is in"},
    {"grace", OPT_UINT, OFF(grace), "seconds in-flight requests get on SIGTERM"},
    {"compact-interval", OPT_UINT, OFF(compact_interval),
     "seconds between compactions of mostly-dead pack files (0 = never)"},
    {"log-level", OPT_LEVEL, OFF(log_level), "error, warn, info (access log) or debug"},
    {"port-file", OPT_STR, OFF(port_file), "write the bound port to FILE once listening"},
    {"redis-listen", OPT_STR, OFF(redis_listen),
     "HOST:PORT for the Redis protocol (RESP2/3; off when unset)"},
    {"redis-port-file", OPT_STR, OFF(redis_port_file),
     "write the bound Redis port to FILE (before --port-file)"},
    {"redis-timeout", OPT_UINT, OFF(redis_timeout),
     "seconds a Redis client may send nothing before it is closed (0 = never)"},
};
#define NOPTS (sizeof kcd_opts / sizeof kcd_opts[0])

void kcd_config_defaults(kcd_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->listen = strdup("127.0.0.1:7070");
    cfg->data = strdup("kcached-data");
    cfg->max_blob = 1ull << 30;
    cfg->upload_memory = 2ull << 30;
    cfg->tls_priorities = strdup(KCD_TLS_PRIORITIES_DEFAULT);
    cfg->memory_cache = 128ull << 20;
    cfg->timeout = 60;
    cfg->max_connections = 4096;
    cfg->per_ip_connections = 256;
    cfg->header_timeout = 20;
    cfg->redis_timeout = 300;
    cfg->grace = 30;
    cfg->compact_interval = 3600;
    cfg->log_level = KCD_LOG_INFO;
    kcd_s3_config_defaults(&cfg->s3);
}

void kcd_config_free(kcd_config *cfg)
{
    if (!cfg)
        return;
    free(cfg->listen);
    free(cfg->data);
    free(cfg->tokens);
    free(cfg->tls_cert);
    free(cfg->tls_priorities);
    free(cfg->trusted_keys);
    free(cfg->tls_key);
    free(cfg->tls_client_ca);
    free(cfg->port_file);
    free(cfg->redis_listen);
    free(cfg->redis_port_file);
    free(cfg->config);
    kcd_s3_config_free(&cfg->s3);
    memset(cfg, 0, sizeof *cfg);
}

static const opt_def *opt_find(const char *name)
{
    char norm[64];
    size_t n = strlen(name);
    if (n >= sizeof norm)
        return NULL;
    for (size_t i = 0; i <= n; i++)
        norm[i] = name[i] == '_' ? '-' : (char)tolower((unsigned char)name[i]);
    for (size_t i = 0; i < NOPTS; i++)
        if (!strcmp(kcd_opts[i].name, norm))
            return &kcd_opts[i];
    return NULL;
}

static int parse_bool(const char *v)
{
    if (!v || !*v || !strcasecmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes") ||
        !strcasecmp(v, "on"))
        return 1;
    if (!strcasecmp(v, "0") || !strcasecmp(v, "false") || !strcasecmp(v, "no") ||
        !strcasecmp(v, "off"))
        return 0;
    return -1;
}

kc_code kcd_config_set(kcd_config *cfg, const char *name, const char *value, const char *source,
                       kc_err *err)
{
    const opt_def *o = opt_find(name);
    if (!o) {
        char norm[64];
        snprintf(norm, sizeof norm, "%s", name);
        for (char *c = norm; *c; c++)
            *c = *c == '_' ? '-' : (char)tolower((unsigned char)*c);
        kc_code rc = kcd_s3_config_set(&cfg->s3, norm, value, source, err);
        if (rc == KC_ERR_NOT_FOUND)
            return kc_err_set(err, KC_ERR_INVALID, "%s: unknown option '%s'", source, name);
        return rc;
    }
    void *field = (char *)cfg + o->off;
    switch (o->type) {
    case OPT_STR: {
        char **s = field;
        if (!value)
            return kc_err_set(err, KC_ERR_INVALID, "%s: option '%s' needs a value", source, name);
        char *dup = strdup(value);
        if (!dup)
            return kc_err_set(err, KC_ERR_NOMEM, "%s: out of memory", source);
        free(*s);
        *s = *value ? dup : (free(dup), (char *)NULL);
        return KC_OK;
    }
    case OPT_SIZE: {
        uint64_t v;
        kc_err e;
        if (!value || kc_parse_size(value, &v, &e) != KC_OK)
            return kc_err_set(err, KC_ERR_INVALID, "%s: option '%s': bad size '%s'", source, name,
                              value ? value : "");
        *(uint64_t *)field = v;
        return KC_OK;
    }
    case OPT_UINT: {
        char *end;
        errno = 0;
        unsigned long v = value ? strtoul(value, &end, 10) : 0;
        if (!value || !*value || *end || errno || v > 1000000 || value[0] == '-')
            return kc_err_set(err, KC_ERR_INVALID, "%s: option '%s': bad number '%s'", source, name,
                              value ? value : "");
        *(unsigned *)field = (unsigned)v;
        return KC_OK;
    }
    case OPT_BOOL: {
        int b = parse_bool(value);
        if (b < 0)
            return kc_err_set(err, KC_ERR_INVALID, "%s: option '%s': bad boolean '%s'", source,
                              name, value);
        *(bool *)field = b;
        return KC_OK;
    }
    case OPT_LEVEL: {
        int l = kcd_log_level_parse(value);
        if (l < 0)
            return kc_err_set(err, KC_ERR_INVALID,
                              "%s: option '%s': bad level '%s' (error, warn, info, debug)", source,
                              name, value ? value : "");
        *(int *)field = l;
        return KC_OK;
    }
    }
    return KC_ERR_INVALID;
}

static char *trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1]))
        s[--n] = 0;
    return s;
}

kc_code kcd_config_load_file(kcd_config *cfg, const char *path, kc_err *err)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return kc_err_errno(err, KC_ERR_IO, errno, "cannot open config file %s", path);
    char line[4096];
    unsigned lineno = 0;
    kc_code rc = KC_OK;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        char *s = trim(line);
        if (!*s || *s == '#')
            continue;
        char *eq = strchr(s, '=');
        if (!eq) {
            rc = kc_err_set(err, KC_ERR_INVALID, "%s:%u: expected `key = value`", path, lineno);
            break;
        }
        *eq = 0;
        char *key = trim(s), *val = trim(eq + 1);
        size_t vn = strlen(val);
        if (vn >= 2 &&
            ((val[0] == '"' && val[vn - 1] == '"') || (val[0] == '\'' && val[vn - 1] == '\''))) {
            val[vn - 1] = 0;
            val++;
        }
        char src[600];
        snprintf(src, sizeof src, "%s:%u", path, lineno);
        if ((rc = kcd_config_set(cfg, key, val, src, err)) != KC_OK)
            break;
    }
    fclose(f);
    return rc;
}

static kc_code load_env(kcd_config *cfg, char **envp, kc_err *err)
{
    if (!envp)
        return KC_OK;
    for (char **e = envp; *e; e++) {
        if (strncmp(*e, "KCACHED_", 8) != 0)
            continue;
        const char *eq = strchr(*e, '=');
        if (!eq)
            continue;
        char name[64];
        size_t n = (size_t)(eq - (*e + 8));
        if (n == 0 || n >= sizeof name)
            continue;
        memcpy(name, *e + 8, n);
        name[n] = 0;
        if (!strcmp(name, "CONFIG"))
            continue;
        char src[128];
        snprintf(src, sizeof src, "environment KCACHED_%s", name);
        if (!opt_find(name) && !kcd_s3_config_is_option(name, NULL))
            return kc_err_set(err, KC_ERR_INVALID, "%s: unknown setting", src);
        kc_code rc = kcd_config_set(cfg, name, eq + 1, src, err);
        if (rc != KC_OK)
            return rc;
    }
    return KC_OK;
}

kc_code kcd_config_load(kcd_config *cfg, int argc, char **argv, char **envp,
                        kcd_config_action *action, kc_err *err)
{
    kcd_config_defaults(cfg);
    *action = KCD_RUN;
    /* Pass 1: actions and the config file location. */
    const char *config = NULL;
    if (envp)
        for (char **e = envp; *e; e++)
            if (!strncmp(*e, "KCACHED_CONFIG=", 15) && (*e)[15])
                config = *e + 15;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h"))
            *action = KCD_HELP;
        else if (!strcmp(a, "--version"))
            *action = KCD_VERSION;
        else if (!strcmp(a, "--check-config"))
            *action = KCD_CHECK;
        else if (!strcmp(a, "--config")) {
            if (i + 1 >= argc)
                return kc_err_set(err, KC_ERR_INVALID, "--config needs a file");
            config = argv[++i];
        } else if (!strncmp(a, "--config=", 9))
            config = a + 9;
    }
    if (*action == KCD_HELP || *action == KCD_VERSION)
        return KC_OK;
    kc_code rc;
    if (config) {
        cfg->config = strdup(config);
        if ((rc = kcd_config_load_file(cfg, config, err)) != KC_OK)
            return rc;
    }
    if ((rc = load_env(cfg, envp, err)) != KC_OK)
        return rc;
    /* Pass 2: flags. */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--check-config"))
            continue;
        if (!strcmp(a, "--config")) {
            i++;
            continue;
        }
        if (!strncmp(a, "--config=", 9))
            continue;
        if (strncmp(a, "--", 2) != 0)
            return kc_err_set(err, KC_ERR_INVALID, "unexpected argument '%s' (see --help)", a);
        char name[64];
        const char *eq = strchr(a + 2, '=');
        size_t n = eq ? (size_t)(eq - (a + 2)) : strlen(a + 2);
        if (n == 0 || n >= sizeof name)
            return kc_err_set(err, KC_ERR_INVALID, "bad option '%s'", a);
        memcpy(name, a + 2, n);
        name[n] = 0;
        const opt_def *o = opt_find(name);
        bool s3_bool = false;
        if (!o && !kcd_s3_config_is_option(name, &s3_bool))
            return kc_err_set(err, KC_ERR_INVALID, "unknown option '%s' (see --help)", a);
        bool is_bool = o ? o->type == OPT_BOOL : s3_bool;
        const char *val = eq ? eq + 1 : NULL;
        if (!val && !is_bool) {
            if (i + 1 >= argc)
                return kc_err_set(err, KC_ERR_INVALID, "option '--%s' needs a value", name);
            val = argv[++i];
        }
        if ((rc = kcd_config_set(cfg, name, val, "command line", err)) != KC_OK)
            return rc;
    }
    if (*action == KCD_CHECK)
        cfg->check_config = true;
    return KC_OK;
}

kc_code kcd_parse_listen(const char *text, char *host, unsigned cap, unsigned *port, kc_err *err)
{
    if (!text || !*text)
        return kc_err_set(err, KC_ERR_INVALID, "empty --listen address");
    const char *colon;
    const char *h = text;
    size_t hn;
    if (text[0] == '[') {
        const char *rb = strchr(text, ']');
        if (!rb || rb[1] != ':')
            return kc_err_set(err, KC_ERR_INVALID, "bad --listen address '%s' (want [V6]:PORT)",
                              text);
        h = text + 1;
        hn = (size_t)(rb - h);
        colon = rb + 1;
    } else {
        colon = strrchr(text, ':');
        if (!colon) {
            hn = 0;
            colon = text - 1; /* "PORT" alone */
        } else
            hn = (size_t)(colon - text);
    }
    if (hn >= cap)
        return kc_err_set(err, KC_ERR_INVALID, "bad --listen address '%s'", text);
    memcpy(host, h, hn);
    host[hn] = 0;
    const char *p = colon + 1;
    char *end;
    errno = 0;
    unsigned long v = strtoul(p, &end, 10);
    if (!*p || *end || errno || v > 65535 || *p == '-')
        return kc_err_set(err, KC_ERR_INVALID, "bad port in --listen address '%s'", text);
    *port = (unsigned)v;
    return KC_OK;
}

/* No listener without tokens beyond loopback unless --insecure-no-auth. */
static kc_code refuse_open_listener(const kcd_config *cfg, const char *flag, const char *spec,
                                    const char *host, kc_err *err)
{
    if (cfg->tokens || cfg->insecure_no_auth || kcd_listen_is_loopback(host))
        return KC_OK;
    return kc_err_set(err, KC_ERR_INVALID,
                      "%s %s is not a loopback address and no --tokens file is set: "
                      "anyone who can reach it could read, write and delete; give --tokens "
                      "FILE, or --insecure-no-auth if that is really meant",
                      flag, spec);
}

kc_code kcd_config_validate(const kcd_config *cfg, kc_err *err)
{
    char host[256];
    unsigned port;
    kc_code rc = kcd_parse_listen(cfg->listen, host, sizeof host, &port, err);
    if (rc != KC_OK)
        return rc;
    if (!cfg->data || !*cfg->data)
        return kc_err_set(err, KC_ERR_INVALID, "--data is required");
    if (!!cfg->tls_cert != !!cfg->tls_key)
        return kc_err_set(err, KC_ERR_INVALID, "--tls-cert and --tls-key go together");
    if (cfg->tls_cert && access(cfg->tls_cert, R_OK) != 0)
        return kc_err_errno(err, KC_ERR_IO, errno, "cannot read --tls-cert %s", cfg->tls_cert);
    if (cfg->tls_key && access(cfg->tls_key, R_OK) != 0)
        return kc_err_errno(err, KC_ERR_IO, errno, "cannot read --tls-key %s", cfg->tls_key);
    if (cfg->tls_client_ca && !cfg->tls_cert)
        return kc_err_set(err, KC_ERR_INVALID,
                          "--tls-client-ca needs --tls-cert and --tls-key (client certificates "
                          "are checked in the TLS handshake)");
    if (cfg->tls_client_ca && access(cfg->tls_client_ca, R_OK) != 0)
        return kc_err_errno(err, KC_ERR_IO, errno, "cannot read --tls-client-ca %s",
                            cfg->tls_client_ca);
    if (cfg->trusted_keys) {
        kc_trust *t;
        if ((rc = kc_trust_load(cfg->trusted_keys, &t, err)) != KC_OK) {
            kc_err_prefix(err, "--trusted-keys");
            return rc;
        }
        kc_trust_free(t);
    }
    if (cfg->max_blob == 0)
        return kc_err_set(err, KC_ERR_INVALID, "--max-blob must be positive");
    if (cfg->timeout == 0)
        return kc_err_set(err, KC_ERR_INVALID, "--timeout must be positive");
    if (cfg->max_connections == 0)
        return kc_err_set(err, KC_ERR_INVALID, "--max-connections must be positive");
    if (cfg->per_ip_connections == 0)
        return kc_err_set(err, KC_ERR_INVALID, "--per-ip-connections must be positive");
    if (cfg->header_timeout == 0)
        return kc_err_set(err, KC_ERR_INVALID, "--header-timeout must be positive");
    if (cfg->upload_memory < cfg->max_blob)
        return kc_err_set(
            err, KC_ERR_INVALID, "--upload-memory (%llu) must be at least --max-blob (%llu)",
            (unsigned long long)cfg->upload_memory, (unsigned long long)cfg->max_blob);
    if ((rc = refuse_open_listener(cfg, "--listen", cfg->listen, host, err)) != KC_OK)
        return rc;
    if ((rc = kcd_s3_config_check(&cfg->s3, err)) != KC_OK)
        return rc;
    if (cfg->redis_listen && *cfg->redis_listen) {
        char rhost[256];
        unsigned rport;
        if ((rc = kcd_parse_listen(cfg->redis_listen, rhost, sizeof rhost, &rport, err)) != KC_OK)
            return kc_err_prefix(err, "--redis-listen"), rc;
        if ((rc = refuse_open_listener(cfg, "--redis-listen", cfg->redis_listen, rhost, err)) !=
            KC_OK)
            return rc;
    }
    if (cfg->tokens) {
        kcd_auth *a = NULL;
        if ((rc = kcd_auth_load(cfg->tokens, cfg->anonymous_read, &a, err)) != KC_OK)
            return rc;
        kcd_auth_free(a);
    }
    return KC_OK;
}

bool kcd_listen_is_loopback(const char *host)
{
    if (!host)
        return false;
    if (!strcasecmp(host, "localhost") || !strcmp(host, "::1"))
        return true;
    struct in_addr a4;
    if (inet_pton(AF_INET, host, &a4) == 1)
        return (ntohl(a4.s_addr) >> 24) == 127;
    struct in6_addr a6;
    if (inet_pton(AF_INET6, host, &a6) == 1)
        return IN6_IS_ADDR_LOOPBACK(&a6) || (IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127);
    return false;
}

/* Appends one formatted line to buf (cap bytes) at *used, truncating. */
static void warn_line(char *buf, size_t cap, size_t *used, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void warn_line(char *buf, size_t cap, size_t *used, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    size_t at = *used < cap ? *used : cap;
    int n = vsnprintf(buf + at, cap - at, fmt, ap);
    va_end(ap);
    *used += n > 0 ? (size_t)n : 0;
}

unsigned kcd_config_warnings(const kcd_config *cfg, char *buf, size_t cap)
{
    unsigned n = 0;
    size_t used = 0;
    if (cap)
        buf[0] = 0;
    if (!cfg->tokens) {
        char host[256] = "";
        unsigned port;
        kcd_parse_listen(cfg->listen, host, sizeof host, &port, NULL);
        warn_line(buf, cap, &used,
                  "authentication is disabled (no --tokens): every client that can reach %s "
                  "may read, write and delete%s\n",
                  cfg->listen,
                  kcd_listen_is_loopback(host) ? ", every local user included"
                                               : " (allowed by --insecure-no-auth)");
        n++;
    }
    const char *why = NULL;
    if (cfg->tokens && kcd_auth_file_exposed(cfg->tokens, &why)) {
        warn_line(buf, cap, &used, "tokens file %s %s; chmod 600 it\n", cfg->tokens, why);
        n++;
    }
    return n;
}

void kcd_config_print_string(void *fp, const char *name, const char *value)
{
    const char *v = value ? value : "";
    size_t n = strlen(v);
    bool wrap = n > 0 && (isspace((unsigned char)v[0]) || isspace((unsigned char)v[n - 1]) ||
                          v[0] == '"' || v[0] == '\'' || v[n - 1] == '"' || v[n - 1] == '\'');
    fprintf(fp, wrap ? "%s = \"%s\"\n" : "%s = %s\n", name, v);
}

void kcd_config_print(const kcd_config *cfg, void *fp)
{
    FILE *f = fp;
    for (size_t i = 0; i < NOPTS; i++) {
        const opt_def *o = &kcd_opts[i];
        const void *field = (const char *)cfg + o->off;
        if (o->type == OPT_STR) {
            kcd_config_print_string(f, o->name, *(char *const *)field);
            continue;
        }
        fprintf(f, "%s = ", o->name);
        switch (o->type) {
        case OPT_STR:
            break;
        case OPT_SIZE:
            fprintf(f, "%llu\n", (unsigned long long)*(const uint64_t *)field);
            break;
        case OPT_UINT:
            fprintf(f, "%u\n", *(const unsigned *)field);
            break;
        case OPT_BOOL:
            fprintf(f, "%s\n", *(const bool *)field ? "true" : "false");
            break;
        case OPT_LEVEL:
            fprintf(f, "%s\n", kcd_log_level_name((kcd_log_level) * (const int *)field));
            break;
        }
    }
    kcd_s3_config_print(&cfg->s3, f);
}

const char *kcd_config_usage(void)
{
    static char buf[8192];
    if (buf[0])
        return buf;
    size_t n = (size_t)snprintf(
        buf, sizeof buf,
        "usage: kcached [--config FILE] [--check-config] [options]\n"
        "Serves a kcache store over HTTP (docs/DESIGN.md §6).\n\noptions (config file key "
        "without dashes; environment KCACHED_NAME, e.g. KCACHED_MAX_SIZE):\n");
    for (size_t i = 0; i < NOPTS && n < sizeof buf; i++)
        n += (size_t)snprintf(buf + n, sizeof buf - n, "  --%-16s %s\n", kcd_opts[i].name,
                              kcd_opts[i].help);
    if (n < sizeof buf)
        snprintf(buf + n, sizeof buf - n,
                 "  --config FILE      read `key = value` settings (also $KCACHED_CONFIG)\n"
                 "  --check-config     validate the settings, print them, exit\n"
                 "  --help, --version\nPrecedence: flags > environment > config file > "
                 "defaults.\n\n%s(each also as KCACHED_S3_NAME in the environment)\n",
                 kcd_s3_usage());
    return buf;
}
