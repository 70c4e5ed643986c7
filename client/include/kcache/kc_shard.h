/*
 * kc_shard.h - client-side sharding over several kcached servers by
 * rendezvous (highest-random-weight) hashing: each key goes to the server
 * with the highest hash(server, key). Every client with the same server list
 * agrees without coordination, the order of the list does not matter, and a
 * dead or removed server moves only its own share of keys (to the next
 * highest server for each key); adding one takes 1/N of keys from the others.
 */
#ifndef KC_SHARD_H
#define KC_SHARD_H

#include <stddef.h>
#include <stdint.h>

#include <kcache/kc_error.h>

#define KC_SHARD_MAX 64 /* servers at most: liveness fits one uint64_t mask */

typedef struct kc_shard kc_shard; /* opaque, immutable after parsing: thread-safe */

/* Parses a comma-separated list of base URLs ("http://a:7070, http://b:7070").
 * Spaces around entries and trailing '/' are dropped. KC_ERR_INVALID names
 * the entry for: an empty entry, a scheme other than http:// or https://, a
 * duplicate, more than KC_SHARD_MAX servers. A single URL is a valid list of
 * one. On success *out is owned by the caller (kc_shard_free). */
kc_code kc_shard_parse(const char *list, kc_shard **out, kc_err *err);
void kc_shard_free(kc_shard *sh);

/* Number of servers, and server i's normalised base URL (owned by sh). */
size_t kc_shard_count(const kc_shard *sh);
const char *kc_shard_url(const kc_shard *sh, size_t i);

/* All servers alive, as a liveness mask (bit i = server i). */
uint64_t kc_shard_all(const kc_shard *sh);

/* The score of key on a server (64-bit XXH3 of the key seeded by a hash of
 * the normalised URL). Exposed for tests and tools. */
uint64_t kc_shard_score(const char *server_url, const char *key);

/* The index of the server that owns key among the servers whose bit is set
 * in alive, or -1 when none is alive. key is any NUL-terminated string
 * (normally a 64-hex artifact key). */
int kc_shard_pick(const kc_shard *sh, const char *key, uint64_t alive);

/* Writes all server indices into order[kc_shard_count(sh)], best first, for
 * failover: order[0] is kc_shard_pick(sh, key, kc_shard_all(sh)). */
void kc_shard_rank(const kc_shard *sh, const char *key, size_t *order);

#endif
