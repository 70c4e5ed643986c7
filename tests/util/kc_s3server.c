/*
 * kc_s3server.c - runs s3rver (node) as a child process for the S3-tier
 * tests: ephemeral port read from its readiness line, killed on demand to
 * simulate a vanished bucket.
 */
#include "kc_s3server.h"

#include <curl/curl.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kc_testutil.h"

const char *kc_s3server_bin(void)
{
    static char path[1024];
    snprintf(path, sizeof path, "%s/tests/s3/node_modules/s3rver/bin/s3rver.js",
             KC_TEST_SOURCE_DIR);
    return access(path, R_OK) == 0 ? path : NULL;
}

/* Runs argv with output to DIR/server.log and waits for a line containing
 * "listening on 127.0.0.1:PORT". */
static int start_cmd(kc_s3server *srv, char *const argv[])
{
    srv->log = kc_test_path(srv->dir, "server.log");
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        int fd = open(srv->log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int in = open("/dev/null", O_RDONLY);
        if (fd < 0 || in < 0)
            _exit(127);
        dup2(in, 0);
        dup2(fd, 1);
        dup2(fd, 2);
        execvp(argv[0], argv);
        _exit(127);
    }
    srv->pid = pid;
    for (int i = 0; i < 3000; i++) {
        char *text = kc_test_read_file(srv->log, NULL);
        const char *at = text ? strstr(text, "listening on 127.0.0.1:") : NULL;
        if (at && strchr(at, '\n')) {
            srv->port = atoi(at + strlen("listening on 127.0.0.1:"));
            free(text);
            snprintf(srv->endpoint, sizeof srv->endpoint, "http://127.0.0.1:%d", srv->port);
            return srv->port > 0 ? 0 : -1;
        }
        free(text);
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) {
            srv->pid = 0;
            text = kc_test_read_file(srv->log, NULL);
            fprintf(stderr, "kc_s3server: %s exited early:\n%s\n", argv[1], text ? text : "");
            free(text);
            return -1;
        }
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    fprintf(stderr, "kc_s3server: %s did not report its port within 30 s\n", argv[1]);
    kc_s3server_kill(srv);
    return -1;
}

int kc_s3server_start(kc_s3server *srv, const char *bucket)
{
    memset(srv, 0, sizeof *srv);
    const char *bin = kc_s3server_bin();
    if (!bin) {
        fprintf(stderr, "kc_s3server: s3rver missing: run tests/s3/install.sh\n");
        return -1;
    }
    srv->dir = kc_test_mkdtemp("s3rver");
    if (!srv->dir)
        return -1;
    char *data = kc_test_path(srv->dir, "data");
    char *argv[] = {"node",         (char *)bin, "--silent", "-d", data,
                    "-a",           "127.0.0.1", "-p",       "0",  "--configure-bucket",
                    (char *)bucket, NULL};
    int rc = start_cmd(srv, argv);
    free(data);
    return rc;
}

int kc_s3server_start_sigv4(kc_s3server *srv, const char *access_key, const char *secret_key,
                            const char *region)
{
    memset(srv, 0, sizeof *srv);
    srv->dir = kc_test_mkdtemp("sigv4");
    if (!srv->dir)
        return -1;
    char script[1024];
    snprintf(script, sizeof script, "%s/tests/s3/sigv4_verify.py", KC_TEST_SOURCE_DIR);
    char *argv[] = {"python3",          script,         (char *)access_key,
                    (char *)secret_key, (char *)region, NULL};
    return start_cmd(srv, argv);
}

void kc_s3server_kill(kc_s3server *srv)
{
    if (srv->pid > 0) {
        kill(srv->pid, SIGKILL);
        waitpid(srv->pid, NULL, 0);
        srv->pid = 0;
    }
}

long kc_s3server_object(const char *url, const char *method, uint8_t **body, size_t *len,
                        long long *mtime)
{
    CURL *h = curl_easy_init();
    struct curl_slist *hdrs =
        curl_slist_append(NULL, "x-amz-content-sha256: "
                                "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    kc_test_buf b = {0};
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
    if (strcmp(method, "HEAD") == 0)
        curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
    else if (strcmp(method, "GET") != 0)
        curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(h, CURLOPT_FILETIME, 1L);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, kc_test_buf_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(h, CURLOPT_AWS_SIGV4, "aws:amz:us-east-1:s3");
    curl_easy_setopt(h, CURLOPT_USERPWD, KC_S3SERVER_KEY ":" KC_S3SERVER_SECRET);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, 10L);
    long status = 0;
    curl_off_t ft = -1;
    if (curl_easy_perform(h) == CURLE_OK) {
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
        curl_easy_getinfo(h, CURLINFO_FILETIME_T, &ft);
    }
    curl_slist_free_all(hdrs);
    curl_easy_cleanup(h);
    if (mtime)
        *mtime = status >= 200 && status < 300 ? (long long)ft : -1;
    if (body) {
        *body = b.p;
        *len = b.len;
    } else {
        free(b.p);
    }
    return status;
}

void kc_s3server_stop(kc_s3server *srv)
{
    kc_s3server_kill(srv);
    if (srv->dir)
        kc_test_rmtree(srv->dir);
    free(srv->dir);
    free(srv->log);
    srv->dir = srv->log = NULL;
}
