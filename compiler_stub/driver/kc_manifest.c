/*
 * kc_manifest.c - reading a prewarm manifest (kc_manifest.h) into plain C arrays.
 */
#include <kcache/kc_manifest.h>

#include <jansson.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *dup_or_null(const char *s)
{
    return s ? strdup(s) : NULL;
}

void kc_manifest_free(kc_manifest *m)
{
    if (!m)
        return;
    for (int i = 0; i < m->n_graphs; i++) {
        free(m->graphs[i]);
        if (m->shapes) {
            for (int k = 0; k < m->shapes[i].n; k++)
                free(m->shapes[i].v[k]);
            free(m->shapes[i].v);
        }
    }
    free(m->shapes);
    for (int i = 0; i < m->n_targets; i++) {
        free(m->targets[i].device);
        free(m->targets[i].target);
        free(m->targets[i].cflags);
    }
    free(m->graphs);
    free(m->targets);
    free(m);
}

kc_code kc_manifest_load(const char *path, kc_manifest **out, kc_err *err)
{
    *out = NULL;
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    if (!j)
        return kc_err_set(err, KC_ERR_INVALID, "%s:%d:%d: bad JSON: %s", path, je.line, je.column,
                          je.text);
    json_t *graphs = json_object_get(j, "graphs"), *targets = json_object_get(j, "targets");
    const char *fmt = json_string_value(json_object_get(j, "format"));
    if (!fmt || strcmp(fmt, "kcache-manifest/1") || !json_is_array(graphs) ||
        !json_is_array(targets)) {
        json_decref(j);
        return kc_err_set(err, KC_ERR_INVALID,
                          "%s: a manifest needs \"format\": \"kcache-manifest/1\", \"graphs\" "
                          "and \"targets\" arrays",
                          path);
    }
    kc_manifest *m = calloc(1, sizeof *m);
    char *copy = strdup(path);
    kc_code rc = KC_OK;
    if (m) {
        m->graphs = calloc(json_array_size(graphs) + 1, sizeof *m->graphs);
        m->shapes = calloc(json_array_size(graphs) + 1, sizeof *m->shapes);
        m->targets = calloc(json_array_size(targets) + 1, sizeof *m->targets);
    }
    if (!m || !copy || !m->graphs || !m->shapes || !m->targets) {
        rc = kc_err_set(err, KC_ERR_NOMEM, "out of memory reading %s", path);
        goto out;
    }
    m->autotune = json_is_true(json_object_get(j, "autotune"));
    const char *dir = dirname(copy);
    size_t i;
    json_t *v;
    json_array_foreach(graphs, i, v)
    {
        const char *rel = json_string_value(v);
        json_t *shape = json_object_get(v, "shape");
        if (json_is_object(v))
            rel = json_string_value(json_object_get(v, "graph"));
        if (!rel || (shape && !json_is_array(shape))) {
            rc = kc_err_set(err, KC_ERR_INVALID,
                            "%s: graphs[%zu]: an entry is a path or {\"graph\": path, "
                            "\"shape\": [\"NAME=D1xD2\", ...]}",
                            path, i);
            goto out;
        }
        int gi = m->n_graphs++; /* counted now, so an error below frees what it has */
        kc_manifest_shapes *sh = &m->shapes[gi];
        size_t si;
        json_t *sj;
        sh->v = calloc(json_array_size(shape) + 1, sizeof *sh->v);
        if (!sh->v) {
            rc = kc_err_set(err, KC_ERR_NOMEM, "out of memory reading %s", path);
            goto out;
        }
        json_array_foreach(shape, si, sj)
        {
            const char *sv = json_string_value(sj);
            if (!sv) {
                rc = kc_err_set(err, KC_ERR_INVALID,
                                "%s: graphs[%zu]: \"shape\" entries must be strings", path, i);
                goto out;
            }
            if (!(sh->v[sh->n] = strdup(sv))) {
                rc = kc_err_set(err, KC_ERR_NOMEM, "out of memory reading %s", path);
                goto out;
            }
            sh->n++;
        }
        size_t cap = strlen(dir) + strlen(rel) + 2;
        char *p = malloc(cap);
        if (!p) {
            rc = kc_err_set(err, KC_ERR_NOMEM, "out of memory reading %s", path);
            goto out;
        }
        if (rel[0] == '/')
            snprintf(p, cap, "%s", rel);
        else
            snprintf(p, cap, "%s/%s", dir, rel);
        m->graphs[gi] = p;
    }
    json_array_foreach(targets, i, v)
    {
        const char *dev = json_string_value(json_object_get(v, "device"));
        kc_manifest_target *t = &m->targets[m->n_targets++];
        t->device = strdup(dev ? dev : "cpu");
        t->target = dup_or_null(json_string_value(json_object_get(v, "target")));
        t->cflags = dup_or_null(json_string_value(json_object_get(v, "cflags")));
        if (!t->device) {
            rc = kc_err_set(err, KC_ERR_NOMEM, "out of memory reading %s", path);
            goto out;
        }
    }
out:
    free(copy);
    json_decref(j);
    if (rc != KC_OK) {
        kc_manifest_free(m);
        return rc;
    }
    *out = m;
    return KC_OK;
}
