/*
 * kcd_server.h - the libmicrohttpd side of kcached: a listening socket, an
 * epoll thread pool, per-connection limits and timeouts, TLS, and graceful
 * shutdown. Request semantics live in kcd_routes.h.
 */
#ifndef KCD_SERVER_H
#define KCD_SERVER_H

#include <kcache/kc_error.h>
#include "kcd_config.h"

typedef struct kcd_server kcd_server;

/* Opens the store, binds cfg->listen and starts serving on cfg->threads
 * worker threads (0 = one per online CPU). When cfg->port_file is set the
 * bound port is written there (atomically) once requests can be served.
 * Errors name the address, file or directory involved. */
kc_code kcd_server_start(const kcd_config *cfg, kcd_server **out, kc_err *err);

/* The bound TCP port (useful with port 0). */
unsigned kcd_server_port(const kcd_server *srv);

/* The request context it serves (kcd_ctx.h): for in-process tests. */
struct kcd_ctx *kcd_server_ctx(kcd_server *srv);

/* Graceful stop: stop accepting, let in-flight requests finish (up to
 * cfg->grace seconds), stop the workers, close (flush and checkpoint) every
 * store handle, free srv. NULL is a no-op. */
void kcd_server_stop(kcd_server *srv);

#endif
