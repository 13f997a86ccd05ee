/*
 * offsets.c - a consumer group's committed offsets beside its topic's ends, asked of the
 * brokers without joining the group (for operators' lag checks and tests).
 */
#include <stdlib.h>
#include <string.h>

#include <librdkafka/rdkafka.h>

#include "kafka_int.h"
#include "mt/kafka.h"

mt_err_t mt_kafka_group_offsets(const char *bootstrap, const char *const *conf, const char *group,
                                const char *topic, int timeout_ms, mt_kafka_group_offset_t *out,
                                size_t cap, size_t *n, char *errbuf, size_t errlen) {
    mt__kafka_errf(errbuf, errlen, "%s", "");
    *n = 0;
    if (!bootstrap || !*bootstrap || !group || !*group || !topic || !*topic || timeout_ms < 0) {
        mt__kafka_errf(errbuf, errlen, "need a bootstrap, a group, a topic and a timeout");
        return MT_INVALID;
    }
    static const char *const defaults[] = {"client.id=monolith-offsets", "enable.auto.commit=false",
                                           "allow.auto.create.topics=false", NULL};
    rd_kafka_conf_t *rconf = NULL;
    mt_err_t rc = mt__kafka_conf_new(defaults, conf, &rconf, errbuf, errlen);
    if (!rc) rc = mt__kafka_conf_set(rconf, "bootstrap.servers", bootstrap, errbuf, errlen);
    if (!rc) rc = mt__kafka_conf_set(rconf, "group.id", group, errbuf, errlen);
    if (rc) {
        if (rconf) rd_kafka_conf_destroy(rconf);
        return rc;
    }
    char errstr[512];
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, rconf, errstr, sizeof(errstr));
    if (!rk) {
        rd_kafka_conf_destroy(rconf);
        mt__kafka_errf(errbuf, errlen, "cannot create a client: %s", errstr);
        return MT_INTERNAL;
    }
    rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, topic, NULL);
    const struct rd_kafka_metadata *md = NULL;
    rd_kafka_topic_partition_list_t *parts = NULL;
    rd_kafka_resp_err_t e =
        rkt ? rd_kafka_metadata(rk, 0, rkt, &md, timeout_ms) : rd_kafka_last_error();
    if (e) {
        mt__kafka_errf(errbuf, errlen, "metadata of %s: %s", topic, rd_kafka_err2str(e));
        rc = MT_UNAVAILABLE;
        goto out;
    }
    if (md->topic_cnt != 1 || md->topics[0].err) {
        mt__kafka_errf(errbuf, errlen, "topic %s: %s", topic,
                       md->topic_cnt == 1 ? rd_kafka_err2str(md->topics[0].err) : "not found");
        rc = MT_NOT_FOUND;
        goto out;
    }
    int np = md->topics[0].partition_cnt;
    if ((size_t)np > cap) {
        mt__kafka_errf(errbuf, errlen, "topic %s has %d partitions, room for %zu", topic, np, cap);
        rc = MT_TOO_SMALL;
        goto out;
    }
    parts = rd_kafka_topic_partition_list_new(np);
    for (int i = 0; i < np; i++)
        rd_kafka_topic_partition_list_add(parts, topic, md->topics[0].partitions[i].id);
    e = rd_kafka_committed(rk, parts, timeout_ms);
    if (e) {
        mt__kafka_errf(errbuf, errlen, "committed offsets of %s: %s", group, rd_kafka_err2str(e));
        rc = MT_UNAVAILABLE;
        goto out;
    }
    for (int i = 0; i < parts->cnt; i++) {
        const rd_kafka_topic_partition_t *tp = &parts->elems[i];
        int64_t lo = 0, hi = 0;
        e = rd_kafka_query_watermark_offsets(rk, topic, tp->partition, &lo, &hi, timeout_ms);
        if (e) {
            mt__kafka_errf(errbuf, errlen, "end of %s [%d]: %s", topic, (int)tp->partition,
                           rd_kafka_err2str(e));
            rc = MT_UNAVAILABLE;
            goto out;
        }
        out[i] = (mt_kafka_group_offset_t){.partition = tp->partition,
                                           .committed = tp->err || tp->offset < 0 ? -1 : tp->offset,
                                           .start = lo,
                                           .end = hi};
    }
    *n = (size_t)parts->cnt;
out:
    if (parts) rd_kafka_topic_partition_list_destroy(parts);
    if (md) rd_kafka_metadata_destroy(md);
    if (rkt) rd_kafka_topic_destroy(rkt);
    rd_kafka_destroy(rk);
    return rc;
}
