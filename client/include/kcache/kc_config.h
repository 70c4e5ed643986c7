/*
 * kc_config.h - the client's settings (cache directory, server, credentials, keys,
 * limits), resolved one way for every program on the client library, so the kcache
 * tool and the Python package read the same values: a value the program was given (a
 * command-line option, a function argument) wins over the environment (KCACHE_*),
 * which wins over the configuration file, which wins over the built-in default.
 *
 * The file is $XDG_CONFIG_HOME/kcache/config, else ~/.config/kcache/config: one
 * `key = value` a line, the keys being the tool's long option names without the
 * dashes ("remote", "token-file", "max-size"); '#' starts a comment line, a value
 * may be quoted, a path is absolute or starts with "~/". A line that is not
 * `key = value`, an unknown key or a bad value is an error naming FILE:LINE.
 */
#ifndef KC_CONFIG_H
#define KC_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <kcache/kc_error.h>
#include <kcache/kc_remote.h>

/* Every setting. */
typedef enum kc_setting {
    KC_SET_CACHE_DIR,
    KC_SET_REMOTE,
    KC_SET_TOKEN,
    KC_SET_TOKEN_FILE,
    KC_SET_CA_FILE,
    KC_SET_CLIENT_CERT,
    KC_SET_CLIENT_KEY,
    KC_SET_SIGN_KEY,
    KC_SET_TRUSTED_KEYS,
    KC_SET_MAX_SIZE,
    KC_SET_MAX_ARTIFACT,
    KC_SETTING_COUNT
} kc_setting;

/* What a setting's value is; decides how it is checked. */
typedef enum kc_setting_kind {
    KC_SETTING_PATH,   /* a file or directory; in the file absolute or "~/..." */
    KC_SETTING_URLS,   /* one or more comma-separated http:// or https:// URLs */
    KC_SETTING_SECRET, /* shown as "(hidden)" */
    KC_SETTING_SIZE,   /* bytes: 4096, 512K, 100M, 10G, 1T (kc_parse_size) */
    KC_SETTING_LIMITS, /* a SIZE, or KIND=SIZE items and at most one SIZE for the other
                          kinds (kc_remote_parse_limits) */
} kc_setting_kind;

/* A setting as a person reads about it (help, manual, `kcache config`). */
typedef struct kc_setting_info {
    const char *name;        /* the file key and long option without "--": "max-size" */
    const char *env;         /* its environment variable: "KCACHE_MAX_SIZE" */
    const char *placeholder; /* what the value is: "SIZE" */
    const char *def;         /* the default in words; NULL: none */
    const char *help;        /* one sentence */
    kc_setting_kind kind;
} kc_setting_info;

/* Where the value in effect came from, lowest first. */
typedef enum kc_source {
    KC_SOURCE_NONE = 0, /* no value and no default */
    KC_SOURCE_DEFAULT,
    KC_SOURCE_FILE,
    KC_SOURCE_ENV,
    KC_SOURCE_GIVEN, /* kc_config_give: an option or an argument */
} kc_source;

/* The description of s (static; never NULL for a valid s). */
const kc_setting_info *kc_setting_describe(kc_setting s);

/* The setting called name ("max-size"; "max_size" too), or -1. */
int kc_setting_find(const char *name);

typedef struct kc_config kc_config; /* opaque */

/* An empty configuration: nothing given, nothing read. NULL when out of memory. */
kc_config *kc_config_new(void);

/* Frees c; the token read from a file is wiped first. NULL is fine. */
void kc_config_free(kc_config *c);

/* Gives s the value a program was handed, above every other source. as names
 * it in messages ("--remote", "url="). Both strings are copied. An empty value
 * is ignored (as an empty variable is). KC_ERR_INVALID "AS: ..." for a value
 * that cannot be right (a size that is not one, a URL that is not http(s)). */
kc_code kc_config_give(kc_config *c, kc_setting s, const char *value, const char *as, kc_err *err);

/* Reads the environment and the configuration file (kc_config_path). A
 * missing file is no error. Errors: KC_ERR_INVALID naming "FILE:LINE" or
 * "$VARIABLE" (a line that is not `key = value`, an unknown key with the
 * nearest known one, a bad value), KC_ERR_IO for a configuration file that
 * cannot be read. Call once, after every kc_config_give. A configuration file
 * that holds a token and that other users can read is used, with a warning
 * through kc_log. */
kc_code kc_config_load(kc_config *c, kc_err *err);

/* After kc_config_load, for a program about to talk to a server: settles the
 * bearer token (kc_config_token), reading the token file when a token-file
 * is the credential in effect. Errors name the setting's source: KC_ERR_IO
 * for a file that cannot be read, KC_ERR_INVALID for an empty one. A token
 * file other users can read is used, with a warning through kc_log. */
kc_code kc_config_read_token(kc_config *c, kc_err *err);

/* The configuration file's path: $XDG_CONFIG_HOME/kcache/config, else
 * $HOME/.config/kcache/config; malloc'd (the caller frees), NULL without
 * either variable. */
char *kc_config_path(void);

/* After kc_config_load: the file that was looked for (NULL: none could be
 * named) and whether it existed. Owned by c. */
const char *kc_config_file(const kc_config *c, bool *found);

/* The value of s in effect, NULL when none (owned by c). For sizes, the text
 * as given; kc_config_size has the number. */
const char *kc_config_get(const kc_config *c, kc_setting s);

/* Where that value came from, and the source in words for messages:
 * "--remote", "$KCACHE_REMOTE", "/home/u/.config/kcache/config:3", "default"
 * (NULL with KC_SOURCE_NONE). where may be NULL. */
kc_source kc_config_origin(const kc_config *c, kc_setting s, const char **where);

/* The number of bytes a size setting stands for (of a limits setting, its
 * SIZE for every kind); 0 when unset. */
uint64_t kc_config_size(const kc_config *c, kc_setting s);

/* False for a value that is set but not used: of token and token-file, the
 * one from the higher source is the credential (within one source, token
 * wins). True for everything else, and for what has no value. */
bool kc_config_used(const kc_config *c, kc_setting s);

/* The bearer token in effect (token, or the first line of token-file, blanks
 * trimmed) once kc_config_read_token has run, NULL when none; *where (may be
 * NULL) names its source as kc_config_origin does, with the file a token-file
 * names ("--token-file /etc/t", "$KCACHE_TOKEN_FILE (/etc/t)"). Owned by c. */
const char *kc_config_token(const kc_config *c, const char **where);

/* Sets the fields of *o that are settings: token (and token_source, as
 * kc_config_token's where), ca_file, client_cert, client_key, max_artifact
 * and kind_limits. Leaves the rest of *o
 * alone; the strings borrow from c. */
void kc_config_remote_opts(const kc_config *c, kc_remote_opts *o);

#endif
