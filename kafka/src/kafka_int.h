/*
 * kafka_int.h - internals shared by the files of the kafka module: building a librdkafka
 * configuration from "key=value" lists, routing librdkafka's log lines to mt_log, and the
 * mapping of librdkafka errors to mt_err_t.
 */
#ifndef MT_KAFKA_INT_H
#define MT_KAFKA_INT_H

#include <librdkafka/rdkafka.h>
#include <stddef.h>
#include <stdint.h>

#include "mt/err.h"
#include "mt/kafka.h"

#define MT__KAFKA_WHO "kafka"

/** Writes a message to @p errbuf (NULL or errlen 0: nothing). */
void mt__kafka_errf(char *errbuf, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/**
 * A new configuration with our log callback, then @p defaults, then @p user applied in order
 * (each a NULL-terminated "key=value" array, either may be NULL).
 * @returns MT_OK (caller owns *out), MT_INVALID (an entry without '=' or with an empty key),
 * MT_CONFIG (librdkafka refused a property), MT_NOMEM; errbuf says which entry.
 */
mt_err_t mt__kafka_conf_new(const char *const *defaults, const char *const *user,
                            rd_kafka_conf_t **out, char *errbuf, size_t errlen);

/** Sets one property; the same errors as mt__kafka_conf_new. */
mt_err_t mt__kafka_conf_set(rd_kafka_conf_t *conf, const char *key, const char *value, char *errbuf,
                            size_t errlen);

/** Our view of a consumed message: @p m points into @p rkm (valid while it lives) and
 *  takes @p topic as its topic name. */
static inline void mt__kafka_msg_fill(mt_kafka_msg_t *m, const rd_kafka_message_t *rkm,
                                      const char *topic) {
    m->topic = topic;
    m->partition = rkm->partition;
    m->offset = rkm->offset;
    m->timestamp_ms = rd_kafka_message_timestamp(rkm, NULL);
    m->key = rkm->key;
    m->key_len = rkm->key_len;
    m->value = rkm->payload;
    m->len = rkm->len;
}

/** Milliseconds of CLOCK_MONOTONIC. */
int64_t mt__kafka_now_ms(void);

#endif /* MT_KAFKA_INT_H */
