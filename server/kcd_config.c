/*
 * kcd_config.c - merges kcached's settings from defaults, a config file, the
 * environment and the command line, in that order of increasing precedence.
 * One option table drives all four sources so they cannot drift apart; the
 * S3 tier's --s3-* options are rows of it too (their S3 checks are in
 * kcd_s3_config.c).
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
#include <sys/stat.h>
#include <unistd.h>

#include <kcache/kc_sign.h>
#include <kcache/kc_util.h>
#include "kcd_auth.h"
#include "kcd_log.h"

/* How a value is read and printed. */
typedef enum {
    OPT_STR,      /* char *: "" unsets it (unless OPT_F_NONEMPTY) */
    OPT_SIZE,     /* uint64_t bytes: "64M" (kc_parse_size) */
    OPT_UINT,     /* unsigned, in min..max (default 0..1000000) */
    OPT_MS,       /* long milliseconds, in min..max */
    OPT_DURATION, /* uint64_t seconds: N, Ns, Nm, Nh or Nd, at most 10 years */
    OPT_BOOL,     /* bool: true/false/yes/no/on/off/1/0; no value = true */
    OPT_LEVEL,    /* int kcd_log_level */
    OPT_CHOICE,   /* int: the index of the value in the row's choices */
} opt_type;

enum {
    OPT_F_S3 = 1,       /* the S3 tier's: own --help section, printed only when it is on */
    OPT_F_NONEMPTY = 2, /* an empty value is refused; left out of --check-config when unset */
};

typedef struct opt_def {
    const char *name;
    opt_type type;
    size_t off;
    const char *help; /* a '\n' continues it on the next line of --help */
    const char *arg;  /* the value's name in --help ("URL"); NULL for a boolean */
    unsigned flags;   /* OPT_F_* */
    uint64_t min, max;
    /* --check-config: what is used instead when the option is unset, printed
     * as a `# NAME: NOTE` comment */
    const char *(*unset_note)(const kcd_config *cfg);
    const char *const *choices; /* OPT_CHOICE: the values, NULL-terminated */
    /* --help's "(default ...)" when the built-in value says it badly (a
     * long string); NULL: the built-in value, as --check-config prints it.
     * S3 rows say their defaults in their help text. */
    const char *shown_default;
} opt_def;

static const char *const send_modes[] = {"auto", "sendfile", "copy", NULL};

static const char *s3_credentials_note(const kcd_config *cfg)
{
    return kcd_s3_config_credentials_source(&cfg->s3);
}

#define OFF(f) offsetof(kcd_config, f)
/* An option of kcached itself, its value named a in --help; the S3 tier's
 * rows name every field. */
#define OPT(n, t, f, a, h)                                                                         \
    {                                                                                              \
        .name = n, .type = t, .off = OFF(f), .arg = a, .help = h                                   \
    }
#define S3(f) OFF(s3.f)
#define S3OPT(n, t, f, a, fl, h)                                                                   \
    {                                                                                              \
        .name = n, .type = t, .off = S3(f), .arg = a, .flags = OPT_F_S3 | (fl), .help = h          \
    }
#define S3NUM(n, t, f, a, lo, hi, h)                                                               \
    {                                                                                              \
        .name = n, .type = t, .off = S3(f), .arg = a, .flags = OPT_F_S3, .min = lo, .max = hi,     \
        .help = h                                                                                  \
    }
static const opt_def kcd_opts[] = {
    OPT("listen", OPT_STR, listen, "HOST:PORT",
        "address to listen on (port 0 = any free port; a bare\n"
        "port is refused: 127.0.0.1:PORT or 0.0.0.0:PORT)"),
    OPT("data", OPT_STR, data, "DIR", "store directory"),
    OPT("max-size", OPT_SIZE, max_size, "SIZE", "store size limit, LRU eviction (0 = unlimited)"),
    OPT("max-blob", OPT_SIZE, max_blob, "SIZE",
        "largest accepted upload and bundle artifact (413 above)"),
    OPT("upload-memory", OPT_SIZE, upload_memory, "SIZE",
        "request-body bytes buffered by all uploads at once\n(503 above)"),
    OPT("memory-cache", OPT_SIZE, memory_cache, "SIZE", "memory for hot artifacts (0 = off)"),
    OPT("durable", OPT_BOOL, durable, NULL,
        "fsync each write (HTTP and Redis) before answering it:\n"
        "it survives a power loss (off: it survives a crash\n"
        "of kcached, and reaches the disk within ~1 s)"),
    OPT("tokens", OPT_STR, tokens, "FILE",
        "tokens file: `TOKEN SCOPES [NAME]` per line (SIGHUP\nreloads it; unset = no "
        "authentication)"),
    OPT("anonymous-read", OPT_BOOL, anonymous_read, NULL, "allow reads without a token"),
    OPT("insecure-no-auth", OPT_BOOL, insecure_no_auth, NULL,
        "allow a non-loopback --listen without --tokens"),
    OPT("insecure-short-tokens", OPT_BOOL, insecure_short_tokens, NULL,
        "accept tokens under 16 characters, with a warning\n"
        "(for a migration from a weaker password)"),
    OPT("tls-cert", OPT_STR, tls_cert, "FILE",
        "PEM certificate: serve HTTPS (SIGHUP reloads it and\n--tls-key)"),
    OPT("tls-key", OPT_STR, tls_key, "FILE", "PEM private key for --tls-cert"),
    {.name = "tls-priorities",
     .type = OPT_STR,
     .off = OFF(tls_priorities),
     .arg = "STRING",
     .shown_default = "TLS 1.2 and 1.3 only",
     .help = "GnuTLS priority string"},
    OPT("tls-client-ca", OPT_STR, tls_client_ca, "FILE",
        "PEM CA: require a client certificate it signed\n"
        "(mTLS; `cert:SUBJECT` lines in --tokens)"),
    OPT("trusted-keys", OPT_STR, trusted_keys, "FILE",
        "PEM Ed25519 public keys: refuse uploads not signed\nby one (422)"),
    OPT("threads", OPT_UINT, threads, "N", "worker threads (0 = one per CPU)"),
    OPT("timeout", OPT_UINT, timeout, "SECONDS", "idle connection timeout"),
    OPT("max-connections", OPT_UINT, max_connections, "N", "concurrent connection limit"),
    OPT("per-ip-connections", OPT_UINT, per_ip_connections, "N",
        "concurrent connections from one client address"),
    OPT("header-timeout", OPT_UINT, header_timeout, "SECONDS",
        "how long a new connection may stay idle before its\nrequest head is in"),
    OPT("grace", OPT_UINT, grace, "SECONDS", "how long in-flight requests get on SIGTERM"),
    {.name = "send-mode",
     .type = OPT_CHOICE,
     .off = OFF(send_mode),
     .arg = "MODE",
     .choices = send_modes,
     .help = "large bodies: sendfile, copy (from a mapping) or auto\n"
             "(copy to loopback peers, sendfile to others)"},
    OPT("compact-interval", OPT_UINT, compact_interval, "SECONDS",
        "time between compactions of mostly-dead pack files\n(0 = never)"),
    OPT("log-level", OPT_LEVEL, log_level, "LEVEL", "error, warn, info (access log) or debug"),
    OPT("port-file", OPT_STR, port_file, "FILE", "write the bound port to FILE once listening"),
    OPT("redis-listen", OPT_STR, redis_listen, "HOST:PORT",
        "address for the Redis protocol (RESP2/3; off when unset)"),
    OPT("redis-port-file", OPT_STR, redis_port_file, "FILE",
        "write the bound Redis port to FILE (before --port-file)"),
    OPT("redis-timeout", OPT_UINT, redis_timeout, "SECONDS",
        "how long a Redis client may send nothing before it\nis closed (0 = never)"),
    /* the Redis listener's other doors (issues 25.11, 27.11) */
    OPT("redis-unix", OPT_STR, redis_unix, "PATH",
        "also speak the Redis protocol on this Unix socket\n(redis-cli -s, redis+unix://)"),
    OPT("redis-unix-mode", OPT_STR, redis_unix_mode, "MODE",
        "permission bits of --redis-unix, octal\n(0700: its owner only)"),
    OPT("redis-insecure-plaintext", OPT_BOOL, redis_insecure_plaintext, NULL,
        "allow a non-loopback --redis-listen (plain text)\nwhile HTTP uses TLS"),
    /* the S3 backing tier (kcd_s3.h), in --help order */
    S3OPT("s3-endpoint", OPT_STR, endpoint, "URL", OPT_F_NONEMPTY,
          "http(s)://host[:port] of the S3 service"),
    S3OPT("s3-bucket", OPT_STR, bucket, "NAME", OPT_F_NONEMPTY,
          "bucket shared by every kcached instance"),
    S3OPT("s3-region", OPT_STR, region, "NAME", OPT_F_NONEMPTY,
          "SigV4 signing region (default us-east-1)"),
    S3OPT("s3-prefix", OPT_STR, prefix, "PATH", 0, "object key prefix (default kcache/v1/)"),
    {.name = "s3-credentials",
     .type = OPT_STR,
     .off = S3(credentials_file),
     .arg = "FILE",
     .flags = OPT_F_S3 | OPT_F_NONEMPTY,
     .unset_note = s3_credentials_note,
     .help = "AWS credentials file (default: AWS_ACCESS_KEY_ID,\n"
             "AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN from the environment)"},
    S3OPT("s3-profile", OPT_STR, profile, "NAME", OPT_F_NONEMPTY,
          "profile in the credentials file (default $AWS_PROFILE or default)"),
    S3OPT("s3-virtual-host", OPT_BOOL, virtual_host, NULL, 0,
          "bucket.host/key URLs instead of host/bucket/key"),
    S3OPT("s3-write-through", OPT_BOOL, write_through, NULL, 0,
          "a write (PUT, Redis SET) waits for the bucket instead of queueing the upload"),
    S3NUM("s3-queue", OPT_UINT, queue_max, "N", 1, 1000000,
          "queued uploads at most (default 1024)"),
    S3OPT("s3-queue-bytes", OPT_SIZE, queue_max_bytes, "SIZE", 0,
          "queued upload bytes at most (default 256M)"),
    S3NUM("s3-workers", OPT_UINT, workers, "N", 1, 64, "upload threads (default 2)"),
    S3NUM("s3-connect-timeout", OPT_MS, connect_timeout_ms, "MS", 1, 600000,
          "connect timeout (default 2000)"),
    S3NUM("s3-timeout", OPT_MS, timeout_ms, "MS", 1, 3600000,
          "whole-request timeout (default 30000)"),
    S3OPT("s3-ca-file", OPT_STR, ca_file, "FILE", OPT_F_NONEMPTY,
          "extra CA bundle for an https endpoint"),
    S3OPT("s3-refresh-interval", OPT_DURATION, refresh_interval_s, "D", 0,
          "re-write an artifact served (read through or from the\n"
          "local store) whose bucket copy is D old or gone, at most\n"
          "once per D, so a lifecycle rule keeps hot objects\n"
          "(default 1d; 0 = off)"),
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
    free(cfg->redis_unix);
    free(cfg->redis_unix_mode);
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

/* A decimal number in min..max (max 0: 0..1000000), no sign; -1 if not. */
static int parse_number(const char *v, const opt_def *o, uint64_t *out)
{
    uint64_t max = o->max ? o->max : 1000000;
    char *end;
    errno = 0;
    unsigned long long n = v && *v ? strtoull(v, &end, 10) : 0;
    if (!v || !*v || *end || errno || v[0] == '-' || n < o->min || n > max)
        return -1;
    *out = n;
    return 0;
}

/* "90", "90s", "15m", "12h", "1d" -> seconds, at most 10 years; -1 if not. */
static int parse_duration(const char *v, uint64_t *out)
{
    static const struct {
        char suffix;
        uint64_t mult;
    } units[] = {{'s', 1}, {'m', 60}, {'h', 3600}, {'d', 86400}};
    const uint64_t limit = 3650ull * 86400;
    if (!v || !*v || strlen(v) > 24)
        return -1;
    char num[32];
    snprintf(num, sizeof num, "%s", v);
    size_t n = strlen(num);
    uint64_t mult = 1;
    for (size_t i = 0; n > 1 && i < sizeof units / sizeof units[0]; i++)
        if (tolower((unsigned char)num[n - 1]) == units[i].suffix) {
            mult = units[i].mult;
            num[n - 1] = 0;
            break;
        }
    char *end;
    errno = 0;
    unsigned long long x = strtoull(num, &end, 10);
    if (*end || errno || num[0] == '-' || !isdigit((unsigned char)num[0]) || x > limit / mult)
        return -1;
    *out = x * mult;
    return 0;
}

kc_code kcd_config_set(kcd_config *cfg, const char *name, const char *value, const char *source,
                       kc_err *err)
{
    const opt_def *o = opt_find(name);
    if (!o)
        return kc_err_set(err, KC_ERR_INVALID, "%s: unknown option '%s'", source, name);
    void *field = (char *)cfg + o->off;
    const char *v = value ? value : "";
    uint64_t num;
    switch (o->type) {
    case OPT_STR: {
        char **s = field;
        if (!value || (!*value && (o->flags & OPT_F_NONEMPTY)))
            return kc_err_set(err, KC_ERR_INVALID, "%s: option '%s' needs a value", source,
                              o->name);
        char *dup = *value ? strdup(value) : NULL;
        if (*value && !dup)
            return kc_err_set(err, KC_ERR_NOMEM, "%s: out of memory", source);
        free(*s);
        *s = dup;
        return KC_OK;
    }
    case OPT_SIZE: {
        kc_err e;
        if (!value || kc_parse_size(value, &num, &e) != KC_OK)
            return kc_err_set(err, KC_ERR_INVALID, "%s: option '%s': bad size '%s'", source,
                              o->name, v);
        *(uint64_t *)field = num;
        return KC_OK;
    }
    case OPT_UINT:
    case OPT_MS:
        if (parse_number(value, o, &num) != 0) {
            if (!o->max)
                return kc_err_set(err, KC_ERR_INVALID, "%s: option '%s': bad number '%s'", source,
                                  o->name, v);
            return kc_err_set(err, KC_ERR_INVALID,
                              "%s: option '%s': bad number '%s' (want %llu..%llu)", source, o->name,
                              v, (unsigned long long)o->min, (unsigned long long)o->max);
        }
        if (o->type == OPT_MS)
            *(long *)field = (long)num;
        else
            *(unsigned *)field = (unsigned)num;
        return KC_OK;
    case OPT_DURATION:
        if (parse_duration(value, &num) != 0)
            return kc_err_set(err, KC_ERR_INVALID,
                              "%s: option '%s': bad duration '%s' (N, Ns, Nm, Nh or Nd, at most "
                              "3650d)",
                              source, o->name, v);
        *(uint64_t *)field = num;
        return KC_OK;
    case OPT_BOOL: {
        int b = parse_bool(value);
        if (b < 0)
            return kc_err_set(err, KC_ERR_INVALID, "%s: option '%s': bad boolean '%s'", source,
                              o->name, v);
        *(bool *)field = b;
        return KC_OK;
    }
    case OPT_CHOICE: {
        char want[128];
        size_t n = 0;
        for (int i = 0; o->choices[i]; i++) {
            if (strcmp(v, o->choices[i]) == 0) {
                *(int *)field = i;
                return KC_OK;
            }
            n += (size_t)snprintf(want + n, n < sizeof want ? sizeof want - n : 0, "%s%s",
                                  i ? ", " : "", o->choices[i]);
        }
        return kc_err_set(err, KC_ERR_INVALID, "%s: option '%s': bad value '%s' (want %s)", source,
                          o->name, v, want);
    }
    case OPT_LEVEL: {
        int l = kcd_log_level_parse(value);
        if (l < 0)
            return kc_err_set(err, KC_ERR_INVALID,
                              "%s: option '%s': bad level '%s' (error, warn, info, debug)", source,
                              o->name, v);
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
        if (!opt_find(name))
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
        if (!o)
            return kc_err_set(err, KC_ERR_INVALID, "unknown option '%s' (see --help)", a);
        const char *val = eq ? eq + 1 : NULL;
        if (!val && o->type != OPT_BOOL) {
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
    /* a bare port would bind every interface: say which is meant */
    const char *last = strrchr(text, ':');
    if (!last || last == text)
        return kc_err_set(err, KC_ERR_INVALID,
                          "bad --listen address '%s': want HOST:PORT (127.0.0.1:%s for this "
                          "machine only, 0.0.0.0:%s for every interface)",
                          text, last ? last + 1 : text, last ? last + 1 : text);
    if (text[0] == '[') {
        const char *rb = strchr(text, ']');
        if (!rb || rb[1] != ':')
            return kc_err_set(err, KC_ERR_INVALID, "bad --listen address '%s' (want [V6]:PORT)",
                              text);
        h = text + 1;
        hn = (size_t)(rb - h);
        colon = rb + 1;
    } else {
        colon = last;
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

/* The Redis listener's other doors (issues 25.11, 27.11): its socket has no
 * TLS, so beside HTTPS it stays on loopback unless asked; the Unix socket's
 * mode must be octal permission bits. */
static kc_code check_redis_doors(const kcd_config *cfg, const char *rhost, kc_err *err)
{
    if (rhost && cfg->tls_cert && !cfg->redis_insecure_plaintext && !kcd_listen_is_loopback(rhost))
        return kc_err_set(err, KC_ERR_INVALID,
                          "--redis-listen %s is not a loopback address and the Redis protocol "
                          "has no TLS here while HTTP uses it (--tls-cert): tokens and values "
                          "would cross the network in plain text; listen on loopback or "
                          "--redis-unix, or give --redis-insecure-plaintext if that is really "
                          "meant",
                          cfg->redis_listen);
    if (cfg->redis_unix_mode && kcd_config_unix_mode(cfg->redis_unix_mode) < 0)
        return kc_err_set(err, KC_ERR_INVALID,
                          "--redis-unix-mode '%s' is not octal permission bits (0 to 0777, "
                          "e.g. 0700 or 0770)",
                          cfg->redis_unix_mode);
    if (cfg->redis_unix && !*cfg->redis_unix)
        return kc_err_set(err, KC_ERR_INVALID, "--redis-unix needs a path");
    return KC_OK;
}

int kcd_config_unix_mode(const char *text)
{
    if (!text)
        return 0700;
    char *end;
    errno = 0;
    long v = strtol(text, &end, 8);
    if (!*text || *end || errno || v < 0 || v > 0777)
        return -1;
    return (int)v;
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
        if ((rc = check_redis_doors(cfg, rhost, err)) != KC_OK)
            return rc;
    } else if ((rc = check_redis_doors(cfg, NULL, err)) != KC_OK) {
        return rc;
    }
    if (cfg->tokens) {
        kcd_auth *a = NULL;
        if ((rc = kcd_auth_load(cfg->tokens, kcd_config_auth_flags(cfg), &a, err)) != KC_OK)
            return rc;
        kcd_auth_free(a);
    }
    return KC_OK;
}

unsigned kcd_config_auth_flags(const kcd_config *cfg)
{
    return (cfg->anonymous_read ? KCD_AUTH_ANONYMOUS_READ : 0u) |
           (cfg->insecure_short_tokens ? KCD_AUTH_SHORT_TOKENS : 0u);
}

kc_code kcd_config_check_data(const kcd_config *cfg, kc_err *err)
{
    /* the directory itself when it exists, else the nearest parent that
     * does (where kcached would create it) */
    char dir[4096];
    if (snprintf(dir, sizeof dir, "%s", cfg->data) >= (int)sizeof dir)
        return kc_err_set(err, KC_ERR_INVALID, "--data %.64s...: path too long", cfg->data);
    struct stat st;
    bool exists = true;
    while (stat(dir, &st) != 0) {
        if (errno != ENOENT)
            return kc_err_errno(err, KC_ERR_IO, errno, "--data %s: cannot create it: %s", cfg->data,
                                dir);
        exists = false;
        char *slash = strrchr(dir, '/');
        while (slash && slash > dir && slash[1] == 0) { /* "a/b/" */
            *slash = 0;
            slash = strrchr(dir, '/');
        }
        if (!slash)
            snprintf(dir, sizeof dir, ".");
        else
            slash == dir ? (void)(dir[1] = 0) : (void)(*slash = 0);
    }
    if (!S_ISDIR(st.st_mode))
        return kc_err_set(err, KC_ERR_INVALID, "--data %s: %s %s not a directory", cfg->data,
                          exists ? "it" : "cannot create it:", exists ? "is" : dir);
    /* a real write, so a read-only mount or a root-owned 0555 counts */
    char probe[4200];
    snprintf(probe, sizeof probe, "%s/.kcached-check-XXXXXX", dir);
    if (!mkdtemp(probe))
        return kc_err_errno(err, KC_ERR_IO, errno, "--data %s: %s %s", cfg->data,
                            exists ? "cannot write into it:" : "cannot create it in", dir);
    rmdir(probe);
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
    kcd_auth *a = NULL;
    kc_err e = {0};
    if (cfg->tokens && kcd_auth_load(cfg->tokens, kcd_config_auth_flags(cfg), &a, &e) == KC_OK) {
        size_t at = used < cap ? used : cap;
        n += kcd_auth_warnings(a, buf + at, cap - at);
        used = at + strlen(buf + at);
        kcd_auth_free(a);
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
    bool s3_on = kcd_s3_config_enabled(&cfg->s3);
    for (size_t i = 0; i < NOPTS; i++) {
        const opt_def *o = &kcd_opts[i];
        const void *field = (const char *)cfg + o->off;
        if ((o->flags & OPT_F_S3) && !s3_on)
            continue;
        if (o->type == OPT_STR) {
            const char *v = *(char *const *)field;
            if (!v && o->unset_note)
                fprintf(f, "# %s: %s\n", o->name, o->unset_note(cfg));
            if (v || !(o->flags & OPT_F_NONEMPTY)) /* `name = ` would not read back */
                kcd_config_print_string(f, o->name, v);
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
        case OPT_MS:
            fprintf(f, "%ld\n", *(const long *)field);
            break;
        case OPT_DURATION:
            fprintf(f, "%llus\n", (unsigned long long)*(const uint64_t *)field);
            break;
        case OPT_BOOL:
            fprintf(f, "%s\n", *(const bool *)field ? "true" : "false");
            break;
        case OPT_LEVEL:
            fprintf(f, "%s\n", kcd_log_level_name((kcd_log_level) * (const int *)field));
            break;
        case OPT_CHOICE:
            fprintf(f, "%s\n", o->choices[*(const int *)field]);
            break;
        }
    }
}

/* A byte count as --help shows a default: "1G", "128M", "64K" or bytes. */
static void size_text(uint64_t v, char *buf, size_t cap)
{
    static const char units[] = "KMGT";
    int u = -1;
    while (v && v % 1024 == 0 && u < 3) {
        v /= 1024;
        u++;
    }
    snprintf(buf, cap, u < 0 ? "%llu" : "%llu%c", (unsigned long long)v, u < 0 ? 0 : units[u]);
}

/* o's built-in value as --help shows it, into buf (cap bytes). */
static void default_text(const opt_def *o, const kcd_config *def, char *buf, size_t cap)
{
    const void *field = (const char *)def + o->off;
    if (o->shown_default) {
        snprintf(buf, cap, "%s", o->shown_default);
        return;
    }
    switch (o->type) {
    case OPT_STR:
        snprintf(buf, cap, "%s", *(char *const *)field ? *(char *const *)field : "unset");
        break;
    case OPT_SIZE:
        size_text(*(const uint64_t *)field, buf, cap);
        break;
    case OPT_UINT:
        snprintf(buf, cap, "%u", *(const unsigned *)field);
        break;
    case OPT_MS:
        snprintf(buf, cap, "%ld", *(const long *)field);
        break;
    case OPT_DURATION:
        snprintf(buf, cap, "%llus", (unsigned long long)*(const uint64_t *)field);
        break;
    case OPT_BOOL:
        snprintf(buf, cap, "%s", *(const bool *)field ? "on" : "off");
        break;
    case OPT_LEVEL:
        snprintf(buf, cap, "%s", kcd_log_level_name((kcd_log_level) * (const int *)field));
        break;
    case OPT_CHOICE:
        snprintf(buf, cap, "%s", o->choices[*(const int *)field]);
        break;
    }
}

/* Appends the --help lines of the options whose OPT_F_S3 flag is s3 to
 * buf (cap bytes) at *n: each with its value's name ("URL"); kcached's own
 * options end with their built-in default (the S3 rows say theirs in their
 * help text). */
static void usage_options(char *buf, size_t cap, size_t *n, bool s3)
{
    const int width = 26; /* help text starts at column width + 5 */
    kcd_config def;
    kcd_config_defaults(&def);
    for (size_t i = 0; i < NOPTS && *n < cap; i++) {
        const opt_def *o = &kcd_opts[i];
        if (!!(o->flags & OPT_F_S3) != s3)
            continue;
        char head[64], dflt[64] = "";
        snprintf(head, sizeof head, "%s%s%s", o->name, o->arg ? " " : "", o->arg ? o->arg : "");
        if (!s3)
            default_text(o, &def, dflt, sizeof dflt);
        *n += (size_t)snprintf(buf + *n, cap - *n, "  --%-*s ", width, head);
        for (const char *h = o->help; *n < cap;) {
            const char *nl = strchr(h, '\n');
            int len = nl ? (int)(nl - h) : (int)strlen(h);
            /* the default ends the last line, or goes below it past 79 columns */
            bool below = width + 5 + len + (int)strlen(dflt) + 11 > 79;
            *n += (size_t)snprintf(
                buf + *n, cap - *n, "%.*s%s%*s%s%s%s\n%*s", len, h,
                !nl && dflt[0] && below ? "\n" : "", !nl && dflt[0] && below ? width + 5 : 0, "",
                !nl && dflt[0] ? (below ? "(default " : " (default ") : "", nl ? "" : dflt,
                !nl && dflt[0] ? ")" : "", nl ? width + 5 : 0, "");
            if (!nl)
                break;
            h = nl + 1;
        }
    }
    kcd_config_free(&def);
}

const char *kcd_config_usage(void)
{
    static char buf[12288];
    if (buf[0])
        return buf;
    size_t n = (size_t)snprintf(
        buf, sizeof buf,
        "usage: kcached [--config FILE] [--check-config] [options]\n"
        "Serves a kcache store over HTTP (docs/DESIGN.md §6).\n\noptions (config file key "
        "without dashes; environment KCACHED_NAME, e.g. KCACHED_MAX_SIZE):\n");
    usage_options(buf, sizeof buf, &n, false);
    if (n < sizeof buf)
        n += (size_t)snprintf(
            buf + n, sizeof buf - n,
            "  --config FILE                read `key = value` settings (also $KCACHED_CONFIG)\n"
            "  --check-config               validate the settings, print the resolved bind\n"
            "                               addresses and the settings, exit\n"
            "  --help, --version\nPrecedence: flags > environment > config file > "
            "defaults.\n\nS3-compatible backing tier (off unless --s3-endpoint is given):\n");
    usage_options(buf, sizeof buf, &n, true);
    if (n < sizeof buf)
        snprintf(buf + n, sizeof buf - n, "(each also as KCACHED_S3_NAME in the environment)\n");
    return buf;
}
