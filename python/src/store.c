/*
 * store.c - kcache.Store: the local store (kc_store.h) of a cache directory, the
 * same one the kcache tool uses by default. A get is one kc_store_get: a small
 * payload is copied into a bytes object, a large one (1 MiB and up) comes back
 * as a read-only memoryview over the library's buffer, so it is never held twice.
 */
#include "kcpy.h"

#include <string.h>

#include <kcache/kc_util.h>

/* ---- handles ---- */

kc_store *kcpy_store_borrow(kcpy_store *st, kc_err *err)
{
    bool closed;
    kc_store *s = kcpy_pool_take(&st->pool, &closed);
    if (s)
        return s;
    if (closed) {
        kc_err_set(err, KC_ERR_INVALID, "store %s is closed", st->path);
        return NULL;
    }
    if (kc_store_open(st->path, &st->opts, &s, err) != KC_OK)
        return NULL;
    kcpy_pool_opened(&st->pool);
    return s;
}

void kcpy_store_return(kcpy_store *st, kc_store *s)
{
    if (s && !kcpy_pool_give(&st->pool, s, true))
        kc_store_close(s);
}

/* ---- construction ---- */

static int size_arg(PyObject *o, const char *what, uint64_t *out)
{
    if (!o || o == Py_None)
        return 0;
    kc_err err = {0};
    if (PyLong_Check(o)) {
        unsigned long long v = PyLong_AsUnsignedLongLong(o);
        if (PyErr_Occurred())
            return -1;
        *out = v;
        return 0;
    }
    if (PyUnicode_Check(o)) {
        if (kc_parse_size(PyUnicode_AsUTF8(o), out, &err) == KC_OK)
            return 0;
        kc_err_prefix(&err, "%s", what);
        kcpy_raise(&err);
        return -1;
    }
    PyErr_Format(PyExc_TypeError, "%s must be an int or a size like '10G'", what);
    return -1;
}

static int store_init(kcpy_store *self, PyObject *args, PyObject *kwargs)
{
    static char *kw[] = {"path", "max_size", "trusted_keys", "read_only", NULL};
    PyObject *path = Py_None, *max_size = Py_None, *trusted = Py_None;
    int read_only = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|O$OOp:Store", kw, &path, &max_size, &trusted,
                                     &read_only))
        return -1;
    if (self->path) {
        PyErr_SetString(PyExc_RuntimeError, "Store.__init__ called twice");
        return -1;
    }
    kcpy_pool_init(&self->pool);
    PyObject *pathb = NULL;
    if (path == Py_None) {
        self->path = kc_store_default_dir();
        if (!self->path) {
            kcpy_raise_msg(KC_ERR_INVALID, "no cache directory: set $KCACHE_DIR or $HOME");
            return -1;
        }
    } else {
        if (!PyUnicode_FSConverter(path, &pathb))
            return -1;
        self->path = strdup(PyBytes_AS_STRING(pathb));
        Py_DECREF(pathb);
    }
    /* as the kcache tool: $KCACHE_MAX_SIZE and $KCACHE_TRUSTED_KEYS unless given */
    if (max_size == Py_None && getenv("KCACHE_MAX_SIZE") && *getenv("KCACHE_MAX_SIZE")) {
        kc_err err = {0};
        if (kc_parse_size(getenv("KCACHE_MAX_SIZE"), &self->opts.max_size, &err) != KC_OK) {
            kc_err_prefix(&err, "KCACHE_MAX_SIZE");
            kcpy_raise(&err);
            return -1;
        }
    } else if (size_arg(max_size, "max_size", &self->opts.max_size) < 0) {
        return -1;
    }
    const char *trust_path = getenv("KCACHE_TRUSTED_KEYS");
    PyObject *trustb = NULL;
    if (trusted != Py_None) {
        if (!PyUnicode_FSConverter(trusted, &trustb))
            return -1;
        trust_path = PyBytes_AS_STRING(trustb);
    }
    kc_err err = {0};
    kc_code rc = KC_OK;
    kc_store *s = NULL;
    self->opts.read_only = read_only;
    self->opts.recover_corrupt = !read_only; /* a damaged client cache starts again empty */
    Py_BEGIN_ALLOW_THREADS;
    if (trust_path && *trust_path)
        rc = kc_trust_load(trust_path, &self->trust, &err);
    self->opts.trust = self->trust;
    if (rc == KC_OK)
        rc = kc_store_open(self->path, &self->opts, &s, &err);
    Py_END_ALLOW_THREADS;
    Py_XDECREF(trustb);
    if (rc != KC_OK) {
        kcpy_raise(&err);
        return -1;
    }
    const char *why, *moved = kc_store_recovered(s, &why);
    if (moved)
        self->recovered = Py_BuildValue("(ss)", moved, why ? why : "");
    kcpy_pool_opened(&self->pool);
    kcpy_store_return(self, s);
    kcpy_flush_log();
    return 0;
}

static void close_all(kcpy_store *self)
{
    void *idle[KCPY_POOL_MAX];
    int n = kcpy_pool_close(&self->pool, idle);
    Py_BEGIN_ALLOW_THREADS;
    for (int i = 0; i < n; i++)
        kc_store_close(idle[i]);
    Py_END_ALLOW_THREADS;
}

static void store_dealloc(kcpy_store *self)
{
    if (self->path)
        close_all(self);
    kc_trust_free(self->trust);
    free(self->path);
    Py_XDECREF(self->recovered);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

kcpy_store *kcpy_store_from(PyObject *arg)
{
    if (arg && PyObject_TypeCheck(arg, &kcpy_StoreType)) {
        Py_INCREF(arg);
        return (kcpy_store *)arg;
    }
    return (kcpy_store *)PyObject_CallFunctionObjArgs((PyObject *)&kcpy_StoreType,
                                                      arg ? arg : Py_None, NULL);
}

/* ---- put / get / has / delete ---- */

static PyObject *store_put(kcpy_store *self, PyObject *args, PyObject *kwargs)
{
    kcpy_put_args p;
    if (kcpy_put_args_parse(&p, args, kwargs) < 0)
        return NULL;
    kc_err err = {0};
    kc_code rc;
    kc_artifact a;
    char out[KC_KEY_HEX_LEN + 1] = "";
    Py_BEGIN_ALLOW_THREADS;
    rc = kcpy_artifact_borrow(&a, p.key, p.kind, p.meta, p.data.buf, (size_t)p.data.len, &err);
    if (rc == KC_OK) {
        kc_store *s = kcpy_store_borrow(self, &err);
        rc = s ? kc_store_put(s, &a, NULL, &err) : err.code;
        kcpy_store_return(self, s);
        memcpy(out, a.key, sizeof out);
        kcpy_artifact_release(&a);
    }
    Py_END_ALLOW_THREADS;
    kcpy_put_args_release(&p);
    if (rc != KC_OK)
        return kcpy_raise(&err);
    kcpy_flush_log();
    return PyUnicode_FromString(out);
}

static PyObject *store_get(kcpy_store *self, PyObject *keyo)
{
    const char *key = kcpy_key_arg(keyo);
    if (!key)
        return NULL;
    kc_err err = {0};
    kc_code rc;
    kc_artifact a = {0};
    Py_BEGIN_ALLOW_THREADS;
    kc_store *s = kcpy_store_borrow(self, &err);
    rc = s ? kc_store_get(s, key, &a, &err) : err.code;
    kcpy_store_return(self, s);
    Py_END_ALLOW_THREADS;
    if (rc != KC_OK)
        return kcpy_raise(&err);
    kcpy_flush_log();
    return kcpy_payload_of(&a);
}

/* has/delete: one key, one call that answers KC_OK or an error. */
typedef kc_code (*key_fn)(kc_store *, const char *, kc_err *);

static kc_code run_key_fn(kcpy_store *self, key_fn fn, const char *key, kc_err *err)
{
    kc_code rc;
    Py_BEGIN_ALLOW_THREADS;
    kc_store *s = kcpy_store_borrow(self, err);
    rc = s ? fn(s, key, err) : err->code;
    kcpy_store_return(self, s);
    Py_END_ALLOW_THREADS;
    kcpy_flush_log();
    return rc;
}

static PyObject *store_has(kcpy_store *self, PyObject *keyo)
{
    const char *key = kcpy_key_arg(keyo);
    if (!key)
        return NULL;
    kc_err err = {0};
    return kcpy_presence(run_key_fn(self, kc_store_has, key, &err), &err);
}

static int store_contains(kcpy_store *self, PyObject *keyo)
{
    PyObject *r = store_has(self, keyo);
    if (!r)
        return -1;
    int yes = r == Py_True;
    Py_DECREF(r);
    return yes;
}

static PyObject *store_delete(kcpy_store *self, PyObject *keyo)
{
    const char *key = kcpy_key_arg(keyo);
    if (!key)
        return NULL;
    kc_err err = {0};
    if (run_key_fn(self, kc_store_delete, key, &err) != KC_OK)
        return kcpy_raise(&err);
    Py_RETURN_NONE;
}

/* ---- listing and statistics ---- */

/* The walk runs without the GIL, so it copies each entry; the Python list is
 * built afterwards. */
typedef struct entry_copy {
    kc_entry_info info;
    char *device, *tag, *origin, *sig; /* owned copies of the callback-only strings */
} entry_copy;

typedef struct list_ctx {
    entry_copy *v;
    size_t n, cap;
    bool nomem;
} list_ctx;

static char *dup_or_empty(const char *s)
{
    return strdup(s ? s : "");
}

static int list_one(const kc_entry_info *e, void *ctx)
{
    list_ctx *c = ctx;
    if (c->n == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 256;
        entry_copy *v = realloc(c->v, cap * sizeof *v);
        if (!v) {
            c->nomem = true;
            return 1;
        }
        c->v = v;
        c->cap = cap;
    }
    entry_copy *x = &c->v[c->n++];
    x->info = *e;
    x->device = dup_or_empty(e->device);
    x->tag = dup_or_empty(e->tag);
    x->origin = dup_or_empty(e->origin);
    x->sig = dup_or_empty(e->sig);
    if (!x->device || !x->tag || !x->origin || !x->sig)
        c->nomem = true;
    return c->nomem;
}

static PyObject *entry_object(const entry_copy *x, bool full)
{
    const kc_entry_info *e = &x->info;
    if (!full)
        return PyUnicode_FromString(e->key);
    return Py_BuildValue("{s:s,s:s,s:s,s:s,s:K,s:K,s:L,s:L,s:s,s:s}", "key", e->key, "kind",
                         e->kind, "device", x->device, "tag", x->tag, "size",
                         (unsigned long long)e->size, "stored_size",
                         (unsigned long long)e->stored_size, "created", (long long)e->created,
                         "atime", (long long)e->atime, "origin", x->origin, "sig", x->sig);
}

static PyObject *list_entries(kcpy_store *self, PyObject *args, PyObject *kwargs, bool full)
{
    static char *kw[] = {"kind", "device", "tag", "since", NULL};
    kc_filter f = {0};
    long long since = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|$zzzL", kw, &f.kind, &f.device, &f.tag,
                                     &since))
        return NULL;
    f.since = since;
    list_ctx c = {0};
    kc_err err = {0};
    kc_code rc;
    Py_BEGIN_ALLOW_THREADS;
    kc_store *s = kcpy_store_borrow(self, &err);
    rc = s ? kc_store_list(s, &f, list_one, &c, &err) : err.code;
    kcpy_store_return(self, s);
    Py_END_ALLOW_THREADS;
    PyObject *out = NULL;
    if (c.nomem)
        PyErr_NoMemory();
    else if (rc != KC_OK)
        kcpy_raise(&err);
    else
        out = PyList_New((Py_ssize_t)c.n);
    for (size_t i = 0; i < c.n; i++) {
        PyObject *item = out ? entry_object(&c.v[i], full) : NULL;
        if (item)
            PyList_SET_ITEM(out, (Py_ssize_t)i, item);
        else
            Py_CLEAR(out);
        free(c.v[i].device);
        free(c.v[i].tag);
        free(c.v[i].origin);
        free(c.v[i].sig);
    }
    free(c.v);
    return out;
}

static PyObject *store_keys(kcpy_store *self, PyObject *args, PyObject *kwargs)
{
    return list_entries(self, args, kwargs, false);
}

static PyObject *store_entries(kcpy_store *self, PyObject *args, PyObject *kwargs)
{
    return list_entries(self, args, kwargs, true);
}

static PyObject *store_iter(kcpy_store *self)
{
    PyObject *empty = PyTuple_New(0);
    PyObject *keys = empty ? list_entries(self, empty, NULL, false) : NULL;
    Py_XDECREF(empty);
    if (!keys)
        return NULL;
    PyObject *it = PyObject_GetIter(keys);
    Py_DECREF(keys);
    return it;
}

static kc_code stats_of(kcpy_store *self, kc_store_stats *st, kc_err *err)
{
    kc_code rc;
    Py_BEGIN_ALLOW_THREADS;
    kc_store *s = kcpy_store_borrow(self, err);
    rc = s ? kc_store_stats_get(s, st, err) : err->code;
    kcpy_store_return(self, s);
    Py_END_ALLOW_THREADS;
    return rc;
}

static PyObject *store_stats(kcpy_store *self, PyObject *unused)
{
    (void)unused;
    kc_err err = {0};
    kc_store_stats st;
    if (stats_of(self, &st, &err) != KC_OK)
        return kcpy_raise(&err);
    return Py_BuildValue(
        "{s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K}", "entries", (unsigned long long)st.entries,
        "blobs", (unsigned long long)st.blobs, "logical_bytes",
        (unsigned long long)st.logical_bytes, "stored_bytes", (unsigned long long)st.stored_bytes,
        "file_bytes", (unsigned long long)st.file_bytes, "hits", (unsigned long long)st.hits,
        "misses", (unsigned long long)st.misses, "evictions", (unsigned long long)st.evictions,
        "corrupt", (unsigned long long)st.corrupt, "quarantined",
        (unsigned long long)st.quarantined, "untrusted", (unsigned long long)st.untrusted);
}

static Py_ssize_t store_len(kcpy_store *self)
{
    kc_err err = {0};
    kc_store_stats st;
    if (stats_of(self, &st, &err) != KC_OK) {
        kcpy_raise(&err);
        return -1;
    }
    return (Py_ssize_t)st.entries;
}

static PyObject *store_flush(kcpy_store *self, PyObject *unused)
{
    (void)unused;
    kc_err err = {0};
    kc_code rc;
    Py_BEGIN_ALLOW_THREADS;
    kc_store *s = kcpy_store_borrow(self, &err);
    rc = s ? kc_store_flush(s, &err) : err.code;
    kcpy_store_return(self, s);
    Py_END_ALLOW_THREADS;
    if (rc != KC_OK)
        return kcpy_raise(&err);
    Py_RETURN_NONE;
}

static PyObject *store_close(kcpy_store *self, PyObject *unused)
{
    (void)unused;
    close_all(self);
    kcpy_flush_log();
    Py_RETURN_NONE;
}

static PyObject *store_repr(kcpy_store *self)
{
    return PyUnicode_FromFormat("kcache.Store('%s')", self->path ? self->path : "");
}

static PyObject *get_path(kcpy_store *self, void *closure)
{
    (void)closure;
    return PyUnicode_DecodeFSDefault(self->path ? self->path : "");
}

static PyObject *get_recovered(kcpy_store *self, void *closure)
{
    (void)closure;
    PyObject *r = self->recovered ? self->recovered : Py_None;
    Py_INCREF(r);
    return r;
}

static PyGetSetDef store_getset[] = {
    {"path", (getter)get_path, NULL, "The cache directory.", NULL},
    {"recovered", (getter)get_recovered, NULL,
     "(moved_to, why) when the database was found damaged at open and moved aside (an empty "
     "store took its place, as the kcache tool does); None otherwise.",
     NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyMethodDef store_methods[] = {
    {"put", (PyCFunction)(void (*)(void))store_put, METH_VARARGS | METH_KEYWORDS,
     "put(data, *, kind='blob', meta=None, key=None) -> str\n\n"
     "Stores data (bytes, bytearray, memoryview or any buffer; not copied) as an artifact of "
     "kind (1-32 characters of a-z 0-9 . _ -) with meta (a dict or JSON object text; 'device' "
     "and 'tag' steer filters) and returns its key: key if given (64 lowercase hex), else the "
     "SHA-256 of data, as `kcache put` does. Storing an existing key keeps the first entry. "
     "Raises InvalidError for a bad key, kind or meta, FullError when the size limit cannot be "
     "met."},
    {"get", (PyCFunction)store_get, METH_O,
     "get(key) -> bytes | memoryview\n\nThe payload stored under key, checked against the "
     "checksum recorded at put: bytes below 1 MiB, else a read-only memoryview over the "
     "buffer the store read it into (no second copy). Raises NotFound on a miss, "
     "CorruptError when the stored bytes are damaged (the entry is quarantined), TrustError "
     "when trusted keys are configured and the entry came from a server or bundle without a "
     "trusted signature."},
    {"has", (PyCFunction)store_has, METH_O,
     "has(key) -> bool\n\nWhether key is stored (`key in store` too). Raises TrustError for an "
     "entry from outside that no trusted key signed."},
    {"delete", (PyCFunction)store_delete, METH_O,
     "delete(key) -> None\n\nRemoves the entry. Raises NotFound when absent."},
    {"keys", (PyCFunction)(void (*)(void))store_keys, METH_VARARGS | METH_KEYWORDS,
     "keys(*, kind=None, device=None, tag=None, since=None) -> list[str]\n\n"
     "Keys of the matching entries, in key order (iterating the store gives every key). "
     "device may list several ids separated by commas; since is a Unix time."},
    {"entries", (PyCFunction)(void (*)(void))store_entries, METH_VARARGS | METH_KEYWORDS,
     "entries(*, kind=None, device=None, tag=None, since=None) -> list[dict]\n\n"
     "What `kcache ls --json` prints for the matching entries: key, kind, device, tag, size, "
     "stored_size, created, atime, origin, sig."},
    {"stats", (PyCFunction)store_stats, METH_NOARGS,
     "stats() -> dict\n\nWhat `kcache stats --json` prints: entries, blobs, logical_bytes, "
     "stored_bytes, file_bytes, hits, misses, evictions, corrupt, quarantined, untrusted."},
    {"flush", (PyCFunction)store_flush, METH_NOARGS,
     "flush() -> None\n\nWrites batched access times and counters now (close does it too)."},
    {"close", (PyCFunction)store_close, METH_NOARGS,
     "close() -> None\n\nCloses the store's handles; later calls raise InvalidError."},
    {"__enter__", kcpy_enter, METH_NOARGS, NULL},
    {"__exit__", kcpy_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL}};

static PySequenceMethods store_as_sequence = {
    .sq_length = (lenfunc)store_len,
    .sq_contains = (objobjproc)store_contains,
};

PyTypeObject kcpy_StoreType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kcache.Store",
    .tp_basicsize = sizeof(kcpy_store),
    .tp_dealloc = (destructor)store_dealloc,
    .tp_repr = (reprfunc)store_repr,
    .tp_as_sequence = &store_as_sequence,
    .tp_iter = (getiterfunc)store_iter,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "Store(path=None, *, max_size=None, trusted_keys=None, read_only=False)\n\n"
              "The local artifact store of a cache directory: path, else the directory the "
              "kcache tool uses ($KCACHE_DIR, $XDG_CACHE_HOME/kcache, ~/.cache/kcache). "
              "max_size (bytes or '10G'; default $KCACHE_MAX_SIZE) evicts least-recently-used "
              "entries on put; trusted_keys (a PEM file of Ed25519 public keys; default "
              "$KCACHE_TRUSTED_KEYS) refuses entries from servers and bundles that none of "
              "them signed. Safe to share between threads (each call borrows a handle of its "
              "own and runs without the GIL) and between processes. A context manager.",
    .tp_methods = store_methods,
    .tp_getset = store_getset,
    .tp_init = (initproc)store_init,
    .tp_new = PyType_GenericNew,
};
