/*
 * test_remote_shard.c - client-side sharding against three real kcached
 * servers on loopback: a push spreads the keys disjointly by rendezvous
 * hashing, another cache dir with the same list gets everything back, a dead
 * server costs only its share (one warning, clean misses), and a compile
 * through the kcache binary with --remote A,B,C warms a second machine.
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <kcache/kc_remote.h>
#include <kcache/kc_shard.h>
#include "kc_testserver.h"
#include "kc_testutil.h"
#include <kcache/kc_util.h>

#define NSERV 3
#define NART 90
#define DEVICE "cpu-shard-test"

static char *tmp;
static kc_testserver ts[NSERV];
static char list[NSERV * 100];

static void setup(void)
{
    kc_test_log_to_stderr(); /* warnings go through kc_log; the tests read them back */
    tmp = kc_test_mkdtemp("remote-shard");
    cr_assert_not_null(tmp);
    list[0] = '\0';
    for (int i = 0; i < NSERV; i++) {
        memset(&ts[i], 0, sizeof ts[i]);
        cr_assert_eq(kc_testserver_start(&ts[i], NULL, NULL), 0, "kcached %d did not start", i);
        if (i)
            strcat(list, ",");
        strcat(list, ts[i].url);
    }
}

static void teardown(void)
{
    for (int i = 0; i < NSERV; i++)
        kc_testserver_cleanup(&ts[i]);
    kc_test_rmtree(tmp);
    free(tmp);
}

TestSuite(remote_shard, .init = setup, .fini = teardown, .timeout = 50);

/* Fills a store with n small artifacts; their keys go to keys. */
static void fill_store(const char *dir, int n, int seed0, char (*keys)[65])
{
    kc_store *s;
    kc_err err = {0};
    cr_assert_eq(kc_store_open(dir, NULL, &s, &err), KC_OK, "%s", err.msg);
    uint8_t payload[700];
    for (int i = 0; i < n; i++) {
        char seed[48], meta[96];
        snprintf(seed, sizeof seed, "shard-%d-%d", seed0, i);
        kc_sha256_hex(seed, strlen(seed), keys[i]);
        kc_test_fill_random(payload, sizeof payload, (uint64_t)(seed0 * 100000 + i + 1));
        snprintf(meta, sizeof meta, "{\"device\":\"%s\"}", DEVICE);
        kc_artifact a;
        cr_assert_eq(kc_artifact_init(&a, keys[i], "cpu-so", meta, payload, sizeof payload, &err),
                     KC_OK, "%s", err.msg);
        cr_assert_eq(kc_store_put(s, &a, NULL, &err), KC_OK, "%s", err.msg);
        kc_artifact_free(&a);
    }
    kc_store_close(s);
}

static int count_cb(const kc_entry_info *info, void *ctx)
{
    (void)info;
    (*(uint64_t *)ctx)++;
    return 0;
}

static uint64_t count_entries(const char *dir)
{
    kc_store *s;
    kc_err err = {0};
    cr_assert_eq(kc_store_open(dir, NULL, &s, &err), KC_OK, "%s", err.msg);
    uint64_t n = 0;
    cr_assert_eq(kc_store_list(s, NULL, count_cb, &n, &err), KC_OK, "%s", err.msg);
    kc_store_close(s);
    return n;
}

/* Which of keys server url holds, asked of it alone (one missing query). */
static size_t held_by(const char *url, char (*keys)[65], size_t n, bool *held)
{
    kc_remote *r;
    kc_err err = {0};
    cr_assert_eq(kc_remote_open(url, NULL, &r, &err), KC_OK, "%s", err.msg);
    const char **ptrs = malloc(n * sizeof *ptrs);
    bool *miss = malloc(n * sizeof *miss);
    for (size_t i = 0; i < n; i++)
        ptrs[i] = keys[i];
    cr_assert_eq(kc_remote_missing(r, ptrs, n, miss, &err), KC_OK, "%s", err.msg);
    size_t c = 0;
    for (size_t i = 0; i < n; i++) {
        held[i] = !miss[i];
        c += held[i];
    }
    free(ptrs);
    free(miss);
    kc_remote_close(r);
    return c;
}

/* Where stderr goes while a handle may warn: a file read back later. */
typedef struct captured {
    int saved;
    char path[512];
} captured;

static void capture_begin(captured *c)
{
    snprintf(c->path, sizeof c->path, "%s/stderr.txt", tmp);
    fflush(stderr);
    c->saved = dup(2);
    int fd = open(c->path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    cr_assert(fd >= 0);
    dup2(fd, 2);
    close(fd);
}

static char *capture_end(captured *c)
{
    fflush(stderr);
    dup2(c->saved, 2);
    close(c->saved);
    return kc_test_read_file(c->path, NULL);
}

static int count_str(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p++)
        n++;
    return n;
}

Test(remote_shard, push_spreads_keys_disjointly_and_another_dir_gets_them_all)
{
    static char keys[NART][65];
    char *a = kc_test_path(tmp, "a"), *b = kc_test_path(tmp, "b");
    fill_store(a, NART, 1, keys);

    kc_remote *r;
    kc_err err = {0};
    cr_assert_eq(kc_remote_open(list, NULL, &r, &err), KC_OK, "%s", err.msg);
    cr_assert_str_eq(kc_remote_url(r), list, "the URL is the list as given");
    cr_assert(!kc_remote_offline(r));
    kc_store *s;
    cr_assert_eq(kc_store_open(a, NULL, &s, &err), KC_OK, "%s", err.msg);
    kc_remote_push_stats ps = {0};
    cr_assert_eq(kc_remote_push_ex(r, s, NULL, NULL, NULL, &ps, &err), KC_OK, "%s", err.msg);
    cr_assert_eq(ps.considered, NART);
    cr_assert_eq(ps.uploaded, NART, "every artifact uploaded once");
    /* again: each server's missing query says it has its share already */
    cr_assert_eq(kc_remote_push_ex(r, s, NULL, NULL, NULL, &ps, &err), KC_OK, "%s", err.msg);
    cr_assert_eq(ps.uploaded, 0);
    cr_assert_eq(ps.skipped, NART);
    kc_store_close(s);
    kc_remote_close(r);

    /* each server holds exactly the keys rendezvous hashing gives it */
    kc_shard *sh;
    cr_assert_eq(kc_shard_parse(list, &sh, &err), KC_OK, "%s", err.msg);
    static bool held[NSERV][NART];
    size_t total = 0;
    for (int i = 0; i < NSERV; i++) {
        size_t c = held_by(ts[i].url, keys, NART, held[i]);
        cr_log_info("server %d holds %zu of %d", i, c, NART);
        cr_assert_geq(c, NART / NSERV / 3, "server %d holds roughly its share: %zu", i, c);
        total += c;
    }
    cr_assert_eq(total, NART, "together the servers hold every artifact exactly once");
    for (int k = 0; k < NART; k++) {
        int owner = kc_shard_pick(sh, keys[k], kc_shard_all(sh));
        cr_assert(owner >= 0 && held[owner][k], "key %d is on its owner %d", k, owner);
    }
    kc_shard_free(sh);

    /* another machine with the same list: a pull gets everything, and so
     * does a get of every key */
    cr_assert_eq(kc_remote_open(list, NULL, &r, &err), KC_OK, "%s", err.msg);
    cr_assert_eq(kc_store_open(b, NULL, &s, &err), KC_OK, "%s", err.msg);
    kc_bundle_stats st = {0};
    cr_assert_eq(kc_remote_pull(r, s, NULL, NULL, NULL, NULL, &st, &err), KC_OK, "%s", err.msg);
    cr_assert_eq(st.imported, NART, "the pull from all servers imports each artifact");
    kc_store_close(s);
    for (int k = 0; k < NART; k++) {
        kc_artifact art;
        cr_assert_eq(kc_remote_get(r, keys[k], &art, &err), KC_OK, "%s", err.msg);
        cr_assert_str_eq(art.key, keys[k]);
        kc_artifact_free(&art);
        cr_assert_eq(kc_remote_has(r, keys[k], &err), KC_OK, "%s", err.msg);
    }
    kc_remote_close(r);
    cr_assert_eq(count_entries(b), NART);

    /* and through the kcache binary, with the list in $KCACHE_REMOTE */
    char *c = kc_test_path(tmp, "c");
    setenv("KCACHE_REMOTE", list, 1);
    kc_test_result res;
    cr_assert_eq(kc_test_runl(&res, KC_TEST_KCACHE, "--cache-dir", c, "pull", "--device", "all",
                              "--json", NULL),
                 0);
    unsetenv("KCACHE_REMOTE");
    cr_assert_eq(res.exit_code, 0, "pull: %s", res.err);
    json_t *j = json_loads(res.out, 0, NULL);
    cr_assert(j, "pull output: %s", res.out);
    cr_assert_eq(json_integer_value(json_object_get(j, "imported")), NART, "%s", res.out);
    json_decref(j);
    kc_test_result_free(&res);
    cr_assert_eq(count_entries(c), NART);
    free(a);
    free(b);
    free(c);
}

Test(remote_shard, dead_server_costs_only_its_share)
{
    static char keys[NART][65];
    char *a = kc_test_path(tmp, "a"), *b = kc_test_path(tmp, "b");
    fill_store(a, NART, 2, keys);
    kc_remote *r;
    kc_err err = {0};
    kc_remote_opts o = {.connect_timeout_ms = 1000};
    cr_assert_eq(kc_remote_open(list, &o, &r, &err), KC_OK, "%s", err.msg);
    kc_store *s;
    cr_assert_eq(kc_store_open(a, NULL, &s, &err), KC_OK, "%s", err.msg);
    /* single puts, and background ones for the second half */
    for (int k = 0; k < NART; k++) {
        kc_artifact art;
        uint8_t *env;
        size_t len;
        cr_assert_eq(kc_store_get_envelope(s, keys[k], &env, &len, &err), KC_OK, "%s", err.msg);
        if (k < NART / 2) {
            bool created = false;
            cr_assert_eq(kc_remote_put(r, keys[k], env, len, &created, &err), KC_OK, "%s", err.msg);
            cr_assert(created);
        } else {
            kc_remote_put_async(r, keys[k], env, len);
        }
        free(env);
        (void)art;
    }
    kc_store_close(s);
    cr_assert_eq(kc_remote_flush(r, 20000), 0);
    uint64_t up = 0, failed = 0, dropped = 0;
    kc_remote_queue_stats(r, &up, &failed, &dropped);
    cr_assert_eq(up, NART - NART / 2, "the queues of all servers uploaded");
    cr_assert_eq(failed + dropped, 0);
    kc_remote_close(r);

    const int dead = 1;
    kc_testserver_kill(&ts[dead]);
    kc_shard *sh;
    cr_assert_eq(kc_shard_parse(list, &sh, &err), KC_OK, "%s", err.msg);

    captured cap;
    capture_begin(&cap);
    cr_assert_eq(kc_remote_open(list, &o, &r, &err), KC_OK, "%s", err.msg);
    int hits = 0, misses = 0, owned_dead = 0;
    double t0 = kc_now();
    for (int k = 0; k < NART; k++) {
        int owner = kc_shard_pick(sh, keys[k], kc_shard_all(sh));
        kc_artifact art;
        kc_code rc = kc_remote_get(r, keys[k], &art, &err);
        if (owner == dead) {
            owned_dead++;
            cr_assert_eq(rc, KC_ERR_NOT_FOUND, "the dead server's share misses cleanly: %s",
                         err.msg);
            misses++;
        } else {
            cr_assert_eq(rc, KC_OK, "a live server's key still hits: %s", err.msg);
            kc_artifact_free(&art);
            hits++;
        }
    }
    double took = kc_now() - t0;
    cr_assert(!kc_remote_offline(r), "two servers are still up");

    /* a batch fetch gets exactly the live servers' share */
    cr_assert_eq(kc_store_open(b, NULL, &s, &err), KC_OK, "%s", err.msg);
    const char *ptrs[NART];
    bool fetched[NART];
    for (int k = 0; k < NART; k++)
        ptrs[k] = keys[k];
    size_t nf = 0;
    cr_assert_eq(kc_remote_fetch(r, s, ptrs, NART, fetched, &nf, &err), KC_OK, "%s", err.msg);
    cr_assert_eq(nf, (size_t)hits);
    for (int k = 0; k < NART; k++)
        cr_assert_eq(fetched[k], kc_shard_pick(sh, keys[k], kc_shard_all(sh)) != dead);

    /* a put whose owner is dead goes to the next live server, and a get
     * finds it there */
    kc_store_close(s);
    cr_assert_eq(kc_store_open(a, NULL, &s, &err), KC_OK, "%s", err.msg);
    int k0 = -1;
    for (int k = 0; k < NART && k0 < 0; k++)
        if (kc_shard_pick(sh, keys[k], kc_shard_all(sh)) == dead)
            k0 = k;
    cr_assert_geq(k0, 0);
    uint8_t *env;
    size_t len;
    cr_assert_eq(kc_store_get_envelope(s, keys[k0], &env, &len, &err), KC_OK, "%s", err.msg);
    bool created = false;
    cr_assert_eq(kc_remote_put(r, keys[k0], env, len, &created, &err), KC_OK, "%s", err.msg);
    cr_assert(created);
    free(env);
    kc_artifact art;
    cr_assert_eq(kc_remote_get(r, keys[k0], &art, &err), KC_OK, "%s", err.msg);
    kc_artifact_free(&art);
    size_t order[KC_SHARD_MAX];
    kc_shard_rank(sh, keys[k0], order);
    bool on_next = false;
    held_by(ts[order[1]].url, &keys[k0], 1, &on_next);
    cr_assert(on_next, "the failover put went to the next server in rank order");

    /* a pull with one server dead imports the others' shares, then says
     * which failed */
    kc_store_close(s);
    char *c = kc_test_path(tmp, "c");
    cr_assert_eq(kc_store_open(c, NULL, &s, &err), KC_OK, "%s", err.msg);
    kc_bundle_stats st = {0};
    cr_assert_eq(kc_remote_pull(r, s, NULL, NULL, NULL, NULL, &st, &err), KC_ERR_REMOTE);
    cr_assert(strstr(err.msg, ts[dead].url) || strstr(err.msg, "offline"), "%s", err.msg);
    cr_assert_eq(st.imported, (uint64_t)hits + 1, "the live servers' shares arrive");
    kc_store_close(s);
    kc_remote_close(r);
    char *log = capture_end(&cap);
    cr_log_info("%d hits, %d misses (dead owner) in %.2f s", hits, misses, took);
    cr_assert_gt(owned_dead, 0);
    cr_assert_gt(hits, 0);
    cr_assert_eq(count_str(log, "warning"), 1, "one warning, for the dead server: %s", log);
    cr_assert(strstr(log, ts[dead].url), "the warning names the dead server: %s", log);
    free(log);

    /* every server dead: the handle is offline */
    for (int i = 0; i < NSERV; i++)
        kc_testserver_kill(&ts[i]);
    o.quiet = true;
    cr_assert_eq(kc_remote_open(list, &o, &r, &err), KC_OK, "%s", err.msg);
    for (int k = 0; k < 6; k++)
        cr_assert_eq(kc_remote_get(r, keys[k], &art, &err), KC_ERR_REMOTE);
    cr_assert(kc_remote_offline(r), "offline once every server is");
    kc_remote_close(r);
    kc_shard_free(sh);
    free(a);
    free(b);
    free(c);
}

Test(remote_shard, hung_server_hands_its_share_to_the_next_one)
{
    /* the middle server listens and never answers (a hung host) */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    cr_assert_eq(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    cr_assert_eq(listen(fd, 64), 0);
    socklen_t sl = sizeof sa;
    getsockname(fd, (struct sockaddr *)&sa, &sl);
    char hung[64], hlist[300];
    snprintf(hung, sizeof hung, "http://127.0.0.1:%d", ntohs(sa.sin_port));
    snprintf(hlist, sizeof hlist, "%s,%s,%s", ts[0].url, hung, ts[2].url);

    static char keys[NART][65];
    char *a = kc_test_path(tmp, "a");
    fill_store(a, NART, 3, keys);
    kc_shard *sh;
    kc_err err = {0};
    cr_assert_eq(kc_shard_parse(hlist, &sh, &err), KC_OK, "%s", err.msg);
    int owned_hung = 0;
    for (int k = 0; k < NART; k++)
        owned_hung += kc_shard_pick(sh, keys[k], kc_shard_all(sh)) == 1;
    kc_shard_free(sh);
    cr_assert_gt(owned_hung, 0);

    captured cap;
    capture_begin(&cap);
    kc_remote_opts o = {.connect_timeout_ms = 1000};
    kc_remote *r;
    cr_assert_eq(kc_remote_open(hlist, &o, &r, &err), KC_OK, "%s", err.msg);
    kc_store *s;
    cr_assert_eq(kc_store_open(a, NULL, &s, &err), KC_OK, "%s", err.msg);
    double t0 = kc_now();
    kc_remote_push_stats ps = {0};
    kc_code rc = kc_remote_push_ex(r, s, NULL, NULL, NULL, &ps, &err);
    double push_s = kc_now() - t0;
    kc_store_close(s);
    kc_remote_close(r);

    /* a fresh process-like handle: the hung owner costs one stall, then
     * every key of its share is found on the next server */
    cr_assert_eq(kc_remote_open(hlist, &o, &r, &err), KC_OK, "%s", err.msg);
    t0 = kc_now();
    int hits = 0;
    for (int k = 0; k < NART; k++) {
        kc_artifact art;
        if (kc_remote_get(r, keys[k], &art, &err) == KC_OK) {
            hits++;
            kc_artifact_free(&art);
        }
    }
    double get_s = kc_now() - t0;
    kc_remote_close(r);
    char *log = capture_end(&cap);
    cr_log_info("hung server owns %d of %d: push %.2f s, %d gets %.2f s", owned_hung, NART, push_s,
                NART, get_s);
    cr_assert_eq(rc, KC_OK, "the push carries on without the hung server: %s", err.msg);
    cr_assert_eq(ps.uploaded, NART, "its share went to the next servers");
    cr_assert_eq(hits, NART, "every key is found, the hung server's share on the next server");
    cr_assert_eq(count_str(log, "warning"), 2, "one warning per handle, naming it: %s", log);
    cr_assert_eq(count_str(log, hung), 2, "%s", log);
    free(log);
    close(fd);
    free(a);
}

Test(remote_shard, bad_lists_are_rejected)
{
    kc_remote *r = NULL;
    kc_err err = {0};
    cr_assert_eq(kc_remote_open("http://127.0.0.1:1,ftp://127.0.0.1:2", NULL, &r, &err),
                 KC_ERR_INVALID);
    cr_assert(strstr(err.msg, "ftp://"), "%s", err.msg);
    cr_assert_null(r);
    cr_assert_eq(kc_remote_open("http://127.0.0.1:1,,http://127.0.0.1:2", NULL, &r, &err),
                 KC_ERR_INVALID);
    cr_assert_eq(kc_remote_open("http://127.0.0.1:1,http://127.0.0.1:1", NULL, &r, &err),
                 KC_ERR_INVALID);
    kc_remote_opts o = {.token = "bad token"};
    cr_assert_eq(kc_remote_open("http://127.0.0.1:1,http://127.0.0.1:2", &o, &r, &err),
                 KC_ERR_INVALID);
    cr_assert_null(r);
}

typedef struct owner_check {
    kc_shard *sh;
    int want, wrong;
} owner_check;

static int owner_cb(const kc_entry_info *info, void *ctx)
{
    owner_check *oc = ctx;
    oc->wrong += kc_shard_pick(oc->sh, info->key, kc_shard_all(oc->sh)) != oc->want;
    return 0;
}

/* kcache compile/pull with a list, as a user runs it */
static json_t *kcache_json(const char *dir, const char *url, const char *const *args)
{
    const char *argv[24] = {KC_TEST_KCACHE, "--cache-dir", dir};
    int n = 3;
    if (url) {
        argv[n++] = "--remote";
        argv[n++] = url;
    }
    for (; *args && n < 23; args++)
        argv[n++] = *args;
    argv[n] = NULL;
    kc_test_result res;
    cr_assert_eq(kc_test_run((char *const *)argv, NULL, 0, 45, &res), 0);
    cr_assert_eq(res.exit_code, 0, "kcache %s: %s", argv[n - 1], res.err);
    json_t *j = json_loads(res.out, 0, NULL);
    cr_assert(j, "not JSON: %s / %s", res.out, res.err);
    kc_test_result_free(&res);
    return j;
}

Test(remote_shard, compile_with_three_servers_warms_another_machine)
{
    char *a = kc_test_path(tmp, "a"), *b = kc_test_path(tmp, "b");
    const char *graph = KC_TEST_SOURCE_DIR "/examples/mlp.json";
    const char *compile[] = {"compile", graph, "--device", "cpu", "--json", NULL};
    json_t *j = kcache_json(a, list, compile);
    cr_assert_gt(json_integer_value(json_object_get(j, "compiled")), 0, "a cold compile");
    json_decref(j);

    j = kcache_json(b, list, (const char *[]){"pull", "--json", NULL});
    cr_assert_gt(json_integer_value(json_object_get(j, "imported")), 0);
    json_decref(j);

    j = kcache_json(b, NULL, compile);
    cr_assert_eq(json_integer_value(json_object_get(j, "compiled")), 0,
                 "after the pull from all servers, B compiles nothing");
    cr_assert(json_is_true(json_object_get(j, "graph_hit")));
    json_decref(j);

    /* the uploads went to their owners: each server holds exactly the
     * entries rendezvous hashing gives it, together all of A's */
    uint64_t na = count_entries(a);
    cr_assert_gt(na, 1);
    kc_shard *sh;
    kc_err err = {0};
    cr_assert_eq(kc_shard_parse(list, &sh, &err), KC_OK, "%s", err.msg);
    uint64_t sum = 0;
    int servers_used = 0;
    for (int i = 0; i < NSERV; i++) {
        char name[16];
        snprintf(name, sizeof name, "only%d", i);
        char *d = kc_test_path(tmp, name);
        json_t *p =
            kcache_json(d, ts[i].url, (const char *[]){"pull", "--device", "all", "--json", NULL});
        json_int_t got = json_integer_value(json_object_get(p, "imported"));
        json_decref(p);
        sum += (uint64_t)got;
        servers_used += got > 0;
        owner_check oc = {.sh = sh, .want = i};
        kc_store *s;
        cr_assert_eq(kc_store_open(d, NULL, &s, &err), KC_OK, "%s", err.msg);
        cr_assert_eq(kc_store_list(s, NULL, owner_cb, &oc, &err), KC_OK, "%s", err.msg);
        kc_store_close(s);
        cr_assert_eq(oc.wrong, 0, "server %d holds only keys it owns", i);
        free(d);
    }
    kc_shard_free(sh);
    cr_log_info("%llu entries spread over %d servers", (unsigned long long)na, servers_used);
    cr_assert_eq(sum, na, "the servers hold A's entries once each");
    free(a);
    free(b);
}
