/*
 * kc_remote_queue.c - the background push queue: a compile hands a fresh
 * artifact over and goes on; one worker thread uploads it on its own kept-alive
 * handle. Bounded (items and bytes): when full, an artifact is dropped rather
 * than ever blocking a compile. Flushed at exit within a time limit.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <kcache/kc_log.h>
#include "kc_remote_internal.h"

void kc_remote_queue_init(kc_remote *r)
{
    pthread_mutex_init(&r->q_mu, NULL);
    pthread_cond_init(&r->q_work, NULL);
    pthread_cond_init(&r->q_idle, NULL);
    r->q_inited = true;
}

static void *worker(void *arg)
{
    kc_remote *r = arg;
    CURL *h = curl_easy_init();
    pthread_mutex_lock(&r->q_mu);
    for (;;) {
        while (!r->q_head && !r->q_stop)
            pthread_cond_wait(&r->q_work, &r->q_mu);
        if (!r->q_head && r->q_stop)
            break;
        kc_qitem *it = r->q_head;
        r->q_head = it->next;
        if (!r->q_head)
            r->q_tail = NULL;
        r->q_items--;
        r->q_bytes -= it->len;
        r->q_busy++;
        pthread_mutex_unlock(&r->q_mu);

        kc_err err = {0};
        kc_code rc = KC_ERR_REMOTE;
        if (h && !atomic_load(&r->offline) && !atomic_load(&r->abort_all))
            rc = kc_remote_put_on(r, h, it->key, it->env, it->len, NULL, &err);
        free(it->env);
        free(it);

        pthread_mutex_lock(&r->q_mu);
        if (rc == KC_OK)
            r->q_done++;
        else
            r->q_failed++;
        r->q_busy--;
        if (!r->q_head && r->q_busy == 0)
            pthread_cond_broadcast(&r->q_idle);
    }
    pthread_mutex_unlock(&r->q_mu);
    if (h)
        curl_easy_cleanup(h);
    return NULL;
}

void kc_remote_server_put_async(kc_remote *r, const char *key, const uint8_t *env, size_t len)
{
    if (atomic_load(&r->offline) || atomic_load(&r->no_write))
        return;
    pthread_mutex_lock(&r->q_mu);
    if (r->q_stop || r->q_items >= KC_REMOTE_QUEUE_MAX_ITEMS ||
        r->q_bytes + len > KC_REMOTE_QUEUE_MAX_BYTES) {
        r->q_dropped++;
        pthread_mutex_unlock(&r->q_mu);
        return;
    }
    if (!r->q_started) {
        if (pthread_create(&r->q_thread, NULL, worker, r) != 0) {
            r->q_dropped++;
            pthread_mutex_unlock(&r->q_mu);
            return;
        }
        r->q_started = true;
    }
    kc_qitem *it = calloc(1, sizeof *it);
    uint8_t *copy = len ? malloc(len) : NULL;
    if (!it || (len && !copy)) {
        free(it);
        free(copy);
        r->q_dropped++;
        pthread_mutex_unlock(&r->q_mu);
        return;
    }
    memcpy(it->key, key, KC_KEY_HEX_LEN + 1);
    if (len)
        memcpy(copy, env, len);
    it->env = copy;
    it->len = len;
    if (r->q_tail)
        r->q_tail->next = it;
    else
        r->q_head = it;
    r->q_tail = it;
    r->q_items++;
    r->q_bytes += len;
    pthread_cond_signal(&r->q_work);
    pthread_mutex_unlock(&r->q_mu);
}

size_t kc_remote_server_flush(kc_remote *r, long timeout_ms)
{
    if (!r->q_inited)
        return 0;
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += timeout_ms / 1000;
    dl.tv_nsec += (timeout_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&r->q_mu);
    while ((r->q_head || r->q_busy) && r->q_started) {
        if (pthread_cond_timedwait(&r->q_idle, &r->q_mu, &dl) == ETIMEDOUT)
            break;
    }
    size_t left = r->q_items + (size_t)r->q_busy;
    pthread_mutex_unlock(&r->q_mu);
    return left;
}

void kc_remote_server_queue_stats(kc_remote *r, uint64_t *uploaded, uint64_t *failed,
                                  uint64_t *dropped)
{
    pthread_mutex_lock(&r->q_mu);
    if (uploaded)
        *uploaded = r->q_done;
    if (failed)
        *failed = r->q_failed;
    if (dropped)
        *dropped = r->q_dropped;
    pthread_mutex_unlock(&r->q_mu);
}

void kc_remote_queue_shutdown(kc_remote *r, long limit_ms)
{
    if (!r->q_inited)
        return;
    size_t left = kc_remote_server_flush(r, limit_ms);
    pthread_mutex_lock(&r->q_mu);
    r->q_stop = true;
    /* Whatever is still queued after the limit is given up. */
    kc_qitem *it = r->q_head;
    r->q_head = r->q_tail = NULL;
    r->q_dropped += r->q_items;
    r->q_items = 0;
    r->q_bytes = 0;
    pthread_cond_broadcast(&r->q_work);
    bool started = r->q_started;
    pthread_mutex_unlock(&r->q_mu);
    while (it) {
        kc_qitem *next = it->next;
        free(it->env);
        free(it);
        it = next;
    }
    if (left)
        atomic_store(&r->abort_all, true); /* cut the upload in flight */
    if (started)
        pthread_join(r->q_thread, NULL);
    if (left && !r->quiet)
        kc_log(KC_LOG_WARN, "remote %s: %zu background upload(s) abandoned at exit", r->base, left);
    pthread_cond_destroy(&r->q_work);
    pthread_cond_destroy(&r->q_idle);
    pthread_mutex_destroy(&r->q_mu);
    r->q_inited = false;
}
