/*
 * kcd_net.h - socket set-up shared by kcached's two listeners (HTTP,
 * kcd_server.h; Redis, kcd_redis.h).
 */
#ifndef KCD_NET_H
#define KCD_NET_H

#include <kcache/kc_error.h>

/* Binds and listens on a "HOST:PORT" address (kcd_parse_listen; port 0
 * picks a free one) with a non-blocking, close-on-exec socket and
 * SO_REUSEADDR. *fd_out is the caller's to close; *port_out is the bound
 * port. KC_ERR_INVALID for an address that does not parse or resolve,
 * KC_ERR_IO when no socket can bind it; the message names the address. */
kc_code kcd_net_listen(const char *listen_spec, int *fd_out, unsigned *port_out, kc_err *err);

#endif
