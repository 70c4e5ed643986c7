/*
 * kc_shard.c - rendezvous hashing over a list of kcached base URLs (see
 * kc_shard.h). Scores are XXH3-64 of the key seeded by each server's own
 * hash, so a server's identity is its URL, never its position in the list.
 */
#include <kcache/kc_shard.h>

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

struct kc_shard {
    size_t n;
    char *urls[KC_SHARD_MAX];
    uint64_t seeds[KC_SHARD_MAX];
};

void kc_shard_free(kc_shard *sh)
{
    if (!sh)
        return;
    for (size_t i = 0; i < sh->n; i++)
        free(sh->urls[i]);
    free(sh);
}

static uint64_t shard_seed(const char *url)
{
    return XXH3_64bits(url, strlen(url));
}

kc_code kc_shard_parse(const char *list, kc_shard **out, kc_err *err)
{
    *out = NULL;
    if (!list)
        return kc_err_set(err, KC_ERR_INVALID, "remote list: empty");
    kc_shard *sh = calloc(1, sizeof *sh);
    if (!sh)
        return kc_err_set(err, KC_ERR_NOMEM, "remote list: out of memory");
    const char *p = list;
    for (;;) {
        const char *end = strchr(p, ',');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        const char *a = p, *z = p + n;
        while (a < z && (*a == ' ' || *a == '\t'))
            a++;
        while (z > a && (z[-1] == ' ' || z[-1] == '\t'))
            z--;
        while (z > a && z[-1] == '/')
            z--;
        size_t len = (size_t)(z - a);
        kc_code rc = KC_OK;
        if (len == 0)
            rc = kc_err_set(err, KC_ERR_INVALID, "remote list '%s': empty entry", list);
        else if (!((len > 7 && strncmp(a, "http://", 7) == 0) ||
                   (len > 8 && strncmp(a, "https://", 8) == 0)))
            rc = kc_err_set(err, KC_ERR_INVALID,
                            "remote list '%s': '%.*s' is not an http:// or https:// URL", list,
                            (int)len, a);
        else if (sh->n == KC_SHARD_MAX)
            rc = kc_err_set(err, KC_ERR_INVALID, "remote list: more than %d servers", KC_SHARD_MAX);
        if (rc == KC_OK) {
            char *url = strndup(a, len);
            if (!url) {
                rc = kc_err_set(err, KC_ERR_NOMEM, "remote list: out of memory");
            } else {
                for (size_t i = 0; i < sh->n && rc == KC_OK; i++)
                    if (strcmp(sh->urls[i], url) == 0)
                        rc = kc_err_set(err, KC_ERR_INVALID, "remote list: '%s' given twice", url);
                if (rc == KC_OK) {
                    sh->urls[sh->n] = url;
                    sh->seeds[sh->n] = shard_seed(url);
                    sh->n++;
                } else {
                    free(url);
                }
            }
        }
        if (rc != KC_OK) {
            kc_shard_free(sh);
            return rc;
        }
        if (!end)
            break;
        p = end + 1;
    }
    *out = sh;
    return KC_OK;
}

size_t kc_shard_count(const kc_shard *sh)
{
    return sh->n;
}

const char *kc_shard_url(const kc_shard *sh, size_t i)
{
    return i < sh->n ? sh->urls[i] : NULL;
}

uint64_t kc_shard_all(const kc_shard *sh)
{
    return sh->n >= 64 ? UINT64_MAX : ((uint64_t)1 << sh->n) - 1;
}

static uint64_t shard_score_seed(uint64_t seed, const char *key)
{
    return XXH3_64bits_withSeed(key, strlen(key), seed);
}

uint64_t kc_shard_score(const char *server_url, const char *key)
{
    return shard_score_seed(shard_seed(server_url), key);
}

/* Higher score wins; equal scores (never seen in practice) go to the
 * lexicographically smaller URL so that every client agrees. */
static bool shard_better(const kc_shard *sh, size_t i, uint64_t si, size_t j, uint64_t sj)
{
    if (si != sj)
        return si > sj;
    return strcmp(sh->urls[i], sh->urls[j]) < 0;
}

int kc_shard_pick(const kc_shard *sh, const char *key, uint64_t alive)
{
    int best = -1;
    uint64_t best_score = 0;
    for (size_t i = 0; i < sh->n; i++) {
        if (!(alive & ((uint64_t)1 << i)))
            continue;
        uint64_t s = shard_score_seed(sh->seeds[i], key);
        if (best < 0 || shard_better(sh, i, s, (size_t)best, best_score)) {
            best = (int)i;
            best_score = s;
        }
    }
    return best;
}

void kc_shard_rank(const kc_shard *sh, const char *key, size_t *order)
{
    uint64_t scores[KC_SHARD_MAX];
    for (size_t i = 0; i < sh->n; i++) {
        scores[i] = shard_score_seed(sh->seeds[i], key);
        order[i] = i;
    }
    /* insertion sort: n <= 64 */
    for (size_t i = 1; i < sh->n; i++) {
        size_t v = order[i], j = i;
        while (j > 0 && shard_better(sh, v, scores[v], order[j - 1], scores[order[j - 1]])) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = v;
    }
}
