/*
 * rpc.h - a small service layer over gRPC C core (<grpc/grpc.h>, no C++) for Monolith-C's
 * daemons and clients. Messages are opaque bytes here (the callers use protobuf-c); gRPC
 * types stay out of this header.
 *
 * Server: completion-queue driven. Threads wait for new calls on one notification queue;
 * each call is bound to a completion queue of its own, so a handler runs to the end on the
 * thread that received the call (sending its reply, or a stream of messages, and waiting
 * for each send) without depending on the other threads. Admission (docs/security.md):
 *  - at most `threads` unary handlers run at once; a unary call that finds them all busy
 *    waits in a queue of at most `max_queued` calls, and a call beyond that is answered
 *    RESOURCE_EXHAUSTED ("server overloaded: N calls queued") at once;
 *  - streaming calls (long-lived: a PS Sync stream may stay open for minutes) run on
 *    threads of their own, at most `max_streams` at once (more: RESOURCE_EXHAUSTED), so
 *    they never starve unary calls;
 *  - grpc.health.v1.Health/Check and calls to paths nobody registered (UNIMPLEMENTED) are
 *    answered at once by whichever thread receives them, under any load: one thread more
 *    than the running handlers can occupy always waits for calls.
 * Every method keeps enough calls requested from gRPC that a call beyond the bounds is
 * received (and refused) instead of waiting inside gRPC.
 *
 * TLS (mt_rpc_tls_config_t): off by default (plaintext, for loopback). Server and client
 * read their PEM files when created (the one place a library of ours reads files: paths
 * are what operators configure, and every caller gets the same checks and messages), and
 * check them with OpenSSL: a missing or unreadable file is MT_IO, a file without a
 * certificate or key, a key that does not match its certificate, or an expired
 * certificate is MT_CONFIG. mt_rpc_tls_check() gives the message ("tls.cert_file
 * '/etc/x.pem': cannot open: No such file or directory"); the create functions log it.
 *
 * Client: one channel per target; unary calls with a deadline and retries with exponential
 * backoff on UNAVAILABLE; several unary calls in flight at once (mt_rpc_call_many); and
 * server-streaming calls read message by message.
 *
 * gRPC core is initialized once per process, on first use, and left running until exit.
 * Deadlines: a deadline_ms of 0 or less means none.
 *
 * Thread safety: mt_rpc_server_* functions may be called from any thread; handlers run on
 * server threads, concurrently with each other (a handler is called for one call only, and
 * its mt_rpc_call_t must not be used after it returns). A channel is thread-safe: many
 * threads may make calls on it at once. A stream belongs to one thread at a time.
 */
#ifndef MT_RPC_H
#define MT_RPC_H

#include <stddef.h>
#include <stdint.h>

#include "mt/err.h"

/* gRPC status codes (same numbers as grpc_status_code). */
enum {
    MT_RPC_OK = 0,
    MT_RPC_CANCELLED = 1,
    MT_RPC_UNKNOWN = 2,
    MT_RPC_INVALID_ARGUMENT = 3,
    MT_RPC_DEADLINE_EXCEEDED = 4,
    MT_RPC_NOT_FOUND = 5,
    MT_RPC_ALREADY_EXISTS = 6,
    MT_RPC_PERMISSION_DENIED = 7,
    MT_RPC_RESOURCE_EXHAUSTED = 8,
    MT_RPC_FAILED_PRECONDITION = 9,
    MT_RPC_ABORTED = 10,
    MT_RPC_OUT_OF_RANGE = 11,
    MT_RPC_UNIMPLEMENTED = 12,
    MT_RPC_INTERNAL = 13,
    MT_RPC_UNAVAILABLE = 14,
    MT_RPC_DATA_LOSS = 15,
    MT_RPC_UNAUTHENTICATED = 16
};

/** The outcome of a call as the client saw it. */
typedef struct mt_rpc_status {
    int code;          /* MT_RPC_* */
    char message[256]; /* the server's message, or the transport's */
} mt_rpc_status_t;

/* ============================== TLS ============================== */

/**
 * Transport security of a server or a channel. Paths are borrowed during create; "" and
 * NULL mean unset. A server needs cert_file and key_file (and ca_file with client_auth); a
 * client verifies the server against ca_file (unset: gRPC's default roots) and presents
 * cert_file / key_file when both are set (mutual TLS).
 */
typedef struct mt_rpc_tls_config {
    int enabled;             /* 0: plaintext (default) */
    const char *cert_file;   /* PEM certificate chain, leaf first: the server's / the client's */
    const char *key_file;    /* PEM private key of cert_file (not encrypted) */
    const char *ca_file;     /* PEM CA certificates the peer's certificate must chain to */
    int client_auth;         /* server: require a client certificate signed by ca_file */
    const char *server_name; /* client: name the server certificate must carry (unset: the
                                target's host); gRPC's ssl_target_name_override */
} mt_rpc_tls_config_t;

/**
 * Reads and checks the files of @p tls as a server (@p server = 1) or a client would.
 * Nothing to check when !tls->enabled.
 * @param[out] errbuf  what is wrong, naming the key and the path (may be NULL)
 * @returns MT_OK, MT_IO (a file cannot be read), MT_CONFIG (a required file is unset, or a
 *          file holds no certificate / key, the key does not match, a certificate expired).
 */
mt_err_t mt_rpc_tls_check(const mt_rpc_tls_config_t *tls, int server, char *errbuf, size_t errlen);

/* ============================== server ============================== */

typedef struct mt_rpc_server mt_rpc_server_t;
typedef struct mt_rpc_call mt_rpc_call_t;

#define MT_RPC_MAX_THREADS 64
#define MT_RPC_MAX_QUEUED  4096
#define MT_RPC_MAX_STREAMS 256

typedef struct mt_rpc_server_config {
    const char *listen;         /* "127.0.0.1:0" picks a free port (default) */
    uint32_t threads;           /* unary handlers running at once, 1..64 (default 4) */
    uint32_t max_queued;        /* unary calls waiting for a thread, 0..4096 (default 16);
                                   one more is answered RESOURCE_EXHAUSTED */
    uint32_t max_streams;       /* streaming calls at once, on threads of their own, 1..256
                                   (default 8); one more is answered RESOURCE_EXHAUSTED */
    uint32_t max_message_bytes; /* receive and send limit (default 64 MiB); a larger request
                                   is answered RESOURCE_EXHAUSTED by gRPC */
    uint32_t grace_ms;          /* shutdown: how long in-flight calls may finish (default 5000) */
    mt_rpc_tls_config_t tls;    /* default: plaintext */
} mt_rpc_server_config_t;

/** Admission counters of a server (mt_rpc_server_stats()). */
typedef struct mt_rpc_server_stats {
    uint64_t rejected;         /* calls answered RESOURCE_EXHAUSTED: queue or streams full */
    uint64_t rejected_streams; /* of which streaming calls */
    uint32_t running;          /* unary handlers running now */
    uint32_t queued;           /* unary calls waiting now */
    uint32_t streams;          /* streaming handlers running now */
} mt_rpc_server_stats_t;

/**
 * A method handler. It reads the request (@p req, @p len: borrowed until it returns) and
 * must finish the call with exactly one of mt_rpc_reply() or mt_rpc_fail(); a streaming
 * handler may first call mt_rpc_send() any number of times, then mt_rpc_reply(c, NULL, 0)
 * or mt_rpc_fail(). Returning without finishing answers INTERNAL.
 */
typedef void (*mt_rpc_handler_fn)(void *ud, mt_rpc_call_t *c, const uint8_t *req, size_t len);

void mt_rpc_server_config_init(mt_rpc_server_config_t *cfg);

/**
 * Creates a server (not yet listening); with TLS, reads and checks the PEM files now.
 * @param[out] out  caller frees with mt_rpc_server_destroy().
 * @returns MT_OK, MT_CONFIG (a field out of bounds; a TLS file unset or invalid: logged),
 *          MT_IO (a TLS file cannot be read: logged), MT_NOMEM.
 */
mt_err_t mt_rpc_server_create(const mt_rpc_server_config_t *cfg, mt_rpc_server_t **out);

/* Flags of mt_rpc_server_add(). */
#define MT_RPC_STREAMING   1 /* the handler may mt_rpc_send() several messages */
#define MT_RPC_OWN_THREADS 2 /* unary, but admitted as streams are (see below) */

/**
 * Registers a method before mt_rpc_server_start(). @p path is "/package.Service/Method"
 * (copied). @p flags: 0 for a unary method (its calls run on the `threads`, then wait in
 * the queue); MT_RPC_STREAMING: the handler may mt_rpc_send() several messages, and its
 * calls are admitted as streams (threads of their own, at most max_streams, never queued);
 * MT_RPC_OWN_THREADS: a unary method admitted as streams are, for calls that other servers
 * make from inside their own handlers (a serving node's peer Lookups: queued behind Predicts
 * that themselves wait for peers, they could stall two nodes until their deadlines).
 * @returns MT_OK, MT_INVALID (after start, a path registered twice, unknown flags), MT_NOMEM.
 */
mt_err_t mt_rpc_server_add(mt_rpc_server_t *s, const char *path, int flags, mt_rpc_handler_fn fn,
                           void *ud);

/** Binds, starts the workers. @param[out] port  the bound port. @returns MT_OK or MT_IO. */
mt_err_t mt_rpc_server_start(mt_rpc_server_t *s, int *port);

/** What Health/Check answers: 1 SERVING (default after start), 0 NOT_SERVING. */
void mt_rpc_server_set_serving(mt_rpc_server_t *s, int serving);

/** Admission counters and gauges (for /metrics). Thread-safe; @p s may be NULL (zeros). */
void mt_rpc_server_stats(mt_rpc_server_t *s, mt_rpc_server_stats_t *out);

/**
 * Writes the admission metrics as Prometheus text into @p buf (NUL-terminated, cut to
 * @p len): <prefix>_rejected_total and <prefix>_rejected_streams_total (counters),
 * <prefix>_queued_calls and <prefix>_open_streams (gauges), each with @p labels (e.g.
 * "shard=\"0\"", or "" for none). @returns the length it needed (as snprintf).
 */
int mt_rpc_server_render_metrics(mt_rpc_server_t *s, const char *prefix, const char *labels,
                                 char *buf, size_t len);

/**
 * Graceful shutdown: stops accepting calls (clients get UNAVAILABLE), lets running handlers
 * finish for up to grace_ms, then cancels what is left (calls not yet handled at once,
 * once no handler runs), and joins the workers. Idempotent.
 */
void mt_rpc_server_shutdown(mt_rpc_server_t *s);

/** Shuts down if needed and frees. NULL is a no-op. */
void mt_rpc_server_destroy(mt_rpc_server_t *s);

/** Finishes a call with OK and one message (@p buf borrowed; NULL/0 for a stream's end). */
void mt_rpc_reply(mt_rpc_call_t *c, const uint8_t *buf, size_t len);

/** Finishes a call with an error status and a printf-style message. */
void mt_rpc_fail(mt_rpc_call_t *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/**
 * Sends one message of a streaming reply and waits until gRPC took it.
 * @returns MT_OK, or MT_CANCELLED when the client went away or the deadline passed (the
 *          handler should then stop and call mt_rpc_fail()).
 */
mt_err_t mt_rpc_send(mt_rpc_call_t *c, const uint8_t *buf, size_t len);

/** Milliseconds left before the call's deadline (INT64_MAX if none, <= 0 if passed). */
int64_t mt_rpc_call_remaining_ms(const mt_rpc_call_t *c);

/** The call's metadata value for @p key (e.g. "authorization"), or NULL. Valid in the handler. */
const char *mt_rpc_call_metadata(const mt_rpc_call_t *c, const char *key);

/* ============================== client ============================== */

typedef struct mt_rpc_channel mt_rpc_channel_t;
typedef struct mt_rpc_stream mt_rpc_stream_t;

typedef struct mt_rpc_client_config {
    uint32_t max_message_bytes; /* default 64 MiB */
    uint32_t retries;           /* extra attempts on UNAVAILABLE (default 3) */
    uint32_t backoff_ms;        /* first backoff, doubled each retry (default 50) */
    uint32_t backoff_max_ms;    /* cap of the backoff (default 2000) */
    mt_rpc_tls_config_t tls;    /* default: plaintext */
} mt_rpc_client_config_t;

void mt_rpc_client_config_init(mt_rpc_client_config_t *cfg);

/**
 * Creates a channel; with TLS, reads and checks the PEM files now. Connects lazily: a TLS
 * handshake that fails (wrong CA, a server without TLS, a client certificate the server
 * requires and does not get) shows as calls failing UNAVAILABLE, with gRPC's reason.
 * @param[out] out  caller frees with mt_rpc_channel_destroy().
 * @returns MT_OK, MT_CONFIG (bad target or limits; a TLS file invalid: logged), MT_IO (a
 *          TLS file cannot be read: logged), MT_NOMEM.
 */
mt_err_t mt_rpc_channel_create(const char *target, const mt_rpc_client_config_t *cfg,
                               mt_rpc_channel_t **out);
void mt_rpc_channel_destroy(mt_rpc_channel_t *ch);

/**
 * A unary call. On success (st->code == MT_RPC_OK) *resp is a malloc'd buffer the caller
 * frees (NULL if the reply was empty). Retries on UNAVAILABLE within the deadline.
 * @returns MT_OK when the call completed (whatever its status: see @p st), MT_TIMEOUT if
 *          the deadline passed, MT_UNAVAILABLE if the server stayed unreachable, MT_NOMEM.
 */
mt_err_t mt_rpc_call(mt_rpc_channel_t *ch, const char *path, const uint8_t *req, size_t len,
                     int64_t deadline_ms, uint8_t **resp, size_t *resp_len, mt_rpc_status_t *st);

/**
 * grpc.health.v1.Health/Check of the whole server (service ""), as load balancers ask it.
 * @returns 1 when it answers SERVING; 0 otherwise: NOT_SERVING or another status, a call
 *          that fails or does not complete within @p deadline_ms, a reply that is not a
 *          HealthCheckResponse. Retries on UNAVAILABLE as mt_rpc_call() does.
 */
int mt_rpc_serving(mt_rpc_channel_t *ch, int64_t deadline_ms);

/** One call of a batch (mt_rpc_call_many). Inputs borrowed; outputs as for mt_rpc_call. */
typedef struct mt_rpc_batch_call {
    mt_rpc_channel_t *ch;
    const char *path;
    const uint8_t *req;
    size_t len;
    uint8_t *resp;      /* out: malloc'd, caller frees */
    size_t resp_len;    /* out */
    mt_rpc_status_t st; /* out */
} mt_rpc_batch_call_t;

/** Runs @p n unary calls in parallel (possibly on different channels), each with the same
 *  deadline, and the retry policy of the first call's channel: calls that got UNAVAILABLE
 *  are sent again together. @returns MT_OK once all completed; see each call's st. */
mt_err_t mt_rpc_call_many(mt_rpc_batch_call_t *calls, size_t n, int64_t deadline_ms);

/** mt_rpc_call_many(), running @p meanwhile(@p ud) on the calling thread once the calls are
 *  sent and before their answers are waited for (work that overlaps the round trips: a
 *  Predict's own lookups while its peers answer). @p meanwhile is called exactly once, also
 *  when @p n is 0 or nothing could be sent; it must not call into this batch. */
mt_err_t mt_rpc_call_many_overlap(mt_rpc_batch_call_t *calls, size_t n, int64_t deadline_ms,
                                  void (*meanwhile)(void *ud), void *ud);

/** Opens a server-streaming call and waits for the server's first response (its initial
 *  metadata, a message or its status). @param[out] out  caller closes with
 *  mt_rpc_stream_close(). */
mt_err_t mt_rpc_stream_open(mt_rpc_channel_t *ch, const char *path, const uint8_t *req, size_t len,
                            int64_t deadline_ms, mt_rpc_stream_t **out);

/**
 * Next message of the stream: *buf is malloc'd (caller frees).
 * @returns MT_OK with a message, MT_NOT_FOUND at the end of the stream (then read the
 *          status with mt_rpc_stream_close()), or MT_CANCELLED on a broken stream.
 */
mt_err_t mt_rpc_stream_next(mt_rpc_stream_t *s, uint8_t **buf, size_t *len);

/** Ends the stream (cancelling it if not finished) and gives its final status. */
void mt_rpc_stream_close(mt_rpc_stream_t *s, mt_rpc_status_t *st);

#endif /* MT_RPC_H */
