/*
 * compile.c - kcache.compile(): a graph or ONNX model through the cache tiers, as
 * `kcache compile --json` runs it (client/kcache/cmd_compile.c): the store, the
 * server unless offline (kc_remote_cache: hits written back, fresh kernels
 * uploaded), a backend opened by name, kc_compile, and the same summary fields.
 * The whole compile runs without the GIL.
 */
#include "kcpy.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <kcache/kc_backend.h>
#include <kcache/kc_cflags.h>
#include <kcache/kc_compile.h>
#include <kcache/kc_onnx.h>
#include <kcache/kc_remote_cache.h>
#include <kcache/kc_util.h>

#define MAX_BINDS 64

const char kcpy_compile_doc[] =
    "compile(graph, *, device='cpu', target=None, remote=None, store=None, offline=False, "
    "require_hit=False, autotune=False, jobs=0, shape=None, tag=None, cflags=None) -> dict\n\n"
    "Compiles graph (a kcache-graph/1 JSON file or an ONNX model) through the cache, as "
    "`kcache compile --json`, and returns the same summary: graph, graph_fp, graph_key, "
    "device, backend, graph_hit, kernels, hits, misses, compiled, remote_hits, autotuned, "
    "seconds. device is cpu, xpu, xpu-spirv or auto; target a CPU ISA level (native, "
    "x86-64-v2/v3/v4). store is a Store or path (default: the default cache directory); "
    "remote a Remote or URL (default: $KCACHE_REMOTE, as the tool), unless offline. shape "
    "binds symbolic ONNX dimensions: {'input': (8, 3, 224, 224)} or ['input=8x3x224x224']. "
    "Raises MissError with require_hit when a kernel was not cached, CompileError when the "
    "toolchain fails (the generated source is kept; the message names it), InvalidError for "
    "a bad graph, flag or tag.";

/* The summary, copied out of the program before it is freed. */
typedef struct summary {
    char graph_fp[KC_KEY_HEX_LEN + 1], graph_key[KC_KEY_HEX_LEN + 1], device[128], backend[32];
    bool graph_hit;
    int kernels, hits, misses, compiled, remote_hits, autotuned;
    double seconds;
} summary;

typedef struct job {
    const char *graph;
    const char *device, *target, *tag, *cflags;
    bool offline, require_hit, autotune;
    int jobs;
    kc_shape_bind binds[MAX_BINDS];
    int n_binds;
} job;

static void rm_shallow(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    char p[8192];
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) {
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            unlink(p);
        }
    closedir(d);
    rmdir(dir);
}

/* Everything below runs without the GIL. */
static kc_code run(const job *j, const char *cache_dir, kc_store *s, kc_remote *r, summary *out,
                   kc_err *err)
{
    char tmp[4096], work[4200], state[4096];
    snprintf(tmp, sizeof tmp, "%s/tmp", cache_dir);
    snprintf(work, sizeof work, "%s/compile-%d-XXXXXX", tmp, (int)getpid());
    snprintf(state, sizeof state, "%s/state", cache_dir);
    kc_err ignore;
    bool have_state = kc_mkdirs(state, &ignore) == KC_OK;
    if (kc_mkdirs(tmp, err) != KC_OK)
        return err->code;
    if (!mkdtemp(work))
        return kc_err_errno(err, KC_ERR_IO, errno, "cannot create a scratch directory under %s",
                            tmp);
    kc_cache *cache = NULL;
    kc_graph *g = NULL;
    kc_backend *b = NULL;
    kc_program *p = NULL;
    kc_onnx_opts oo = {.binds = j->binds, .n_binds = j->n_binds, .skip_weights = true};
    kc_backend_opts bo = {.target = j->target,
                          .extra_flags = j->cflags,
                          .work_dir = work,
                          .state_dir = have_state ? state : NULL};
    kc_compile_opts co = {
        .autotune = j->autotune, .require_hit = j->require_hit, .jobs = j->jobs, .tag = j->tag};
    kc_code rc = kc_remote_cache_open(s, r, j->offline || !r, &cache, err);
    bo.cache = cache;
    if (rc == KC_OK)
        rc = kc_model_load(j->graph, &oo, &g, err);
    if (rc == KC_OK)
        rc = kc_backend_open(j->device, &bo, &b, err);
    if (rc == KC_OK)
        rc = kc_compile(b, cache, g, &co, &p, err);
    if (rc == KC_OK) {
        snprintf(out->graph_fp, sizeof out->graph_fp, "%s", g->fp);
        snprintf(out->graph_key, sizeof out->graph_key, "%s", p->graph_key);
        snprintf(out->device, sizeof out->device, "%s", p->device.id);
        snprintf(out->backend, sizeof out->backend, "%s", b->ops->name);
        out->graph_hit = p->graph_hit;
        out->kernels = p->n_kernels;
        out->hits = p->hits;
        out->misses = p->misses;
        out->compiled = p->compiled;
        out->remote_hits = p->remote_hits;
        out->autotuned = p->autotuned;
        out->seconds = p->seconds;
    }
    if (cache && r && !j->offline)
        kc_cache_flush(cache, 10000); /* fresh kernels reach the server before we return */
    kc_program_free(p);
    kc_backend_close(b);
    kc_graph_free(g);
    kc_cache_close(cache);
    if (rc == KC_ERR_COMPILE)
        rmdir(work); /* only if empty: a failed source stays for inspection */
    else
        rm_shallow(work);
    return rc;
}

/* shape: {'name': (d1, d2, ...)} or ['name=d1xd2', ...]. */
static int parse_shapes(PyObject *o, job *j)
{
    if (!o || o == Py_None)
        return 0;
    PyObject *items = PyDict_Check(o) ? PyDict_Items(o) : PySequence_List(o);
    if (!items)
        return -1;
    int ok = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(items) && ok == 0; i++) {
        PyObject *it = PyList_GET_ITEM(items, i), *text;
        if (PyTuple_Check(it) && PyTuple_GET_SIZE(it) == 2) { /* (name, dims) from a dict */
            PyObject *dims = PySequence_Fast(PyTuple_GET_ITEM(it, 1), "a shape is a sequence");
            if (!dims)
                break;
            PyObject *parts = PyList_New(0);
            for (Py_ssize_t k = 0; parts && k < PySequence_Fast_GET_SIZE(dims); k++) {
                PyObject *s = PyObject_Str(PySequence_Fast_GET_ITEM(dims, k));
                if (!s || PyList_Append(parts, s) < 0)
                    Py_CLEAR(parts);
                Py_XDECREF(s);
            }
            Py_DECREF(dims);
            PyObject *sep = PyUnicode_FromString("x");
            PyObject *joined = parts && sep ? PyUnicode_Join(sep, parts) : NULL;
            Py_XDECREF(sep);
            Py_XDECREF(parts);
            text = joined ? PyUnicode_FromFormat("%S=%S", PyTuple_GET_ITEM(it, 0), joined) : NULL;
            Py_XDECREF(joined);
        } else {
            text = PyObject_Str(it);
        }
        if (!text) {
            ok = -1;
            break;
        }
        char msg[256];
        if (j->n_binds == MAX_BINDS) {
            PyErr_SetString(PyExc_ValueError, "at most 64 shape bindings");
            ok = -1;
        } else if (!kc_shape_bind_parse(PyUnicode_AsUTF8(text), &j->binds[j->n_binds], msg,
                                        sizeof msg)) {
            kcpy_raise_msg(KC_ERR_INVALID, "shape: %s", msg);
            ok = -1;
        } else {
            j->n_binds++;
        }
        Py_DECREF(text);
    }
    Py_DECREF(items);
    return PyErr_Occurred() ? -1 : ok;
}

/* The remote argument: a Remote (new reference), NULL for none, or an error. */
static int remote_of(PyObject *arg, bool offline, kcpy_remote **out)
{
    *out = NULL;
    if (offline)
        return 0;
    if (arg && PyObject_TypeCheck(arg, &kcpy_RemoteType)) {
        Py_INCREF(arg);
        *out = (kcpy_remote *)arg;
        return 0;
    }
    if (!arg || arg == Py_None) { /* as the tool: $KCACHE_REMOTE when set */
        const char *env = getenv("KCACHE_REMOTE");
        if (!env || !*env)
            return 0;
        arg = Py_None;
    }
    *out = (kcpy_remote *)PyObject_CallFunctionObjArgs((PyObject *)&kcpy_RemoteType, arg, NULL);
    return *out ? 0 : -1;
}

PyObject *kcpy_compile(PyObject *module, PyObject *args, PyObject *kwargs)
{
    (void)module;
    static char *kw[] = {"graph",   "device",      "target",   "remote", "store",
                         "offline", "require_hit", "autotune", "jobs",   "shape",
                         "tag",     "cflags",      NULL};
    job j = {.device = "cpu"};
    PyObject *graph, *remote_arg = Py_None, *store_arg = Py_None, *shape = Py_None;
    int offline = 0, require_hit = 0, autotune = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|$szOOpppiOzz:compile", kw, &graph, &j.device,
                                     &j.target, &remote_arg, &store_arg, &offline, &require_hit,
                                     &autotune, &j.jobs, &shape, &j.tag, &j.cflags))
        return NULL;
    j.offline = offline;
    j.require_hit = require_hit;
    j.autotune = autotune;
    PyObject *graphb = NULL, *out = NULL;
    kcpy_store *st = NULL;
    kcpy_remote *rm = NULL;
    kc_err err = {0};
    if (!PyUnicode_FSConverter(graph, &graphb))
        return NULL;
    j.graph = PyBytes_AS_STRING(graphb);
    /* flags and tags may come from configuration: refused before anything runs */
    if (kc_cflags_check(j.cflags, "cflags", &err) != KC_OK ||
        (j.tag && kc_tag_check(j.tag, &err) != KC_OK)) {
        kcpy_raise(&err);
        goto done;
    }
    if (parse_shapes(shape, &j) < 0 || !(st = kcpy_store_from(store_arg)) ||
        remote_of(remote_arg, j.offline, &rm) < 0)
        goto done;
    summary sum = {0};
    kc_code rc;
    Py_BEGIN_ALLOW_THREADS;
    kc_store *s = kcpy_store_borrow(st, &err);
    kc_remote *r = s && rm ? kcpy_remote_borrow(rm, &err) : NULL;
    if (!s || (rm && !r))
        rc = err.code;
    else
        rc = run(&j, st->path, s, r, &sum, &err);
    if (rm)
        kcpy_remote_return(rm, r);
    kcpy_store_return(st, s);
    Py_END_ALLOW_THREADS;
    if (rc != KC_OK) {
        kcpy_raise(&err);
        goto done;
    }
    kcpy_flush_log();
    out = Py_BuildValue("{s:N,s:s,s:s,s:s,s:s,s:O,s:i,s:i,s:i,s:i,s:i,s:i,s:d}", "graph",
                        PyUnicode_DecodeFSDefault(j.graph), "graph_fp", sum.graph_fp, "graph_key",
                        sum.graph_key, "device", sum.device, "backend", sum.backend, "graph_hit",
                        sum.graph_hit ? Py_True : Py_False, "kernels", sum.kernels, "hits",
                        sum.hits, "misses", sum.misses, "compiled", sum.compiled, "remote_hits",
                        sum.remote_hits, "autotuned", sum.autotuned, "seconds", sum.seconds);
done:
    kc_shape_binds_free(j.binds, j.n_binds);
    Py_XDECREF(graphb);
    Py_XDECREF((PyObject *)st);
    Py_XDECREF((PyObject *)rm);
    return out;
}
