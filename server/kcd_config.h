/*
 * kcd_config.h - kcached's settings: built-in defaults, then a config file
 * (--config FILE or $KCACHED_CONFIG, `key = value` lines using the flag
 * names without dashes), then KCACHED_* environment variables (KCACHED_MAX_SIZE
 * for --max-size), then command-line flags. Later sources win.
 */
#ifndef KCD_CONFIG_H
#define KCD_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <kcache/kc_error.h>
#include "kcd_s3_config.h"

/* Built-in TLS: TLS 1.2 and 1.3 only, GnuTLS's NORMAL cipher choice. */
#define KCD_TLS_PRIORITIES_DEFAULT "NORMAL:-VERS-ALL:+VERS-TLS1.3:+VERS-TLS1.2"

/* How a large body (a pack range, a memory-cache memfd) is sent. */
typedef enum {
    KCD_SEND_AUTO,     /* copied from a mapping to loopback peers, sendfile(2) to others */
    KCD_SEND_SENDFILE, /* always sendfile(2): no copy in kcached */
    KCD_SEND_COPY,     /* always copied from a mapping (peers behind veth on this host) */
} kcd_send_mode;

typedef struct kcd_config {
    char *listen;               /* "HOST:PORT" (IPv6 as "[::1]:PORT"); port 0 = any free port */
    char *data;                 /* store directory */
    uint64_t max_size;          /* store size limit (LRU eviction); 0 = unlimited */
    uint64_t max_blob;          /* largest accepted request body, and bundle record payload */
    uint64_t upload_memory;     /* request-body bytes buffered across all uploads (503 beyond) */
    uint64_t memory_cache;      /* bytes of hot responses kept in memory; 0 = off */
    bool durable;               /* fsync each write before answering it */
    char *tokens;               /* tokens file; NULL = authentication disabled */
    bool anonymous_read;        /* reads without a token when tokens are configured */
    bool insecure_no_auth;      /* allow a non-loopback --listen without --tokens */
    bool insecure_short_tokens; /* tokens under KCD_TOKEN_MIN allowed, with a warning */
    char *tls_cert;             /* PEM certificate (chain) file; with tls_key enables HTTPS */
    char *tls_priorities;       /* GnuTLS priority string (default: TLS 1.2 and 1.3 only) */
    char *trusted_keys; /* PEM Ed25519 public keys: uploads must be signed by one (kc_sign.h) */
    unsigned compact_interval; /* seconds between pack-file upkeep runs; 0 = never */
    char *tls_client_ca;       /* PEM CA(s): require client certificates they signed (mTLS) */
    char *tls_key;             /* PEM private key file */
    unsigned threads;          /* MHD worker threads; 0 = one per online CPU */
    unsigned timeout;          /* idle connection timeout, seconds */
    unsigned max_connections;
    unsigned per_ip_connections; /* concurrent connections from one client address */
    unsigned header_timeout;     /* seconds a connection may take to send its request head */
    unsigned grace;              /* seconds to let in-flight requests finish on SIGTERM */
    int send_mode;               /* kcd_send_mode: how large bodies are sent */
    int log_level;               /* kcd_log_level */
    char *port_file;             /* written with the bound port once listening */
    char *redis_listen;          /* "HOST:PORT" of the Redis listener (kcd_redis.h); NULL = off */
    char *redis_port_file;       /* written with the bound Redis port */
    unsigned redis_timeout;      /* seconds a Redis client may stay idle; 0 = never */
    /* the Redis listener's other doors (issues 25.11, 27.11; kcd_redis.c) */
    char *redis_unix;              /* Unix socket path for the Redis protocol; NULL = none */
    char *redis_unix_mode;         /* its permission bits, octal ("0700" when NULL) */
    bool redis_insecure_plaintext; /* allow a non-loopback --redis-listen beside HTTPS */
    char *config;                  /* the config file that was read, if any */
    bool check_config;             /* validate, print the effective settings, exit */
    kcd_s3_config s3;              /* optional S3 backing tier (s3-* options, kcd_s3_config.h) */
} kcd_config;

/* What main should do after kcd_config_load. */
typedef enum kcd_config_action {
    KCD_RUN = 0,
    KCD_HELP,
    KCD_VERSION,
    KCD_CHECK,
} kcd_config_action;

/* Fills cfg with defaults (listen 127.0.0.1:7070, data ./kcached-data,
 * max-blob 1G, timeout 60, ...). Free with kcd_config_free. */
void kcd_config_defaults(kcd_config *cfg);

/* Sets one option by flag name without dashes ("max-size", "s3-bucket"; '_'
 * is accepted for '-'). source names where the value came from, for error messages.
 * KC_ERR_INVALID names the option, value and source; a refused value leaves
 * cfg unchanged. */
kc_code kcd_config_set(kcd_config *cfg, const char *name, const char *value, const char *source,
                       kc_err *err);

/* Reads `key = value` lines ('#' comments, blank lines ignored). */
kc_code kcd_config_load_file(kcd_config *cfg, const char *path, kc_err *err);

/* Defaults, config file, environment (envp style list, usually `environ`),
 * then argv. Sets *action. Usage errors are KC_ERR_INVALID. */
kc_code kcd_config_load(kcd_config *cfg, int argc, char **argv, char **envp,
                        kcd_config_action *action, kc_err *err);

/* Checks consistency: data set, listen parses, TLS files readable in pairs,
 * tokens file loads, no anonymous server on a non-loopback address unless
 * insecure_no_auth. Does not open the store. */
kc_code kcd_config_validate(const kcd_config *cfg, kc_err *err);

/* --check-config: can kcached create and write the --data directory? A
 * directory is made and removed again inside it (or inside the nearest
 * existing parent when it does not exist yet), so a read-only mount counts
 * whoever runs it. The error names the directory and why. */
kc_code kcd_config_check_data(const kcd_config *cfg, kc_err *err);

/* Warnings about a valid configuration (authentication off, a tokens file
 * others can read, kcd_auth_warnings' duplicate and short tokens), one per line, each ending in
 * '\n', written into buf (cap bytes, always NUL-terminated). Returns how many. */
unsigned kcd_config_warnings(const kcd_config *cfg, char *buf, size_t cap);

/* The kcd_auth_load flags (KCD_AUTH_*) cfg asks for: --anonymous-read,
 * --insecure-short-tokens. */
unsigned kcd_config_auth_flags(const kcd_config *cfg);

/* True when the --listen host is a loopback address (127.0.0.0/8, ::1,
 * localhost). "" (any address) is not. */
bool kcd_listen_is_loopback(const char *host);

/* The permission bits --redis-unix-mode gives (octal text; NULL: 0700), or
 * -1 when text is not octal bits within 0777. */
int kcd_config_unix_mode(const char *text);

/* Parses "HOST:PORT" / "[V6]:PORT" into host (cap bytes) and *port. A
 * bare "PORT" or ":PORT" is refused (KC_ERR_INVALID, "want HOST:PORT"): it
 * used to bind every interface, rarely what was meant. */
kc_code kcd_parse_listen(const char *text, char *host, unsigned cap, unsigned *port, kc_err *err);

/* Prints the effective configuration as `key = value` lines (the format
 * --config reads) to f (a FILE *). */
void kcd_config_print(const kcd_config *cfg, void *f);

/* Prints one `name = value` line to f (a FILE *) so that the config reader
 * gives value back: a value with leading or trailing blanks or quotes is
 * wrapped in double quotes (the reader strips one matching pair). NULL
 * prints as empty. */
void kcd_config_print_string(void *f, const char *name, const char *value);

/* The --help text. */
const char *kcd_config_usage(void);

void kcd_config_free(kcd_config *cfg);

#endif
