/*
 * kc_compile.c - the compile driver: graph record lookup, lowering,
 * autotuning, kernel lookups, parallel compilation of misses (one worker per
 * core), write-back through the tiers, loading, and the runner.
 */
#include <kcache/kc_compile.h>

#include "kc_driver.h"

#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kc_kernel_json.h"
#include <kcache/kc_log.h>
#include <kcache/kc_lower.h>
#include <kcache/kc_util.h>

#define KC_RECORD_FORMAT "kcache-graph-record/1"

kc_code kc_kernel_fp(const kc_kernel *k, char out[KC_KEY_HEX_LEN + 1], kc_err *err)
{
    char *id = kc_kernel_identity_json(k);
    if (!id)
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory");
    kc_sha256_hex(id, strlen(id), out);
    free(id);
    return KC_OK;
}

static kc_code kernel_key(kc_program *p, const kc_kernel *k, char out[KC_KEY_HEX_LEN + 1],
                          kc_err *err)
{
    char fp[KC_KEY_HEX_LEN + 1];
    kc_code rc = kc_kernel_fp(k, fp, err);
    if (rc == KC_OK)
        kc_key_kernel(p->backend->ops->artifact_kind, fp, p->device.hash, p->compiler_fp, out);
    return rc;
}

/* Server hits of the cache so far (a lookup that raised it came from the server). */
static uint64_t remote_hits(kc_cache *c)
{
    kc_cache_stats st;
    kc_cache_stats_get(c, &st);
    return st.remote_hits;
}

/* Did a lookup since *before find a damaged entry (quarantined, a miss)? */
static bool damaged_since(kc_cache *c, const kc_cache_stats *before)
{
    kc_cache_stats now;
    kc_cache_stats_get(c, &now);
    return now.damaged > before->damaged;
}

/* ---- parallel compilation ------------------------------------------------- */

typedef struct job {
    const kc_kernel *k;
    char key[KC_KEY_HEX_LEN + 1];
    uint8_t *payload;
    size_t len;
    double secs;
    int ran;
    int weight; /* kernels of the graph with this key (progress) */
    bool hit;   /* stored by another process while we waited for its claim */
    bool done;  /* compiled here (compile_claimed) */
    kc_code rc;
    kc_err err;
} job;

typedef struct pool {
    kc_backend *b;
    job *jobs;
    int n;
    int next;
    pthread_mutex_t mu;
    const kc_compile_opts *o; /* its progress callback */
    int *settled, total;      /* kernels settled so far, of total; NULL: no progress */
} pool;

static void *worker(void *arg)
{
    pool *pl = arg;
    for (;;) {
        pthread_mutex_lock(&pl->mu);
        int i = pl->next < pl->n ? pl->next++ : -1;
        pthread_mutex_unlock(&pl->mu);
        if (i < 0)
            return NULL;
        job *j = &pl->jobs[i];
        double t0 = kc_now();
        char *src = NULL;
        j->rc = pl->b->ops->generate(pl->b, j->k, &src, &j->err);
        if (j->rc == KC_OK)
            j->rc = pl->b->ops->compile(pl->b, j->k, src, j->key, &j->payload, &j->len, &j->ran,
                                        &j->err);
        free(src);
        j->secs = kc_now() - t0;
        if (pl->o->progress && pl->settled) {
            pthread_mutex_lock(&pl->mu);
            *pl->settled += j->weight;
            pl->o->progress(*pl->settled, pl->total, pl->o->progress_ctx);
            pthread_mutex_unlock(&pl->mu);
        }
    }
}

static int online_cpus(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* Compiles jobs in parallel, stores the results through the tiers. */
static kc_code run_jobs(kc_program *p, kc_cache *t, job *jobs, int n, const kc_compile_opts *o,
                        int *settled, kc_err *err)
{
    if (n == 0)
        return KC_OK;
    int nt = o->jobs > 0 ? o->jobs : online_cpus();
    if (nt > n)
        nt = n;
    pool pl = {
        .b = p->backend, .jobs = jobs, .n = n, .o = o, .settled = settled, .total = p->n_kernels};
    pthread_mutex_init(&pl.mu, NULL);
    pthread_t th[64];
    if (nt > 64)
        nt = 64;
    int started = 0;
    for (int i = 1; i < nt; i++)
        if (pthread_create(&th[started], NULL, worker, &pl) == 0)
            started++;
    worker(&pl);
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    pthread_mutex_destroy(&pl.mu);
    kc_code rc = KC_OK;
    for (int i = 0; i < n; i++) {
        job *j = &jobs[i];
        p->compiled += j->ran;
        if (j->rc != KC_OK) {
            if (rc == KC_OK) {
                *err = j->err;
                rc = j->rc;
            }
            continue;
        }
        /* built by the JSON library: a tag or an id never becomes JSON syntax */
        json_t *m =
            json_pack("{s:s,s:s,s:s,s:s,s:s,s:I,s:I}", "device", p->device.id, "device_hash",
                      p->device.hash, "compiler_fp", p->compiler_fp, "graph_fp", p->graph->fp,
                      "kernel", kc_kernel_kind_name(j->k->kind), "compile_ms",
                      (json_int_t)(j->secs * 1e3), "created", (json_int_t)time(NULL));
        if (m && o->tag)
            json_object_set_new(m, "tag", json_string(o->tag));
        char *meta = m ? json_dumps(m, JSON_COMPACT) : NULL;
        json_decref(m);
        if (!meta) {
            if (rc == KC_OK)
                rc = kc_err_set(err, KC_ERR_NOMEM, "out of memory");
            continue;
        }
        kc_artifact a;
        kc_code prc = kc_artifact_init(&a, j->key, p->backend->ops->artifact_kind, meta, j->payload,
                                       j->len, err);
        if (prc == KC_OK) {
            prc = kc_cache_put(t, &a, 0, err);
            kc_artifact_free(&a);
        }
        free(meta);
        if (prc != KC_OK && rc == KC_OK)
            rc = prc;
    }
    return rc;
}

/* ---- one compile per key across processes ---------------------------------------- */

/* Default bound on waiting for another process's compile of a key. */
#define KC_CLAIM_WAIT_S 120.0

/* Job x is a hit after all (another process stored its key meanwhile): it
 * is read back when the program loads kernels, and every kernel with that
 * key is counted as a hit instead of a miss. */
static kc_code job_became_hit(kc_program *p, kc_cache *t, job *j, const kc_compile_opts *o,
                              kc_err *err)
{
    j->hit = true;
    for (int i = 0; i < p->n_kernels; i++)
        if (strcmp(p->keys[i], j->key) == 0) {
            p->misses--;
            p->hits++;
        }
    if (!o->load)
        return KC_OK;
    kc_artifact a;
    kc_code rc = kc_cache_get(t, j->key, 0, &a, err);
    if (rc != KC_OK)
        return kc_err_prefix(err, "kernel %s", j->key);
    j->payload = a.payload;
    j->len = a.payload_len;
    a.payload = NULL;
    kc_artifact_free(&a);
    return KC_OK;
}

/* Is key stored now? (checked like any hit) */
static bool stored_now(kc_cache *t, const char *key)
{
    kc_err e = {0};
    return kc_cache_has(t, key, KC_CACHE_LOCAL, &e) == KC_OK;
}

/* Compiles the missed jobs so that processes sharing the cache compile each
 * key once: keys claimed here are compiled here (a claim taken just after
 * another process stored the key is a hit); keys another process is
 * compiling are waited for once ours are done, then found stored, or
 * compiled here if their holder failed or the wait timed out. */
static kc_code compile_claimed(kc_program *p, kc_cache *t, job *jobs, int nj,
                               const kc_compile_opts *o, int *settled, kc_err *err)
{
    if (nj == 0)
        return KC_OK;
    double wait_s = o->claim_wait_s > 0 ? o->claim_wait_s : KC_CLAIM_WAIT_S;
    kc_claim **claims = calloc((size_t)nj, sizeof *claims);
    job *run = calloc((size_t)nj, sizeof *run);
    int *from = calloc((size_t)nj, sizeof(int));
    kc_code rc = KC_OK;
    if (!claims || !run || !from) {
        rc = kc_err_set(err, KC_ERR_NOMEM, "out of memory");
        goto out;
    }
    int waiting = 0;
    for (int pass = 0; pass < 2 && rc == KC_OK; pass++) {
        int nr = 0;
        if (pass == 1 && waiting && o->verbosity > 0)
            kc_log(KC_LOG_INFO, "waiting for %d kernel%s another process is compiling", waiting,
                   waiting == 1 ? "" : "s");
        for (int x = 0; x < nj; x++) {
            job *j = &jobs[x];
            if (j->hit || j->done)
                continue;
            kc_err e = {0};
            kc_code crc = kc_cache_claim(t, j->key, pass ? wait_s : 0, &claims[x], &e);
            if (crc == KC_OK && !claims[x] && pass == 0) {
                waiting++; /* someone else has it: come back once ours are done */
                continue;
            }
            if (crc != KC_OK && o->verbosity > 0)
                kc_log(KC_LOG_INFO, "%s; compiling without a claim", e.msg);
            else if (!claims[x] && o->verbosity > 0)
                kc_log(KC_LOG_INFO,
                       "waited %.0f s for another process compiling %s; compiling it here too",
                       wait_s, j->key);
            if (stored_now(t, j->key)) {
                kc_claim_release(claims[x]);
                claims[x] = NULL;
                if ((rc = job_became_hit(p, t, j, o, err)))
                    break;
                continue;
            }
            j->done = true;
            from[nr] = x;
            run[nr++] = *j;
        }
        if (rc == KC_OK)
            rc = run_jobs(p, t, run, nr, o, settled, err);
        for (int r = 0; r < nr; r++) { /* results back into the caller's jobs */
            jobs[from[r]].payload = run[r].payload;
            jobs[from[r]].len = run[r].len;
            run[r].payload = NULL;
            kc_claim_release(claims[from[r]]);
            claims[from[r]] = NULL;
        }
    }
out:
    for (int x = 0; claims && x < nj; x++)
        kc_claim_release(claims[x]);
    free(claims);
    free(run);
    free(from);
    return rc;
}

/* ---- autotuning -------------------------------------------------------------- */

static const char *const gemm_candidates[] = {"tile:4x16", "tile:6x16", "tile:8x8", "tile:4x32",
                                              "onednn"};
static const char *const conv_candidates[] = {"direct", "onednn"};
#define N_CAND 5

/* The implementations worth timing for a kernel (none for other kinds). */
static int candidates(const kc_kernel *k, const char *const **out)
{
    if (k->kind == KC_KK_GEMM) {
        *out = gemm_candidates;
        return 5;
    }
    if (k->kind == KC_KK_CONV2D) {
        *out = conv_candidates;
        return 2;
    }
    return 0;
}

static double time_kernel(kc_backend *b, const kc_kernel *k, const uint8_t *payload, size_t len,
                          kc_err *err)
{
    kc_loaded *l = NULL;
    if (b->ops->load(b, k, payload, len, &l, err) != KC_OK)
        return -1;
    float *in[KC_KERNEL_MAX_IN];
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < k->n_in; i++) {
        int64_t n = kc_shape_numel(&k->in_shape[i]);
        in[i] = malloc(sizeof(float) * (size_t)n);
        for (int64_t j = 0; in[i] && j < n; j++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            in[i][j] = (float)((s >> 40) & 0xffff) / 65536.f - 0.5f;
        }
    }
    float *out = malloc(sizeof(float) * (size_t)kc_shape_numel(&k->out_shape));
    /* a candidate that cannot run (no memory, a failing primitive) must not
     * be timed as the fastest: it is out of the race */
    bool ok = out != NULL;
    for (int i = 0; i < k->n_in; i++)
        ok = ok && in[i] != NULL;
    double best = 1e30;
    if (ok && b->ops->run(b, l, k, (const float *const *)in, out, err) != KC_OK) /* warm-up */
        ok = false;
    for (int r = 0; ok && r < 5; r++) {
        double t0 = kc_now();
        if (b->ops->run(b, l, k, (const float *const *)in, out, err) != KC_OK) {
            ok = false;
            break;
        }
        double dt = kc_now() - t0;
        if (dt < best)
            best = dt;
        if (best > 0.05)
            break;
    }
    for (int i = 0; i < k->n_in; i++)
        free(in[i]);
    free(out);
    b->ops->unload(b, l);
    return ok ? best : -1;
}

bool kc_autotune_decision(kc_cache *t, const char *tkey, char impl[32])
{
    kc_artifact a;
    kc_err e = {0};
    char choice[32] = "";
    if (kc_cache_get(t, tkey, 0, &a, &e) != KC_OK)
        return false;
    json_t *d = json_loadb((const char *)a.payload, a.payload_len, 0, NULL);
    const char *ch = json_string_value(json_object_get(d, "choice"));
    if (ch)
        snprintf(choice, sizeof choice, "%s", ch);
    json_decref(d);
    kc_artifact_free(&a);
    if (!choice[0])
        return false;
    memcpy(impl, choice, sizeof choice);
    return true;
}

void kc_choose_impls(kc_backend *b, kc_kernel *ks, int n)
{
    for (int i = 0; b->ops->choose_impl && i < n; i++)
        b->ops->choose_impl(b, &ks[i], ks[i].impl);
}

bool kc_impl_tunable(const kc_kernel *k)
{
    const char *const *cand;
    return candidates(k, &cand) > 0;
}

/* The tuned kernel's problem in words, kept in the decision for people comparing
 * decisions with the cost model (not read back). */
static void tuned_shape(const kc_kernel *k, char *out, size_t n)
{
    if (k->kind == KC_KK_GEMM)
        snprintf(out, n, "batch %lld m %lld n %lld k %lld%s", (long long)k->gemm.batch,
                 (long long)k->gemm.m, (long long)k->gemm.n, (long long)k->gemm.k,
                 k->gemm.trans_b ? " trans_b" : "");
    else
        snprintf(
            out, n, "n %lld c %lld h %lld w %lld o %lld k %lldx%lld stride %d pad %d groups %d",
            (long long)k->conv.n, (long long)k->conv.c, (long long)k->conv.h, (long long)k->conv.w,
            (long long)k->conv.o, (long long)k->conv.kh, (long long)k->conv.kw, k->conv.stride,
            k->conv.padding, k->conv.groups > 1 ? k->conv.groups : 1);
}

/* Sets impl of every GEMM and conv2d kernel from an autotune artifact or a
 * benchmark of its candidate implementations. */
static kc_code autotune(kc_program *p, kc_cache *t, const kc_compile_opts *o, kc_err *err)
{
    kc_backend *b = p->backend;
    if (strcmp(b->ops->name, "cpu") != 0)
        return KC_OK; /* the CPU backend is the one with tile/oneDNN choices */
    int n = p->n_kernels;
    char(*tkey)[KC_KEY_HEX_LEN + 1] = calloc((size_t)n + 1, sizeof *tkey);
    kc_kernel *cands = calloc((size_t)n * N_CAND + 1, sizeof *cands);
    job *jobs = calloc((size_t)n * N_CAND + 1, sizeof *jobs);
    int *need = calloc((size_t)n + 1, sizeof(int));
    kc_code rc = KC_OK;
    int nj = 0;
    if (!tkey || !cands || !jobs || !need) {
        rc = kc_err_set(err, KC_ERR_NOMEM, "out of memory");
        goto out;
    }
    for (int i = 0; i < n; i++) {
        kc_kernel *k = &p->kernels[i];
        const char *const *cand = NULL;
        int nc = candidates(k, &cand);
        if (!nc)
            continue;
        char fp[KC_KEY_HEX_LEN + 1];
        k->impl[0] = 0;
        if ((rc = kc_kernel_fp(k, fp, err)))
            goto out;
        kc_key_autotune(fp, p->device.hash, p->compiler_fp, tkey[i]);
        /* the same shape earlier in this graph? */
        for (int j = 0; j < i; j++)
            if (strcmp(tkey[j], tkey[i]) == 0 && p->kernels[j].impl[0]) {
                snprintf(k->impl, sizeof k->impl, "%s", p->kernels[j].impl);
                break;
            }
        if (k->impl[0])
            continue;
        kc_err e = {0};
        if (kc_autotune_decision(t, tkey[i], k->impl))
            continue;
        bool dup = false;
        for (int j = 0; j < i; j++)
            dup = dup || (need[j] && strcmp(tkey[j], tkey[i]) == 0);
        if (dup)
            continue;
        if (o->require_hit) {
            rc = kc_err_set(err, KC_ERR_MISS,
                            "--require-hit: autotune decision %s for a %s kernel is not cached",
                            tkey[i], kc_kernel_kind_name(k->kind));
            goto out;
        }
        need[i] = 1;
        for (int c = 0; c < nc; c++) {
            kc_kernel *ck = &cands[i * N_CAND + c];
            *ck = *k;
            snprintf(ck->impl, sizeof ck->impl, "%s", cand[c]);
            job *j = &jobs[nj];
            j->k = ck;
            if ((rc = kernel_key(p, ck, j->key, err)))
                goto out;
            if (kc_cache_has(t, j->key, 0, &e) != KC_OK)
                nj++;
        }
    }
    if ((rc = run_jobs(p, t, jobs, nj, o, NULL, err))) /* candidates: no progress */
        goto out;
    for (int i = 0; i < n; i++) {
        if (!need[i])
            continue;
        kc_kernel *k = &p->kernels[i];
        const char *const *cand = NULL;
        int nc = candidates(k, &cand);
        if (!nc)
            continue;
        double best = 1e30;
        const char *choice = cand[0];
        json_t *timings = json_object();
        for (int c = 0; c < nc; c++) {
            kc_kernel *ck = &cands[i * N_CAND + c];
            char key[KC_KEY_HEX_LEN + 1];
            kc_artifact a;
            kc_err e = {0};
            if (kernel_key(p, ck, key, &e) || kc_cache_get(t, key, 0, &a, &e))
                continue;
            double s = time_kernel(p->backend, ck, a.payload, a.payload_len, &e);
            kc_artifact_free(&a);
            if (s < 0)
                continue;
            json_object_set_new(timings, cand[c], json_real(s * 1e6));
            if (s < best) {
                best = s;
                choice = cand[c];
            }
        }
        snprintf(k->impl, sizeof k->impl, "%s", choice);
        char shape[160];
        tuned_shape(k, shape, sizeof shape);
        json_t *d = json_pack("{s:s,s:o,s:s,s:s,s:s,s:i}", "choice", choice, "timings_us", timings,
                              "unit", "microseconds", "kernel", kc_kernel_kind_name(k->kind),
                              "shape", shape, "threads", b->threads);
        char *txt = json_dumps(d, JSON_COMPACT | JSON_SORT_KEYS);
        json_decref(d);
        json_t *mj =
            json_pack("{s:s,s:s,s:s,s:I}", "device", p->device.id, "device_hash", p->device.hash,
                      "compiler_fp", p->compiler_fp, "created", (json_int_t)time(NULL));
        char *meta = mj ? json_dumps(mj, JSON_COMPACT) : NULL;
        json_decref(mj);
        kc_artifact a;
        if (txt && meta &&
            kc_artifact_init(&a, tkey[i], "autotune", meta, txt, strlen(txt), err) == KC_OK) {
            kc_cache_put(t, &a, 0, err);
            kc_artifact_free(&a);
        }
        free(txt);
        free(meta);
        p->autotuned++;
        /* equal shapes later in the graph take the same choice */
        for (int j = i + 1; j < n; j++)
            if (strcmp(tkey[j], tkey[i]) == 0)
                snprintf(p->kernels[j].impl, sizeof p->kernels[j].impl, "%s", choice);
    }
out:
    for (int i = 0; i < nj; i++)
        free(jobs[i].payload);
    free(tkey);
    free(cands);
    free(jobs);
    free(need);
    return rc;
}

/* ---- graph records ------------------------------------------------------------- */

/* A graph record: {"format", "graph_fp", "device", "autotune": {...},
 * "descs": [kernel identity, one per distinct kernel],
 * "kernels": [[key, desc index, [input value ids], output value id, fused nodes], ...]}.
 * Each distinct kernel is described once, so a warm compile parses little. */
kc_code kc_record_parse(kc_program *p, const kc_artifact *a, kc_err *err)
{
    json_error_t je;
    json_t *r = json_loadb((const char *)a->payload, a->payload_len, 0, &je);
    json_t *ks = json_object_get(r, "kernels"), *ds = json_object_get(r, "descs");
    kc_code rc = KC_OK;
    kc_kernel *descs = NULL;
    const char *fmt = json_string_value(json_object_get(r, "format"));
    if (!r || !fmt || strcmp(fmt, KC_RECORD_FORMAT) != 0 || !json_is_array(ks) ||
        !json_is_array(ds)) {
        rc = kc_err_set(err, KC_ERR_CORRUPT, "graph record %s is malformed", a->key);
        goto out;
    }
    int n = (int)json_array_size(ks), nd = (int)json_array_size(ds);
    p->kernels = calloc((size_t)n + 1, sizeof *p->kernels);
    p->keys = calloc((size_t)n + 1, sizeof *p->keys);
    descs = calloc((size_t)nd + 1, sizeof *descs);
    if (!p->kernels || !p->keys || !descs) {
        rc = kc_err_set(err, KC_ERR_NOMEM, "out of memory");
        goto out;
    }
    for (int d = 0; d < nd; d++)
        if ((rc = kc_kernel_from_json_object(json_array_get(ds, (size_t)d), &descs[d], err)))
            goto out;
    const kc_graph *g = p->graph;
    for (int i = 0; i < n; i++) {
        json_t *ko = json_array_get(ks, (size_t)i), *bind = NULL;
        const char *key = NULL;
        int d = -1, outv = -1, fused = 0;
        bool ok = !json_unpack(ko, "[s,i,o,i,i]", &key, &d, &bind, &outv, &fused) &&
                  kc_key_valid(key) && d >= 0 && d < nd && json_is_array(bind) &&
                  (int)json_array_size(bind) == descs[d].n_in;
        kc_kernel *k = &p->kernels[i];
        if (ok) {
            *k = descs[d];
            k->out_value = outv;
            k->n_fused = fused;
            for (int j = 0; j < k->n_in; j++)
                k->in_value[j] = (int)json_integer_value(json_array_get(bind, (size_t)j));
        }
        /* bindings must name values of this graph with the kernel's shapes, so a
         * damaged record can never make a kernel read past a buffer */
        ok = ok && k->out_value >= 0 && k->out_value < g->n_values &&
             kc_shape_equal(&k->out_shape, &g->values[k->out_value].shape);
        for (int j = 0; ok && j < k->n_in; j++)
            ok = k->in_value[j] >= 0 && k->in_value[j] < g->n_values &&
                 kc_shape_equal(&k->in_shape[j], &g->values[k->in_value[j]].shape) &&
                 (k->kind != KC_KK_OP || k->in_dt[j] == g->values[k->in_value[j]].dtype);
        ok = ok && (k->kind != KC_KK_OP || k->out_dt == g->values[k->out_value].dtype);
        if (!ok) {
            rc = kc_err_set(err, KC_ERR_CORRUPT, "graph record %s: bad kernel %d", a->key, i);
            goto out;
        }
        memcpy(p->keys[i], key, KC_KEY_HEX_LEN + 1);
    }
    p->n_kernels = n;
out:
    free(descs);
    json_decref(r);
    return rc;
}

static kc_code record_put(kc_program *p, kc_cache *t, const kc_compile_opts *o, double secs,
                          kc_err *err)
{
    json_t *r = json_object();
    json_object_set_new(r, "format", json_string(KC_RECORD_FORMAT));
    json_object_set_new(r, "graph_fp", json_string(p->graph->fp));
    json_object_set_new(r, "device", json_string(p->device.id));
    json_t *ks = json_array(), *tune = json_object(), *ds = json_array();
    for (int i = 0; i < p->n_kernels; i++) {
        const kc_kernel *kk = &p->kernels[i];
        int d = -1;
        for (int j = 0; j < i && d < 0; j++)
            if (strcmp(p->keys[j], p->keys[i]) == 0)
                d = (int)json_integer_value(json_array_get(json_array_get(ks, (size_t)j), 1));
        if (d < 0) {
            d = (int)json_array_size(ds);
            json_array_append_new(ds, kc_kernel_identity_object(kk));
        }
        json_t *bind = json_array();
        for (int j = 0; j < kk->n_in; j++)
            json_array_append_new(bind, json_integer(kk->in_value[j]));
        json_array_append_new(
            ks, json_pack("[s,i,o,i,i]", p->keys[i], d, bind, kk->out_value, kk->n_fused));
        if (p->kernels[i].impl[0]) {
            char name[96];
            const kc_kernel *k = &p->kernels[i];
            if (k->kind == KC_KK_GEMM)
                snprintf(name, sizeof name, "kernel %d gemm %lldx%lldx%lldx%lld", i,
                         (long long)k->gemm.batch, (long long)k->gemm.m, (long long)k->gemm.n,
                         (long long)k->gemm.k);
            else
                snprintf(name, sizeof name, "kernel %d %s", i, kc_kernel_kind_name(k->kind));
            json_object_set_new(tune, name, json_string(k->impl));
        }
    }
    json_object_set_new(r, "descs", ds);
    json_object_set_new(r, "kernels", ks);
    json_object_set_new(r, "autotune", tune);
    /* the canonical form, so explain can name the first node in which
     * another graph differs from this one (kc_graph_canon_diff) */
    char *canon = kc_graph_canonical_text(p->graph);
    if (canon)
        json_object_set_new(r, "canon", json_string(canon));
    free(canon);
    char *txt = json_dumps(r, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(r);
    json_t *m = json_pack("{s:s,s:s,s:s,s:s,s:s,s:I,s:I}", "device", p->device.id, "device_hash",
                          p->device.hash, "compiler_fp", p->compiler_fp, "graph_fp", p->graph->fp,
                          "options", p->options, "compile_ms", (json_int_t)(secs * 1e3), "created",
                          (json_int_t)time(NULL));
    json_t *dj = json_loads(p->device.json, 0, NULL);
    if (dj)
        json_object_set_new(m, "device_json", dj);
    if (o->tag)
        json_object_set_new(m, "tag", json_string(o->tag));
    json_object_set_new(m, "graph_name", json_string(p->graph->name));
    char *meta = json_dumps(m, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(m);
    kc_code rc = KC_OK;
    kc_artifact a;
    if (!txt || !meta)
        rc = kc_err_set(err, KC_ERR_NOMEM, "out of memory");
    else if ((rc = kc_artifact_init(&a, p->graph_key, "graph", meta, txt, strlen(txt), err)) ==
             KC_OK) {
        rc = kc_cache_put(t, &a, 0, err);
        kc_artifact_free(&a);
    }
    free(txt);
    free(meta);
    return rc;
}

/* ---- the driver ------------------------------------------------------------------ */

kc_code kc_compile(kc_backend *b, kc_cache *t, const kc_graph *g, const kc_compile_opts *o,
                   kc_program **out, kc_err *err)
{
    double t0 = kc_now();
    kc_compile_opts defaults = {0};
    if (!o)
        o = &defaults;
    if (o->tag && kc_tag_check(o->tag, err) != KC_OK)
        return KC_ERR_INVALID;
    kc_program *p = calloc(1, sizeof *p);
    if (!p)
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory");
    p->graph = g;
    p->backend = b;
    kc_code rc;
    job *jobs = NULL;
    if ((rc = b->ops->device_fp(b, &p->device, err)) ||
        (rc = b->ops->compiler_fp(b, p->compiler_fp, err)))
        goto fail;
    kc_compile_options_text(b, o, p->options);
    kc_key_graph_record(g->fp, p->device.hash, p->compiler_fp, p->options, p->graph_key);

    kc_artifact rec;
    kc_err e = {0};
    /* what a server is told about the keys asked for (shown beside a miss), as data: the
     * cache decides whether and how it goes along */
    kc_cache_hint hint = {"graph", p->device.id, g->name};
    kc_cache_hint_set(t, &hint);
    /* one read snapshot for the record and every kernel lookup (a burst) */
    kc_cache_burst(t, true);
    if (kc_cache_get(t, p->graph_key, 0, &rec, &e) == KC_OK) {
        rc = kc_record_parse(p, &rec, err);
        kc_artifact_free(&rec);
        if (rc == KC_OK) {
            p->graph_hit = true;
        } else {
            /* a damaged record: forget it, lower again, store a good one */
            free(p->kernels);
            free(p->keys);
            p->kernels = NULL;
            p->keys = NULL;
            p->n_kernels = 0;
            kc_cache_burst(t, false);
            kc_cache_drop(t, p->graph_key, &e);
            kc_err_clear(err);
        }
    }
    if (!p->graph_hit) {
        if ((rc = kc_lower_ex(g, b->ops->lower_flags, &p->kernels, &p->n_kernels, err)))
            goto fail;
        kc_choose_impls(b, p->kernels, p->n_kernels);
        p->keys = calloc((size_t)p->n_kernels + 1, sizeof *p->keys);
        if (!p->keys) {
            rc = kc_err_set(err, KC_ERR_NOMEM, "out of memory");
            goto fail;
        }
        hint.kind = "autotune";
        kc_cache_hint_set(t, &hint);
        if (o->autotune && (rc = autotune(p, t, o, err)))
            goto fail;
        for (int i = 0; i < p->n_kernels; i++)
            if ((rc = kernel_key(p, &p->kernels[i], p->keys[i], err)))
                goto fail;
    }
    int n = p->n_kernels;
    for (int i = 0; i < n; i++) { /* which inputs keep their values between runs */
        kc_kernel *k = &p->kernels[i];
        k->const_in = 0;
        for (int j = 0; j < k->n_in; j++)
            if (g->values[k->in_value[j]].role == KC_VAL_PARAM)
                k->const_in |= 1u << j;
    }
    p->loaded = calloc((size_t)n + 1, sizeof *p->loaded);
    p->load_owner = calloc((size_t)n + 1, sizeof(int));
    jobs = calloc((size_t)n + 1, sizeof *jobs);
    if (!p->loaded || !p->load_owner || !jobs) {
        rc = kc_err_set(err, KC_ERR_NOMEM, "out of memory");
        goto fail;
    }
    /* look up every distinct kernel key and load each hit as it is read, in
     * the record's read snapshot. Loading on a second thread overlapped the
     * two halves but cost more CPU (thread start, a second malloc arena,
     * wake-ups) than it hid, and was no faster in wall time on a busy host. */
    int nj = 0;
    hint.kind = b->ops->artifact_kind;
    kc_cache_hint_set(t, &hint);
    for (int i = 0; i < n; i++) {
        p->load_owner[i] = i;
        for (int j = 0; j < i; j++)
            if (strcmp(p->keys[j], p->keys[i]) == 0) {
                p->load_owner[i] = p->load_owner[j];
                break;
            }
        if (p->load_owner[i] != i) {
            bool was_miss = false;
            for (int x = 0; x < nj; x++)
                was_miss = was_miss || strcmp(jobs[x].key, p->keys[i]) == 0;
            if (was_miss)
                p->misses++;
            else
                p->hits++;
            continue;
        }
        bool remote = false;
        kc_code hrc;
        kc_cache_stats before_st;
        kc_cache_stats_get(t, &before_st);
        if (o->load) {
            kc_artifact a;
            uint64_t before = remote_hits(t);
            hrc = kc_cache_get(t, p->keys[i], 0, &a, &e);
            remote = remote_hits(t) > before;
            if (hrc == KC_OK) {
                hrc = b->ops->load(b, &p->kernels[i], a.payload, a.payload_len, &p->loaded[i], err);
                kc_artifact_free(&a);
                if (hrc == KC_ERR_MISS) {
                    /* the device refused a cached binary (e.g. a driver update):
                     * drop it and compile again under the same key */
                    kc_cache_drop(t, p->keys[i], &e);
                    kc_err_clear(err);
                } else if (hrc != KC_OK) {
                    rc = kc_err_prefix(err, "kernel %s", p->keys[i]);
                    goto fail;
                }
            }
        } else {
            uint64_t before = remote_hits(t);
            hrc = kc_cache_has(t, p->keys[i], 0, &e);
            remote = remote_hits(t) > before;
        }
        if (hrc == KC_OK) {
            p->hits++;
            p->remote_hits += remote;
            continue;
        }
        if (o->require_hit) {
            rc =
                kc_err_set(err, KC_ERR_MISS,
                           "--require-hit: kernel %s (%s, from graph %s) is not cached for %s%s",
                           p->keys[i], kc_kernel_kind_name(p->kernels[i].kind), g->fp, p->device.id,
                           damaged_since(t, &before_st)
                               ? " (its stored copy failed its integrity check: quarantined)"
                               : "");
            goto fail;
        }
        p->misses++;
        jobs[nj].k = &p->kernels[i];
        memcpy(jobs[nj].key, p->keys[i], sizeof jobs[nj].key);
        nj++;
    }
    kc_cache_burst(t, false);
    kc_cache_hint_set(t, NULL);
    if (o->verbosity > 0 && nj)
        kc_log(KC_LOG_INFO, "compiling %d kernel%s", nj, nj == 1 ? "" : "s");
    int settled = n;
    for (int x = 0; x < nj; x++) {
        for (int i = 0; i < n; i++)
            jobs[x].weight += strcmp(p->keys[i], jobs[x].key) == 0;
        settled -= jobs[x].weight;
    }
    if (o->progress)
        o->progress(settled, n, o->progress_ctx);
    double tc = kc_now();
    if ((rc = compile_claimed(p, t, jobs, nj, o, &settled, err)))
        goto fail;
    if (o->load) {
        for (int x = 0; x < nj; x++) {
            int i = (int)(jobs[x].k - p->kernels);
            if ((rc = b->ops->load(b, jobs[x].k, jobs[x].payload, jobs[x].len, &p->loaded[i], err)))
                goto fail;
        }
        for (int i = 0; i < n; i++)
            p->loaded[i] = p->loaded[p->load_owner[i]];
    }
    if (!p->graph_hit && (rc = record_put(p, t, o, kc_now() - tc, err)))
        goto fail;
    for (int x = 0; x < nj; x++)
        free(jobs[x].payload);
    free(jobs);
    if (o->progress && nj) /* with nothing to compile, the first call said it all */
        o->progress(n, n, o->progress_ctx);
    p->seconds = kc_now() - t0;
    *out = p;
    return KC_OK;
fail:
    kc_cache_burst(t, false);
    kc_cache_hint_set(t, NULL);
    if (jobs)
        for (int x = 0; x < n; x++)
            free(jobs[x].payload);
    free(jobs);
    kc_program_free(p);
    return rc;
}

void kc_program_free(kc_program *p)
{
    if (!p)
        return;
    if (p->loaded)
        for (int i = 0; i < p->n_kernels; i++)
            if (p->load_owner[i] == i && p->loaded[i])
                p->backend->ops->unload(p->backend, p->loaded[i]);
    free(p->loaded);
    free(p->load_owner);
    free(p->kernels);
    free(p->keys);
    kc_device_fp_free(&p->device);
    free(p);
}

kc_code kc_program_run_profiled(kc_program *p, float *const *values, double *kernel_s, kc_err *err)
{
    for (int i = 0; i < p->n_kernels; i++) {
        kc_kernel *k = &p->kernels[i];
        if (!p->loaded || !p->loaded[i])
            return kc_err_set(err, KC_ERR_INVALID, "kernel %s is not loaded", p->keys[i]);
        const float *in[KC_KERNEL_MAX_IN];
        for (int j = 0; j < k->n_in; j++)
            in[j] = values[k->in_value[j]];
        double t0 = kernel_s ? kc_now() : 0;
        kc_code rc =
            p->backend->ops->run(p->backend, p->loaded[i], k, in, values[k->out_value], err);
        if (rc)
            return rc;
        if (kernel_s)
            kernel_s[i] += kc_now() - t0;
    }
    return KC_OK;
}

void kc_program_forget_params(kc_program *p)
{
    for (int i = 0; p && p->loaded && p->backend->ops->forget && i < p->n_kernels; i++)
        if (p->load_owner[i] == i && p->loaded[i])
            p->backend->ops->forget(p->backend, p->loaded[i]);
}

kc_code kc_program_run(kc_program *p, float *const *values, kc_err *err)
{
    return kc_program_run_profiled(p, values, NULL, err);
}
