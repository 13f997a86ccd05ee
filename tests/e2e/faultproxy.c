/*
 * faultproxy.c - mt_faultproxy, the transport fault of tests/e2e/lost_response_e2e.sh: a TCP
 * proxy that lets a request reach the server and loses the server's answer.
 *
 *   mt_faultproxy --target HOST:PORT [--listen PORT] [--port-file FILE] [--drop-ms MS]
 *                 [--arm-fields F:W[,F:W...]] [--arm-timeout-ms MS] [--until-answer]
 *                 [--log FILE]
 *
 * Every connection accepted on 127.0.0.1:PORT (0: any free port, written to --port-file once
 * the proxy is ready for signals) is forwarded to --target, byte for byte, both ways.
 *
 * The fault, on SIGUSR1 (a "trigger"):
 *   1. without --arm-fields the fault window opens at once; with it the proxy is armed: the
 *      window opens the moment a client sends an HTTP/2 gRPC request (uncompressed, in DATA
 *      frames without padding) whose protobuf message holds, at its top level, every field
 *      F with wire type W of the list (e.g. "2:2,5:0": an ApplyGradientsRequest with
 *      gradients and examples). That request is still forwarded whole. Without such a
 *      request within --arm-timeout-ms the trigger lapses and no window opens;
 *   2. for --drop-ms the window stays open: client->server bytes keep being forwarded, while
 *      server->client bytes are read and discarded (bytes read before it opened still go
 *      out), on every connection, including ones accepted meanwhile. With --until-answer
 *      (and --arm-fields) it closes as soon as the answer to the matching request has been
 *      dropped whole (the HEADERS frame with END_STREAM of its stream: the gRPC trailers),
 *      --drop-ms being then only the longest it stays open: the fault is then "the answer
 *      to that request is lost", by construction, however slowly the server answers (a
 *      fixed window loses nothing when a loaded server answers after it);
 *   3. then every open connection is reset both ways (SO_LINGER 0, then close: an RST), and
 *      the proxy forwards normally again; new connections are not affected.
 * A trigger while a window is armed or open is ignored (and logged). SIGTERM or SIGINT: the
 * proxy closes everything and exits 0.
 *
 * Log (stderr, or --log FILE, one line per event, flushed): "faultproxy: window K open: ..."
 * and "faultproxy: window K closed after MS ms: forwarded_c2s=B dropped_s2c=B
 * lost_responses=R reset=C matched=0|1 answer_lost=0|1": the client->server bytes written to
 * servers while the window was open (the request that opened it included), the
 * server->client bytes read and thrown away, among them the ends of R responses (with --arm-fields, which parses both
 * directions as HTTP/2: HEADERS frames with END_STREAM, the gRPC trailers a server sends once
 * it handled a call), and the connections reset. matched=1 and lost_responses >= 1 show
 * that the server received the matching request and handled calls whose answers were lost;
 * answer_lost=1 that among them was the answer to the matching request itself.
 *
 * Exit status: 0 stopped by SIGTERM/SIGINT, 1 runtime failure (cannot listen, cannot write
 * the port file or the log), 2 bad flags or a target that does not resolve.
 *
 * Design: one thread, one poll() loop over the listening socket, a self-pipe fed by the
 * signal handlers, and two non-blocking sockets per connection. Each direction holds at
 * most one buffer of bytes read and not yet written; a side is read only when its buffer
 * is empty (back-pressure), except the server side during a window (read to be dropped).
 * A FIN is passed on (shutdown(SHUT_WR)) once the buffer before it is written.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>

#define FP_BUF_BYTES      65536       /* per direction and connection */
#define FP_MSG_MAX_BYTES  (16u << 20) /* larger gRPC messages are not inspected */
#define FP_MAX_FIELDS     8           /* entries of --arm-fields */
#define FP_STREAMS        8           /* HTTP/2 streams inspected at once per connection */
#define FP_H2_PREFACE_LEN 24          /* "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" */

/* ============================== types ============================== */

/* One direction of a connection: bytes read from one side, not yet written to the other. */
typedef struct fp_dir {
    uint8_t buf[FP_BUF_BYTES];
    size_t off, len; /* pending bytes: buf[off .. off+len) */
    int eof;         /* the reading side sent its FIN */
    int shut;        /* ... and it was passed on (shutdown(SHUT_WR) of the writing side) */
} fp_dir_t;

/* One gRPC message being collected from the DATA frames of one HTTP/2 stream. Layout of a
 * gRPC message on the wire: flag (1 byte: 1 = compressed), length (4 bytes, big endian),
 * then length bytes of protobuf. */
typedef struct fp_msg {
    uint32_t stream; /* 0: slot free */
    uint8_t prefix[5];
    size_t prefix_have;
    size_t need, have; /* message bytes expected / collected */
    int skip;          /* compressed or too large: counted through, not kept */
    uint8_t *buf;      /* owned; capacity cap */
    size_t cap;
} fp_msg_t;

/* One direction of a connection parsed as HTTP/2 frames (only with --arm-fields). Frame
 * header: length (3 bytes), type (1), flags (1), stream id (4, top bit reserved).
 * Client->server: the preface first, then frames whose DATA are collected as gRPC messages.
 * Server->client: frames only, counting the ends of responses (HEADERS with END_STREAM: the
 * trailers, sent once the server handled the call). */
typedef struct fp_h2 {
    int server;          /* the server->client direction */
    unsigned conn;       /* the connection's id */
    uint64_t ends;       /* server: HEADERS frames with END_STREAM seen */
    size_t preface_have; /* bytes of the preface seen (skipped) */
    uint8_t hdr[9];
    size_t hdr_have;
    size_t payload_left; /* bytes of the current frame's payload still to come */
    uint8_t type, flags;
    uint32_t stream;
    int inspect; /* the current frame is an unpadded DATA frame */
    int broken;  /* not HTTP/2 after all: inspection stops for this connection */
    fp_msg_t msg[FP_STREAMS];
    unsigned next_evict; /* slot reused when all are taken */
} fp_h2_t;

typedef struct fp_conn {
    unsigned id;
    int cfd, sfd;   /* client side, server side */
    int connecting; /* the connect to the target is in progress */
    int dead;       /* to be closed at the end of this loop turn */
    int pc, ps;     /* their index in the pollfd array this turn, -1 if not polled */
    fp_dir_t c2s, s2c;
    fp_h2_t h2c, h2s; /* c2s, s2c */
    struct fp_conn *next;
} fp_conn_t;

typedef enum { FP_IDLE, FP_ARMED, FP_OPEN } fp_state_t;

typedef struct fp_field {
    uint32_t field;
    uint32_t wire;
} fp_field_t;

typedef struct fp_proxy {
    /* configuration */
    struct sockaddr_storage target;
    socklen_t target_len;
    const char *target_name;
    int drop_ms, arm_timeout_ms;
    int until_answer; /* --until-answer: close the window once its request's answer ended */
    fp_field_t arm[FP_MAX_FIELDS];
    size_t narm;
    FILE *log; /* stderr or --log (owned then) */
    /* state */
    int lfd;
    fp_conn_t *conns;
    unsigned next_id, nconns;
    fp_state_t state;
    unsigned triggers, windows;
    int64_t armed_at_ms, open_at_ms;
    uint64_t win_c2s, win_s2c; /* bytes forwarded / dropped in the open window */
    uint64_t win_responses;    /* ends of responses among the dropped bytes */
    size_t win_request_bytes;  /* the request that opened it (0: opened by the trigger) */
    unsigned win_conn;         /* ... on this connection */
    uint32_t win_stream;       /* ... on this HTTP/2 stream */
    int win_answer_lost;       /* the end of that stream's answer was dropped */
    uint64_t total_c2s, total_s2c, total_dropped; /* since start */
    unsigned accepted;
    uint8_t sink[FP_BUF_BYTES]; /* where dropped responses are read to */
} fp_proxy_t;

/* The self-pipe: the only state the signal handlers touch. */
static int fp_sigpipe[2] = {-1, -1};

/* ============================== helpers ============================== */

static int64_t fp_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void fp_log(fp_proxy_t *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fp_log(fp_proxy_t *p, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("faultproxy: ", p->log);
    vfprintf(p->log, fmt, ap);
    fputc('\n', p->log);
    fflush(p->log);
    va_end(ap);
}

static void fp_on_signal(int sig) {
    int saved = errno;
    char c = sig == SIGUSR1 ? 'u' : 't';
    ssize_t r = write(fp_sigpipe[1], &c, 1); /* full pipe: the signal is already pending */
    (void)r;
    errno = saved;
}

static int fp_nonblock(int fd) {
    int fl = fcntl(fd, F_GETFL);
    return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

/* Closes @p fd with an RST instead of a FIN. */
static void fp_reset_fd(int fd) {
    if (fd < 0) return;
    struct linger lg = {1, 0};
    (void)setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    close(fd);
}

/* Parses a decimal integer in [lo, hi]. @returns 0, or -1 if @p s is not one. */
static int fp_parse_int(const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

/* "2:2,5:0" -> {2, 2}, {5, 0}. @returns 0, or -1 with a message in @p err. */
static int fp_parse_fields(const char *s, fp_field_t *out, size_t *n, char *err, size_t errlen) {
    *n = 0;
    const char *q = s;
    while (*q) {
        char *end;
        errno = 0;
        unsigned long f = strtoul(q, &end, 10);
        if (end == q || *end != ':' || errno || f < 1 || f > 536870911ul) {
            snprintf(err, errlen, "'%s': expected FIELD:WIRE with FIELD in 1..536870911", s);
            return -1;
        }
        q = end + 1;
        unsigned long w = strtoul(q, &end, 10);
        if (end == q || (*end && *end != ',') || (w != 0 && w != 1 && w != 2 && w != 5)) {
            snprintf(err, errlen, "'%s': WIRE must be 0 (varint), 1 (64-bit), 2 (length) or 5", s);
            return -1;
        }
        if (*n == FP_MAX_FIELDS) {
            snprintf(err, errlen, "'%s': at most %d fields", s, FP_MAX_FIELDS);
            return -1;
        }
        out[*n].field = (uint32_t)f;
        out[*n].wire = (uint32_t)w;
        (*n)++;
        q = *end ? end + 1 : end;
        if (*end && !*q) {
            snprintf(err, errlen, "'%s': trailing comma", s);
            return -1;
        }
    }
    if (!*n) {
        snprintf(err, errlen, "empty field list");
        return -1;
    }
    return 0;
}

/* ============================== request inspection ============================== */

static int fp_varint(const uint8_t *b, size_t len, size_t *i, uint64_t *v) {
    *v = 0;
    for (unsigned shift = 0; shift < 64; shift += 7) {
        if (*i >= len) return -1;
        uint8_t c = b[(*i)++];
        *v |= (uint64_t)(c & 0x7f) << shift;
        if (!(c & 0x80)) return 0;
    }
    return -1;
}

/* @returns 1 if the protobuf message @p b holds, at its top level, every field of the list
 * with its wire type; 0 if not, or if it is not a well-formed message. */
static int fp_pb_match(const uint8_t *b, size_t len, const fp_field_t *want, size_t nwant) {
    unsigned found = 0; /* bit k: want[k] seen */
    size_t i = 0;
    while (i < len) {
        uint64_t key, v;
        if (fp_varint(b, len, &i, &key) || key >> 3 == 0 || key >> 3 > 536870911u) return 0;
        uint32_t field = (uint32_t)(key >> 3), wire = (uint32_t)(key & 7);
        for (size_t k = 0; k < nwant; k++)
            if (want[k].field == field && want[k].wire == wire) found |= 1u << k;
        switch (wire) {
        case 0:
            if (fp_varint(b, len, &i, &v)) return 0;
            break;
        case 1:
            if (len - i < 8) return 0;
            i += 8;
            break;
        case 2:
            if (fp_varint(b, len, &i, &v) || v > len - i) return 0;
            i += (size_t)v;
            break;
        case 5:
            if (len - i < 4) return 0;
            i += 4;
            break;
        default: return 0; /* groups (3, 4) are not used by proto3 */
        }
    }
    return found == (1u << nwant) - 1;
}

static void fp_msg_release(fp_msg_t *m) {
    free(m->buf);
    memset(m, 0, sizeof(*m));
}

static fp_msg_t *fp_msg_of(fp_h2_t *h, uint32_t stream) {
    for (size_t k = 0; k < FP_STREAMS; k++)
        if (h->msg[k].stream == stream) return &h->msg[k];
    for (size_t k = 0; k < FP_STREAMS; k++)
        if (!h->msg[k].stream) {
            h->msg[k].stream = stream;
            return &h->msg[k];
        }
    /* all taken (streams whose end we missed): reuse one; its message is lost */
    fp_msg_t *m = &h->msg[h->next_evict++ % FP_STREAMS];
    fp_msg_release(m);
    m->stream = stream;
    return m;
}

/* Feeds DATA payload bytes of one stream. @returns the length of the first message that
 * completed in them and matched the list, or 0. */
static size_t fp_msg_feed(fp_proxy_t *p, fp_msg_t *m, const uint8_t *b, size_t len) {
    size_t matched = 0;
    while (len) {
        if (m->prefix_have < 5) {
            m->prefix[m->prefix_have++] = *b++;
            len--;
            if (m->prefix_have < 5) continue;
            m->need = (size_t)m->prefix[1] << 24 | (size_t)m->prefix[2] << 16 |
                      (size_t)m->prefix[3] << 8 | m->prefix[4];
            m->have = 0;
            m->skip = m->prefix[0] != 0 || m->need > FP_MSG_MAX_BYTES;
            if (!m->skip && m->need > m->cap) {
                uint8_t *nb = realloc(m->buf, m->need);
                if (!nb) {
                    m->skip = 1; /* not inspected; forwarding goes on */
                } else {
                    m->buf = nb;
                    m->cap = m->need;
                }
            }
        }
        size_t take = m->need - m->have < len ? m->need - m->have : len;
        if (!m->skip && take) memcpy(m->buf + m->have, b, take);
        m->have += take;
        b += take;
        len -= take;
        if (m->have == m->need) {
            if (!m->skip && !matched && fp_pb_match(m->buf, m->need, p->arm, p->narm))
                matched = m->need;
            m->prefix_have = 0; /* a next message on this stream (client streaming) */
        }
    }
    return matched;
}

/* Parses the bytes of one direction as HTTP/2. @returns (client->server) the length of a gRPC
 * request that matched the list, or 0; *stream receives its stream id (may be NULL). */
static size_t fp_h2_feed(fp_proxy_t *p, fp_h2_t *h, const uint8_t *b, size_t len,
                         uint32_t *stream) {
    static const char preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    size_t matched = 0;
    while (len && !h->broken) {
        if (h->preface_have < FP_H2_PREFACE_LEN) {
            if (*b != (uint8_t)preface[h->preface_have]) h->broken = 1;
            h->preface_have++;
            b++;
            len--;
            continue;
        }
        if (h->hdr_have < 9) {
            h->hdr[h->hdr_have++] = *b++;
            len--;
            if (h->hdr_have < 9) continue;
            h->payload_left = (size_t)h->hdr[0] << 16 | (size_t)h->hdr[1] << 8 | h->hdr[2];
            h->type = h->hdr[3];
            h->flags = h->hdr[4];
            h->stream = ((uint32_t)h->hdr[5] << 24 | (uint32_t)h->hdr[6] << 16 |
                         (uint32_t)h->hdr[7] << 8 | h->hdr[8]) &
                        0x7fffffffu;
            h->inspect = 0;
            /* server: HEADERS with END_STREAM ends a response (during a window, server bytes
             * are fed here only as they are dropped) */
            if (h->server && h->type == 1 && (h->flags & 0x1)) {
                h->ends++;
                if (p->state == FP_OPEN && p->win_request_bytes && h->conn == p->win_conn &&
                    h->stream == p->win_stream)
                    p->win_answer_lost = 1;
            }
            if (!h->server && h->type == 0 && h->stream) {
                /* client: DATA, collected per stream */
                fp_msg_t *m = fp_msg_of(h, h->stream);
                if (h->flags & 0x8) { /* PADDED (gRPC does not pad): stream not inspected */
                    m->skip = 1;
                    m->prefix_have = 5;
                    m->need = SIZE_MAX; /* never completes; released at END_STREAM */
                    m->have = 0;
                } else {
                    h->inspect = 1;
                }
            }
            if (!h->server && h->type == 3) /* RST_STREAM */
                for (size_t k = 0; k < FP_STREAMS; k++)
                    if (h->msg[k].stream == h->stream) fp_msg_release(&h->msg[k]);
        }
        size_t take = h->payload_left < len ? h->payload_left : len;
        if (h->inspect && take) {
            size_t mlen = fp_msg_feed(p, fp_msg_of(h, h->stream), b, take);
            if (mlen && !matched) {
                matched = mlen;
                if (stream) *stream = h->stream;
            }
        }
        h->payload_left -= take;
        b += take;
        len -= take;
        if (!h->payload_left) {
            /* end of the frame; a client's DATA with END_STREAM ends its request */
            if (!h->server && h->type == 0 && (h->flags & 0x1))
                for (size_t k = 0; k < FP_STREAMS; k++)
                    if (h->msg[k].stream == h->stream) fp_msg_release(&h->msg[k]);
            h->hdr_have = 0;
        }
    }
    return matched;
}

/* ============================== windows ============================== */

static void fp_conn_close(fp_proxy_t *p, fp_conn_t *c, int reset);

static void fp_window_open(fp_proxy_t *p, int64_t now_ms, size_t request_bytes, unsigned conn,
                           uint32_t stream) {
    p->state = FP_OPEN;
    p->windows++;
    p->open_at_ms = now_ms;
    p->win_c2s = p->win_s2c = p->win_responses = 0;
    p->win_request_bytes = request_bytes;
    p->win_conn = conn;
    p->win_stream = stream;
    p->win_answer_lost = 0;
    if (request_bytes)
        fp_log(p,
               "window %u open: a matching request of %zu bytes on connection %u stream %" PRIu32
               ", %" PRId64 " ms after trigger %u; dropping responses %s%d ms",
               p->windows, request_bytes, conn, stream, now_ms - p->armed_at_ms, p->triggers,
               p->until_answer ? "until its answer ended, at most " : "for ", p->drop_ms);
    else
        fp_log(p, "window %u open: trigger %u; dropping responses for %d ms", p->windows,
               p->triggers, p->drop_ms);
}

static void fp_window_close(fp_proxy_t *p, int64_t now_ms) {
    unsigned reset = 0;
    for (fp_conn_t *c = p->conns; c; c = c->next)
        if (!c->dead) {
            fp_conn_close(p, c, 1);
            reset++;
        }
    fp_log(p,
           "window %u closed after %" PRId64 " ms: forwarded_c2s=%" PRIu64 " dropped_s2c=%" PRIu64
           " lost_responses=%" PRIu64 " reset=%u matched=%d answer_lost=%d",
           p->windows, now_ms - p->open_at_ms, p->win_c2s, p->win_s2c, p->win_responses, reset,
           p->win_request_bytes > 0, p->win_answer_lost);
    p->state = FP_IDLE;
}

static void fp_trigger(fp_proxy_t *p, int64_t now_ms) {
    if (p->state != FP_IDLE) {
        fp_log(p, "trigger ignored: window %u is %s", p->windows + (p->state == FP_ARMED),
               p->state == FP_ARMED ? "armed" : "open");
        return;
    }
    p->triggers++;
    p->armed_at_ms = now_ms;
    if (!p->narm) {
        fp_window_open(p, now_ms, 0, 0, 0);
        return;
    }
    p->state = FP_ARMED;
    fp_log(p, "trigger %u: armed for %d ms, waiting for a matching request", p->triggers,
           p->arm_timeout_ms);
}

/* ============================== connections ============================== */

static void fp_conn_close(fp_proxy_t *p, fp_conn_t *c, int reset) {
    if (c->dead) return;
    if (reset) {
        fp_reset_fd(c->cfd);
        fp_reset_fd(c->sfd);
    } else {
        if (c->cfd >= 0) close(c->cfd);
        if (c->sfd >= 0) close(c->sfd);
    }
    c->cfd = c->sfd = -1;
    c->dead = 1;
    p->nconns--;
}

static void fp_conn_free(fp_conn_t *c) {
    for (size_t k = 0; k < FP_STREAMS; k++) {
        fp_msg_release(&c->h2c.msg[k]);
        fp_msg_release(&c->h2s.msg[k]);
    }
    free(c);
}

static void fp_accept(fp_proxy_t *p) {
    for (;;) {
        int cfd = accept(p->lfd, NULL, NULL);
        if (cfd < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED)
                fp_log(p, "accept: %s", strerror(errno));
            return;
        }
        p->accepted++;
        fp_conn_t *c = calloc(1, sizeof(*c));
        int sfd = socket(p->target.ss_family, SOCK_STREAM, 0);
        if (!c || sfd < 0 || fp_nonblock(cfd) || fp_nonblock(sfd)) {
            fp_log(p, "connection dropped: %s", !c ? "out of memory" : strerror(errno));
            free(c);
            if (sfd >= 0) close(sfd);
            fp_reset_fd(cfd);
            continue;
        }
        int one = 1;
        (void)setsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        (void)setsockopt(sfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        c->id = ++p->next_id;
        c->cfd = cfd;
        c->sfd = sfd;
        c->pc = c->ps = -1;
        c->h2s.server = 1;
        c->h2c.conn = c->h2s.conn = c->id;
        c->h2s.preface_have = FP_H2_PREFACE_LEN; /* a server sends none */
        if (connect(sfd, (struct sockaddr *)&p->target, p->target_len) < 0) {
            if (errno != EINPROGRESS) {
                fp_log(p, "connection %u: cannot reach %s: %s", c->id, p->target_name,
                       strerror(errno));
                fp_reset_fd(cfd);
                close(sfd);
                free(c);
                continue;
            }
            c->connecting = 1;
        }
        c->next = p->conns;
        p->conns = c;
        p->nconns++;
    }
}

/* Writes what @p d holds to @p fd, then passes a FIN on. @returns -1 on a write error. */
static int fp_flush(fp_dir_t *d, int fd, uint64_t *count) {
    while (d->len) {
        ssize_t w = send(fd, d->buf + d->off, d->len, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR) continue;
            return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -1;
        }
        d->off += (size_t)w;
        d->len -= (size_t)w;
        *count += (uint64_t)w;
    }
    d->off = 0;
    if (d->eof && !d->shut) {
        (void)shutdown(fd, SHUT_WR);
        d->shut = 1;
    }
    return 0;
}

/* Moves bytes both ways as far as the sockets allow. */
static void fp_pump(fp_proxy_t *p, fp_conn_t *c) {
    if (c->dead) return;
    if (!c->connecting) {
        uint64_t n = 0;
        if (fp_flush(&c->c2s, c->sfd, &n)) {
            fp_conn_close(p, c, 1);
            return;
        }
        p->total_c2s += n;
        if (p->state == FP_OPEN) p->win_c2s += n;
    }
    uint64_t n = 0;
    if (fp_flush(&c->s2c, c->cfd, &n)) {
        fp_conn_close(p, c, 1);
        return;
    }
    p->total_s2c += n;
    if (c->c2s.shut && c->s2c.shut) fp_conn_close(p, c, 0); /* both FINs passed on */
}

/* Reads from one side into @p d (or, from the server during a window, into the void).
 * @returns -1 on a read error. */
static int fp_read(fp_proxy_t *p, fp_conn_t *c, int from_client) {
    int fd = from_client ? c->cfd : c->sfd;
    fp_dir_t *d = from_client ? &c->c2s : &c->s2c;
    int drop = !from_client && p->state == FP_OPEN;
    ssize_t r;
    do
        r = recv(fd, drop ? p->sink : d->buf, drop ? sizeof(p->sink) : sizeof(d->buf), 0);
    while (r < 0 && errno == EINTR);
    if (r < 0) return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -1;
    if (r == 0) {
        d->eof = 1;
        return 0;
    }
    if (!from_client && p->narm) { /* responses are followed, forwarded or dropped */
        uint64_t ends = c->h2s.ends;
        fp_h2_feed(p, &c->h2s, drop ? p->sink : d->buf, (size_t)r, NULL);
        if (drop) p->win_responses += c->h2s.ends - ends;
    }
    if (drop) {
        p->win_s2c += (uint64_t)r;
        p->total_dropped += (uint64_t)r;
        return 0;
    }
    d->off = 0;
    d->len = (size_t)r;
    if (from_client && p->narm) {
        uint32_t stream = 0;
        size_t m = fp_h2_feed(p, &c->h2c, d->buf, d->len, &stream);
        if (m && p->state == FP_ARMED) fp_window_open(p, fp_now_ms(), m, c->id, stream);
    }
    return 0;
}

static void fp_conn_events(fp_proxy_t *p, fp_conn_t *c, short crev, short srev) {
    if (c->connecting && srev) {
        int err = 0;
        socklen_t l = sizeof(err);
        if (getsockopt(c->sfd, SOL_SOCKET, SO_ERROR, &err, &l) < 0) err = errno;
        if (err) {
            fp_log(p, "connection %u: cannot reach %s: %s", c->id, p->target_name, strerror(err));
            fp_conn_close(p, c, 1);
            return;
        }
        c->connecting = 0;
        srev &= (short)~POLLOUT;
    }
    if ((crev | srev) & POLLERR) { /* a reset from either side: reset the other */
        fp_conn_close(p, c, 1);
        return;
    }
    if ((crev & (POLLIN | POLLHUP)) && !c->c2s.len && !c->c2s.eof && fp_read(p, c, 1)) {
        fp_conn_close(p, c, 1);
        return;
    }
    if (!c->connecting && (srev & (POLLIN | POLLHUP)) && !c->s2c.eof &&
        (p->state == FP_OPEN || !c->s2c.len) && fp_read(p, c, 0)) {
        fp_conn_close(p, c, 1);
        return;
    }
    fp_pump(p, c);
}

/* ============================== main loop ============================== */

static int fp_run(fp_proxy_t *p) {
    struct pollfd *pfd = NULL;
    size_t pcap = 0;
    int rc = 0;
    for (;;) {
        size_t need = 2 + 2 * (size_t)p->nconns;
        if (need > pcap) {
            struct pollfd *np = realloc(pfd, need * 2 * sizeof(*np));
            if (!np) {
                fp_log(p, "out of memory");
                rc = 1;
                break;
            }
            pfd = np;
            pcap = need * 2;
        }
        size_t n = 0;
        pfd[n++] = (struct pollfd){.fd = fp_sigpipe[0], .events = POLLIN};
        pfd[n++] = (struct pollfd){.fd = p->lfd, .events = POLLIN};
        for (fp_conn_t *c = p->conns; c; c = c->next) {
            short ce = 0, se = 0;
            if (!c->c2s.len && !c->c2s.eof) ce |= POLLIN;
            if (c->s2c.len) ce |= POLLOUT;
            if (c->connecting) {
                se = POLLOUT;
            } else {
                if (!c->s2c.eof && (p->state == FP_OPEN || !c->s2c.len)) se |= POLLIN;
                if (c->c2s.len) se |= POLLOUT;
            }
            /* a side with nothing to wait for is left out: its POLLHUP would spin */
            c->pc = ce ? (int)n : -1;
            if (ce) pfd[n++] = (struct pollfd){.fd = c->cfd, .events = ce};
            c->ps = se ? (int)n : -1;
            if (se) pfd[n++] = (struct pollfd){.fd = c->sfd, .events = se};
        }
        int timeout = -1;
        int64_t now = fp_now_ms();
        if (p->state == FP_OPEN) {
            int64_t left = p->open_at_ms + p->drop_ms - now;
            timeout = left > 0 ? (int)left : 0;
        } else if (p->state == FP_ARMED) {
            int64_t left = p->armed_at_ms + p->arm_timeout_ms - now;
            timeout = left > 0 ? (int)left : 0;
        }
        int r = poll(pfd, n, timeout);
        if (r < 0 && errno != EINTR) {
            fp_log(p, "poll: %s", strerror(errno));
            rc = 1;
            break;
        }
        int stop = 0;
        if (r > 0 && (pfd[0].revents & POLLIN)) {
            char sig[64];
            ssize_t k = read(fp_sigpipe[0], sig, sizeof(sig));
            for (ssize_t i = 0; i < k; i++) {
                if (sig[i] == 't')
                    stop = 1;
                else
                    fp_trigger(p, fp_now_ms());
            }
        }
        if (stop) break;
        if (r > 0) {
            for (fp_conn_t *c = p->conns; c; c = c->next) {
                if (c->dead) continue;
                short crev = c->pc >= 0 ? pfd[c->pc].revents : 0;
                short srev = c->ps >= 0 ? pfd[c->ps].revents : 0;
                if (crev || srev) fp_conn_events(p, c, crev, srev);
            }
            if (pfd[1].revents & POLLIN) fp_accept(p);
        }
        now = fp_now_ms();
        if (p->state == FP_OPEN &&
            (now >= p->open_at_ms + p->drop_ms || (p->until_answer && p->win_answer_lost)))
            fp_window_close(p, now);
        if (p->state == FP_ARMED && now >= p->armed_at_ms + p->arm_timeout_ms) {
            fp_log(p, "trigger %u lapsed: no matching request in %d ms", p->triggers,
                   p->arm_timeout_ms);
            p->state = FP_IDLE;
        }
        for (fp_conn_t **pp = &p->conns; *pp;) { /* sweep */
            fp_conn_t *c = *pp;
            if (c->dead) {
                *pp = c->next;
                fp_conn_free(c);
            } else {
                pp = &c->next;
            }
        }
    }
    free(pfd);
    return rc;
}

/* ============================== setup ============================== */

static void fp_usage(FILE *f) {
    fprintf(f, "usage: mt_faultproxy --target HOST:PORT [--listen PORT] [--port-file FILE]\n"
               "                     [--drop-ms MS] [--arm-fields F:W[,F:W...]]\n"
               "                     [--arm-timeout-ms MS] [--until-answer] [--log FILE]\n"
               "A TCP proxy on 127.0.0.1:PORT (default 0: any free port) to HOST:PORT. SIGUSR1\n"
               "opens a fault window (at the next gRPC request whose protobuf message has every\n"
               "field F with wire type W, with --arm-fields; it lapses after --arm-timeout-ms,\n"
               "default 10000): for --drop-ms (default 500) responses are read and dropped, then\n"
               "every connection is reset; with --until-answer the window closes as soon as the\n"
               "answer to the matching request was dropped (--drop-ms: at most). SIGTERM/SIGINT:\n"
               "exit 0. Exit 1: runtime failure, 2: bad flags. See tests/e2e/faultproxy.c.\n");
}

static int fp_resolve(fp_proxy_t *p, const char *target, char *err, size_t errlen) {
    const char *colon = strrchr(target, ':');
    if (!colon || colon == target || !colon[1]) {
        snprintf(err, errlen, "--target '%s': expected HOST:PORT", target);
        return -1;
    }
    char host[256];
    size_t hl = (size_t)(colon - target);
    if (hl >= sizeof(host)) {
        snprintf(err, errlen, "--target '%s': host too long", target);
        return -1;
    }
    memcpy(host, target, hl);
    host[hl] = '\0';
    long port;
    if (fp_parse_int(colon + 1, 1, 65535, &port)) {
        snprintf(err, errlen, "--target '%s': port must be 1..65535", target);
        return -1;
    }
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai = NULL;
    int g = getaddrinfo(host, colon + 1, &hints, &ai);
    if (g || !ai) {
        snprintf(err, errlen, "--target '%s': %s", target, g ? gai_strerror(g) : "no address");
        return -1;
    }
    memcpy(&p->target, ai->ai_addr, ai->ai_addrlen);
    p->target_len = ai->ai_addrlen;
    freeaddrinfo(ai);
    return 0;
}

static int fp_listen(fp_proxy_t *p, long port, const char *port_file) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int one = 1;
    p->lfd = socket(AF_INET, SOCK_STREAM, 0);
    if (p->lfd < 0 || setsockopt(p->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) ||
        bind(p->lfd, (struct sockaddr *)&a, sizeof(a)) || listen(p->lfd, 64) ||
        fp_nonblock(p->lfd)) {
        fp_log(p, "cannot listen on 127.0.0.1:%ld: %s", port, strerror(errno));
        return -1;
    }
    socklen_t al = sizeof(a);
    if (getsockname(p->lfd, (struct sockaddr *)&a, &al)) {
        fp_log(p, "getsockname: %s", strerror(errno));
        return -1;
    }
    unsigned bound = ntohs(a.sin_port);
    fp_log(p, "listening on 127.0.0.1:%u, forwarding to %s, drop %d ms", bound, p->target_name,
           p->drop_ms);
    if (!port_file) return 0;
    /* written whole, then renamed: a reader never sees half a number */
    char tmp[4096];
    if (snprintf(tmp, sizeof(tmp), "%s.tmp", port_file) >= (int)sizeof(tmp)) {
        fp_log(p, "--port-file: path too long");
        return -1;
    }
    FILE *f = fopen(tmp, "w");
    int bad = !f || fprintf(f, "%u\n", bound) < 0;
    if (f && fclose(f)) bad = 1;
    if (bad || rename(tmp, port_file)) {
        fp_log(p, "cannot write %s: %s", port_file, strerror(errno));
        unlink(tmp);
        return -1;
    }
    return 0;
}

int main(int argc, char **argv) {
    fp_proxy_t p;
    memset(&p, 0, sizeof(p));
    p.log = stderr;
    p.lfd = -1;
    p.drop_ms = 500;
    p.arm_timeout_ms = 10000;
    const char *target = NULL, *port_file = NULL, *log_path = NULL;
    long port = 0, v;
    char err[512];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fp_usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--until-answer")) {
            p.until_answer = 1;
            continue;
        }
        static const char *const with_value[] = {"--target",         "--listen", "--port-file",
                                                 "--drop-ms",        "--log",    "--arm-fields",
                                                 "--arm-timeout-ms", NULL};
        int known = 0;
        for (size_t k = 0; with_value[k]; k++)
            known |= !strcmp(a, with_value[k]);
        if (!known) {
            fprintf(stderr, "mt_faultproxy: unknown flag %s\n", a);
            fp_usage(stderr);
            return 2;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "mt_faultproxy: %s needs a value\n", a);
            return 2;
        }
        const char *val = argv[++i];
        if (!strcmp(a, "--target")) {
            target = val;
        } else if (!strcmp(a, "--listen")) {
            if (fp_parse_int(val, 0, 65535, &port)) {
                fprintf(stderr, "mt_faultproxy: --listen '%s': a port, 0..65535\n", val);
                return 2;
            }
        } else if (!strcmp(a, "--port-file")) {
            port_file = val;
        } else if (!strcmp(a, "--log")) {
            log_path = val;
        } else if (!strcmp(a, "--drop-ms")) {
            if (fp_parse_int(val, 1, 3600000, &v)) {
                fprintf(stderr, "mt_faultproxy: %s '%s': milliseconds, 1..3600000\n", a, val);
                return 2;
            }
            p.drop_ms = (int)v;
        } else if (!strcmp(a, "--arm-fields")) {
            if (fp_parse_fields(val, p.arm, &p.narm, err, sizeof(err))) {
                fprintf(stderr, "mt_faultproxy: --arm-fields %s\n", err);
                return 2;
            }
        } else { /* --arm-timeout-ms */
            if (fp_parse_int(val, 1, 3600000, &v)) {
                fprintf(stderr, "mt_faultproxy: %s '%s': milliseconds, 1..3600000\n", a, val);
                return 2;
            }
            p.arm_timeout_ms = (int)v;
        }
    }
    if (!target) {
        fprintf(stderr, "mt_faultproxy: --target HOST:PORT is required\n");
        fp_usage(stderr);
        return 2;
    }
    if (p.until_answer && !p.narm) {
        fprintf(stderr, "mt_faultproxy: --until-answer needs --arm-fields (the request whose "
                        "answer ends the window)\n");
        return 2;
    }
    p.target_name = target;
    if (fp_resolve(&p, target, err, sizeof(err))) {
        fprintf(stderr, "mt_faultproxy: %s\n", err);
        return 2;
    }
    if (log_path && !(p.log = fopen(log_path, "a"))) {
        fprintf(stderr, "mt_faultproxy: --log %s: %s\n", log_path, strerror(errno));
        return 1;
    }
    int rc = 1;
    if (pipe(fp_sigpipe) || fp_nonblock(fp_sigpipe[0]) || fp_nonblock(fp_sigpipe[1])) {
        fp_log(&p, "pipe: %s", strerror(errno));
        goto out;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = fp_on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    if (sigaction(SIGUSR1, &sa, NULL) || sigaction(SIGTERM, &sa, NULL) ||
        sigaction(SIGINT, &sa, NULL)) {
        fp_log(&p, "sigaction: %s", strerror(errno));
        goto out;
    }
    signal(SIGPIPE, SIG_IGN);
    /* the port file says "ready": the handlers are in place before it exists */
    if (fp_listen(&p, port, port_file)) goto out;
    rc = fp_run(&p);
    fp_log(&p,
           "stopping: %u connections accepted, %u windows, %" PRIu64
           " bytes forwarded c2s, %" PRIu64 " s2c, %" PRIu64 " dropped",
           p.accepted, p.windows, p.total_c2s, p.total_s2c, p.total_dropped);
out:
    while (p.conns) {
        fp_conn_t *c = p.conns;
        p.conns = c->next;
        fp_conn_close(&p, c, 0);
        fp_conn_free(c);
    }
    if (p.lfd >= 0) close(p.lfd);
    for (int k = 0; k < 2; k++)
        if (fp_sigpipe[k] >= 0) close(fp_sigpipe[k]);
    if (p.log != stderr) fclose(p.log);
    return rc;
}
