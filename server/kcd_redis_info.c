/*
 * kcd_redis_info.c - what kcached's Redis listener says about itself: INFO
 * (with Redis' section and field names, so redis-cli --stat, monitoring
 * agents and client libraries read it unchanged) and CLIENT, whose LIST
 * sees the connections of every worker thread through one registry.
 */
#include <inttypes.h>
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <kcache/kc_util.h>
#include "kcd_net.h"
#include "kcd_redis_cmd.h"

/* Guards every listener's r->clients list and each connection's name. */
static pthread_mutex_t clients_mu = PTHREAD_MUTEX_INITIALIZER;

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

void kcd_redis_client_opened(rconn *c)
{
    kcd_redis *r = c->w->r;
    c->created = mono_s();
    pthread_mutex_lock(&clients_mu);
    c->cprev = NULL;
    c->cnext = r->clients;
    if (r->clients)
        r->clients->cprev = c;
    r->clients = c;
    pthread_mutex_unlock(&clients_mu);
}

void kcd_redis_client_closed(rconn *c)
{
    kcd_redis *r = c->w->r;
    pthread_mutex_lock(&clients_mu);
    if (c->cprev)
        c->cprev->cnext = c->cnext;
    else if (r->clients == c)
        r->clients = c->cnext;
    if (c->cnext)
        c->cnext->cprev = c->cprev;
    c->cprev = c->cnext = NULL;
    pthread_mutex_unlock(&clients_mu);
    kcd_redis_tx_free(c);
}

void kcd_redis_set_name(rconn *c, const char *name, size_t len)
{
    pthread_mutex_lock(&clients_mu);
    memcpy(c->name, name, len);
    c->name[len] = 0;
    pthread_mutex_unlock(&clients_mu);
}

/* One CLIENT LIST / CLIENT INFO line for c, as Redis writes it (the fields
 * kcached has; the others as Redis shows an idle plain client). self: c is
 * the caller's own connection, whose MULTI state may be read. Under
 * clients_mu. */
static void client_line(FILE *f, const rconn *c, bool self, double now)
{
    char laddr[INET6_ADDRSTRLEN + 8] = "";
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(c->fd, (struct sockaddr *)&ss, &sl) == 0)
        kcd_net_format_addr(&ss, laddr, sizeof laddr);
    double active;
    __atomic_load(&c->last_active, &active, __ATOMIC_RELAXED);
    const rcmd *last = __atomic_load_n(&c->last_cmd, __ATOMIC_RELAXED);
    long multi = self && c->tx ? (long)kcd_redis_tx_count(c) : -1;
    fprintf(f,
            "id=%" PRIu64 " addr=%s laddr=%s fd=%d name=%s age=%.0f idle=%.0f flags=%s db=0 "
            "sub=0 psub=0 ssub=0 multi=%ld watch=0 qbuf=0 qbuf-free=0 obl=0 oll=0 omem=0 "
            "events=r cmd=%s user=%s redir=-1 resp=%d\n",
            c->id, c->remote, laddr, c->fd, c->name, now - c->created,
            now - active > 0 ? now - active : 0, multi >= 0 ? "x" : "N", multi,
            last ? last->name : "NULL", c->who, self ? c->proto : 2);
}

static void client_list(rconn *c, bool only_self, const uint64_t *ids, size_t nids)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f)
        return kcd_redis_errorf(c, "ERR out of memory");
    double now = mono_s();
    pthread_mutex_lock(&clients_mu);
    for (const rconn *o = only_self ? c : c->w->r->clients; o; o = only_self ? NULL : o->cnext) {
        bool want = nids == 0;
        for (size_t i = 0; i < nids; i++)
            want |= ids[i] == o->id;
        if (want)
            client_line(f, o, o == c, now);
    }
    pthread_mutex_unlock(&clients_mu);
    fclose(f);
    kcd_resp_bulk(&c->out, text, len);
    free(text);
}

static void client_help(rconn *c)
{
    static const char *const lines[] = {
        "CLIENT <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
        "GETNAME",
        "    Return the name of the current connection.",
        "ID",
        "    Return the ID of the current connection.",
        "INFO",
        "    Return information about the current client connection.",
        "LIST [TYPE (NORMAL|MASTER|REPLICA|PUBSUB)] [ID <id> [<id> ...]]",
        "    Return information about client connections.",
        "SETNAME <name>",
        "    Assign the name <name> to the current connection.",
        "SETINFO <option> <value>",
        "    Set client meta attr. Options are:",
        "    * LIB-NAME: the client lib name.",
        "    * LIB-VER: the client lib version.",
        "HELP",
        "    Print this help.",
    };
    kcd_resp_array(&c->out, sizeof lines / sizeof lines[0]);
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++)
        kcd_resp_status_reply(&c->out, lines[i]);
}

void kcd_redis_cmd_client(rconn *c)
{
    if (kcd_redis_arg_is(c, 1, "HELP") && c->argc == 2)
        return client_help(c);
    if (kcd_redis_arg_is(c, 1, "SETNAME") && c->argc == 3) {
        if (!kcd_redis_valid_client_name(ARG(2), ARGL(2)))
            return kcd_redis_errorf(
                c, "ERR Client names cannot contain spaces, newlines or special characters.");
        kcd_redis_set_name(c, ARG(2), ARGL(2));
        return kcd_resp_status_reply(&c->out, "OK");
    }
    if (kcd_redis_arg_is(c, 1, "GETNAME") && c->argc == 2) {
        if (c->name[0])
            return kcd_resp_bulk_str(&c->out, c->name);
        return kcd_resp_null(&c->out, c->proto);
    }
    if (kcd_redis_arg_is(c, 1, "ID") && c->argc == 2)
        return kcd_resp_int(&c->out, (long long)c->id);
    if (kcd_redis_arg_is(c, 1, "INFO") && c->argc == 2)
        return client_list(c, true, NULL, 0);
    if (kcd_redis_arg_is(c, 1, "LIST")) {
        uint64_t *ids = NULL;
        size_t nids = 0;
        bool none = false;
        for (size_t i = 2; i < c->argc; i++) {
            if (kcd_redis_arg_is(c, i, "TYPE") && i + 1 < c->argc) {
                i++;
                if (kcd_redis_arg_is(c, i, "MASTER") || kcd_redis_arg_is(c, i, "REPLICA") ||
                    kcd_redis_arg_is(c, i, "PUBSUB"))
                    none = true; /* kcached has only normal clients */
                else if (!kcd_redis_arg_is(c, i, "NORMAL")) {
                    free(ids);
                    return kcd_redis_errorf(c, "ERR Unknown client type '%.*s'",
                                            (int)(ARGL(i) > 64 ? 64 : ARGL(i)), ARG(i));
                }
            } else if (kcd_redis_arg_is(c, i, "ID") && i + 1 < c->argc) {
                free(ids);
                ids = calloc(c->argc - i - 1, sizeof *ids);
                if (!ids)
                    return kcd_redis_errorf(c, "ERR out of memory");
                for (i++; i < c->argc; i++) {
                    long long id;
                    if (!kcd_redis_arg_ll(c, i, &id) || id <= 0) {
                        free(ids);
                        return kcd_redis_errorf(c, "ERR Invalid client ID");
                    }
                    ids[nids++] = (uint64_t)id;
                }
            } else {
                free(ids);
                return kcd_redis_errorf(c, "ERR syntax error");
            }
        }
        if (none)
            kcd_resp_bulk(&c->out, "", 0);
        else
            client_list(c, false, ids, nids);
        free(ids);
        return;
    }
    if (kcd_redis_arg_is(c, 1, "SETINFO") && c->argc == 4) {
        if (!kcd_redis_arg_is(c, 2, "LIB-NAME") && !kcd_redis_arg_is(c, 2, "LIB-VER"))
            return kcd_redis_errorf(c, "ERR Unrecognized option '%.*s'", (int)ARGL(2), ARG(2));
        return kcd_resp_status_reply(&c->out, "OK");
    }
    kcd_redis_errorf(c, "ERR unknown subcommand '%.*s'. Try CLIENT HELP.",
                     (int)(ARGL(1) > 128 ? 128 : ARGL(1)), ARG(1));
}

/* ----------------------------------------------------------------- INFO */

/* Redis' bytesToHuman: "1.50M". */
static void human(char *out, size_t cap, uint64_t n)
{
    double d = (double)n;
    if (n < 1024)
        snprintf(out, cap, "%" PRIu64 "B", n);
    else if (n < 1024ull * 1024)
        snprintf(out, cap, "%.2fK", d / 1024);
    else if (n < 1024ull * 1024 * 1024)
        snprintf(out, cap, "%.2fM", d / (1024.0 * 1024));
    else if (n < 1024ull * 1024 * 1024 * 1024)
        snprintf(out, cap, "%.2fG", d / (1024.0 * 1024 * 1024));
    else
        snprintf(out, cap, "%.2fT", d / (1024.0 * 1024 * 1024 * 1024));
}

static uint64_t rss_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long long size = 0, resident = 0;
    if (f) {
        if (fscanf(f, "%llu %llu", &size, &resident) != 2)
            resident = 0;
        fclose(f);
    }
    return (uint64_t)resident * (uint64_t)sysconf(_SC_PAGESIZE);
}

/* Writes one "name:value" line per field, as Redis; the memory figures are
 * the process' heap in use (malloc), its resident size and the peak of
 * that, the machine's memory, and --max-size as maxmemory. */
static void info_memory(FILE *f, const kcd_redis *r)
{
    struct mallinfo2 mi = mallinfo2();
    uint64_t used = (uint64_t)mi.uordblks + (uint64_t)mi.hblkhd, rss = rss_bytes();
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    uint64_t peak = (uint64_t)ru.ru_maxrss * 1024;
    uint64_t total = (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE);
    char h_used[32], h_rss[32], h_peak[32], h_total[32], h_max[32];
    human(h_used, sizeof h_used, used);
    human(h_rss, sizeof h_rss, rss);
    human(h_peak, sizeof h_peak, peak);
    human(h_total, sizeof h_total, total);
    human(h_max, sizeof h_max, r->max_size);
    fprintf(f,
            "# Memory\r\nused_memory:%" PRIu64
            "\r\nused_memory_human:%s\r\nused_memory_rss:%" PRIu64
            "\r\nused_memory_rss_human:%s\r\nused_memory_peak:%" PRIu64
            "\r\nused_memory_peak_human:%s\r\ntotal_system_memory:%" PRIu64
            "\r\ntotal_system_memory_human:%s\r\nmaxmemory:%" PRIu64
            "\r\nmaxmemory_human:%s\r\nmaxmemory_policy:%s\r\nmem_fragmentation_ratio:%.2f\r\n"
            "mem_allocator:libc\r\n\r\n",
            used, h_used, rss, h_rss, peak, h_peak, total, h_total, r->max_size, h_max,
            r->max_size ? "allkeys-lru" : "noeviction", used ? (double)rss / (double)used : 0.0);
}

static double tv_s(struct timeval tv)
{
    return (double)tv.tv_sec + tv.tv_usec / 1e6;
}

static void info_cpu(FILE *f)
{
    struct rusage self, children;
    getrusage(RUSAGE_SELF, &self);
    getrusage(RUSAGE_CHILDREN, &children);
    fprintf(f,
            "# CPU\r\nused_cpu_sys:%.6f\r\nused_cpu_user:%.6f\r\nused_cpu_sys_children:%.6f\r\n"
            "used_cpu_user_children:%.6f\r\n\r\n",
            tv_s(self.ru_stime), tv_s(self.ru_utime), tv_s(children.ru_stime),
            tv_s(children.ru_utime));
}

/* cmdstat_NAME lines for each command called at least once: calls (those
 * that ran), usec (their time), rejected_calls (refused before running:
 * arity, AUTH, scope), failed_calls (ran and answered an error). */
static void info_commandstats(FILE *f, const kcd_redis *r)
{
    fprintf(f, "# Commandstats\r\n");
    for (size_t i = 0; i < kcd_redis_ncommands && i < KCD_REDIS_CMD_SLOTS; i++) {
        uint64_t all = __atomic_load_n(&r->m->redis.commands[i], __ATOMIC_RELAXED);
        uint64_t rejected = __atomic_load_n(&r->cmd_rejected[i], __ATOMIC_RELAXED);
        uint64_t failed = __atomic_load_n(&r->cmd_failed[i], __ATOMIC_RELAXED);
        uint64_t usec = __atomic_load_n(&r->cmd_usec[i], __ATOMIC_RELAXED);
        uint64_t calls = all > rejected ? all - rejected : 0;
        if (!all)
            continue;
        fprintf(f,
                "cmdstat_%s:calls=%" PRIu64 ",usec=%" PRIu64
                ",usec_per_call=%.2f,rejected_calls=%" PRIu64 ",failed_calls=%" PRIu64 "\r\n",
                kcd_redis_commands[i].name, calls, usec, calls ? (double)usec / (double)calls : 0.0,
                rejected, failed);
    }
    fprintf(f, "\r\n");
}

enum { S_SERVER, S_CLIENTS, S_MEMORY, S_STATS, S_CPU, S_COMMANDSTATS, S_KEYSPACE, S_N };

/* INFO [section ...]: no section, "default": all but commandstats, as
 * Redis; "all" and "everything": every section. */
void kcd_redis_cmd_info(rconn *c)
{
    kcd_redis *r = c->w->r;
    const kcd_redis_metrics *m = &r->m->redis;
    static const char *const names[S_N] = {"server", "clients",      "memory",  "stats",
                                           "cpu",    "commandstats", "keyspace"};
    bool want[S_N] = {false};
    bool any = c->argc == 1;
    for (size_t i = 1; i < c->argc; i++) {
        bool all = kcd_redis_arg_is(c, i, "all") || kcd_redis_arg_is(c, i, "everything");
        bool dflt = kcd_redis_arg_is(c, i, "default");
        for (int s = 0; s < S_N; s++)
            if (all || (dflt && s != S_COMMANDSTATS) || kcd_redis_arg_is(c, i, names[s]))
                want[s] = true;
    }
    if (any)
        for (int s = 0; s < S_N; s++)
            want[s] = s != S_COMMANDSTATS;
    kcd_redis_keyspace ks = {0};
    if (want[S_KEYSPACE] && !kcd_redis_keyspace_get(c, &ks))
        return;
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f)
        return kcd_redis_errorf(c, "ERR out of memory");
    if (want[S_SERVER])
        fprintf(f,
                "# Server\r\nredis_version:%s\r\nredis_mode:standalone\r\nkcached_version:%s\r\n"
                "os:Linux\r\nprocess_id:%ld\r\ntcp_port:%u\r\nuptime_in_seconds:%.0f\r\n\r\n",
                KCD_REDIS_VERSION, KC_VERSION, (long)getpid(), r->port, kc_now() - r->started);
    if (want[S_CLIENTS])
        fprintf(f, "# Clients\r\nconnected_clients:%" PRIu64 "\r\n\r\n",
                __atomic_load_n(&m->clients, __ATOMIC_RELAXED));
    if (want[S_MEMORY])
        info_memory(f, r);
    if (want[S_STATS]) {
        uint64_t total = 0;
        for (unsigned i = 0; i < KCD_REDIS_CMD_SLOTS; i++)
            total += __atomic_load_n(&m->commands[i], __ATOMIC_RELAXED);
        fprintf(f,
                "# Stats\r\ntotal_connections_received:%" PRIu64
                "\r\ntotal_commands_processed:%" PRIu64 "\r\nkeyspace_hits:%" PRIu64
                "\r\nkeyspace_misses:%" PRIu64 "\r\ntotal_net_input_bytes:%" PRIu64
                "\r\ntotal_net_output_bytes:%" PRIu64 "\r\n\r\n",
                __atomic_load_n(&m->connections, __ATOMIC_RELAXED), total,
                __atomic_load_n(&m->hits, __ATOMIC_RELAXED),
                __atomic_load_n(&m->misses, __ATOMIC_RELAXED),
                __atomic_load_n(&m->bytes_in, __ATOMIC_RELAXED),
                __atomic_load_n(&m->bytes_out, __ATOMIC_RELAXED));
    }
    if (want[S_CPU])
        info_cpu(f);
    if (want[S_COMMANDSTATS])
        info_commandstats(f, r);
    if (want[S_KEYSPACE]) {
        fprintf(f, "# Keyspace\r\n");
        if (ks.keys > 0)
            fprintf(f, "db0:keys=%" PRIu64 ",expires=%" PRIu64 ",avg_ttl=%" PRId64 "\r\n", ks.keys,
                    ks.expires, ks.avg_ttl_ms);
    }
    fclose(f);
    kcd_resp_bulk(&c->out, text, len);
    free(text);
}
