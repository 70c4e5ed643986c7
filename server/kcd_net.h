/*
 * kcd_net.h - socket set-up shared by kcached's two listeners (HTTP,
 * kcd_server.h; Redis, kcd_redis.h).
 */
#ifndef KCD_NET_H
#define KCD_NET_H

#include <stddef.h>

#include <kcache/kc_error.h>

/* Binds and listens on a "HOST:PORT" address (kcd_parse_listen; port 0
 * picks a free one) with a non-blocking, close-on-exec socket and
 * SO_REUSEADDR. *fd_out is the caller's to close; *port_out is the bound
 * port. KC_ERR_INVALID for an address that does not parse or resolve,
 * KC_ERR_IO when no socket can bind it; the message names the address. */
kc_code kcd_net_listen(const char *listen_spec, int *fd_out, unsigned *port_out, kc_err *err);

/* The address kcd_net_listen would bind for listen_spec, as text
 * ("127.0.0.1:7070", "[::1]:7070") into buf (cap bytes): the first that
 * getaddrinfo gives, which is the one tried first. Errors as kcd_net_listen's
 * for an address that does not parse or resolve. */
kc_code kcd_net_resolve(const char *listen_spec, char *buf, size_t cap, kc_err *err);

struct sockaddr_storage;

/* Writes "HOST:PORT" of an IPv4 or IPv6 address into out (cap bytes), as
 * logs and CLIENT LIST show it; "-:0" for any other family. */
void kcd_net_format_addr(const struct sockaddr_storage *ss, char *out, size_t cap);

#endif
