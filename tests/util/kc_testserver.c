/*
 * kc_testserver.c - process management for kcached in integration tests:
 * fork/exec with output to a log file, readiness through the port file the
 * server writes once it accepts connections, SIGTERM/SIGKILL and restart.
 */
#include "kc_testserver.h"

#include <ctype.h>
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kc_testutil.h"

extern char **environ;

#ifndef KC_TEST_KCACHED
#define KC_TEST_KCACHED "kcached"
#endif

static int rm_cb(const char *p, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    remove(p);
    return 0;
}

void kc_testserver_rmtree(const char *path)
{
    if (path && path[0])
        nftw(path, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void pause_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static int spawn(kc_testserver *ts)
{
    unlink(ts->port_file);
    const char *argv[KC_TESTSERVER_MAX_ARGS + 12];
    int n = 0;
    argv[n++] = KC_TEST_KCACHED;
    argv[n++] = "--listen";
    argv[n++] = "127.0.0.1:0";
    argv[n++] = "--data";
    argv[n++] = ts->data;
    argv[n++] = "--port-file";
    argv[n++] = ts->port_file;
    for (int i = 0; i < ts->nargs; i++)
        argv[n++] = ts->args[i];
    argv[n] = NULL;
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        int fd = open(ts->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        /* A developer's KCACHED_* settings must not leak into tests. */
        for (char **e = environ; e && *e;) {
            if (!strncmp(*e, "KCACHED_", 8)) {
                char name[128];
                size_t n = strcspn(*e, "=");
                snprintf(name, sizeof name, "%.*s", (int)n, *e);
                unsetenv(name); /* shifts environ down: re-check this slot */
            } else
                e++;
        }
        int nul = open("/dev/null", O_RDONLY);
        if (nul >= 0)
            dup2(nul, 0);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    ts->pid = pid;
    /* Readiness: the port file is written (atomically) only once the server
     * accepts connections. Poll for it, bailing out if the child exits. */
    double deadline = now_s() + 30;
    while (now_s() < deadline) {
        FILE *f = fopen(ts->port_file, "r");
        if (f) {
            unsigned port = 0;
            int ok = fscanf(f, "%u", &port);
            fclose(f);
            if (ok == 1 && port) {
                ts->port = port;
                snprintf(ts->url, sizeof ts->url, "%s://127.0.0.1:%u", ts->tls ? "https" : "http",
                         port);
                return 0;
            }
        }
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) {
            ts->pid = 0;
            return -1;
        }
        pause_ms(5);
    }
    kc_testserver_kill(ts);
    return -1;
}

int kc_testserver_start(kc_testserver *ts, const char *data_dir, const char *const *args)
{
    memset(ts, 0, sizeof *ts);
    const char *tmp = getenv("TMPDIR");
    snprintf(ts->root, sizeof ts->root, "%s/kcts.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(ts->root))
        return -1;
    if (data_dir)
        snprintf(ts->data, sizeof ts->data, "%s", data_dir);
    else
        snprintf(ts->data, sizeof ts->data, "%s/data", ts->root);
    snprintf(ts->port_file, sizeof ts->port_file, "%s/port", ts->root);
    snprintf(ts->log, sizeof ts->log, "%s/kcached.log", ts->root);
    for (int i = 0; args && args[i] && i < KC_TESTSERVER_MAX_ARGS; i++) {
        ts->args[ts->nargs++] = strdup(args[i]);
        if (!strcmp(args[i], "--tls-cert"))
            ts->tls = true;
    }
    return spawn(ts);
}

int kc_testserver_restart(kc_testserver *ts)
{
    if (ts->pid)
        kc_testserver_stop(ts);
    return spawn(ts);
}

int kc_testserver_stop(kc_testserver *ts)
{
    if (!ts->pid)
        return -1;
    kill(ts->pid, SIGTERM);
    double deadline = now_s() + 20;
    int status = 0;
    while (now_s() < deadline) {
        pid_t r = waitpid(ts->pid, &status, WNOHANG);
        if (r == ts->pid) {
            ts->pid = 0;
            return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        }
        if (r < 0 && errno != EINTR) {
            ts->pid = 0;
            return -1;
        }
        pause_ms(5);
    }
    kc_testserver_kill(ts);
    return -1;
}

void kc_testserver_kill(kc_testserver *ts)
{
    if (!ts->pid)
        return;
    kill(ts->pid, SIGKILL);
    int status;
    while (waitpid(ts->pid, &status, 0) < 0 && errno == EINTR)
        ;
    ts->pid = 0;
}

void kc_testserver_cleanup(kc_testserver *ts)
{
    if (ts->pid)
        kc_testserver_stop(ts);
    for (int i = 0; i < ts->nargs; i++)
        free(ts->args[i]);
    ts->nargs = 0;
    if (ts->root[0])
        kc_testserver_rmtree(ts->root);
    ts->root[0] = 0;
}

char *kc_testserver_url(const kc_testserver *ts, const char *path, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s%s", ts->url, path);
    return buf;
}

char *kc_testserver_read_log(const kc_testserver *ts)
{
    FILE *f = fopen(ts->log, "r");
    if (!f)
        return strdup("");
    char *buf = NULL;
    size_t len = 0, cap = 0;
    char chunk[4096];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) {
        if (len + n + 1 > cap) {
            cap = (len + n + 1) * 2;
            char *b = realloc(buf, cap);
            if (!b)
                break;
            buf = b;
        }
        memcpy(buf + len, chunk, n);
        len += n;
    }
    fclose(f);
    if (!buf)
        return strdup("");
    buf[len] = 0;
    return buf;
}

typedef struct upload {
    const unsigned char *p;
    size_t len, off;
} upload;

static size_t upload_read(char *buf, size_t size, size_t nmemb, void *cls)
{
    upload *u = cls;
    size_t n = size * nmemb;
    if (n > u->len - u->off)
        n = u->len - u->off;
    if (n > 65536)
        n = 65536;
    memcpy(buf, u->p + u->off, n);
    u->off += n;
    return n;
}

int kc_testserver_http(const kc_testserver *ts, const char *method, const char *path,
                       const char *const *headers, const void *body, size_t len, bool chunked,
                       kc_http_result *out)
{
    memset(out, 0, sizeof *out);
    CURL *c = curl_easy_init();
    if (!c)
        return -1;
    char url[8192];
    snprintf(url, sizeof url, "%s%s", ts->url, path);
    kc_test_buf b = {0}, h = {0};
    upload u = {body, len, 0};
    struct curl_slist *hl = NULL;
    for (int i = 0; headers && headers[i]; i++)
        hl = curl_slist_append(hl, headers[i]);
    hl = curl_slist_append(hl, "Expect:");
    if (chunked)
        hl = curl_slist_append(hl, "Transfer-Encoding: chunked");
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_PATH_AS_IS, 1L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 30L);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, kc_test_buf_write);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, kc_test_buf_write);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, &h);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, out->curl_error);
    if (ts->cainfo[0])
        curl_easy_setopt(c, CURLOPT_CAINFO, ts->cainfo);
    if (!strcmp(method, "HEAD"))
        curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
    else if (!strcmp(method, "PUT") || !strcmp(method, "POST")) {
        curl_easy_setopt(c, CURLOPT_UPLOAD, 1L);
        curl_easy_setopt(c, CURLOPT_READFUNCTION, upload_read);
        curl_easy_setopt(c, CURLOPT_READDATA, &u);
        if (!chunked)
            curl_easy_setopt(c, CURLOPT_INFILESIZE_LARGE, (curl_off_t)len);
        curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    } else if (strcmp(method, "GET") != 0)
        curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hl);
    CURLcode rc = curl_easy_perform(c);
    if (rc == CURLE_OK)
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &out->status);
    else if (!out->curl_error[0])
        snprintf(out->curl_error, sizeof out->curl_error, "%s", curl_easy_strerror(rc));
    curl_slist_free_all(hl);
    curl_easy_cleanup(c);
    out->body = b.p ? b.p : (unsigned char *)calloc(1, 1);
    out->len = b.len;
    out->headers = h.p ? (char *)h.p : calloc(1, 1);
    return rc == CURLE_OK ? 0 : -1;
}

char *kc_http_header(const kc_http_result *r, const char *name)
{
    size_t n = strlen(name);
    const char *line = r->headers;
    while (line && *line) {
        const char *eol = strchr(line, '\n');
        size_t ll = eol ? (size_t)(eol - line) : strlen(line);
        if (ll > n && !strncasecmp(line, name, n) && line[n] == ':') {
            const char *v = line + n + 1;
            while (*v == ' ')
                v++;
            size_t vl = (size_t)(line + ll - v);
            while (vl && isspace((unsigned char)v[vl - 1]))
                vl--;
            return strndup(v, vl);
        }
        line = eol ? eol + 1 : NULL;
    }
    return NULL;
}

void kc_http_result_free(kc_http_result *r)
{
    free(r->body);
    free(r->headers);
    memset(r, 0, sizeof *r);
}
