/* http.c - see mt/http.h. poll(2) with a timeout lets the thread notice a stop request. */
#include "mt/http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

struct mt_http {
    int fd;
    pthread_t thread;
    _Atomic int stop;
    mt_http_render_fn fn;
    void *ud;
};

static void write_all(int fd, const char *p, size_t n) {
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w <= 0) {
            if (w < 0 && errno == EINTR) continue;
            return;
        }
        p += w;
        n -= (size_t)w;
    }
}

static void serve(mt_http_t *h, int c) {
    char req[2048];
    size_t got = 0;
    /* Read the request line and headers (up to the blank line, 2 KiB, or 2 s). */
    while (got < sizeof(req) - 1) {
        struct pollfd p = {c, POLLIN, 0};
        if (poll(&p, 1, 2000) <= 0) break;
        ssize_t r = recv(c, req + got, sizeof(req) - 1 - got, 0);
        if (r <= 0) break;
        got += (size_t)r;
        req[got] = 0;
        if (strstr(req, "\r\n\r\n") || strstr(req, "\n\n")) break;
    }
    req[got] = 0;
    char method[8] = "", path[256] = "";
    if (sscanf(req, "%7s %255s", method, path) != 2 || strcmp(method, "GET") != 0) {
        const char *bad =
            "HTTP/1.0 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
        write_all(c, bad, strlen(bad));
        return;
    }
    char *body = NULL;
    size_t len = 0;
    int status = h->fn(h->ud, path, &body, &len);
    char hdr[256];
    int n = snprintf(hdr, sizeof(hdr),
                     "HTTP/1.0 %d %s\r\nContent-Type: text/plain; version=0.0.4\r\n"
                     "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                     status, status == 200 ? "OK" : "Not Found", body ? len : 0);
    write_all(c, hdr, (size_t)n);
    if (body) write_all(c, body, len);
    free(body);
}

static void *http_main(void *arg) {
    mt_http_t *h = arg;
    while (!atomic_load(&h->stop)) {
        struct pollfd p = {h->fd, POLLIN, 0};
        if (poll(&p, 1, 200) <= 0) continue;
        int c = accept(h->fd, NULL, NULL);
        if (c < 0) continue;
        serve(h, c);
        close(c);
    }
    return NULL;
}

mt_err_t mt_http_start(const char *listen_addr, mt_http_render_fn fn, void *ud, int *port,
                       mt_http_t **out) {
    char host[64];
    int p;
    const char *colon = strrchr(listen_addr, ':');
    if (!colon || (size_t)(colon - listen_addr) >= sizeof(host) ||
        sscanf(colon + 1, "%d", &p) != 1 || p < 0 || p > 65535)
        return MT_CONFIG;
    memcpy(host, listen_addr, (size_t)(colon - listen_addr));
    host[colon - listen_addr] = 0;
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)p);
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) return MT_CONFIG;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return MT_IO;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(fd, 64) != 0) {
        close(fd);
        return MT_IO;
    }
    socklen_t sl = sizeof(sa);
    getsockname(fd, (struct sockaddr *)&sa, &sl);
    mt_http_t *h = calloc(1, sizeof(*h));
    if (!h) {
        close(fd);
        return MT_NOMEM;
    }
    h->fd = fd;
    h->fn = fn;
    h->ud = ud;
    atomic_init(&h->stop, 0);
    if (pthread_create(&h->thread, NULL, http_main, h) != 0) {
        close(fd);
        free(h);
        return MT_NOMEM;
    }
    if (port) *port = ntohs(sa.sin_port);
    *out = h;
    return MT_OK;
}

void mt_http_stop(mt_http_t *h) {
    if (!h) return;
    atomic_store(&h->stop, 1);
    pthread_join(h->thread, NULL);
    close(h->fd);
    free(h);
}
