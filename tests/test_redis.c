/*
 * test_redis.c - kcached's Redis protocol (--redis-listen) driven by real
 * clients: redis-cli for the command set and error shapes, redis-py
 * (tests/redis/clients.py) replaying Inductor's and Triton's cache traffic,
 * raw sockets for pipelining and for bad input, which must close only the
 * offending connection. A real kcached on ephemeral ports behind each test.
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <kcache/kc_bundle.h>
#include <kcache/kc_hash.h>
#include <kcache/kc_store.h>
#include "kc_testserver.h"
#include "kc_testutil.h"

#define TOK_R "redis-read-1c9e7a55"
#define TOK_W "redis-write-52be0d17"
#define TOK_RW "redis-rw-8f03c2d4"
#define TOK_ADM "redis-admin-40e7b19a"

typedef struct rserver {
    kc_testserver ts;
    char *dir;
    unsigned port; /* the Redis port */
    char portstr[16];
} rserver;

/* Starts kcached with --redis-listen and the extra args (NULL-terminated,
 * may be NULL); tokens != 0 adds a tokens file with TOK_R, TOK_W, TOK_RW. */
static void rs_start(rserver *rs, bool tokens, const char *const *extra)
{
    memset(rs, 0, sizeof *rs);
    rs->dir = kc_test_mkdtemp("kcdredis");
    char *rpf = kc_test_path(rs->dir, "redis.port");
    char *tok = kc_test_path(rs->dir, "tokens");
    const char *text = TOK_R " read reader\n" TOK_W " write writer\n" TOK_RW
                             " read,write builder\n" TOK_ADM " read,write,admin ops\n";
    kc_test_write_file(tok, text, strlen(text));
    const char *args[24] = {"--redis-listen", "127.0.0.1:0", "--redis-port-file", rpf};
    int n = 4;
    if (tokens) {
        args[n++] = "--tokens";
        args[n++] = tok;
    }
    for (int i = 0; extra && extra[i] && n < 22; i++)
        args[n++] = extra[i];
    args[n] = NULL;
    cr_assert_eq(kc_testserver_start(&rs->ts, NULL, args), 0, "kcached did not start");
    size_t len;
    char *p = kc_test_read_file(rpf, &len);
    cr_assert_not_null(p, "no Redis port file");
    rs->port = (unsigned)strtoul(p, NULL, 10);
    cr_assert_gt(rs->port, 0);
    snprintf(rs->portstr, sizeof rs->portstr, "%u", rs->port);
    free(p);
    free(rpf);
    free(tok);
}

static void rs_reread_port(rserver *rs)
{
    char *rpf = kc_test_path(rs->dir, "redis.port");
    size_t len;
    char *p = kc_test_read_file(rpf, &len);
    cr_assert_not_null(p);
    rs->port = (unsigned)strtoul(p, NULL, 10);
    snprintf(rs->portstr, sizeof rs->portstr, "%u", rs->port);
    free(p);
    free(rpf);
}

static void rs_stop(rserver *rs)
{
    if (rs->ts.pid) {
        int st = kc_testserver_stop(&rs->ts);
        char *log = st ? kc_testserver_read_log(&rs->ts) : NULL;
        cr_expect_eq(st, 0, "kcached exit status %d; log:\n%s", st, log ? log : "");
        free(log);
    }
    kc_testserver_cleanup(&rs->ts);
    kc_test_rmtree(rs->dir);
    free(rs->dir);
}

/* redis-cli -p PORT args... ; returns stdout (caller frees), trailing
 * newline removed. */
static char *cli(const rserver *rs, const char *arg, ...)
{
    va_list ap;
    va_start(ap, arg);
    char *out = kc_test_redis_cliv(rs->portstr, arg, ap);
    va_end(ap);
    cr_assert_not_null(out, "redis-cli did not run");
    return out;
}

#define EXPECT_CLI(want, ...)                                                                      \
    do {                                                                                           \
        char *got_ = cli(__VA_ARGS__, NULL);                                                       \
        cr_expect_str_eq(got_, want, "redis-cli %s", #__VA_ARGS__);                                \
        free(got_);                                                                                \
    } while (0)

/* A raw connection with a 20 s receive timeout (no test can hang), from
 * source address src (127.0.0.x, all loopback; NULL: the kernel's choice). */
static int rconnect_from(const rserver *rs, const char *src)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_geq(fd, 0);
    if (src) {
        struct sockaddr_in me = {.sin_family = AF_INET};
        cr_assert_eq(inet_pton(AF_INET, src, &me.sin_addr), 1);
        cr_assert_eq(bind(fd, (struct sockaddr *)&me, sizeof me), 0, "bind %s", src);
    }
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)rs->port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    struct timeval tv = {20, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

static int rconnect(const rserver *rs)
{
    return rconnect_from(rs, NULL);
}

static void send_all(int fd, const void *data, size_t n)
{
    const char *p = data;
    while (n) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k <= 0)
            return; /* the server may close first; the reply says why */
        p += k;
        n -= (size_t)k;
    }
}

/* Reads until want bytes arrived, or (suffix non-NULL) until what arrived
 * ends with suffix, or else until the server closes. *closed (may be NULL)
 * tells whether it closed (a reset counts: Linux still returns the bytes
 * that came before it). Returns a malloc'd, NUL-terminated buffer. */
static char *recv_until(int fd, size_t want, const char *suffix, bool *closed)
{
    size_t cap = 1 << 16, n = 0, sl = suffix ? strlen(suffix) : 0;
    char *buf = malloc(cap + 1);
    bool eof = false;
    while (want == 0 || n < want) {
        if (suffix && n >= sl && !memcmp(buf + n - sl, suffix, sl))
            break;
        if (n == cap)
            buf = realloc(buf, (cap *= 2) + 1);
        ssize_t k = recv(fd, buf + n, cap - n, 0);
        /* a server closing with request bytes unread sends a reset after
         * its reply: that is closed too */
        eof = k == 0 || (k < 0 && errno == ECONNRESET);
        if (k <= 0)
            break;
        n += (size_t)k;
    }
    buf[n] = 0;
    if (closed)
        *closed = eof;
    return buf;
}

static char *exchange(int fd, const char *req, size_t want)
{
    send_all(fd, req, strlen(req));
    return recv_until(fd, want, NULL, NULL);
}

TestSuite(redis, .timeout = 120);

Test(redis, redis_cli_commands_and_error_shapes)
{
    rserver rs;
    rs_start(&rs, false, NULL);
    EXPECT_CLI("PONG", &rs, "PING");
    EXPECT_CLI("hi", &rs, "PING", "hi");
    EXPECT_CLI("hello world", &rs, "ECHO", "hello world");
    EXPECT_CLI("OK", &rs, "SET", "k", "v1");
    EXPECT_CLI("v1", &rs, "GET", "k");
    EXPECT_CLI("", &rs, "GET", "missing");
    EXPECT_CLI("", &rs, "SET", "k", "v2", "NX");
    EXPECT_CLI("v1", &rs, "GET", "k");
    EXPECT_CLI("OK", &rs, "SET", "k", "v2", "XX");
    EXPECT_CLI("", &rs, "SET", "nx-new", "x", "XX");
    EXPECT_CLI("0", &rs, "EXISTS", "nx-new");
    EXPECT_CLI("v2", &rs, "SET", "k", "v3", "GET");
    EXPECT_CLI("v3", &rs, "GET", "k");
    EXPECT_CLI("OK", &rs, "SET", "t", "x", "EX", "100");
    char *ttl = cli(&rs, "TTL", "t", NULL);
    cr_expect(atoi(ttl) > 90 && atoi(ttl) <= 100, "TTL %s", ttl);
    free(ttl);
    EXPECT_CLI("OK", &rs, "SET", "t", "y", "KEEPTTL");
    ttl = cli(&rs, "PTTL", "t", NULL);
    cr_expect(atoi(ttl) > 90000 && atoi(ttl) <= 100000, "KEEPTTL kept it: PTTL %s", ttl);
    free(ttl);
    EXPECT_CLI("1", &rs, "PERSIST", "t");
    EXPECT_CLI("-1", &rs, "TTL", "t");
    EXPECT_CLI("0", &rs, "PERSIST", "t");
    EXPECT_CLI("1", &rs, "EXPIRE", "t", "50");
    EXPECT_CLI("0", &rs, "EXPIRE", "t", "60", "NX");
    EXPECT_CLI("1", &rs, "PEXPIRE", "t", "70000", "GT");
    EXPECT_CLI("y", &rs, "GET", "t");
    EXPECT_CLI("-2", &rs, "TTL", "nope");
    EXPECT_CLI("OK", &rs, "SETEX", "se", "100", "a");
    EXPECT_CLI("OK", &rs, "PSETEX", "pse", "100000", "b");
    EXPECT_CLI("ERR invalid expire time in 'setex' command", &rs, "SETEX", "se", "0", "a");
    EXPECT_CLI("ERR invalid expire time in 'set' command", &rs, "SET", "se", "a", "EX", "-5");
    EXPECT_CLI("ERR value is not an integer or out of range", &rs, "SET", "se", "a", "PX", "x");
    EXPECT_CLI("ERR syntax error", &rs, "SET", "se", "a", "NX", "XX");
    /* an absolute expiry in the past: stored, then read as missing */
    EXPECT_CLI("OK", &rs, "SET", "old", "gone", "PXAT", "1");
    EXPECT_CLI("", &rs, "GET", "old");
    EXPECT_CLI("-2", &rs, "TTL", "old");
    EXPECT_CLI("2", &rs, "STRLEN", "k");
    EXPECT_CLI("string", &rs, "TYPE", "k");
    EXPECT_CLI("none", &rs, "TYPE", "nope");
    EXPECT_CLI("2", &rs, "EXISTS", "k", "k", "nope");
    EXPECT_CLI("v3\n\ny", &rs, "MGET", "k", "nope", "t");
    EXPECT_CLI("4", &rs, "DBSIZE"); /* k, t, se, pse */
    EXPECT_CLI("1", &rs, "DEL", "se", "nope");
    EXPECT_CLI("1", &rs, "UNLINK", "pse");
    EXPECT_CLI("2", &rs, "DBSIZE");
    EXPECT_CLI("OK", &rs, "SELECT", "0");
    EXPECT_CLI("ERR DB index is out of range", &rs, "SELECT", "1");
    EXPECT_CLI("ERR unknown command 'lpush', with args beginning with: 'l' 'x' ", &rs, "lpush", "l",
               "x");
    EXPECT_CLI("ERR wrong number of arguments for 'get' command", &rs, "GET");
    EXPECT_CLI("ERR wrong number of arguments for 'set' command", &rs, "SET", "k");
    EXPECT_CLI("OK", &rs, "CLIENT", "SETINFO", "LIB-NAME", "redis-py");
    EXPECT_CLI("37", &rs, "COMMAND", "COUNT");
    /* CONFIG GET answers as Redis does (what redis-benchmark asks first);
     * CONFIG SET is refused with Redis' error */
    EXPECT_CLI("save\n\nappendonly\nyes", &rs, "CONFIG", "GET", "save", "appendonly");
    EXPECT_CLI("databases\n1", &rs, "CONFIG", "GET", "DATABASES");
    EXPECT_CLI("maxmemory\n0\nmaxmemory-policy\nnoeviction", &rs, "CONFIG", "GET", "maxmem*");
    EXPECT_CLI("appendonly\nyes\nappendfsync\neverysec", &rs, "CONFIG", "GET", "append*",
               "appendonly");
    EXPECT_CLI("", &rs, "CONFIG", "GET", "requirepass");
    EXPECT_CLI("ERR CONFIG SET failed (possibly related to argument 'save') - can't set immutable "
               "config",
               &rs, "CONFIG", "SET", "save", "");
    EXPECT_CLI("ERR wrong number of arguments for 'config|get' command", &rs, "CONFIG", "GET");
    EXPECT_CLI("ERR unknown subcommand 'rewrite'. Try CONFIG HELP.", &rs, "CONFIG", "rewrite");
    char *cg3 = cli(&rs, "-3", "CONFIG", "GET", "databases", NULL);
    cr_expect_str_eq(cg3, "databases 1", "RESP3: a map");
    free(cg3);
    char *info = cli(&rs, "INFO", NULL);
    cr_expect(strstr(info, "redis_version:") && strstr(info, "keyspace_hits:") &&
                  strstr(info, "keyspace_misses:") && strstr(info, "db0:keys=2"),
              "INFO: %s", info);
    free(info);
    /* expired keys read as missing for the write commands too (which
     * look the key up while holding its lock) */
    EXPECT_CLI("OK", &rs, "SET", "exp1", "old", "PXAT", "1");
    EXPECT_CLI("OK", &rs, "SET", "exp1", "fresh", "NX");
    EXPECT_CLI("fresh", &rs, "GET", "exp1");
    EXPECT_CLI("OK", &rs, "SET", "exp2", "old", "PXAT", "1");
    EXPECT_CLI("", &rs, "SET", "exp2", "new", "XX", "GET");
    EXPECT_CLI("OK", &rs, "SET", "exp3", "old", "PXAT", "1");
    EXPECT_CLI("0", &rs, "DEL", "exp3");
    EXPECT_CLI("OK", &rs, "SET", "exp4", "old", "PXAT", "1");
    EXPECT_CLI("0", &rs, "EXPIRE", "exp4", "100");
    EXPECT_CLI("0", &rs, "PERSIST", "exp4");
    /* RESP3 after HELLO 3 (redis-cli -3 sends it) */
    char *hello = cli(&rs, "-3", "HELLO", "3", NULL);
    cr_expect(strstr(hello, "proto") && strstr(hello, "3"), "HELLO 3: %s", hello);
    free(hello);
    EXPECT_CLI("", &rs, "-3", "GET", "nope");
    EXPECT_CLI("NOPROTO unsupported protocol version", &rs, "HELLO", "4");
    rs_stop(&rs);
}

/* Replies on the wire, byte for byte, for a pipeline sent in one write:
 * RESP2, then RESP3 after HELLO 3 (nulls become "_"), CLIENT names, QUIT. */
Test(redis, pipelined_commands_get_exact_replies_in_order)
{
    rserver rs;
    rs_start(&rs, false, NULL);
    int fd = rconnect(&rs);
    const char *req = "*3\r\n$3\r\nSET\r\n$1\r\na\r\n$5\r\nhello\r\n"
                      "*2\r\n$3\r\nGET\r\n$1\r\na\r\n"
                      "*2\r\n$3\r\nGET\r\n$1\r\nb\r\n"
                      "*3\r\n$4\r\nMGET\r\n$1\r\na\r\n$1\r\nb\r\n"
                      "PING\r\n"
                      "*3\r\n$6\r\nCLIENT\r\n$7\r\nSETNAME\r\n$2\r\nme\r\n"
                      "*2\r\n$6\r\nCLIENT\r\n$7\r\nGETNAME\r\n";
    const char *want2 = "+OK\r\n$5\r\nhello\r\n$-1\r\n*2\r\n$5\r\nhello\r\n$-1\r\n+PONG\r\n+OK\r\n"
                        "$2\r\nme\r\n";
    char *got = exchange(fd, req, strlen(want2));
    cr_expect_str_eq(got, want2, "RESP2 replies");
    free(got);
    /* HELLO 3 answers with a map; PING marks its end */
    send_all(fd, "HELLO 3\r\nPING\r\n", 15);
    got = recv_until(fd, 0, "+PONG\r\n", NULL);
    cr_expect(!strncmp(got, "%7\r\n$6\r\nserver\r\n", 16), "HELLO 3: %s", got);
    cr_expect(strstr(got, "$5\r\nproto\r\n:3\r\n") != NULL, "HELLO 3: %s", got);
    free(got);
    const char *req3 = "*2\r\n$3\r\nGET\r\n$1\r\nb\r\n*3\r\n$4\r\nMGET\r\n$1\r\nb\r\n$1\r\na\r\n"
                       "QUIT\r\n";
    send_all(fd, req3, strlen(req3));
    bool closed;
    char *all = recv_until(fd, 0, NULL, &closed);
    cr_expect_str_eq(all, "_\r\n*2\r\n_\r\n$5\r\nhello\r\n+OK\r\n", "RESP3 nulls");
    cr_expect(closed, "QUIT closes the connection");
    free(all);
    close(fd);
    rs_stop(&rs);
}

/* The value of a metric line "name value" in /metrics, or -1. */
static long long metric(const rserver *rs, const char *name)
{
    kc_http_result m;
    cr_assert_eq(kc_testserver_http(&rs->ts, "GET", "/metrics", NULL, NULL, 0, false, &m), 0);
    char pat[128];
    snprintf(pat, sizeof pat, "\n%s ", name);
    const char *p = strstr((char *)m.body, pat);
    long long v = p ? strtoll(p + strlen(pat), NULL, 10) : -1;
    kc_http_result_free(&m);
    return v;
}

/* Pipelined writes of one client join one store transaction, in order
 * with the reads and errors between them. */
Test(redis, pipelined_writes_share_a_commit_in_order)
{
    rserver rs;
    rs_start(&rs, false, NULL);
    long long commits0 = metric(&rs, "kcached_redis_write_commits_total");
    int fd = rconnect(&rs);
    char *req = NULL, *want = NULL;
    size_t len = 0, wlen = 0;
    FILE *f = open_memstream(&req, &len), *g = open_memstream(&want, &wlen);
    for (int i = 0; i < 40; i++) {
        fprintf(f, "*3\r\n$3\r\nSET\r\n$1\r\np\r\n$2\r\n%02d\r\n", i);
        fprintf(g, "+OK\r\n");
        if (i % 10 == 5) { /* a read and a refused write between them */
            fprintf(f, "*2\r\n$3\r\nGET\r\n$1\r\np\r\n*4\r\n$3\r\nSET\r\n$1\r\np\r\n$1\r\nx\r\n"
                       "$2\r\nNO\r\n");
            fprintf(g, "$2\r\n%02d\r\n-ERR syntax error\r\n", i);
        }
    }
    fprintf(f, "*2\r\n$3\r\nGET\r\n$1\r\np\r\n");
    fprintf(g, "$2\r\n39\r\n");
    fclose(f);
    fclose(g);
    send_all(fd, req, len);
    char *got = recv_until(fd, wlen, NULL, NULL);
    cr_expect_str_eq(got, want, "replies in order");
    free(got);
    free(req);
    free(want);
    close(fd);
    long long writes = metric(&rs, "kcached_redis_writes_total");
    long long commits = metric(&rs, "kcached_redis_write_commits_total") - commits0;
    cr_expect_eq(writes, 44, "SETs run by the committer (refused ones included)");
    cr_expect(commits > 0 && commits < 40, "%lld commits for 44 pipelined writes", commits);
    rs_stop(&rs);
}

/* Reads pipelined between writes join the writes' commit: a client
 * sending SET k, GET k pairs waits for one commit per batch, not one per
 * SET, and each read answers, in order, with the value the write before it
 * stored (never the value from before the batch, which the memory cache
 * held). Deletes and TTLs in the batch are seen by the reads after them. */
Test(redis, pipelined_reads_between_writes_see_them_in_one_commit)
{
    rserver rs;
    rs_start(&rs, false, NULL);
    int fd = rconnect(&rs);
    /* the old value in the memory cache first */
    char *got =
        exchange(fd, "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$3\r\nold\r\n*2\r\n$3\r\nGET\r\n$1\r\nk\r\n",
                 strlen("+OK\r\n$3\r\nold\r\n"));
    cr_expect_str_eq(got, "+OK\r\n$3\r\nold\r\n");
    free(got);
    long long commits0 = metric(&rs, "kcached_redis_write_commits_total");
    char *req = NULL, *want = NULL;
    size_t len = 0, wlen = 0;
    FILE *f = open_memstream(&req, &len), *g = open_memstream(&want, &wlen);
    for (int i = 0; i < 30; i++) {
        fprintf(f, "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$3\r\nv%02d\r\n*2\r\n$3\r\nGET\r\n$1\r\nk\r\n",
                i);
        fprintf(g, "+OK\r\n$3\r\nv%02d\r\n", i);
    }
    fprintf(f, "*5\r\n$3\r\nSET\r\n$1\r\nt\r\n$4\r\nfive\r\n$2\r\nEX\r\n$3\r\n100\r\n"
               "*2\r\n$3\r\nTTL\r\n$1\r\nt\r\n*2\r\n$6\r\nSTRLEN\r\n$1\r\nt\r\n"
               "*2\r\n$3\r\nDEL\r\n$1\r\nt\r\n*2\r\n$6\r\nEXISTS\r\n$1\r\nt\r\n"
               "*2\r\n$3\r\nGET\r\n$1\r\nt\r\n*2\r\n$4\r\nTYPE\r\n$1\r\nt\r\n");
    fprintf(g, "+OK\r\n:100\r\n:4\r\n:1\r\n:0\r\n$-1\r\n+none\r\n");
    fclose(f);
    fclose(g);
    send_all(fd, req, len);
    got = recv_until(fd, wlen, NULL, NULL);
    cr_expect_str_eq(got, want, "replies in order, each read after the write before it");
    free(got);
    free(req);
    free(want);
    long long commits = metric(&rs, "kcached_redis_write_commits_total") - commits0;
    /* one per SET before: reads sent the connection back to its worker */
    cr_expect(commits > 0 && commits <= 8, "%lld commits for 32 pipelined writes", commits);
    /* what was answered is what is stored, for a new connection too */
    char *v = cli(&rs, "GET", "k", NULL);
    cr_expect_str_eq(v, "v29");
    free(v);
    close(fd);
    rs_stop(&rs);
}

/* A worker hashes a SET's value before the committer stores it; pipelined
 * SETs, some taken by the worker and some joining the batch on the
 * committer, each store their own value under its own digest: a digest
 * left over from another SET would file the value under that one's bytes
 * (the same length here, so only the digest tells them apart), and a GET
 * would answer with the wrong value. */
Test(redis, pipelined_sets_are_stored_under_their_own_digests)
{
    rserver rs;
    rs_start(&rs, false, NULL);
    int fd = rconnect(&rs);
    for (int round = 0; round < 3; round++) {
        char *req = NULL, *want = NULL;
        size_t len = 0, wlen = 0;
        FILE *f = open_memstream(&req, &len), *g = open_memstream(&want, &wlen);
        for (int i = 0; i < 48; i++) {
            fprintf(f, "*3\r\n$3\r\nSET\r\n$4\r\nd%03d\r\n$64\r\nround-%d-value-%02d-", i, round,
                    i);
            for (int j = 0; j < 64 - 17; j++)
                fputc('a' + (i + j + round) % 26, f);
            fprintf(f, "\r\n");
            fprintf(g, "+OK\r\n");
            if (i % 7 == 3) { /* a read sends the connection back to its worker */
                fprintf(f, "*2\r\n$6\r\nSTRLEN\r\n$4\r\nd%03d\r\n", i);
                fprintf(g, ":64\r\n");
            }
        }
        fclose(f);
        fclose(g);
        send_all(fd, req, len);
        char *got = recv_until(fd, wlen, NULL, NULL);
        cr_expect_str_eq(got, want, "round %d: replies", round);
        free(got);
        free(req);
        free(want);
        for (int i = 0; i < 48; i += 5) {
            char key[8], exp[65];
            snprintf(key, sizeof key, "d%03d", i);
            int n = snprintf(exp, sizeof exp, "round-%d-value-%02d-", round, i);
            for (int j = 0; j < 64 - 17; j++)
                exp[n + j] = (char)('a' + (i + j + round) % 26);
            exp[64] = '\0';
            char *v = cli(&rs, "GET", key, NULL);
            cr_expect_str_eq(v, exp, "round %d: %s", round, key);
            free(v);
        }
    }
    close(fd);
    rs_stop(&rs);
}

Test(redis, ttls_survive_a_restart)
{
    rserver rs;
    rs_start(&rs, false, NULL);
    EXPECT_CLI("OK", &rs, "SET", "keep", "v", "EX", "3600");
    EXPECT_CLI("OK", &rs, "SET", "forever", "w");
    EXPECT_CLI("OK", &rs, "SET", "past", "x", "PXAT", "1000");
    cr_assert_eq(kc_testserver_stop(&rs.ts), 0);
    cr_assert_eq(kc_testserver_restart(&rs.ts), 0);
    rs_reread_port(&rs);
    char *ttl = cli(&rs, "TTL", "keep", NULL);
    cr_expect(atoi(ttl) > 3500 && atoi(ttl) <= 3600, "TTL after restart: %s", ttl);
    free(ttl);
    EXPECT_CLI("v", &rs, "GET", "keep");
    EXPECT_CLI("-1", &rs, "TTL", "forever");
    EXPECT_CLI("", &rs, "GET", "past");
    EXPECT_CLI("0", &rs, "EXISTS", "past");
    rs_stop(&rs);
}

#define GC_CONNS 8
#define GC_SETS 200

/* Group commit: SETs from many clients at once share store transactions,
 * and each one answered +OK is on disk: kill -9 right after the last reply
 * loses none of them. */
Test(redis, concurrent_sets_share_commits_and_survive_kill9)
{
    rserver rs;
    rs_start(&rs, false, (const char *const[]){"--threads", "2", NULL});
    int fds[GC_CONNS];
    char *want = malloc(GC_SETS * 5 + 1);
    for (int i = 0; i < GC_SETS; i++)
        memcpy(want + i * 5, "+OK\r\n", 5);
    want[GC_SETS * 5] = 0;
    /* every client's SETs are sent before any reply is read: the
     * committer finds several clients' writes waiting at once */
    for (int c = 0; c < GC_CONNS; c++) {
        fds[c] = rconnect(&rs);
        char *req = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&req, &len);
        for (int i = 0; i < GC_SETS; i++) {
            char key[32], val[64];
            int kl = snprintf(key, sizeof key, "gc:%d:%d", c, i);
            int vl = snprintf(val, sizeof val, "value-%d-%d-%0*d", c, i, 20, i * 7);
            fprintf(f, "*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n", kl, key, vl, val);
        }
        fclose(f);
        send_all(fds[c], req, len);
        free(req);
    }
    for (int c = 0; c < GC_CONNS; c++) {
        char *got = recv_until(fds[c], GC_SETS * 5, NULL, NULL);
        cr_assert_str_eq(got, want, "client %d: every SET answered +OK", c);
        free(got);
    }
    long long writes = metric(&rs, "kcached_redis_writes_total");
    long long commits = metric(&rs, "kcached_redis_write_commits_total");
    cr_expect_eq(writes, GC_CONNS * GC_SETS, "writes counted");
    cr_expect(commits > 0 && commits < writes, "%lld writes in %lld commits", writes, commits);
    kc_testserver_kill(&rs.ts);
    for (int c = 0; c < GC_CONNS; c++)
        close(fds[c]);
    cr_assert_eq(kc_testserver_restart(&rs.ts), 0);
    rs_reread_port(&rs);
    char n[16];
    snprintf(n, sizeof n, "%d", GC_CONNS * GC_SETS);
    EXPECT_CLI(n, &rs, "DBSIZE");
    /* and each value is the one acknowledged */
    int fd = rconnect(&rs);
    for (int c = 0; c < GC_CONNS; c++) {
        char *req = NULL, *exp = NULL;
        size_t len = 0, elen = 0;
        FILE *f = open_memstream(&req, &len), *g = open_memstream(&exp, &elen);
        for (int i = 0; i < GC_SETS; i++) {
            char key[32], val[64];
            int kl = snprintf(key, sizeof key, "gc:%d:%d", c, i);
            int vl = snprintf(val, sizeof val, "value-%d-%d-%0*d", c, i, 20, i * 7);
            fprintf(f, "*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n", kl, key);
            fprintf(g, "$%d\r\n%s\r\n", vl, val);
        }
        fclose(f);
        fclose(g);
        send_all(fd, req, len);
        char *got = recv_until(fd, elen, NULL, NULL);
        cr_expect_str_eq(got, exp, "client %d's values after kill -9", c);
        free(got);
        free(req);
        free(exp);
    }
    close(fd);
    free(want);
    rs_stop(&rs);
}

#define NX_CONNS 12
#define NX_KEYS 60

/* NX_CONNS clients each send SET nx:K client-C NX and wait for the answer,
 * for NX_KEYS keys: exactly one client takes each key, and after kill -9
 * each key holds its winner's value. */
static void nx_race_survives_kill9(const char *const *args)
{
    rserver rs;
    rs_start(&rs, false, args);
    int fds[NX_CONNS];
    for (int c = 0; c < NX_CONNS; c++)
        fds[c] = rconnect(&rs);
    int owner[NX_KEYS];
    for (int k = 0; k < NX_KEYS; k++) {
        for (int c = 0; c < NX_CONNS; c++) {
            char req[128];
            int n = snprintf(req, sizeof req, "SET nx:%d client-%d NX\r\n", k, c);
            send_all(fds[c], req, (size_t)n);
        }
        owner[k] = -1;
        for (int c = 0; c < NX_CONNS; c++) {
            char *got = recv_until(fds[c], 5, NULL, NULL);
            if (!strcmp(got, "+OK\r\n")) {
                cr_expect_eq(owner[k], -1, "key %d taken by clients %d and %d", k, owner[k], c);
                owner[k] = c;
            } else {
                cr_expect_str_eq(got, "$-1\r\n", "client %d, key %d", c, k);
            }
            free(got);
        }
        cr_expect_neq(owner[k], -1, "key %d taken by nobody", k);
    }
    long long commits = metric(&rs, "kcached_redis_write_commits_total");
    cr_expect_geq(commits, NX_KEYS, "%lld commits", commits);
    kc_testserver_kill(&rs.ts);
    for (int c = 0; c < NX_CONNS; c++)
        close(fds[c]);
    cr_assert_eq(kc_testserver_restart(&rs.ts), 0);
    rs_reread_port(&rs);
    for (int k = 0; k < NX_KEYS; k++) {
        char key[32], want[32];
        snprintf(key, sizeof key, "nx:%d", k);
        snprintf(want, sizeof want, "client-%d", owner[k]);
        EXPECT_CLI(want, &rs, "GET", key);
    }
    rs_stop(&rs);
}

/* Clients that send one command and wait for its answer are committed by
 * their own worker at the end of its round, three workers racing for the
 * write seat with the committer idle. SET NX still lets exactly one client
 * take each key, and every +OK is on disk when it is answered. */
Test(redis, lone_writers_on_several_workers_stay_exclusive_and_durable)
{
    nx_race_survives_kill9((const char *const[]){"--threads", "3", NULL});
}

/* --durable with every client on the one worker: the worker commits and
 * fsyncs its round itself, as redis-server's appendfsync always does, where
 * other workers' clients would send it to the committer. The same race, the
 * same answers, the same values after kill -9. */
Test(redis, durable_writers_on_a_sole_worker_stay_exclusive_and_durable)
{
    nx_race_survives_kill9((const char *const[]){"--durable", "--threads", "1", NULL});
}

/* PING on fd; returns the reply (caller frees). */
static char *ping(int fd)
{
    send_all(fd, "PING\r\n", 6);
    return recv_until(fd, 0, "\r\n", NULL);
}

Test(redis, per_address_limit_leaves_other_addresses_in)
{
    rserver rs;
    rs_start(&rs, false, (const char *const[]){"--per-ip-connections", "4", NULL});
    int busy[4];
    for (int i = 0; i < 4; i++) {
        busy[i] = rconnect_from(&rs, "127.0.0.2");
        char *got = ping(busy[i]);
        cr_assert_str_eq(got, "+PONG\r\n", "connection %d from 127.0.0.2", i);
        free(got);
    }
    /* a fifth from the same address is told why and closed */
    int extra = rconnect_from(&rs, "127.0.0.2");
    bool closed = false;
    char *got = recv_until(extra, 0, NULL, &closed);
    cr_expect_str_eq(got, "-ERR too many connections from your address\r\n");
    cr_expect(closed, "the fifth connection is closed");
    free(got);
    close(extra);
    /* another address is not locked out */
    int other = rconnect_from(&rs, "127.0.0.1");
    got = ping(other);
    cr_expect_str_eq(got, "+PONG\r\n", "127.0.0.1 still served");
    free(got);
    close(other);
    /* a closed connection frees its place (counted down before the close
     * the client sees) */
    send_all(busy[0], "QUIT\r\n", 6);
    got = recv_until(busy[0], 0, NULL, &closed);
    cr_expect(closed && !strcmp(got, "+OK\r\n"), "QUIT: %s", got);
    free(got);
    close(busy[0]);
    busy[0] = rconnect_from(&rs, "127.0.0.2");
    got = ping(busy[0]);
    cr_expect_str_eq(got, "+PONG\r\n", "a place freed by QUIT is usable");
    free(got);
    for (int i = 0; i < 4; i++)
        close(busy[i]);
    rs_stop(&rs);
}

Test(redis, idle_connections_are_closed_after_redis_timeout)
{
    rserver rs;
    rs_start(&rs, false, (const char *const[]){"--redis-timeout", "1", NULL});
    int fd = rconnect(&rs);
    char *got = ping(fd);
    cr_assert_str_eq(got, "+PONG\r\n");
    free(got);
    /* nothing more is sent: the server closes it (the wait is bounded so a
     * server that never does fails the test instead of hanging it) */
    struct pollfd p = {.fd = fd, .events = POLLIN};
    cr_assert_eq(poll(&p, 1, 30000), 1, "the idle connection was not closed");
    char b;
    cr_expect_eq(recv(fd, &b, 1, 0), 0, "EOF on the idle connection");
    close(fd);
    /* a new connection is served as usual */
    fd = rconnect(&rs);
    got = ping(fd);
    cr_expect_str_eq(got, "+PONG\r\n");
    free(got);
    close(fd);
    rs_stop(&rs);
}

static void run_py(const rserver *rs, const char *scenario, const char *password, const char *user)
{
    char script[512];
    snprintf(script, sizeof script, "%s/tests/redis/clients.py", KC_TEST_SOURCE_DIR);
    char *argv[] = {
        "/usr/bin/python3", script, (char *)rs->portstr, (char *)scenario, (char *)password,
        (char *)user,       NULL};
    kc_test_result r;
    cr_assert_eq(kc_test_run(argv, NULL, 0, 60, &r), 0);
    cr_expect_eq(r.exit_code, 0, "clients.py %s: %s%s", scenario, r.out, r.err);
    kc_test_result_free(&r);
}

Test(redis, redis_py_replays_inductor_and_triton_caches)
{
    rserver rs;
    rs_start(&rs, false, NULL);
    run_py(&rs, "inductor", NULL, NULL);
    run_py(&rs, "triton", NULL, NULL);
    /* what they stored is in the store, and counted */
    kc_http_result m;
    kc_testserver_http(&rs.ts, "GET", "/metrics", NULL, NULL, 0, false, &m);
    cr_expect(strstr((char *)m.body, "kcached_redis_commands_total{command=\"mget\"} 3"), "%s",
              m.body);
    cr_expect(strstr((char *)m.body, "kcached_redis_keyspace_hits_total"), "%s", m.body);
    kc_http_result_free(&m);
    rs_stop(&rs);
}

Test(redis, tokens_decide_auth_and_scopes)
{
    rserver rs;
    rs_start(&rs, true, NULL);
    EXPECT_CLI("PONG", &rs, "PING");
    EXPECT_CLI("NOAUTH Authentication required.", &rs, "GET", "k");
    EXPECT_CLI("NOAUTH Authentication required.", &rs, "SET", "k", "v");
    EXPECT_CLI("WRONGPASS invalid username-password pair or user is disabled.", &rs, "AUTH",
               "not-a-token");
    EXPECT_CLI("WRONGPASS invalid username-password pair or user is disabled.", &rs, "AUTH",
               "writer", TOK_R);
    /* one connection, pipelined, checked reply by reply */
    int fd = rconnect(&rs);
    const char *req = "AUTH " TOK_R "\r\nGET k\r\nSET k v\r\nAUTH writer " TOK_W
                      "\r\nSET k v\r\nGET k\r\nAUTH default " TOK_RW "\r\nGET k\r\nQUIT\r\n";
    send_all(fd, req, strlen(req));
    bool closed;
    char *all = recv_until(fd, 0, NULL, &closed);
    const char *want = "+OK\r\n$-1\r\n"
                       "-NOPERM User reader has no permissions to run the 'set' command\r\n"
                       "+OK\r\n+OK\r\n"
                       "-NOPERM User writer has no permissions to run the 'get' command\r\n"
                       "+OK\r\n$1\r\nv\r\n+OK\r\n";
    cr_expect_str_eq(all, want);
    free(all);
    close(fd);
    /* redis-py with a password, and with the token's name as user name */
    run_py(&rs, "auth", TOK_RW, NULL);
    run_py(&rs, "auth", TOK_RW, "builder");
    /* HELLO 3 with AUTH in one go */
    char *hello = cli(&rs, "HELLO", "3", "AUTH", "default", TOK_RW, NULL);
    cr_expect(strstr(hello, "proto") != NULL, "HELLO AUTH: %s", hello);
    free(hello);
    /* before AUTH only small commands are read (as Redis does) */
    fd = rconnect(&rs);
    char *got = exchange(fd, "*20\r\n", 0);
    cr_expect(strstr(got, "-ERR Protocol error: unauthenticated multibulk length"), "%s", got);
    free(got);
    close(fd);
    char *log = kc_testserver_read_log(&rs.ts);
    cr_expect(!strstr(log, TOK_R) && !strstr(log, TOK_W) && !strstr(log, TOK_RW),
              "a token reached the log");
    free(log);
    rs_stop(&rs);
}

/* A token without the read scope never gets stored bytes back: not from
 * SET's GET option, GETSET, GETDEL or GETEX, whose replies carry the old
 * value; nothing it sent changed the stored value either. */
Test(redis, write_only_token_never_reads_stored_bytes)
{
    rserver rs;
    rs_start(&rs, true, NULL);
#define AS_WRITER "--user", "writer", "--pass", TOK_W, "--no-auth-warning"
#define AS_BUILDER "--user", "builder", "--pass", TOK_RW, "--no-auth-warning"
    EXPECT_CLI("OK", &rs, AS_BUILDER, "SET", "secret", "stored-bytes");
    EXPECT_CLI("OK", &rs, AS_WRITER, "SET", "other", "x");
    const char *noperm_set = "NOPERM User writer has no permissions to run the 'set' command "
                             "with GET (it needs the read scope)";
    EXPECT_CLI(noperm_set, &rs, AS_WRITER, "SET", "secret", "x", "GET");
    EXPECT_CLI(noperm_set, &rs, AS_WRITER, "SET", "secret", "x", "EX", "100", "get");
    EXPECT_CLI("NOPERM User writer has no permissions to run the 'getset' command", &rs, AS_WRITER,
               "GETSET", "secret", "x");
    EXPECT_CLI("NOPERM User writer has no permissions to run the 'getdel' command", &rs, AS_WRITER,
               "GETDEL", "secret");
    EXPECT_CLI("NOPERM User writer has no permissions to run the 'getex' command", &rs, AS_WRITER,
               "GETEX", "secret", "PERSIST");
    /* pipelined, so the refusal holds on the committer's path too */
    int fd = rconnect(&rs);
    const char *req = "AUTH writer " TOK_W "\r\nSET a 1\r\nSET secret y GET\r\nSET b 2\r\n"
                      "QUIT\r\n";
    send_all(fd, req, strlen(req));
    char *all = recv_until(fd, 0, NULL, NULL);
    cr_expect_str_eq(all, "+OK\r\n+OK\r\n-NOPERM User writer has no permissions to run the "
                          "'set' command with GET (it needs the read scope)\r\n+OK\r\n+OK\r\n");
    free(all);
    close(fd);
    EXPECT_CLI("stored-bytes", &rs, AS_BUILDER, "GET", "secret");
    /* a token with both scopes gets them all, as Redis answers */
    EXPECT_CLI("stored-bytes", &rs, AS_BUILDER, "SET", "secret", "v2", "GET");
    EXPECT_CLI("v2", &rs, AS_BUILDER, "GETSET", "secret", "v3");
    EXPECT_CLI("v3", &rs, AS_BUILDER, "GETEX", "secret", "EX", "100");
    EXPECT_CLI("100", &rs, AS_BUILDER, "TTL", "secret");
    EXPECT_CLI("v3", &rs, AS_BUILDER, "GETDEL", "secret");
    EXPECT_CLI("0", &rs, AS_BUILDER, "EXISTS", "secret");
    rs_stop(&rs);

    /* with --anonymous-read an unauthenticated client reads, but a command
     * that also writes is refused */
    const char *anon[] = {"--anonymous-read", NULL};
    rs_start(&rs, true, anon);
    EXPECT_CLI("OK", &rs, AS_BUILDER, "SET", "k", "v");
    EXPECT_CLI("v", &rs, "GET", "k");
    EXPECT_CLI("NOAUTH Authentication required.", &rs, "GETDEL", "k");
    EXPECT_CLI("NOAUTH Authentication required.", &rs, "SET", "k", "w", "GET");
    EXPECT_CLI("v", &rs, "GET", "k");
#undef AS_WRITER
#undef AS_BUILDER
    rs_stop(&rs);
}

/* A refused AUTH is logged with the user name escaped, never a name shaped
 * like a credential (a token given as the user name), and no client can
 * forge a log line with newlines or terminal escapes. */
Test(redis, auth_failures_log_escaped_names_and_no_credentials)
{
    rserver rs;
    rs_start(&rs, true, NULL);
    int fd = rconnect(&rs);
    /* the token and the name swapped; a forged line; an escape code */
    const char *req = "*3\r\n$4\r\nAUTH\r\n$"
                      "20"
                      "\r\n" TOK_W "\r\n$6\r\nwriter\r\n"
                      "*3\r\n$4\r\nAUTH\r\n$13\r\na\nFORGED line\r\n"
                      "$3\r\npw1\r\n"
                      "*3\r\n$4\r\nAUTH\r\n$6\r\n\x1b[2Jab\r\n$3\r\npw2\r\n"
                      "*3\r\n$4\r\nAUTH\r\n$12\r\nnot-a-token1\r\n$3\r\npw3\r\nQUIT\r\n";
    send_all(fd, req, strlen(req));
    char *all = recv_until(fd, 0, NULL, NULL);
    const char *wrong = "-WRONGPASS invalid username-password pair or user is disabled.\r\n";
    cr_expect(strstr(all, wrong) == all, "%s", all);
    free(all);
    close(fd);
    char *log = kc_testserver_read_log(&rs.ts);
    cr_expect(!strstr(log, TOK_W), "a token reached the log:\n%s", log);
    cr_expect(!strstr(log, "\nFORGED"), "a forged line reached the log:\n%s", log);
    cr_expect(!strchr(log, '\x1b'), "an escape code reached the log");
    cr_expect(strstr(log, "withheld (20 bytes, shaped like a token)"), "%s", log);
    cr_expect(strstr(log, "'\\x1b[2Jab'"), "%s", log);
    cr_expect(strstr(log, "'a\\x0aFORGED line'"), "%s", log);
    cr_expect(strstr(log, "'not-a-token1'"), "%s", log);
    free(log);
    rs_stop(&rs);
}

/* redis-py's default pipeline() (MULTI ... EXEC) works, and no other
 * client's command lands between a transaction's commands (a second client
 * writes the same key all along); DISCARD, EXECABORT; a write-only token
 * queues no read. */
Test(redis, multi_exec_runs_queued_commands_without_interleaving)
{
    rserver rs;
    rs_start(&rs, false, NULL);
    run_py(&rs, "transactions", NULL, NULL);
    rs_stop(&rs);
    rs_start(&rs, true, NULL);
    run_py(&rs, "transactions", TOK_RW, "builder");
    int fd = rconnect(&rs);
    const char *req = "AUTH writer " TOK_W "\r\nMULTI\r\nSET k v\r\nGET k\r\nEXEC\r\n"
                      "MULTI\r\nMULTI\r\nSET k w\r\nEXEC\r\nEXEC\r\nDISCARD\r\nQUIT\r\n";
    send_all(fd, req, strlen(req));
    char *all = recv_until(fd, 0, NULL, NULL);
    cr_expect_str_eq(all, "+OK\r\n+OK\r\n+QUEUED\r\n"
                          "-NOPERM User writer has no permissions to run the 'get' command\r\n"
                          "-EXECABORT Transaction discarded because of previous errors.\r\n"
                          "+OK\r\n-ERR MULTI calls can not be nested\r\n+QUEUED\r\n*1\r\n+OK\r\n"
                          "-ERR EXEC without MULTI\r\n-ERR DISCARD without MULTI\r\n+OK\r\n");
    free(all);
    close(fd);
    EXPECT_CLI("w", &rs, "--user", "builder", "--pass", TOK_RW, "--no-auth-warning", "GET", "k");
    rs_stop(&rs);
}

/* KEYS and SCAN list Redis keys only (not what HTTP stored), skip expired
 * ones, and each SCAN call looks at COUNT entries at most; they need the
 * read scope. */
Test(redis, keys_and_scan_list_redis_keys_in_bounded_steps)
{
    rserver rs;
    rs_start(&rs, true, NULL);
    const char *auth[] = {"Authorization: Bearer " TOK_RW, NULL};
    kc_http_result h;
    kc_testserver_http(&rs.ts, "PUT", "/ccache/ab/cdef", auth, "blob", 4, false, &h);
    cr_assert_eq(h.status, 201, "ccache PUT: %ld %s", h.status, h.body);
    kc_http_result_free(&h);
    run_py(&rs, "keyspace", TOK_RW, "builder");
#define AS(tok) "--pass", tok, "--no-auth-warning"
    EXPECT_CLI("other:1", &rs, AS(TOK_R), "KEYS", "other*");
    EXPECT_CLI("NOPERM User writer has no permissions to run the 'keys' command", &rs, AS(TOK_W),
               "KEYS", "*");
    EXPECT_CLI("NOPERM User writer has no permissions to run the 'scan' command", &rs, AS(TOK_W),
               "SCAN", "0");
    EXPECT_CLI("ERR invalid cursor", &rs, AS(TOK_R), "SCAN", "x");
    EXPECT_CLI("ERR syntax error", &rs, AS(TOK_R), "SCAN", "0", "COUNT", "0");
    EXPECT_CLI("ERR syntax error", &rs, AS(TOK_R), "SCAN", "0", "LIMIT", "1");
    /* a cursor past every key ends the scan */
    EXPECT_CLI("0", &rs, AS(TOK_R), "SCAN", "18446744073709551615");
    rs_stop(&rs);
}

/* FLUSHDB/FLUSHALL need the admin scope and remove Redis keys only: a
 * ccache entry stored over HTTP is still there. */
Test(redis, flushall_needs_admin_and_removes_only_redis_keys)
{
    rserver rs;
    rs_start(&rs, true, NULL);
    const char *auth[] = {"Authorization: Bearer " TOK_RW, NULL};
    kc_http_result h;
    kc_testserver_http(&rs.ts, "PUT", "/ccache/ab/cdef", auth, "blob", 4, false, &h);
    cr_assert_eq(h.status, 201, "ccache PUT: %ld %s", h.status, h.body);
    kc_http_result_free(&h);
    EXPECT_CLI("OK", &rs, AS(TOK_RW), "SET", "a", "1");
    EXPECT_CLI("OK", &rs, AS(TOK_RW), "SET", "b", "2");
    EXPECT_CLI("NOPERM User builder has no permissions to run the 'flushall' command", &rs,
               AS(TOK_RW), "FLUSHALL");
    EXPECT_CLI("2", &rs, AS(TOK_R), "DBSIZE");
    EXPECT_CLI("ERR syntax error", &rs, AS(TOK_ADM), "FLUSHDB", "LATER");
    EXPECT_CLI("OK", &rs, AS(TOK_ADM), "FLUSHALL", "ASYNC");
    EXPECT_CLI("0", &rs, AS(TOK_R), "DBSIZE");
    EXPECT_CLI("", &rs, AS(TOK_R), "GET", "a");
    EXPECT_CLI("OK", &rs, AS(TOK_RW), "SET", "c", "3");
    EXPECT_CLI("OK", &rs, AS(TOK_ADM), "FLUSHDB");
    EXPECT_CLI("0", &rs, AS(TOK_R), "EXISTS", "c");
    kc_testserver_http(&rs.ts, "GET", "/ccache/ab/cdef", auth, NULL, 0, false, &h);
    cr_expect_eq(h.status, 200, "the ccache entry survives FLUSHALL");
    cr_expect(h.len == 4 && !memcmp(h.body, "blob", 4));
    kc_http_result_free(&h);
    rs_stop(&rs);
}

/* CLIENT HELP|LIST|ID|INFO|SETNAME|GETNAME as Redis answers them; LIST sees
 * the connections of every worker thread. */
Test(redis, client_subcommands_answer_as_redis)
{
    const char *threads[] = {"--threads", "3", NULL};
    rserver rs;
    rs_start(&rs, false, threads);
    char *help = cli(&rs, "CLIENT", "HELP", NULL);
    cr_expect(strstr(help, "CLIENT <subcommand>") == help && strstr(help, "\nLIST"), "%s", help);
    free(help);
    int fds[4];
    char ids[4][128], num[4][24];
    for (int i = 0; i < 4; i++) {
        fds[i] = rconnect(&rs);
        char req[96];
        snprintf(req, sizeof req, "CLIENT SETNAME worker-%d\r\n", i);
        char *got = exchange(fds[i], req, 5);
        cr_assert_str_eq(got, "+OK\r\n");
        free(got);
        send_all(fds[i], "CLIENT ID\r\n", 11);
        got = recv_until(fds[i], 0, "\r\n", NULL);
        cr_assert(got[0] == ':', "%s", got);
        snprintf(num[i], sizeof num[i], "%ld", strtol(got + 1, NULL, 10));
        snprintf(ids[i], sizeof ids[i], "id=%s ", num[i]);
        free(got);
    }
    char *list = cli(&rs, "CLIENT", "LIST", NULL);
    for (int i = 0; i < 4; i++) {
        char name[32];
        snprintf(name, sizeof name, "name=worker-%d ", i);
        cr_expect(strstr(list, name) && strstr(list, ids[i]), "%s / %s:\n%s", name, ids[i], list);
    }
    cr_expect(strstr(list, "cmd=client") && strstr(list, " db=0 ") &&
                  strstr(list, "laddr=127.0.0.1:"),
              "%s", list);
    free(list);
    char *one = cli(&rs, "CLIENT", "LIST", "ID", num[2], NULL);
    cr_expect(strstr(one, "name=worker-2 ") && !strstr(one, "name=worker-1 "), "%s", one);
    free(one);
    char *got = exchange(fds[0], "CLIENT GETNAME\r\n", 14);
    cr_expect_str_eq(got, "$8\r\nworker-0\r\n");
    free(got);
    send_all(fds[0], "CLIENT INFO\r\n", 13);
    got = recv_until(fds[0], 0, "\n\r\n", NULL);
    cr_expect(strstr(got, "name=worker-0 ") && strstr(got, ids[0]) && !strstr(got, "worker-1"),
              "%s", got);
    free(got);
    EXPECT_CLI("", &rs, "CLIENT", "LIST", "TYPE", "pubsub");
    EXPECT_CLI("ERR unknown subcommand 'NOPE'. Try CLIENT HELP.", &rs, "CLIENT", "NOPE");
    for (int i = 0; i < 4; i++)
        close(fds[i]);
    rs_stop(&rs);
}

/* INFO keyspace counts keys with a TTL and their mean time left; INFO
 * memory, cpu and commandstats carry Redis' field names. */
Test(redis, info_sections_use_redis_field_names)
{
    rserver rs;
    rs_start(&rs, false, NULL);
    EXPECT_CLI("OK", &rs, "SET", "plain", "1");
    EXPECT_CLI("OK", &rs, "SET", "t1", "1", "EX", "1000");
    EXPECT_CLI("OK", &rs, "SET", "t2", "1", "EX", "3000");
    char *ks = cli(&rs, "INFO", "keyspace", NULL);
    long long keys = 0, expires = 0, avg = 0;
    const char *line = strstr(ks, "db0:");
    cr_assert_not_null(line, "%s", ks);
    cr_expect_eq(sscanf(line, "db0:keys=%lld,expires=%lld,avg_ttl=%lld", &keys, &expires, &avg), 3,
                 "%s", ks);
    cr_expect_eq(keys, 3);
    cr_expect_eq(expires, 2);
    cr_expect(avg > 1900000 && avg <= 2000000, "avg_ttl %lld ms (two TTLs: 1000 s, 3000 s)", avg);
    free(ks);
    EXPECT_CLI("", &rs, "GET", "missing");
    EXPECT_CLI("ERR wrong number of arguments for 'get' command", &rs, "GET");
    char *mem = cli(&rs, "INFO", "memory", NULL);
    const char *mem_fields[] = {"# Memory",
                                "\nused_memory:",
                                "\nused_memory_human:",
                                "\nused_memory_rss:",
                                "\nused_memory_peak:",
                                "\nmaxmemory:0",
                                "\nmaxmemory_policy:noeviction",
                                "\ntotal_system_memory:"};
    for (size_t i = 0; i < sizeof mem_fields / sizeof mem_fields[0]; i++)
        cr_expect(strstr(mem, mem_fields[i]), "%s missing:\n%s", mem_fields[i], mem);
    free(mem);
    char *cpu = cli(&rs, "INFO", "cpu", NULL);
    cr_expect(strstr(cpu, "# CPU") && strstr(cpu, "\nused_cpu_sys:") &&
                  strstr(cpu, "\nused_cpu_user:") && strstr(cpu, "\nused_cpu_user_children:"),
              "%s", cpu);
    free(cpu);
    char *cs = cli(&rs, "INFO", "commandstats", NULL);
    long long calls = -1, rejected = -1, failed = -1;
    line = strstr(cs, "cmdstat_get:");
    cr_assert_not_null(line, "%s", cs);
    cr_expect_eq(sscanf(line,
                        "cmdstat_get:calls=%lld,usec=%*d,usec_per_call=%*f,rejected_calls=%lld,"
                        "failed_calls=%lld",
                        &calls, &rejected, &failed),
                 3, "%s", cs);
    cr_expect_eq(calls, 1, "%s", cs);
    cr_expect_eq(rejected, 1, "%s", cs);
    cr_expect_eq(failed, 0, "%s", cs);
    cr_expect(strstr(cs, "cmdstat_set:calls=3,"), "%s", cs);
    free(cs);
    /* the default INFO leaves commandstats out, as Redis */
    char *all = cli(&rs, "INFO", NULL);
    cr_expect(strstr(all, "# Memory") && strstr(all, "# CPU") && !strstr(all, "# Commandstats"),
              "%s", all);
    free(all);
    rs_stop(&rs);
}
#undef AS

/* Bad input closes the offending connection with an error; another client,
 * connected all along, and the stored data are unaffected. */
Test(redis, bad_input_closes_only_that_connection)
{
    const char *extra[] = {"--max-blob", "1M", NULL};
    rserver rs;
    rs_start(&rs, false, extra);
    EXPECT_CLI("OK", &rs, "SET", "keep", "safe");
    int other = rconnect(&rs);
    char *pong = exchange(other, "PING\r\n", 7);
    cr_expect_str_eq(pong, "+PONG\r\n");
    free(pong);

    static char inline_big[80 * 1024];
    memset(inline_big, 'a', sizeof inline_big - 1);
    static const struct {
        const char *what;
        const char *req;
        const char *error;
    } cases[] = {
        {"oversized bulk", "*3\r\n$3\r\nSET\r\n$4\r\nkeep\r\n$2000000\r\n",
         "-ERR Protocol error: invalid bulk length\r\n"},
        {"malformed frame", "*2\r\n$3\r\nGET\r\n:5\r\n",
         "-ERR Protocol error: expected '$', got ':'\r\n"},
        {"inline command with an unbalanced quote", "SET k \"abc\r\n",
         "-ERR Protocol error: unbalanced quotes in request\r\n"},
        {"inline command with a closing quote inside an argument", "SET k 'a'b v\r\n",
         "-ERR Protocol error: unbalanced quotes in request\r\n"},
        {"1M-element array", "*1000000\r\n", "-ERR Protocol error: invalid multibulk length\r\n"},
        {"bad bulk terminator", "*1\r\n$4\r\nPINGxx",
         "-ERR Protocol error: expected CRLF after a "
         "bulk string\r\n"},
        {"unterminated inline command", inline_big,
         "-ERR Protocol error: too big inline request\r\n"},
        {"bad array length", "*x\r\n", "-ERR Protocol error: invalid multibulk length\r\n"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int fd = rconnect(&rs);
        send_all(fd, cases[i].req, strlen(cases[i].req));
        bool closed;
        char *got = recv_until(fd, 0, NULL, &closed);
        cr_expect_str_eq(got, cases[i].error, "%s", cases[i].what);
        cr_expect(closed, "%s: the connection is closed", cases[i].what);
        free(got);
        close(fd);
        pong = exchange(other, "*1\r\n$4\r\nPING\r\n", 7);
        cr_expect_str_eq(pong, "+PONG\r\n", "after %s the other client is served", cases[i].what);
        free(pong);
    }
    /* every argument within --max-blob, the whole command far beyond it */
    {
        size_t nargs = 300, alen = 8000;
        char *req = malloc(nargs * (alen + 16) + 32), *p = req;
        p += sprintf(p, "*%zu\r\n$4\r\nMGET\r\n", nargs + 1);
        for (size_t i = 0; i < nargs; i++) {
            p += sprintf(p, "$%zu\r\n", alen);
            memset(p, 'k', alen);
            p += alen;
            p += sprintf(p, "\r\n");
        }
        int fd = rconnect(&rs);
        send_all(fd, req, (size_t)(p - req));
        bool closed;
        char *got = recv_until(fd, 0, NULL, &closed);
        cr_expect(strstr(got, "-ERR Protocol error: request larger than") == got, "%s", got);
        cr_expect(closed, "an oversized command closes the connection");
        free(got);
        free(req);
        close(fd);
    }
    /* a value over --max-blob from redis-cli (-x: the value on stdin):
     * refused, nothing stored. kcached answers the error as soon as it has
     * read the bulk length and closes, as redis-server does; redis-cli may
     * still be writing the value then, and so reports either the error or
     * the broken pipe, whichever it meets first. */
    size_t bn = 1100000;
    char *big = malloc(bn);
    memset(big, 'v', bn);
    char *argv[] = {"redis-cli", "-p", rs.portstr, "-x", "SET", "big", NULL};
    kc_test_result r;
    cr_assert_eq(kc_test_run(argv, big, bn, 30, &r), 0);
    bool refused = strstr(r.out, "invalid bulk length") || strstr(r.out, "Broken pipe") ||
                   strstr(r.err, "Broken pipe") || strstr(r.out, "Connection reset") ||
                   strstr(r.err, "Connection reset");
    cr_expect(refused, "redis-cli -x SET: %s %s", r.out, r.err);
    kc_test_result_free(&r);
    free(big);
    EXPECT_CLI("0", &rs, "EXISTS", "big");
    EXPECT_CLI("safe", &rs, "GET", "keep");
    kc_http_result m;
    kc_testserver_http(&rs.ts, "GET", "/metrics", NULL, NULL, 0, false, &m);
    cr_expect(strstr((char *)m.body, "kcached_redis_protocol_errors_total 10"), "%s", m.body);
    kc_http_result_free(&m);
    close(other);
    rs_stop(&rs);
}

/* Inline commands (telnet, nc) are split as Redis splits them: quotes,
 * escapes, quotes inside an argument; a RESP frame with something other
 * than '$' where a bulk string belongs is answered with Redis' text. */
Test(redis, inline_commands_are_split_as_redis_splits_them)
{
    rserver rs;
    rs_start(&rs, false, NULL);
    int fd = rconnect(&rs);
    const char *req = "SET \"two words\" \"a\\x41\\n\\\"q\\\"\"\r\n"
                      "GET 'two words'\r\n"
                      "SET k'ey' 'it\\'s'\r\n"
                      "GET key\r\n"
                      "  ECHO\t\"\"  \r\n"
                      "PING\n";
    char *got = exchange(fd, req,
                         0 + strlen("+OK\r\n$6\r\naA\n\"q\"\r\n+OK\r\n$4\r\nit's\r\n"
                                    "$0\r\n\r\n+PONG\r\n"));
    cr_expect_str_eq(got, "+OK\r\n$6\r\naA\n\"q\"\r\n+OK\r\n$4\r\nit's\r\n$0\r\n\r\n+PONG\r\n");
    free(got);
    close(fd);
    /* the same values as redis-cli sees them */
    EXPECT_CLI("aA\n\"q\"", &rs, "GET", "two words");
    rs_stop(&rs);
}

/* 1 MiB values, as Inductor stores compiled graphs: in and out whole. */
Test(redis, large_values_round_trip)
{
    rserver rs;
    rs_start(&rs, false, NULL);
    size_t n = 1 << 20;
    char *val = malloc(n);
    kc_test_fill_random(val, n, 7);
    int fd = rconnect(&rs);
    char head[128];
    int hl = snprintf(head, sizeof head, "*3\r\n$3\r\nSET\r\n$3\r\nbig\r\n$%zu\r\n", n);
    send_all(fd, head, (size_t)hl);
    send_all(fd, val, n);
    char *ok = exchange(fd, "\r\n*2\r\n$3\r\nGET\r\n$3\r\nbig\r\n", 5 + 10 + n + 2);
    cr_expect(!strncmp(ok, "+OK\r\n$1048576\r\n", 15), "%.20s", ok);
    cr_expect(!memcmp(ok + 15, val, n), "the value came back whole");
    free(ok);
    /* 16 pipelined GETs: 16 MiB of replies, more than a connection may
     * have pending, so the server pauses and must resume on its own */
    char req[16 * 24 + 1] = "";
    for (int i = 0; i < 16; i++)
        strcat(req, "*2\r\n$3\r\nGET\r\n$3\r\nbig\r\n");
    size_t one = 10 + n + 2;
    char *all = exchange(fd, req, 16 * one);
    for (int i = 0; i < 16; i++)
        cr_expect(!strncmp(all + i * one, "$1048576\r\n", 10) &&
                      !memcmp(all + i * one + 10, val, n),
                  "pipelined GET %d", i);
    free(all);
    close(fd);
    free(val);
    rs_stop(&rs);
}

/* The value a GET /v1/bundle?kind=redis holds for Redis key name
 * (malloc'd), or NULL: the bundle is imported into a scratch store and the
 * entry looked up under the key kcached files name under (SHA-256 over
 * "redis:" and the name). */
static char *bundle_value(const rserver *rs, const char *name)
{
    kc_http_result h;
    cr_assert_eq(
        kc_testserver_http(&rs->ts, "GET", "/v1/bundle?kind=redis", NULL, NULL, 0, false, &h), 0);
    cr_assert_eq(h.status, 200, "GET /v1/bundle: %ld %s", h.status, h.body);
    char *dir = kc_test_mkdtemp("kcdredisbundle");
    kc_store *s;
    kc_bundle_import *im;
    kc_err e = {0};
    cr_assert_eq(kc_store_open(dir, NULL, &s, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(kc_bundle_import_begin(s, &im, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(kc_bundle_import_feed(im, h.body, h.len, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(kc_bundle_import_finish(im, NULL, &e), KC_OK, "%s", e.msg);
    kc_bundle_import_free(im);
    kc_http_result_free(&h);
    char text[300], key[KC_KEY_HEX_LEN + 1];
    snprintf(text, sizeof text, "redis:%s", name);
    kc_sha256_hex(text, strlen(text), key);
    kc_artifact a;
    char *value = NULL;
    if (kc_store_get(s, key, &a, &e) == KC_OK) {
        value = strndup((const char *)a.payload, a.payload_len);
        kc_artifact_free(&a);
    }
    kc_store_close(s);
    kc_test_rmtree(dir);
    free(dir);
    return value;
}

#define EXPECT_BUNDLE(rs, name, want)                                                              \
    do {                                                                                           \
        char *got_ = bundle_value(rs, name);                                                       \
        cr_expect(got_ && !strcmp(got_, want), "bundle has %s = %s, want %s", name,                \
                  got_ ? got_ : "(none)", want);                                                   \
        free(got_);                                                                                \
    } while (0)

#define EXPECT_NOT_IN_BUNDLE(rs, name)                                                             \
    do {                                                                                           \
        char *got_ = bundle_value(rs, name);                                                       \
        cr_expect_null(got_, "bundle still has %s = %s", name, got_);                              \
        free(got_);                                                                                \
    } while (0)

/* A finished bundle is kept in the memory cache under its query and the
 * count of writes kcached has answered: Redis writes count like HTTP ones,
 * so a bundle asked for after a SET or DEL was answered shows it. */
Test(redis, redis_writes_show_in_the_next_bundle_at_once)
{
    rserver rs;
    rs_start(&rs, false, NULL);
    EXPECT_CLI("OK", &rs, "SET", "pt2:first", "one");
    EXPECT_BUNDLE(&rs, "pt2:first", "one");
    EXPECT_NOT_IN_BUNDLE(&rs, "pt2:second"); /* the same query again: from memory */
    EXPECT_CLI("OK", &rs, "SET", "pt2:second", "two");
    EXPECT_BUNDLE(&rs, "pt2:second", "two");
    EXPECT_CLI("OK", &rs, "SET", "pt2:first", "uno");
    EXPECT_BUNDLE(&rs, "pt2:first", "uno");
    EXPECT_CLI("1", &rs, "DEL", "pt2:first");
    EXPECT_NOT_IN_BUNDLE(&rs, "pt2:first");
    EXPECT_CLI("OK", &rs, "SET", "pt2:fourth", "four", "EX", "3600");
    EXPECT_BUNDLE(&rs, "pt2:fourth", "four");
    rs_stop(&rs);
}

/* --redis-listen is an option like every other: config key, KCACHED_
 * variable, flag; a bad address is a configuration error. */
Test(redis, redis_listen_is_configured_like_every_option)
{
    char *dir = kc_test_mkdtemp("kcdrediscfg");
    char *conf = kc_test_path(dir, "kcached.conf");
    const char *text = "redis-listen = 127.0.0.1:6390\n";
    kc_test_write_file(conf, text, strlen(text));
    kc_test_result r;
    kc_test_runl(&r, KC_TEST_KCACHED, "--config", conf, "--data", dir, "--check-config", NULL);
    cr_expect_eq(r.exit_code, 0, "%s", r.err);
    cr_expect(strstr(r.out, "redis-listen = 127.0.0.1:6390") != NULL, "%s", r.out);
    kc_test_result_free(&r);
    setenv("KCACHED_REDIS_LISTEN", "127.0.0.1:6391", 1);
    kc_test_runl(&r, KC_TEST_KCACHED, "--config", conf, "--data", dir, "--check-config", NULL);
    unsetenv("KCACHED_REDIS_LISTEN");
    cr_expect(strstr(r.out, "redis-listen = 127.0.0.1:6391") != NULL, "env beats file: %s", r.out);
    kc_test_result_free(&r);
    kc_test_runl(&r, KC_TEST_KCACHED, "--data", dir, "--redis-listen", "127.0.0.1:notaport",
                 "--check-config", NULL);
    cr_expect_eq(r.exit_code, 2);
    cr_expect(strstr(r.err, "--redis-listen") != NULL, "%s", r.err);
    kc_test_result_free(&r);
    /* no open Redis port beyond loopback without tokens, unless asked for */
    kc_test_runl(&r, KC_TEST_KCACHED, "--data", dir, "--redis-listen", "0.0.0.0:6390",
                 "--check-config", NULL);
    cr_expect_eq(r.exit_code, 2, "%s", r.out);
    cr_expect(strstr(r.err, "--redis-listen 0.0.0.0:6390 is not a loopback address") != NULL, "%s",
              r.err);
    kc_test_result_free(&r);
    kc_test_runl(&r, KC_TEST_KCACHED, "--data", dir, "--redis-listen", "0.0.0.0:6390",
                 "--insecure-no-auth", "--check-config", NULL);
    cr_expect_eq(r.exit_code, 0, "%s", r.err);
    kc_test_result_free(&r);
    /* off by default */
    kc_test_runl(&r, KC_TEST_KCACHED, "--data", dir, "--check-config", NULL);
    cr_expect(strstr(r.out, "redis-listen = \n") != NULL, "%s", r.out);
    kc_test_result_free(&r);
    free(conf);
    kc_test_rmtree(dir);
    free(dir);
}

/* Entries of kind redis in the database file alone, as after a power loss
 * that took the log's unsynced pages (immutable=1: SQLite reads neither the
 * -wal nor the -shm file); -1 while a copy into it is half done. */
static int redis_rows_in_database_file(const rserver *rs)
{
    char uri[512];
    snprintf(uri, sizeof uri, "file:%s/kcache.db?immutable=1", rs->ts.data);
    sqlite3 *db = NULL;
    int n = -1;
    if (sqlite3_open_v2(uri, &db, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI, NULL) == SQLITE_OK) {
        sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(db, "SELECT count(*) FROM entries WHERE kind = 'redis'", -1, &st,
                               NULL) == SQLITE_OK &&
            sqlite3_step(st) == SQLITE_ROW)
            n = sqlite3_column_int(st, 0);
        sqlite3_finalize(st);
    }
    sqlite3_close(db);
    return n;
}

/* A commit no longer copies the log into the database file (that copy and
 * its fsyncs stalled every client for 20-45 ms): the server's upkeep does,
 * once writes pause for 0.1 s, so a few writes reach the database file, and the disk, within
 * a second, where before they waited for 4,000 pages of log. */
Test(redis, writes_reach_the_database_file_within_a_second)
{
    rserver rs;
    rs_start(&rs, false, NULL);
    EXPECT_CLI("OK", &rs, "SET", "ckpt:a", "1");
    EXPECT_CLI("OK", &rs, "SET", "ckpt:b", "2");
    EXPECT_CLI("OK", &rs, "SET", "ckpt:c", "3");
    int rows = -1;
    for (int i = 0; i < 300 && rows != 3; i++) { /* up to 3 s on a loaded machine */
        usleep(10000);
        rows = redis_rows_in_database_file(&rs);
    }
    cr_expect_eq(rows, 3, "the database file holds %d of the 3 keys", rows);
    EXPECT_CLI("appendfsync\neverysec", &rs, "CONFIG", "GET", "appendfsync");
    rs_stop(&rs);
}

/* --durable: every answered write was fsynced first (synchronous=FULL), and
 * CONFIG GET says so in Redis's words. A power loss cannot be staged here:
 * what is checked is the setting, and that writes still round-trip. */
Test(redis, durable_is_appendfsync_always)
{
    rserver rs;
    const char *const durable[] = {"--durable", NULL};
    rs_start(&rs, false, durable);
    EXPECT_CLI("appendfsync\nalways", &rs, "CONFIG", "GET", "appendfsync");
    EXPECT_CLI("OK", &rs, "SET", "d:1", "one");
    EXPECT_CLI("one", &rs, "GET", "d:1");
    rs_stop(&rs);
    kc_test_result r;
    char *dir = kc_test_mkdtemp("kcddurable");
    kc_test_runl(&r, KC_TEST_KCACHED, "--data", dir, "--durable", "--check-config", NULL);
    cr_expect_eq(r.exit_code, 0, "%s", r.err);
    cr_expect(strstr(r.out, "durable = true") != NULL, "%s", r.out);
    kc_test_result_free(&r);
    kc_test_rmtree(dir);
    free(dir);
}

/* Writes without a pause: SQLite starts the log over only for a write
 * that begins when a checkpoint has copied all of it, which the upkeep's
 * checkpoints never see while commits go on. Before, the log then grew to
 * 16,000 pages (66 MB), where the commit that passed them copied the rest
 * itself and stalled every client; now the upkeep hands the last small copy
 * to the next writer, which starts the log over at a few thousand pages
 * (15-22 MB of file here), and a commit copies the rest itself at 8,192
 * pages (34 MB) when the upkeep thread is starved.
 * 30,000 SETs of 3,000 random bytes write about 100 MB of log. */
Test(redis, the_log_starts_over_under_writes_without_a_pause)
{
    rserver rs;
    rs_start(&rs, false, NULL);
    int fd = rconnect(&rs);
    enum { VALUE = 3000, KEYS = 2000, CHUNK = 100, SETS = 30000 };
    char value[VALUE + 1];
    const char *req_head = "*3\r\n$3\r\nSET\r\n";
    char *req = malloc((size_t)CHUNK * (VALUE + 64));
    char want[CHUNK * 5 + 1];
    for (int i = 0; i < CHUNK; i++)
        memcpy(want + i * 5, "+OK\r\n", 5);
    want[CHUNK * 5] = 0;
    srand(27);
    long long wal_max = 0;
    char last[VALUE + 1] = "";
    for (int sent = 0; sent < SETS; sent += CHUNK) {
        size_t n = 0;
        for (int i = 0; i < CHUNK; i++) {
            for (int j = 0; j < VALUE; j++)
                value[j] = (char)('!' + rand() % 90);
            value[VALUE] = 0;
            char key[32];
            int klen = snprintf(key, sizeof key, "wal:%d", (sent + i) % KEYS);
            n += (size_t)sprintf(req + n, "%s$%d\r\n%s\r\n$%d\r\n%s\r\n", req_head, klen, key,
                                 VALUE, value);
            if ((sent + i) % KEYS == 7)
                memcpy(last, value, sizeof last);
        }
        send_all(fd, req, n);
        char *got = recv_until(fd, CHUNK * 5, NULL, NULL);
        cr_assert_str_eq(got, want, "the replies to SETs %d..%d", sent, sent + CHUNK - 1);
        free(got);
        long long wal = kc_test_file_size(rs.ts.data, "kcache.db-wal");
        if (wal > wal_max)
            wal_max = wal;
    }
    free(req);
    close(fd);
    cr_log_info("the log file grew to %lld bytes", wal_max);
    cr_expect_lt(wal_max, 48LL << 20, "the log file grew to %lld bytes", wal_max);
    char *got = cli(&rs, "GET", "wal:7", NULL);
    cr_expect_str_eq(got, last, "the last value of wal:7");
    free(got);
    EXPECT_CLI("2000", &rs, "DBSIZE");
    rs_stop(&rs);
}
