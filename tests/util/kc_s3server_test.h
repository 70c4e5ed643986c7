/*
 * kc_s3server_test.h - the start of every S3-tier Criterion test, kept
 * apart from kc_s3server.h so that the helper library stays free of
 * Criterion: skip the test when tests/s3/install.sh has not run, start
 * s3rver with the bucket, and (for tests whose kcached children read the
 * tier's credentials from the environment) export s3rver's fixed key.
 */
#ifndef KC_S3SERVER_TEST_H
#define KC_S3SERVER_TEST_H

#include <criterion/criterion.h>
#include <stdbool.h>
#include <stdlib.h>

#include "kc_s3server.h"

/* Starts srv with bucket, or skips the calling test when s3rver is not
 * installed; a start that fails fails the test. With export_credentials,
 * sets AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY to s3rver's key. */
static inline void kc_s3server_start_or_skip(kc_s3server *srv, const char *bucket,
                                             bool export_credentials)
{
    if (!kc_s3server_bin())
        cr_skip_test("s3rver not installed: run tests/s3/install.sh");
    cr_assert_eq(kc_s3server_start(srv, bucket), 0, "s3rver did not start");
    if (export_credentials) {
        setenv("AWS_ACCESS_KEY_ID", KC_S3SERVER_KEY, 1);
        setenv("AWS_SECRET_ACCESS_KEY", KC_S3SERVER_SECRET, 1);
    }
}

#endif
