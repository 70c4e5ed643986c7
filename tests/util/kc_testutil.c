/*
 * kc_testutil.c - temp dirs, subprocess runner with captured stdout/stderr
 * and timeout, and file helpers used by the Criterion suites.
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kc_testutil.h"

#include <kcache/kc_envelope.h>
#include <kcache/kc_hash.h>
#include <kcache/kc_log.h>

extern char **environ;

char *kc_test_mkdtemp(const char *tag)
{
    const char *base = getenv("TMPDIR");
    if (!base || !*base)
        base = "/tmp";
    size_t n = strlen(base) + (tag ? strlen(tag) : 0) + 32;
    char *p = malloc(n);
    if (!p)
        return NULL;
    snprintf(p, n, "%s/kctest-%s-XXXXXX", base, tag ? tag : "t");
    if (!mkdtemp(p)) {
        free(p);
        return NULL;
    }
    return p;
}

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

int kc_test_rmtree(const char *path)
{
    if (!path)
        return 0;
    return nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

static int append(char **buf, size_t *len, size_t *cap, const char *data, size_t n)
{
    if (*len + n + 1 > *cap) {
        size_t nc = *cap ? *cap : 4096;
        while (nc < *len + n + 1)
            nc *= 2;
        char *nb = realloc(*buf, nc);
        if (!nb)
            return -1;
        *buf = nb;
        *cap = nc;
    }
    memcpy(*buf + *len, data, n);
    *len += n;
    (*buf)[*len] = '\0';
    return 0;
}

int kc_test_run(char *const argv[], const void *stdin_data, size_t stdin_len, int timeout_s,
                kc_test_result *r)
{
    memset(r, 0, sizeof *r);
    r->exit_code = -1;
    int pin[2], pout[2], perr[2];
    if (pipe2(pin, O_CLOEXEC) != 0)
        return -1;
    if (pipe2(pout, O_CLOEXEC) != 0 || pipe2(perr, O_CLOEXEC) != 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        dup2(pin[0], 0);
        dup2(pout[1], 1);
        dup2(perr[1], 2);
        execvp(argv[0], argv);
        fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(pin[0]);
    close(pout[1]);
    close(perr[1]);
    signal(SIGPIPE, SIG_IGN);
    int in_fd = pin[1];
    const char *in = stdin_data;
    size_t in_left = stdin_data ? stdin_len : 0;
    if (in_left == 0) {
        close(in_fd);
        in_fd = -1;
    } else {
        fcntl(in_fd, F_SETFL, O_NONBLOCK);
    }
    size_t ocap = 0, ecap = 0;
    append(&r->out, &r->out_len, &ocap, "", 0);
    append(&r->err, &r->err_len, &ecap, "", 0);
    int fds_open = 2;
    int out_fd = pout[0], err_fd = perr[0];
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (timeout_s <= 0)
        timeout_s = 60;
    while (fds_open > 0 || in_fd >= 0) {
        struct pollfd p[3];
        int np = 0;
        if (out_fd >= 0)
            p[np++] = (struct pollfd){.fd = out_fd, .events = POLLIN};
        if (err_fd >= 0)
            p[np++] = (struct pollfd){.fd = err_fd, .events = POLLIN};
        if (in_fd >= 0)
            p[np++] = (struct pollfd){.fd = in_fd, .events = POLLOUT};
        int pr = poll(p, (nfds_t)np, 200);
        struct timespec t1;
        clock_gettime(CLOCK_MONOTONIC, &t1);
        if (t1.tv_sec - t0.tv_sec >= timeout_s) {
            kill(pid, SIGKILL);
            r->timed_out = 1;
            break;
        }
        if (pr < 0 && errno != EINTR)
            break;
        for (int i = 0; i < np && pr > 0; i++) {
            if (!p[i].revents)
                continue;
            if (p[i].fd == in_fd) {
                ssize_t w = write(in_fd, in, in_left);
                if (w > 0) {
                    in += w;
                    in_left -= (size_t)w;
                }
                if ((w < 0 && errno != EAGAIN) || in_left == 0) {
                    close(in_fd);
                    in_fd = -1;
                }
                continue;
            }
            char buf[65536];
            ssize_t n = read(p[i].fd, buf, sizeof buf);
            if (n > 0) {
                if (p[i].fd == out_fd)
                    append(&r->out, &r->out_len, &ocap, buf, (size_t)n);
                else
                    append(&r->err, &r->err_len, &ecap, buf, (size_t)n);
            } else if (n == 0 || errno != EINTR) {
                if (p[i].fd == out_fd)
                    out_fd = -1;
                else
                    err_fd = -1;
                close(p[i].fd);
                fds_open--;
            }
        }
    }
    if (in_fd >= 0)
        close(in_fd);
    if (out_fd >= 0)
        close(out_fd);
    if (err_fd >= 0)
        close(err_fd);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    if (WIFEXITED(st))
        r->exit_code = WEXITSTATUS(st);
    else if (WIFSIGNALED(st))
        r->term_signal = WTERMSIG(st);
    return 0;
}

int kc_test_runl(kc_test_result *r, const char *arg0, ...)
{
    const char *argv[64];
    int n = 0;
    argv[n++] = arg0;
    va_list ap;
    va_start(ap, arg0);
    const char *a;
    while ((a = va_arg(ap, const char *)) != NULL && n < 63)
        argv[n++] = a;
    va_end(ap);
    argv[n] = NULL;
    return kc_test_run((char *const *)argv, NULL, 0, 0, r);
}

void kc_test_result_free(kc_test_result *r)
{
    free(r->out);
    free(r->err);
    memset(r, 0, sizeof *r);
}

long long kc_test_file_size(const char *dir, const char *name)
{
    char *path = kc_test_path(dir, name);
    struct stat sb;
    long long n = path && stat(path, &sb) == 0 ? (long long)sb.st_size : -1;
    free(path);
    return n;
}

char *kc_test_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (n + 1 >= cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
        size_t r = fread(buf + n, 1, cap - 1 - n, f);
        if (r == 0)
            break;
        n += r;
    }
    fclose(f);
    if (!buf)
        return NULL;
    buf[n] = '\0';
    if (len)
        *len = n;
    return buf;
}

int kc_test_write_file(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    size_t w = len ? fwrite(data, 1, len, f) : 0;
    int rc = fclose(f);
    return (w == len && rc == 0) ? 0 : -1;
}

size_t kc_test_buf_write(char *data, size_t size, size_t nmemb, void *buf)
{
    kc_test_buf *m = buf;
    size_t n = size * nmemb;
    if (m->len + n + 1 > m->cap) {
        size_t cap = (m->len + n + 1) * 2;
        unsigned char *p = realloc(m->p, cap);
        if (!p)
            return 0;
        m->p = p;
        m->cap = cap;
    }
    memcpy(m->p + m->len, data, n);
    m->len += n;
    m->p[m->len] = 0;
    return n;
}

void kc_test_fill_random(void *buf, size_t len, uint64_t seed)
{
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 0x1234567ull;
    uint8_t *p = buf;
    for (size_t i = 0; i < len; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p[i] = (uint8_t)(x >> 24);
    }
}

uint8_t *kc_test_envelope(const char *seed, size_t payload_len, char key[65], size_t *len)
{
    kc_sha256_hex(seed, strlen(seed), key);
    uint8_t *payload = malloc(payload_len ? payload_len : 1);
    if (!payload)
        return NULL;
    kc_test_fill_random(payload, payload_len, strlen(seed));
    kc_artifact a;
    kc_err e = {0};
    uint8_t *env = NULL;
    if (kc_artifact_init(&a, key, "cpu-so", NULL, payload, payload_len, &e) == KC_OK) {
        if (kc_envelope_encode(&a, &env, len, &e) != KC_OK)
            env = NULL;
        kc_artifact_free(&a);
    }
    free(payload);
    return env;
}

int kc_test_kcache(kc_test_result *r, const char *kcache_bin, const char *dir, const char *url,
                   const char *const *args)
{
    const char *argv[32];
    int n = 0;
    argv[n++] = kcache_bin;
    argv[n++] = "--cache-dir";
    argv[n++] = dir;
    if (url) {
        argv[n++] = "--remote";
        argv[n++] = url;
    }
    for (; *args && n < 31; args++)
        argv[n++] = *args;
    argv[n] = NULL;
    return kc_test_run((char *const *)argv, NULL, 0, 120, r);
}

static uint64_t le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    while (n-- > 0)
        v = v << 8 | p[n];
    return v;
}

int kc_test_bundle_records(const uint8_t *p, size_t n, size_t *ends, int max, size_t *end_record)
{
    size_t off = n >= 16 ? 16 + (size_t)le(p + 12, 4) : n;
    int count = 0;
    while (off + 9 <= n && p[off] != 0xFF && count < max) {
        off += 9 + (size_t)le(p + off + 1, 8);
        ends[count++] = off;
    }
    *end_record = off;
    return count;
}

int kc_test_settle(const char *path, int settle_s)
{
    for (;;) {
        struct stat st;
        struct timespec now;
        if (stat(path, &st) != 0)
            return -1;
        clock_gettime(CLOCK_REALTIME, &now);
        const struct timespec *t =
            st.st_ctim.tv_sec > st.st_mtim.tv_sec ? &st.st_ctim : &st.st_mtim;
        double age = (double)(now.tv_sec - t->tv_sec) + (now.tv_nsec - t->tv_nsec) / 1e9;
        if (age > settle_s + 0.05)
            return 0;
        double left = settle_s + 0.1 - age;
        struct timespec d = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
        nanosleep(&d, NULL);
    }
}

char *kc_test_path(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p)
        snprintf(p, n, "%s/%s", dir, name);
    return p;
}

int kc_test_make_ed25519(const char *priv, const char *pub)
{
    kc_test_result r;
    int ok =
        kc_test_runl(&r, "openssl", "genpkey", "-algorithm", "ed25519", "-out", priv, NULL) == 0 &&
        r.exit_code == 0;
    kc_test_result_free(&r);
    if (!ok)
        return -1;
    ok = kc_test_runl(&r, "openssl", "pkey", "-in", priv, "-pubout", "-out", pub, NULL) == 0 &&
         r.exit_code == 0;
    kc_test_result_free(&r);
    return ok ? 0 : -1;
}

char *kc_test_redis_cliv(const char *port, const char *first, va_list ap)
{
    char *argv[32] = {"redis-cli", "-p", (char *)port};
    int n = 3;
    for (const char *a = first; a && n < 31; a = va_arg(ap, const char *))
        argv[n++] = (char *)a;
    argv[n] = NULL;
    kc_test_result r;
    if (kc_test_run(argv, NULL, 0, 30, &r) != 0)
        return NULL;
    char *out = strdup(r.out ? r.out : "");
    kc_test_result_free(&r);
    size_t len = out ? strlen(out) : 0;
    while (len && out[len - 1] == '\n')
        out[--len] = 0;
    return out;
}

char *kc_test_redis_cli(const char *port, ...)
{
    va_list ap;
    va_start(ap, port);
    const char *first = va_arg(ap, const char *);
    char *out = kc_test_redis_cliv(port, first, ap);
    va_end(ap);
    return out;
}

static void log_to_stderr(kc_log_level level, const char *msg, void *ctx)
{
    (void)ctx;
    fprintf(stderr, level == KC_LOG_WARN ? "kcache: warning: %s\n" : "kcache: %s\n", msg);
}

void kc_test_log_to_stderr(void)
{
    kc_log_set(log_to_stderr, NULL);
}

#ifdef __SANITIZE_ADDRESS__
/* LeakSanitizer asks this at exit. Criterion runs every test in a worker
 * process (boxfort sets BXFI_MAP there), where the code under test runs and
 * leaks are checked; the runner process runs none of it, and Criterion 2.4's
 * runner leaks a 48-byte timeout record when two tests with .timeout end
 * together, which failed whole suites with no kcache frame in the stack. */
int __lsan_is_turned_off(void);
int __lsan_is_turned_off(void)
{
    return getenv("BXFI_MAP") == NULL;
}
#endif
