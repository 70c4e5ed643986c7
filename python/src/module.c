/*
 * module.c - the _kcache extension module: its exception hierarchy (one class per
 * family of kc_code, all under kcache.Error), the bridge from the libraries' log
 * callback to Python's logging module, and the module table. The package
 * kcache/__init__.py re-exports what is here.
 */
#include "kcpy.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <kcache/kc_log.h>

/* ---- exceptions ---- */

typedef struct exc_def {
    kc_code code;     /* the first of the codes it stands for */
    const char *name; /* kcache.NAME */
    const char *doc;
    PyObject **extra_base; /* a builtin it also derives from, or NULL */
    PyObject *type;
} exc_def;

static PyObject *error_type; /* kcache.Error */

/* The order is the index used by code_to_exc below. */
enum {
    X_NOTFOUND,
    X_INVALID,
    X_AUTH,
    X_TRUST,
    X_CORRUPT,
    X_SERVER,
    X_TOOLARGE,
    X_FULL,
    X_STORAGE,
    X_COMPILE,
    X_MISS,
    X_UNSUPPORTED,
    X_COUNT
};

static exc_def excs[X_COUNT] = {
    [X_NOTFOUND] = {KC_ERR_NOT_FOUND, "NotFound",
                    "The key is not in the store or on the server (a cache miss).",
                    &PyExc_LookupError, NULL},
    [X_INVALID] = {KC_ERR_INVALID, "InvalidError",
                   "Bad argument or malformed input: a key, kind, metadata, graph, URL or "
                   "option; also an unsupported format version.",
                   &PyExc_ValueError, NULL},
    [X_AUTH] = {KC_ERR_AUTH, "AuthError",
                "The server refused the credentials (HTTP 401: no or unknown token) or the "
                "token's scopes (HTTP 403: e.g. a read token that writes).",
                NULL, NULL},
    [X_TRUST] = {KC_ERR_UNTRUSTED, "TrustError",
                 "The artifact is not signed by one of the trusted keys (trusted_keys, "
                 "$KCACHE_TRUSTED_KEYS).",
                 NULL, NULL},
    [X_CORRUPT] = {KC_ERR_CORRUPT, "CorruptError",
                   "Stored or received bytes failed their checksum, or ended early; a damaged "
                   "store entry is quarantined.",
                   NULL, NULL},
    [X_SERVER] = {KC_ERR_REMOTE, "ServerError",
                  "The server could not be reached, timed out, or answered with an error "
                  "other than 401/403/404.",
                  NULL, NULL},
    [X_TOOLARGE] = {KC_ERR_TOO_LARGE, "TooLargeError", "A size limit was exceeded.", NULL, NULL},
    [X_FULL] = {KC_ERR_FULL, "FullError",
                "No room: the disk is full or the store's size limit cannot be met; nothing "
                "was written.",
                NULL, NULL},
    [X_STORAGE] = {KC_ERR_IO, "StorageError",
                   "A file or database operation failed (the message says which).", NULL, NULL},
    [X_COMPILE] = {KC_ERR_COMPILE, "CompileError", "The kernel compiler or a toolchain failed.",
                   NULL, NULL},
    [X_MISS] = {KC_ERR_MISS, "MissError",
                "A cache hit that was required (require_hit=True) did not happen.", NULL, NULL},
    [X_UNSUPPORTED] = {KC_ERR_UNSUPPORTED, "UnsupportedError",
                       "The device, feature or target is not available on this machine.", NULL,
                       NULL},
};

static PyObject *code_to_exc(kc_code code)
{
    switch (code) {
    case KC_ERR_NOT_FOUND:
        return excs[X_NOTFOUND].type;
    case KC_ERR_INVALID:
    case KC_ERR_VERSION:
        return excs[X_INVALID].type;
    case KC_ERR_AUTH:
        return excs[X_AUTH].type;
    case KC_ERR_UNTRUSTED:
        return excs[X_TRUST].type;
    case KC_ERR_CORRUPT:
    case KC_ERR_TRUNCATED:
        return excs[X_CORRUPT].type;
    case KC_ERR_REMOTE:
        return excs[X_SERVER].type;
    case KC_ERR_TOO_LARGE:
        return excs[X_TOOLARGE].type;
    case KC_ERR_FULL:
        return excs[X_FULL].type;
    case KC_ERR_IO:
    case KC_ERR_DB:
        return excs[X_STORAGE].type;
    case KC_ERR_COMPILE:
        return excs[X_COMPILE].type;
    case KC_ERR_MISS:
        return excs[X_MISS].type;
    case KC_ERR_UNSUPPORTED:
        return excs[X_UNSUPPORTED].type;
    default:
        return error_type;
    }
}

PyObject *kcpy_raise(const kc_err *err)
{
    kcpy_flush_log();
    kc_code code = err->code == KC_OK ? KC_ERR_INVALID : err->code;
    if (code == KC_ERR_NOMEM && !err->msg[0])
        return PyErr_NoMemory();
    PyObject *type = code_to_exc(code);
    PyObject *exc = PyObject_CallFunction(type, "s", err->msg[0] ? err->msg : kc_code_name(code));
    if (!exc)
        return NULL;
    if (PyObject_SetAttrString(exc, "code", PyUnicode_FromString(kc_code_name(code))) == 0)
        PyErr_SetObject(type, exc);
    Py_DECREF(exc);
    return NULL;
}

PyObject *kcpy_raise_msg(kc_code code, const char *fmt, ...)
{
    kc_err err = {.code = code};
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err.msg, sizeof err.msg, fmt, ap);
    va_end(ap);
    return kcpy_raise(&err);
}

/* ---- arguments and results ---- */

const char *kcpy_key_arg(PyObject *o)
{
    if (!PyUnicode_Check(o)) {
        PyErr_Format(PyExc_TypeError, "a key is a str of 64 lowercase hex digits, not %s",
                     Py_TYPE(o)->tp_name);
        return NULL;
    }
    return PyUnicode_AsUTF8(o);
}

const char **kcpy_keys(PyObject *seq, Py_ssize_t *n)
{
    *n = PySequence_Fast_GET_SIZE(seq);
    const char **keys = calloc((size_t)*n + 1, sizeof *keys);
    if (!keys)
        return (const char **)PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < *n; i++)
        if (!(keys[i] = kcpy_key_arg(PySequence_Fast_GET_ITEM(seq, i)))) {
            free(keys);
            return NULL;
        }
    return keys;
}

PyObject *kcpy_keys_where(PyObject *seq, const bool *flags)
{
    PyObject *out = PyList_New(0);
    for (Py_ssize_t i = 0; out && i < PySequence_Fast_GET_SIZE(seq); i++)
        if (flags[i] && PyList_Append(out, PySequence_Fast_GET_ITEM(seq, i)) < 0)
            Py_CLEAR(out);
    return out;
}

PyObject *kcpy_presence(kc_code rc, const kc_err *err)
{
    if (rc == KC_OK)
        Py_RETURN_TRUE;
    if (rc == KC_ERR_NOT_FOUND)
        Py_RETURN_FALSE;
    return kcpy_raise(err);
}

PyObject *kcpy_enter(PyObject *self, PyObject *unused)
{
    (void)unused;
    Py_INCREF(self);
    return self;
}

PyObject *kcpy_exit(PyObject *self, PyObject *args)
{
    (void)args;
    PyObject *r = PyObject_CallMethod(self, "close", NULL);
    if (!r)
        return NULL;
    Py_DECREF(r);
    Py_RETURN_FALSE;
}

/* ---- log messages ----
 *
 * kc_log may be called from any thread (the background upload queue too) and at
 * any time, so the callback only copies the message into a small ring under a
 * mutex; kcpy_flush_log hands the messages to logging.getLogger("kcache") from a
 * thread that holds the GIL. The package adds a NullHandler to that logger, so
 * nothing is printed unless the application configures logging. */

#define LOG_RING 64
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    kc_log_level level;
    char msg[KC_ERR_MSG_MAX];
} log_ring[LOG_RING];
static unsigned log_head, log_count, log_dropped;
static volatile int log_pending;

static void log_collect(kc_log_level level, const char *msg, void *ctx)
{
    (void)ctx;
    pthread_mutex_lock(&log_mu);
    if (log_count == LOG_RING) {
        log_head = (log_head + 1) % LOG_RING; /* keep the newest */
        log_count--;
        log_dropped++;
    }
    unsigned i = (log_head + log_count) % LOG_RING;
    log_ring[i].level = level;
    snprintf(log_ring[i].msg, sizeof log_ring[i].msg, "%s", msg);
    log_count++;
    log_pending = 1;
    pthread_mutex_unlock(&log_mu);
}

void kcpy_flush_log(void)
{
    if (!log_pending)
        return;
    PyObject *saved_type, *saved_value, *saved_tb;
    PyErr_Fetch(&saved_type, &saved_value, &saved_tb);
    PyObject *logging = PyImport_ImportModule("logging");
    PyObject *logger = logging ? PyObject_CallMethod(logging, "getLogger", "s", "kcache") : NULL;
    for (;;) {
        kc_log_level level;
        char msg[KC_ERR_MSG_MAX + 64];
        pthread_mutex_lock(&log_mu);
        if (log_count == 0) {
            log_pending = 0;
            pthread_mutex_unlock(&log_mu);
            break;
        }
        level = log_ring[log_head].level;
        if (log_dropped)
            snprintf(msg, sizeof msg, "(%u earlier messages dropped) %s", log_dropped,
                     log_ring[log_head].msg);
        else
            snprintf(msg, sizeof msg, "%s", log_ring[log_head].msg);
        log_dropped = 0;
        log_head = (log_head + 1) % LOG_RING;
        log_count--;
        pthread_mutex_unlock(&log_mu);
        if (logger) {
            PyObject *r = PyObject_CallMethod(logger, level == KC_LOG_WARN ? "warning" : "info",
                                              "ss", "%s", msg);
            Py_XDECREF(r);
            PyErr_Clear();
        }
    }
    Py_XDECREF(logger);
    Py_XDECREF(logging);
    PyErr_Clear();
    PyErr_Restore(saved_type, saved_value, saved_tb);
}

/* ---- module ---- */

static PyObject *default_dir(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    char *d = kc_store_default_dir();
    if (!d)
        return kcpy_raise_msg(KC_ERR_INVALID, "no cache directory: set $KCACHE_DIR or $HOME");
    PyObject *r = PyUnicode_DecodeFSDefault(d);
    free(d);
    return r;
}

static PyMethodDef module_methods[] = {
    {"default_dir", default_dir, METH_NOARGS,
     "default_dir() -> str\n\nThe cache directory the kcache tool uses without --cache-dir: "
     "$KCACHE_DIR, else $XDG_CACHE_HOME/kcache, else ~/.cache/kcache."},
    {"compile", (PyCFunction)(void (*)(void))kcpy_compile, METH_VARARGS | METH_KEYWORDS,
     kcpy_compile_doc},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "_kcache",
    "The C core of the kcache package (use it through `import kcache`).",
    -1,
    module_methods,
    NULL,
    NULL,
    NULL,
    NULL};

static int add_type(PyObject *m, PyTypeObject *t, const char *name)
{
    if (PyType_Ready(t) < 0)
        return -1;
    Py_INCREF(t);
    if (PyModule_AddObject(m, name, (PyObject *)t) < 0) {
        Py_DECREF(t);
        return -1;
    }
    return 0;
}

PyMODINIT_FUNC PyInit__kcache(void)
{
    PyObject *m = PyModule_Create(&module_def);
    if (!m)
        return NULL;
    PyObject *error_dict = Py_BuildValue("{s:s}", "code", "error");
    error_type = error_dict ? PyErr_NewExceptionWithDoc(
                                  "kcache.Error",
                                  "Base of every error kcache raises. str(e) is kcache's "
                                  "message, which names the key, file or URL involved; e.code "
                                  "is the error's short name ('not-found', 'auth', ...).",
                                  NULL, error_dict)
                            : NULL;
    Py_XDECREF(error_dict);
    if (!error_type || PyModule_AddObject(m, "Error", error_type) < 0)
        goto fail;
    Py_INCREF(error_type);
    for (int i = 0; i < X_COUNT; i++) {
        char qual[64];
        snprintf(qual, sizeof qual, "kcache.%s", excs[i].name);
        PyObject *bases = excs[i].extra_base ? PyTuple_Pack(2, error_type, *excs[i].extra_base)
                                             : PyTuple_Pack(1, error_type);
        if (!bases)
            goto fail;
        /* .code of an instance raised from Python rather than from a kc_err */
        PyObject *dict = Py_BuildValue("{s:s}", "code", kc_code_name(excs[i].code));
        excs[i].type = dict ? PyErr_NewExceptionWithDoc(qual, excs[i].doc, bases, dict) : NULL;
        Py_XDECREF(dict);
        Py_DECREF(bases);
        if (!excs[i].type || PyModule_AddObject(m, excs[i].name, excs[i].type) < 0)
            goto fail;
        Py_INCREF(excs[i].type); /* the table keeps one */
    }
    if (add_type(m, &kcpy_PayloadType, "_Payload") < 0 ||
        add_type(m, &kcpy_StoreType, "Store") < 0 || add_type(m, &kcpy_RemoteType, "Remote") < 0)
        goto fail;
    if (PyModule_AddStringConstant(m, "__version__", KC_VERSION) < 0)
        goto fail;
    /* Libraries never print; their notes reach logging.getLogger("kcache"). */
    kc_log_set(log_collect, NULL);
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
