/*
 * remote.c - kcache.Remote: a kcached server (or a comma-separated list of them,
 * sharded as the kcache tool does) through the libcurl client (kc_remote.h).
 * Each call borrows a client handle, runs without the GIL, and gives the handle
 * back; a handle that gave up on the server (kc_remote_offline) is closed rather
 * than kept, so the next call tries again instead of failing for the rest of
 * the process, which suits a long-lived Python program better than a command.
 */
#include "kcpy.h"

#include <string.h>

#include <kcache/kc_backend.h>
#include <kcache/kc_util.h>

kc_remote *kcpy_remote_borrow(kcpy_remote *rm, kc_err *err)
{
    bool closed;
    kc_remote *r = kcpy_pool_take(&rm->pool, &closed);
    if (r)
        return r;
    if (closed) {
        kc_err_set(err, KC_ERR_INVALID, "remote %s is closed", rm->shown_url);
        return NULL;
    }
    if (kc_remote_open(rm->conf.url, &rm->opts, &r, err) != KC_OK)
        return NULL;
    kcpy_pool_opened(&rm->pool);
    return r;
}

void kcpy_remote_return(kcpy_remote *rm, kc_remote *r)
{
    if (r && !kcpy_pool_give(&rm->pool, r, !kc_remote_offline(r)))
        kc_remote_close(r);
}

static int opt_path(PyObject *o, char **out)
{
    if (!o || o == Py_None)
        return 0;
    PyObject *b = NULL;
    if (!PyUnicode_FSConverter(o, &b))
        return -1;
    *out = strdup(PyBytes_AS_STRING(b));
    Py_DECREF(b);
    return 0;
}

static int remote_init(kcpy_remote *self, PyObject *args, PyObject *kwargs)
{
    static char *kw[] = {"url",          "token",
                         "token_file",   "ca_file",
                         "client_cert",  "client_key",
                         "trusted_keys", "sign_key",
                         "timeout_ms",   "connect_timeout_ms",
                         "concurrency",  NULL};
    const char *url = NULL, *token = NULL;
    PyObject *token_file = Py_None, *ca = Py_None, *cert = Py_None, *key = Py_None,
             *trusted = Py_None, *sign = Py_None;
    long timeout_ms = 0, connect_ms = 0;
    int concurrency = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|zzOOOOO$Olli:Remote", kw, &url, &token,
                                     &token_file, &ca, &cert, &key, &trusted, &sign, &timeout_ms,
                                     &connect_ms, &concurrency))
        return -1;
    if (self->conf.url) {
        PyErr_SetString(PyExc_RuntimeError, "Remote.__init__ called twice");
        return -1;
    }
    kcpy_pool_init(&self->pool);
    char *token_path = NULL;
    kcpy_remote_conf *c = &self->conf;
    if (opt_path(token_file, &token_path) < 0 || opt_path(ca, &c->ca_file) < 0 ||
        opt_path(cert, &c->client_cert) < 0 || opt_path(key, &c->client_key) < 0 ||
        opt_path(trusted, &c->trusted_keys) < 0 || opt_path(sign, &c->sign_key) < 0) {
        free(token_path);
        return -1;
    }
    kc_err err = {0};
    kc_code rc;
    kc_remote *probe = NULL;
    Py_BEGIN_ALLOW_THREADS;
    rc = kcpy_remote_conf_fill(c, url, token, token_path, &err);
    if (rc == KC_OK && c->trusted_keys)
        rc = kc_trust_load(c->trusted_keys, &self->trust, &err);
    if (rc == KC_OK && c->sign_key)
        rc = kc_signer_load(c->sign_key, &self->signer, &err);
    self->opts = (kc_remote_opts){.token = c->token,
                                  .ca_file = c->ca_file,
                                  .client_cert = c->client_cert,
                                  .client_key = c->client_key,
                                  .connect_timeout_ms = connect_ms,
                                  .timeout_ms = timeout_ms,
                                  .concurrency = concurrency,
                                  .quiet = false, /* its notes reach logging, never the terminal */
                                  .trust = self->trust,
                                  .max_artifact = c->max_artifact,
                                  .signer = self->signer};
    /* a bad URL or token fails here, not at the first call (no traffic yet) */
    if (rc == KC_OK && (rc = kc_remote_open(c->url, &self->opts, &probe, &err)) == KC_OK)
        kcpy_pool_opened(&self->pool);
    Py_END_ALLOW_THREADS;
    free(token_path);
    self->shown_url = kc_remote_redact_url(c->url ? c->url : "");
    if (rc != KC_OK) {
        kcpy_raise(&err);
        return -1;
    }
    kcpy_remote_return(self, probe);
    kcpy_flush_log();
    return 0;
}

static void close_all(kcpy_remote *self)
{
    void *idle[KCPY_POOL_MAX];
    int n = kcpy_pool_close(&self->pool, idle);
    Py_BEGIN_ALLOW_THREADS;
    for (int i = 0; i < n; i++)
        kc_remote_close(idle[i]);
    Py_END_ALLOW_THREADS;
}

static void remote_dealloc(kcpy_remote *self)
{
    if (self->conf.url)
        close_all(self);
    kcpy_remote_conf_free(&self->conf);
    kc_trust_free(self->trust);
    kc_signer_free(self->signer);
    free(self->shown_url);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *remote_put(kcpy_remote *self, PyObject *args, PyObject *kwargs)
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
        uint8_t *env = NULL;
        size_t len = 0;
        memcpy(out, a.key, sizeof out);
        rc = kc_envelope_encode(&a, &env, &len, &err); /* the one copy an upload needs */
        kcpy_artifact_release(&a);
        kc_remote *r = rc == KC_OK ? kcpy_remote_borrow(self, &err) : NULL;
        if (rc == KC_OK)
            rc = r ? kc_remote_put(r, out, env, len, NULL, &err) : err.code;
        kcpy_remote_return(self, r);
        free(env);
    }
    Py_END_ALLOW_THREADS;
    kcpy_put_args_release(&p);
    if (rc != KC_OK)
        return kcpy_raise(&err);
    kcpy_flush_log();
    return PyUnicode_FromString(out);
}

static PyObject *remote_get(kcpy_remote *self, PyObject *keyo)
{
    const char *key = kcpy_key_arg(keyo);
    if (!key)
        return NULL;
    kc_err err = {0};
    kc_code rc;
    kc_artifact a = {0};
    Py_BEGIN_ALLOW_THREADS;
    kc_remote *r = kcpy_remote_borrow(self, &err);
    rc = r ? kc_remote_get(r, key, &a, &err) : err.code;
    kcpy_remote_return(self, r);
    Py_END_ALLOW_THREADS;
    if (rc != KC_OK)
        return kcpy_raise(&err);
    kcpy_flush_log();
    return kcpy_payload_of(&a);
}

static PyObject *remote_has(kcpy_remote *self, PyObject *keyo)
{
    const char *key = kcpy_key_arg(keyo);
    if (!key)
        return NULL;
    kc_err err = {0};
    kc_code rc;
    Py_BEGIN_ALLOW_THREADS;
    kc_remote *r = kcpy_remote_borrow(self, &err);
    rc = r ? kc_remote_has(r, key, &err) : err.code;
    kcpy_remote_return(self, r);
    Py_END_ALLOW_THREADS;
    kcpy_flush_log();
    return kcpy_presence(rc, &err);
}

static PyObject *remote_missing(kcpy_remote *self, PyObject *keys_arg)
{
    PyObject *seq = PySequence_Fast(keys_arg, "missing() takes an iterable of keys");
    if (!seq)
        return NULL;
    Py_ssize_t n;
    const char **keys = kcpy_keys(seq, &n);
    bool *missing = keys ? calloc((size_t)n + 1, sizeof *missing) : NULL;
    PyObject *out = NULL;
    kc_err err = {0};
    kc_code rc = KC_OK;
    if (keys && !missing)
        PyErr_NoMemory();
    if (missing && n > 0) {
        Py_BEGIN_ALLOW_THREADS;
        kc_remote *r = kcpy_remote_borrow(self, &err);
        rc = r ? kc_remote_missing(r, keys, (size_t)n, missing, &err) : err.code;
        kcpy_remote_return(self, r);
        Py_END_ALLOW_THREADS;
    }
    if (missing && rc != KC_OK)
        kcpy_raise(&err);
    else if (missing)
        out = kcpy_keys_where(seq, missing);
    kcpy_flush_log();
    free(keys);
    free(missing);
    Py_DECREF(seq);
    return out;
}

static PyObject *remote_fetch(kcpy_remote *self, PyObject *args, PyObject *kwargs)
{
    static char *kw[] = {"keys", "store", NULL};
    PyObject *keys_arg, *store_arg = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|$O:fetch", kw, &keys_arg, &store_arg))
        return NULL;
    PyObject *seq = PySequence_Fast(keys_arg, "fetch() takes an iterable of keys");
    if (!seq)
        return NULL;
    Py_ssize_t n;
    const char **keys = kcpy_keys(seq, &n);
    bool *fetched = keys ? calloc((size_t)n + 1, sizeof *fetched) : NULL;
    kcpy_store *st = fetched ? kcpy_store_from(store_arg) : NULL;
    PyObject *out = NULL;
    kc_err err = {0};
    kc_code rc = KC_OK;
    if (keys && !fetched)
        PyErr_NoMemory();
    if (st && n > 0) {
        Py_BEGIN_ALLOW_THREADS;
        kc_store *s = kcpy_store_borrow(st, &err);
        kc_remote *r = s ? kcpy_remote_borrow(self, &err) : NULL;
        rc = r ? kc_remote_fetch(r, s, keys, (size_t)n, fetched, NULL, &err) : err.code;
        kcpy_remote_return(self, r);
        kcpy_store_return(st, s);
        Py_END_ALLOW_THREADS;
    }
    if (st && rc != KC_OK)
        kcpy_raise(&err);
    else if (st)
        out = kcpy_keys_where(seq, fetched);
    kcpy_flush_log();
    free(keys);
    free(fetched);
    Py_XDECREF((PyObject *)st);
    Py_DECREF(seq);
    return out;
}

/* ---- pull / push ---- */

#define MAX_DEVICES 64

typedef struct device_list {
    const char *ids[MAX_DEVICES + 1];
    char *owned[MAX_DEVICES];
    int n;
} device_list;

static void device_add(const char *id, const char *what, const char *why, void *ctx)
{
    (void)what;
    (void)why;
    device_list *d = ctx;
    if (!id || d->n == MAX_DEVICES)
        return;
    for (int i = 0; i < d->n; i++)
        if (strcmp(d->ids[i], id) == 0)
            return;
    if ((d->owned[d->n] = strdup(id)))
        d->ids[d->n] = d->owned[d->n], d->n++;
}

static void device_list_free(device_list *d)
{
    for (int i = 0; i < d->n; i++)
        free(d->owned[i]);
    d->n = 0;
}

/* devices: None or "auto" (this machine's fingerprint ids, as `kcache pull`),
 * "all" (no device filter), an id, or a list of ids. *all set for "all". */
static int parse_devices(PyObject *o, device_list *d, bool *auto_ids)
{
    *auto_ids = false;
    d->n = 0;
    if (!o || o == Py_None) {
        *auto_ids = true;
        return 0;
    }
    PyObject *seq = PyUnicode_Check(o)
                        ? PyTuple_Pack(1, o)
                        : PySequence_Fast(o, "devices must be a str or a list of str");
    if (!seq)
        return -1;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        const char *id = PyUnicode_Check(item) ? PyUnicode_AsUTF8(item) : NULL;
        if (!id) {
            Py_DECREF(seq);
            PyErr_SetString(PyExc_TypeError, "devices must be a str or a list of str");
            return -1;
        }
        if (strcmp(id, "auto") == 0)
            *auto_ids = true;
        else if (strcmp(id, "all") != 0)
            device_add(id, NULL, NULL, d);
    }
    Py_DECREF(seq);
    return 0;
}

static PyObject *stats_error(kc_err *err, PyObject *stats)
{
    kcpy_raise(err);
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    PyErr_NormalizeException(&t, &v, &tb);
    if (v)
        PyObject_SetAttrString(v, "stats", stats);
    PyErr_Restore(t, v, tb);
    Py_DECREF(stats);
    return NULL;
}

static PyObject *remote_pull(kcpy_remote *self, PyObject *args, PyObject *kwargs)
{
    static char *kw[] = {"devices", "store", "kind", "tag", "since", NULL};
    PyObject *devices = Py_None, *store_arg = Py_None;
    kc_filter f = {0};
    long long since = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|O$OzzL:pull", kw, &devices, &store_arg,
                                     &f.kind, &f.tag, &since))
        return NULL;
    f.since = since;
    device_list d;
    bool auto_ids;
    if (parse_devices(devices, &d, &auto_ids) < 0)
        return NULL;
    kcpy_store *st = kcpy_store_from(store_arg);
    if (!st) {
        device_list_free(&d);
        return NULL;
    }
    kc_err err = {0};
    kc_code rc;
    kc_bundle_stats bs = {0};
    double secs;
    Py_BEGIN_ALLOW_THREADS;
    if (auto_ids) { /* the compiler's device probe keeps its answers in DIR/state */
        char state[4096];
        snprintf(state, sizeof state, "%s/state", st->path);
        kc_err ignore;
        kc_backend_local_devices(kc_mkdirs(state, &ignore) == KC_OK ? state : NULL, device_add, &d);
    }
    d.ids[d.n] = NULL;
    double t0 = kc_now();
    kc_store *s = kcpy_store_borrow(st, &err);
    kc_remote *r = s ? kcpy_remote_borrow(self, &err) : NULL;
    rc = r ? kc_remote_pull(r, s, d.n ? d.ids : NULL, &f, NULL, NULL, &bs, &err) : err.code;
    kc_err ferr = {0};
    if (s && kc_store_flush(s, &ferr) != KC_OK && rc == KC_OK)
        err = ferr, rc = ferr.code;
    secs = kc_now() - t0;
    kcpy_remote_return(self, r);
    kcpy_store_return(st, s);
    Py_END_ALLOW_THREADS;
    PyObject *devs = PyList_New(0);
    for (int i = 0; devs && i < d.n; i++) {
        PyObject *id = PyUnicode_FromString(d.ids[i]);
        if (!id || PyList_Append(devs, id) < 0)
            Py_CLEAR(devs);
        Py_XDECREF(id);
    }
    device_list_free(&d);
    Py_DECREF(st);
    if (!devs)
        return NULL;
    PyObject *stats = Py_BuildValue(
        "{s:K,s:K,s:K,s:K,s:K,s:d,s:N}", "artifacts", (unsigned long long)bs.artifacts, "imported",
        (unsigned long long)bs.imported, "present", (unsigned long long)bs.present, "refused",
        (unsigned long long)bs.refused, "bytes", (unsigned long long)bs.bytes, "seconds", secs,
        "devices", devs);
    if (!stats)
        return NULL;
    if (rc != KC_OK)
        return stats_error(&err, stats);
    if (bs.refused) { /* as `kcache pull`: a security signal, after storing what was trusted */
        kc_err_set(&err, KC_ERR_UNTRUSTED,
                   "refused %llu artifact(s) not signed by a trusted key; everything else was "
                   "stored",
                   (unsigned long long)bs.refused);
        return stats_error(&err, stats);
    }
    kcpy_flush_log();
    return stats;
}

static PyObject *remote_push(kcpy_remote *self, PyObject *args, PyObject *kwargs)
{
    static char *kw[] = {"store", "kind", "device", "tag", "since", NULL};
    PyObject *store_arg = Py_None;
    kc_filter f = {0};
    long long since = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|$OzzzL:push", kw, &store_arg, &f.kind,
                                     &f.device, &f.tag, &since))
        return NULL;
    f.since = since;
    kcpy_store *st = kcpy_store_from(store_arg);
    if (!st)
        return NULL;
    kc_err err = {0};
    kc_code rc;
    kc_remote_push_stats ps = {0};
    double secs;
    Py_BEGIN_ALLOW_THREADS;
    double t0 = kc_now();
    kc_store *s = kcpy_store_borrow(st, &err);
    kc_remote *r = s ? kcpy_remote_borrow(self, &err) : NULL;
    rc = r ? kc_remote_push_ex(r, s, &f, NULL, NULL, &ps, &err) : err.code;
    secs = kc_now() - t0;
    kcpy_remote_return(self, r);
    kcpy_store_return(st, s);
    Py_END_ALLOW_THREADS;
    Py_DECREF(st);
    PyObject *stats = Py_BuildValue(
        "{s:K,s:K,s:K,s:K,s:d}", "considered", (unsigned long long)ps.considered, "uploaded",
        (unsigned long long)ps.uploaded, "skipped", (unsigned long long)ps.skipped, "bytes",
        (unsigned long long)ps.bytes, "seconds", secs);
    if (!stats)
        return NULL;
    if (rc != KC_OK)
        return stats_error(&err, stats);
    kcpy_flush_log();
    return stats;
}

static PyObject *remote_close(kcpy_remote *self, PyObject *unused)
{
    (void)unused;
    close_all(self);
    kcpy_flush_log();
    Py_RETURN_NONE;
}

static PyObject *remote_repr(kcpy_remote *self)
{
    return PyUnicode_FromFormat("kcache.Remote('%s')", self->shown_url ? self->shown_url : "");
}

static PyObject *get_url(kcpy_remote *self, void *closure)
{
    (void)closure;
    return PyUnicode_FromString(self->shown_url ? self->shown_url : "");
}

static PyGetSetDef remote_getset[] = {
    {"url", (getter)get_url, NULL,
     "The server URL (or comma-separated list), with any user:password shown as ***.", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyMethodDef remote_methods[] = {
    {"put", (PyCFunction)(void (*)(void))remote_put, METH_VARARGS | METH_KEYWORDS,
     "put(data, *, kind='blob', meta=None, key=None) -> str\n\n"
     "Uploads data as an artifact (signed when a signing key is configured) and returns its "
     "key (key, else the SHA-256 of data). Raises AuthError without a write token (401/403), "
     "TooLargeError / ServerError for the server's 413 / 507 and other failures."},
    {"get", (PyCFunction)remote_get, METH_O,
     "get(key) -> bytes | memoryview\n\n"
     "The payload the server holds under key, its envelope checked (SHA-256, size limit, "
     "signature with trusted keys) before it is returned: bytes below 1 MiB, else a read-only "
     "memoryview over the received buffer (no copy). Raises NotFound on 404, AuthError on "
     "401/403, TrustError, TooLargeError, CorruptError, ServerError."},
    {"has", (PyCFunction)remote_has, METH_O, "has(key) -> bool\n\nA HEAD request for key."},
    {"missing", (PyCFunction)remote_missing, METH_O,
     "missing(keys) -> list[str]\n\nThose of keys the server lacks (one request per 1000 "
     "keys)."},
    {"fetch", (PyCFunction)(void (*)(void))remote_fetch, METH_VARARGS | METH_KEYWORDS,
     "fetch(keys, *, store=None) -> list[str]\n\n"
     "GETs keys in parallel into store (a Store or path; default: the default cache "
     "directory), each envelope checked and, with the store's trusted keys, refused unless "
     "signed, as the compiler's remote tier does; returns the keys fetched (a 404 is simply "
     "absent). Raises AuthError, CorruptError, ServerError for failures other than a miss."},
    {"pull", (PyCFunction)(void (*)(void))remote_pull, METH_VARARGS | METH_KEYWORDS,
     "pull(devices=None, *, store=None, kind=None, tag=None, since=None) -> dict\n\n"
     "Imports into store (a Store or path; default: the default cache directory) every "
     "artifact the server has for devices, in one streamed bundle, as `kcache pull`: None or "
     "'auto' means this machine's device fingerprint ids, 'all' every device, else an id or a "
     "list of ids. Returns artifacts, imported, present, refused, bytes, seconds, devices. "
     "Raises TrustError (with .stats) when artifacts were refused for want of a trusted "
     "signature, after storing the others."},
    {"push", (PyCFunction)(void (*)(void))remote_push, METH_VARARGS | METH_KEYWORDS,
     "push(*, store=None, kind=None, device=None, tag=None, since=None) -> dict\n\n"
     "Uploads the matching entries of store that the server lacks, in parallel, as `kcache "
     "push`. Returns considered, uploaded, skipped, bytes, seconds; errors carry .stats."},
    {"close", (PyCFunction)remote_close, METH_NOARGS,
     "close() -> None\n\nCloses the connections; later calls raise InvalidError."},
    {"__enter__", kcpy_enter, METH_NOARGS, NULL},
    {"__exit__", kcpy_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL}};

PyTypeObject kcpy_RemoteType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kcache.Remote",
    .tp_basicsize = sizeof(kcpy_remote),
    .tp_dealloc = (destructor)remote_dealloc,
    .tp_repr = (reprfunc)remote_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc =
        "Remote(url=None, token=None, token_file=None, ca_file=None, client_cert=None, "
        "client_key=None, trusted_keys=None, *, sign_key=None, timeout_ms=0, "
        "connect_timeout_ms=0, concurrency=0)\n\n"
        "A kcached server, or several (a comma-separated list, sharded by rendezvous hashing). "
        "What is not given comes from the kcache tool's variables: $KCACHE_REMOTE, "
        "$KCACHE_TOKEN or $KCACHE_TOKEN_FILE, $KCACHE_CA_FILE, $KCACHE_CLIENT_CERT, "
        "$KCACHE_CLIENT_KEY, $KCACHE_TRUSTED_KEYS, $KCACHE_SIGN_KEY, $KCACHE_MAX_ARTIFACT. "
        "Opening sends nothing. Safe to share between threads: each call borrows a connection "
        "of its own and runs without the GIL, so threads fetch in parallel. A context "
        "manager.",
    .tp_methods = remote_methods,
    .tp_getset = remote_getset,
    .tp_init = (initproc)remote_init,
    .tp_new = PyType_GenericNew,
};
