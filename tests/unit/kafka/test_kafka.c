/*
 * test_kafka.c - the kafka module against its embedded mock cluster:
 *   - argument and configuration errors (no broker needed);
 *   - produce then consume everything through a consumer group: every message once per
 *     distinct (partition, offset), contents intact, keys on the partition the Java
 *     clients' murmur2 partitioner picks, explicit partitions respected;
 *   - at-least-once: a member marks half of each partition (one mark moving backwards is
 *     ignored), a reseek brings it the unmarked rest again, it leaves; the next member of
 *     the group gets exactly the unmarked rest;
 *   - producer errors: a full queue (MT_KAFKA_BUSY), a message too large (MT_LIMIT), failed
 *     deliveries (flush says MT_IO once, the counter keeps them);
 *   - caller-owned positions (checkpoints): the group's committed offsets are ignored, a
 *     listed partition starts at its position and the others at their beginning, marks
 *     move the positions, a move back while assigned re-reads exactly from there (nothing
 *     fetched before it comes through), revocations and destroy commit nothing, and
 *     commit_positions commits exactly what it is given; a reseek delivers again from the
 *     positions what was polled and not marked.
 * Consumer-group tests take a few seconds each: the mock assigns ~3 s after subscribe.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mt/kafka.h"

static const char *const GROUP_CONF[] = {"session.timeout.ms=6000", NULL};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Kafka's Java partitioner: murmur2 (seed 0x9747b28c), made positive, modulo the count. */
static int32_t java_partition(const void *key, size_t len, int32_t nparts) {
    const uint32_t m = 0x5bd1e995;
    const unsigned char *d = key;
    uint32_t h = 0x9747b28cu ^ (uint32_t)len;
    size_t n4 = len / 4;
    for (size_t i = 0; i < n4; i++) {
        uint32_t k = (uint32_t)d[4 * i] | (uint32_t)d[4 * i + 1] << 8 |
                     (uint32_t)d[4 * i + 2] << 16 | (uint32_t)d[4 * i + 3] << 24;
        k *= m;
        k ^= k >> 24;
        k *= m;
        h *= m;
        h ^= k;
    }
    const unsigned char *t = d + 4 * n4;
    size_t rest = len % 4;
    if (rest >= 3) h ^= (uint32_t)t[2] << 16;
    if (rest >= 2) h ^= (uint32_t)t[1] << 8;
    if (rest >= 1) {
        h ^= t[0];
        h *= m;
    }
    h ^= h >> 13;
    h *= m;
    h ^= h >> 15;
    return (int32_t)((h & 0x7fffffffu) % (uint32_t)nparts);
}

Test(kafka, argument_and_config_errors, .timeout = 30) {
    char err[512];
    mt_kafka_mock_t *m = NULL;
    mt_kafka_topic_spec_t bad_name = {"a b", 1}, zero = {"t", 0}, dup[] = {{"t", 1}, {"t", 2}};
    cr_assert_eq(mt_kafka_mock_create(0, NULL, 0, &m, err, sizeof(err)), MT_INVALID);
    cr_assert_eq(mt_kafka_mock_create(1, &bad_name, 1, &m, err, sizeof(err)), MT_INVALID);
    cr_assert(strstr(err, "a b"), "%s", err);
    cr_assert_eq(mt_kafka_mock_create(1, &zero, 1, &m, err, sizeof(err)), MT_INVALID);
    cr_assert_eq(mt_kafka_mock_create(1, dup, 2, &m, err, sizeof(err)), MT_INVALID);
    cr_assert_null(m);

    mt_kafka_topic_spec_t ts[] = {{"x", 2}, {"y.z_1-2", 3}};
    cr_assert_eq(mt_kafka_mock_create(3, ts, 2, &m, err, sizeof(err)), MT_OK, "%s", err);
    const char *bs = mt_kafka_mock_bootstrap(m);
    int entries = 0;
    for (const char *p = bs; p; p = strchr(p, ',')) {
        if (*p == ',') p++;
        cr_assert_eq(strncmp(p, "127.0.0.1:", 10), 0, "%s", bs);
        cr_assert_gt(atoi(p + 10), 0, "%s", bs);
        entries++;
    }
    cr_assert_eq(entries, 3, "%s", bs);
    cr_assert_eq(mt_kafka_mock_topic_create(m, "x", 2), MT_EXISTS);
    cr_assert_eq(mt_kafka_mock_topic_create(m, "new", 0), MT_INVALID);
    cr_assert_eq(mt_kafka_mock_topic_create(m, "new", 5), MT_OK);

    mt_kafka_producer_t *p = NULL;
    cr_assert_eq(mt_kafka_producer_create(NULL, NULL, &p, err, sizeof(err)), MT_INVALID);
    cr_assert_eq(mt_kafka_producer_create("", NULL, &p, err, sizeof(err)), MT_INVALID);
    const char *noeq[] = {"acks", NULL}, *unknown[] = {"bogus.property=1", NULL},
               *badval[] = {"acks=sometimes", NULL};
    cr_assert_eq(mt_kafka_producer_create(bs, noeq, &p, err, sizeof(err)), MT_INVALID);
    cr_assert_eq(mt_kafka_producer_create(bs, unknown, &p, err, sizeof(err)), MT_CONFIG);
    cr_assert(strstr(err, "bogus.property"), "%s", err);
    cr_assert_eq(mt_kafka_producer_create(bs, badval, &p, err, sizeof(err)), MT_CONFIG);
    cr_assert(strstr(err, "acks"), "%s", err);
    cr_assert_null(p);

    mt_kafka_consumer_t *c = NULL;
    const char *topics[] = {"x"}, *empty[] = {""};
    cr_assert_eq(mt_kafka_consumer_create(bs, "g", topics, 0, NULL, &c, err, sizeof(err)),
                 MT_INVALID);
    cr_assert_eq(mt_kafka_consumer_create(bs, "", topics, 1, NULL, &c, err, sizeof(err)),
                 MT_INVALID);
    cr_assert_eq(mt_kafka_consumer_create(bs, "g", empty, 1, NULL, &c, err, sizeof(err)),
                 MT_INVALID);
    cr_assert_eq(mt_kafka_consumer_create(bs, "g", topics, 1, unknown, &c, err, sizeof(err)),
                 MT_CONFIG);
    cr_assert_null(c);
    /* A member with nothing marked: commit is a no-op, destroy leaves cleanly. */
    cr_assert_eq(mt_kafka_consumer_create(bs, "g", topics, 1, GROUP_CONF, &c, err, sizeof(err)),
                 MT_OK, "%s", err);
    cr_assert_eq(mt_kafka_consumer_commit(c), MT_OK);
    mt_kafka_msg_t msg;
    cr_assert_eq(mt_kafka_consumer_poll(c, &msg, 1, 0), 0);
    mt_kafka_consumer_destroy(c);

    mt_kafka_producer_destroy(NULL);
    mt_kafka_consumer_destroy(NULL);
    mt_kafka_mock_destroy(NULL);
    mt_kafka_mock_destroy(m);
}

enum { N = 3000, NEXPLICIT = 20, NPARTS = 4 };

Test(kafka, produce_then_consume_all_through_a_group, .timeout = 60) {
    char err[512];
    mt_kafka_topic_spec_t ts = {"events", NPARTS};
    mt_kafka_mock_t *m;
    cr_assert_eq(mt_kafka_mock_create(2, &ts, 1, &m, err, sizeof(err)), MT_OK, "%s", err);
    const char *bs = mt_kafka_mock_bootstrap(m);

    mt_kafka_producer_t *p;
    cr_assert_eq(mt_kafka_producer_create(bs, NULL, &p, err, sizeof(err)), MT_OK, "%s", err);
    char key[32], val[64];
    for (int i = 0; i < N + NEXPLICIT; i++) {
        int kl = snprintf(key, sizeof(key), "key-%d", i);
        int vl = snprintf(val, sizeof(val), "value-%d-%s", i, i % 2 ? "odd" : "even");
        int32_t part = i < N ? -1 : 2;
        cr_assert_eq(mt_kafka_produce(p, "events", part, key, (size_t)kl, val, (size_t)vl, 5000),
                     MT_OK);
    }
    cr_assert_eq(mt_kafka_producer_flush(p, 20000), MT_OK);
    uint64_t delivered, failed;
    mt_kafka_producer_counts(p, &delivered, &failed);
    cr_assert_eq(delivered, N + NEXPLICIT);
    cr_assert_eq(failed, 0);
    cr_assert_eq(mt_kafka_producer_queued(p), 0);

    const char *topics[] = {"events"};
    mt_kafka_consumer_t *c;
    cr_assert_eq(
        mt_kafka_consumer_create(bs, "readers", topics, 1, GROUP_CONF, &c, err, sizeof(err)), MT_OK,
        "%s", err);
    static uint8_t seen_off[NPARTS][N + NEXPLICIT];
    static uint8_t seen_key[N + NEXPLICIT];
    memset(seen_off, 0, sizeof(seen_off));
    memset(seen_key, 0, sizeof(seen_key));
    size_t distinct = 0;
    mt_kafka_msg_t msgs[256];
    double deadline = now_s() + 40;
    while (distinct < N + NEXPLICIT && now_s() < deadline) {
        size_t n = mt_kafka_consumer_poll(c, msgs, 256, 200);
        for (size_t k = 0; k < n; k++) {
            const mt_kafka_msg_t *g = &msgs[k];
            cr_assert_str_eq(g->topic, "events");
            cr_assert(g->partition >= 0 && g->partition < NPARTS);
            cr_assert(g->offset >= 0 && g->offset < N + NEXPLICIT);
            cr_assert_gt(g->timestamp_ms, 1000000000000LL);
            cr_assert(g->key && g->key_len > 4 && g->key_len < sizeof(key));
            char kb[32];
            memcpy(kb, g->key, g->key_len);
            kb[g->key_len] = '\0';
            int i = atoi(kb + 4);
            cr_assert(i >= 0 && i < N + NEXPLICIT, "%s", kb);
            int vl = snprintf(val, sizeof(val), "value-%d-%s", i, i % 2 ? "odd" : "even");
            cr_assert_eq(g->len, (size_t)vl);
            cr_assert_eq(memcmp(g->value, val, g->len), 0);
            int32_t want = i < N ? java_partition(g->key, g->key_len, NPARTS) : 2;
            cr_assert_eq(g->partition, want, "key %s: partition %d, murmur2 says %d", kb,
                         g->partition, want);
            if (!seen_off[g->partition][g->offset]) {
                seen_off[g->partition][g->offset] = 1;
                distinct++;
                cr_assert_eq(seen_key[i], 0, "key %d at two offsets", i);
                seen_key[i] = 1;
            }
        }
        mt_kafka_consumer_mark(c, n ? &msgs[n - 1] : NULL);
    }
    cr_assert_eq(distinct, N + NEXPLICIT, "consumed %zu distinct of %d", distinct, N + NEXPLICIT);
    cr_assert_eq(mt_kafka_consumer_assigned(c), NPARTS);
    mt_kafka_consumer_counts_t cc;
    mt_kafka_consumer_counts(c, &cc);
    cr_assert_geq(cc.messages, N + NEXPLICIT);
    cr_assert_eq(cc.errors, 0);
    cr_assert_geq(cc.assignments, 1);
    cr_assert_eq(mt_kafka_consumer_commit(c), MT_OK);
    mt_kafka_consumer_counts(c, &cc);
    cr_assert_geq(cc.commits, 1);
    mt_kafka_consumer_destroy(c);
    mt_kafka_producer_destroy(p);
    mt_kafka_mock_destroy(m);
}

enum { ALO_N = 300, ALO_PARTS = 3 };

Test(kafka, unmarked_messages_go_to_the_next_member, .timeout = 90) {
    char err[512];
    mt_kafka_topic_spec_t ts = {"alo", ALO_PARTS};
    mt_kafka_mock_t *m;
    cr_assert_eq(mt_kafka_mock_create(1, &ts, 1, &m, err, sizeof(err)), MT_OK, "%s", err);
    const char *bs = mt_kafka_mock_bootstrap(m);
    mt_kafka_producer_t *p;
    cr_assert_eq(mt_kafka_producer_create(bs, NULL, &p, err, sizeof(err)), MT_OK, "%s", err);
    for (int i = 0; i < ALO_N; i++) {
        char key[16];
        int kl = snprintf(key, sizeof(key), "k%d", i);
        cr_assert_eq(mt_kafka_produce(p, "alo", -1, key, (size_t)kl, &i, sizeof(i), 5000), MT_OK);
    }
    cr_assert_eq(mt_kafka_producer_flush(p, 20000), MT_OK);

    /* First member: read everything, keep a copy of each message's coordinates. */
    const char *topics[] = {"alo"};
    mt_kafka_consumer_t *c;
    cr_assert_eq(
        mt_kafka_consumer_create(bs, "alo-group", topics, 1, GROUP_CONF, &c, err, sizeof(err)),
        MT_OK, "%s", err);
    static mt_kafka_msg_t got[ALO_PARTS][ALO_N];
    static uint8_t seen[ALO_PARTS][ALO_N];
    memset(seen, 0, sizeof(seen));
    int64_t cnt[ALO_PARTS] = {0};
    size_t distinct = 0;
    mt_kafka_msg_t msgs[64];
    double deadline = now_s() + 30;
    while (distinct < ALO_N && now_s() < deadline) {
        size_t n = mt_kafka_consumer_poll(c, msgs, 64, 200);
        for (size_t k = 0; k < n; k++) {
            const mt_kafka_msg_t *g = &msgs[k];
            cr_assert(g->partition >= 0 && g->partition < ALO_PARTS);
            cr_assert(g->offset >= 0 && g->offset < ALO_N);
            if (seen[g->partition][g->offset]) continue;
            seen[g->partition][g->offset] = 1;
            got[g->partition][g->offset] = *g; /* topic stays valid, key/value do not */
            got[g->partition][g->offset].key = got[g->partition][g->offset].value = NULL;
            distinct++;
            if (g->offset + 1 > cnt[g->partition]) cnt[g->partition] = g->offset + 1;
        }
    }
    cr_assert_eq(distinct, ALO_N);
    /* Mark the first half of each partition; a later mark of offset 0 must not move the
     * position back. Then a partition that is not ours: ignored. */
    int64_t expect = 0;
    for (int q = 0; q < ALO_PARTS; q++) {
        cr_assert_gt(cnt[q], 2, "partition %d has %lld messages", q, (long long)cnt[q]);
        mt_kafka_consumer_mark(c, &got[q][cnt[q] / 2 - 1]);
        mt_kafka_consumer_mark(c, &got[q][0]);
        expect += cnt[q] - cnt[q] / 2;
    }
    mt_kafka_msg_t foreign = got[0][0];
    foreign.partition = 77;
    mt_kafka_consumer_mark(c, &foreign);
    /* A reseek (a stalled fetch) brings this member the unmarked rest again, nothing else. */
    cr_assert_eq(mt_kafka_consumer_reseek(c, err, sizeof(err)), MT_OK, "%s", err);
    memset(seen, 0, sizeof(seen));
    int64_t again = 0;
    deadline = now_s() + 30;
    while (again < expect && now_s() < deadline) {
        size_t n = mt_kafka_consumer_poll(c, msgs, 64, 200);
        for (size_t k = 0; k < n; k++) {
            const mt_kafka_msg_t *g = &msgs[k];
            cr_assert_geq(g->offset, cnt[g->partition] / 2, "partition %d: offset %lld again",
                          (int)g->partition, (long long)g->offset);
            if (!seen[g->partition][g->offset]++) again++;
        }
    }
    cr_assert_eq(again, expect, "after the reseek: %lld of %lld", (long long)again,
                 (long long)expect);
    mt_kafka_consumer_destroy(c); /* commits the marks, leaves the group */

    /* Second member of the same group: exactly the unmarked rest. */
    cr_assert_eq(
        mt_kafka_consumer_create(bs, "alo-group", topics, 1, GROUP_CONF, &c, err, sizeof(err)),
        MT_OK, "%s", err);
    memset(seen, 0, sizeof(seen));
    int64_t got2 = 0;
    double quiet_until = 0;
    deadline = now_s() + 40;
    while (now_s() < deadline) {
        size_t n = mt_kafka_consumer_poll(c, msgs, 64, 200);
        for (size_t k = 0; k < n; k++) {
            const mt_kafka_msg_t *g = &msgs[k];
            int q = g->partition;
            cr_assert(q >= 0 && q < ALO_PARTS);
            cr_assert_geq(g->offset, cnt[q] / 2,
                          "partition %d: offset %lld was marked, yet delivered again", q,
                          (long long)g->offset);
            cr_assert_lt(g->offset, cnt[q]);
            int v;
            cr_assert_eq(g->len, sizeof(v));
            if (!seen[q][g->offset]) {
                seen[q][g->offset] = 1;
                got2++;
            }
        }
        if (got2 == expect && quiet_until == 0) quiet_until = now_s() + 1.5;
        if (quiet_until && now_s() >= quiet_until) break;
    }
    cr_assert_eq(got2, expect, "second member got %lld of the %lld unmarked", (long long)got2,
                 (long long)expect);
    mt_kafka_consumer_destroy(c);
    mt_kafka_producer_destroy(p);
    mt_kafka_mock_destroy(m);
}

Test(kafka, producer_errors, .timeout = 60) {
    char err[512];
    /* Nobody listens on port 1: messages queue up, then time out. */
    const char *conf[] = {"queue.buffering.max.messages=2", "message.timeout.ms=300",
                          "message.max.bytes=2000", NULL};
    mt_kafka_producer_t *p;
    cr_assert_eq(mt_kafka_producer_create("127.0.0.1:1", conf, &p, err, sizeof(err)), MT_OK, "%s",
                 err);
    char big[4000];
    memset(big, 'x', sizeof(big));
    cr_assert_eq(mt_kafka_produce(p, "t", -1, NULL, 0, big, sizeof(big), 0), MT_LIMIT);
    cr_assert_eq(mt_kafka_produce(p, "t", -5, NULL, 0, "a", 1, 0), MT_INVALID);
    cr_assert_eq(mt_kafka_produce(p, "t", -1, NULL, 0, "a", 1, 0), MT_OK);
    cr_assert_eq(mt_kafka_produce(p, "t", -1, NULL, 0, "b", 1, 0), MT_OK);
    double t0 = now_s();
    cr_assert_eq(mt_kafka_produce(p, "t", -1, NULL, 0, "c", 1, 100), MT_KAFKA_BUSY);
    cr_assert_geq(now_s() - t0, 0.09);
    /* Both time out after 300 ms: flush reports the failure once. */
    cr_assert_eq(mt_kafka_producer_flush(p, 10000), MT_IO);
    cr_assert_eq(mt_kafka_producer_flush(p, 10000), MT_OK);
    uint64_t delivered, failed;
    mt_kafka_producer_counts(p, &delivered, &failed);
    cr_assert_eq(delivered, 0);
    cr_assert_eq(failed, 2);
    /* The queue has room again. */
    cr_assert_eq(mt_kafka_produce(p, "t", 0, "k", 1, "d", 1, 0), MT_OK);
    cr_assert_eq(mt_kafka_producer_queued(p), 1);
    cr_assert_eq(mt_kafka_producer_flush(p, 0), MT_TIMEOUT);
    mt_kafka_producer_destroy(p); /* waits for the last failure (300 ms), not 5 s */

    /* A partition the cluster does not have: refused at once or failed at delivery. */
    mt_kafka_topic_spec_t ts = {"two", 2};
    mt_kafka_mock_t *m;
    cr_assert_eq(mt_kafka_mock_create(1, &ts, 1, &m, err, sizeof(err)), MT_OK, "%s", err);
    cr_assert_eq(mt_kafka_producer_create(mt_kafka_mock_bootstrap(m), NULL, &p, err, sizeof(err)),
                 MT_OK, "%s", err);
    cr_assert_eq(mt_kafka_produce(p, "two", 1, "k", 1, "v", 1, 1000), MT_OK);
    cr_assert_eq(mt_kafka_producer_flush(p, 10000), MT_OK);
    mt_err_t e = mt_kafka_produce(p, "two", 99, "k", 1, "v", 1, 1000);
    if (e == MT_OK) {
        cr_assert_eq(mt_kafka_producer_flush(p, 10000), MT_IO);
        mt_kafka_producer_counts(p, NULL, &failed);
        cr_assert_eq(failed, 1);
    } else {
        cr_assert_eq(e, MT_NOT_FOUND, "%s", mt_err_name(e));
    }
    mt_kafka_producer_destroy(p);
    mt_kafka_mock_destroy(m);
}

enum { SPLIT_PARTS = 4, PHASE = 200 };

static void produce_range(mt_kafka_producer_t *p, int from, int to) {
    for (int i = from; i < to; i++) {
        char key[16];
        int kl = snprintf(key, sizeof(key), "s%d", i);
        cr_assert_eq(mt_kafka_produce(p, "split", -1, key, (size_t)kl, &i, sizeof(i), 5000), MT_OK);
    }
    cr_assert_eq(mt_kafka_producer_flush(p, 20000), MT_OK);
}

/* Polls @p c once, marks every message, records who read it (bit id; bit id << 2: again);
 * @returns the number of new distinct messages. */
static int poll_mark(mt_kafka_consumer_t *c, uint8_t *seen, int *who, int id, int timeout_ms) {
    mt_kafka_msg_t msgs[32];
    size_t n = mt_kafka_consumer_poll(c, msgs, 32, timeout_ms);
    int fresh = 0;
    for (size_t k = 0; k < n; k++) {
        int i;
        cr_assert_eq(msgs[k].len, sizeof(i));
        memcpy(&i, msgs[k].value, sizeof(i));
        cr_assert(i >= 0 && i < 2 * PHASE);
        if (!seen[i]) fresh++;
        seen[i] = 1;
        if (who[i] & id) who[i] |= id << 2; /* read again by the same member */
        who[i] |= id;
        mt_kafka_consumer_mark(c, &msgs[k]);
    }
    return fresh;
}

Test(kafka, a_second_member_takes_over_from_the_revoked_positions, .timeout = 90) {
    char err[512];
    mt_kafka_topic_spec_t ts = {"split", SPLIT_PARTS};
    mt_kafka_mock_t *m;
    cr_assert_eq(mt_kafka_mock_create(1, &ts, 1, &m, err, sizeof(err)), MT_OK, "%s", err);
    const char *bs = mt_kafka_mock_bootstrap(m);
    mt_kafka_producer_t *p;
    cr_assert_eq(mt_kafka_producer_create(bs, NULL, &p, err, sizeof(err)), MT_OK, "%s", err);
    produce_range(p, 0, PHASE);

    /* A reads the first phase and marks it, but never commits by itself: only the commit
     * in the revocation (when B joins) can keep B from reading it again. */
    const char *topics[] = {"split"};
    mt_kafka_consumer_t *a, *b;
    cr_assert_eq(
        mt_kafka_consumer_create(bs, "split-group", topics, 1, GROUP_CONF, &a, err, sizeof(err)),
        MT_OK, "%s", err);
    static uint8_t seen[2 * PHASE];
    static int who[2 * PHASE];
    int distinct = 0;
    double deadline = now_s() + 30;
    while (distinct < PHASE && now_s() < deadline)
        distinct += poll_mark(a, seen, who, 1, 200);
    cr_assert_eq(distinct, PHASE);
    cr_assert_eq(mt_kafka_consumer_assigned(a), SPLIT_PARTS);

    cr_assert_eq(
        mt_kafka_consumer_create(bs, "split-group", topics, 1, GROUP_CONF, &b, err, sizeof(err)),
        MT_OK, "%s", err);
    deadline = now_s() + 40;
    while (now_s() < deadline &&
           !(mt_kafka_consumer_assigned(a) > 0 && mt_kafka_consumer_assigned(b) > 0 &&
             mt_kafka_consumer_assigned(a) + mt_kafka_consumer_assigned(b) == SPLIT_PARTS)) {
        distinct += poll_mark(a, seen, who, 1, 50);
        distinct += poll_mark(b, seen, who, 2, 50);
    }
    cr_assert_gt(mt_kafka_consumer_assigned(b), 0, "B got no partition");
    cr_assert_eq(mt_kafka_consumer_assigned(a) + mt_kafka_consumer_assigned(b), SPLIT_PARTS);
    mt_kafka_consumer_counts_t ca;
    mt_kafka_consumer_counts(a, &ca);
    cr_assert_geq(ca.revocations, 1);
    /* A real broker takes the commit of the revocation; the mock refuses commits during a
     * rebalance, and then A resumes its kept partitions at the carried positions and commits
     * them at the assignment (B's partitions restart at the last commit: none here). */
    cr_assert_geq(ca.commits, 1, "neither the revocation nor the assignment committed");
    int revoke_commit_failed = ca.commit_failures > 0;

    produce_range(p, PHASE, 2 * PHASE);
    deadline = now_s() + 30;
    while (distinct < 2 * PHASE && now_s() < deadline) {
        distinct += poll_mark(a, seen, who, 1, 50);
        distinct += poll_mark(b, seen, who, 2, 50);
    }
    cr_assert_eq(distinct, 2 * PHASE);
    int by_b = 0, again_a = 0, again_b = 0;
    for (int i = 0; i < 2 * PHASE; i++) {
        by_b += i >= PHASE && (who[i] & 2);
        again_a += i < PHASE && (who[i] & 4);
        again_b += i < PHASE && (who[i] & 2);
    }
    cr_assert_gt(by_b, 0, "B read nothing of the second phase");
    cr_assert_eq(again_a, 0, "A read %d of its own marked messages again", again_a);
    if (!revoke_commit_failed)
        cr_assert_eq(again_b, 0, "B read %d messages marked by A before", again_b);
    else
        cr_assert_leq(again_b, PHASE); /* B's partitions restarted from offset 0 (mock) */
    mt_kafka_consumer_destroy(a);
    mt_kafka_consumer_destroy(b);
    mt_kafka_producer_destroy(p);
    mt_kafka_mock_destroy(m);
}

/* ---------------- caller-owned positions ---------------- */

enum { OWN_PARTS = 2, OWN_N = 60 }; /* messages per partition: value = partition * 1000 + i */

/* Polls until @p want messages came (or 20 s), then 1 s more (anything more is counted);
 * records the first @p want values in order into got[]. @returns how many came. */
static int poll_values(mt_kafka_consumer_t *c, int *got, int want, int mark) {
    int n = 0;
    double deadline = now_s() + 20, extra = 0;
    while (now_s() < deadline && (n < want || now_s() < extra)) {
        if (n >= want && extra == 0) extra = now_s() + 1;
        mt_kafka_msg_t msgs[16];
        size_t k = mt_kafka_consumer_poll(c, msgs, 16, 100);
        for (size_t i = 0; i < k; i++) {
            int v;
            cr_assert_eq(msgs[i].len, sizeof(v));
            memcpy(&v, msgs[i].value, sizeof(v));
            cr_assert_eq(v / 1000, msgs[i].partition);
            cr_assert_eq(v % 1000, msgs[i].offset, "value and offset agree");
            if (n < want) got[n] = v;
            n++;
            if (mark) mt_kafka_consumer_mark(c, &msgs[i]);
        }
    }
    return n;
}

static int64_t position_of(mt_kafka_consumer_t *c, int32_t partition) {
    mt_kafka_position_t pos[8];
    size_t n = 0;
    mt_kafka_consumer_positions(c, pos, 8, &n);
    cr_assert_leq(n, 8);
    for (size_t i = 0; i < n; i++)
        if (pos[i].partition == partition) return pos[i].offset;
    return -1;
}

Test(kafka, caller_owned_positions, .timeout = 90) {
    char err[512];
    mt_kafka_topic_spec_t ts = {"own", OWN_PARTS};
    mt_kafka_mock_t *m;
    cr_assert_eq(mt_kafka_mock_create(1, &ts, 1, &m, err, sizeof(err)), MT_OK, "%s", err);
    const char *bs = mt_kafka_mock_bootstrap(m);
    mt_kafka_producer_t *p;
    cr_assert_eq(mt_kafka_producer_create(bs, NULL, &p, err, sizeof(err)), MT_OK, "%s", err);
    for (int part = 0; part < OWN_PARTS; part++)
        for (int i = 0; i < OWN_N; i++) {
            int v = part * 1000 + i;
            cr_assert_eq(mt_kafka_produce(p, "own", part, NULL, 0, &v, sizeof(v), 5000), MT_OK);
        }
    cr_assert_eq(mt_kafka_producer_flush(p, 20000), MT_OK);
    const char *topics[] = {"own"};
    mt_kafka_consumer_t *c;
    cr_assert_eq(
        mt_kafka_consumer_create(bs, "own-group", topics, 1, GROUP_CONF, &c, err, sizeof(err)),
        MT_OK, "%s", err);
    /* the group commits 50 for partition 0 (a stale at-least-once run): ignored below */
    mt_kafka_position_t stale = {"own", 0, 50};
    mt_kafka_position_t bad = {"own", 0, -1};
    cr_assert_eq(mt_kafka_consumer_set_positions(c, &bad, 1, err, sizeof(err)), MT_INVALID);
    mt_kafka_position_t start = {"own", 0, 40}; /* partition 1: not listed, from 0 */
    cr_assert_eq(mt_kafka_consumer_set_positions(c, &start, 1, err, sizeof(err)), MT_OK, "%s", err);
    cr_assert_eq(position_of(c, 0), 40);
    cr_assert_eq(position_of(c, 1), -1);
    static int got[4 * OWN_N];
    int n = poll_values(c, got, (OWN_N - 40) + OWN_N, 1);
    cr_assert_eq(n, (OWN_N - 40) + OWN_N, "read %d", n);
    int lo[OWN_PARTS] = {1000000, 1000000};
    for (int i = 0; i < n; i++)
        if (got[i] % 1000 < lo[got[i] / 1000]) lo[got[i] / 1000] = got[i] % 1000;
    cr_assert_eq(lo[0], 40, "partition 0 starts at its position");
    cr_assert_eq(lo[1], 0, "partition 1 starts at its beginning");
    cr_assert_eq(position_of(c, 0), OWN_N);
    cr_assert_eq(position_of(c, 1), OWN_N);
    /* the group's commit is of no concern to it, and commit() commits nothing */
    cr_assert_eq(mt_kafka_consumer_commit_positions(c, &stale, 1), MT_OK);
    cr_assert_eq(mt_kafka_consumer_commit(c), MT_OK);
    /* back to 10 / 55 while assigned: exactly those again, nothing fetched before */
    mt_kafka_position_t back[2] = {{"own", 0, 10}, {"own", 1, 55}};
    cr_assert_eq(mt_kafka_consumer_set_positions(c, back, 2, err, sizeof(err)), MT_OK, "%s", err);
    n = poll_values(c, got, (OWN_N - 10) + (OWN_N - 55), 0);
    cr_assert_eq(n, (OWN_N - 10) + (OWN_N - 55));
    int next[OWN_PARTS] = {10, 55};
    for (int i = 0; i < n; i++) {
        int part = got[i] / 1000;
        cr_assert_eq(got[i] % 1000, next[part], "partition %d: %d, expected %d", part,
                     got[i] % 1000, next[part]);
        next[part]++;
    }
    /* not marked this time: the positions stayed; a duplicate delivery below them would be
     * dropped (none here: skipped counts what poll dropped) */
    cr_assert_eq(position_of(c, 0), 10);
    cr_log_info("skipped below position: %llu", (unsigned long long)mt_kafka_consumer_skipped(c));
    /* a reseek (a stalled fetch) goes back to the positions: the unmarked messages again */
    cr_assert_eq(mt_kafka_consumer_reseek(c, err, sizeof(err)), MT_OK, "%s", err);
    n = poll_values(c, got, (OWN_N - 10) + (OWN_N - 55), 0);
    cr_assert_eq(n, (OWN_N - 10) + (OWN_N - 55));
    next[0] = 10;
    next[1] = 55;
    for (int i = 0; i < n; i++) {
        int part = got[i] / 1000;
        cr_assert_eq(got[i] % 1000, next[part], "after reseek, partition %d: %d, expected %d", part,
                     got[i] % 1000, next[part]);
        next[part]++;
    }
    cr_assert_eq(mt_kafka_consumer_assigned(c), OWN_PARTS);
    mt_kafka_consumer_destroy(c); /* commits nothing */

    /* a consumer of the group reading committed offsets sees the one commit_positions made */
    mt_kafka_consumer_t *d;
    cr_assert_eq(
        mt_kafka_consumer_create(bs, "own-group", topics, 1, GROUP_CONF, &d, err, sizeof(err)),
        MT_OK, "%s", err);
    n = poll_values(d, got, (OWN_N - 50) + OWN_N, 0);
    cr_assert_eq(n, (OWN_N - 50) + OWN_N, "committed: partition 0 at 50, partition 1 none");
    for (int i = 0; i < n; i++)
        cr_assert(got[i] / 1000 == 1 || got[i] % 1000 >= 50);
    mt_kafka_consumer_destroy(d);
    mt_kafka_producer_destroy(p);
    mt_kafka_mock_destroy(m);
}

/* Reads @p want messages of partition 1 of "params" through @p r (or until 20 s pass);
 * checks they come in order from @p from and returns how many came. */
static int read_in_order(mt_kafka_reader_t *r, int64_t from, int want) {
    mt_kafka_msg_t msgs[64];
    int got = 0;
    double deadline = now_s() + 20;
    while (got < want && now_s() < deadline) {
        mt_kafka_reader_event_t ev;
        size_t n = mt_kafka_reader_poll(r, msgs, 64, 100, &ev);
        cr_assert_eq(ev.out_of_range, 0);
        for (size_t k = 0; k < n; k++) {
            if (msgs[k].offset < from + got) continue; /* fetched for an earlier start */
            cr_assert_eq(msgs[k].partition, 1);
            cr_assert_eq(msgs[k].offset, from + got, "offset %lld, want %lld",
                         (long long)msgs[k].offset, (long long)(from + got));
            char val[32];
            int vl = snprintf(val, sizeof(val), "v%lld", (long long)msgs[k].offset);
            cr_assert_eq(msgs[k].len, (size_t)vl);
            cr_assert_eq(memcmp(msgs[k].value, val, (size_t)vl), 0);
            got++;
        }
    }
    return got;
}

/* Readers outside any group: each reads every message of the partition it starts, from the
 * offset it gives; the end offset is the next message's; a restart moves it; an offset past
 * the end is reported, not reset; bad arguments are refused. */
Test(kafka, readers_read_every_message_from_their_offsets, .timeout = 90) {
    char err[512];
    mt_kafka_topic_spec_t ts = {"params", 2};
    mt_kafka_mock_t *m;
    cr_assert_eq(mt_kafka_mock_create(1, &ts, 1, &m, err, sizeof(err)), MT_OK, "%s", err);
    const char *bs = mt_kafka_mock_bootstrap(m);
    mt_kafka_reader_t *bad;
    cr_assert_eq(mt_kafka_reader_create("", NULL, &bad, err, sizeof(err)), MT_INVALID);
    const char *const badconf[] = {"fetch.wait.max.ms=nope", NULL};
    cr_assert_eq(mt_kafka_reader_create(bs, badconf, &bad, err, sizeof(err)), MT_CONFIG);
    cr_assert(strstr(err, "fetch.wait.max.ms"), "%s", err);

    mt_kafka_producer_t *p;
    cr_assert_eq(mt_kafka_producer_create(bs, NULL, &p, err, sizeof(err)), MT_OK, "%s", err);
    for (int i = 0; i < 100; i++) {
        char val[32];
        int vl = snprintf(val, sizeof(val), "v%d", i);
        cr_assert_eq(mt_kafka_produce(p, "params", 1, "k", 1, val, (size_t)vl, 5000), MT_OK);
    }
    cr_assert_eq(mt_kafka_producer_flush(p, 20000), MT_OK);

    mt_kafka_reader_t *a, *b;
    cr_assert_eq(mt_kafka_reader_create(bs, NULL, &a, err, sizeof(err)), MT_OK, "%s", err);
    cr_assert_eq(mt_kafka_reader_create(bs, NULL, &b, err, sizeof(err)), MT_OK, "%s", err);
    int64_t lo = -1, hi = -1;
    cr_assert_eq(mt_kafka_reader_end(a, "params", 1, 5000, &lo, &hi, err, sizeof(err)), MT_OK, "%s",
                 err);
    cr_assert_eq(lo, 0);
    cr_assert_eq(hi, 100);
    cr_assert_eq(mt_kafka_reader_end(a, "params", 0, 5000, &lo, &hi, err, sizeof(err)), MT_OK);
    cr_assert_eq(hi, 0);
    cr_assert_eq(mt_kafka_reader_start(a, "params", 1, -1, err, sizeof(err)), MT_INVALID);

    /* both readers get everything: no group splits the partition */
    cr_assert_eq(mt_kafka_reader_start(a, "params", 1, 0, err, sizeof(err)), MT_OK, "%s", err);
    cr_assert_eq(mt_kafka_reader_start(b, "params", 1, 50, err, sizeof(err)), MT_OK, "%s", err);
    cr_assert_eq(read_in_order(a, 0, 100), 100);
    cr_assert_eq(read_in_order(b, 50, 50), 50);
    /* messages produced now arrive too */
    for (int i = 100; i < 110; i++) {
        char val[32];
        int vl = snprintf(val, sizeof(val), "v%d", i);
        cr_assert_eq(mt_kafka_produce(p, "params", 1, "k", 1, val, (size_t)vl, 5000), MT_OK);
    }
    cr_assert_eq(mt_kafka_producer_flush(p, 20000), MT_OK);
    cr_assert_eq(read_in_order(a, 100, 10), 10);
    /* a restart reads again from its offset */
    cr_assert_eq(mt_kafka_reader_start(a, "params", 1, 10, err, sizeof(err)), MT_OK, "%s", err);
    cr_assert_eq(read_in_order(a, 10, 100), 100);

    /* past the end: reported by the poll, not reset to somewhere else */
    cr_assert_eq(mt_kafka_reader_start(b, "params", 1, 5000, err, sizeof(err)), MT_OK);
    int reported = 0;
    double deadline = now_s() + 20;
    while (!reported && now_s() < deadline) {
        mt_kafka_msg_t msgs[16];
        mt_kafka_reader_event_t ev;
        size_t n = mt_kafka_reader_poll(b, msgs, 16, 100, &ev);
        for (size_t k = 0; k < n; k++)
            cr_assert_lt(msgs[k].offset, 110); /* only what was fetched before the restart */
        if (ev.out_of_range) {
            cr_assert_eq(ev.partition, 1);
            reported = 1;
        }
    }
    cr_assert(reported, "an offset past the end was not reported");
    uint64_t nm, ne, noor;
    mt_kafka_reader_counts(b, &nm, &ne, &noor);
    cr_assert_geq(noor, 1);
    cr_assert_eq(mt_kafka_reader_stop(b, "params", 1, err, sizeof(err)), MT_OK);
    mt_kafka_reader_destroy(a);
    mt_kafka_reader_destroy(b);
    mt_kafka_producer_destroy(p);
    mt_kafka_mock_destroy(m);
}
