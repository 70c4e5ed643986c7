/*
 * kc_util.c - size parsing and formatting, a monotonic clock, whole-file
 * read, atomic file write and mkdir -p: the small helpers every tool shares.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "kc_util.h"

kc_code kc_parse_size(const char *text, uint64_t *out, kc_err *err)
{
    if (!text || !*text)
        return kc_err_set(err, KC_ERR_INVALID, "empty size");
    const char *p = text;
    uint64_t v = 0;
    if (*p < '0' || *p > '9')
        return kc_err_set(err, KC_ERR_INVALID, "bad size '%s' (expected e.g. 4096, 512M, 10G)",
                          text);
    while (*p >= '0' && *p <= '9') {
        unsigned d = (unsigned)(*p - '0');
        if (v > (UINT64_MAX - d) / 10)
            return kc_err_set(err, KC_ERR_INVALID, "size '%s' is too large", text);
        v = v * 10 + d;
        p++;
    }
    unsigned shift = 0;
    switch (*p) {
    case 'k':
    case 'K':
        shift = 10;
        p++;
        break;
    case 'm':
    case 'M':
        shift = 20;
        p++;
        break;
    case 'g':
    case 'G':
        shift = 30;
        p++;
        break;
    case 't':
    case 'T':
        shift = 40;
        p++;
        break;
    default:
        break;
    }
    if (shift && (strcasecmp(p, "iB") == 0 || strcasecmp(p, "B") == 0))
        p += strlen(p);
    else if (!shift && strcasecmp(p, "B") == 0)
        p++;
    if (*p)
        return kc_err_set(err, KC_ERR_INVALID, "bad size '%s' (expected e.g. 4096, 512M, 10G)",
                          text);
    if (shift && v > (UINT64_MAX >> shift))
        return kc_err_set(err, KC_ERR_INVALID, "size '%s' is too large", text);
    *out = v << shift;
    return KC_OK;
}

char *kc_format_size(uint64_t bytes, char *buf, size_t cap)
{
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    if (bytes < 1024) {
        snprintf(buf, cap, "%llu B", (unsigned long long)bytes);
        return buf;
    }
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024.0 && u < 5) {
        v /= 1024.0;
        u++;
    }
    snprintf(buf, cap, "%.1f %s", v, units[u]);
    return buf;
}

double kc_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

kc_code kc_read_file(const char *path, uint8_t **out, size_t *len, kc_err *err)
{
    *out = NULL;
    *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return kc_err_errno(err, errno == ENOENT ? KC_ERR_NOT_FOUND : KC_ERR_IO, errno,
                            "cannot open %s", path);
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return kc_err_errno(err, KC_ERR_IO, e, "cannot stat %s", path);
    }
    size_t cap = S_ISREG(st.st_mode) && st.st_size > 0 ? (size_t)st.st_size + 1 : 65536;
    uint8_t *buf = malloc(cap);
    if (!buf) {
        close(fd);
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory reading %s", path);
    }
    size_t n = 0;
    for (;;) {
        if (n + 1 >= cap) {
            size_t ncap = cap * 2;
            uint8_t *nb = realloc(buf, ncap);
            if (!nb) {
                free(buf);
                close(fd);
                return kc_err_set(err, KC_ERR_NOMEM, "out of memory reading %s", path);
            }
            buf = nb;
            cap = ncap;
        }
        ssize_t r = read(fd, buf + n, cap - 1 - n);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            int e = errno;
            free(buf);
            close(fd);
            return kc_err_errno(err, KC_ERR_IO, e, "cannot read %s", path);
        }
        if (r == 0)
            break;
        n += (size_t)r;
    }
    close(fd);
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return KC_OK;
}

/* Writes all of data to fd, retrying short writes and EINTR. */
static int write_all(int fd, const void *data, size_t len)
{
    const uint8_t *p = data;
    while (len > 0) {
        ssize_t w = write(fd, p, len);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return -1;
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

kc_code kc_write_file_atomic(const char *path, const void *data, size_t len, kc_err *err)
{
    /* A device, FIFO or socket (kcache get -o /dev/null, /dev/stdout) is
     * written in place: renaming a temp file over it would replace the
     * device node itself. */
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
        int fd = open(path, O_WRONLY | O_CLOEXEC);
        if (fd < 0)
            return kc_err_errno(err, KC_ERR_IO, errno, "cannot open %s", path);
        int rc = write_all(fd, data, len);
        int e = errno;
        if (close(fd) != 0 && rc == 0) {
            rc = -1;
            e = errno;
        }
        return rc == 0 ? KC_OK : kc_err_errno(err, KC_ERR_IO, e, "cannot write %s", path);
    }
    size_t plen = strlen(path) + 32;
    char *tmp = malloc(plen);
    if (!tmp)
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory writing %s", path);
    snprintf(tmp, plen, "%s.tmp.%ld", path, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        kc_code rc = kc_err_errno(err, KC_ERR_IO, errno, "cannot create %s", tmp);
        free(tmp);
        return rc;
    }
    if (write_all(fd, data, len) != 0) {
        int e = errno;
        close(fd);
        unlink(tmp);
        free(tmp);
        return kc_err_errno(err, e == ENOSPC ? KC_ERR_FULL : KC_ERR_IO, e, "cannot write %s", path);
    }
    if (fsync(fd) != 0 || close(fd) != 0) {
        int e = errno;
        unlink(tmp);
        free(tmp);
        return kc_err_errno(err, KC_ERR_IO, e, "cannot write %s", path);
    }
    if (rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        free(tmp);
        return kc_err_errno(err, KC_ERR_IO, e, "cannot rename %s into place", path);
    }
    free(tmp);
    return KC_OK;
}

kc_code kc_mkdirs(const char *path, kc_err *err)
{
    size_t n = strlen(path);
    if (n == 0)
        return kc_err_set(err, KC_ERR_INVALID, "empty directory path");
    char *p = strdup(path);
    if (!p)
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory creating %s", path);
    for (size_t i = 1; i <= n; i++) {
        if (p[i] == '/' || p[i] == '\0') {
            char c = p[i];
            p[i] = '\0';
            if (mkdir(p, 0755) != 0 && errno != EEXIST) {
                kc_code rc = kc_err_errno(err, KC_ERR_IO, errno, "cannot create directory %s", p);
                free(p);
                return rc;
            }
            p[i] = c;
        }
    }
    free(p);
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
        return kc_err_set(err, KC_ERR_IO, "%s exists and is not a directory", path);
    return KC_OK;
}
