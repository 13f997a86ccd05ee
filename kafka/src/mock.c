/*
 * mock.c - the embedded mock cluster: librdkafka's in-process brokers (rdkafka_mock.h).
 *
 * A mock cluster hangs off an rd_kafka_t handle (here a producer that never produces); the
 * brokers run on the mock's own thread and listen on 127.0.0.1 with ports the OS chooses
 * (librdkafka 2.0.2 has no option to choose them). Destroying the cluster closes the
 * listeners and the connections of every client.
 */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "kafka_int.h" /* rdkafka.h, which rdkafka_mock.h needs first */
#include <librdkafka/rdkafka_mock.h>
#include "mt/kafka.h"

#define MAX_BROKERS    64
#define MAX_PARTITIONS 100000

struct mt_kafka_mock {
    rd_kafka_t *rk; /* owns the cluster's lifetime */
    rd_kafka_mock_cluster_t *mc;
    int nbrokers;
    char *bootstrap; /* our copy of rd_kafka_mock_cluster_bootstraps() */
};

/* Kafka's rule for topic names: 1..249 of [A-Za-z0-9._-], not "." or "..". */
static int topic_name_ok(const char *name) {
    size_t n = name ? strlen(name) : 0;
    if (n == 0 || n > 249 || !strcmp(name, ".") || !strcmp(name, "..")) return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)name[i];
        if (!isalnum(ch) && ch != '.' && ch != '_' && ch != '-') return 0;
    }
    return 1;
}

static mt_err_t topic_create(mt_kafka_mock_t *m, const char *name, int32_t partitions, char *errbuf,
                             size_t errlen) {
    if (!topic_name_ok(name)) {
        mt__kafka_errf(errbuf, errlen, "topic '%s': a name is 1..249 characters of [A-Za-z0-9._-]",
                       name ? name : "(null)");
        return MT_INVALID;
    }
    if (partitions < 1 || partitions > MAX_PARTITIONS) {
        mt__kafka_errf(errbuf, errlen, "topic '%s': %d partitions (1..%d)", name, (int)partitions,
                       MAX_PARTITIONS);
        return MT_INVALID;
    }
    /* Replicas only matter to clients that look at the metadata; three at most, like a
     * typical real cluster. */
    int rf = m->nbrokers < 3 ? m->nbrokers : 3;
    rd_kafka_resp_err_t e = rd_kafka_mock_topic_create(m->mc, name, partitions, rf);
    if (e == RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS) {
        mt__kafka_errf(errbuf, errlen, "topic '%s' exists", name);
        return MT_EXISTS;
    }
    if (e) {
        mt__kafka_errf(errbuf, errlen, "topic '%s': %s", name, rd_kafka_err2str(e));
        return MT_INTERNAL;
    }
    return MT_OK;
}

mt_err_t mt_kafka_mock_create(int nbrokers, const mt_kafka_topic_spec_t *topics, size_t ntopics,
                              mt_kafka_mock_t **out, char *errbuf, size_t errlen) {
    mt__kafka_errf(errbuf, errlen, "%s", "");
    if (!out || nbrokers < 1 || nbrokers > MAX_BROKERS || (ntopics && !topics)) {
        mt__kafka_errf(errbuf, errlen, "need 1..%d brokers (got %d) and a topic list", MAX_BROKERS,
                       nbrokers);
        return MT_INVALID;
    }
    for (size_t i = 0; i < ntopics; i++) {
        for (size_t j = 0; j < i; j++) {
            if (topics[i].name && topics[j].name && !strcmp(topics[i].name, topics[j].name)) {
                mt__kafka_errf(errbuf, errlen, "topic '%s' is listed twice", topics[i].name);
                return MT_INVALID;
            }
        }
    }
    mt_err_t rc = MT_OK;
    rd_kafka_conf_t *conf = NULL;
    mt_kafka_mock_t *m = calloc(1, sizeof(*m));
    if (!m) return MT_NOMEM;
    m->nbrokers = nbrokers;
    /* The hosting handle never connects anywhere: only its errors are worth a line (it
     * would otherwise note at every start that it has no bootstrap.servers). */
    static const char *const defaults[] = {"client.id=monolith-mock", "log_level=3", NULL};
    rc = mt__kafka_conf_new(defaults, NULL, &conf, errbuf, errlen);
    if (rc) goto out;
    char errstr[512];
    m->rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr));
    if (!m->rk) {
        mt__kafka_errf(errbuf, errlen, "cannot create the mock's handle: %s", errstr);
        rc = MT_INTERNAL;
        goto out;
    }
    conf = NULL; /* owned by m->rk */
    m->mc = rd_kafka_mock_cluster_new(m->rk, nbrokers);
    if (!m->mc) {
        mt__kafka_errf(errbuf, errlen, "cannot start %d mock brokers", nbrokers);
        rc = MT_INTERNAL;
        goto out;
    }
    for (size_t i = 0; i < ntopics; i++) {
        rc = topic_create(m, topics[i].name, topics[i].partitions, errbuf, errlen);
        if (rc) goto out;
    }
    m->bootstrap = strdup(rd_kafka_mock_cluster_bootstraps(m->mc));
    if (!m->bootstrap) {
        rc = MT_NOMEM;
        goto out;
    }
out:
    if (conf) rd_kafka_conf_destroy(conf);
    if (rc) {
        mt_kafka_mock_destroy(m);
        return rc;
    }
    *out = m;
    return MT_OK;
}

const char *mt_kafka_mock_bootstrap(const mt_kafka_mock_t *m) {
    return m->bootstrap;
}

mt_err_t mt_kafka_mock_topic_create(mt_kafka_mock_t *m, const char *name, int32_t partitions) {
    if (!m) return MT_INVALID;
    return topic_create(m, name, partitions, NULL, 0);
}

mt_err_t mt_kafka_mock_broker_set_up(mt_kafka_mock_t *m, int broker, int up) {
    if (!m || broker < 1 || broker > m->nbrokers) return MT_INVALID;
    rd_kafka_resp_err_t e = up ? rd_kafka_mock_broker_set_up(m->mc, (int32_t)broker)
                               : rd_kafka_mock_broker_set_down(m->mc, (int32_t)broker);
    return e ? MT_INTERNAL : MT_OK;
}

void mt_kafka_mock_destroy(mt_kafka_mock_t *m) {
    if (!m) return;
    if (m->mc) rd_kafka_mock_cluster_destroy(m->mc);
    if (m->rk) rd_kafka_destroy(m->rk);
    free(m->bootstrap);
    free(m);
}
