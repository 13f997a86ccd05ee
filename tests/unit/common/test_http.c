/*
 * test_http.c - the operational HTTP server (mt/http.h) against slow and idle peers, in
 * this process on 127.0.0.1.
 *
 *  - idle connections, one that sent half a request line and one that trickles a byte at a
 *    time do not delay a normal GET: it is answered while they are all still open;
 *  - more idle connections than MT_HTTP_MAX_CONNS: the oldest are closed, a GET is answered;
 *  - a trickling or silent connection is closed by the whole-request deadline
 *    (MT_HTTP_REQUEST_TIMEOUT_MS), however often it sends a byte;
 *  - a peer that does not read its (large) answer does not delay another GET, and a large
 *    answer read in full arrives whole.
 *
 * Every wait polls for its condition with a generous bound; nothing asserts on time.
 */
#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "mt/http.h"

TestSuite(http, .timeout = 120);

static atomic_int g_renders;

#define BIG_BYTES (8u << 20)

static int render(void *ud, const char *path, char **body, size_t *len) {
    (void)ud;
    atomic_fetch_add(&g_renders, 1);
    if (!strcmp(path, "/big")) { /* more than the socket buffers hold */
        *len = BIG_BYTES;
        *body = malloc(BIG_BYTES);
        cr_assert_not_null(*body);
        memset(*body, 'b', BIG_BYTES);
        return 200;
    }
    if (strcmp(path, "/metrics") != 0) return 404;
    *body = strdup("up 1\n");
    *len = *body ? 5 : 0;
    return 200;
}

static int dial(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_geq(fd, 0);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0, "connect: %s",
                 strerror(errno));
    return fd;
}

static void send_str(int fd, const char *s) {
    cr_assert_eq(send(fd, s, strlen(s), MSG_NOSIGNAL), (ssize_t)strlen(s));
}

/* 1 if the server closed @p fd (EOF or reset), 0 if it is open with nothing to read;
 * data is read and dropped (a 408 before the close). Does not wait. */
static int closed_now(int fd) {
    char buf[512];
    for (;;) {
        ssize_t r = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (r == 0) return 1;
        if (r < 0) return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : 1;
    }
}

/* Polls until the server closed @p fd, sending one byte on @p trickle (if >= 0) every
 * 100 ms. @returns 1 once closed, 0 if still open after @p rounds rounds. */
static int wait_closed(int fd, int trickle, int rounds) {
    for (int i = 0; i < rounds; i++) {
        if (closed_now(fd)) return 1;
        if (trickle >= 0) send(trickle, "x", 1, MSG_NOSIGNAL);
        struct pollfd p = {fd, POLLIN, 0};
        poll(&p, 1, 100);
    }
    return closed_now(fd);
}

/* GET /metrics on a new connection; while waiting for the answer (at most 20 s), one byte
 * goes out on @p trickle (if >= 0) every 100 ms. @returns the answer (caller frees). */
static char *get_metrics(int port, int trickle) {
    int fd = dial(port);
    send_str(fd, "GET /metrics HTTP/1.0\r\n\r\n");
    size_t cap = 4096, len = 0;
    char *buf = calloc(1, cap);
    cr_assert_not_null(buf);
    for (int i = 0; i < 200; i++) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 100) == 1) {
            ssize_t r = recv(fd, buf + len, cap - 1 - len, 0);
            if (r <= 0) break; /* the answer is complete: the server closes */
            len += (size_t)r;
            if (len == cap - 1) break;
        } else if (trickle >= 0) {
            send(trickle, "x", 1, MSG_NOSIGNAL);
        }
    }
    buf[len] = 0;
    close(fd);
    return buf;
}

Test(http, slow_and_idle_peers_do_not_delay_a_get) {
    mt_http_t *h = NULL;
    int port = 0;
    cr_assert_eq(mt_http_start("127.0.0.1:0", render, NULL, &port, &h), MT_OK);
    enum { IDLE = 8 };
    int idle[IDLE];
    for (int i = 0; i < IDLE; i++)
        idle[i] = dial(port);
    int half = dial(port); /* half a request line, then nothing */
    send_str(half, "GET /met");
    int trickle = dial(port); /* a request line, then a header one byte at a time */
    send_str(trickle, "GET /metrics HTTP/1.0\r\nX-Slow: ");

    char *a = get_metrics(port, trickle);
    cr_assert(strstr(a, "HTTP/1.0 200 OK\r\n") && strstr(a, "\r\n\r\nup 1\n"), "answer: '%s'", a);
    free(a);
    /* ...answered while every slow peer is still connected and unanswered */
    for (int i = 0; i < IDLE; i++)
        cr_assert_eq(closed_now(idle[i]), 0, "idle connection %d was closed first", i);
    cr_assert_eq(closed_now(half), 0);
    cr_assert_eq(closed_now(trickle), 0);
    a = get_metrics(port, trickle); /* and again */
    cr_assert(strstr(a, "HTTP/1.0 200 OK\r\n"), "answer: '%s'", a);
    free(a);

    for (int i = 0; i < IDLE; i++)
        close(idle[i]);
    close(half);
    close(trickle);
    mt_http_stop(h);
}

Test(http, more_connections_than_the_bound_close_the_oldest) {
    mt_http_t *h = NULL;
    int port = 0;
    cr_assert_eq(mt_http_start("127.0.0.1:0", render, NULL, &port, &h), MT_OK);
    enum { N = MT_HTTP_MAX_CONNS + 8 };
    int fds[N];
    for (int i = 0; i < N; i++)
        fds[i] = dial(port);
    char *a = get_metrics(port, -1);
    cr_assert(strstr(a, "HTTP/1.0 200 OK\r\n"), "answer: '%s'", a);
    free(a);
    /* the 8 (and the GET's: 9) oldest made room; the newest are open */
    for (int i = 0; i < 8; i++)
        cr_assert(wait_closed(fds[i], -1, 100), "connection %d (of the oldest) still open", i);
    for (int i = N - 32; i < N; i++)
        cr_assert_eq(closed_now(fds[i]), 0, "connection %d (of the newest) was closed", i);
    for (int i = 0; i < N; i++)
        close(fds[i]);
    mt_http_stop(h); /* with connections open: frees them */
}

Test(http, a_trickling_request_is_closed_at_its_deadline) {
    mt_http_t *h = NULL;
    int port = 0;
    cr_assert_eq(mt_http_start("127.0.0.1:0", render, NULL, &port, &h), MT_OK);
    int silent = dial(port);
    int trickle = dial(port);
    send_str(trickle, "GET /metrics HTTP/1.0\r\nX-Slow: ");
    /* a byte every 100 ms would keep a per-read timeout from ever firing; the whole-request
     * deadline closes it (bound: 300 rounds, several times MT_HTTP_REQUEST_TIMEOUT_MS) */
    cr_assert(wait_closed(trickle, trickle, 300), "the trickling connection is still open");
    cr_assert(wait_closed(silent, -1, 300), "the silent connection is still open");
    cr_assert_eq(atomic_load(&g_renders), 0, "a partial request was answered");
    char *a = get_metrics(port, -1);
    cr_assert(strstr(a, "HTTP/1.0 200 OK\r\n"), "answer: '%s'", a);
    free(a);
    close(silent);
    close(trickle);
    mt_http_stop(h);
}

Test(http, a_peer_that_does_not_read_its_answer_does_not_delay_others) {
    mt_http_t *h = NULL;
    int port = 0;
    cr_assert_eq(mt_http_start("127.0.0.1:0", render, NULL, &port, &h), MT_OK);
    int stuck = dial(port); /* asks for 8 MiB and reads nothing */
    send_str(stuck, "GET /big HTTP/1.0\r\n\r\n");
    char *a = get_metrics(port, -1);
    cr_assert(strstr(a, "HTTP/1.0 200 OK\r\n") && strstr(a, "up 1\n"), "answer: '%s'", a);
    free(a);
    /* the stuck one still gets all of it once it reads */
    size_t got = 0;
    char buf[65536];
    for (;;) {
        struct pollfd p = {stuck, POLLIN, 0};
        cr_assert_eq(poll(&p, 1, 20000), 1, "no more of the answer after %zu bytes", got);
        ssize_t r = recv(stuck, buf, sizeof(buf), 0);
        cr_assert_geq(r, 0, "%s", strerror(errno));
        if (r == 0) break;
        got += (size_t)r;
    }
    cr_assert_gt(got, BIG_BYTES);
    close(stuck);
    mt_http_stop(h);
}
