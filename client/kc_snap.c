/*
 * kc_snap.c - the directory-snapshot workflow of kc_snap.h over the store and
 * the server: push (scan, then the files the server lacks, the manifest last),
 * pull (the slot's manifests, a plan, one streamed fetch overlapping the
 * restore), status, explain and what exists of a name.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include <jansson.h>

#include "kc_snap_internal.h"
#include <kcache/kc_util.h>

enum { NEED_DIR = 1, NEED_STORE = 2 };

/* What every call checks first: the words that name the snapshot, and the
 * directory and store when it needs them; fills slot. */
static kc_code begin(const kc_snap_opts *o, const char *what, unsigned needs,
                     char slot[KC_KEY_HEX_LEN + 1], kc_err *err)
{
    if (kc_snapshot_check_ident("snapshot name", o->name, true, err) != KC_OK ||
        kc_snapshot_check_ident("device key", o->device_key, false, err) != KC_OK ||
        kc_snapshot_check_ident("version key", o->version_key, false, err) != KC_OK)
        return err->code;
    if ((needs & NEED_DIR) && (!o->dir || !*o->dir))
        return kc_err_set(err, KC_ERR_INVALID, "snapshot %s '%s': no directory given", what,
                          o->name);
    if ((needs & NEED_STORE) && !o->store)
        return kc_err_set(err, KC_ERR_INVALID, "snapshot %s '%s': no store given", what, o->name);
    kc_snapshot_key(o->name, o->device_key, o->version_key, slot);
    return KC_OK;
}

/* The handle for file artifacts (kc_snap.h: no trust policy, no size limit). */
static kc_code open_files_store(const kc_snap_opts *o, kc_store **s, kc_err *err)
{
    *s = NULL;
    if (!o->cache_dir || !*o->cache_dir)
        return kc_err_set(err, KC_ERR_INVALID, "snapshot '%s': no cache directory given", o->name);
    return kc_store_open(o->cache_dir, NULL, s, err);
}

static int64_t now_us(void)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (int64_t)tv.tv_sec * 1000000 + tv.tv_usec;
}

/* Flushes s (the file handle) and closes it; a failed flush becomes the
 * call's error when there was none. */
static kc_code close_files_store(kc_store *s, kc_code c, kc_err *err)
{
    kc_err ferr = {0};
    if (s && kc_store_flush(s, &ferr) != KC_OK && c == KC_OK) {
        if (err)
            *err = ferr;
        c = ferr.code;
    }
    kc_store_close(s);
    return c;
}

/* ---- push --------------------------------------------------------------- */

/* Uploads the manifest's files the server lacks, then the manifest. */
static kc_code send(const kc_snap_opts *o, kc_store *s, const kc_snap_manifest *m,
                    kc_snap_push_result *res, kc_err *err)
{
    const char **keys = malloc((m->nfiles + 1) * sizeof *keys);
    if (!keys)
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory");
    size_t nk = 0;
    for (size_t i = 0; i < m->n; i++)
        if (m->e[i].type == KC_SNAP_FILE)
            keys[nk++] = m->e[i].key;
    const char *mk = res->manifest;
    kc_code c =
        kc_remote_push_list(o->remote, s, keys, nk, o->progress, o->progress_ctx, &res->sent, err);
    kc_remote_push_stats mps = {0};
    if (c == KC_OK)
        c = kc_remote_push_list(o->remote, s, &mk, 1, NULL, NULL, &mps, err);
    res->manifest_sent = mps.uploaded > 0;
    res->sent.bytes += mps.bytes;
    free(keys);
    return c;
}

kc_code kc_snap_push(const kc_snap_opts *o, kc_snap_push_result *res, kc_err *err)
{
    kc_err local;
    err = err ? err : &local; /* some steps hand their code on through err */
    memset(res, 0, sizeof *res);
    kc_code c = begin(o, "push", NEED_DIR, res->slot, err);
    if (c != KC_OK)
        return c;
    kc_store *s;
    if ((c = open_files_store(o, &s, err)) != KC_OK)
        return c;
    kc_snap_manifest m = {0};
    c = kc_snap_scan(s, o->dir, kc_snap_skip, (void *)o->preset, &m, &res->scan, err);
    if (c == KC_OK) {
        m.name = strdup(o->name);
        m.device = strdup(o->device_key);
        m.version = strdup(o->version_key);
        m.created_us = now_us();
        c = (m.name && m.device && m.version)
                ? kc_snap_manifest_store(s, &m, res->manifest, NULL, err)
                : kc_err_set(err, KC_ERR_NOMEM, "out of memory");
    }
    if (c == KC_OK && o->remote)
        c = send(o, s, &m, res, err);
    kc_snap_manifest_free(&m);
    return close_files_store(s, c, err);
}

/* ---- pull --------------------------------------------------------------- */

/* Fetches the manifests of snapshot name (every device and version when slot
 * is NULL, else that slot's) into st; adds to *bytes and *refused. */
static kc_code fetch_manifests(kc_remote *r, kc_store *st, const char *name, const char *slot,
                               uint64_t *bytes, uint64_t *refused, kc_err *err)
{
    char tag[KC_SNAP_IDENT_MAX + 8];
    snprintf(tag, sizeof tag, "dir:%s", name);
    kc_filter f = {.kind = KC_SNAP_KIND_MANIFEST, .tag = tag};
    const char *devs[] = {slot, NULL};
    kc_bundle_stats bs = {0};
    kc_code rc = kc_remote_pull(r, st, slot ? devs : NULL, &f, NULL, NULL, &bs, err);
    *bytes += bs.bytes;
    *refused += bs.refused;
    return rc;
}

/* Compares dir with m: reports each file that is missing or differs; *bad
 * receives how many. */
static kc_code check_dir(const kc_snap_opts *o, const kc_snap_manifest *m, size_t *bad, kc_err *err)
{
    uint8_t *state = malloc(m->n ? m->n : 1);
    if (!state)
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory");
    kc_code rc = kc_snap_plan(NULL, m, o->dir, state, bad, err);
    for (size_t i = 0; rc == KC_OK && o->report && i < m->n; i++)
        if (m->e[i].type == KC_SNAP_FILE && !(state[i] & KC_SNAP_HAVE_DIR))
            o->report(m->e[i].path, o->report_ctx);
    free(state);
    return rc;
}

/* Fetches the files state marks as needed (one POST /v1/bundle/select),
 * writing each one into the directory straight from the import's check of
 * its payload (renamed into place once proved), then restores the rest of
 * the snapshot (files already in the store, a content named twice) from
 * the store. No restore thread waits on the fetch: on a busy machine every
 * hand-over between threads costs a wait for a CPU. A broken fetch leaves
 * every file whole; the error says how far the restore got. */
static kc_code fetch_and_restore(const kc_snap_opts *o, kc_store *s, const kc_snap_manifest *m,
                                 const uint8_t *state, size_t need, const kc_snap_restore_opts *ro,
                                 kc_bundle_stats *fs, kc_snap_restore_stats *rs, double *t_fetched,
                                 kc_err *err)
{
    const char **keys = malloc(need * sizeof *keys);
    kc_snap_gate *gate = keys ? kc_snap_gate_new(m, state) : NULL;
    if (!gate) {
        free(keys);
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory");
    }
    size_t nk = 0;
    for (size_t i = 0; i < m->n; i++)
        if (m->e[i].type == KC_SNAP_FILE && !state[i])
            keys[nk++] = m->e[i].key;
    kc_bundle_sink sink;
    kc_code c = kc_snap_gate_sink(gate, o->dir, &sink, err);
    if (c == KC_OK) {
        c = kc_remote_pull_keys(o->remote, s, keys, nk, &sink, o->progress, o->progress_ctx, fs,
                                err);
        kc_snap_gate_advance(gate, fs->artifacts); /* a broken stream's complete ones too */
        kc_snap_gate_finish(gate, c == KC_OK);
        *t_fetched = kc_now();
        kc_snap_restore_opts gro = *ro;
        gro.gate = gate;
        kc_err rerr = {0};
        kc_code rc = kc_snap_restore(s, m, o->dir, state, &gro, rs, &rerr);
        if (c != KC_OK && rc != KC_OK)
            kc_err_prefix(err, "%s", rerr.msg);
        else if (c == KC_OK && rc != KC_OK) {
            c = rc;
            if (err)
                *err = rerr;
        }
    }
    kc_snap_gate_free(gate);
    free(keys);
    return c;
}

/* Everything of a pull after the manifest was found: plan, fetch and
 * restore, verify. */
static kc_code restore(const kc_snap_opts *o, kc_store *s, const kc_snap_manifest *m,
                       kc_snap_pull_result *res, double t0, kc_err *err)
{
    uint8_t *state = malloc(m->n ? m->n : 1);
    if (!state)
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory");
    kc_code c = kc_snap_plan(s, m, o->dir, state, &res->fetched, err);
    double t_plan = kc_now(), t_fetch = t_plan;
    res->plan_s = t_plan - t0;
    kc_snap_restore_opts ro = {
        .exact = o->exact, .keep = kc_snap_skip, .keep_ctx = (void *)o->preset};
    kc_bundle_stats fs = {0};
    if (c == KC_OK && res->fetched && o->remote) {
        c = fetch_and_restore(o, s, m, state, res->fetched, &ro, &fs, &res->restore, &t_fetch, err);
        res->bytes_received += fs.bytes;
        res->files_received = fs.imported + fs.present;
    } else if (c == KC_OK) {
        c = kc_snap_restore(s, m, o->dir, state, &ro, &res->restore, err);
    }
    res->fetch_s = t_fetch - t_plan;
    if (c == KC_OK && o->verify) {
        c = check_dir(o, m, &res->missing, err);
        if (c == KC_OK && res->missing)
            c = kc_err_set(err, KC_ERR_MISS,
                           "--verify: %zu of %zu files of snapshot '%s' are "
                           "missing or different in %s",
                           res->missing, m->nfiles, o->name, o->dir);
    }
    res->restore_s = kc_now() - t_fetch;
    free(state);
    return c;
}

kc_code kc_snap_pull(const kc_snap_opts *o, kc_snap_pull_result *res, kc_err *err)
{
    kc_err local;
    err = err ? err : &local; /* some steps hand their code on through err */
    memset(res, 0, sizeof *res);
    double t0 = kc_now();
    kc_code c = begin(o, "pull", NEED_DIR | NEED_STORE, res->slot, err);
    if (c != KC_OK)
        return c;
    kc_store *s;
    if ((c = open_files_store(o, &s, err)) != KC_OK)
        return c;
    kc_snap_manifest m = {0};
    if (o->remote)
        c = fetch_manifests(o->remote, o->store, o->name, res->slot, &res->bytes_received,
                            &res->refused, err);
    if (c == KC_OK) {
        c = kc_snap_manifest_find(o->store, res->slot, &m, res->manifest, err);
        if (c == KC_ERR_NOT_FOUND) {
            kc_err_set(err, KC_ERR_NOT_FOUND,
                       "no snapshot '%s' for device '%s' and version '%s'%s%s", o->name,
                       o->device_key, o->version_key, o->remote ? " on " : "",
                       o->remote ? kc_remote_url(o->remote) : "");
            kc_err ignore;
            if (o->remote) /* so that kc_snap_nearest sees what the server has */
                fetch_manifests(o->remote, o->store, o->name, NULL, &res->bytes_received,
                                &res->refused, &ignore);
        }
    }
    if (c == KC_OK) {
        res->found = true;
        res->files = m.nfiles;
        res->bytes = m.bytes;
        c = restore(o, s, &m, res, t0, err);
    }
    kc_snap_manifest_free(&m);
    return close_files_store(s, c, err);
}

/* ---- status, explain, nearest ------------------------------------------- */

/* Looks up the slot's newest trusted manifest in the store into info (and m). */
static kc_code find(const kc_snap_opts *o, kc_snap_info *info, kc_snap_manifest *m, kc_err *err)
{
    kc_code c = kc_snap_manifest_find(o->store, info->slot, m, info->manifest, err);
    info->found = c == KC_OK;
    if (c == KC_OK) {
        info->files = m->nfiles;
        info->bytes = m->bytes;
    }
    return c;
}

kc_code kc_snap_status(const kc_snap_opts *o, kc_snap_info *info, kc_err *err)
{
    kc_err local;
    err = err ? err : &local; /* some steps hand their code on through err */
    memset(info, 0, sizeof *info);
    kc_code c = begin(o, "status", NEED_DIR | NEED_STORE, info->slot, err);
    if (c != KC_OK)
        return c;
    kc_snap_manifest m = {0};
    c = find(o, info, &m, err);
    if (c == KC_OK)
        c = check_dir(o, &m, &info->missing, err);
    kc_snap_manifest_free(&m);
    return c;
}

kc_code kc_snap_explain(const kc_snap_opts *o, kc_snap_info *info, kc_err *err)
{
    kc_err local;
    err = err ? err : &local; /* some steps hand their code on through err */
    memset(info, 0, sizeof *info);
    kc_code c = begin(o, "explain", NEED_STORE, info->slot, err);
    if (c != KC_OK)
        return c;
    if (o->remote && (c = fetch_manifests(o->remote, o->store, o->name, NULL, &info->bytes_received,
                                          &info->refused, err)) != KC_OK)
        return c;
    kc_snap_manifest m = {0};
    kc_err ignore = {0};
    find(o, info, &m, &ignore); /* not found, untrusted or damaged: info->found false */
    kc_snap_manifest_free(&m);
    return KC_OK;
}

kc_code kc_snap_nearest(const kc_snap_opts *o, kc_snap_near **out, size_t *n, kc_err *err)
{
    kc_err local;
    err = err ? err : &local; /* some steps hand their code on through err */
    *out = NULL;
    *n = 0;
    char slot[KC_KEY_HEX_LEN + 1];
    kc_code c = begin(o, "nearest", NEED_STORE, slot, err);
    if (c != KC_OK)
        return c;
    char tag[KC_SNAP_IDENT_MAX + 8];
    snprintf(tag, sizeof tag, "dir:%s", o->name);
    kc_filter f = {.kind = KC_SNAP_KIND_MANIFEST, .tag = tag};
    char(*keys)[KC_KEY_HEX_LEN + 1];
    size_t nkeys;
    if ((c = kc_store_list_keys(o->store, &f, &keys, &nkeys, err)) != KC_OK)
        return c;
    kc_snap_near *near = malloc((nkeys ? nkeys : 1) * sizeof *near);
    if (!near) {
        free(keys);
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory");
    }
    size_t nn = 0;
    for (size_t i = 0; i < nkeys; i++) {
        kc_artifact art;
        kc_err e = {0};
        if (kc_store_get(o->store, keys[i], &art, &e) != KC_OK)
            continue; /* evicted or refused meanwhile */
        json_t *meta = json_loads(art.meta, 0, NULL);
        const char *dk = json_string_value(json_object_get(meta, "device_key"));
        const char *vk = json_string_value(json_object_get(meta, "version"));
        bool seen = !dk || !vk;
        for (size_t k = 0; !seen && k < nn; k++)
            seen = strcmp(near[k].device_key, dk) == 0 && strcmp(near[k].version_key, vk) == 0;
        if (!seen) {
            kc_snap_near *x = &near[nn++];
            snprintf(x->device_key, sizeof x->device_key, "%s", dk);
            snprintf(x->version_key, sizeof x->version_key, "%s", vk);
            bool dd = strcmp(dk, o->device_key) != 0;
            bool vd = strcmp(vk, o->version_key) != 0;
            x->differs = dd && vd ? "device and version"
                         : dd     ? "device"
                         : vd     ? "version"
                                  : "nothing";
        }
        json_decref(meta);
        kc_artifact_free(&art);
    }
    free(keys);
    *out = near;
    *n = nn;
    return KC_OK;
}
