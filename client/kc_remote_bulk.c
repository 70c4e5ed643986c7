/*
 * kc_remote_bulk.c - the two bulk operations of the remote client: pull (one
 * streamed GET /v1/bundle fed into the store's importer as bytes arrive, so
 * memory stays bounded) and push (ask which keys the server lacks, then PUT
 * those in parallel over a curl multi with a bounded number of transfers).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "kc_remote_internal.h"
#include <kcache/kc_util.h>

/* ------------------------------------------------------------------ pull -- */

/* Bytes handed to the importer at once. libcurl delivers a chunked response
 * in the server's chunk sizes (often 16-32 KiB); the importer commits once
 * per feed, so coalescing into larger feeds means fewer, larger store
 * transactions (7x faster on small artifacts). Data never waits longer than
 * 100 ms here. */
#define PULL_FEED_CHUNK (1u << 20)
/* Filled chunks waiting for the importer: the download runs ahead of the
 * import by at most this many, so memory stays bounded. */
#define PULL_QUEUE 4

/* The importer runs on its own thread, fed chunk by chunk, so receiving
 * (and the server's sending) overlaps checking and storing. The store is
 * used only by that thread until it is joined. */
typedef struct feeder {
    pthread_mutex_t mu;
    pthread_cond_t changed;
    uint8_t *full[PULL_QUEUE]; /* chunks to import, oldest first */
    size_t full_len[PULL_QUEUE];
    size_t head, count;
    uint8_t *spare[PULL_QUEUE + 1]; /* empty chunks for the download side */
    size_t nspare;
    bool eof;
    kc_bundle_import *im;
    kc_code irc; /* the import's first error, once */
    kc_err ierr;
    uint64_t kept; /* complete artifacts stored so far */
    pthread_t tid;
    bool started;
} feeder;

static void *feeder_main(void *arg)
{
    feeder *fd = arg;
    pthread_mutex_lock(&fd->mu);
    for (;;) {
        while (!fd->count && !fd->eof)
            pthread_cond_wait(&fd->changed, &fd->mu);
        if (!fd->count)
            break;
        uint8_t *chunk = fd->full[fd->head];
        size_t len = fd->full_len[fd->head];
        bool ok = fd->irc == KC_OK;
        pthread_mutex_unlock(&fd->mu);
        kc_err e = {0};
        kc_code rc = ok ? kc_bundle_import_feed(fd->im, chunk, len, &e) : KC_OK;
        kc_bundle_stats st;
        kc_bundle_import_progress(fd->im, &st);
        pthread_mutex_lock(&fd->mu);
        if (rc != KC_OK && fd->irc == KC_OK) {
            fd->irc = rc;
            fd->ierr = e;
        }
        fd->kept = st.artifacts;
        fd->head = (fd->head + 1) % PULL_QUEUE;
        fd->count--;
        fd->spare[fd->nspare++] = chunk;
        pthread_cond_broadcast(&fd->changed);
    }
    pthread_mutex_unlock(&fd->mu);
    return NULL;
}

static void feeder_free_chunks(feeder *fd)
{
    for (size_t i = 0; i < fd->nspare; i++)
        free(fd->spare[i]);
    fd->nspare = 0;
}

/* Starts the importer thread over im with PULL_QUEUE + 1 chunks; *first
 * receives the first one to fill. */
static kc_code feeder_start(feeder *fd, kc_bundle_import *im, uint8_t **first, kc_err *err)
{
    memset(fd, 0, sizeof *fd);
    fd->im = im;
    for (size_t i = 0; i < PULL_QUEUE + 1; i++) {
        if (!(fd->spare[i] = malloc(PULL_FEED_CHUNK))) {
            feeder_free_chunks(fd);
            return kc_err_set(err, KC_ERR_NOMEM, "out of memory for the pull buffers");
        }
        fd->nspare++;
    }
    *first = fd->spare[--fd->nspare];
    pthread_mutex_init(&fd->mu, NULL);
    pthread_cond_init(&fd->changed, NULL);
    if (pthread_create(&fd->tid, NULL, feeder_main, fd) != 0) {
        free(*first);
        *first = NULL;
        pthread_mutex_destroy(&fd->mu);
        pthread_cond_destroy(&fd->changed);
        feeder_free_chunks(fd);
        return kc_err_set(err, KC_ERR_NOMEM, "cannot start the pull's importer thread");
    }
    fd->started = true;
    return KC_OK;
}

/* Queues a filled chunk (waiting while the importer is PULL_QUEUE chunks
 * behind) and returns an empty one, or NULL once the import has failed. */
static uint8_t *feeder_push(feeder *fd, uint8_t *chunk, size_t len)
{
    pthread_mutex_lock(&fd->mu);
    while (fd->count == PULL_QUEUE && fd->irc == KC_OK)
        pthread_cond_wait(&fd->changed, &fd->mu);
    uint8_t *empty = NULL;
    if (fd->irc == KC_OK) {
        fd->full[(fd->head + fd->count) % PULL_QUEUE] = chunk;
        fd->full_len[(fd->head + fd->count) % PULL_QUEUE] = len;
        fd->count++;
        empty = fd->spare[--fd->nspare];
        pthread_cond_broadcast(&fd->changed);
    } else {
        fd->spare[fd->nspare++] = chunk;
    }
    pthread_mutex_unlock(&fd->mu);
    return empty;
}

/* Imports what is queued, stops the thread; afterwards irc/ierr/kept are
 * final and the store is the caller's again. */
static void feeder_stop(feeder *fd)
{
    if (!fd->started)
        return;
    pthread_mutex_lock(&fd->mu);
    fd->eof = true;
    pthread_cond_broadcast(&fd->changed);
    pthread_mutex_unlock(&fd->mu);
    pthread_join(fd->tid, NULL);
    pthread_mutex_destroy(&fd->mu);
    pthread_cond_destroy(&fd->changed);
    feeder_free_chunks(fd);
    fd->started = false;
}

typedef struct pull_ctx {
    kc_remote *r;
    CURL *h;
    feeder fd;
    int decided; /* 0 unknown, 1 bundle (200), 2 error body */
    kc_rbuf errbody;
    uint64_t bytes;
    uint64_t total; /* artifacts announced by the server, 0 unknown */
    kc_remote_progress_fn progress;
    void *pctx;
    double last_report;
    uint64_t last_records;
    uint8_t *buf; /* the chunk being filled: blen bytes not yet queued */
    size_t blen;
    double last_feed;
} pull_ctx;

/* Hands the filled part of the chunk to the importer; false once the import
 * has failed (then fd.irc, fd.ierr say why). */
static bool pull_flush(pull_ctx *pc)
{
    if (pc->blen == 0)
        return true;
    pc->buf = feeder_push(&pc->fd, pc->buf, pc->blen);
    pc->blen = 0;
    pc->last_feed = kc_now();
    return pc->buf != NULL;
}

/* Complete artifacts stored so far. */
static uint64_t pulled(pull_ctx *pc)
{
    pthread_mutex_lock(&pc->fd.mu);
    uint64_t n = pc->fd.kept;
    pthread_mutex_unlock(&pc->fd.mu);
    return n;
}

static size_t pull_header(char *buf, size_t size, size_t nitems, void *ctx)
{
    pull_ctx *pc = ctx;
    size_t n = size * nitems;
    static const char name[] = "x-kcache-artifacts:";
    if (n > sizeof name && strncasecmp(buf, name, sizeof name - 1) == 0)
        pc->total = strtoull(buf + sizeof name - 1, NULL, 10);
    return n;
}

static size_t pull_write(char *ptr, size_t size, size_t nmemb, void *ctx)
{
    pull_ctx *pc = ctx;
    size_t n = size * nmemb;
    if (!pc->decided) {
        long status = 0;
        curl_easy_getinfo(pc->h, CURLINFO_RESPONSE_CODE, &status);
        pc->decided = status == 200 ? 1 : 2;
    }
    if (pc->decided == 2) {
        /* the server's error text, capped; out of memory loses only it */
        pc->errbody.limit = 16384;
        pc->errbody.truncate_ok = true;
        kc_rbuf_write(ptr, 1, n, &pc->errbody);
        return n;
    }
    if (!pc->buf)
        return 0; /* the import failed: abort the transfer (CURLE_WRITE_ERROR) */
    pc->bytes += n;
    const char *src = ptr;
    size_t left = n;
    while (left > 0) {
        size_t take = PULL_FEED_CHUNK - pc->blen;
        if (take > left)
            take = left;
        memcpy(pc->buf + pc->blen, src, take);
        pc->blen += take;
        src += take;
        left -= take;
        if (pc->blen == PULL_FEED_CHUNK && !pull_flush(pc))
            return 0;
    }
    double now = kc_now();
    if (pc->blen && now - pc->last_feed >= 0.1 && !pull_flush(pc))
        return 0;
    /* Reported at each completed artifact and at least every 100 ms; the
     * caller throttles its display. */
    if (pc->progress) {
        uint64_t kept = pulled(pc);
        if (kept != pc->last_records || now - pc->last_report >= 0.1) {
            pc->last_report = now;
            pc->last_records = kept;
            pc->progress(kept, pc->total, pc->bytes, pc->pctx);
        }
    }
    return n;
}

/* Appends ?name=value or &name=value, the value URL-escaped. */
static void append_param(CURL *h, kc_buf *u, bool *first, const char *name, const char *value)
{
    char *esc = curl_easy_escape(h, value, 0);
    if (!esc) {
        u->failed = true;
        return;
    }
    kc_buf_printf(u, "%s%s=%s", *first ? "?" : "&", name, esc);
    curl_free(esc);
    *first = false;
}

char *kc_remote_server_bundle_url(kc_remote *r, const char *device, const kc_filter *f)
{
    kc_buf u = {0};
    bool first = true;
    kc_buf_printf(&u, "%s/v1/bundle", r->base);
    if ((!device || !*device) && f && f->device && *f->device)
        device = f->device;
    if (device && *device)
        append_param(r->easy, &u, &first, "device", device);
    if (f && f->kind && *f->kind)
        append_param(r->easy, &u, &first, "kind", f->kind);
    if (f && f->tag && *f->tag)
        append_param(r->easy, &u, &first, "tag", f->tag);
    if (f && f->since > 0) {
        char num[32];
        snprintf(num, sizeof num, "%lld", (long long)f->since);
        append_param(r->easy, &u, &first, "since", num);
    }
    return kc_buf_take(&u); /* NULL when out of memory */
}

/* One streamed GET of url into s; with a JSON body, a POST. */
static kc_code pull_one(kc_remote *r, kc_store *s, const char *url, const char *body,
                        const kc_bundle_sink *sink, kc_remote_progress_fn progress, void *pctx,
                        kc_bundle_stats *st, kc_err *err)
{
    if (atomic_load(&r->offline))
        return kc_remote_offline_error(r, body ? "POST" : "GET", url, err);
    kc_code rc = KC_OK;
    for (int attempt = 0;; attempt++) {
        pull_ctx pc = {.r = r, .h = r->easy, .progress = progress, .pctx = pctx};
        kc_bundle_import *im;
        if ((rc = kc_bundle_import_begin(s, &im, err)) != KC_OK)
            break;
        kc_bundle_import_set_sink(im, sink);
        if ((rc = feeder_start(&pc.fd, im, &pc.buf, err)) != KC_OK) {
            kc_bundle_import_free(im);
            kc_err_prefix(err, "pulling %s", url);
            break;
        }
        pc.last_feed = kc_now();
        kc_req q = {.method = body ? "POST" : "GET",
                    .url = (char *)url,
                    .body = (const uint8_t *)body,
                    .body_len = body ? strlen(body) : 0,
                    .json = body != NULL,
                    .accept_zstd = true,
                    .stream = true,
                    .write_fn = pull_write,
                    .write_ctx = &pc};
        kc_remote_setup(r, r->easy, &q);
        curl_easy_setopt(r->easy, CURLOPT_HEADERFUNCTION, pull_header);
        curl_easy_setopt(r->easy, CURLOPT_HEADERDATA, &pc);
        CURLcode cc = curl_easy_perform(r->easy); /* a stall: see kc_remote_classify */
        /* Whatever arrived is imported, also from a broken transfer: its
         * complete artifacts are kept, a partial one is dropped. */
        if (pc.decided == 1 && pc.buf)
            pull_flush(&pc);
        free(pc.buf);
        pc.buf = NULL;
        feeder_stop(&pc.fd);
        /* Once bytes reached the importer a retry would start a new stream;
         * report the break instead and let the user pull again (idempotent). */
        q.no_retry = pc.bytes > 0;
        q.resp = pc.errbody;
        pc.errbody = (kc_rbuf){0};
        kc_err cerr = {0};
        kc_outcome o = pc.fd.irc != KC_OK ? KC_OUT_FAIL
                                          : kc_remote_classify(r, r->easy, &q, cc, attempt, &cerr);
        if (o == KC_OUT_RETRY) {
            kc_bundle_import_free(im);
            kc_rbuf_free(&q.resp);
            kc_remote_backoff(attempt);
            continue;
        }
        /* finish stores what the importer still queued; a stream that did
         * not end cleanly keeps its complete artifacts and says how many */
        kc_bundle_stats bs = {0};
        kc_err ferr = {0};
        kc_code frc = kc_bundle_import_finish(im, &bs, &ferr);
        if (pc.fd.irc != KC_OK) {
            rc = kc_err_set(err, pc.fd.irc, "pulling %s: %s (kept %llu complete artifact(s))", url,
                            pc.fd.ierr.msg, (unsigned long long)bs.artifacts);
        } else if (o == KC_OUT_FAIL) {
            if (pc.bytes > 0)
                rc = kc_err_set(err, KC_ERR_REMOTE,
                                "pulling %s: the transfer broke after %llu bytes (%s); kept "
                                "%llu complete verified artifact(s), nothing partial; pull "
                                "again to finish",
                                url, (unsigned long long)pc.bytes, cerr.msg,
                                (unsigned long long)bs.artifacts);
            else
                rc = kc_err_set(err, cerr.code, "%s", cerr.msg);
        } else if (q.status != 200) {
            rc = kc_remote_http_error(r, &q, err);
        } else if ((rc = frc) != KC_OK) {
            if (err)
                *err = ferr;
            kc_err_prefix(err, "pulling %s", url);
        } else if (progress) {
            progress(bs.artifacts, pc.total ? pc.total : bs.artifacts, pc.bytes, pctx);
        }
        *st = bs; /* a broken stream: the complete artifacts kept still count */
        kc_bundle_import_free(im);
        kc_rbuf_free(&q.resp);
        break;
    }
    return rc;
}

kc_code kc_remote_server_pull(kc_remote *r, kc_store *s, const char *const *devices,
                              const kc_filter *f, kc_remote_progress_fn progress, void *pctx,
                              kc_bundle_stats *st, kc_err *err)
{
    kc_bundle_stats total = {0};
    if (st)
        *st = total;
    /* One streamed request for all of this machine's device ids: the
     * server's device filter takes a comma-separated list. */
    size_t cap = 1;
    for (size_t i = 0; devices && devices[i]; i++)
        cap += strlen(devices[i]) + 1;
    char *joined = malloc(cap);
    if (!joined)
        return kc_err_set(err, KC_ERR_NOMEM, "pull from %s: out of memory", r->base);
    joined[0] = '\0';
    for (size_t i = 0; devices && devices[i]; i++) {
        if (i)
            strcat(joined, ",");
        strcat(joined, devices[i]);
    }
    char *url = kc_remote_server_bundle_url(r, joined[0] ? joined : NULL, f);
    free(joined);
    if (!url)
        return kc_err_set(err, KC_ERR_NOMEM, "pull from %s: out of memory", r->base);
    kc_code rc = pull_one(r, s, url, NULL, NULL, progress, pctx, &total, err);
    free(url);
    if (st)
        *st = total;
    return rc;
}

kc_code kc_remote_server_pull_keys(kc_remote *r, kc_store *s, const char *const *keys, size_t n,
                                   const kc_bundle_sink *sink, kc_remote_progress_fn progress,
                                   void *pctx, kc_bundle_stats *st, kc_err *err)
{
    kc_bundle_stats total = {0};
    json_t *arr = json_array();
    json_t *obj = json_object();
    for (size_t i = 0; arr && i < n; i++)
        json_array_append_new(arr, json_string(keys[i]));
    char *body = NULL;
    if (arr && obj && json_object_set_new(obj, "keys", arr) == 0)
        body = json_dumps(obj, JSON_COMPACT);
    else
        json_decref(arr);
    json_decref(obj);
    size_t ul = strlen(r->base) + 32;
    char *url = body ? malloc(ul) : NULL;
    if (!url) {
        free(body);
        return kc_err_set(err, KC_ERR_NOMEM, "pull from %s: out of memory", r->base);
    }
    snprintf(url, ul, "%s/v1/bundle/select", r->base);
    kc_code rc = pull_one(r, s, url, body, sink, progress, pctx, &total, err);
    free(url);
    free(body);
    if (st)
        *st = total;
    return rc;
}

/* ----------------------------------------------- the parallel engine -- */

/* One transfer slot of the curl multi: an easy handle kept (with its
 * connection) across the items it carries. */
typedef struct slot {
    CURL *h;
    bool busy;
    size_t idx; /* the item being transferred */
    int attempt;
    double retry_at; /* > 0: waiting to be re-added */
    uint8_t *env;    /* request body owned by the slot (push) */
    size_t env_len;
    kc_req q;
} slot;

/* What a parallel run does per item. */
typedef struct xfer_ops {
    /* Fills sl->q (method, url: malloc'd, body...) for item idx. An error
     * counts as a failed item; KC_ERR_NOT_FOUND skips it silently. */
    kc_code (*prepare)(void *ctx, size_t idx, slot *sl, kc_err *err);
    /* An HTTP answer arrived for item idx (sl->q.status, sl->q.resp).
     * Returns KC_OK or the item's error. */
    kc_code (*finish)(void *ctx, size_t idx, slot *sl, kc_err *err);
    void *ctx;
    const char *what; /* "upload(s)" ... for the summary message */
    uint64_t *bytes;  /* progress: bytes moved so far (may be NULL) */
} xfer_ops;

static void slot_release(slot *sl)
{
    free(sl->env);
    sl->env = NULL;
    sl->env_len = 0;
    free(sl->q.url);
    kc_rbuf_free(&sl->q.resp);
    memset(&sl->q, 0, sizeof sl->q);
    sl->busy = false;
    sl->retry_at = 0;
}

static void slot_launch(kc_remote *r, CURLM *m, slot *sl)
{
    kc_rbuf_free(&sl->q.resp);
    sl->q.resp.limit = sl->q.resp_limit;
    sl->q.resp.truncate_ok = sl->q.resp_truncate;
    kc_remote_setup(r, sl->h, &sl->q);
    curl_multi_add_handle(m, sl->h);
}

/* Runs items 0..n-1 through ops with r->concurrency transfers at once on one
 * curl multi, retrying per kc_remote_classify. Stops early on auth failures
 * or when the handle goes offline; other per-item failures are counted and
 * the first is reported after the rest finished. */
static kc_code run_parallel(kc_remote *r, size_t n, const xfer_ops *ops,
                            kc_remote_progress_fn progress, void *pctx, uint64_t base_done,
                            uint64_t total, kc_err *err)
{
    if (n == 0)
        return KC_OK;
    if (atomic_load(&r->offline))
        return kc_remote_offline_error(r, "transfer", NULL, err);
    int nslots = r->concurrency;
    if ((size_t)nslots > n)
        nslots = (int)n;
    CURLM *m = curl_multi_init();
    slot *slots = calloc((size_t)nslots, sizeof *slots);
    bool handles = slots != NULL;
    for (int i = 0; handles && i < nslots; i++)
        handles = (slots[i].h = curl_easy_init()) != NULL;
    if (!m || !handles) {
        for (int i = 0; slots && i < nslots; i++)
            if (slots[i].h)
                curl_easy_cleanup(slots[i].h);
        if (m)
            curl_multi_cleanup(m);
        free(slots);
        return kc_err_set(err, KC_ERR_NOMEM, "transfers with %s: out of memory", r->base);
    }
    curl_multi_setopt(m, CURLMOPT_MAX_TOTAL_CONNECTIONS, (long)nslots);
    curl_multi_setopt(m, CURLMOPT_MAX_HOST_CONNECTIONS, (long)nslots);

    size_t next = 0, failed = 0, done = 0;
    bool stop = false;
    kc_err first = {0};
    int running = 0;
    for (;;) {
        double now = kc_now();
        int active = 0;
        for (int i = 0; i < nslots; i++) {
            slot *sl = &slots[i];
            if (sl->busy && sl->retry_at > 0 && stop) {
                slot_release(sl);
            } else if (sl->busy && sl->retry_at > 0 && now >= sl->retry_at) {
                sl->retry_at = 0;
                slot_launch(r, m, sl);
            }
            while (!sl->busy && !stop && next < n) {
                kc_err e = {0};
                sl->idx = next++;
                sl->attempt = 0;
                if (ops->prepare(ops->ctx, sl->idx, sl, &e) != KC_OK) {
                    slot_release(sl);
                    done++;
                    if (e.code != KC_ERR_NOT_FOUND && !failed++)
                        first = e;
                    continue;
                }
                sl->busy = true;
                slot_launch(r, m, sl);
            }
            if (sl->busy)
                active++;
        }
        if (active == 0)
            break;
        curl_multi_perform(m, &running);
        CURLMsg *msg;
        int left;
        while ((msg = curl_multi_info_read(m, &left))) {
            if (msg->msg != CURLMSG_DONE)
                continue;
            slot *sl = NULL;
            for (int i = 0; i < nslots; i++)
                if (slots[i].h == msg->easy_handle)
                    sl = &slots[i];
            CURLcode cc = msg->data.result;
            curl_multi_remove_handle(m, msg->easy_handle);
            if (!sl)
                continue;
            kc_err e = {0};
            kc_outcome o = kc_remote_classify(r, sl->h, &sl->q, cc, sl->attempt, &e);
            if (o == KC_OUT_RETRY) {
                sl->retry_at = kc_now() + 0.1 * (1 << (sl->attempt < 4 ? sl->attempt : 4));
                sl->attempt++;
                continue;
            }
            kc_code rc = o == KC_OUT_DONE ? ops->finish(ops->ctx, sl->idx, sl, &e) : e.code;
            if (rc != KC_OK) {
                if (!failed++)
                    first = e;
                if (e.code == KC_ERR_AUTH || atomic_load(&r->offline))
                    stop = true;
            }
            done++;
            slot_release(sl);
            if (progress)
                progress(base_done + done, total, ops->bytes ? *ops->bytes : 0, pctx);
        }
        long wait_ms = 100;
        for (int i = 0; i < nslots; i++)
            if (slots[i].busy && slots[i].retry_at > 0) {
                long w = (long)((slots[i].retry_at - kc_now()) * 1000);
                if (w < wait_ms)
                    wait_ms = w < 1 ? 1 : w;
            }
        if (running > 0) {
            curl_multi_poll(m, NULL, 0, (int)wait_ms, NULL);
        } else if (wait_ms > 0) {
            struct timespec ts = {0, wait_ms * 1000000L};
            nanosleep(&ts, NULL);
        }
    }
    for (int i = 0; i < nslots; i++) {
        if (slots[i].busy)
            slot_release(&slots[i]);
        curl_easy_cleanup(slots[i].h);
    }
    free(slots);
    curl_multi_cleanup(m);
    if (failed) {
        if (err) {
            *err = first;
            if (failed > 1)
                kc_err_prefix(err, "%zu %s failed; first", failed, ops->what);
        }
        return first.code ? first.code : KC_ERR_REMOTE;
    }
    return KC_OK;
}

/* ------------------------------------------------------------------ push -- */

typedef struct push_ctx {
    kc_remote *r;
    kc_store *s;
    char (*keys)[KC_KEY_HEX_LEN + 1];
    uint64_t uploaded, present, bytes;
} push_ctx;

static kc_code push_prepare(void *ctx, size_t idx, slot *sl, kc_err *err)
{
    push_ctx *pc = ctx;
    const char *key = pc->keys[idx];
    /* KC_ERR_NOT_FOUND (evicted meanwhile) skips the key; a push is not a
     * use, so it must not count hits or refresh LRU order */
    kc_code rc = kc_store_peek_envelope(pc->s, key, &sl->env, &sl->env_len, err);
    if (rc != KC_OK)
        return rc;
    const uint8_t *body;
    uint8_t *signed_env;
    rc = kc_remote_upload_body(pc->r, sl->env, sl->env_len, &body, &sl->env_len, &signed_env, err);
    if (rc != KC_OK) {
        kc_err_prefix(err, "push %s", key);
        return rc;
    }
    if (signed_env) {
        free(sl->env);
        sl->env = signed_env;
    }
    if (!(sl->q.url = kc_remote_artifact_url(pc->r, key)))
        return kc_err_set(err, KC_ERR_NOMEM, "push %s: out of memory", key);
    sl->q.method = "PUT";
    sl->q.body = sl->env;
    sl->q.body_len = sl->env_len;
    sl->q.resp_limit = 16384;
    sl->q.resp_truncate = true;
    return KC_OK;
}

static kc_code push_finish(void *ctx, size_t idx, slot *sl, kc_err *err)
{
    (void)idx;
    push_ctx *pc = ctx;
    if (sl->q.status == 201 || sl->q.status == 200) {
        if (sl->q.status == 201)
            pc->uploaded++;
        else
            pc->present++;
        pc->bytes += sl->env_len;
        return KC_OK;
    }
    kc_code rc = kc_remote_http_error(pc->r, &sl->q, err);
    if (sl->q.status == 403)
        atomic_store(&pc->r->no_write, true);
    return rc;
}

/* ----------------------------------------------------------------- fetch -- */

typedef struct fetch_ctx {
    kc_remote *r;
    kc_store *s;
    const char *const *keys;
    bool *fetched;
    uint64_t stored, bytes;
} fetch_ctx;

static kc_code fetch_prepare(void *ctx, size_t idx, slot *sl, kc_err *err)
{
    fetch_ctx *fc = ctx;
    if (!(sl->q.url = kc_remote_artifact_url(fc->r, fc->keys[idx])))
        return kc_err_set(err, KC_ERR_NOMEM, "fetch %s: out of memory", fc->keys[idx]);
    sl->q.method = "GET";
    sl->q.accept_zstd = true;
    sl->q.resp_limit = KC_PAYLOAD_MAX + KC_META_MAX + 4096;
    kc_remote_gate_envelope(&sl->q, fc->keys[idx]);
    return KC_OK;
}

static kc_code fetch_finish(void *ctx, size_t idx, slot *sl, kc_err *err)
{
    fetch_ctx *fc = ctx;
    if (sl->q.status == 404)
        return KC_OK; /* a miss */
    if (sl->q.status != 200)
        return kc_remote_http_error(fc->r, &sl->q, err);
    bool created = false;
    kc_err pe = {0};
    kc_code rc = kc_store_put_envelope(fc->s, (const uint8_t *)sl->q.resp.body.data,
                                       sl->q.resp.body.len, fc->keys[idx], &created, &pe);
    if (rc != KC_OK) {
        /* a damaged or foreign envelope from the server is corrupt data;
         * a failing local store keeps its own code */
        kc_code code = rc == KC_ERR_INVALID || rc == KC_ERR_TRUNCATED || rc == KC_ERR_VERSION
                           ? KC_ERR_CORRUPT
                           : rc;
        return kc_err_set(err, code, "GET %s: %s", sl->q.url, pe.msg);
    }
    if (fc->fetched)
        fc->fetched[idx] = true;
    fc->stored++;
    fc->bytes += sl->q.resp.body.len;
    return KC_OK;
}

kc_code kc_remote_server_fetch(kc_remote *r, kc_store *s, const char *const *keys, size_t n,
                               bool *fetched, size_t *nfetched, kc_err *err)
{
    fetch_ctx fc = {.r = r, .s = s, .keys = keys, .fetched = fetched};
    xfer_ops ops = {.prepare = fetch_prepare,
                    .finish = fetch_finish,
                    .ctx = &fc,
                    .what = "download(s)",
                    .bytes = &fc.bytes};
    kc_code rc = run_parallel(r, n, &ops, NULL, NULL, 0, n, err);
    if (nfetched)
        *nfetched = fc.stored;
    return rc;
}

kc_code kc_remote_push_keys(kc_remote *r, kc_store *s, char (*keys)[KC_KEY_HEX_LEN + 1], size_t n,
                            kc_remote_progress_fn progress, void *pctx, uint64_t base_done,
                            uint64_t total, kc_remote_push_stats *ps, kc_err *err)
{
    kc_code rc = KC_OK;
    const size_t batch = 1000;
    const char **ptrs = malloc(batch * sizeof *ptrs);
    bool *miss = malloc(batch * sizeof *miss);
    char(*up)[KC_KEY_HEX_LEN + 1] = malloc(batch * sizeof *up);
    if (!ptrs || !miss || !up) {
        rc = kc_err_set(err, KC_ERR_NOMEM, "push: out of memory");
        goto out;
    }
    for (size_t off = 0; off < n && rc == KC_OK; off += batch) {
        size_t m = n - off < batch ? n - off : batch;
        for (size_t i = 0; i < m; i++)
            ptrs[i] = keys[off + i];
        rc = kc_remote_server_missing(r, ptrs, m, miss, err);
        if (rc != KC_OK)
            break;
        size_t nu = 0;
        for (size_t i = 0; i < m; i++) {
            if (miss[i])
                memcpy(up[nu++], ptrs[i], KC_KEY_HEX_LEN + 1);
            else
                ps->skipped++;
        }
        push_ctx pc = {.r = r, .s = s, .keys = up, .bytes = ps->bytes};
        xfer_ops ops = {.prepare = push_prepare,
                        .finish = push_finish,
                        .ctx = &pc,
                        .what = "upload(s)",
                        .bytes = &pc.bytes};
        rc = run_parallel(r, nu, &ops, progress, pctx, base_done + off + (m - nu), total, err);
        ps->uploaded += pc.uploaded;
        ps->skipped += pc.present;
        ps->bytes = pc.bytes;
        if (progress && nu == 0)
            progress(base_done + off + m, total, ps->bytes, pctx);
    }
out:
    free(ptrs);
    free(miss);
    free(up);
    return rc;
}
