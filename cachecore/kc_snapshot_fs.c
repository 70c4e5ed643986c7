/*
 * kc_snapshot_fs.c - the file-system side of directory snapshots: walking a
 * cache directory into the store (push), and restoring a validated manifest
 * into a directory (pull) without ever following a symlink below it or
 * leaving a partly written file under a real name.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <kcache/kc_snapshot.h>
#include <kcache/kc_util.h>

#define TMP_PREFIX ".kcache-tmp-"
#define KC_SNAP_RESTORE_THREADS 4

/* ---- reading files -------------------------------------------------------- */

static kc_code read_fd(int fd, size_t size, uint8_t **out, const char *path, kc_err *err)
{
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf)
        return kc_err_set(err, KC_ERR_NOMEM, "%s: out of memory reading %zu bytes", path, size);
    size_t got = 0;
    while (got < size) {
        ssize_t n = read(fd, buf + got, size - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            int e = n < 0 ? errno : 0;
            free(buf);
            return e ? kc_err_errno(err, KC_ERR_IO, e, "reading %s", path)
                     : kc_err_set(err, KC_ERR_IO, "reading %s: it shrank while being read", path);
        }
        got += (size_t)n;
    }
    *out = buf;
    return KC_OK;
}

/* SHA-256 (hex) of an open file, streamed. */
static kc_code hash_fd(int fd, char out[KC_KEY_HEX_LEN + 1], const char *path, kc_err *err)
{
    kc_sha256_ctx *c = kc_sha256_new();
    uint8_t *buf = malloc(1 << 20);
    if (!c || !buf) {
        kc_sha256_free(c);
        free(buf);
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory hashing %s", path);
    }
    kc_code rc = KC_OK;
    for (;;) {
        ssize_t n = read(fd, buf, 1 << 20);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            rc = kc_err_errno(err, KC_ERR_IO, errno, "reading %s", path);
            break;
        }
        if (n == 0)
            break;
        kc_sha256_update(c, buf, (size_t)n);
    }
    uint8_t d[KC_SHA256_LEN];
    kc_sha256_final(c, d);
    kc_hex_encode(d, KC_SHA256_LEN, out);
    kc_sha256_free(c);
    free(buf);
    return rc;
}

/* ---- push: scanning ------------------------------------------------------- */

typedef struct scan_ctx {
    kc_store *s;
    kc_snap_skip_fn skip;
    void *skip_ctx;
    kc_snap_manifest *m;
    kc_snap_scan_stats *st;
    const char *root;
} scan_ctx;

static kc_code add_entry(kc_snap_manifest *m, const char *rel, kc_snap_type type, unsigned mode,
                         kc_err *err)
{
    if (m->n == m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 256;
        kc_snap_entry *e = realloc(m->e, cap * sizeof *e);
        if (!e)
            return kc_err_set(err, KC_ERR_NOMEM, "out of memory scanning");
        m->e = e;
        m->cap = cap;
    }
    if (m->n >= KC_SNAP_ENTRIES_MAX)
        return kc_err_set(err, KC_ERR_TOO_LARGE, "more than %d entries below the directory",
                          KC_SNAP_ENTRIES_MAX);
    kc_snap_entry *e = &m->e[m->n];
    memset(e, 0, sizeof *e);
    if (!(e->path = strdup(rel)))
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory scanning");
    e->type = type;
    e->mode = mode & 0777;
    m->n++;
    return KC_OK;
}

static kc_code scan_file(scan_ctx *c, int dfd, const char *name, const char *rel, kc_err *err)
{
    char shown[PATH_MAX + KC_SNAP_PATH_MAX + 2];
    snprintf(shown, sizeof shown, "%s/%s", c->root, rel);
    int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (fd < 0)
        return kc_err_errno(err, KC_ERR_IO, errno, "opening %s", shown);
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return kc_err_set(err, KC_ERR_IO, "%s changed while being read", shown);
    }
    if ((uint64_t)st.st_size > KC_PAYLOAD_MAX) {
        close(fd);
        return kc_err_set(err, KC_ERR_TOO_LARGE, "%s: larger than 4 GiB", shown);
    }
    uint8_t *buf = NULL;
    kc_code rc = read_fd(fd, (size_t)st.st_size, &buf, shown, err);
    close(fd);
    if (rc != KC_OK)
        return rc;
    kc_artifact a = {.meta = "{}", .payload = buf, .payload_len = (size_t)st.st_size};
    kc_sha256(buf, a.payload_len, a.payload_sha);
    char sha[KC_KEY_HEX_LEN + 1];
    kc_hex_encode(a.payload_sha, KC_SHA256_LEN, sha);
    kc_snapshot_file_key(sha, a.key);
    snprintf(a.kind, sizeof a.kind, "%s", KC_SNAP_KIND_FILE);
    bool created = false;
    kc_err e2 = {0};
    if (kc_store_has(c->s, a.key, &e2) != KC_OK) {
        rc = kc_store_put(c->s, &a, &created, err);
        if (rc != KC_OK)
            kc_err_prefix(err, "storing %s", shown);
    }
    free(buf);
    if (rc == KC_OK)
        rc = add_entry(c->m, rel, KC_SNAP_FILE, st.st_mode, err);
    if (rc != KC_OK)
        return rc;
    kc_snap_entry *e = &c->m->e[c->m->n - 1];
    e->size = (uint64_t)st.st_size;
    memcpy(e->sha, sha, sizeof e->sha);
    memcpy(e->key, a.key, sizeof e->key);
    c->m->nfiles++;
    c->m->bytes += e->size;
    c->st->files++;
    c->st->bytes += e->size;
    c->st->stored += created;
    return KC_OK;
}

static kc_code scan_dir(scan_ctx *c, int dfd, char *rel, size_t rlen, kc_err *err)
{
    int dup_fd = dup(dfd);
    DIR *d = dup_fd >= 0 ? fdopendir(dup_fd) : NULL;
    if (!d) {
        if (dup_fd >= 0)
            close(dup_fd);
        return kc_err_errno(err, KC_ERR_IO, errno, "reading directory %s/%s", c->root, rel);
    }
    kc_code rc = KC_OK;
    struct dirent *de;
    while (rc == KC_OK && (errno = 0, de = readdir(d)) != NULL) {
        const char *name = de->d_name;
        if (!strcmp(name, ".") || !strcmp(name, ".."))
            continue;
        size_t nl = strlen(name);
        if (rlen + 1 + nl > KC_SNAP_PATH_MAX || nl > KC_SNAP_NAME_MAX) {
            rc = kc_err_set(err, KC_ERR_TOO_LARGE, "%s/%s/%s: path longer than %d bytes", c->root,
                            rel, name, KC_SNAP_PATH_MAX);
            break;
        }
        size_t nlen = rlen ? rlen + 1 + nl : nl;
        if (rlen)
            rel[rlen] = '/';
        memcpy(rel + (rlen ? rlen + 1 : 0), name, nl + 1);
        struct stat st;
        if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
            if (errno != ENOENT) /* removed meanwhile: not part of the snapshot */
                rc = kc_err_errno(err, KC_ERR_IO, errno, "stat %s/%s", c->root, rel);
        } else if (S_ISDIR(st.st_mode) || S_ISREG(st.st_mode)) {
            bool dir = S_ISDIR(st.st_mode);
            if (c->skip && c->skip(rel, name, dir, c->skip_ctx)) {
                c->st->excluded++;
            } else if (dir) {
                rc = add_entry(c->m, rel, KC_SNAP_DIR, st.st_mode, err);
                int sub = rc == KC_OK
                              ? openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
                              : -1;
                if (rc == KC_OK && sub < 0)
                    rc = kc_err_errno(err, KC_ERR_IO, errno, "opening %s/%s", c->root, rel);
                if (rc == KC_OK) {
                    c->st->dirs++;
                    rc = scan_dir(c, sub, rel, nlen, err);
                    close(sub);
                }
            } else {
                rc = scan_file(c, dfd, name, rel, err);
            }
        } else {
            c->st->special++; /* symlinks, FIFOs, sockets, devices: not carried */
        }
        rel[rlen] = '\0';
    }
    if (rc == KC_OK && errno != 0)
        rc = kc_err_errno(err, KC_ERR_IO, errno, "reading directory %s/%s", c->root, rel);
    closedir(d);
    return rc;
}

static int entry_cmp(const void *a, const void *b)
{
    return strcmp(((const kc_snap_entry *)a)->path, ((const kc_snap_entry *)b)->path);
}

kc_code kc_snap_scan(kc_store *s, const char *dir, kc_snap_skip_fn skip, void *skip_ctx,
                     kc_snap_manifest *m, kc_snap_scan_stats *st, kc_err *err)
{
    kc_snap_scan_stats local = {0};
    if (!st)
        st = &local;
    memset(st, 0, sizeof *st);
    int root = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (root < 0)
        return kc_err_errno(err, errno == ENOENT ? KC_ERR_NOT_FOUND : KC_ERR_IO, errno,
                            "opening directory %s", dir);
    scan_ctx c = {s, skip, skip_ctx, m, st, dir};
    char rel[KC_SNAP_PATH_MAX + 2] = "";
    kc_code rc = scan_dir(&c, root, rel, 0, err);
    close(root);
    if (rc == KC_OK && m->n)
        qsort(m->e, m->n, sizeof *m->e, entry_cmp);
    return rc;
}

/* ---- pull: walking DIR safely ---------------------------------------------- */

/* Keeps the descriptor of the directory last walked to, so the files of one
 * directory (sorted together) share one walk. */
typedef struct walker {
    int root;
    const char *dir; /* for messages */
    char cur[KC_SNAP_PATH_MAX + 1];
    int curfd;      /* == root when cur is "" */
    uint8_t rnd[8]; /* temporary names: random part */
    uint64_t seq;   /* and a counter */
    unsigned umask; /* the process's umask (0777 when unknown: always fchmod) */
} walker;

/* The umask without changing it (umask(2) can only set it), from
 * /proc/self/status; 0777 when that is not readable. */
static unsigned current_umask(void)
{
    unsigned m = 0777;
    FILE *f = fopen("/proc/self/status", "re");
    char line[128];
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "Umask: %o", &m) == 1)
            break;
    if (f)
        fclose(f);
    return m;
}

static void walker_close(walker *w)
{
    if (w->curfd >= 0 && w->curfd != w->root)
        close(w->curfd);
    w->curfd = w->root;
    w->cur[0] = '\0';
}

/* Opens DIR/sub (sub "" = DIR), one component at a time with O_NOFOLLOW;
 * creates missing directories when create. KC_ERR_NOT_FOUND when missing
 * and not create; KC_ERR_INVALID for a symlink or non-directory on the
 * way. */
static kc_code walk_to(walker *w, const char *sub, bool create, int *out, kc_err *err)
{
    if (strcmp(sub, w->cur) == 0) {
        *out = w->curfd;
        return KC_OK;
    }
    walker_close(w);
    int fd = w->root;
    char path[KC_SNAP_PATH_MAX + 1];
    snprintf(path, sizeof path, "%s", sub);
    for (char *c = path, *slash; c && *c; c = slash ? slash + 1 : NULL) {
        slash = strchr(c, '/');
        if (slash)
            *slash = '\0';
        int next = openat(fd, c, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (next < 0 && errno == ENOENT && create) {
            if (mkdirat(fd, c, 0755) != 0 && errno != EEXIST) {
                int e = errno;
                if (fd != w->root)
                    close(fd);
                return kc_err_errno(err, e == ENOSPC || e == EDQUOT ? KC_ERR_FULL : KC_ERR_IO, e,
                                    "creating %s/%s", w->dir, path);
            }
            next = openat(fd, c, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        }
        int e = errno;
        if (fd != w->root)
            close(fd);
        if (next < 0) {
            if (slash)
                *slash = '/';
            if (e == ELOOP || e == ENOTDIR)
                return kc_err_set(err, KC_ERR_INVALID,
                                  "refusing %s/%s: '%s' is a symlink or not a directory in %s "
                                  "(a restore never writes through a symlink)",
                                  w->dir, sub, path, w->dir);
            return kc_err_errno(err, e == ENOENT ? KC_ERR_NOT_FOUND : KC_ERR_IO, e, "opening %s/%s",
                                w->dir, path);
        }
        fd = next;
        if (slash)
            *slash = '/';
    }
    snprintf(w->cur, sizeof w->cur, "%s", sub);
    w->curfd = fd;
    *out = fd;
    return KC_OK;
}

/* Splits a validated path into its parent (into buf) and last component. */
static const char *split(const char *path, char buf[KC_SNAP_PATH_MAX + 1])
{
    const char *slash = strrchr(path, '/');
    if (!slash) {
        buf[0] = '\0';
        return path;
    }
    memcpy(buf, path, (size_t)(slash - path));
    buf[slash - path] = '\0';
    return slash + 1;
}

/* True when DIR already holds entry e exactly (content, size and mode). */
static kc_code dir_has(walker *w, const kc_snap_entry *e, bool *have, kc_err *err)
{
    char parent[KC_SNAP_PATH_MAX + 1];
    const char *base = split(e->path, parent);
    *have = false;
    int dfd;
    kc_err e2 = {0};
    kc_code rc = walk_to(w, parent, false, &dfd, &e2);
    if (rc == KC_ERR_NOT_FOUND)
        return KC_OK;
    if (rc != KC_OK) {
        if (err)
            *err = e2;
        return rc;
    }
    struct stat st;
    if (fstatat(dfd, base, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode) ||
        (uint64_t)st.st_size != e->size || (st.st_mode & 0777) != e->mode)
        return KC_OK;
    int fd = openat(dfd, base, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return KC_OK;
    char sha[KC_KEY_HEX_LEN + 1];
    char shown[PATH_MAX + KC_SNAP_PATH_MAX + 2];
    snprintf(shown, sizeof shown, "%s/%s", w->dir, e->path);
    rc = hash_fd(fd, sha, shown, err);
    close(fd);
    *have = rc == KC_OK && strcmp(sha, e->sha) == 0;
    return rc;
}

static kc_code open_root(const char *dir, bool create, walker *w, kc_err *err)
{
    if (create) {
        kc_code rc = kc_mkdirs(dir, err);
        if (rc != KC_OK)
            return rc;
    }
    w->root = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (w->root < 0)
        return kc_err_errno(err, errno == ENOENT ? KC_ERR_NOT_FOUND : KC_ERR_IO, errno,
                            "opening directory %s", dir);
    w->dir = dir;
    w->cur[0] = '\0';
    w->curfd = w->root;
    return KC_OK;
}

kc_code kc_snap_plan(kc_store *s, const kc_snap_manifest *m, const char *dir, uint8_t *state,
                     size_t *need, kc_err *err)
{
    size_t missing = 0;
    walker w;
    kc_err e2 = {0};
    kc_code rc = open_root(dir, false, &w, &e2);
    bool have_root = rc == KC_OK;
    if (rc != KC_OK && rc != KC_ERR_NOT_FOUND) {
        if (err)
            *err = e2;
        return rc;
    }
    rc = KC_OK;
    for (size_t i = 0; rc == KC_OK && i < m->n; i++) {
        const kc_snap_entry *e = &m->e[i];
        state[i] = 0;
        if (e->type != KC_SNAP_FILE)
            continue;
        bool have = false;
        if (have_root && (rc = dir_has(&w, e, &have, err)) != KC_OK)
            break;
        if (have)
            state[i] |= KC_SNAP_HAVE_DIR;
        else if (s && kc_store_has(s, e->key, &e2) == KC_OK)
            state[i] |= KC_SNAP_HAVE_STORE;
        else
            missing++;
    }
    if (have_root) {
        walker_close(&w);
        close(w.root);
    }
    if (need)
        *need = missing;
    return rc;
}

/* ---- pull: writing -------------------------------------------------------- */

static kc_code io_error(int e, kc_err *err, const char *what, const char *dir, const char *path)
{
    return kc_err_errno(err, e == ENOSPC || e == EDQUOT ? KC_ERR_FULL : KC_ERR_IO, e, "%s %s/%s",
                        what, dir, path);
}

/* Creates a fresh random name in dfd for e (O_EXCL|O_NOFOLLOW, e's mode);
 * *fd and tmp get it. */
static kc_code tmp_open(walker *w, int dfd, const kc_snap_entry *e, int *fd, char tmp[64],
                        kc_err *err)
{
    *fd = -1;
    for (int tries = 0; *fd < 0 && tries < 16; tries++) {
        /* a random name per walker (one getentropy), then a counter */
        if ((w->seq == 0 || tries > 0) && getentropy(w->rnd, sizeof w->rnd) != 0)
            return kc_err_errno(err, KC_ERR_IO, errno, "no random bytes for a temporary name");
        char hex[2 * sizeof w->rnd + 1];
        kc_hex_encode(w->rnd, sizeof w->rnd, hex);
        snprintf(tmp, 64, TMP_PREFIX "%s-%llu", hex, (unsigned long long)++w->seq);
        /* created with its final mode (the file is not yet under its
         * name); fchmod at the end only where the umask takes bits away */
        *fd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, e->mode);
        if (*fd < 0 && errno != EEXIST)
            return io_error(errno, err, "creating a temporary file for", w->dir, e->path);
    }
    if (*fd < 0)
        return kc_err_set(err, KC_ERR_IO, "no free temporary name beside %s/%s", w->dir, e->path);
    return KC_OK;
}

/* Writes all of data to fd: 0 or an errno. */
static int write_all(int fd, const uint8_t *data, size_t len)
{
    size_t done = 0;
    while (done < len) {
        ssize_t n = write(fd, data + done, len - done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return n < 0 ? errno : ENOSPC;
        done += (size_t)n;
    }
    return 0;
}

/* Ends a temporary file of tmp_open: werr 0 (all written) renames it to
 * base, else (or when that fails) removes it. */
static kc_code tmp_commit(walker *w, int dfd, const kc_snap_entry *e, const char *base, int fd,
                          const char *tmp, int werr, kc_err *err)
{
    if (!werr && (e->mode & w->umask) && fchmod(fd, e->mode) != 0)
        werr = errno;
    if (close(fd) != 0 && !werr)
        werr = errno;
    if (!werr && renameat(dfd, tmp, dfd, base) != 0)
        werr = errno;
    if (werr) {
        unlinkat(dfd, tmp, 0);
        if (werr == EISDIR || werr == ENOTEMPTY || werr == EEXIST)
            return kc_err_set(err, KC_ERR_INVALID,
                              "%s/%s: a directory stands where the snapshot "
                              "has a file",
                              w->dir, e->path);
        return io_error(werr, err, "writing", w->dir, e->path);
    }
    return KC_OK;
}

/* Writes data to a fresh random name in dfd, then renames it to base. */
static kc_code write_one(walker *w, int dfd, const kc_snap_entry *e, const char *base,
                         const uint8_t *data, size_t len, kc_err *err)
{
    char tmp[64];
    int fd;
    kc_code rc = tmp_open(w, dfd, e, &fd, tmp, err);
    if (rc != KC_OK)
        return rc;
    return tmp_commit(w, dfd, e, base, fd, tmp, write_all(fd, data, len), err);
}

static int path_cmp(const void *key, const void *elem)
{
    return strcmp(key, ((const kc_snap_entry *)elem)->path);
}

/* --exact: removes what m lacks below dfd (rel is its path in DIR). */
static kc_code prune(const kc_snap_manifest *m, const kc_snap_restore_opts *o, int dfd, char *rel,
                     size_t rlen, kc_snap_restore_stats *st, const char *dir, kc_err *err)
{
    int dup_fd = dup(dfd);
    DIR *d = dup_fd >= 0 ? fdopendir(dup_fd) : NULL;
    if (!d) {
        if (dup_fd >= 0)
            close(dup_fd);
        return kc_err_errno(err, KC_ERR_IO, errno, "reading directory %s/%s", dir, rel);
    }
    kc_code rc = KC_OK;
    struct dirent *de;
    while (rc == KC_OK && (de = readdir(d)) != NULL) {
        const char *name = de->d_name;
        size_t nl = strlen(name);
        if (!strcmp(name, ".") || !strcmp(name, "..") || rlen + 1 + nl > KC_SNAP_PATH_MAX)
            continue;
        if (rlen)
            rel[rlen] = '/';
        memcpy(rel + (rlen ? rlen + 1 : 0), name, nl + 1);
        size_t nlen = rlen ? rlen + 1 + nl : nl;
        struct stat sb;
        const kc_snap_entry *hit = m->n ? bsearch(rel, m->e, m->n, sizeof *m->e, path_cmp) : NULL;
        bool isdir = fstatat(dfd, name, &sb, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(sb.st_mode);
        bool keep = o->keep && o->keep(rel, name, isdir, o->keep_ctx);
        if (keep) {
            /* a preset's lock or temp file: left alone */
        } else if (isdir) {
            int sub = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (sub >= 0) {
                rc = prune(m, o, sub, rel, nlen, st, dir, err);
                close(sub);
            }
            if (rc == KC_OK && !hit && unlinkat(dfd, name, AT_REMOVEDIR) == 0)
                st->removed++;
        } else if (!hit || hit->type != KC_SNAP_FILE) {
            if (unlinkat(dfd, name, 0) == 0)
                st->removed++;
            else if (errno != ENOENT)
                rc = kc_err_errno(err, KC_ERR_IO, errno, "removing %s/%s", dir, rel);
        }
        rel[rlen] = '\0';
    }
    closedir(d);
    return rc;
}

/* ---- overlapping the fetch ---------------------------------------------- */

struct kc_snap_gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t committed;
    bool finished, ok;
    uint64_t *pos; /* per entry: its place in the fetch order */
    /* writing files straight from the fetch (kc_snap_gate_sink) */
    const kc_snap_manifest *m;
    const uint8_t *state;
    const char *dir;
    int root; /* -1 until a sink is made */
    unsigned umask;
    const kc_snap_entry **by_key; /* the state-0 file entries, sorted by key */
    size_t nkey;
    atomic_uchar *direct; /* per entry: DIRECT_* */
};

enum { DIRECT_NONE, DIRECT_WRITING, DIRECT_DONE };

kc_snap_gate *kc_snap_gate_new(const kc_snap_manifest *m, const uint8_t *state)
{
    kc_snap_gate *g = calloc(1, sizeof *g);
    if (g)
        g->pos = malloc((m->n ? m->n : 1) * sizeof *g->pos);
    if (!g || !g->pos) {
        free(g);
        return NULL;
    }
    uint64_t k = 0;
    for (size_t i = 0; i < m->n; i++)
        g->pos[i] = m->e[i].type == KC_SNAP_FILE && state[i] == 0 ? k++ : 0;
    g->m = m;
    g->state = state;
    g->root = -1;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    return g;
}

void kc_snap_gate_advance(kc_snap_gate *g, uint64_t committed)
{
    pthread_mutex_lock(&g->mu);
    if (committed > g->committed) {
        g->committed = committed;
        pthread_cond_broadcast(&g->cv);
    }
    pthread_mutex_unlock(&g->mu);
}

void kc_snap_gate_finish(kc_snap_gate *g, bool ok)
{
    pthread_mutex_lock(&g->mu);
    g->finished = true;
    g->ok = ok;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

void kc_snap_gate_free(kc_snap_gate *g)
{
    if (!g)
        return;
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    if (g->root >= 0)
        close(g->root);
    free(g->by_key);
    free(g->direct);
    free(g->pos);
    free(g);
}

/* One file being written straight from the fetch. */
typedef struct direct_file {
    kc_snap_gate *g;
    size_t i; /* its entry */
    walker w;
    int dfd, fd, werr;
    char tmp[64];
} direct_file;

static int by_key_cmp(const void *a, const void *b)
{
    return strcmp((*(const kc_snap_entry *const *)a)->key, (*(const kc_snap_entry *const *)b)->key);
}

static int key_probe_cmp(const void *key, const void *elem)
{
    return strcmp(key, (*(const kc_snap_entry *const *)elem)->key);
}

/* Claims the first state-0 entry for key that no one writes yet and whose
 * manifest content is what the stream says it brings (sha, size); SIZE_MAX
 * when none (the restore then takes it from the store, and says what is
 * wrong). */
static size_t direct_claim(kc_snap_gate *g, const char *key, uint64_t len,
                           const uint8_t sha[KC_SHA256_LEN])
{
    const kc_snap_entry *const *hit =
        bsearch(key, g->by_key, g->nkey, sizeof *g->by_key, key_probe_cmp);
    if (!hit)
        return SIZE_MAX;
    while (hit > g->by_key && strcmp(hit[-1]->key, key) == 0)
        hit--;
    char hex[KC_KEY_HEX_LEN + 1];
    kc_hex_encode(sha, KC_SHA256_LEN, hex);
    for (; hit < g->by_key + g->nkey && strcmp((*hit)->key, key) == 0; hit++) {
        size_t i = (size_t)(*hit - g->m->e);
        unsigned char none = DIRECT_NONE;
        if ((*hit)->size == len && strcmp((*hit)->sha, hex) == 0 &&
            atomic_compare_exchange_strong(&g->direct[i], &none, DIRECT_WRITING))
            return i;
    }
    return SIZE_MAX;
}

static void *direct_open(void *ctx, const char *key, const char *kind, uint64_t len,
                         const uint8_t sha[KC_SHA256_LEN])
{
    kc_snap_gate *g = ctx;
    if (strcmp(kind, KC_SNAP_KIND_FILE) != 0)
        return NULL;
    size_t i = direct_claim(g, key, len, sha);
    if (i == SIZE_MAX)
        return NULL;
    direct_file *f = calloc(1, sizeof *f);
    if (f) {
        *f = (direct_file){.g = g, .i = i, .fd = -1};
        f->w = (walker){.root = g->root, .dir = g->dir, .curfd = g->root, .umask = g->umask};
        char parent[KC_SNAP_PATH_MAX + 1];
        split(g->m->e[i].path, parent);
        kc_err ignore; /* the restore retries from the store and reports it */
        if (walk_to(&f->w, parent, true, &f->dfd, &ignore) == KC_OK &&
            tmp_open(&f->w, f->dfd, &g->m->e[i], &f->fd, f->tmp, &ignore) == KC_OK)
            return f;
        walker_close(&f->w);
        free(f);
    }
    atomic_store(&g->direct[i], DIRECT_NONE);
    return NULL;
}

static int direct_write(void *handle, const uint8_t *data, size_t n)
{
    direct_file *f = handle;
    if (!f->werr)
        f->werr = write_all(f->fd, data, n);
    return f->werr;
}

/* Renames the file into place only when the import proved its bytes. */
static void direct_close(void *handle, bool ok)
{
    direct_file *f = handle;
    kc_snap_gate *g = f->g;
    const kc_snap_entry *e = &g->m->e[f->i];
    char parent[KC_SNAP_PATH_MAX + 1];
    const char *base = split(e->path, parent);
    kc_err ignore;
    bool done = tmp_commit(&f->w, f->dfd, e, base, f->fd, f->tmp, ok ? f->werr : ECANCELED,
                           &ignore) == KC_OK;
    atomic_store(&g->direct[f->i], done ? DIRECT_DONE : DIRECT_NONE);
    walker_close(&f->w);
    free(f);
}

kc_code kc_snap_gate_sink(kc_snap_gate *g, const char *dir, kc_bundle_sink *sink, kc_err *err)
{
    const kc_snap_manifest *m = g->m;
    g->by_key = malloc((m->n ? m->n : 1) * sizeof *g->by_key);
    g->direct = calloc(m->n ? m->n : 1, sizeof *g->direct);
    if (!g->by_key || !g->direct)
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory restoring %s", dir);
    g->nkey = 0;
    for (size_t i = 0; i < m->n; i++)
        if (m->e[i].type == KC_SNAP_FILE && g->state[i] == 0)
            g->by_key[g->nkey++] = &m->e[i];
    qsort(g->by_key, g->nkey, sizeof *g->by_key, by_key_cmp);
    walker w = {.root = -1, .curfd = -1};
    kc_code rc = open_root(dir, true, &w, err);
    if (rc != KC_OK)
        return rc;
    g->root = w.root;
    g->dir = dir;
    g->umask = current_umask();
    *sink = (kc_bundle_sink){direct_open, direct_write, direct_close, g};
    return KC_OK;
}

/* True when the fetch already wrote entry i into DIR (kc_snap_gate_sink). */
static bool gate_direct(const kc_snap_gate *g, size_t i)
{
    return g->direct && atomic_load(&g->direct[i]) == DIRECT_DONE;
}

/* Waits until entry i has been fetched (the stream keeps the request's
 * order, so the first committed count past its place means it is stored;
 * an absent key only makes later entries wait longer) or the fetch ended.
 * False when the fetch failed first. */
static bool gate_wait(kc_snap_gate *g, size_t i)
{
    pthread_mutex_lock(&g->mu);
    while (!g->finished && g->committed <= g->pos[i])
        pthread_cond_wait(&g->cv, &g->mu);
    bool ok = g->committed > g->pos[i] || g->ok;
    pthread_mutex_unlock(&g->mu);
    return ok;
}

/* The file part of a restore, shared by its worker threads: each takes the
 * next chunk of entries, with a store handle and a walker of its own. */
typedef struct restore_job {
    const kc_snap_manifest *m;
    const uint8_t *state;
    const char *dir, *store_dir;
    kc_snap_gate *gate;
    int root;
    unsigned umask;
    atomic_size_t next;
    atomic_bool stop;
    atomic_uint_fast64_t done, written, unchanged, bytes;
    pthread_mutex_t mu;
    kc_code rc; /* the first failure */
    kc_err err;
    const char *failed_at;
} restore_job;

#define RESTORE_CHUNK 64

static void job_fail(restore_job *j, kc_code rc, const kc_err *e, const char *path)
{
    pthread_mutex_lock(&j->mu);
    if (j->rc == KC_OK) {
        j->rc = rc;
        j->err = *e;
        j->failed_at = path;
    }
    pthread_mutex_unlock(&j->mu);
    atomic_store(&j->stop, true);
}

/* Writes file entry e from s into DIR through w. */
static kc_code restore_file(kc_store *s, walker *w, const kc_snap_entry *e, uint64_t *bytes,
                            kc_err *err)
{
    kc_artifact a;
    kc_code rc = kc_store_get(s, e->key, &a, err);
    if (rc == KC_ERR_NOT_FOUND)
        return kc_err_set(err, KC_ERR_NOT_FOUND, "the content of %s (%s) is not in the store",
                          e->path, e->key);
    if (rc != KC_OK)
        return rc;
    char sha[KC_KEY_HEX_LEN + 1];
    kc_hex_encode(a.payload_sha, KC_SHA256_LEN, sha);
    if (strcmp(sha, e->sha) != 0 || a.payload_len != e->size ||
        strcmp(a.kind, KC_SNAP_KIND_FILE) != 0) {
        rc =
            kc_err_set(err, KC_ERR_CORRUPT,
                       "artifact %s is not the content the manifest names for %s", e->key, e->path);
    } else {
        char parent[KC_SNAP_PATH_MAX + 1];
        const char *base = split(e->path, parent);
        int dfd;
        rc = walk_to(w, parent, true, &dfd, err);
        if (rc == KC_OK)
            rc = write_one(w, dfd, e, base, a.payload, a.payload_len, err);
        *bytes = a.payload_len;
    }
    kc_artifact_free(&a);
    return rc;
}

static void restore_files(restore_job *j, kc_store *s)
{
    walker w = {.root = j->root, .dir = j->dir, .curfd = j->root, .umask = j->umask};
    kc_store *own = NULL;
    kc_err err = {0};
    if (!s && kc_store_open(j->store_dir, NULL, &own, &err) != KC_OK) {
        job_fail(j, err.code, &err, NULL);
        return;
    }
    if (!s)
        s = own;
    while (!atomic_load(&j->stop)) {
        size_t from = atomic_fetch_add(&j->next, RESTORE_CHUNK);
        if (from >= j->m->n)
            break;
        size_t to = from + RESTORE_CHUNK < j->m->n ? from + RESTORE_CHUNK : j->m->n;
        for (size_t i = from; i < to && !atomic_load(&j->stop); i++) {
            const kc_snap_entry *e = &j->m->e[i];
            if (e->type != KC_SNAP_FILE)
                continue;
            if (j->state[i] & KC_SNAP_HAVE_DIR) {
                atomic_fetch_add(&j->unchanged, 1);
                atomic_fetch_add(&j->done, 1);
                continue;
            }
            if (j->gate && j->state[i] == 0 && gate_direct(j->gate, i)) {
                /* written and proved by the fetch (kc_snap_gate_sink) */
                atomic_fetch_add(&j->written, 1);
                atomic_fetch_add(&j->bytes, e->size);
                atomic_fetch_add(&j->done, 1);
                continue;
            }
            if (j->gate && j->state[i] == 0 && !gate_wait(j->gate, i)) {
                kc_err_set(&err, KC_ERR_REMOTE, "the fetch ended before %s arrived", e->path);
                job_fail(j, KC_ERR_REMOTE, &err, e->path);
                break;
            }
            uint64_t n = 0;
            kc_code rc = restore_file(s, &w, e, &n, &err);
            if (rc != KC_OK) {
                job_fail(j, rc, &err, e->path);
                break;
            }
            atomic_fetch_add(&j->written, 1);
            atomic_fetch_add(&j->bytes, n);
            atomic_fetch_add(&j->done, 1);
        }
    }
    walker_close(&w);
    kc_store_close(own);
}

static void *restore_thread(void *arg)
{
    restore_files(arg, NULL);
    return NULL;
}

kc_code kc_snap_restore(kc_store *s, const kc_snap_manifest *m, const char *dir,
                        const uint8_t *state, const kc_snap_restore_opts *o,
                        kc_snap_restore_stats *st, kc_err *err)
{
    kc_snap_restore_opts none = {0};
    kc_snap_restore_stats local = {0};
    if (!o)
        o = &none;
    if (!st)
        st = &local;
    memset(st, 0, sizeof *st);
    st->files = m->nfiles;
    uint8_t *own = NULL;
    kc_code rc = KC_OK;
    if (!state) {
        own = malloc(m->n ? m->n : 1);
        if (!own)
            return kc_err_set(err, KC_ERR_NOMEM, "out of memory restoring %s", dir);
        rc = kc_snap_plan(s, m, dir, own, NULL, err);
        state = own;
    }
    walker w = {.root = -1, .curfd = -1};
    if (rc == KC_OK)
        rc = open_root(dir, true, &w, err);
    if (rc != KC_OK) {
        free(own);
        return rc;
    }
    const char *failed_at = NULL;
    /* directories first (sorted: parents before children) */
    for (size_t i = 0; rc == KC_OK && i < m->n; i++) {
        int dfd;
        if (m->e[i].type == KC_SNAP_DIR &&
            (rc = walk_to(&w, m->e[i].path, true, &dfd, err)) != KC_OK)
            failed_at = m->e[i].path;
    }
    walker_close(&w);
    /* then the files, on up to KC_SNAP_RESTORE_THREADS threads: creating and
     * renaming files waits on the file system more than on the CPU */
    restore_job j = {.m = m,
                     .state = state,
                     .dir = dir,
                     .gate = o->gate,
                     .root = w.root,
                     .umask = current_umask()};
    pthread_mutex_init(&j.mu, NULL);
    char store_dir[PATH_MAX];
    snprintf(store_dir, sizeof store_dir, "%s", kc_store_db_path(s));
    char *slash = strrchr(store_dir, '/');
    if (slash)
        *slash = '\0';
    j.store_dir = store_dir;
    pthread_t th[KC_SNAP_RESTORE_THREADS];
    int nth = 0;
    if (rc == KC_OK) {
        size_t left = 0; /* files to take from the store */
        for (size_t i = 0; i < m->n; i++)
            left += m->e[i].type == KC_SNAP_FILE && !(state[i] & KC_SNAP_HAVE_DIR) &&
                    !(o->gate && gate_direct(o->gate, i));
        size_t want = left / (4 * RESTORE_CHUNK);
        while (slash && (size_t)nth < want && nth < KC_SNAP_RESTORE_THREADS - 1 &&
               pthread_create(&th[nth], NULL, restore_thread, &j) == 0)
            nth++;
        restore_files(&j, o->gate ? NULL : s);
        for (int t = 0; t < nth; t++)
            pthread_join(th[t], NULL);
        if (j.rc != KC_OK) {
            rc = j.rc;
            if (err)
                *err = j.err;
            failed_at = j.failed_at ? j.failed_at : "opening the store";
        }
    }
    pthread_mutex_destroy(&j.mu);
    st->written = atomic_load(&j.written);
    st->unchanged = atomic_load(&j.unchanged);
    st->bytes = atomic_load(&j.bytes);
    uint64_t done = atomic_load(&j.done);
    /* directory modes last, deepest first, so a read-only directory does not
     * stop its own files from being written */
    for (size_t i = m->n; rc == KC_OK && i-- > 0;) {
        int dfd;
        if (m->e[i].type == KC_SNAP_DIR &&
            (rc = walk_to(&w, m->e[i].path, true, &dfd, err)) == KC_OK &&
            fchmod(dfd, m->e[i].mode) != 0)
            rc = kc_err_errno(err, KC_ERR_IO, errno, "chmod %s/%s", dir, m->e[i].path);
    }
    walker_close(&w);
    if (rc == KC_OK && o->exact) {
        char rel[KC_SNAP_PATH_MAX + 2] = "";
        rc = prune(m, o, w.root, rel, 0, st, dir, err);
    }
    close(w.root);
    free(own);
    if (rc != KC_OK && failed_at)
        kc_err_prefix(err,
                      "restoring %s: %llu of %zu files in place when it stopped at %s; every "
                      "file in the directory is whole",
                      dir, (unsigned long long)done, m->nfiles, failed_at);
    return rc;
}
