/*
 * joiner_e2e_tool - the producer and the checker of tests/e2e/joiner_e2e.sh.
 *
 *   joiner_e2e_tool produce BOOTSTRAP FIRST COUNT [RATE]
 *       Requests FIRST..FIRST+COUNT-1: each shows 1 or 2 items (Impressions to `features`),
 *       about a third of the items are clicked 50 ms later (Actions to `actions`; a
 *       single-item request's action names item 0 half of the time), a quarter of the
 *       actions are produced before their impression, and one event in ten is produced
 *       twice. Event time: the wall clock when the request is produced (as serving logs it).
 *       RATE: events/s (0: as fast as possible). Prints how many impressions and clicks it
 *       made.
 *   joiner_e2e_tool count BOOTSTRAP GROUP FIRST COUNT TIMEOUT_S
 *       Reads `examples` as group GROUP until every impression of requests
 *       FIRST..FIRST+COUNT-1 came or TIMEOUT_S passed, and prints one JSON line: messages,
 *       distinct keys, duplicates, positives, negatives, wrong labels, unknown keys, bad.
 *
 * Everything is a function of the request number, so the checker knows each label.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "monolith/v1/example.pb-c.h"
#include "mt/kafka.h"

static uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static int nitems(uint64_t r) {
    return 1 + (int)(mix(r) % 2);
}
static uint64_t item_of(uint64_t r, int i) {
    return r * 10 + (uint64_t)i + 1;
}
static int clicked(uint64_t r, int i) {
    return mix(r * 31 + (uint64_t)i + 7) % 3 == 0;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void send(mt_kafka_producer_t *p, const char *topic, const char *rid, const uint8_t *b,
                 size_t len, int twice) {
    for (int k = 0; k <= twice; k++) {
        if (mt_kafka_produce(p, topic, -1, rid, strlen(rid), b, len, -1)) {
            fprintf(stderr, "produce failed\n");
            exit(1);
        }
    }
}

static int produce(const char *bs, uint64_t first, uint64_t count, double rate) {
    char err[256];
    mt_kafka_producer_t *p;
    if (mt_kafka_producer_create(bs, NULL, &p, err, sizeof(err))) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    uint64_t imps = 0, clicks = 0, events = 0;
    double t0 = now_s();
    for (uint64_t r = first; r < first + count; r++) {
        char rid[32];
        snprintf(rid, sizeof(rid), "req-%" PRIu64, r);
        int n = nitems(r);
        struct timespec wall;
        clock_gettime(CLOCK_REALTIME, &wall);
        int64_t ts = (int64_t)wall.tv_sec * 1000 + wall.tv_nsec / 1000000;
        for (int i = 0; i < n; i++) {
            uint64_t item = item_of(r, i), fu = ((uint64_t)1 << 48) | (r % 1000);
            uint64_t fi = ((uint64_t)2 << 48) | item;
            Monolith__V1__SlotFids su = MONOLITH__V1__SLOT_FIDS__INIT;
            Monolith__V1__SlotFids si = MONOLITH__V1__SLOT_FIDS__INIT;
            su.slot = 1, su.n_fids = 1, su.fids = &fu;
            si.slot = 2, si.n_fids = 1, si.fids = &fi;
            Monolith__V1__SlotFids *us[] = {&su}, *is[] = {&si};
            Monolith__V1__Impression im = MONOLITH__V1__IMPRESSION__INIT;
            im.request_id = rid, im.timestamp_ms = ts, im.item_id = item;
            im.n_user = 1, im.user = us, im.n_item = 1, im.item = is;
            uint8_t ib[256], ab[128];
            size_t il = monolith__v1__impression__pack(&im, ib), al = 0;
            int c = clicked(r, i), early = c && mix(r + 1000003 * (uint64_t)i) % 4 == 0;
            if (c) {
                Monolith__V1__Action a = MONOLITH__V1__ACTION__INIT;
                a.request_id = rid, a.timestamp_ms = ts + 50;
                a.type = MONOLITH__V1__ACTION_TYPE__ACTION_CLICK;
                a.item_id = n == 1 && mix(r ^ 0x5555) % 2 ? 0 : item;
                al = monolith__v1__action__pack(&a, ab);
                clicks++;
            }
            if (early) send(p, "actions", rid, ab, al, mix(r * 3 + 1) % 10 == 0);
            send(p, "features", rid, ib, il, mix(r * 3 + 2 + (uint64_t)i) % 10 == 0);
            if (c && !early) send(p, "actions", rid, ab, al, mix(r * 3 + 1) % 10 == 0);
            imps++;
            events += 1 + (uint64_t)c;
        }
        if (rate > 0) {
            double due = t0 + (double)events / rate;
            double now = now_s();
            if (due > now) usleep((useconds_t)((due - now) * 1e6));
        }
    }
    if (mt_kafka_producer_flush(p, 30000)) {
        fprintf(stderr, "flush failed\n");
        return 1;
    }
    mt_kafka_producer_destroy(p);
    printf("{\"impressions\": %" PRIu64 ", \"clicks\": %" PRIu64 "}\n", imps, clicks);
    return 0;
}

static int count(const char *bs, const char *group, uint64_t first, uint64_t n, double timeout) {
    char err[256];
    const char *topics[] = {"examples"};
    const char *conf[] = {"session.timeout.ms=6000", NULL};
    mt_kafka_consumer_t *c;
    if (mt_kafka_consumer_create(bs, group, topics, 1, conf, &c, err, sizeof(err))) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    /* seen[(r - first) * 2 + i] */
    unsigned char *seen = calloc(n * 2, 1);
    uint64_t expect = 0, messages = 0, distinct = 0, dups = 0, pos = 0, neg = 0, wrong = 0,
             unknown = 0, bad = 0;
    for (uint64_t r = first; r < first + n; r++)
        expect += (uint64_t)nitems(r);
    mt_kafka_msg_t m[512];
    double t0 = now_s();
    double done_at = 0; /* once everything came, read 2 s more to see duplicates */
    while (now_s() - t0 < timeout && (distinct < expect || now_s() - done_at < 2.0)) {
        if (distinct >= expect && done_at == 0) done_at = now_s();
        size_t k = mt_kafka_consumer_poll(c, m, 512, 200);
        for (size_t q = 0; q < k; q++) {
            messages++;
            Monolith__V1__Example *ex = monolith__v1__example__unpack(NULL, m[q].len, m[q].value);
            uint64_t r, item = 0;
            if (!ex || ex->n_labels != 1 || sscanf(ex->request_id, "req-%" SCNu64, &r) != 1) {
                bad++;
                if (ex) monolith__v1__example__free_unpacked(ex, NULL);
                continue;
            }
            for (size_t s = 0; s < ex->n_slots; s++)
                if (ex->slots[s]->slot == 2 && ex->slots[s]->n_fids)
                    item = ex->slots[s]->fids[0] & 0xffffffffffffull;
            int label = ex->labels[0] > 0.5f;
            monolith__v1__example__free_unpacked(ex, NULL);
            int i = (int)(item - r * 10) - 1;
            if (r < first || r >= first + n || i < 0 || i >= nitems(r)) {
                unknown++;
                continue;
            }
            if (seen[(r - first) * 2 + (uint64_t)i]++) {
                dups++;
                continue;
            }
            distinct++;
            label ? pos++ : neg++;
            if (label != clicked(r, i)) wrong++;
        }
    }
    mt_kafka_consumer_destroy(c);
    free(seen);
    printf("{\"expected\": %" PRIu64 ", \"messages\": %" PRIu64 ", \"distinct\": %" PRIu64
           ", \"duplicates\": %" PRIu64 ", \"positives\": %" PRIu64 ", \"negatives\": %" PRIu64
           ", \"wrong_labels\": %" PRIu64 ", \"unknown\": %" PRIu64 ", \"bad\": %" PRIu64 "}\n",
           expect, messages, distinct, dups, pos, neg, wrong, unknown, bad);
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 5 && !strcmp(argv[1], "produce"))
        return produce(argv[2], strtoull(argv[3], NULL, 10), strtoull(argv[4], NULL, 10),
                       argc > 5 ? strtod(argv[5], NULL) : 0);
    if (argc == 7 && !strcmp(argv[1], "count"))
        return count(argv[2], argv[3], strtoull(argv[4], NULL, 10), strtoull(argv[5], NULL, 10),
                     strtod(argv[6], NULL));
    fprintf(stderr, "usage: joiner_e2e_tool produce BOOTSTRAP FIRST COUNT [RATE]\n"
                    "       joiner_e2e_tool count BOOTSTRAP GROUP FIRST COUNT TIMEOUT_S\n");
    return 2;
}
