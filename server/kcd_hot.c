/*
 * kcd_hot.c - byte-bounded LRU of reference-counted response buffers (see
 * kcd_hot.h): a chained hash table plus an intrusive LRU list under one
 * mutex. The shard structure is kept so the lock can be split later.
 */
#include "kcd_hot.h"

#include <pthread.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#include <kcache/kc_hash.h>

#define HOT_SHARDS 1 /* one LRU: a byte budget split across shards strands large bodies */

typedef struct hot_ent {
    uint8_t key[KC_SHA256_LEN];
    int ns;
    kcd_blob *blob;
    double touched;
    struct hot_ent *hnext;       /* hash chain */
    struct hot_ent *prev, *next; /* LRU list, most recent after the sentinel */
} hot_ent;

typedef struct hot_shard {
    pthread_mutex_t lock;
    hot_ent **buckets;
    size_t nbuckets, count;
    uint64_t bytes, cap;
    uint64_t drops; /* kcd_hot_drop calls: the epoch of kcd_hot_put_since */
    hot_ent lru;    /* sentinel */
} hot_shard;

struct kcd_hot {
    hot_shard shards[HOT_SHARDS];
    size_t max_entry;
    double refresh_s;
};

void kcd_blob_ref(kcd_blob *b)
{
    __atomic_add_fetch(&b->refs, 1, __ATOMIC_RELAXED);
}

void kcd_blob_unref(kcd_blob *b)
{
    if (b && __atomic_sub_fetch(&b->refs, 1, __ATOMIC_ACQ_REL) == 0) {
        if (b->fd >= 0) {
            munmap(b->data, b->len);
            close(b->fd);
        }
        free(b);
    }
}

kcd_hot *kcd_hot_new(uint64_t capacity, size_t max_entry, double refresh_s)
{
    if (capacity == 0)
        return NULL;
    kcd_hot *h = calloc(1, sizeof *h);
    if (!h)
        return NULL;
    h->max_entry = max_entry;
    h->refresh_s = refresh_s;
    for (int i = 0; i < HOT_SHARDS; i++) {
        hot_shard *s = &h->shards[i];
        pthread_mutex_init(&s->lock, NULL);
        s->nbuckets = 256;
        s->buckets = calloc(s->nbuckets, sizeof *s->buckets);
        s->cap = capacity / HOT_SHARDS;
        s->lru.prev = s->lru.next = &s->lru;
        if (!s->buckets) {
            kcd_hot_free(h);
            return NULL;
        }
    }
    return h;
}

void kcd_hot_free(kcd_hot *h)
{
    if (!h)
        return;
    for (int i = 0; i < HOT_SHARDS; i++) {
        hot_shard *s = &h->shards[i];
        if (s->lru.next)
            for (hot_ent *e = s->lru.next, *n; e != &s->lru; e = n) {
                n = e->next;
                kcd_blob_unref(e->blob);
                free(e);
            }
        free(s->buckets);
        pthread_mutex_destroy(&s->lock);
    }
    free(h);
}

static bool parse_key(const char *hex, uint8_t out[KC_SHA256_LEN])
{
    return kc_key_valid(hex) && kc_hex_decode(hex, out, KC_SHA256_LEN);
}

static uint64_t key_hash(const uint8_t *k, int ns)
{
    uint64_t v;
    memcpy(&v, k + 8, sizeof v);
    return v ^ (uint64_t)ns * 0x9E3779B97F4A7C15ull;
}

static hot_shard *shard_of(kcd_hot *h, const uint8_t *k)
{
    return &h->shards[k[0] % HOT_SHARDS];
}

static hot_ent **find(hot_shard *s, const uint8_t *k, int ns)
{
    hot_ent **pp = &s->buckets[key_hash(k, ns) & (s->nbuckets - 1)];
    while (*pp && ((*pp)->ns != ns || memcmp((*pp)->key, k, KC_SHA256_LEN) != 0))
        pp = &(*pp)->hnext;
    return pp;
}

static void lru_unlink(hot_ent *e)
{
    e->prev->next = e->next;
    e->next->prev = e->prev;
}

static void lru_front(hot_shard *s, hot_ent *e)
{
    e->next = s->lru.next;
    e->prev = &s->lru;
    s->lru.next->prev = e;
    s->lru.next = e;
}

static void remove_ent(hot_shard *s, hot_ent **pp)
{
    hot_ent *e = *pp;
    *pp = e->hnext;
    lru_unlink(e);
    s->count--;
    s->bytes -= e->blob->len;
    kcd_blob_unref(e->blob);
    free(e);
}

kcd_blob *kcd_hot_get_bin(kcd_hot *h, int ns, const uint8_t k[KC_SHA256_LEN], double now,
                          bool *refresh)
{
    *refresh = false;
    if (!h)
        return NULL;
    hot_shard *s = shard_of(h, k);
    pthread_mutex_lock(&s->lock);
    hot_ent *e = *find(s, k, ns);
    kcd_blob *b = NULL;
    if (e) {
        b = e->blob;
        kcd_blob_ref(b);
        lru_unlink(e);
        lru_front(s, e);
        if (now - e->touched > h->refresh_s) {
            e->touched = now;
            *refresh = true;
        }
    }
    pthread_mutex_unlock(&s->lock);
    return b;
}

static void grow(hot_shard *s)
{
    size_t n = s->nbuckets * 2;
    hot_ent **nb = calloc(n, sizeof *nb);
    if (!nb)
        return;
    for (size_t i = 0; i < s->nbuckets; i++)
        for (hot_ent *e = s->buckets[i], *next; e; e = next) {
            next = e->hnext;
            hot_ent **slot = &nb[key_hash(e->key, e->ns) & (n - 1)];
            e->hnext = *slot;
            *slot = e;
        }
    free(s->buckets);
    s->buckets = nb;
    s->nbuckets = n;
}

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25 /* Linux 6.1; older kernels answer EINVAL */
#endif
#define HOT_HUGE (2u << 20)

/* Maps a large body's memfd read-only at a 2 MiB boundary and asks the
 * kernel to hold its whole 2 MiB stretches in huge pages (MADV_COLLAPSE,
 * which shmem honours whatever shmem_enabled says, unless "deny"): then
 * sendfile(2) looks up one page per 2 MiB of the memfd instead of one per
 * 4 KiB. Those lookups were 30% of kcached's CPU time on 4 MiB GETs from
 * the memory cache (perf, docs/bench-notes/server.md). Best effort: where
 * the kernel declines, the body stays in small pages. */
static void *map_body(int fd, size_t len)
{
    if (len < HOT_HUGE)
        return mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
    size_t span = len + HOT_HUGE;
    uint8_t *res = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (res == MAP_FAILED)
        return MAP_FAILED;
    uint8_t *at = (uint8_t *)(((uintptr_t)res + HOT_HUGE - 1) & ~(uintptr_t)(HOT_HUGE - 1));
    if (mmap(at, len, PROT_READ, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
        munmap(res, span);
        return MAP_FAILED;
    }
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    uint8_t *end = at + ((len + page - 1) & ~(page - 1)); /* the mapping's end */
    if (at > res)
        munmap(res, (size_t)(at - res));
    if (res + span > end)
        munmap(end, (size_t)(res + span - end));
    /* then unmap the pages from this process again (the memfd keeps them,
     * huge): they are read through sendfile, and a later touch maps them
     * back, so RSS counts them only when used, as before */
    if (madvise(at, len & ~(size_t)(HOT_HUGE - 1), MADV_COLLAPSE) == 0)
        madvise(at, len, MADV_DONTNEED);
    return at;
}

/* Copies data into a new blob (memfd-backed when large). */
static kcd_blob *blob_new(const uint8_t *data, size_t len)
{
    bool big = len >= KCD_HOT_FD_MIN;
    kcd_blob *b = malloc(sizeof *b + (big ? 0 : len ? len : 1));
    if (!b)
        return NULL;
    b->refs = 1;
    b->len = len;
    b->fd = -1;
    b->data = b->inline_data;
    if (!big) {
        memcpy(b->data, data, len);
        return b;
    }
    int fd = memfd_create("kcached-hot", MFD_CLOEXEC);
    if (fd < 0)
        goto fail;
    for (size_t off = 0; off < len;) {
        ssize_t n = write(fd, data + off, len - off);
        if (n <= 0) {
            close(fd);
            goto fail;
        }
        off += (size_t)n;
    }
    void *map = map_body(fd, len);
    if (map == MAP_FAILED) {
        close(fd);
        goto fail;
    }
    b->fd = fd;
    b->data = map;
    return b;
fail:
    free(b);
    return NULL;
}

uint64_t kcd_hot_epoch_bin(kcd_hot *h, const uint8_t k[KC_SHA256_LEN])
{
    return h ? __atomic_load_n(&shard_of(h, k)->drops, __ATOMIC_ACQUIRE) : 0;
}

void kcd_hot_put_bin(kcd_hot *h, int ns, const uint8_t k[KC_SHA256_LEN], const uint8_t *data,
                     size_t len, double now, uint64_t epoch)
{
    if (!h || len > h->max_entry)
        return;
    hot_shard *s = shard_of(h, k);
    if (len > s->cap)
        return;
    kcd_blob *b = blob_new(data, len);
    if (!b)
        return;
    pthread_mutex_lock(&s->lock);
    if (epoch != KCD_HOT_ANY_EPOCH && s->drops != epoch) {
        /* a drop since the caller's read: its bytes may be the old ones */
        pthread_mutex_unlock(&s->lock);
        kcd_blob_unref(b);
        return;
    }
    hot_ent **pp = find(s, k, ns);
    if (*pp)
        remove_ent(s, pp);
    hot_ent *e = calloc(1, sizeof *e);
    if (!e) {
        pthread_mutex_unlock(&s->lock);
        kcd_blob_unref(b);
        return;
    }
    memcpy(e->key, k, KC_SHA256_LEN);
    e->ns = ns;
    e->blob = b;
    e->touched = now;
    if (s->count >= s->nbuckets)
        grow(s);
    pp = &s->buckets[key_hash(k, ns) & (s->nbuckets - 1)];
    e->hnext = *pp;
    *pp = e;
    lru_front(s, e);
    s->count++;
    s->bytes += len;
    while (s->bytes > s->cap && s->lru.prev != e) {
        hot_ent *victim = s->lru.prev;
        remove_ent(s, find(s, victim->key, victim->ns));
    }
    pthread_mutex_unlock(&s->lock);
}

bool kcd_hot_accepts(const kcd_hot *h, size_t len)
{
    return h && len <= h->max_entry && len <= h->shards[0].cap;
}

void kcd_hot_drop(kcd_hot *h, const char *key_hex)
{
    uint8_t k[KC_SHA256_LEN];
    if (h && parse_key(key_hex, k))
        kcd_hot_drop_bin(h, k);
}

void kcd_hot_drop_bin(kcd_hot *h, const uint8_t k[KC_SHA256_LEN])
{
    if (!h)
        return;
    hot_shard *s = shard_of(h, k);
    pthread_mutex_lock(&s->lock);
    __atomic_store_n(&s->drops, s->drops + 1, __ATOMIC_RELEASE);
    for (int ns = KCD_HOT_ENVELOPE; ns <= KCD_HOT_REDIS; ns++) {
        hot_ent **pp = find(s, k, ns);
        if (*pp)
            remove_ent(s, pp);
    }
    pthread_mutex_unlock(&s->lock);
}

void kcd_hot_usage(kcd_hot *h, uint64_t *entries, uint64_t *bytes)
{
    *entries = *bytes = 0;
    if (!h)
        return;
    for (int i = 0; i < HOT_SHARDS; i++) {
        hot_shard *s = &h->shards[i];
        pthread_mutex_lock(&s->lock);
        *entries += s->count;
        *bytes += s->bytes;
        pthread_mutex_unlock(&s->lock);
    }
}
