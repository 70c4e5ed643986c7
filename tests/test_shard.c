/*
 * test_shard.c - rendezvous hashing for client-side sharding (kc_shard):
 * parsing of --remote lists, agreement regardless of list order, an even
 * spread, and that a dead, removed or added server moves only its own share.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include <kcache/kc_hash.h>
#include <kcache/kc_shard.h>

#define NKEYS 20000

static void key_of(unsigned i, char key[KC_KEY_HEX_LEN + 1])
{
    char text[32];
    snprintf(text, sizeof text, "key-%u", i);
    kc_sha256_hex(text, strlen(text), key);
}

static kc_shard *parse_ok(const char *list)
{
    kc_shard *sh = NULL;
    kc_err err;
    cr_assert_eq(kc_shard_parse(list, &sh, &err), KC_OK, "%s: %s", list, err.msg);
    return sh;
}

Test(shard, parses_remote_lists_and_names_bad_entries)
{
    kc_shard *sh = parse_ok(" http://a:7070/ ,https://b.example:443,http://c:7070");
    cr_assert_eq(kc_shard_count(sh), 3);
    cr_assert_str_eq(kc_shard_url(sh, 0), "http://a:7070");
    cr_assert_str_eq(kc_shard_url(sh, 1), "https://b.example:443");
    cr_assert_str_eq(kc_shard_url(sh, 2), "http://c:7070");
    cr_assert_null(kc_shard_url(sh, 3));
    cr_assert_eq(kc_shard_all(sh), 7);
    kc_shard_free(sh);

    sh = parse_ok("http://only:7070");
    cr_assert_eq(kc_shard_count(sh), 1);
    char key[KC_KEY_HEX_LEN + 1];
    key_of(1, key);
    cr_assert_eq(kc_shard_pick(sh, key, kc_shard_all(sh)), 0);
    kc_shard_free(sh);

    struct {
        const char *list, *want;
    } bad[] = {
        {"", "empty entry"},
        {"http://a,,http://b", "empty entry"},
        {"http://a,", "empty entry"},
        {"ftp://a", "'ftp://a' is not an http"},
        {"a:7070", "'a:7070' is not an http"},
        {"http://a:7070,http://a:7070/", "given twice"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kc_err err;
        sh = (kc_shard *)1;
        cr_assert_eq(kc_shard_parse(bad[i].list, &sh, &err), KC_ERR_INVALID, "'%s' accepted",
                     bad[i].list);
        cr_assert_null(sh);
        cr_assert(strstr(err.msg, bad[i].want), "'%s': %s", bad[i].list, err.msg);
    }

    char big[64 * 32 + 64] = "";
    for (int i = 0; i < 65; i++) {
        char one[32];
        snprintf(one, sizeof one, "%shttp://h%d", i ? "," : "", i);
        strcat(big, one);
    }
    kc_err err;
    cr_assert_eq(kc_shard_parse(big, &sh, &err), KC_ERR_INVALID);
    cr_assert(strstr(err.msg, "more than 64"), "%s", err.msg);
    char *comma = strrchr(big, ',');
    *comma = 0; /* exactly 64 */
    sh = parse_ok(big);
    cr_assert_eq(kc_shard_all(sh), UINT64_MAX);
    cr_assert_geq(kc_shard_pick(sh, "k", UINT64_MAX), 0);
    kc_shard_free(sh);
}

Test(shard, every_client_agrees_whatever_the_list_order)
{
    kc_shard *a = parse_ok("http://a:7070,http://b:7070,http://c:7070,http://d:7070");
    kc_shard *b = parse_ok("http://d:7070/, http://b:7070,http://a:7070 ,http://c:7070");
    for (unsigned i = 0; i < 2000; i++) {
        char key[KC_KEY_HEX_LEN + 1];
        key_of(i, key);
        int pa = kc_shard_pick(a, key, kc_shard_all(a));
        int pb = kc_shard_pick(b, key, kc_shard_all(b));
        cr_assert_str_eq(kc_shard_url(a, (size_t)pa), kc_shard_url(b, (size_t)pb), "key %s", key);
        cr_assert_eq(kc_shard_score(kc_shard_url(a, (size_t)pa), key),
                     kc_shard_score(kc_shard_url(b, (size_t)pb), key));
    }
    kc_shard_free(a);
    kc_shard_free(b);
}

Test(shard, spreads_keys_evenly)
{
    kc_shard *sh = parse_ok("http://10.0.0.1:7070,http://10.0.0.2:7070,http://10.0.0.3:7070,"
                            "http://10.0.0.4:7070,http://10.0.0.5:7070");
    unsigned count[5] = {0};
    for (unsigned i = 0; i < NKEYS; i++) {
        char key[KC_KEY_HEX_LEN + 1];
        key_of(i, key);
        count[kc_shard_pick(sh, key, kc_shard_all(sh))]++;
    }
    for (int s = 0; s < 5; s++) /* 4000 each; hashing is deterministic, so no flakiness */
        cr_assert(count[s] > 3600 && count[s] < 4400, "server %d got %u of %d keys", s, count[s],
                  NKEYS);
    kc_shard_free(sh);
}

Test(shard, a_dead_server_moves_only_its_own_keys)
{
    kc_shard *sh = parse_ok("http://a:7070,http://b:7070,http://c:7070,http://d:7070");
    uint64_t all = kc_shard_all(sh);
    uint64_t without_b = all & ~(uint64_t)2;
    unsigned moved = 0;
    for (unsigned i = 0; i < NKEYS; i++) {
        char key[KC_KEY_HEX_LEN + 1];
        key_of(i, key);
        int before = kc_shard_pick(sh, key, all);
        int after = kc_shard_pick(sh, key, without_b);
        cr_assert_neq(after, 1);
        if (before != 1)
            cr_assert_eq(after, before, "key %s moved off a live server", key);
        else
            moved++;
        /* Failover order: the pick under the mask is the first live server in
         * the full ranking. */
        size_t order[4];
        kc_shard_rank(sh, key, order);
        cr_assert_eq((int)order[0], before);
        size_t first_live = order[0] == 1 ? order[1] : order[0];
        cr_assert_eq((int)first_live, after);
        bool seen[4] = {false};
        for (int j = 0; j < 4; j++) {
            cr_assert_lt(order[j], 4);
            cr_assert_not(seen[order[j]]);
            seen[order[j]] = true;
        }
    }
    cr_assert(moved > NKEYS / 4 - NKEYS / 20 && moved < NKEYS / 4 + NKEYS / 20, "moved %u", moved);
    cr_assert_eq(kc_shard_pick(sh, "any", 0), -1, "no live server");
    kc_shard_free(sh);
}

Test(shard, adding_a_server_takes_keys_only_for_itself)
{
    kc_shard *four = parse_ok("http://a:7070,http://b:7070,http://c:7070,http://d:7070");
    kc_shard *five = parse_ok("http://a:7070,http://b:7070,http://e:7070,http://c:7070,"
                              "http://d:7070");
    unsigned moved = 0;
    for (unsigned i = 0; i < NKEYS; i++) {
        char key[KC_KEY_HEX_LEN + 1];
        key_of(i, key);
        const char *u4 = kc_shard_url(four, (size_t)kc_shard_pick(four, key, kc_shard_all(four)));
        const char *u5 = kc_shard_url(five, (size_t)kc_shard_pick(five, key, kc_shard_all(five)));
        if (strcmp(u4, u5) != 0) {
            cr_assert_str_eq(u5, "http://e:7070", "key %s moved between old servers", key);
            moved++;
        }
    }
    cr_assert(moved > NKEYS / 5 - NKEYS / 25 && moved < NKEYS / 5 + NKEYS / 25, "moved %u", moved);
    kc_shard_free(four);
    kc_shard_free(five);
}
