/*
 * rpc.c - the gRPC C core service layer (see mt/rpc.h).
 *
 * Server anatomy
 * --------------
 *   notification queue (cq, "next" type, registered with the server)
 *     <- requested calls ("slots"), per method as many as the method can hold at once plus
 *        spares: unary: threads + max_queued + 2; streaming: max_streams + 2; Health: 4; and
 *        2 generic slots for paths nobody registered (answered UNIMPLEMENTED; without them
 *        such calls would hang until their deadline). So a call beyond the bounds is
 *        received, and refused at once, instead of waiting inside gRPC for a slot.
 *   slot: {method, call, deadline, metadata, payload, ccq}
 *     ccq is a "pluck" queue bound to the slot's calls: every batch of a call completes
 *     there, and only the thread handling the call plucks it. So a handler that streams
 *     (send, wait, send, wait, ...) never needs another thread to make progress.
 *
 *   threads: next(cq) -> a slot whose call arrived -> admission (under qlock):
 *     Health / unknown path      -> answered here and now (never waits, never refused)
 *     streaming, own threads     -> streams < max_streams ? run it here : refuse
 *     unary                      -> running < threads ? run it here, then the queue
 *                                   : queued < max_queued ? queue it : refuse
 *     then the slot is released and requested again (unless shutting down).
 *   A thread that ran a unary handler takes the queued calls (oldest first) before it goes
 *   back to the queue: so a call is queued only while `threads` handlers run, and the queue
 *   drains as they finish. Refused: RESOURCE_EXHAUSTED "server overloaded: ...".
 *
 *   Thread count: threads + 1 at start, one more for each stream that would otherwise leave
 *   no thread waiting on cq (at most threads + max_streams + 1; they stay until shutdown).
 *   Invariant: threads + streams < live threads (running <= threads), so some thread always
 *   waits for calls and Health is answered under any load.
 *
 * Shutdown: grpc_server_shutdown_and_notify() stops new calls (clients get UNAVAILABLE)
 * and fails the requested slots; in-flight handlers finish (queued calls are in flight:
 * they run too); the shutdown tag arrives once no call is left. If that takes longer than
 * grace_ms, grpc_server_cancel_all_calls() makes every pending send fail so that handlers
 * return, and calls still queued are answered CANCELLED without running. Then the queue is
 * shut down and drained and the threads exit.
 *
 * TLS: the PEM files are read and checked with OpenSSL at create time (gRPC would accept a
 * bad file and fail every handshake later with a vaguer message); the server's credentials
 * are made at create and used by start; a channel's when it is created.
 */
#include "mt/rpc.h"

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/time.h>
#include <errno.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mt/log.h"

/* ThreadSanitizer cannot see the synchronization inside Debian's (uninstrumented) gRPC: a
 * slot handed to gRPC with a tag on one thread and taken back from a completion queue on
 * another looks like a race on everything the first thread wrote. The hand-offs say so:
 * TAG_RELEASE before a tag goes into gRPC, TAG_ACQUIRE when an event gives it back (no
 * code outside the tsan build). */
#ifdef MT_TSAN
#include <sanitizer/tsan_interface.h>
#define TAG_RELEASE(tag) __tsan_release(tag)
#define TAG_ACQUIRE(tag) __tsan_acquire(tag)
#else
#define TAG_RELEASE(tag) ((void)(tag))
#define TAG_ACQUIRE(tag) ((void)(tag))
#endif

#define MT__GENERIC_SLOTS 2 /* requested calls for unknown paths */
#define MT__HEALTH_SLOTS  4 /* requested Health/Check calls */
#define MT__SPARE_SLOTS   2 /* per method beyond what it can hold: calls being refused */
#define MT__HEALTH_PATH   "/grpc.health.v1.Health/Check"
#define MT__PEM_MAX_BYTES (1u << 20)

/* ============================== small helpers ============================== */

/* gRPC is initialized once per process and never shut down by this layer: grpc_shutdown()
 * from the last destroy joins gRPC's executor threads, one of which may sit in a 10 s poll
 * after a large write (measured: 4 of 20 destroys stalled 10 s). The OS reclaims it all. */
static pthread_once_t grpc_once = PTHREAD_ONCE_INIT;
static void grpc_init_once(void) {
    grpc_init();
}
static void rpc_init(void) {
    pthread_once(&grpc_once, grpc_init_once);
}

static void int_arg(grpc_arg *a, const char *key, int value) {
    a->type = GRPC_ARG_INTEGER;
    a->key = (char *)key;
    a->value.integer = value;
}

static gpr_timespec deadline_after_ms(int64_t ms) {
    if (ms <= 0) return gpr_inf_future(GPR_CLOCK_MONOTONIC);
    return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(ms, GPR_TIMESPAN));
}

/* Copies a byte buffer into one malloc'd block. @returns 0 or -1 (out of memory / bad). */
static int bb_flatten(grpc_byte_buffer *bb, uint8_t **out, size_t *len) {
    *out = NULL;
    *len = 0;
    if (!bb) return 0;
    grpc_byte_buffer_reader r;
    if (!grpc_byte_buffer_reader_init(&r, bb)) return -1;
    grpc_slice s = grpc_byte_buffer_reader_readall(&r);
    grpc_byte_buffer_reader_destroy(&r);
    size_t n = GRPC_SLICE_LENGTH(s);
    if (n) {
        *out = malloc(n);
        if (!*out) {
            grpc_slice_unref(s);
            return -1;
        }
        memcpy(*out, GRPC_SLICE_START_PTR(s), n);
    }
    *len = n;
    grpc_slice_unref(s);
    return 0;
}

static grpc_byte_buffer *bb_from(const uint8_t *buf, size_t len) {
    grpc_slice s = grpc_slice_from_copied_buffer((const char *)buf, len);
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    return bb;
}

static void status_set(mt_rpc_status_t *st, int code, grpc_slice details) {
    st->code = code;
    size_t n = GRPC_SLICE_LENGTH(details);
    if (n >= sizeof(st->message)) n = sizeof(st->message) - 1;
    memcpy(st->message, GRPC_SLICE_START_PTR(details), n);
    st->message[n] = 0;
}

/* Shuts a pluck queue down, drains it and destroys it. */
static void cq_destroy_pluck(grpc_completion_queue *cq) {
    if (!cq) return;
    grpc_completion_queue_shutdown(cq);
    while (grpc_completion_queue_pluck(cq, NULL, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
           GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(cq);
}

/* ============================== TLS ============================== */

static int is_set(const char *s) {
    return s && *s;
}

/* The PEM texts of a TLS config, NUL-terminated (NULL: unset). */
typedef struct tls_pem {
    char *cert, *key, *ca;
} tls_pem_t;

static void tls_pem_free(tls_pem_t *p) {
    free(p->cert);
    if (p->key) OPENSSL_cleanse(p->key, strlen(p->key));
    free(p->key);
    free(p->ca);
    memset(p, 0, sizeof(*p));
}

/* A key file must not ask for a password (a daemon has nobody to type it). */
static int pem_no_password(char *buf, int size, int rwflag, void *u) {
    return 0;
}

/* Reads the file of tls.<key> into a NUL-terminated string. */
static mt_err_t pem_read(const char *key, const char *path, char **out, char *errbuf,
                         size_t errlen) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) {
        mt_msgf(errbuf, errlen, "tls.%s '%s': cannot open: %s", key, path, strerror(errno));
        return MT_IO;
    }
    char *buf = malloc(MT__PEM_MAX_BYTES + 1);
    if (!buf) {
        fclose(f);
        return MT_NOMEM;
    }
    size_t n = fread(buf, 1, MT__PEM_MAX_BYTES + 1, f);
    int bad = ferror(f);
    int saved = errno;
    fclose(f);
    mt_err_t err = MT_OK;
    if (bad) {
        mt_msgf(errbuf, errlen, "tls.%s '%s': cannot read: %s", key, path, strerror(saved));
        err = MT_IO;
    } else if (n > MT__PEM_MAX_BYTES) {
        mt_msgf(errbuf, errlen, "tls.%s '%s': larger than %u bytes: not a PEM file", key, path,
                MT__PEM_MAX_BYTES);
        err = MT_CONFIG;
    } else if (n == 0 || memchr(buf, 0, n)) {
        mt_msgf(errbuf, errlen, "tls.%s '%s': %s", key, path,
                n ? "binary content: not a PEM file (DER? convert with openssl x509 -outform PEM)"
                  : "empty file");
        err = MT_CONFIG;
    }
    if (err) {
        free(buf);
        return err;
    }
    buf[n] = 0;
    *out = buf;
    return MT_OK;
}

/* The certificates of a PEM text: their number, and the first (caller frees) if asked. */
static int pem_certs(const char *pem, X509 **first) {
    BIO *b = BIO_new_mem_buf(pem, -1);
    int n = 0;
    if (first) *first = NULL;
    X509 *x;
    while (b && (x = PEM_read_bio_X509(b, NULL, pem_no_password, NULL)) != NULL) {
        if (first && n == 0)
            *first = x;
        else
            X509_free(x);
        n++;
    }
    BIO_free(b);
    ERR_clear_error(); /* the end of the text leaves "no start line" queued */
    return n;
}

/* Checks a certificate chain file (and its key, when key_pem is given). */
static mt_err_t check_chain(const char *path, const char *pem, const char *key_path,
                            const char *key_pem, char *errbuf, size_t errlen) {
    X509 *leaf = NULL;
    EVP_PKEY *pk = NULL;
    mt_err_t err = MT_CONFIG;
    if (pem_certs(pem, &leaf) == 0) {
        mt_msgf(errbuf, errlen, "tls.cert_file '%s': no PEM certificate in it", path);
        goto out;
    }
    if (X509_cmp_current_time(X509_get0_notAfter(leaf)) < 0) {
        mt_msgf(errbuf, errlen, "tls.cert_file '%s': the certificate has expired", path);
        goto out;
    }
    if (key_pem) {
        BIO *b = BIO_new_mem_buf(key_pem, -1);
        pk = b ? PEM_read_bio_PrivateKey(b, NULL, pem_no_password, NULL) : NULL;
        BIO_free(b);
        if (!pk) {
            mt_msgf(errbuf, errlen,
                    "tls.key_file '%s': no PEM private key in it (or it is encrypted: daemons "
                    "need an unencrypted key, readable only by their user)",
                    key_path);
            goto out;
        }
        if (X509_check_private_key(leaf, pk) != 1) {
            mt_msgf(errbuf, errlen, "tls.key_file '%s' is not the key of the certificate in '%s'",
                    key_path, path);
            goto out;
        }
    }
    err = MT_OK;
out:
    ERR_clear_error();
    EVP_PKEY_free(pk);
    X509_free(leaf);
    return err;
}

/* Reads and checks the files of @p t for a server or a client into @p out. */
static mt_err_t tls_load(const mt_rpc_tls_config_t *t, int server, tls_pem_t *out, char *errbuf,
                         size_t errlen) {
    memset(out, 0, sizeof(*out));
    if (!t->enabled) return MT_OK;
    int cert = is_set(t->cert_file), key = is_set(t->key_file), ca = is_set(t->ca_file);
    if (server && !cert) {
        mt_msgf(errbuf, errlen, "tls.cert_file: a TLS server needs its certificate chain");
        return MT_CONFIG;
    }
    if (cert != key) {
        mt_msgf(errbuf, errlen, "%s: tls.cert_file and tls.key_file go together",
                cert ? "tls.key_file" : "tls.cert_file");
        return MT_CONFIG;
    }
    if (server && t->client_auth && !ca) {
        mt_msgf(errbuf, errlen,
                "tls.ca_file: tls.client_auth needs the CA of the client certificates");
        return MT_CONFIG;
    }
    mt_err_t err = MT_OK;
    if (cert && (err = pem_read("cert_file", t->cert_file, &out->cert, errbuf, errlen))) goto fail;
    if (key && (err = pem_read("key_file", t->key_file, &out->key, errbuf, errlen))) goto fail;
    if (ca && (err = pem_read("ca_file", t->ca_file, &out->ca, errbuf, errlen))) goto fail;
    if (cert && (err = check_chain(t->cert_file, out->cert, t->key_file, out->key, errbuf, errlen)))
        goto fail;
    if (ca && pem_certs(out->ca, NULL) == 0) {
        mt_msgf(errbuf, errlen, "tls.ca_file '%s': no PEM certificate in it", t->ca_file);
        err = MT_CONFIG;
        goto fail;
    }
    if (server && !t->client_auth) { /* the CA is for client certificates: none asked */
        free(out->ca);
        out->ca = NULL;
    }
    return MT_OK;
fail:
    tls_pem_free(out);
    return err;
}

mt_err_t mt_rpc_tls_check(const mt_rpc_tls_config_t *tls, int server, char *errbuf, size_t errlen) {
    if (!tls) return MT_OK;
    tls_pem_t pem;
    mt_err_t err = tls_load(tls, server, &pem, errbuf, errlen);
    tls_pem_free(&pem);
    return err;
}

/* Server credentials from checked PEM texts (NULL: out of memory / refused by gRPC). */
static grpc_server_credentials *tls_server_creds(const mt_rpc_tls_config_t *t,
                                                 const tls_pem_t *pem) {
    grpc_ssl_pem_key_cert_pair pair = {pem->key, pem->cert};
    return grpc_ssl_server_credentials_create_ex(
        pem->ca, &pair, 1,
        t->client_auth ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                       : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
        NULL);
}

static grpc_channel_credentials *tls_channel_creds(const tls_pem_t *pem) {
    grpc_ssl_pem_key_cert_pair pair = {pem->key, pem->cert};
    return grpc_ssl_credentials_create_ex(pem->ca, pem->cert ? &pair : NULL, NULL, NULL);
}

/* ============================== server ============================== */

/* How a method's calls are admitted (see the top of the file). */
typedef enum kind {
    KIND_UNARY,  /* bounded by threads, then max_queued */
    KIND_STREAM, /* bounded by max_streams, on threads of their own (MT_RPC_STREAMING and
                    MT_RPC_OWN_THREADS methods) */
    KIND_INLINE  /* Health: answered by the receiving thread, never refused */
} kind_t;

typedef struct method {
    char *path;
    char *service; /* "package.Service" */
    int streaming;
    kind_t kind;
    mt_rpc_handler_fn fn;
    void *ud;
    void *handle; /* grpc_server_register_method's */
} method_t;

typedef struct slot {
    struct mt_rpc_server *s;
    method_t *m; /* NULL: generic slot (unknown paths) */
    grpc_call *call;
    gpr_timespec deadline;
    grpc_metadata_array md;
    grpc_call_details details;
    grpc_byte_buffer *payload;
    grpc_completion_queue *ccq;
    int posted;
    struct slot *next; /* in the queue of calls waiting for a thread (qlock) */
} slot_t;

struct mt_rpc_call {
    slot_t *slot;
    int finished;
    int sent_md;
    int broken; /* a send failed: the client is gone */
    char mdval[256];
};

struct mt_rpc_server {
    mt_rpc_server_config_t cfg; /* cfg.tls's paths are not kept (NULL) */
    char *listen;
    grpc_server *server;
    grpc_completion_queue *cq;
    grpc_server_credentials *creds; /* TLS, made at create; released by start / destroy */
    method_t *methods;
    size_t nmethods, cap_methods;
    slot_t *slots;
    size_t nslots;
    _Atomic int serving;
    _Atomic int stopping;
    _Atomic int cancelled; /* shutdown cancelled every call: queued ones are not run */
    _Atomic int active;    /* handlers running (any kind) */
    _Atomic uint64_t rejected, rejected_streams;
    int started, shut;
    /* Admission and threads, guarded by qlock. */
    pthread_mutex_t qlock;
    uint32_t running;      /* threads running unary handlers (and then the queue) */
    uint32_t streams;      /* threads running streaming handlers */
    uint32_t queued;       /* calls in the queue */
    slot_t *qhead, *qtail; /* the queue, oldest first */
    pthread_t *workers;    /* threads + max_streams + 1 entries */
    uint32_t nworkers;     /* started */
    /* Shutdown, guarded by lock. */
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int shutdown_seen; /* the shutdown tag arrived */
    char shutdown_tag; /* its address is the tag */
};

void mt_rpc_server_config_init(mt_rpc_server_config_t *cfg) {
    memset(cfg, 0, sizeof(*cfg));
    cfg->listen = "127.0.0.1:0";
    cfg->threads = 4;
    cfg->max_queued = 16;
    cfg->max_streams = 8;
    cfg->max_message_bytes = 64u << 20;
    cfg->grace_ms = 5000;
}

static void health_check(void *ud, mt_rpc_call_t *c, const uint8_t *req, size_t len);

mt_err_t mt_rpc_server_create(const mt_rpc_server_config_t *cfg, mt_rpc_server_t **out) {
    if (!cfg || !cfg->listen || cfg->threads < 1 || cfg->threads > MT_RPC_MAX_THREADS ||
        cfg->max_queued > MT_RPC_MAX_QUEUED || cfg->max_streams < 1 ||
        cfg->max_streams > MT_RPC_MAX_STREAMS || cfg->max_message_bytes < 1024 ||
        cfg->max_message_bytes > INT32_MAX)
        return MT_CONFIG;
    tls_pem_t pem;
    char msg[512];
    mt_err_t err = tls_load(&cfg->tls, 1, &pem, msg, sizeof(msg));
    if (err) {
        if (err != MT_NOMEM) mt_log(MT_LOG_ERROR, "rpc", "server on %s: %s", cfg->listen, msg);
        return err;
    }
    mt_rpc_server_t *s = calloc(1, sizeof(*s));
    if (!s) {
        tls_pem_free(&pem);
        return MT_NOMEM;
    }
    s->cfg = *cfg;
    s->cfg.tls.cert_file = s->cfg.tls.key_file = s->cfg.tls.ca_file = NULL;
    s->cfg.tls.server_name = NULL;
    s->listen = strdup(cfg->listen);
    if (!s->listen) {
        free(s);
        tls_pem_free(&pem);
        return MT_NOMEM;
    }
    s->cfg.listen = s->listen;
    pthread_mutex_init(&s->lock, NULL);
    pthread_mutex_init(&s->qlock, NULL);
    pthread_cond_init(&s->cond, NULL);
    atomic_init(&s->serving, 1);
    atomic_init(&s->stopping, 0);
    atomic_init(&s->cancelled, 0);
    atomic_init(&s->active, 0);
    atomic_init(&s->rejected, 0);
    atomic_init(&s->rejected_streams, 0);
    rpc_init();
    if (cfg->tls.enabled) {
        s->creds = tls_server_creds(&cfg->tls, &pem);
        tls_pem_free(&pem);
        if (!s->creds) {
            mt_log(MT_LOG_ERROR, "rpc", "server on %s: gRPC refused the TLS credentials",
                   cfg->listen);
            mt_rpc_server_destroy(s);
            return MT_CONFIG;
        }
    }
    grpc_arg args[3];
    int_arg(&args[0], GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, (int)cfg->max_message_bytes);
    int_arg(&args[1], GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, (int)cfg->max_message_bytes);
    /* gRPC sets SO_REUSEPORT by default: two servers on one port would both "bind" and
     * split the connections. A busy port must be an error. */
    int_arg(&args[2], GRPC_ARG_ALLOW_REUSEPORT, 0);
    grpc_channel_args cargs = {3, args};
    s->server = grpc_server_create(&cargs, NULL);
    s->cq = grpc_completion_queue_create_for_next(NULL);
    grpc_server_register_completion_queue(s->server, s->cq, NULL);
    err = mt_rpc_server_add(s, MT__HEALTH_PATH, 0, health_check, s);
    if (err) {
        mt_rpc_server_destroy(s);
        return err;
    }
    s->methods[s->nmethods - 1].kind = KIND_INLINE;
    *out = s;
    return MT_OK;
}

mt_err_t mt_rpc_server_add(mt_rpc_server_t *s, const char *path, int flags, mt_rpc_handler_fn fn,
                           void *ud) {
    if (s->started || !path || path[0] != '/' || !fn) return MT_INVALID;
    if (flags & ~(MT_RPC_STREAMING | MT_RPC_OWN_THREADS)) return MT_INVALID;
    const char *slash = strchr(path + 1, '/');
    if (!slash || slash == path + 1 || !slash[1]) return MT_INVALID;
    for (size_t i = 0; i < s->nmethods; i++)
        if (!strcmp(s->methods[i].path, path)) return MT_INVALID;
    if (s->nmethods == s->cap_methods) {
        size_t c = s->cap_methods ? 2 * s->cap_methods : 16;
        method_t *m = realloc(s->methods, c * sizeof(*m));
        if (!m) return MT_NOMEM;
        s->methods = m;
        s->cap_methods = c;
    }
    method_t *m = &s->methods[s->nmethods];
    memset(m, 0, sizeof(*m));
    m->path = strdup(path);
    m->service = strndup(path + 1, (size_t)(slash - path - 1));
    if (!m->path || !m->service) {
        free(m->path);
        free(m->service);
        return MT_NOMEM;
    }
    m->streaming = (flags & MT_RPC_STREAMING) != 0;
    m->kind = flags ? KIND_STREAM : KIND_UNARY;
    m->fn = fn;
    m->ud = ud;
    m->handle = grpc_server_register_method(s->server, m->path, NULL,
                                            GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER, 0);
    if (!m->handle) {
        free(m->path);
        free(m->service);
        return MT_INVALID;
    }
    s->nmethods++;
    return MT_OK;
}

/* Posts a slot for its next call. @returns 0, or -1 if gRPC refused (shutting down). */
static int slot_post(slot_t *sl) {
    mt_rpc_server_t *s = sl->s;
    grpc_metadata_array_init(&sl->md);
    sl->payload = NULL;
    sl->call = NULL;
    grpc_call_error e;
    if (!sl->m) grpc_call_details_init(&sl->details);
    /* Posted, the slot belongs to gRPC and then to the thread its event reaches: everything
     * of it is written before, nothing after (posted was once set after the request, racing
     * with that thread's slot_release: ThreadSanitizer). */
    sl->posted = 1;
    TAG_RELEASE(sl);
    if (sl->m)
        e = grpc_server_request_registered_call(s->server, sl->m->handle, &sl->call, &sl->deadline,
                                                &sl->md, &sl->payload, sl->ccq, s->cq, sl);
    else
        e = grpc_server_request_call(s->server, &sl->call, &sl->details, &sl->md, sl->ccq, s->cq,
                                     sl);
    if (e == GRPC_CALL_OK) return 0;
    sl->posted = 0; /* not taken: still ours */
    grpc_metadata_array_destroy(&sl->md);
    if (!sl->m) grpc_call_details_destroy(&sl->details);
    return -1;
}

/* Releases what a finished (or failed) request holds. */
static void slot_release(slot_t *sl) {
    if (sl->call) grpc_call_unref(sl->call);
    sl->call = NULL;
    if (sl->payload) grpc_byte_buffer_destroy(sl->payload);
    sl->payload = NULL;
    grpc_metadata_array_destroy(&sl->md);
    if (!sl->m) grpc_call_details_destroy(&sl->details);
    sl->posted = 0;
}

/* Runs one batch on the call and waits for it on the slot's queue. @returns 1 on success. */
static int call_batch(mt_rpc_call_t *c, grpc_op *ops, size_t n) {
    slot_t *sl = c->slot;
    if (grpc_call_start_batch(sl->call, ops, n, ops, NULL) != GRPC_CALL_OK) return 0;
    grpc_event ev =
        grpc_completion_queue_pluck(sl->ccq, ops, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    return ev.type == GRPC_OP_COMPLETE && ev.success;
}

/* Puts SEND_INITIAL_METADATA in ops[0] the first time a call sends anything.
 * @returns the number of ops used (0 or 1). */
static size_t initial_md_op(mt_rpc_call_t *c, grpc_op *ops) {
    if (c->sent_md) return 0;
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    c->sent_md = 1;
    return 1;
}

static void call_finish(mt_rpc_call_t *c, int code, const char *msg, const uint8_t *buf, size_t len,
                        int with_message) {
    if (c->finished) return;
    c->finished = 1;
    grpc_op ops[4];
    memset(ops, 0, sizeof(ops));
    size_t n = initial_md_op(c, ops);
    grpc_byte_buffer *bb = NULL;
    if (with_message && code == MT_RPC_OK && !c->broken) {
        bb = bb_from(buf, len);
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n].data.send_message.send_message = bb;
        n++;
    }
    grpc_slice details = grpc_slice_from_copied_string(msg ? msg : "");
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.status = (grpc_status_code)code;
    ops[n].data.send_status_from_server.status_details = &details;
    n++;
    int cancelled = 0;
    ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    ops[n].data.recv_close_on_server.cancelled = &cancelled;
    n++;
    call_batch(c, ops, n);
    grpc_slice_unref(details);
    if (bb) grpc_byte_buffer_destroy(bb);
}

void mt_rpc_reply(mt_rpc_call_t *c, const uint8_t *buf, size_t len) {
    call_finish(c, MT_RPC_OK, NULL, buf, len, !c->slot->m || !c->slot->m->streaming || buf);
}

void mt_rpc_fail(mt_rpc_call_t *c, int code, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (code == MT_RPC_OK) code = MT_RPC_UNKNOWN;
    call_finish(c, code, msg, NULL, 0, 0);
}

mt_err_t mt_rpc_send(mt_rpc_call_t *c, const uint8_t *buf, size_t len) {
    if (c->finished || c->broken) return MT_CANCELLED;
    grpc_op ops[2];
    memset(ops, 0, sizeof(ops));
    size_t n = initial_md_op(c, ops);
    grpc_byte_buffer *bb = bb_from(buf, len);
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n].data.send_message.send_message = bb;
    n++;
    int ok = call_batch(c, ops, n);
    grpc_byte_buffer_destroy(bb);
    if (!ok) c->broken = 1;
    return ok ? MT_OK : MT_CANCELLED;
}

int64_t mt_rpc_call_remaining_ms(const mt_rpc_call_t *c) {
    gpr_timespec d = gpr_convert_clock_type(c->slot->deadline, GPR_CLOCK_MONOTONIC);
    if (gpr_time_cmp(d, gpr_inf_future(GPR_CLOCK_MONOTONIC)) == 0) return INT64_MAX;
    gpr_timespec left = gpr_time_sub(d, gpr_now(GPR_CLOCK_MONOTONIC));
    return (int64_t)left.tv_sec * 1000 + left.tv_nsec / 1000000;
}

const char *mt_rpc_call_metadata(const mt_rpc_call_t *c, const char *key) {
    const grpc_metadata_array *md = &c->slot->md;
    size_t klen = strlen(key);
    for (size_t i = 0; i < md->count; i++) {
        const grpc_metadata *m = &md->metadata[i];
        if (GRPC_SLICE_LENGTH(m->key) == klen && !memcmp(GRPC_SLICE_START_PTR(m->key), key, klen)) {
            mt_rpc_call_t *mc = (mt_rpc_call_t *)c;
            size_t n = GRPC_SLICE_LENGTH(m->value);
            if (n >= sizeof(mc->mdval)) n = sizeof(mc->mdval) - 1;
            memcpy(mc->mdval, GRPC_SLICE_START_PTR(m->value), n);
            mc->mdval[n] = 0;
            return mc->mdval;
        }
    }
    return NULL;
}

/* grpc.health.v1.Health/Check: "" (or a service of ours) answers SERVING / NOT_SERVING;
 * another service name answers NOT_FOUND, as the protocol says. */
static void health_check(void *ud, mt_rpc_call_t *c, const uint8_t *req, size_t len) {
    mt_rpc_server_t *s = ud;
    if (len > 0) {
        /* HealthCheckRequest: field 1 (tag 0x0A), length-delimited string. */
        if (req[0] != 0x0A || len < 2 || req[1] > 127 || (size_t)req[1] + 2 != len) {
            mt_rpc_fail(c, MT_RPC_INVALID_ARGUMENT, "malformed HealthCheckRequest");
            return;
        }
        size_t n = req[1];
        int known = n == 0;
        for (size_t i = 0; i < s->nmethods && !known; i++)
            known =
                strlen(s->methods[i].service) == n && !memcmp(s->methods[i].service, req + 2, n);
        if (!known) {
            mt_rpc_fail(c, MT_RPC_NOT_FOUND, "unknown service %.*s", (int)n, (const char *)req + 2);
            return;
        }
    }
    uint8_t resp[2] = {0x08, (uint8_t)(atomic_load(&s->serving) ? 1 : 2)};
    mt_rpc_reply(c, resp, sizeof(resp));
}

/* Runs the call of a slot: its handler, or the answer to an unknown path. @p queued: the
 * call waited in the queue (one whose deadline passed meanwhile is not handled). */
static void handle_call(slot_t *sl, int queued) {
    mt_rpc_call_t c;
    memset(&c, 0, sizeof(c));
    c.slot = sl;
    if (!sl->m) {
        char path[256];
        size_t n = GRPC_SLICE_LENGTH(sl->details.method);
        if (n >= sizeof(path)) n = sizeof(path) - 1;
        memcpy(path, GRPC_SLICE_START_PTR(sl->details.method), n);
        path[n] = 0;
        mt_rpc_fail(&c, MT_RPC_UNIMPLEMENTED, "unknown method %s", path);
        return;
    }
    if (queued && mt_rpc_call_remaining_ms(&c) <= 0) {
        mt_rpc_fail(&c, MT_RPC_DEADLINE_EXCEEDED, "%s: the deadline passed in the queue",
                    sl->m->path);
        return;
    }
    if (queued && atomic_load(&sl->s->cancelled)) { /* past the grace period */
        mt_rpc_fail(&c, MT_RPC_CANCELLED, "%s: the server stopped", sl->m->path);
        return;
    }
    uint8_t *req = NULL;
    size_t len = 0;
    if (!sl->payload) {
        mt_rpc_fail(&c, MT_RPC_INVALID_ARGUMENT, "%s: no request message", sl->m->path);
        return;
    }
    if (bb_flatten(sl->payload, &req, &len) != 0) {
        mt_rpc_fail(&c, MT_RPC_RESOURCE_EXHAUSTED, "%s: cannot read the request", sl->m->path);
        return;
    }
    sl->m->fn(sl->m->ud, &c, req ? req : (const uint8_t *)"", len);
    if (!c.finished) mt_rpc_fail(&c, MT_RPC_INTERNAL, "%s: handler did not answer", sl->m->path);
    free(req);
}

/* Releases the slot's call and requests the next one (unless shutting down). */
static void slot_recycle(slot_t *sl) {
    slot_release(sl);
    if (!atomic_load(&sl->s->stopping)) slot_post(sl);
}

static void *worker_main(void *arg);

/* Keeps one thread waiting on cq however many handlers run: live threads must exceed
 * threads + streams (unary handlers may take `threads` of them at any time). Starts one
 * more after a stream was admitted if needed. Caller holds qlock. */
static void ensure_listener_qlocked(mt_rpc_server_t *s) {
    uint32_t cap = s->cfg.threads + s->cfg.max_streams + 1;
    if (s->cfg.threads + s->streams < s->nworkers || s->nworkers >= cap) return;
    if (pthread_create(&s->workers[s->nworkers], NULL, worker_main, s) == 0)
        s->nworkers++;
    else
        mt_log(MT_LOG_WARN, "rpc", "cannot start a server thread: Health may wait under load");
}

/* Answers a call the bounds do not admit. */
static void refuse(slot_t *sl, int stream, uint32_t n) {
    mt_rpc_server_t *s = sl->s;
    atomic_fetch_add(&s->rejected, 1);
    if (stream) atomic_fetch_add(&s->rejected_streams, 1);
    mt_rpc_call_t c;
    memset(&c, 0, sizeof(c));
    c.slot = sl;
    if (stream)
        mt_rpc_fail(&c, MT_RPC_RESOURCE_EXHAUSTED, "server overloaded: %u streams open", n);
    else
        mt_rpc_fail(&c, MT_RPC_RESOURCE_EXHAUSTED, "server overloaded: %u calls queued", n);
    slot_recycle(sl);
}

/* A call arrived on slot @p sl: admit it (run it here, or queue it) or refuse it. */
static void dispatch(mt_rpc_server_t *s, slot_t *sl) {
    kind_t kind = sl->m ? sl->m->kind : KIND_INLINE;
    if (kind == KIND_INLINE) {
        atomic_fetch_add(&s->active, 1);
        handle_call(sl, 0);
        atomic_fetch_sub(&s->active, 1);
        slot_recycle(sl);
        return;
    }
    pthread_mutex_lock(&s->qlock);
    if (kind == KIND_STREAM) {
        if (s->streams >= s->cfg.max_streams) {
            uint32_t n = s->streams;
            pthread_mutex_unlock(&s->qlock);
            refuse(sl, 1, n);
            return;
        }
        s->streams++;
        ensure_listener_qlocked(s);
        pthread_mutex_unlock(&s->qlock);
        atomic_fetch_add(&s->active, 1);
        handle_call(sl, 0);
        atomic_fetch_sub(&s->active, 1);
        slot_recycle(sl);
        pthread_mutex_lock(&s->qlock);
        s->streams--;
        pthread_mutex_unlock(&s->qlock);
        return;
    }
    if (s->running >= s->cfg.threads) {
        if (s->queued >= s->cfg.max_queued) {
            uint32_t n = s->queued;
            pthread_mutex_unlock(&s->qlock);
            refuse(sl, 0, n);
            return;
        }
        sl->next = NULL;
        if (s->qtail)
            s->qtail->next = sl;
        else
            s->qhead = sl;
        s->qtail = sl;
        s->queued++;
        pthread_mutex_unlock(&s->qlock);
        return;
    }
    s->running++;
    pthread_mutex_unlock(&s->qlock);
    atomic_fetch_add(&s->active, 1);
    handle_call(sl, 0);
    slot_recycle(sl);
    /* Then the calls that queued meanwhile: a thread leaves `running` only with the queue
     * empty, so a queued call always has a thread coming for it. */
    for (;;) {
        pthread_mutex_lock(&s->qlock);
        slot_t *q = s->qhead;
        if (!q) {
            s->running--;
            pthread_mutex_unlock(&s->qlock);
            break;
        }
        s->qhead = q->next;
        if (!s->qhead) s->qtail = NULL;
        s->queued--;
        pthread_mutex_unlock(&s->qlock);
        handle_call(q, 1);
        slot_recycle(q);
    }
    atomic_fetch_sub(&s->active, 1);
}

static void *worker_main(void *arg) {
    mt_rpc_server_t *s = arg;
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN) break;
        if (ev.type != GRPC_OP_COMPLETE) continue;
        TAG_ACQUIRE(ev.tag);
        if (ev.tag == &s->shutdown_tag) {
            pthread_mutex_lock(&s->lock);
            s->shutdown_seen = 1;
            pthread_cond_broadcast(&s->cond);
            pthread_mutex_unlock(&s->lock);
            continue;
        }
        slot_t *sl = ev.tag;
        if (!ev.success) { /* the server is shutting down: this request never got a call */
            slot_release(sl);
            continue;
        }
        dispatch(s, sl);
    }
    return NULL;
}

/* Requested calls a method keeps: what it can hold at once, plus spares being refused. */
static size_t method_slots(const mt_rpc_server_t *s, const method_t *m) {
    switch (m->kind) {
    case KIND_UNARY: return (size_t)s->cfg.threads + s->cfg.max_queued + MT__SPARE_SLOTS;
    case KIND_STREAM: return (size_t)s->cfg.max_streams + MT__SPARE_SLOTS;
    case KIND_INLINE: break;
    }
    return MT__HEALTH_SLOTS;
}

mt_err_t mt_rpc_server_start(mt_rpc_server_t *s, int *port) {
    if (s->started) return MT_INVALID;
    grpc_server_credentials *creds =
        s->creds ? s->creds : grpc_insecure_server_credentials_create();
    s->creds = NULL;
    int p = grpc_server_add_http2_port(s->server, s->listen, creds);
    grpc_server_credentials_release(creds);
    if (p <= 0) return MT_IO;
    s->nslots = MT__GENERIC_SLOTS;
    for (size_t i = 0; i < s->nmethods; i++)
        s->nslots += method_slots(s, &s->methods[i]);
    s->slots = calloc(s->nslots, sizeof(slot_t));
    s->workers = calloc((size_t)s->cfg.threads + s->cfg.max_streams + 1, sizeof(pthread_t));
    if (!s->slots || !s->workers) return MT_NOMEM;
    size_t k = 0;
    for (size_t i = 0; i < s->nmethods; i++)
        for (size_t j = method_slots(s, &s->methods[i]); j > 0; j--)
            s->slots[k++].m = &s->methods[i];
    for (size_t i = 0; i < s->nslots; i++) { /* the last MT__GENERIC_SLOTS keep m = NULL */
        slot_t *sl = &s->slots[i];
        sl->s = s;
        sl->ccq = grpc_completion_queue_create_for_pluck(NULL);
        if (!sl->ccq) return MT_NOMEM;
    }
    grpc_server_start(s->server);
    s->started = 1;
    for (size_t i = 0; i < s->nslots; i++)
        if (slot_post(&s->slots[i]) != 0) return MT_INTERNAL;
    /* threads + 1: one always waits for calls while `threads` handlers run. */
    pthread_mutex_lock(&s->qlock);
    for (uint32_t i = 0; i < s->cfg.threads + 1; i++) {
        if (pthread_create(&s->workers[i], NULL, worker_main, s) != 0) break;
        s->nworkers++;
    }
    uint32_t n = s->nworkers;
    pthread_mutex_unlock(&s->qlock);
    if (n < s->cfg.threads + 1) return MT_NOMEM;
    if (port) *port = p;
    return MT_OK;
}

void mt_rpc_server_set_serving(mt_rpc_server_t *s, int serving) {
    atomic_store(&s->serving, serving ? 1 : 0);
}

void mt_rpc_server_stats(mt_rpc_server_t *s, mt_rpc_server_stats_t *out) {
    memset(out, 0, sizeof(*out));
    if (!s) return;
    out->rejected = atomic_load(&s->rejected);
    out->rejected_streams = atomic_load(&s->rejected_streams);
    pthread_mutex_lock(&s->qlock);
    out->running = s->running;
    out->queued = s->queued;
    out->streams = s->streams;
    pthread_mutex_unlock(&s->qlock);
}

int mt_rpc_server_render_metrics(mt_rpc_server_t *s, const char *prefix, const char *labels,
                                 char *buf, size_t len) {
    mt_rpc_server_stats_t st;
    mt_rpc_server_stats(s, &st);
    const char *o = *labels ? "{" : "", *c = *labels ? "}" : "";
    return snprintf(
        buf, len,
        "# HELP %s_rejected_total Calls answered RESOURCE_EXHAUSTED because the server was "
        "full (queue or streams).\n"
        "# TYPE %s_rejected_total counter\n"
        "%s_rejected_total%s%s%s %llu\n"
        "# HELP %s_rejected_streams_total Streaming calls refused: max_streams open.\n"
        "# TYPE %s_rejected_streams_total counter\n"
        "%s_rejected_streams_total%s%s%s %llu\n"
        "# HELP %s_queued_calls Calls waiting for a thread.\n"
        "# TYPE %s_queued_calls gauge\n"
        "%s_queued_calls%s%s%s %u\n"
        "# HELP %s_open_streams Streaming calls running.\n"
        "# TYPE %s_open_streams gauge\n"
        "%s_open_streams%s%s%s %u\n",
        prefix, prefix, prefix, o, labels, c, (unsigned long long)st.rejected, prefix, prefix,
        prefix, o, labels, c, (unsigned long long)st.rejected_streams, prefix, prefix, prefix, o,
        labels, c, st.queued, prefix, prefix, prefix, o, labels, c, st.streams);
}

void mt_rpc_server_shutdown(mt_rpc_server_t *s) {
    if (!s) return;
    pthread_mutex_lock(&s->lock);
    if (s->shut || !s->started) {
        s->shut = 1;
        pthread_mutex_unlock(&s->lock);
        return;
    }
    s->shut = 1;
    pthread_mutex_unlock(&s->lock);
    atomic_store(&s->stopping, 1);
    atomic_store(&s->serving, 0);
    TAG_RELEASE(&s->shutdown_tag);
    grpc_server_shutdown_and_notify(s->server, s->cq, &s->shutdown_tag);
    /* Wait for in-flight handlers, at most grace_ms. Once none is running, cancel what is
     * left at once: a call that raced with the shutdown can stay queued inside gRPC core
     * until cancelled (seen in tests), and nobody would ever handle it. */
    double waited_ms = 0;
    int idle = 0, cancelled = 0;
    for (;;) {
        pthread_mutex_lock(&s->lock);
        int done = s->shutdown_seen;
        pthread_mutex_unlock(&s->lock);
        if (done) break;
        idle = atomic_load(&s->active) == 0 ? idle + 1 : 0;
        if (!cancelled && (idle >= 3 || waited_ms >= s->cfg.grace_ms)) {
            atomic_store(&s->cancelled, 1);
            grpc_server_cancel_all_calls(s->server);
            cancelled = 1;
        }
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
        waited_ms += 10;
    }
    grpc_completion_queue_shutdown(s->cq);
    /* A thread may start another (a stream) until it sees the queue shut down. */
    for (uint32_t i = 0;; i++) {
        pthread_mutex_lock(&s->qlock);
        int more = i < s->nworkers;
        pthread_t t = more ? s->workers[i] : (pthread_t)0;
        pthread_mutex_unlock(&s->qlock);
        if (!more) break;
        pthread_join(t, NULL);
    }
    pthread_mutex_lock(&s->qlock);
    s->nworkers = 0;
    pthread_mutex_unlock(&s->qlock);
}

void mt_rpc_server_destroy(mt_rpc_server_t *s) {
    if (!s) return;
    mt_rpc_server_shutdown(s);
    if (s->creds) grpc_server_credentials_release(s->creds);
    if (!s->started && s->cq) grpc_completion_queue_shutdown(s->cq);
    if (s->server) grpc_server_destroy(s->server);
    if (s->cq) {
        while (grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
               GRPC_QUEUE_SHUTDOWN) {
        }
        grpc_completion_queue_destroy(s->cq);
    }
    if (s->slots)
        for (size_t i = 0; i < s->nslots; i++)
            cq_destroy_pluck(s->slots[i].ccq);
    for (size_t i = 0; i < s->nmethods; i++) {
        free(s->methods[i].path);
        free(s->methods[i].service);
    }
    free(s->methods);
    free(s->slots);
    free(s->workers);
    free(s->listen);
    pthread_mutex_destroy(&s->lock);
    pthread_mutex_destroy(&s->qlock);
    pthread_cond_destroy(&s->cond);
    free(s);
}

/* ============================== client ============================== */

struct mt_rpc_channel {
    grpc_channel *ch;
    mt_rpc_client_config_t cfg;
};

struct mt_rpc_stream {
    grpc_call *call;
    grpc_completion_queue *cq;
    grpc_metadata_array md_initial, md_trailing;
    int ended;
};

void mt_rpc_client_config_init(mt_rpc_client_config_t *cfg) {
    memset(cfg, 0, sizeof(*cfg));
    cfg->max_message_bytes = 64u << 20;
    cfg->retries = 3;
    cfg->backoff_ms = 50;
    cfg->backoff_max_ms = 2000;
}

mt_err_t mt_rpc_channel_create(const char *target, const mt_rpc_client_config_t *cfg,
                               mt_rpc_channel_t **out) {
    mt_rpc_client_config_t def;
    if (!cfg) {
        mt_rpc_client_config_init(&def);
        cfg = &def;
    }
    if (!target || !*target || cfg->max_message_bytes < 1024 || cfg->max_message_bytes > INT32_MAX)
        return MT_CONFIG;
    tls_pem_t pem;
    char msg[512];
    mt_err_t err = tls_load(&cfg->tls, 0, &pem, msg, sizeof(msg));
    if (err) {
        if (err != MT_NOMEM) mt_log(MT_LOG_ERROR, "rpc", "channel to %s: %s", target, msg);
        return err;
    }
    mt_rpc_channel_t *c = calloc(1, sizeof(*c));
    if (!c) {
        tls_pem_free(&pem);
        return MT_NOMEM;
    }
    c->cfg = *cfg;
    c->cfg.tls.cert_file = c->cfg.tls.key_file = c->cfg.tls.ca_file = NULL; /* not kept */
    c->cfg.tls.server_name = NULL;
    rpc_init();
    grpc_arg args[5];
    int_arg(&args[0], GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, (int)cfg->max_message_bytes);
    int_arg(&args[1], GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, (int)cfg->max_message_bytes);
    /* gRPC's own reconnect backoff (about 1 s) would make our retries inside that window
     * fail at once without connecting: align it with ours. (GRPC_ARG_MIN_RECONNECT_BACKOFF_MS
     * is the minimum connect timeout in this version, not a backoff: left alone.) */
    int_arg(&args[2], GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS,
            (int)(cfg->backoff_ms ? cfg->backoff_ms : 1));
    int_arg(&args[3], GRPC_ARG_MAX_RECONNECT_BACKOFF_MS,
            (int)(cfg->backoff_max_ms ? cfg->backoff_max_ms : 1));
    grpc_channel_args cargs = {4, args};
    if (cfg->tls.enabled && is_set(cfg->tls.server_name)) {
        args[4].type = GRPC_ARG_STRING;
        args[4].key = (char *)GRPC_SSL_TARGET_NAME_OVERRIDE_ARG;
        args[4].value.string = (char *)cfg->tls.server_name;
        cargs.num_args = 5;
    }
    grpc_channel_credentials *creds =
        cfg->tls.enabled ? tls_channel_creds(&pem) : grpc_insecure_credentials_create();
    tls_pem_free(&pem);
    if (!creds) {
        mt_log(MT_LOG_ERROR, "rpc", "channel to %s: gRPC refused the TLS credentials", target);
        free(c);
        return MT_CONFIG;
    }
    c->ch = grpc_channel_create(target, creds, &cargs);
    grpc_channel_credentials_release(creds);
    if (!c->ch) {
        free(c);
        return MT_NOMEM;
    }
    *out = c;
    return MT_OK;
}

void mt_rpc_channel_destroy(mt_rpc_channel_t *c) {
    if (!c) return;
    grpc_channel_destroy(c->ch);
    free(c);
}

/* One attempt of a unary call, started on cq with tag `a`. */
typedef struct attempt {
    grpc_call *call;
    grpc_metadata_array md_initial, md_trailing;
    grpc_byte_buffer *req_bb, *resp_bb;
    grpc_status_code status;
    grpc_slice details;
    grpc_op ops[6];
} attempt_t;

static int attempt_start(attempt_t *a, mt_rpc_channel_t *ch, grpc_completion_queue *cq,
                         const char *path, const uint8_t *req, size_t len, gpr_timespec deadline) {
    memset(a, 0, sizeof(*a));
    /* Copied: a static slice's bytes must live for ever (gRPC's header compression keeps
     * the pointer and compares later paths with it), and path may be the caller's buffer
     * (regression: test_e2e_serving's call() builds it on its stack; under ASan a
     * stack-buffer-overflow in memcmp, from serving::long_request_ids_are_refused on). */
    grpc_slice method = grpc_slice_from_copied_string(path);
    a->call = grpc_channel_create_call(ch->ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq, method, NULL,
                                       deadline, NULL);
    grpc_slice_unref(method);
    if (!a->call) return -1;
    grpc_metadata_array_init(&a->md_initial);
    grpc_metadata_array_init(&a->md_trailing);
    a->req_bb = bb_from(req, len);
    a->details = grpc_empty_slice();
    grpc_op *op = a->ops;
    op[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    op[1].op = GRPC_OP_SEND_MESSAGE;
    op[1].data.send_message.send_message = a->req_bb;
    op[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    op[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    op[3].data.recv_initial_metadata.recv_initial_metadata = &a->md_initial;
    op[4].op = GRPC_OP_RECV_MESSAGE;
    op[4].data.recv_message.recv_message = &a->resp_bb;
    op[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    op[5].data.recv_status_on_client.trailing_metadata = &a->md_trailing;
    op[5].data.recv_status_on_client.status = &a->status;
    op[5].data.recv_status_on_client.status_details = &a->details;
    TAG_RELEASE(a);
    if (grpc_call_start_batch(a->call, a->ops, 6, a, NULL) != GRPC_CALL_OK) {
        grpc_call_unref(a->call);
        a->call = NULL;
        grpc_byte_buffer_destroy(a->req_bb);
        grpc_metadata_array_destroy(&a->md_initial);
        grpc_metadata_array_destroy(&a->md_trailing);
        return -1;
    }
    return 0;
}

/* Collects a finished attempt into status and response; frees the attempt. */
static void attempt_finish(attempt_t *a, mt_rpc_status_t *st, uint8_t **resp, size_t *resp_len) {
    status_set(st, (int)a->status, a->details);
    *resp = NULL;
    *resp_len = 0;
    if (a->status == GRPC_STATUS_OK && bb_flatten(a->resp_bb, resp, resp_len) != 0) {
        st->code = MT_RPC_RESOURCE_EXHAUSTED;
        snprintf(st->message, sizeof(st->message), "out of memory reading the response");
    }
    if (a->resp_bb) grpc_byte_buffer_destroy(a->resp_bb);
    grpc_byte_buffer_destroy(a->req_bb);
    grpc_slice_unref(a->details);
    grpc_metadata_array_destroy(&a->md_initial);
    grpc_metadata_array_destroy(&a->md_trailing);
    grpc_call_unref(a->call);
}

static void sleep_ms(uint32_t ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static mt_err_t status_err(const mt_rpc_status_t *st) {
    if (st->code == MT_RPC_DEADLINE_EXCEEDED) return MT_TIMEOUT;
    if (st->code == MT_RPC_UNAVAILABLE) return MT_UNAVAILABLE;
    return MT_OK;
}

mt_err_t mt_rpc_call(mt_rpc_channel_t *ch, const char *path, const uint8_t *req, size_t len,
                     int64_t deadline_ms, uint8_t **resp, size_t *resp_len, mt_rpc_status_t *st) {
    mt_rpc_batch_call_t c = {.ch = ch, .path = path, .req = req, .len = len};
    mt_err_t err = mt_rpc_call_many(&c, 1, deadline_ms);
    *st = c.st;
    *resp = c.resp;
    *resp_len = c.resp_len;
    return err ? err : status_err(st);
}

/* A protobuf varint at *p (< end): @returns its value and moves *p past it; *ok = 0 when it
 * runs past end or over 10 bytes. */
static uint64_t read_varint(const uint8_t **p, const uint8_t *end, int *ok) {
    uint64_t v = 0;
    for (int shift = 0; shift < 70; shift += 7) {
        if (*p >= end) break;
        uint8_t b = *(*p)++;
        v |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80)) return v;
    }
    *ok = 0;
    return 0;
}

int mt_rpc_serving(mt_rpc_channel_t *ch, int64_t deadline_ms) {
    uint8_t *resp = NULL;
    size_t rlen = 0;
    mt_rpc_status_t st;
    if (mt_rpc_call(ch, MT__HEALTH_PATH, NULL, 0, deadline_ms, &resp, &rlen, &st) != MT_OK ||
        st.code != MT_RPC_OK) {
        free(resp);
        return 0;
    }
    /* HealthCheckResponse: status = field 1, a varint (SERVING = 1); an absent field is
     * UNKNOWN (0); other fields are skipped, as a protobuf reader does. */
    uint64_t status = 0;
    int ok = 1;
    const uint8_t *p = resp, *end = resp + rlen;
    while (ok && p < end) {
        uint64_t key = read_varint(&p, end, &ok);
        if (!ok) break;
        if ((key & 7) == 0) {
            uint64_t v = read_varint(&p, end, &ok);
            if (key >> 3 == 1) status = v;
        } else if ((key & 7) == 2) {
            uint64_t n = read_varint(&p, end, &ok);
            if (n > (uint64_t)(end - p))
                ok = 0;
            else
                p += n;
        } else if ((key & 7) == 1 || (key & 7) == 5) { /* 64- or 32-bit: skipped */
            size_t n = (key & 7) == 1 ? 8 : 4;
            if (n > (size_t)(end - p))
                ok = 0;
            else
                p += n;
        } else {
            ok = 0; /* groups (3, 4) and unknown wire types */
        }
    }
    free(resp);
    return ok && status == 1;
}

mt_err_t mt_rpc_call_many(mt_rpc_batch_call_t *calls, size_t n, int64_t deadline_ms) {
    return mt_rpc_call_many_overlap(calls, n, deadline_ms, NULL, NULL);
}

mt_err_t mt_rpc_call_many_overlap(mt_rpc_batch_call_t *calls, size_t n, int64_t deadline_ms,
                                  void (*meanwhile)(void *ud), void *ud) {
    if (n == 0) {
        if (meanwhile) meanwhile(ud);
        return MT_OK;
    }
    gpr_timespec deadline = deadline_after_ms(deadline_ms);
    attempt_t *at = calloc(n, sizeof(*at));
    uint8_t *retry = calloc(n, 1); /* 1: the call needs an attempt */
    if (!at || !retry) {
        free(at);
        free(retry);
        if (meanwhile) meanwhile(ud);
        return MT_NOMEM;
    }
    grpc_completion_queue *cq = grpc_completion_queue_create_for_next(NULL);
    uint32_t backoff = calls[0].ch->cfg.backoff_ms, tries = 0;
    for (size_t i = 0; i < n; i++) {
        retry[i] = 1;
        calls[i].resp = NULL;
        calls[i].resp_len = 0;
        memset(&calls[i].st, 0, sizeof(calls[i].st));
    }
    for (;;) {
        size_t inflight = 0;
        for (size_t i = 0; i < n; i++) {
            if (!retry[i]) continue;
            if (attempt_start(&at[i], calls[i].ch, cq, calls[i].path, calls[i].req, calls[i].len,
                              deadline) == 0) {
                inflight++;
            } else {
                retry[i] = 0;
                calls[i].st.code = MT_RPC_INTERNAL;
                snprintf(calls[i].st.message, sizeof(calls[i].st.message), "cannot start the call");
            }
        }
        if (meanwhile) { /* the first attempts are on their way */
            meanwhile(ud);
            meanwhile = NULL;
        }
        while (inflight > 0) {
            grpc_event ev =
                grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
            if (ev.type != GRPC_OP_COMPLETE) continue;
            TAG_ACQUIRE(ev.tag);
            attempt_t *a = ev.tag;
            size_t i = (size_t)(a - at);
            attempt_finish(a, &calls[i].st, &calls[i].resp, &calls[i].resp_len);
            retry[i] = calls[i].st.code == MT_RPC_UNAVAILABLE;
            inflight--;
        }
        size_t again = 0;
        for (size_t i = 0; i < n; i++)
            again += retry[i];
        if (!again || tries >= calls[0].ch->cfg.retries) break;
        /* Back off, but never past the deadline. */
        gpr_timespec left = gpr_time_sub(deadline, gpr_now(GPR_CLOCK_MONOTONIC));
        int64_t left_ms = (int64_t)left.tv_sec * 1000 + left.tv_nsec / 1000000;
        if (deadline_ms > 0 && left_ms <= (int64_t)backoff) break;
        sleep_ms(backoff);
        tries++;
        backoff = backoff * 2 < calls[0].ch->cfg.backoff_max_ms ? backoff * 2
                                                                : calls[0].ch->cfg.backoff_max_ms;
    }
    grpc_completion_queue_shutdown(cq);
    while (grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
           GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(cq);
    free(at);
    free(retry);
    return MT_OK;
}

mt_err_t mt_rpc_stream_open(mt_rpc_channel_t *ch, const char *path, const uint8_t *req, size_t len,
                            int64_t deadline_ms, mt_rpc_stream_t **out) {
    mt_rpc_stream_t *s = calloc(1, sizeof(*s));
    if (!s) return MT_NOMEM;
    s->cq = grpc_completion_queue_create_for_pluck(NULL);
    grpc_slice method = grpc_slice_from_copied_string(path); /* as in attempt_start */
    s->call = grpc_channel_create_call(ch->ch, NULL, GRPC_PROPAGATE_DEFAULTS, s->cq, method, NULL,
                                       deadline_after_ms(deadline_ms), NULL);
    grpc_slice_unref(method);
    grpc_metadata_array_init(&s->md_initial);
    grpc_metadata_array_init(&s->md_trailing);
    if (!s->call) {
        mt_rpc_stream_close(s, NULL);
        return MT_INTERNAL;
    }
    grpc_byte_buffer *bb = bb_from(req, len);
    grpc_op ops[4];
    memset(ops, 0, sizeof(ops));
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = bb;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &s->md_initial;
    int ok = grpc_call_start_batch(s->call, ops, 4, ops, NULL) == GRPC_CALL_OK;
    if (ok) {
        grpc_event ev =
            grpc_completion_queue_pluck(s->cq, ops, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        ok = ev.type == GRPC_OP_COMPLETE;
        /* ev.success is 0 if the server failed at once: the status tells why (close). */
        if (ok && !ev.success) s->ended = 1;
    }
    grpc_byte_buffer_destroy(bb);
    if (!ok) {
        mt_rpc_stream_close(s, NULL);
        return MT_INTERNAL;
    }
    *out = s;
    return MT_OK;
}

mt_err_t mt_rpc_stream_next(mt_rpc_stream_t *s, uint8_t **buf, size_t *len) {
    *buf = NULL;
    *len = 0;
    if (s->ended) return MT_NOT_FOUND;
    grpc_byte_buffer *bb = NULL;
    grpc_op op;
    memset(&op, 0, sizeof(op));
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &bb;
    if (grpc_call_start_batch(s->call, &op, 1, &op, NULL) != GRPC_CALL_OK) return MT_CANCELLED;
    grpc_event ev =
        grpc_completion_queue_pluck(s->cq, &op, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    if (ev.type != GRPC_OP_COMPLETE || !ev.success || !bb) {
        if (bb) grpc_byte_buffer_destroy(bb);
        s->ended = 1;
        return ev.success ? MT_NOT_FOUND : MT_CANCELLED;
    }
    int rc = bb_flatten(bb, buf, len);
    grpc_byte_buffer_destroy(bb);
    return rc == 0 ? MT_OK : MT_NOMEM;
}

void mt_rpc_stream_close(mt_rpc_stream_t *s, mt_rpc_status_t *st) {
    if (!s) return;
    if (s->call) {
        if (!s->ended) grpc_call_cancel(s->call, NULL);
        grpc_status_code code = GRPC_STATUS_UNKNOWN;
        grpc_slice details = grpc_empty_slice();
        grpc_op op;
        memset(&op, 0, sizeof(op));
        op.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
        op.data.recv_status_on_client.trailing_metadata = &s->md_trailing;
        op.data.recv_status_on_client.status = &code;
        op.data.recv_status_on_client.status_details = &details;
        if (grpc_call_start_batch(s->call, &op, 1, &op, NULL) == GRPC_CALL_OK)
            grpc_completion_queue_pluck(s->cq, &op, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (st) status_set(st, (int)code, details);
        grpc_slice_unref(details);
        grpc_call_unref(s->call);
    } else if (st) {
        st->code = MT_RPC_INTERNAL;
        snprintf(st->message, sizeof(st->message), "stream was never opened");
    }
    grpc_metadata_array_destroy(&s->md_initial);
    grpc_metadata_array_destroy(&s->md_trailing);
    cq_destroy_pluck(s->cq);
    free(s);
}
