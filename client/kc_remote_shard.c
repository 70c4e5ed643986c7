/*
 * kc_remote_shard.c - client-side sharding behind the kc_remote API, as one composite: a
 * base URL with commas opens one child handle per server, and each call is routed by
 * rendezvous hashing (kc_shard.h) over the children still online, so a dead server costs
 * only its share of keys and each warns once on its own. It talks to its children only
 * through the public API (kc_remote.h) and knows nothing of their insides.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kc_remote_ops.h"
#include <kcache/kc_shard.h>
#include <kcache/kc_util.h>

/* The composite: a kc_remote * of this implementation points at one of these. */
typedef struct sharded {
    kc_remote_head head; /* first */
    kc_shard *shard;
    kc_remote **child; /* one per server, in kc_shard_url order */
    size_t nchild;
    char *base; /* the list as given */
} sharded;

static sharded *S(const kc_remote *r)
{
    return (sharded *)(void *)r;
}

static const kc_remote_ops shard_ops;

/* ----------------------------------------------------------- open/close -- */

static void shard_close(kc_remote *rr, long limit_ms)
{
    sharded *r = S(rr);
    /* Every child flushes its queue at the same time, within one shared
     * limit (as for a single server), not one limit after the other. */
    long limit = limit_ms;
    for (size_t i = 0; limit_ms < 0 && i < r->nchild; i++) {
        long t = kc_remote_ops_of(r->child[i])->close_limit_ms(r->child[i]);
        limit = t > limit ? t : limit;
    }
    double deadline = kc_now() + (double)(limit > 0 ? limit : 0) / 1000.0;
    for (size_t i = 0; i < r->nchild; i++) {
        long left = (long)((deadline - kc_now()) * 1000.0);
        kc_remote_flush(r->child[i], left > 0 ? left : 0);
    }
    for (size_t i = 0; i < r->nchild; i++) {
        long left = (long)((deadline - kc_now()) * 1000.0);
        kc_remote_ops_of(r->child[i])->close(r->child[i], left > 0 ? left : 0);
    }
    free(r->child);
    kc_shard_free(r->shard);
    free(r->base);
    free(r);
}

kc_code kc_remote_shard_open(const char *list, const kc_remote_opts *opts, kc_remote **out,
                             kc_err *err)
{
    *out = NULL;
    kc_shard *sh = NULL;
    kc_code rc = kc_shard_parse(list, &sh, err);
    if (rc != KC_OK)
        return rc;
    sharded *r = calloc(1, sizeof *r);
    size_t n = kc_shard_count(sh);
    if (!r || !(r->base = kc_remote_redact_url(list)) ||
        !(r->child = calloc(n, sizeof *r->child))) {
        if (r)
            free(r->base);
        free(r);
        kc_shard_free(sh);
        return kc_err_set(err, KC_ERR_NOMEM, "remote: out of memory");
    }
    r->head.ops = &shard_ops;
    r->shard = sh;
    for (size_t i = 0; i < n; i++) {
        rc = kc_remote_open(kc_shard_url(sh, i), opts, &r->child[i], err);
        if (rc != KC_OK) {
            shard_close((kc_remote *)(void *)r, 0);
            return rc;
        }
        r->nchild++;
    }
    *out = (kc_remote *)(void *)r;
    return KC_OK;
}

static bool child_online(const kc_remote *c)
{
    return !kc_remote_offline(c);
}

static uint64_t live_mask(const sharded *r)
{
    uint64_t m = 0;
    for (size_t i = 0; i < r->nchild; i++)
        if (child_online(r->child[i]))
            m |= UINT64_C(1) << i;
    return m;
}

static bool shard_offline(const kc_remote *r)
{
    return live_mask(S(r)) == 0;
}

static long shard_close_limit_ms(const kc_remote *rr)
{
    const sharded *r = S(rr);
    long limit = 0;
    for (size_t i = 0; i < r->nchild; i++) {
        long t = kc_remote_ops_of(r->child[i])->close_limit_ms(r->child[i]);
        limit = t > limit ? t : limit;
    }
    return limit;
}

static const char *shard_url(const kc_remote *r)
{
    return S(r)->base;
}

/* Every child was opened with the same options. */
static const kc_signer *shard_signer(const kc_remote *r)
{
    return kc_remote_signer(S(r)->child[0]);
}

/* Several servers: a bundle URL names the first one. */
static char *shard_bundle_url(kc_remote *r, const char *device, const kc_filter *f)
{
    return kc_remote_bundle_url(S(r)->child[0], device, f);
}

static kc_code all_offline(const sharded *r, const char *what, kc_err *err)
{
    return kc_err_set(err, KC_ERR_REMOTE,
                      "%s on %s: every server is offline for this process (see the warnings)", what,
                      r->base);
}

/* ------------------------------------------------------ single artifacts -- */

/* Single requests go to the key's owner among the live servers; when the
 * owner goes offline during the call, to the next live one in rank order.
 * An answer from a live server (a hit, a miss, an HTTP error) is final. */
#define SHARD_ROUTE(r, key, call)                                                                  \
    do {                                                                                           \
        size_t order_[KC_SHARD_MAX];                                                               \
        kc_shard_rank((r)->shard, (key), order_);                                                  \
        for (size_t k_ = 0; k_ < (r)->nchild; k_++) {                                              \
            kc_remote *c = (r)->child[order_[k_]];                                                 \
            if (!child_online(c))                                                                  \
                continue;                                                                          \
            kc_code rc_ = (call);                                                                  \
            if (rc_ == KC_OK || child_online(c))                                                   \
                return rc_;                                                                        \
        }                                                                                          \
    } while (0)

static kc_code shard_offline_error(kc_remote *r, const char *method, kc_err *err)
{
    return all_offline(S(r), method, err);
}

static kc_code shard_get(kc_remote *rr, const char *key, kc_artifact *a, kc_err *err)
{
    sharded *r = S(rr);
    SHARD_ROUTE(r, key, kc_remote_get(c, key, a, err));
    return all_offline(r, "GET", err);
}

static kc_code shard_has(kc_remote *rr, const char *key, kc_err *err)
{
    sharded *r = S(rr);
    SHARD_ROUTE(r, key, kc_remote_has(c, key, err));
    return all_offline(r, "HEAD", err);
}

static kc_code shard_put(kc_remote *rr, const char *key, const uint8_t *env, size_t len,
                         bool *created, kc_err *err)
{
    sharded *r = S(rr);
    SHARD_ROUTE(r, key, kc_remote_put(c, key, env, len, created, err));
    return all_offline(r, "PUT", err);
}

static void shard_put_async(kc_remote *rr, const char *key, const uint8_t *env, size_t len)
{
    sharded *r = S(rr);
    uint64_t alive = live_mask(r);
    int i = kc_shard_pick(r->shard, key, alive);
    if (i >= 0)
        kc_remote_put_async(r->child[i], key, env, len);
}

static size_t shard_flush(kc_remote *rr, long timeout_ms)
{
    sharded *r = S(rr);
    double deadline = kc_now() + (double)timeout_ms / 1000.0;
    size_t left = 0;
    for (size_t i = 0; i < r->nchild; i++) {
        long ms = (long)((deadline - kc_now()) * 1000.0);
        left += kc_remote_flush(r->child[i], ms > 0 ? ms : 0);
    }
    return left;
}

static void shard_queue_stats(kc_remote *rr, uint64_t *uploaded, uint64_t *failed,
                              uint64_t *dropped)
{
    sharded *r = S(rr);
    uint64_t u = 0, f = 0, d = 0;
    for (size_t i = 0; i < r->nchild; i++) {
        uint64_t cu = 0, cf = 0, cd = 0;
        kc_remote_queue_stats(r->child[i], &cu, &cf, &cd);
        u += cu;
        f += cf;
        d += cd;
    }
    if (uploaded)
        *uploaded = u;
    if (failed)
        *failed = f;
    if (dropped)
        *dropped = d;
}

static void shard_publish(kc_remote *rr, kc_remote_publish *st)
{
    sharded *r = S(rr);
    for (size_t i = 0; i < r->nchild; i++) {
        kc_remote_publish c;
        kc_remote_publish_stats(r->child[i], &c);
        if (c.creds > st->creds) /* the enum is ordered from best to worst */
            st->creds = c.creds;
        st->reader = st->reader || c.reader;
        st->uploaded += c.uploaded;
        st->refused += c.refused;
        st->failed += c.failed;
    }
}

/* ---------------------------------------------------- keys split by owner -- */

/* A batch of keys split by owner: round after round, the keys still pending
 * go to their owner among the live servers; a server that goes offline
 * during its part leaves its keys pending for the next round (without it). */
typedef struct split {
    size_t n;
    bool *pending;
    int *owner;
    size_t *pos; /* positions in the caller's arrays of one child's part */
    const char **sub;
    bool *subflag;
} split;

static kc_code split_init(split *sp, size_t n, const sharded *r, const char *what, kc_err *err)
{
    memset(sp, 0, sizeof *sp);
    sp->n = n;
    size_t c = n ? n : 1;
    sp->pending = malloc(c * sizeof *sp->pending);
    sp->owner = malloc(c * sizeof *sp->owner);
    sp->pos = malloc(c * sizeof *sp->pos);
    sp->sub = malloc(c * sizeof *sp->sub);
    sp->subflag = malloc(c * sizeof *sp->subflag);
    if (!sp->pending || !sp->owner || !sp->pos || !sp->sub || !sp->subflag)
        return kc_err_set(err, KC_ERR_NOMEM, "%s on %s: out of memory", what, r->base);
    for (size_t i = 0; i < n; i++)
        sp->pending[i] = true;
    return KC_OK;
}

static void split_free(split *sp)
{
    free(sp->pending);
    free(sp->owner);
    free(sp->pos);
    free(sp->sub);
    free(sp->subflag);
}

/* Assigns each pending key its owner; false when no server is live. */
static bool split_assign(split *sp, const sharded *r, const char *const *keys)
{
    uint64_t alive = live_mask(r);
    if (!alive)
        return false;
    for (size_t i = 0; i < sp->n; i++)
        if (sp->pending[i])
            sp->owner[i] = kc_shard_pick(r->shard, keys[i], alive);
    return true;
}

/* Gathers child c's pending keys into sp->sub / sp->pos; returns how many. */
static size_t split_gather(split *sp, const char *const *keys, size_t c)
{
    size_t m = 0;
    for (size_t i = 0; i < sp->n; i++) {
        if (sp->pending[i] && sp->owner[i] == (int)c) {
            sp->sub[m] = keys[i];
            sp->pos[m++] = i;
        }
    }
    return m;
}

static bool split_any(const split *sp)
{
    for (size_t i = 0; i < sp->n; i++)
        if (sp->pending[i])
            return true;
    return false;
}

/* One server's part of a split call: keys sp->sub[0..m), at sp->pos[j] in
 * the caller's arrays. Sets sp->subflag[j] (cleared before) for each key it
 * settled even if it then fails. */
typedef kc_code (*split_part_fn)(void *ctx, kc_remote *child, split *sp, size_t m, kc_err *err);

/* Runs part over keys split by owner, round after round, until every key is
 * settled. A server that goes offline during its part hands its unsettled
 * keys to the next round (without it); any other failure is final for its
 * part and the first one is reported after every part ran (stop_at_error:
 * at once). No live server left: the "every server is offline" error. */
static kc_code split_run(sharded *r, const char *const *keys, size_t n, const char *what,
                         bool stop_at_error, split_part_fn part, void *ctx, kc_err *err)
{
    split sp;
    kc_err first = {0};
    kc_code rc = split_init(&sp, n, r, what, err);
    while (rc == KC_OK && split_any(&sp) && !(stop_at_error && first.code != KC_OK)) {
        if (!split_assign(&sp, r, keys)) {
            if (first.code == KC_OK)
                all_offline(r, what, &first);
            break;
        }
        for (size_t c = 0; c < r->nchild && !(stop_at_error && first.code != KC_OK); c++) {
            size_t m = split_gather(&sp, keys, c);
            if (m == 0)
                continue;
            memset(sp.subflag, 0, m * sizeof *sp.subflag);
            kc_err e = {0};
            kc_code crc = part(ctx, r->child[c], &sp, m, &e);
            bool dead = crc != KC_OK && !child_online(r->child[c]);
            for (size_t j = 0; j < m; j++)
                sp.pending[sp.pos[j]] = dead && !sp.subflag[j];
            if (crc != KC_OK && !dead && first.code == KC_OK)
                first = e;
        }
    }
    split_free(&sp);
    if (rc == KC_OK && first.code != KC_OK) {
        if (err)
            *err = first;
        rc = first.code;
    }
    return rc;
}

static kc_code missing_part(void *ctx, kc_remote *child, split *sp, size_t m, kc_err *err)
{
    bool *missing = ctx;
    kc_code rc = kc_remote_missing(child, sp->sub, m, sp->subflag, err);
    for (size_t j = 0; j < m; j++) {
        if (rc == KC_OK)
            missing[sp->pos[j]] = sp->subflag[j];
        sp->subflag[j] = rc == KC_OK; /* an answer settles every key */
    }
    return rc;
}

static kc_code shard_missing(kc_remote *r, const char *const *keys, size_t n, bool *missing,
                             kc_err *err)
{
    return split_run(S(r), keys, n, "POST /v1/artifacts/missing", true, missing_part, missing, err);
}

typedef struct fetch_parts {
    kc_store *s;
    bool *fetched;
    size_t total;
} fetch_parts;

static kc_code fetch_part(void *ctx, kc_remote *child, split *sp, size_t m, kc_err *err)
{
    fetch_parts *fp = ctx;
    size_t got = 0;
    kc_code rc = kc_remote_fetch(child, fp->s, sp->sub, m, sp->subflag, &got, err);
    fp->total += got;
    for (size_t j = 0; j < m; j++)
        if (fp->fetched && sp->subflag[j])
            fp->fetched[sp->pos[j]] = true;
    return rc; /* a dead server's unfetched keys try the next live one */
}

static kc_code shard_fetch(kc_remote *r, kc_store *s, const char *const *keys, size_t n,
                           bool *fetched, size_t *nfetched, kc_err *err)
{
    fetch_parts fp = {.s = s, .fetched = fetched};
    kc_code rc = split_run(S(r), keys, n, "fetch", false, fetch_part, &fp, err);
    if (nfetched)
        *nfetched = fp.total;
    return rc;
}

/* ------------------------------------------------------------ pull/push -- */

typedef struct pull_progress {
    kc_remote_progress_fn fn;
    void *ctx;
    uint64_t done, total, bytes; /* of the servers before this one */
} pull_progress;

static void pull_progress_fn(uint64_t done, uint64_t total, uint64_t bytes, void *ctx)
{
    pull_progress *pp = ctx;
    pp->fn(pp->done + done, total ? pp->total + total : 0, pp->bytes + bytes, pp->ctx);
}

/* Adds the comma-separated ids of more to *list (malloc'd), each once. */
static void join_ids(char **list, const char *more)
{
    for (const char *p = more; p && *p;) {
        size_t n = strcspn(p, ",");
        bool have = false;
        for (const char *q = *list; q && *q && !have;) {
            size_t m = strcspn(q, ",");
            have = m == n && strncmp(p, q, n) == 0;
            q += m + (q[m] == ',');
        }
        size_t old = *list ? strlen(*list) : 0;
        char *grown = have ? NULL : realloc(*list, old + n + 2);
        if (grown) {
            snprintf(grown + old, n + 2, "%s%.*s", old ? "," : "", (int)n, p);
            *list = grown;
        }
        p += n + (p[n] == ',');
    }
}

static kc_code shard_pull(kc_remote *rr, kc_store *s, const char *const *devices,
                          const kc_filter *f, kc_remote_progress_fn progress, void *pctx,
                          kc_bundle_stats *st, kc_remote_pull_info *info, kc_err *err)
{
    sharded *r = S(rr);
    /* Every server holds a disjoint share (and, after failovers, maybe a few
     * duplicates, which the idempotent import skips): pull from all. */
    kc_bundle_stats sum = {0};
    kc_err first = {0};
    pull_progress pp = {.fn = progress, .ctx = pctx};
    size_t pulled = 0;
    for (size_t c = 0; c < r->nchild; c++) {
        kc_remote *ch = r->child[c];
        kc_err e = {0};
        kc_bundle_stats bs = {0};
        kc_remote_pull_info ci = {0};
        kc_code crc;
        if (!child_online(ch))
            crc = kc_remote_ops_of(ch)->offline_error(ch, "GET", &e);
        else
            crc = kc_remote_pull_ex(ch, s, devices, f, progress ? pull_progress_fn : NULL, &pp, &bs,
                                    &ci, &e);
        sum.artifacts += bs.artifacts;
        sum.imported += bs.imported;
        sum.present += bs.present;
        sum.refused += bs.refused;
        sum.bytes += bs.bytes;
        info->announced += ci.announced;
        join_ids(&info->other_devices, ci.other_devices);
        kc_remote_pull_info_free(&ci);
        pp.done += bs.artifacts;
        pp.total += bs.artifacts;
        pp.bytes += bs.bytes;
        if (crc == KC_OK)
            pulled++;
        else if (first.code == KC_OK)
            first = e;
    }
    *st = sum;
    if (first.code != KC_OK) {
        if (err) {
            *err = first;
            kc_err_prefix(err, "pulled from %zu of %zu servers; first failure", pulled, r->nchild);
        }
        return first.code;
    }
    return KC_OK;
}

typedef struct push_parts {
    kc_store *s;
    char (*part)[KC_KEY_HEX_LEN + 1]; /* room for every key */
    kc_remote_progress_fn progress;
    void *pctx;
    uint64_t done, total;
    kc_remote_push_stats *ps;
} push_parts;

static kc_code push_part(void *ctx, kc_remote *child, split *sp, size_t m, kc_err *err)
{
    push_parts *pp = ctx;
    for (size_t j = 0; j < m; j++)
        memcpy(pp->part[j], sp->sub[j], KC_KEY_HEX_LEN + 1);
    kc_code rc = kc_remote_ops_of(child)->push_keys(child, pp->s, pp->part, m, pp->progress,
                                                    pp->pctx, pp->done, pp->total, pp->ps, err);
    pp->done += m;
    /* nothing is settled for a server that died on the way: its part goes
     * to the next live one (some may be uploaded twice: harmless) */
    return rc;
}

/* Keys split by owner, each part pushed by its server (a dead one's part goes on to the
 * next live server). */
static kc_code shard_push_keys(kc_remote *rr, kc_store *s, char (*keys)[KC_KEY_HEX_LEN + 1],
                               size_t n, kc_remote_progress_fn progress, void *pctx,
                               uint64_t base_done, uint64_t total, kc_remote_push_stats *ps,
                               kc_err *err)
{
    const char **ptrs = malloc((n ? n : 1) * sizeof *ptrs);
    push_parts pp = {.s = s,
                     .part = malloc((n ? n : 1) * sizeof *pp.part),
                     .progress = progress,
                     .pctx = pctx,
                     .done = base_done,
                     .total = total,
                     .ps = ps};
    kc_code rc;
    /* a part a dead server left goes on to the next: what is not published is counted
     * once, at the end, not by each server that tried */
    kc_remote_push_stats before = *ps;
    if (!ptrs || !pp.part) {
        rc = kc_err_set(err, KC_ERR_NOMEM, "push to %s: out of memory", S(rr)->base);
    } else {
        for (size_t i = 0; i < n; i++)
            ptrs[i] = keys[i];
        rc = split_run(S(rr), ptrs, n, "PUT", false, push_part, &pp, err);
    }
    free(ptrs);
    free(pp.part);
    uint64_t settled = ps->uploaded + ps->skipped - before.uploaded - before.skipped;
    ps->refused = before.refused;
    ps->failed = before.failed;
    if (rc != KC_OK && settled < n)
        *(rc == KC_ERR_AUTH ? &ps->refused : &ps->failed) += n - settled;
    return rc;
}

/* Several owners: one parallel GET per key (fetch) instead of one bundle. */
static kc_code shard_pull_keys(kc_remote *r, kc_store *s, const char *const *keys, size_t n,
                               const kc_bundle_sink *sink, kc_remote_progress_fn progress,
                               void *pctx, kc_bundle_stats *st, kc_err *err)
{
    (void)sink, (void)progress, (void)pctx;
    size_t got = 0;
    kc_code rc = shard_fetch(r, s, keys, n, NULL, &got, err);
    if (st)
        st->artifacts = st->imported = got;
    return rc;
}

static void shard_set_hint(kc_remote *r, const char *kind, const char *device, const char *graph)
{
    for (size_t i = 0; i < S(r)->nchild; i++)
        kc_remote_set_hint(S(r)->child[i], kind, device, graph);
}

static const kc_remote_ops shard_ops = {.close = shard_close,
                                        .close_limit_ms = shard_close_limit_ms,
                                        .offline = shard_offline,
                                        .offline_error = shard_offline_error,
                                        .url = shard_url,
                                        .signer = shard_signer,
                                        .bundle_url = shard_bundle_url,
                                        .get = shard_get,
                                        .has = shard_has,
                                        .set_hint = shard_set_hint,
                                        .put = shard_put,
                                        .put_async = shard_put_async,
                                        .flush = shard_flush,
                                        .queue_stats = shard_queue_stats,
                                        .publish = shard_publish,
                                        .missing = shard_missing,
                                        .pull = shard_pull,
                                        .pull_keys = shard_pull_keys,
                                        .fetch = shard_fetch,
                                        .push_keys = shard_push_keys};
