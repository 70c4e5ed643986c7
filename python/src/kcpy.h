/*
 * kcpy.h - what the parts of the kcache Python extension (_kcache) share: the
 * exception hierarchy and the kc_err -> exception mapping, the payload object
 * that hands a malloc'd buffer to Python without a copy, the library log
 * messages that reach Python's logging module, and the Store/Remote types
 * that compile() borrows handles from.
 *
 * Every call that may touch a disk or a socket runs without the GIL; a handle
 * of the C libraries serves one thread at a time, so each Python object keeps a
 * small pool of handles and a thread borrows one for the length of a call.
 */
#ifndef KCPY_H
#define KCPY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <pthread.h>
#include <stdbool.h>

#include <kcache/kc_error.h>
#include <kcache/kc_remote.h>
#include <kcache/kc_sign.h>
#include <kcache/kc_store.h>

/* Payloads at least this large come back from Remote.get as a memoryview over
 * the library's own buffer rather than as a copy in a bytes object. */
#define KCPY_LARGE_PAYLOAD (1u << 20)

/* Handles kept for reuse per Store or Remote object (more are opened while more
 * threads call at once, and closed when they come back to a full pool). */
#define KCPY_POOL_MAX 16

/* ---- errors (module.c) ---- */

/* Raises the exception kcache maps err->code to (kcache.NotFound, AuthError, ...),
 * with err->msg as its message and .code set to kc_code_name; returns NULL. */
PyObject *kcpy_raise(const kc_err *err);
/* Raises kcache.Error (or the subclass for code) with a formatted message. */
PyObject *kcpy_raise_msg(kc_code code, const char *fmt, ...);
/* Moves the library's log messages collected since the last call (from any
 * thread) to the Python logger "kcache"; call with the GIL held. */
void kcpy_flush_log(void);

/* ---- arguments and results shared by Store and Remote (module.c) ---- */

/* A key argument as UTF-8 (borrowed from the str); NULL with TypeError. */
const char *kcpy_key_arg(PyObject *o);
/* seq (from PySequence_Fast) as n borrowed key strings (a calloc'd array of
 * n + 1, the caller frees it); NULL with an exception set. */
const char **kcpy_keys(PyObject *seq, Py_ssize_t *n);
/* A list of the items seq[i] for which flags[i] is set; NULL on error. */
PyObject *kcpy_keys_where(PyObject *seq, const bool *flags);
/* A has() answer: True for KC_OK, False for a miss, else the exception. */
PyObject *kcpy_presence(kc_code rc, const kc_err *err);
/* __enter__ returns the object; __exit__ calls its close(). */
PyObject *kcpy_enter(PyObject *self, PyObject *unused);
PyObject *kcpy_exit(PyObject *self, PyObject *args);

/* ---- payloads (payload.c) ---- */

/* A bytes object for small payloads, else a read-only memoryview that owns
 * (and frees) buf; takes ownership of buf either way. NULL with an exception
 * set when out of memory. */
PyObject *kcpy_payload_take(uint8_t *buf, size_t len);
extern PyTypeObject kcpy_PayloadType;
/* kcpy_payload_take of a's payload; frees the rest of a. */
PyObject *kcpy_payload_of(kc_artifact *a);

/* The arguments of Store.put and Remote.put: data (a buffer, not copied), kind,
 * meta and key. kcpy_put_args_parse fills p (NULL on error, nothing to
 * release); kcpy_put_args_release releases it. */
typedef struct kcpy_put_args {
    Py_buffer data;
    const char *kind, *key, *meta; /* meta: JSON text or NULL */
    PyObject *meta_obj;            /* owns meta */
} kcpy_put_args;
int kcpy_put_args_parse(kcpy_put_args *p, PyObject *args, PyObject *kwargs);
void kcpy_put_args_release(kcpy_put_args *p);

/* Fills a kc_artifact around data (borrowed, not copied: the caller keeps the
 * buffer alive and calls kcpy_artifact_release, never kc_artifact_free) with
 * key (NULL: SHA-256 of the data), kind and meta checked as kc_artifact_init
 * checks them. */
kc_code kcpy_artifact_borrow(kc_artifact *a, const char *key, const char *kind, const char *meta,
                             const void *data, size_t len, kc_err *err);
void kcpy_artifact_release(kc_artifact *a);

/* meta argument (None, a str of JSON or a dict) as JSON text: a new str object
 * the caller decrefs, or Py_None (a new reference) for no metadata. */
PyObject *kcpy_meta_json(PyObject *meta);

/* ---- handle pools (pool.c) ---- */

typedef struct kcpy_pool {
    pthread_mutex_t mu;
    void *idle[KCPY_POOL_MAX];
    int nidle;
    int busy;
    bool closed;
} kcpy_pool;

void kcpy_pool_init(kcpy_pool *p);
/* An idle handle, or NULL when the caller must open a new one; *closed is set
 * (and NULL returned) once the owner was closed. Without the GIL. */
void *kcpy_pool_take(kcpy_pool *p, bool *closed);
/* Counts a handle opened by the caller after kcpy_pool_take gave NULL. */
void kcpy_pool_opened(kcpy_pool *p);
/* Gives h back; returns true when the pool keeps it, false when the caller
 * must close it (pool full or closed, or keep false). Without the GIL. */
bool kcpy_pool_give(kcpy_pool *p, void *h, bool keep);
/* Marks the pool closed and moves its idle handles to out (returns how many);
 * busy handles are closed by the threads that hold them. */
int kcpy_pool_close(kcpy_pool *p, void **out);

/* ---- Store (store.c) ---- */

typedef struct kcpy_store {
    PyObject_HEAD char *path;
    kc_store_opts opts;
    kc_trust *trust; /* owned; opts.trust points here */
    kcpy_pool pool;
    PyObject *recovered; /* (moved_to, why) when the database was found damaged */
} kcpy_store;

extern PyTypeObject kcpy_StoreType;
/* Borrows a handle of st (NULL with err filled). Without the GIL. */
kc_store *kcpy_store_borrow(kcpy_store *st, kc_err *err);
void kcpy_store_return(kcpy_store *st, kc_store *s);
/* A Store from None (the default directory), a path or a Store (a new
 * reference); NULL with an exception set. */
kcpy_store *kcpy_store_from(PyObject *arg);

/* ---- Remote (remote.c, remote_env.c) ---- */

/* What a Remote is opened with: arguments first, then the environment the
 * kcache tool reads (remote_env.c). Every string is owned. */
typedef struct kcpy_remote_conf {
    char *url, *token, *ca_file, *client_cert, *client_key, *trusted_keys, *sign_key;
    uint64_t max_artifact;
    long connect_timeout_ms, timeout_ms;
    int concurrency;
} kcpy_remote_conf;

/* Fills c from the explicit values (NULL = not given) and the environment;
 * KC_ERR_INVALID with a message naming the variable or file otherwise. */
kc_code kcpy_remote_conf_fill(kcpy_remote_conf *c, const char *url, const char *token,
                              const char *token_file, kc_err *err);
void kcpy_remote_conf_free(kcpy_remote_conf *c);

typedef struct kcpy_remote {
    PyObject_HEAD kcpy_remote_conf conf;
    kc_trust *trust;
    kc_signer *signer;
    kc_remote_opts opts;
    kcpy_pool pool;
    char *shown_url; /* the URL with credentials redacted */
} kcpy_remote;

extern PyTypeObject kcpy_RemoteType;
kc_remote *kcpy_remote_borrow(kcpy_remote *rm, kc_err *err);
void kcpy_remote_return(kcpy_remote *rm, kc_remote *r);

/* ---- compile (compile.c) ---- */

PyObject *kcpy_compile(PyObject *module, PyObject *args, PyObject *kwargs);
extern const char kcpy_compile_doc[];

#endif
