/*
 * kcd_net.c - socket set-up that both of kcached's listeners share: the
 * HTTP server (kcd_server.c, which hands the socket to libmicrohttpd) and
 * the Redis listener (kcd_redis.c, which runs its own epoll loop on it).
 */
#include "kcd_net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kcd_config.h"

/* The addresses listen_spec stands for, in the order they are tried. */
static kc_code resolve(const char *listen_spec, struct addrinfo **res, kc_err *err)
{
    char host[256];
    unsigned port;
    kc_code rc = kcd_parse_listen(listen_spec, host, sizeof host, &port, err);
    if (rc != KC_OK)
        return rc;
    struct addrinfo hints = {0};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    char portstr[16];
    snprintf(portstr, sizeof portstr, "%u", port);
    int gai = getaddrinfo(host[0] ? host : NULL, portstr, &hints, res);
    if (gai != 0)
        return kc_err_set(err, KC_ERR_INVALID, "cannot resolve %s: %s", listen_spec,
                          gai_strerror(gai));
    return KC_OK;
}

kc_code kcd_net_resolve(const char *listen_spec, char *buf, size_t cap, kc_err *err)
{
    struct addrinfo *res = NULL;
    kc_code rc = resolve(listen_spec, &res, err);
    if (rc != KC_OK)
        return rc;
    char ip[INET6_ADDRSTRLEN] = "?";
    unsigned port = 0;
    if (res->ai_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)res->ai_addr;
        inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof ip);
        port = ntohs(a->sin6_port);
        snprintf(buf, cap, "[%s]:%u", ip, port);
    } else {
        const struct sockaddr_in *a = (const struct sockaddr_in *)res->ai_addr;
        inet_ntop(AF_INET, &a->sin_addr, ip, sizeof ip);
        port = ntohs(a->sin_port);
        snprintf(buf, cap, "%s:%u", ip, port);
    }
    freeaddrinfo(res);
    return KC_OK;
}

kc_code kcd_net_listen(const char *listen_spec, int *fd_out, unsigned *port_out, kc_err *err)
{
    struct addrinfo *res = NULL;
    kc_code rc = resolve(listen_spec, &res, err);
    if (rc != KC_OK)
        return rc;
    int fd = -1, saved = 0;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
        if (fd < 0) {
            saved = errno;
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 1024) == 0)
            break;
        saved = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0)
        return kc_err_errno(err, KC_ERR_IO, saved, "cannot listen on %s", listen_spec);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) != 0) {
        saved = errno;
        close(fd);
        return kc_err_errno(err, KC_ERR_IO, saved, "getsockname on %s", listen_spec);
    }
    *port_out = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                               : ((struct sockaddr_in *)&ss)->sin_port);
    *fd_out = fd;
    return KC_OK;
}

void kcd_net_format_addr(const struct sockaddr_storage *ss, char *out, size_t cap)
{
    char host[INET6_ADDRSTRLEN] = "-";
    unsigned port = 0;
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)ss;
        inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
        port = ntohs(in->sin_port);
    } else if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)ss;
        inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
        port = ntohs(in6->sin6_port);
    }
    snprintf(out, cap, "%s:%u", host, port);
}
