/*
 * kcd_s3_config.h - the settings of kcached's S3 backing tier (kcd_s3.h) and
 * the checks only S3 needs: credentials, bucket and prefix names, endpoint
 * form. The s3-* options themselves are rows of kcached's one option table
 * (kcd_config.c), read from the same sources as every other option.
 */
#ifndef KCD_S3_CONFIG_H
#define KCD_S3_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include <kcache/kc_error.h>

/* Settings of the tier. Every string is owned by the struct (malloc'd; free
 * with kcd_s3_config_free). kcached's options (kcd_config.c, `kcached
 * --help`) set them:
 *
 *   s3-endpoint URL          http(s)://host[:port] of the S3 service (required;
 *                            its presence turns the tier on)
 *   s3-bucket NAME           bucket (required)
 *   s3-region NAME           signing region (default us-east-1)
 *   s3-prefix PATH           object key prefix (default "kcache/v1/")
 *   s3-credentials FILE      AWS shared-credentials style file; without it the
 *                            keys come from AWS_ACCESS_KEY_ID /
 *                            AWS_SECRET_ACCESS_KEY (/ AWS_SESSION_TOKEN)
 *   s3-profile NAME          section of the credentials file (default
 *                            $AWS_PROFILE, else "default")
 *   s3-virtual-host BOOL     bucket.host/key URLs instead of host/bucket/key
 *   s3-write-through BOOL    PUT waits for the bucket instead of queueing
 *   s3-queue N               queued uploads at most (default 1024)
 *   s3-queue-bytes SIZE      queued upload bytes at most (default 256M)
 *   s3-workers N             background upload threads (default 2)
 *   s3-connect-timeout MS    connect timeout (default 2000)
 *   s3-timeout MS            whole-request timeout (default 30000)
 *   s3-ca-file FILE          extra CA bundle for an https endpoint
 *   s3-refresh-interval DUR  re-write an artifact served (read through or
 *                            from the local store) whose bucket copy is this
 *                            old or gone, at most once per interval per key
 *                            (default 1d; N[s|m|h|d]; 0 = off)
 */
typedef struct kcd_s3_config {
    char *endpoint;
    char *bucket;
    char *region;
    char *prefix;
    char *credentials_file;
    char *profile;
    char *access_key;    /* resolved by kcd_s3_config_finish */
    char *secret_key;    /* resolved by kcd_s3_config_finish; never printed */
    char *session_token; /* optional */
    char *ca_file;
    bool virtual_host;
    bool write_through;
    unsigned queue_max;
    uint64_t queue_max_bytes;
    unsigned workers;
    long connect_timeout_ms;
    long timeout_ms;
    uint64_t max_object;         /* largest object accepted on read; 0 = 4 GiB + header */
    uint64_t refresh_interval_s; /* refresh-on-read age in seconds; 0 = off */
} kcd_s3_config;

/* Fills c with defaults (tier off: endpoint NULL). */
void kcd_s3_config_defaults(kcd_s3_config *c);

/* True once an endpoint was configured. */
bool kcd_s3_config_enabled(const kcd_s3_config *c);

/* Resolves credentials (the credentials file if one is named, else the
 * environment) and checks the settings: bucket name, endpoint scheme, prefix
 * characters. KC_ERR_INVALID / KC_ERR_AUTH / KC_ERR_IO name what is wrong.
 * Does no network traffic. Call before kcd_s3_open. */
kc_code kcd_s3_config_finish(kcd_s3_config *c, kc_err *err);

/* Runs kcd_s3_config_finish on a copy: for --check-config and validation
 * of a const configuration. KC_OK when the tier is off. */
kc_code kcd_s3_config_check(const kcd_s3_config *c, kc_err *err);

/* Deep copy of src into dst (dst's old contents are not freed); a NULL
 * region or prefix becomes its default. false when out of memory (dst is
 * then still safe to pass to kcd_s3_config_free). */
bool kcd_s3_config_copy(kcd_s3_config *dst, const kcd_s3_config *src);

/* Where the keys come from when no s3-credentials file is named, for
 * --check-config ("from the environment (AWS_ACCESS_KEY_ID)", ...): a
 * static string. Secrets are never part of it. */
const char *kcd_s3_config_credentials_source(const kcd_s3_config *c);

void kcd_s3_config_free(kcd_s3_config *c);

#endif
