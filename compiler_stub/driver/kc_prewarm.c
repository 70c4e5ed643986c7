/*
 * kc_prewarm.c - the manifest x target walk of kc_prewarm.h: for each target,
 * each graph loaded (through the program's loader), compiled with a backend
 * opened for that target, and reported; the device ids seen are collected for
 * the program to push.
 */
#include <kcache/kc_prewarm.h>

#include <stdlib.h>
#include <string.h>

#include <kcache/kc_cflags.h>
#include <kcache/kc_util.h>

kc_code kc_prewarm_check(const kc_manifest *m, const kc_prewarm_opts *o, kc_err *err)
{
    const char *source = o->source ? o->source : "manifest";
    for (int ti = 0; !o->allow_cflags && ti < m->n_targets; ti++)
        if (kc_cflags_check(m->targets[ti].cflags, source, err) != KC_OK)
            return err ? err->code : KC_ERR_INVALID;
    return KC_OK;
}

void kc_prewarm_stats_free(kc_prewarm_stats *st)
{
    for (int i = 0; i < st->n_devices; i++)
        free(st->devices[i]);
    free(st->devices);
    st->devices = NULL;
    st->n_devices = 0;
}

/* Adds id to st->devices unless it is there. */
static bool note_device(kc_prewarm_stats *st, const char *id)
{
    for (int i = 0; i < st->n_devices; i++)
        if (strcmp(st->devices[i], id) == 0)
            return true;
    char **d = realloc(st->devices, (size_t)(st->n_devices + 1) * sizeof *d);
    if (!d)
        return false;
    st->devices = d;
    if (!(d[st->n_devices] = strdup(id)))
        return false;
    st->n_devices++;
    return true;
}

static kc_code load_json_graph(const kc_manifest *m, int gi, const char *source, kc_graph **out,
                               kc_err *err)
{
    if (m->shapes[gi].n > 0)
        return kc_err_set(err, KC_ERR_INVALID,
                          "%s: graphs[%d]: shape bindings need a loader that reads ONNX models",
                          source, gi);
    return kc_graph_load(m->graphs[gi], out, err);
}

/* Loads, opens the backend for target t and compiles graph gi into *p (with
 * *g and *b it borrows from; all NULL after a failure). */
static kc_code compile_pair(const kc_manifest *m, int gi, const kc_manifest_target *t,
                            kc_cache *cache, const kc_prewarm_opts *o, const kc_compile_opts *co,
                            kc_graph **g, kc_backend **b, kc_program **p, kc_err *err)
{
    const char *source = o->source ? o->source : "manifest";
    kc_code rc =
        o->load ? o->load(m, gi, o->load_ctx, g, err) : load_json_graph(m, gi, source, g, err);
    if (rc != KC_OK)
        return rc;
    kc_backend_opts bo = o->backend;
    bo.target = t->target;
    if (t->cflags)
        bo.extra_flags = t->cflags;
    if (!bo.cache)
        bo.cache = cache;
    if ((rc = kc_backend_open(t->device, &bo, b, err)) != KC_OK)
        return rc;
    return kc_compile(*b, cache, *g, co, p, err);
}

kc_code kc_prewarm(const kc_manifest *m, kc_cache *cache, const kc_prewarm_opts *o,
                   kc_prewarm_stats *st, kc_err *err)
{
    memset(st, 0, sizeof *st);
    kc_code rc = kc_prewarm_check(m, o, err);
    if (rc != KC_OK)
        return rc;
    kc_compile_opts co = o->compile;
    co.load = false; /* prewarming fills the cache; nothing runs */
    if (m->autotune)
        co.autotune = true;
    kc_err first = {0};
    double t0 = kc_now();
    for (int ti = 0; ti < m->n_targets; ti++) {
        for (int gi = 0; gi < m->n_graphs; gi++) {
            kc_graph *g = NULL;
            kc_backend *b = NULL;
            kc_program *p = NULL;
            kc_err perr = {0};
            st->pairs++;
            kc_code prc = compile_pair(m, gi, &m->targets[ti], cache, o, &co, &g, &b, &p, &perr);
            if (prc == KC_OK && !note_device(st, p->device.id))
                prc = kc_err_set(&perr, KC_ERR_NOMEM, "out of memory");
            if (prc == KC_OK) {
                st->kernels += p->n_kernels;
                st->hits += p->hits;
                st->compiled += p->compiled;
            } else {
                if (!st->failed++)
                    first = perr;
            }
            if (o->done)
                o->done(m, ti, gi, prc == KC_OK ? p : NULL, prc == KC_OK ? NULL : &perr,
                        o->done_ctx);
            kc_program_free(p);
            kc_backend_close(b);
            kc_graph_free(g);
        }
    }
    st->seconds = kc_now() - t0;
    if (!st->failed)
        return KC_OK;
    if (err)
        *err = first;
    kc_err_prefix(err, "%s: %d of %d graph x target pairs failed; the first",
                  o->source ? o->source : "manifest", st->failed, st->pairs);
    return first.code;
}
