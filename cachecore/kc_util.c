/*
 * kc_util.c - size parsing and formatting, a monotonic clock, whole-file
 * read, output files that appear whole or not at all (kc_outfile) and
 * mkdir -p: the small helpers every tool shares.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <kcache/kc_util.h>

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

/* ---- kc_outfile ------------------------------------------------------ */

struct kc_outfile {
    char *path;   /* as the caller named it, for messages */
    char *target; /* what the rename replaces (path or a symlink's target) */
    char *tmp;    /* temporary beside target; NULL when written in place */
    int fd;
    mode_t mode; /* permission bits to give the new file; 0: leave */
    bool failed;
    kc_err first; /* the first write failure */
};

static kc_code full_or_io(int e)
{
#ifdef EDQUOT
    if (e == EDQUOT)
        return KC_ERR_FULL;
#endif
    return e == ENOSPC ? KC_ERR_FULL : KC_ERR_IO;
}

/* The descriptor behind /dev/stdout, /dev/stderr, /dev/fd/N or
 * /proc/self/fd/N; -1 for any other path. */
static int self_fd(const char *path)
{
    if (strcmp(path, "/dev/stdout") == 0)
        return 1;
    if (strcmp(path, "/dev/stderr") == 0)
        return 2;
    const char *num = NULL;
    if (strncmp(path, "/dev/fd/", 8) == 0)
        num = path + 8;
    else if (strncmp(path, "/proc/self/fd/", 14) == 0)
        num = path + 14;
    if (!num || *num < '0' || *num > '9')
        return -1;
    char *end;
    long v = strtol(num, &end, 10);
    return *end == '\0' && v >= 0 && v < 65536 ? (int)v : -1;
}

static void outfile_free(kc_outfile *o)
{
    free(o->path);
    free(o->target);
    free(o->tmp);
    free(o);
}

/* Creates a temporary beside target with a random name (TARGET.tmp.
 * followed by 12 random hex digits), O_EXCL|O_NOFOLLOW: a name planted in
 * advance (a file or a symlink) is never opened, another name is tried. */
static int open_temp(kc_outfile *o, int *err_no)
{
    size_t tl = strlen(o->target) + 32;
    if (!(o->tmp = malloc(tl))) {
        *err_no = ENOMEM;
        return -1;
    }
    for (int attempt = 0; attempt < 64; attempt++) {
        uint8_t rnd[6];
        if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) {
            *err_no = errno ? errno : EIO;
            return -1;
        }
        snprintf(o->tmp, tl, "%s.tmp.%02x%02x%02x%02x%02x%02x", o->target, rnd[0], rnd[1], rnd[2],
                 rnd[3], rnd[4], rnd[5]);
        int fd = open(o->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
        if (fd >= 0)
            return fd;
        if (errno != EEXIST && errno != ELOOP) {
            *err_no = errno;
            return -1;
        }
    }
    *err_no = EEXIST;
    return -1;
}

kc_code kc_outfile_open(const char *path, kc_outfile **out, kc_err *err)
{
    *out = NULL;
    if (!path || !*path)
        return kc_err_set(err, KC_ERR_INVALID, "empty output path");
    kc_outfile *o = calloc(1, sizeof *o);
    if (!o || !(o->path = strdup(path))) {
        free(o);
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory writing %s", path);
    }
    o->fd = -1;
    struct stat st, lst;
    int sfd = self_fd(path);
    /* A final-component symlink is followed only when this user owns it: in
     * a shared directory (/tmp) another user's link would redirect the write
     * to whatever file it names. */
    bool is_link = sfd < 0 && lstat(path, &lst) == 0 && S_ISLNK(lst.st_mode);
    if (is_link && lst.st_uid != geteuid()) {
        outfile_free(o);
        return kc_err_set(err, KC_ERR_IO,
                          "refusing to write %s: it is a symbolic link owned by another user "
                          "(uid %ld)",
                          path, (long)lst.st_uid);
    }
    int exists = sfd < 0 && stat(path, &st) == 0;
    if (sfd >= 0 || (exists && !S_ISREG(st.st_mode))) {
        /* in place: this process's own descriptor, shared with its offset,
         * or a device, FIFO or socket, written through and never replaced */
        o->fd = sfd >= 0 ? fcntl(sfd, F_DUPFD_CLOEXEC, 3)
                         : open(path, O_WRONLY | O_CLOEXEC | (is_link ? 0 : O_NOFOLLOW));
        if (o->fd < 0) {
            int e = errno;
            outfile_free(o);
            return kc_err_errno(err, KC_ERR_IO, e, "cannot open %s", path);
        }
        *out = o;
        return KC_OK;
    }
    if (is_link && exists)
        o->target = realpath(path, NULL); /* our own link: replace its file, keep the link */
    else
        o->target = strdup(path);
    if (!o->target) {
        outfile_free(o);
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory writing %s", path);
    }
    int e = 0;
    o->fd = open_temp(o, &e);
    if (o->fd < 0) {
        kc_code rc = e == ENOMEM ? kc_err_set(err, KC_ERR_NOMEM, "out of memory writing %s", path)
                                 : kc_err_errno(err, full_or_io(e), e,
                                                "cannot create a temporary file beside %s", path);
        outfile_free(o);
        return rc;
    }
    o->mode = exists ? (st.st_mode & 07777) : 0;
    *out = o;
    return KC_OK;
}

/* Keeps the first failure in o and copies it to err; returns its code. */
static kc_code outfile_fail(kc_outfile *o, kc_err *err, int e, const char *what)
{
    if (!o->failed) {
        o->failed = true;
        kc_err_errno(&o->first, full_or_io(e), e, "cannot %s %s", what, o->path);
    }
    if (err)
        *err = o->first;
    return o->first.code;
}

kc_code kc_outfile_write(kc_outfile *o, const void *data, size_t len, kc_err *err)
{
    if (o->failed)
        return outfile_fail(o, err, 0, "write");
    const uint8_t *p = data;
    while (len > 0) {
        ssize_t w = write(o->fd, p, len);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return outfile_fail(o, err, errno, "write");
        if (w == 0)
            return outfile_fail(o, err, EIO, "write");
        p += w;
        len -= (size_t)w;
    }
    return KC_OK;
}

int kc_outfile_sink(const void *data, size_t len, void *ctx)
{
    return kc_outfile_write(ctx, data, len, NULL) == KC_OK ? 0 : -1;
}

int kc_outfile_failed(const kc_outfile *o)
{
    return o->failed;
}

/* fsync of the directory holding path, so a rename survives a crash; best
 * effort (some file systems refuse to sync a directory). */
static void sync_parent(const char *path)
{
    const char *slash = strrchr(path, '/');
    char *dir = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
    if (!dir)
        return;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
    free(dir);
}

kc_code kc_outfile_commit(kc_outfile *o, kc_err *err)
{
    if (o->failed) {
        kc_code rc = outfile_fail(o, err, 0, "write");
        kc_outfile_abort(o);
        return rc;
    }
    if (!o->tmp) {
        int rc = close(o->fd);
        int e = errno;
        o->fd = -1;
        kc_code code = KC_OK;
        if (rc != 0 && e != EINTR)
            code = outfile_fail(o, err, e, "write");
        outfile_free(o);
        return code;
    }
    if (o->mode)
        (void)fchmod(o->fd, o->mode); /* best effort: a file we may not own */
    if (fsync(o->fd) != 0) {
        kc_code rc = outfile_fail(o, err, errno, "write");
        kc_outfile_abort(o);
        return rc;
    }
    int crc = close(o->fd);
    int e = errno;
    o->fd = -1;
    if (crc != 0 && e != EINTR) {
        kc_code rc = outfile_fail(o, err, e, "write");
        kc_outfile_abort(o);
        return rc;
    }
    if (rename(o->tmp, o->target) != 0) {
        e = errno;
        kc_code rc = kc_err_errno(err, KC_ERR_IO, e, "cannot rename %s into place", o->path);
        kc_outfile_abort(o);
        return rc;
    }
    sync_parent(o->target);
    outfile_free(o);
    return KC_OK;
}

void kc_outfile_abort(kc_outfile *o)
{
    if (!o)
        return;
    if (o->fd >= 0)
        close(o->fd);
    if (o->tmp)
        unlink(o->tmp);
    outfile_free(o);
}

kc_code kc_write_file_atomic(const char *path, const void *data, size_t len, kc_err *err)
{
    kc_outfile *o;
    kc_code rc = kc_outfile_open(path, &o, err);
    if (rc != KC_OK)
        return rc;
    kc_outfile_write(o, data, len, NULL); /* a failure is reported by commit */
    return kc_outfile_commit(o, err);
}

kc_code kc_mkdirs(const char *path, kc_err *err)
{
    return kc_mkdirs_mode(path, 0755, err);
}

kc_code kc_mkdirs_mode(const char *path, unsigned mode, kc_err *err)
{
    size_t n = strlen(path);
    if (n == 0)
        return kc_err_set(err, KC_ERR_INVALID, "empty directory path");
    char *p = strdup(path);
    if (!p)
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory creating %s", path);
    bool made_last = false;
    for (size_t i = 1; i <= n; i++) {
        if (p[i] == '/' || p[i] == '\0') {
            char c = p[i];
            p[i] = '\0';
            bool last = c == '\0' || p[i + strspn(p + i + 1, "/") + 1] == '\0';
            if (mkdir(p, last ? (mode_t)mode : 0755) == 0) {
                made_last = last;
            } else if (errno != EEXIST) {
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
    /* exactly mode, whatever the umask took away */
    if (made_last && chmod(path, (mode_t)mode) != 0)
        return kc_err_errno(err, KC_ERR_IO, errno, "cannot set the mode of %s", path);
    return KC_OK;
}
