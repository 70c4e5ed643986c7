/*
 * snapshot.c - kcache.snapshot (python/kcache/snapshot.py): a framework's cache directory
 * pushed, pulled, checked and explained as `kcache dir` does, over the same library
 * (client/kc_snap.h), so the same rules hold: a directory another user owns or can write
 * is refused (TrustError) unless trust_shared_dir, modes never grant group/other write
 * unless allow_shared_write, a manifest counts only for the slot its signed bytes name.
 * Each call runs without the GIL.
 */
#include "kcpy.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

#include <kcache/kc_backend.h>
#include <kcache/kc_snap.h>
#include <kcache/kc_util.h>

/* What a call was given, as the library takes it. */
typedef struct snap_args {
    PyObject *dirb; /* the directory as bytes (owned), or NULL */
    const char *name, *version_key, *device_key, *preset_name;
    const kc_snap_preset *preset;
    PyObject *remote_arg, *store_arg;
    int trust_shared_dir, allow_shared_write, recheck, exact, verify;
    kcpy_store *st;
    kcpy_remote *rm;
    char dirbuf[PATH_MAX];
    char devbuf[512];
} snap_args;

/* This machine's CPU fingerprint id, the tool's default device key (cmd_dir.c). */
static kc_code cpu_device_id(const char *cache_dir, char *buf, size_t cap, kc_err *err)
{
    char state[PATH_MAX];
    snprintf(state, sizeof state, "%s/state", cache_dir);
    kc_err ignore = {0};
    kc_backend_opts bo = {.target = "native",
                          .state_dir = kc_mkdirs(state, &ignore) == KC_OK ? state : NULL};
    kc_code rc = kc_backend_device_id("cpu", &bo, buf, cap, err);
    if (rc != KC_OK)
        kc_err_prefix(err, "no device fingerprint for the snapshot key (give device_key)");
    return rc;
}

/* The remote argument: a Remote, a URL, or None for $KCACHE_REMOTE (none when unset). */
static int remote_of(PyObject *arg, kcpy_remote **out)
{
    *out = NULL;
    if (arg && PyObject_TypeCheck(arg, &kcpy_RemoteType)) {
        Py_INCREF(arg);
        *out = (kcpy_remote *)arg;
        return 0;
    }
    if (!arg || arg == Py_None) {
        const char *env = getenv("KCACHE_REMOTE");
        if (!env || !*env)
            return 0;
    }
    *out = (kcpy_remote *)PyObject_CallFunctionObjArgs((PyObject *)&kcpy_RemoteType,
                                                       arg ? arg : Py_None, NULL);
    return *out ? 0 : -1;
}

/* Checks the words, finds the preset and the directory, opens the Store and the
 * Remote (with_remote). A name that is a preset's and no preset means that preset,
 * as the tool has it. -1 with an exception set. */
static int prepare(snap_args *a, PyObject *dir, bool need_dir, bool with_remote)
{
    kc_err err = {0};
    if (dir && dir != Py_None) {
        if (!PyUnicode_FSConverter(dir, &a->dirb))
            return -1;
    }
    if (!a->preset_name && kc_snap_preset_find(a->name))
        a->preset_name = a->name;
    if (a->preset_name && !(a->preset = kc_snap_preset_find(a->preset_name))) {
        kcpy_raise_msg(KC_ERR_INVALID, "unknown preset '%s' (%s)", a->preset_name,
                       kc_snap_preset_names());
        return -1;
    }
    if (need_dir && !a->dirb &&
        !(a->preset && kc_snap_preset_dir(a->preset, a->dirbuf, sizeof a->dirbuf))) {
        kcpy_raise_msg(KC_ERR_INVALID, "snapshot '%s': give dir%s%s", a->name,
                       a->preset ? " or set $" : "",
                       a->preset ? kc_snap_preset_env(a->preset) : "");
        return -1;
    }
    if (kc_snapshot_check_ident("name", a->name, true, &err) != KC_OK ||
        kc_snapshot_check_ident("version_key", a->version_key, false, &err) != KC_OK ||
        (a->device_key &&
         kc_snapshot_check_ident("device_key", a->device_key, false, &err) != KC_OK)) {
        kcpy_raise(&err);
        return -1;
    }
    if (!(a->st = kcpy_store_from(a->store_arg)))
        return -1;
    if (with_remote && remote_of(a->remote_arg, &a->rm) < 0)
        return -1;
    return 0;
}

static const char *dir_of(const snap_args *a)
{
    return a->dirb ? PyBytes_AS_STRING(a->dirb) : a->dirbuf;
}

static void finish(snap_args *a)
{
    Py_XDECREF(a->dirb);
    Py_XDECREF((PyObject *)a->st);
    Py_XDECREF((PyObject *)a->rm);
}

/* Borrows the handles, fills o and the device key; runs fn; gives them back. Without
 * the GIL. */
typedef kc_code (*snap_fn)(const kc_snap_opts *o, void *res, kc_err *err);

static kc_code run(snap_args *a, bool need_store, snap_fn fn, void *res, kc_snap_opts *used,
                   kc_err *err)
{
    kc_store *s = kcpy_store_borrow(a->st, err);
    kc_remote *r = s && a->rm ? kcpy_remote_borrow(a->rm, err) : NULL;
    kc_code rc = !s || (a->rm && !r) ? err->code : KC_OK;
    if (rc == KC_OK && !a->device_key &&
        (rc = cpu_device_id(a->st->path, a->devbuf, sizeof a->devbuf, err)) == KC_OK)
        a->device_key = a->devbuf;
    kc_snap_opts o = {.store = need_store ? s : NULL,
                      .cache_dir = a->st->path,
                      .remote = r,
                      .name = a->name,
                      .device_key = a->device_key,
                      .version_key = a->version_key,
                      .dir = dir_of(a),
                      .preset = a->preset,
                      .trust_shared_dir = a->trust_shared_dir,
                      .allow_shared_write = a->allow_shared_write,
                      .recheck = a->recheck,
                      .exact = a->exact,
                      .verify = a->verify};
    if (rc == KC_OK)
        rc = fn(&o, res, err);
    *used = o;
    if (a->rm)
        kcpy_remote_return(a->rm, r);
    kcpy_store_return(a->st, s);
    return rc;
}

static PyObject *key_words(const snap_args *a, const char *slot)
{
    return Py_BuildValue("{s:s,s:s,s:s,s:s}", "name", a->name, "device_key", a->device_key,
                         "version_key", a->version_key, "snapshot", slot);
}

/* d with the items of more added (both new references, stolen); NULL on error. */
static PyObject *with(PyObject *d, PyObject *more)
{
    if (d && more && PyDict_Update(d, more) == 0) {
        Py_DECREF(more);
        return d;
    }
    Py_XDECREF(d);
    Py_XDECREF(more);
    return NULL;
}

static kc_code do_push(const kc_snap_opts *o, void *res, kc_err *err)
{
    return kc_snap_push(o, res, err);
}

PyObject *kcpy_snapshot_push(PyObject *module, PyObject *args, PyObject *kwargs)
{
    (void)module;
    static char *kw[] = {"dir",    "name",  "version_key",      "device_key", "preset",
                         "remote", "store", "trust_shared_dir", "recheck",    NULL};
    snap_args a = {.remote_arg = Py_None, .store_arg = Py_None};
    PyObject *dir;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "Oss|$zzOOpp:push", kw, &dir, &a.name,
                                     &a.version_key, &a.device_key, &a.preset_name, &a.remote_arg,
                                     &a.store_arg, &a.trust_shared_dir, &a.recheck))
        return NULL;
    PyObject *out = NULL;
    if (prepare(&a, dir, true, true) == 0) {
        kc_snap_push_result res;
        kc_snap_opts o;
        kc_err err = {0};
        kc_code rc;
        Py_BEGIN_ALLOW_THREADS;
        rc = run(&a, false, do_push, &res, &o, &err);
        Py_END_ALLOW_THREADS;
        kcpy_flush_log();
        if (rc != KC_OK) {
            kcpy_raise(&err);
        } else {
            const kc_snap_scan_stats *ss = &res.scan;
            out = with(
                key_words(&a, res.slot),
                Py_BuildValue(
                    "{s:s,s:O,s:O,s:N,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K}", "manifest", res.manifest,
                    "manifest_sent", res.manifest_sent ? Py_True : Py_False, "unchanged",
                    res.unchanged ? Py_True : Py_False, "dir", PyUnicode_DecodeFSDefault(o.dir),
                    "files", (unsigned long long)ss->files, "dirs", (unsigned long long)ss->dirs,
                    "bytes", (unsigned long long)ss->bytes, "excluded",
                    (unsigned long long)ss->excluded, "special", (unsigned long long)ss->special,
                    "files_sent", (unsigned long long)res.sent.uploaded, "files_skipped",
                    (unsigned long long)res.sent.skipped, "bytes_sent",
                    (unsigned long long)res.sent.bytes));
        }
    }
    finish(&a);
    return out;
}

static kc_code do_pull(const kc_snap_opts *o, void *res, kc_err *err)
{
    return kc_snap_pull(o, res, err);
}

PyObject *kcpy_snapshot_pull(PyObject *module, PyObject *args, PyObject *kwargs)
{
    (void)module;
    static char *kw[] = {
        "name",  "dir",    "version_key",      "device_key",         "preset", "remote", "store",
        "exact", "verify", "trust_shared_dir", "allow_shared_write", NULL};
    snap_args a = {.remote_arg = Py_None, .store_arg = Py_None};
    PyObject *dir = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "sOs|$zzOOpppp:pull", kw, &a.name, &dir,
                                     &a.version_key, &a.device_key, &a.preset_name, &a.remote_arg,
                                     &a.store_arg, &a.exact, &a.verify, &a.trust_shared_dir,
                                     &a.allow_shared_write))
        return NULL;
    PyObject *out = NULL;
    if (prepare(&a, dir, true, true) == 0) {
        kc_snap_pull_result res;
        kc_snap_opts o;
        kc_err err = {0};
        kc_code rc;
        Py_BEGIN_ALLOW_THREADS;
        rc = run(&a, true, do_pull, &res, &o, &err);
        Py_END_ALLOW_THREADS;
        kcpy_flush_log();
        if (rc != KC_OK) {
            kcpy_raise(&err);
        } else {
            out = with(key_words(&a, res.slot),
                       Py_BuildValue("{s:s,s:N,s:n,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:n}", "manifest",
                                     res.manifest, "dir", PyUnicode_DecodeFSDefault(o.dir), "files",
                                     (Py_ssize_t)res.files, "bytes", (unsigned long long)res.bytes,
                                     "files_received", (unsigned long long)res.files_received,
                                     "bytes_received", (unsigned long long)res.bytes_received,
                                     "written", (unsigned long long)res.restore.written,
                                     "unchanged", (unsigned long long)res.restore.unchanged,
                                     "removed", (unsigned long long)res.restore.removed,
                                     "bytes_written", (unsigned long long)res.restore.bytes,
                                     "missing", (Py_ssize_t)res.missing));
        }
    }
    finish(&a);
    return out;
}

static kc_code do_status(const kc_snap_opts *o, void *res, kc_err *err)
{
    return kc_snap_status(o, res, err);
}

static kc_code do_explain(const kc_snap_opts *o, void *res, kc_err *err)
{
    return kc_snap_explain(o, res, err);
}

/* What exists of the name (kc_snap_nearest) as a list of dicts. */
static PyObject *nearest(const kc_snap_near *near, size_t n)
{
    PyObject *list = PyList_New(0);
    for (size_t i = 0; list && i < n; i++) {
        PyObject *d = Py_BuildValue("{s:s,s:s,s:s}", "device_key", near[i].device_key,
                                    "version_key", near[i].version_key, "differs", near[i].differs);
        if (!d || PyList_Append(list, d) < 0)
            Py_CLEAR(list);
        Py_XDECREF(d);
    }
    return list;
}

/* status() and explain(): one shape, status comparing dir, explain asking the server. */
static PyObject *info_call(PyObject *args, PyObject *kwargs, bool explain)
{
    static char *kw_status[] = {"name",   "dir",   "version_key",      "device_key",
                                "preset", "store", "trust_shared_dir", NULL};
    static char *kw_explain[] = {"name",   "version_key", "device_key", "preset",
                                 "remote", "store",       NULL};
    snap_args a = {.remote_arg = Py_None, .store_arg = Py_None};
    PyObject *dir = Py_None;
    int ok = explain
                 ? PyArg_ParseTupleAndKeywords(args, kwargs, "ss|$zzOO:explain", kw_explain,
                                               &a.name, &a.version_key, &a.device_key,
                                               &a.preset_name, &a.remote_arg, &a.store_arg)
                 : PyArg_ParseTupleAndKeywords(args, kwargs, "sOs|$zzOp:status", kw_status, &a.name,
                                               &dir, &a.version_key, &a.device_key, &a.preset_name,
                                               &a.store_arg, &a.trust_shared_dir);
    if (!ok)
        return NULL;
    PyObject *out = NULL;
    if (prepare(&a, explain ? NULL : dir, !explain, explain) == 0) {
        kc_snap_info info;
        kc_snap_opts o;
        kc_snap_near *near = NULL;
        size_t nn = 0;
        kc_err err = {0};
        kc_code rc;
        Py_BEGIN_ALLOW_THREADS;
        rc = run(&a, true, explain ? do_explain : do_status, &info, &o, &err);
        if (explain && (rc == KC_OK || rc == KC_ERR_REMOTE) && !info.found) {
            kc_store *s = kcpy_store_borrow(a.st, &err);
            o.store = s;
            kc_err ignore = {0};
            if (s)
                kc_snap_nearest(&o, &near, &nn, &ignore);
            kcpy_store_return(a.st, s);
        }
        Py_END_ALLOW_THREADS;
        kcpy_flush_log();
        /* explain: an unreachable server answers like one without the snapshot, as
         * `kcache dir explain` has it */
        if (rc != KC_OK && !(explain && rc == KC_ERR_REMOTE)) {
            kcpy_raise(&err);
        } else if (explain) {
            out = with(
                key_words(&a, info.slot),
                Py_BuildValue("{s:O,s:s,s:n,s:K,s:K,s:N}", "found", info.found ? Py_True : Py_False,
                              "manifest", info.manifest, "files", (Py_ssize_t)info.files, "bytes",
                              (unsigned long long)info.bytes, "refused",
                              (unsigned long long)info.refused, "nearest", nearest(near, nn)));
        } else {
            out =
                with(key_words(&a, info.slot),
                     Py_BuildValue("{s:O,s:s,s:N,s:n,s:K,s:n}", "ok",
                                   info.missing == 0 ? Py_True : Py_False, "manifest",
                                   info.manifest, "dir", PyUnicode_DecodeFSDefault(o.dir), "files",
                                   (Py_ssize_t)info.files, "bytes", (unsigned long long)info.bytes,
                                   "missing", (Py_ssize_t)info.missing));
        }
        free(near);
    }
    finish(&a);
    return out;
}

PyObject *kcpy_snapshot_status(PyObject *module, PyObject *args, PyObject *kwargs)
{
    (void)module;
    return info_call(args, kwargs, false);
}

PyObject *kcpy_snapshot_explain(PyObject *module, PyObject *args, PyObject *kwargs)
{
    (void)module;
    return info_call(args, kwargs, true);
}
