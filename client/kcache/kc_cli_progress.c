/*
 * kc_cli_progress.c - one progress line on a terminal: kernels done of total while
 * compile and prewarm work, files or artifacts, bytes, rate and time left while pull,
 * push and dir move them. Redrawn in place at most ten times a second on stderr, and
 * only when stderr is a terminal and -q was not given: a piped log gets nothing extra.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <kcache/kc_util.h>
#include "kcache_cli.h"

void kc_cli_progress_start(kc_cli_progress *p, const kc_cli *cli, const char *verb,
                           const char *unit)
{
    memset(p, 0, sizeof *p);
    p->on = cli->verbosity >= 0 && isatty(STDERR_FILENO);
    p->verb = verb;
    p->unit = unit;
    p->start = kc_now();
}

void kc_cli_progress_show(kc_cli_progress *p, bool force, const char *fmt, ...)
{
    if (!p->on)
        return;
    double now = kc_now();
    if (!force && p->shown && now - p->last < 0.1)
        return; /* ten redraws a second at most */
    p->last = now;
    char line[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    /* back to the start of the line, clear it, draw */
    fprintf(stderr, "\r\033[K%s: %s", p->verb, line);
    fflush(stderr);
    p->shown = true;
}

void kc_cli_progress_clear(kc_cli_progress *p)
{
    if (!p->shown)
        return;
    fputs("\r\033[K", stderr);
    fflush(stderr);
    p->shown = false;
}

/* "1m05s", "12s" */
static void format_eta(double s, char *buf, size_t cap)
{
    long t = (long)(s + 0.5);
    if (t >= 3600)
        snprintf(buf, cap, "%ldh%02ldm", t / 3600, t / 60 % 60);
    else if (t >= 60)
        snprintf(buf, cap, "%ldm%02lds", t / 60, t % 60);
    else
        snprintf(buf, cap, "%lds", t);
}

void kc_cli_progress_transfer(uint64_t done, uint64_t total, uint64_t bytes, void *ctx)
{
    kc_cli_progress *p = ctx;
    if (!p->on)
        return;
    double el = kc_now() - p->start;
    char sz[32], rate[32], eta[32] = "";
    kc_format_size(bytes, sz, sizeof sz);
    kc_format_size(el > 0 ? (uint64_t)((double)bytes / el) : 0, rate, sizeof rate);
    if (total && done && done < total) {
        char t[24];
        format_eta(el * (double)(total - done) / (double)done, t, sizeof t);
        snprintf(eta, sizeof eta, "  ETA %s", t);
    }
    bool last = total && done >= total;
    if (total)
        kc_cli_progress_show(p, last, "%llu/%llu %s  %s  %s/s%s", (unsigned long long)done,
                             (unsigned long long)total, p->unit, sz, rate, eta);
    else
        kc_cli_progress_show(p, false, "%llu %s  %s  %s/s", (unsigned long long)done, p->unit, sz,
                             rate);
}
