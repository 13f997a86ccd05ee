/*
 * producer.c - a thin producer over librdkafka: copies each message into librdkafka's queue,
 * counts delivery reports, and turns "queue full" into a bounded wait.
 *
 * Delivery reports run inside rd_kafka_poll()/rd_kafka_flush(), on whichever thread calls
 * mt_kafka_produce() or mt_kafka_producer_flush(); the counters they touch are atomics, so
 * any number of threads may produce at once (librdkafka's producer is thread-safe).
 */
#include <stdatomic.h>
#include <stdlib.h>

#include "kafka_int.h"
#include "mt/kafka.h"
#include "mt/log.h"

#define DESTROY_FLUSH_MS   5000
#define QUEUE_FULL_POLL_MS 100

struct mt_kafka_producer {
    rd_kafka_t *rk;
    _Atomic uint64_t delivered;
    _Atomic uint64_t failed;
    _Atomic uint64_t failed_unreported; /* failures the next flush reports (then zeroed) */
    _Atomic uint64_t errors;            /* client-level errors (error_cb) */
};

static void dr_msg_cb(rd_kafka_t *rk, const rd_kafka_message_t *rkm, void *opaque) {
    mt_kafka_producer_t *p = opaque;
    if (!rkm->err) {
        atomic_fetch_add_explicit(&p->delivered, 1, memory_order_relaxed);
        return;
    }
    uint64_t n = atomic_fetch_add_explicit(&p->failed, 1, memory_order_relaxed) + 1;
    atomic_fetch_add_explicit(&p->failed_unreported, 1, memory_order_relaxed);
    if (n <= 10 || n % 1000 == 0)
        mt_log(MT_LOG_WARN, MT__KAFKA_WHO, "%s: delivery to %s [%d] failed (%llu so far): %s",
               rd_kafka_name(rk), rd_kafka_topic_name(rkm->rkt), (int)rkm->partition,
               (unsigned long long)n, rd_kafka_err2str(rkm->err));
}

static void error_cb(rd_kafka_t *rk, int err, const char *reason, void *opaque) {
    mt_kafka_producer_t *p = opaque;
    uint64_t n = atomic_fetch_add_explicit(&p->errors, 1, memory_order_relaxed) + 1;
    /* Connection failures are already logged by librdkafka (FAIL lines). */
    if (err != RD_KAFKA_RESP_ERR__TRANSPORT && (n <= 10 || n % 1000 == 0))
        mt_log(MT_LOG_WARN, MT__KAFKA_WHO, "%s: %s: %s", rd_kafka_name(rk),
               rd_kafka_err2name((rd_kafka_resp_err_t)err), reason);
}

mt_err_t mt_kafka_producer_create(const char *bootstrap, const char *const *conf,
                                  mt_kafka_producer_t **out, char *errbuf, size_t errlen) {
    mt__kafka_errf(errbuf, errlen, "%s", "");
    if (!out || !bootstrap || !*bootstrap) {
        mt__kafka_errf(errbuf, errlen, "a bootstrap \"host:port[,...]\" is needed");
        return MT_INVALID;
    }
    /* murmur2_random: the Java clients' partitioner for keyed messages (NULL keys spread at
     * random), so a key lands where any other client of the topics would put it. */
    static const char *const defaults[] = {"client.id=monolith", "partitioner=murmur2_random",
                                           "acks=all", NULL};
    rd_kafka_conf_t *rconf = NULL;
    mt_kafka_producer_t *p = calloc(1, sizeof(*p));
    if (!p) return MT_NOMEM;
    mt_err_t rc = mt__kafka_conf_new(defaults, conf, &rconf, errbuf, errlen);
    if (!rc) rc = mt__kafka_conf_set(rconf, "bootstrap.servers", bootstrap, errbuf, errlen);
    if (rc) goto fail;
    rd_kafka_conf_set_dr_msg_cb(rconf, dr_msg_cb);
    rd_kafka_conf_set_error_cb(rconf, error_cb);
    rd_kafka_conf_set_opaque(rconf, p);
    char errstr[512];
    p->rk = rd_kafka_new(RD_KAFKA_PRODUCER, rconf, errstr, sizeof(errstr));
    if (!p->rk) {
        mt__kafka_errf(errbuf, errlen, "cannot create a producer: %s", errstr);
        rc = MT_INTERNAL;
        goto fail;
    }
    *out = p;
    return MT_OK;
fail:
    if (rconf) rd_kafka_conf_destroy(rconf);
    free(p);
    return rc;
}

static mt_err_t map_produce_err(rd_kafka_resp_err_t e) {
    switch (e) {
    case RD_KAFKA_RESP_ERR__UNKNOWN_PARTITION:
    case RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC:
    case RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART: return MT_NOT_FOUND;
    case RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE: return MT_LIMIT;
    case RD_KAFKA_RESP_ERR__INVALID_ARG: return MT_INVALID;
    default: return MT_IO;
    }
}

mt_err_t mt_kafka_produce(mt_kafka_producer_t *p, const char *topic, int32_t partition,
                          const void *key, size_t key_len, const void *value, size_t len,
                          int timeout_ms) {
    if (!p || !topic || !*topic || partition < -1 || (!key && key_len) || (!value && len))
        return MT_INVALID;
    int64_t deadline = timeout_ms < 0 ? INT64_MAX : mt__kafka_now_ms() + timeout_ms;
    for (;;) {
        rd_kafka_resp_err_t e = rd_kafka_producev(
            p->rk, RD_KAFKA_V_TOPIC(topic),
            RD_KAFKA_V_PARTITION(partition < 0 ? RD_KAFKA_PARTITION_UA : partition),
            RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_KEY(key, key_len),
            RD_KAFKA_V_VALUE((void *)value, len), RD_KAFKA_V_END);
        if (!e) {
            rd_kafka_poll(p->rk, 0); /* serve delivery reports as we go */
            return MT_OK;
        }
        if (e != RD_KAFKA_RESP_ERR__QUEUE_FULL) {
            mt_err_t rc = map_produce_err(e);
            if (rc == MT_IO)
                mt_log(MT_LOG_WARN, MT__KAFKA_WHO, "%s: produce to %s [%d]: %s",
                       rd_kafka_name(p->rk), topic, (int)partition, rd_kafka_err2str(e));
            return rc;
        }
        int64_t left = deadline - mt__kafka_now_ms();
        if (left <= 0) return MT_KAFKA_BUSY;
        rd_kafka_poll(p->rk, left < QUEUE_FULL_POLL_MS ? (int)left : QUEUE_FULL_POLL_MS);
    }
}

mt_err_t mt_kafka_producer_flush(mt_kafka_producer_t *p, int timeout_ms) {
    if (!p) return MT_INVALID;
    rd_kafka_resp_err_t e = rd_kafka_flush(p->rk, timeout_ms < 0 ? -1 : timeout_ms);
    if (e == RD_KAFKA_RESP_ERR__TIMED_OUT) return MT_TIMEOUT;
    if (atomic_exchange(&p->failed_unreported, 0)) return MT_IO;
    return MT_OK;
}

void mt_kafka_producer_counts(const mt_kafka_producer_t *p, uint64_t *delivered, uint64_t *failed) {
    if (delivered)
        *delivered =
            atomic_load_explicit(&((mt_kafka_producer_t *)p)->delivered, memory_order_relaxed);
    if (failed)
        *failed = atomic_load_explicit(&((mt_kafka_producer_t *)p)->failed, memory_order_relaxed);
}

size_t mt_kafka_producer_queued(const mt_kafka_producer_t *p) {
    int n = rd_kafka_outq_len(p->rk);
    return n > 0 ? (size_t)n : 0;
}

void mt_kafka_producer_destroy(mt_kafka_producer_t *p) {
    if (!p) return;
    if (rd_kafka_flush(p->rk, DESTROY_FLUSH_MS) == RD_KAFKA_RESP_ERR__TIMED_OUT)
        mt_log(MT_LOG_WARN, MT__KAFKA_WHO, "%s: %d messages not delivered within %d ms: lost",
               rd_kafka_name(p->rk), rd_kafka_outq_len(p->rk), DESTROY_FLUSH_MS);
    rd_kafka_destroy(p->rk);
    free(p);
}
