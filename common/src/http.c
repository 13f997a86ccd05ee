/*
 * http.c - see mt/http.h. One thread runs a poll(2) loop over the listening socket and
 * every open connection (non-blocking sockets), so a slow or idle peer never delays another:
 *
 *   accept ──▶ READING (request line + headers into req[], up to the blank line, 2 KiB,
 *              or EOF) ──render──▶ WRITING (out[] from off) ──▶ closed
 *
 * Invariants:
 *  - at most MT_HTTP_MAX_CONNS connections are open; a new one when all are taken closes
 *    the oldest (in accept order) first: a peer that opens connections and sends nothing
 *    cannot keep the endpoint from Prometheus or a health check;
 *  - every connection has a deadline: MT_HTTP_REQUEST_TIMEOUT_MS from its accept for the
 *    whole request (a byte now and then does not extend it), then as long again for the
 *    answer once rendered. A connection past it is closed (a request still being read gets
 *    a best-effort 408 first);
 *  - memory is bounded: per connection 2 KiB of request and the rendered answer;
 *  - the render callback runs on this thread only, one request at a time.
 * The poll timeout is the nearest deadline, at most 100 ms, so that a stop request is seen.
 */
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
#include <time.h>
#include <unistd.h>

#define REQ_BYTES 2048
#define TICK_MS   100

/* ============================== types ============================== */

typedef struct conn {
    int fd;       /* -1: a free slot */
    int writing;  /* 0: reading the request, 1: sending out[] */
    uint64_t seq; /* accept order: the oldest (lowest) is closed first */
    int64_t deadline_ms;
    size_t got;          /* request bytes in req */
    char req[REQ_BYTES]; /* NUL-terminated */
    char *out;           /* the answer (headers and body), malloc'd */
    size_t out_len, off;
} conn_t;

struct mt_http {
    int fd;
    pthread_t thread;
    _Atomic int stop;
    mt_http_render_fn fn;
    void *ud;
    /* Owned by the server thread (after start, before stop's join). */
    uint64_t next_seq;
    conn_t conns[MT_HTTP_MAX_CONNS];
};

/* ============================== private functions ============================== */

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void conn_close(conn_t *c) {
    if (c->fd < 0) return;
    close(c->fd);
    free(c->out);
    c->fd = -1;
    c->out = NULL;
}

static const char *status_text(int status) {
    switch (status) {
    case 200: return "OK";
    case 404: return "Not Found";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    default: return "Error";
    }
}

/* Builds the answer into c->out (headers, then the body). @returns 0 or -1 (no memory). */
static int answer(conn_t *c, int status, const char *reason, const char *body, size_t len) {
    char hdr[256];
    int n = snprintf(hdr, sizeof(hdr),
                     "HTTP/1.0 %d %s\r\nContent-Type: text/plain; version=0.0.4\r\n"
                     "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                     status, reason, len);
    c->out = malloc((size_t)n + len + 1);
    if (!c->out) return -1;
    memcpy(c->out, hdr, (size_t)n);
    if (len) memcpy(c->out + n, body, len);
    c->out_len = (size_t)n + len;
    c->off = 0;
    return 0;
}

static void conn_write(conn_t *c);

/* The request is complete (blank line, full buffer or EOF): render it into c->out. */
static void conn_render(mt_http_t *h, conn_t *c, int64_t t) {
    char method[8] = "", path[256] = "";
    int r;
    if (sscanf(c->req, "%7s %255s", method, path) != 2 || strcmp(method, "GET") != 0) {
        r = answer(c, 400, "Bad Request", NULL, 0);
    } else {
        char *body = NULL;
        size_t len = 0;
        int status = h->fn(h->ud, path, &body, &len);
        r = answer(c, status, status_text(status), body, body ? len : 0);
        free(body);
    }
    if (r) {
        conn_close(c);
        return;
    }
    c->writing = 1;
    c->deadline_ms = t + MT_HTTP_REQUEST_TIMEOUT_MS;
    conn_write(c); /* most answers fit in the socket buffer at once */
}

static void conn_read(mt_http_t *h, conn_t *c, int64_t t) {
    for (;;) {
        ssize_t r = recv(c->fd, c->req + c->got, REQ_BYTES - 1 - c->got, 0);
        if (r < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return;
            conn_close(c);
            return;
        }
        c->got += (size_t)r;
        c->req[c->got] = 0;
        if (r == 0 && c->got == 0) { /* closed before a byte: nothing to answer */
            conn_close(c);
            return;
        }
        if (r == 0 || c->got == REQ_BYTES - 1 || strstr(c->req, "\r\n\r\n") ||
            strstr(c->req, "\n\n")) {
            conn_render(h, c, t);
            return;
        }
    }
}

static void conn_write(conn_t *c) {
    while (c->off < c->out_len) {
        ssize_t w = send(c->fd, c->out + c->off, c->out_len - c->off, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return;
            break;
        }
        c->off += (size_t)w;
    }
    conn_close(c);
}

static void conn_expire(conn_t *c) {
    if (!c->writing) {
        static const char timeout[] =
            "HTTP/1.0 408 Request Timeout\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
        ssize_t w = send(c->fd, timeout, sizeof(timeout) - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
        (void)w; /* best effort: the connection is closed either way */
    }
    conn_close(c);
}

/* Accepts every pending connection, closing the oldest open one for each when all are
 * taken. */
static void accept_all(mt_http_t *h, int64_t t) {
    for (;;) {
        conn_t *slot = NULL, *oldest = NULL;
        for (int i = 0; i < MT_HTTP_MAX_CONNS && !slot; i++) {
            conn_t *c = &h->conns[i];
            if (c->fd < 0)
                slot = c;
            else if (!oldest || c->seq < oldest->seq)
                oldest = c;
        }
        int fd = accept4(h->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            return; /* EAGAIN: none left; EMFILE and the like: the next tick retries */
        }
        if (!slot) {
            conn_close(oldest);
            slot = oldest;
        }
        slot->fd = fd;
        slot->writing = 0;
        slot->seq = h->next_seq++;
        slot->deadline_ms = t + MT_HTTP_REQUEST_TIMEOUT_MS;
        slot->got = 0;
        slot->req[0] = 0;
        slot->out = NULL;
        slot->out_len = slot->off = 0;
    }
}

static void *http_main(void *arg) {
    mt_http_t *h = arg;
    struct pollfd pfd[MT_HTTP_MAX_CONNS + 1];
    conn_t *of[MT_HTTP_MAX_CONNS + 1];
    while (!atomic_load(&h->stop)) {
        int64_t t = now_ms();
        int timeout = TICK_MS, n = 0;
        pfd[n++] = (struct pollfd){h->fd, POLLIN, 0};
        for (int i = 0; i < MT_HTTP_MAX_CONNS; i++) {
            conn_t *c = &h->conns[i];
            if (c->fd < 0) continue;
            if (c->deadline_ms <= t) {
                conn_expire(c);
                continue;
            }
            if (c->deadline_ms - t < timeout) timeout = (int)(c->deadline_ms - t);
            of[n] = c;
            pfd[n++] = (struct pollfd){c->fd, c->writing ? POLLOUT : POLLIN, 0};
        }
        if (poll(pfd, (nfds_t)n, timeout) <= 0) continue;
        t = now_ms();
        for (int i = 1; i < n; i++) {
            if (!pfd[i].revents) continue;
            if (of[i]->writing)
                conn_write(of[i]);
            else
                conn_read(h, of[i], t);
        }
        if (pfd[0].revents & POLLIN) accept_all(h, t); /* after: a slot freed above is reused */
    }
    for (int i = 0; i < MT_HTTP_MAX_CONNS; i++)
        conn_close(&h->conns[i]);
    return NULL;
}

/* ============================== API ============================== */

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
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
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
    for (int i = 0; i < MT_HTTP_MAX_CONNS; i++)
        h->conns[i].fd = -1;
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
