/*
 * consumer.c - an at-least-once consumer-group member over librdkafka.
 *
 * librdkafka stores and commits nothing by itself here (enable.auto.commit=false,
 * enable.auto.offset.store=false): the member keeps its own table of positions, one entry
 * per partition ever assigned, and commits only what the caller marked as processed.
 *
 *   part_t: topic (interned) | partition | assigned | next (marked position) | committed
 *
 * Invariants: next and committed only grow while a partition stays assigned; marks of
 * unassigned partitions are dropped (the partition's new owner delivers the message again).
 *
 * Revocation commits the marked positions of the revoked partitions. When that commit fails
 * (librdkafka's mock cluster refuses every commit during a rebalance; a real broker accepts
 * them until the group moves on) the marked position is kept as "carried": if the very next
 * assignment gives the partition back to this member, consumption resumes at the carried
 * position (not at the stale committed one) and the position is committed at once. Any
 * other partition's carry is dropped at that assignment, and its new owner starts from the
 * last committed position: redelivery, never loss. Resuming at a carried position is safe
 * even if someone else owned the partition meanwhile: a position marks a processed prefix.
 *
 * Caller-owned positions (mt_kafka_consumer_set_positions, `owned`): next is then the
 * caller's position of the partition, set or marked, kept across revocations; an assignment
 * starts each partition at its next (the beginning without one); nothing is committed but
 * what mt_kafka_consumer_commit_positions() is given; poll drops messages below next.
 *
 * Locks: commit_lock -> lock.
 *   commit_lock  serializes commits (explicit ones, the revocation in the rebalance callback,
 *                destroy) so that a later position is never overwritten by an earlier one;
 *                held across the synchronous commit round trip.
 *   lock         guards topics[] and parts[]; never held across a call into the network.
 * The poll thread alone touches held[] and the topic cache. The rebalance callback runs
 * inside rd_kafka_consumer_poll() / rd_kafka_consumer_close(), on the thread calling them.
 *
 * Closing: the callback that rd_kafka_consumer_close() runs makes no request of librdkafka's
 * group thread but the unassign the close waits for. In librdkafka 2.0.2 such requests
 * (rd_kafka_rebalance_protocol(), rd_kafka_assignment(), a synchronous commit) wait without
 * a limit for a reply, and a group that finishes terminating meanwhile purges its request
 * queue unanswered: the close then never returns (its issues #4041 and #4884). So the
 * protocol is read from the configuration at creation, `assigned` is counted from parts[],
 * and destroy commits before it closes, not inside the callback.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "kafka_int.h"
#include "mt/kafka.h"
#include "mt/log.h"

typedef struct part {
    const char *topic; /* interned: points into topics[] */
    int32_t partition;
    int assigned;
    int carried;       /* unassigned, next kept for the next assignment (see above) */
    int64_t next;      /* marked position (offset of the next message to process), -1: none */
    int64_t committed; /* last position committed by this member in this assignment, -1 */
} part_t;

struct mt_kafka_consumer {
    rd_kafka_t *rk;
    pthread_mutex_t commit_lock;

    pthread_mutex_t lock; /* guards the fields up to the next blank line */
    char **topics;        /* every topic name seen, freed at destroy */
    size_t ntopics, topics_cap;
    part_t *parts;
    size_t nparts, parts_cap;

    /* poll thread only */
    rd_kafka_message_t **held; /* the messages handed out by the last poll */
    size_t nheld, held_cap;
    const char *cached_topic; /* interned name of the last message's topic */

    int coop;            /* cooperative rebalance protocol (set at creation) */
    _Atomic int closing; /* destroy has begun: the callback commits nothing */
    _Atomic size_t assigned;
    _Atomic int owned; /* caller-owned positions (set once, never cleared) */
    _Atomic uint64_t skipped;
    _Atomic uint64_t messages, errors, commits, commit_failures, assignments, revocations;
};

/* ---------------- tables (caller holds lock) ---------------- */

static const char *intern_locked(mt_kafka_consumer_t *c, const char *name) {
    for (size_t i = 0; i < c->ntopics; i++)
        if (!strcmp(c->topics[i], name)) return c->topics[i];
    if (c->ntopics == c->topics_cap) {
        size_t cap = c->topics_cap ? 2 * c->topics_cap : 8;
        char **t = realloc(c->topics, cap * sizeof(*t));
        if (!t) return NULL;
        c->topics = t;
        c->topics_cap = cap;
    }
    char *s = strdup(name);
    if (!s) return NULL;
    c->topics[c->ntopics++] = s;
    return s;
}

static part_t *find_locked(mt_kafka_consumer_t *c, const char *topic, int32_t partition) {
    for (size_t i = 0; i < c->nparts; i++) {
        part_t *pt = &c->parts[i];
        if (pt->partition == partition && (pt->topic == topic || !strcmp(pt->topic, topic)))
            return pt;
    }
    return NULL;
}

static part_t *find_or_add_locked(mt_kafka_consumer_t *c, const char *topic, int32_t partition) {
    part_t *pt = find_locked(c, topic, partition);
    if (pt) return pt;
    const char *name = intern_locked(c, topic);
    if (!name) return NULL;
    if (c->nparts == c->parts_cap) {
        size_t cap = c->parts_cap ? 2 * c->parts_cap : 16;
        part_t *p = realloc(c->parts, cap * sizeof(*p));
        if (!p) return NULL;
        c->parts = p;
        c->parts_cap = cap;
    }
    pt = &c->parts[c->nparts++];
    pt->topic = name;
    pt->partition = partition;
    pt->assigned = 0;
    pt->next = pt->committed = -1;
    return pt;
}

/* ---------------- commits ---------------- */

static int in_list(const rd_kafka_topic_partition_list_t *l, const part_t *pt) {
    for (int i = 0; i < l->cnt; i++)
        if (l->elems[i].partition == pt->partition && !strcmp(l->elems[i].topic, pt->topic))
            return 1;
    return 0;
}

/* Commits the marked, uncommitted positions of assigned partitions (only those in @p only,
 * if not NULL). Caller holds commit_lock. */
static mt_err_t commit_cl(mt_kafka_consumer_t *c, const rd_kafka_topic_partition_list_t *only) {
    if (atomic_load(&c->owned)) return MT_OK; /* the caller commits its own positions */
    pthread_mutex_lock(&c->lock);
    rd_kafka_topic_partition_list_t *l =
        rd_kafka_topic_partition_list_new(c->nparts ? (int)c->nparts : 1);
    for (size_t i = 0; i < c->nparts; i++) {
        part_t *pt = &c->parts[i];
        if (!pt->assigned || pt->next <= pt->committed || (only && !in_list(only, pt))) continue;
        rd_kafka_topic_partition_list_add(l, pt->topic, pt->partition)->offset = pt->next;
    }
    pthread_mutex_unlock(&c->lock);
    if (l->cnt == 0) {
        rd_kafka_topic_partition_list_destroy(l);
        return MT_OK;
    }
    rd_kafka_resp_err_t e = rd_kafka_commit(c->rk, l, 0 /* synchronous */);
    uint64_t ok = 0;
    rd_kafka_resp_err_t first = e;
    pthread_mutex_lock(&c->lock);
    for (int i = 0; i < l->cnt; i++) {
        const rd_kafka_topic_partition_t *el = &l->elems[i];
        if (e || el->err) {
            if (!first) first = el->err;
            continue;
        }
        part_t *pt = find_locked(c, el->topic, el->partition);
        if (pt && pt->assigned && el->offset > pt->committed) pt->committed = el->offset;
        ok++;
    }
    pthread_mutex_unlock(&c->lock);
    atomic_fetch_add(&c->commits, ok);
    rd_kafka_topic_partition_list_destroy(l);
    if (!first) return MT_OK;
    uint64_t n = atomic_fetch_add(&c->commit_failures, 1) + 1;
    if (n <= 10 || n % 1000 == 0)
        mt_log(MT_LOG_WARN, MT__KAFKA_WHO, "%s: commit failed (%llu so far): %s",
               rd_kafka_name(c->rk), (unsigned long long)n, rd_kafka_err2str(first));
    switch (first) {
    case RD_KAFKA_RESP_ERR_REBALANCE_IN_PROGRESS:
    case RD_KAFKA_RESP_ERR_ILLEGAL_GENERATION:
    case RD_KAFKA_RESP_ERR_UNKNOWN_MEMBER_ID:
    case RD_KAFKA_RESP_ERR__STATE:
    case RD_KAFKA_RESP_ERR__WAIT_COORD:
    case RD_KAFKA_RESP_ERR_COORDINATOR_NOT_AVAILABLE:
    case RD_KAFKA_RESP_ERR_NOT_COORDINATOR: return MT_UNAVAILABLE;
    default: return MT_IO;
    }
}

/* ---------------- callbacks ---------------- */

/* How many partitions this member holds, from parts[] (caller holds lock). */
static void count_assigned_locked(mt_kafka_consumer_t *c) {
    size_t n = 0;
    for (size_t i = 0; i < c->nparts; i++)
        n += c->parts[i].assigned == 1;
    atomic_store(&c->assigned, n);
}

/* Assignment: entries for @p parts; carried positions become start offsets in @p parts
 * (which the caller passes to assign). @returns how many carried positions were resumed. */
static int on_assign(mt_kafka_consumer_t *c, rd_kafka_topic_partition_list_t *parts) {
    int resumed = 0;
    pthread_mutex_lock(&c->lock);
    if (atomic_load(&c->owned)) { /* every partition starts at the caller's position */
        for (int i = 0; i < parts->cnt; i++) {
            rd_kafka_topic_partition_t *el = &parts->elems[i];
            part_t *pt = find_or_add_locked(c, el->topic, el->partition);
            if (!pt) {
                mt_log(MT_LOG_ERROR, MT__KAFKA_WHO, "out of memory: %s [%d] starts at 0", el->topic,
                       (int)el->partition);
                el->offset = RD_KAFKA_OFFSET_BEGINNING;
                continue;
            }
            el->offset = pt->next >= 0 ? pt->next : RD_KAFKA_OFFSET_BEGINNING;
            pt->carried = 0;
            pt->committed = -1;
            pt->assigned = 1;
        }
        count_assigned_locked(c);
        pthread_mutex_unlock(&c->lock);
        return 0; /* nothing to commit */
    }
    for (size_t i = 0; i < c->nparts; i++)
        c->parts[i].assigned |= 2; /* tag: "not in this assignment" unless seen below */
    for (int i = 0; i < parts->cnt; i++) {
        rd_kafka_topic_partition_t *el = &parts->elems[i];
        part_t *pt = find_or_add_locked(c, el->topic, el->partition);
        if (!pt) {
            mt_log(MT_LOG_ERROR, MT__KAFKA_WHO, "out of memory: marks of %s [%d] are ignored",
                   el->topic, (int)el->partition);
            continue;
        }
        if (pt->carried && pt->next >= 0) {
            el->offset = pt->next;
            pt->committed = -1; /* commit the carried position */
            resumed++;
        } else {
            pt->next = pt->committed = -1;
        }
        pt->carried = 0;
        pt->assigned = 1;
    }
    for (size_t i = 0; i < c->nparts; i++) {
        part_t *pt = &c->parts[i];
        if (!(pt->assigned & 2)) continue;
        pt->assigned &= 1; /* still owned (cooperative protocol) or not owned */
        if (pt->carried) {
            pt->carried = 0;
            pt->next = pt->committed = -1;
        }
    }
    count_assigned_locked(c);
    pthread_mutex_unlock(&c->lock);
    return resumed;
}

/* Revocation (caller holds commit_lock, has tried to commit): keep uncommitted marks as
 * carried unless the partitions were lost. */
static void on_revoke(mt_kafka_consumer_t *c, const rd_kafka_topic_partition_list_t *parts,
                      int lost) {
    int owned = atomic_load(&c->owned);
    pthread_mutex_lock(&c->lock);
    for (int i = 0; i < parts->cnt; i++) {
        part_t *pt = find_locked(c, parts->elems[i].topic, parts->elems[i].partition);
        if (!pt) continue;
        if (owned) { /* the position is the caller's: kept */
            pt->assigned = 0;
            pt->committed = -1;
            continue;
        }
        pt->carried = !lost && pt->assigned && pt->next > pt->committed;
        if (!pt->carried) pt->next = -1;
        pt->committed = -1;
        pt->assigned = 0;
    }
    count_assigned_locked(c);
    pthread_mutex_unlock(&c->lock);
}

static void log_assign_error(rd_kafka_t *rk, const char *what, rd_kafka_error_t *err,
                             rd_kafka_resp_err_t e) {
    if (err) {
        mt_log(MT_LOG_ERROR, MT__KAFKA_WHO, "%s: %s: %s", rd_kafka_name(rk), what,
               rd_kafka_error_string(err));
        rd_kafka_error_destroy(err);
    } else if (e) {
        mt_log(MT_LOG_ERROR, MT__KAFKA_WHO, "%s: %s: %s", rd_kafka_name(rk), what,
               rd_kafka_err2str(e));
    }
}

static void rebalance_cb(rd_kafka_t *rk, rd_kafka_resp_err_t err,
                         rd_kafka_topic_partition_list_t *parts, void *opaque) {
    mt_kafka_consumer_t *c = opaque;
    int coop = c->coop; /* not rd_kafka_rebalance_protocol(): see "Closing" above */
    if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
        int resumed = on_assign(c, parts);
        atomic_fetch_add(&c->assignments, 1);
        mt_log(MT_LOG_INFO, MT__KAFKA_WHO, "%s: %d partitions assigned (%d at carried positions)",
               rd_kafka_name(rk), parts->cnt, resumed);
        if (coop)
            log_assign_error(rk, "incremental assign", rd_kafka_incremental_assign(rk, parts), 0);
        else
            log_assign_error(rk, "assign", NULL, rd_kafka_assign(rk, parts));
        if (resumed) {
            pthread_mutex_lock(&c->commit_lock);
            commit_cl(c, NULL);
            pthread_mutex_unlock(&c->commit_lock);
        }
    } else {
        /* REVOKE (or an error: treated as losing everything). Commit what was processed of
         * the revoked partitions while this member still owns them, then unassign their
         * entries (carrying what the commit did not take): both under commit_lock, so that
         * no mark slips in between unnoticed. */
        int lost = err != RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS || rd_kafka_assignment_lost(rk);
        pthread_mutex_lock(&c->commit_lock);
        if (!lost && !atomic_load(&c->closing)) commit_cl(c, parts);
        on_revoke(c, parts, lost);
        pthread_mutex_unlock(&c->commit_lock);
        atomic_fetch_add(&c->revocations, 1);
        mt_log(MT_LOG_INFO, MT__KAFKA_WHO, "%s: %d partitions %s", rd_kafka_name(rk), parts->cnt,
               lost ? "lost" : "revoked");
        if (coop)
            log_assign_error(rk, "incremental unassign", rd_kafka_incremental_unassign(rk, parts),
                             0);
        else
            log_assign_error(rk, "unassign", NULL, rd_kafka_assign(rk, NULL));
    }
}

static void count_error(mt_kafka_consumer_t *c, rd_kafka_resp_err_t e, const char *reason) {
    uint64_t n = atomic_fetch_add(&c->errors, 1) + 1;
    /* Connection failures are already logged by librdkafka (FAIL lines). */
    if (e != RD_KAFKA_RESP_ERR__TRANSPORT && (n <= 10 || n % 1000 == 0))
        mt_log(MT_LOG_WARN, MT__KAFKA_WHO, "%s: consumer error (%llu so far): %s: %s",
               rd_kafka_name(c->rk), (unsigned long long)n, rd_kafka_err2name(e), reason);
}

static void error_cb(rd_kafka_t *rk, int err, const char *reason, void *opaque) {
    (void)rk;
    count_error(opaque, (rd_kafka_resp_err_t)err, reason);
}

/* ---------------- API ---------------- */

mt_err_t mt_kafka_consumer_create(const char *bootstrap, const char *group,
                                  const char *const *topics, size_t ntopics,
                                  const char *const *conf, mt_kafka_consumer_t **out, char *errbuf,
                                  size_t errlen) {
    mt__kafka_errf(errbuf, errlen, "%s", "");
    if (!out || !bootstrap || !*bootstrap || !group || !*group || !topics || !ntopics ||
        ntopics > 1000) {
        mt__kafka_errf(errbuf, errlen, "need a bootstrap, a group and 1..1000 topics");
        return MT_INVALID;
    }
    for (size_t i = 0; i < ntopics; i++) {
        if (!topics[i] || !*topics[i]) {
            mt__kafka_errf(errbuf, errlen, "topic %zu is empty", i);
            return MT_INVALID;
        }
    }
    static const char *const defaults[] = {"client.id=monolith",
                                           "enable.auto.commit=false",
                                           "enable.auto.offset.store=false",
                                           "auto.offset.reset=earliest",
                                           "enable.partition.eof=false",
                                           NULL};
    rd_kafka_conf_t *rconf = NULL;
    rd_kafka_topic_partition_list_t *sub = NULL;
    mt_kafka_consumer_t *c = calloc(1, sizeof(*c));
    if (!c) return MT_NOMEM;
    pthread_mutex_init(&c->commit_lock, NULL);
    pthread_mutex_init(&c->lock, NULL);
    mt_err_t rc = mt__kafka_conf_new(defaults, conf, &rconf, errbuf, errlen);
    if (!rc) rc = mt__kafka_conf_set(rconf, "bootstrap.servers", bootstrap, errbuf, errlen);
    if (!rc) rc = mt__kafka_conf_set(rconf, "group.id", group, errbuf, errlen);
    if (rc) goto fail;
    char strategy[256];
    size_t slen = sizeof(strategy);
    if (rd_kafka_conf_get(rconf, "partition.assignment.strategy", strategy, &slen) ==
        RD_KAFKA_CONF_OK)
        c->coop = strstr(strategy, "cooperative") != NULL; /* librdkafka refuses a mix */
    rd_kafka_conf_set_rebalance_cb(rconf, rebalance_cb);
    rd_kafka_conf_set_error_cb(rconf, error_cb);
    rd_kafka_conf_set_opaque(rconf, c);
    char errstr[512];
    c->rk = rd_kafka_new(RD_KAFKA_CONSUMER, rconf, errstr, sizeof(errstr));
    if (!c->rk) {
        mt__kafka_errf(errbuf, errlen, "cannot create a consumer: %s", errstr);
        rc = MT_INTERNAL;
        goto fail;
    }
    rconf = NULL;                      /* owned by c->rk */
    rd_kafka_poll_set_consumer(c->rk); /* one queue: callbacks run inside our poll */
    sub = rd_kafka_topic_partition_list_new((int)ntopics);
    for (size_t i = 0; i < ntopics; i++)
        rd_kafka_topic_partition_list_add(sub, topics[i], RD_KAFKA_PARTITION_UA);
    rd_kafka_resp_err_t e = rd_kafka_subscribe(c->rk, sub);
    rd_kafka_topic_partition_list_destroy(sub);
    if (e) {
        mt__kafka_errf(errbuf, errlen, "cannot subscribe: %s", rd_kafka_err2str(e));
        rc = e == RD_KAFKA_RESP_ERR__INVALID_ARG ? MT_INVALID : MT_INTERNAL;
        goto fail;
    }
    *out = c;
    return MT_OK;
fail:
    if (rconf) rd_kafka_conf_destroy(rconf);
    if (c->rk) rd_kafka_destroy(c->rk);
    pthread_mutex_destroy(&c->commit_lock);
    pthread_mutex_destroy(&c->lock);
    free(c);
    return rc;
}

static void release_held(mt_kafka_consumer_t *c) {
    for (size_t i = 0; i < c->nheld; i++)
        rd_kafka_message_destroy(c->held[i]);
    c->nheld = 0;
}

/* The interned name of @p rkm's topic (the poll thread's cache first). */
static const char *topic_of(mt_kafka_consumer_t *c, const rd_kafka_message_t *rkm) {
    const char *name = rd_kafka_topic_name(rkm->rkt);
    if (c->cached_topic && !strcmp(c->cached_topic, name)) return c->cached_topic;
    pthread_mutex_lock(&c->lock);
    const char *t = intern_locked(c, name);
    pthread_mutex_unlock(&c->lock);
    if (t) c->cached_topic = t;
    return t ? t : name; /* out of memory: valid as long as the message */
}

/* Caller-owned positions: @returns 1 if @p rkm is below its partition's position. */
static int below_position(mt_kafka_consumer_t *c, const rd_kafka_message_t *rkm) {
    const char *topic = topic_of(c, rkm);
    pthread_mutex_lock(&c->lock);
    const part_t *pt = find_locked(c, topic, rkm->partition);
    int below = pt && pt->next >= 0 && rkm->offset < pt->next;
    pthread_mutex_unlock(&c->lock);
    return below;
}

size_t mt_kafka_consumer_poll(mt_kafka_consumer_t *c, mt_kafka_msg_t *msgs, size_t cap,
                              int timeout_ms) {
    release_held(c);
    if (!cap || !msgs) return 0;
    if (cap > c->held_cap) {
        rd_kafka_message_t **h = realloc(c->held, cap * sizeof(*h));
        if (h) {
            c->held = h;
            c->held_cap = cap;
        } else if (!c->held_cap) {
            mt_log(MT_LOG_ERROR, MT__KAFKA_WHO, "out of memory for %zu messages", cap);
            return 0;
        } else {
            cap = c->held_cap;
        }
    }
    int64_t deadline = timeout_ms < 0 ? INT64_MAX : mt__kafka_now_ms() + timeout_ms;
    size_t n = 0;
    while (n < cap) {
        int wait_ms = 0;
        if (n == 0 && timeout_ms < 0) {
            wait_ms = -1;
        } else if (n == 0) {
            int64_t left = deadline - mt__kafka_now_ms();
            wait_ms = left > 0 ? (left > 1000000 ? 1000000 : (int)left) : 0;
        }
        rd_kafka_message_t *rkm = rd_kafka_consumer_poll(c->rk, wait_ms);
        if (!rkm) {
            if (n > 0 || wait_ms == 0 || mt__kafka_now_ms() >= deadline) break;
            continue;
        }
        if (rkm->err) {
            if (rkm->err != RD_KAFKA_RESP_ERR__PARTITION_EOF)
                count_error(c, rkm->err, rd_kafka_message_errstr(rkm));
            rd_kafka_message_destroy(rkm);
            if (n == 0 && timeout_ms >= 0 && mt__kafka_now_ms() >= deadline) break;
            continue;
        }
        if (atomic_load(&c->owned) && below_position(c, rkm)) {
            atomic_fetch_add(&c->skipped, 1);
            rd_kafka_message_destroy(rkm);
            continue;
        }
        c->held[c->nheld++] = rkm;
        mt__kafka_msg_fill(&msgs[n++], rkm, topic_of(c, rkm));
    }
    atomic_fetch_add(&c->messages, (uint64_t)n);
    return n;
}

void mt_kafka_consumer_mark(mt_kafka_consumer_t *c, const mt_kafka_msg_t *msg) {
    if (!c || !msg || !msg->topic || msg->offset < 0) return;
    int owned = atomic_load(&c->owned);
    pthread_mutex_lock(&c->lock);
    part_t *pt = owned ? find_or_add_locked(c, msg->topic, msg->partition)
                       : find_locked(c, msg->topic, msg->partition);
    if (pt && (pt->assigned || pt->carried || owned) && msg->offset + 1 > pt->next)
        pt->next = msg->offset + 1;
    pthread_mutex_unlock(&c->lock);
}

mt_err_t mt_kafka_consumer_commit(mt_kafka_consumer_t *c) {
    if (!c) return MT_INVALID;
    pthread_mutex_lock(&c->commit_lock);
    mt_err_t rc = commit_cl(c, NULL);
    pthread_mutex_unlock(&c->commit_lock);
    return rc;
}

size_t mt_kafka_consumer_assigned(const mt_kafka_consumer_t *c) {
    return atomic_load(&((mt_kafka_consumer_t *)c)->assigned);
}

/* Where partitions that returned no message since their assignment (position unknown to
 * librdkafka) start: the caller's position (caller-owned mode), else the group's committed
 * offset (one broker round trip for all of them), else -1 (the beginning). */
static void start_positions(mt_kafka_consumer_t *c, rd_kafka_topic_partition_list_t *parts) {
    rd_kafka_topic_partition_list_t *ask = NULL;
    pthread_mutex_lock(&c->lock);
    for (int i = 0; i < parts->cnt; i++) {
        rd_kafka_topic_partition_t *tp = &parts->elems[i];
        if (tp->offset >= 0) continue;
        part_t *pt = find_locked(c, tp->topic, tp->partition);
        if (atomic_load(&c->owned)) {
            tp->offset = pt && pt->next >= 0 ? pt->next : -1;
        } else {
            if (!ask) ask = rd_kafka_topic_partition_list_new(parts->cnt);
            if (ask) rd_kafka_topic_partition_list_add(ask, tp->topic, tp->partition);
        }
    }
    pthread_mutex_unlock(&c->lock);
    if (!ask) return;
    if (rd_kafka_committed(c->rk, ask, 2000) == RD_KAFKA_RESP_ERR_NO_ERROR) {
        for (int i = 0; i < ask->cnt; i++) {
            rd_kafka_topic_partition_t *tp = rd_kafka_topic_partition_list_find(
                parts, ask->elems[i].topic, ask->elems[i].partition);
            if (tp && ask->elems[i].err == RD_KAFKA_RESP_ERR_NO_ERROR)
                tp->offset = ask->elems[i].offset;
        }
    }
    rd_kafka_topic_partition_list_destroy(ask);
}

#define LAG_QUERY_MS 1000 /* a watermark query of a partition the fetcher has no figures for */

int64_t mt_kafka_consumer_lag(const mt_kafka_consumer_t *c) {
    rd_kafka_topic_partition_list_t *parts = NULL;
    if (rd_kafka_assignment(c->rk, &parts) != RD_KAFKA_RESP_ERR_NO_ERROR || !parts) return -1;
    int64_t lag = parts->cnt ? 0 : -1;
    if (parts->cnt && rd_kafka_position(c->rk, parts) != RD_KAFKA_RESP_ERR_NO_ERROR) lag = -1;
    if (lag >= 0) start_positions((mt_kafka_consumer_t *)c, parts);
    for (int i = 0; i < parts->cnt && lag >= 0; i++) {
        const rd_kafka_topic_partition_t *tp = &parts->elems[i];
        int64_t lo = -1, hi = -1;
        if (rd_kafka_get_watermark_offsets(c->rk, tp->topic, tp->partition, &lo, &hi) !=
                RD_KAFKA_RESP_ERR_NO_ERROR ||
            hi < 0 || lo < 0) {
            /* Not fetched yet, or never (a partition whose fetch did not start): ask the
             * leader, so that a stalled partition shows as lag instead of "unknown". */
            lo = hi = -1;
            if (rd_kafka_query_watermark_offsets(c->rk, tp->topic, tp->partition, &lo, &hi,
                                                 LAG_QUERY_MS) != RD_KAFKA_RESP_ERR_NO_ERROR ||
                hi < 0 || lo < 0) {
                lag = -1;
                break;
            }
        }
        int64_t pos = tp->offset >= 0 ? tp->offset : lo;
        if (hi > pos) lag += hi - pos;
    }
    rd_kafka_topic_partition_list_destroy(parts);
    return lag;
}

/* Seeks every partition of @p l to its offset. @returns MT_OK or MT_IO (errbuf says which). */
static mt_err_t seek_list(mt_kafka_consumer_t *c, rd_kafka_topic_partition_list_t *l, char *errbuf,
                          size_t errlen) {
    /* Waits until nothing fetched for the old positions can be returned by a poll. No finite
     * timeout: librdkafka 2.0.2 reads it as microseconds (fixed in 2.1.0, PR #4230); a seek
     * is a local operation that the fetcher takes at once, and the Confluent clients wait
     * without a limit too. */
    rd_kafka_error_t *e = rd_kafka_seek_partitions(c->rk, l, -1);
    if (e) {
        mt__kafka_errf(errbuf, errlen, "seek: %s", rd_kafka_error_string(e));
        rd_kafka_error_destroy(e);
        return MT_IO;
    }
    for (int i = 0; i < l->cnt; i++) {
        if (l->elems[i].err) {
            mt__kafka_errf(errbuf, errlen, "seek %s [%d]: %s", l->elems[i].topic,
                           (int)l->elems[i].partition, rd_kafka_err2str(l->elems[i].err));
            return MT_IO;
        }
    }
    return MT_OK;
}

mt_err_t mt_kafka_consumer_reseek(mt_kafka_consumer_t *c, char *errbuf, size_t errlen) {
    mt__kafka_errf(errbuf, errlen, "%s", "");
    if (!c) return MT_INVALID;
    pthread_mutex_lock(&c->lock);
    int owned = atomic_load(&c->owned);
    rd_kafka_topic_partition_list_t *l =
        rd_kafka_topic_partition_list_new(c->nparts ? (int)c->nparts : 1);
    for (size_t i = 0; i < c->nparts; i++) {
        const part_t *pt = &c->parts[i];
        if (pt->assigned == 1)
            rd_kafka_topic_partition_list_add(l, pt->topic, pt->partition)->offset =
                pt->next >= 0 ? pt->next : -1;
    }
    pthread_mutex_unlock(&c->lock);
    start_positions(c, l); /* unmarked ones: the caller's position or the committed offset */
    rd_kafka_topic_partition_list_t *go = rd_kafka_topic_partition_list_new(l->cnt ? l->cnt : 1);
    for (int i = 0; i < l->cnt; i++) {
        int64_t off = l->elems[i].offset;
        if (off == -1 && !owned) continue; /* the committed offset is unknown: left alone */
        if (off < 0) off = RD_KAFKA_OFFSET_BEGINNING; /* nothing committed, no position */
        rd_kafka_topic_partition_list_add(go, l->elems[i].topic, l->elems[i].partition)->offset =
            off;
    }
    rd_kafka_topic_partition_list_destroy(l);
    mt_err_t err = MT_OK;
    if (go->cnt) err = seek_list(c, go, errbuf, errlen);
    mt_log(err ? MT_LOG_WARN : MT_LOG_INFO, MT__KAFKA_WHO,
           "%s: %d assigned partitions sought again%s%s", rd_kafka_name(c->rk), go->cnt,
           err ? ": " : "", err && errbuf ? errbuf : "");
    rd_kafka_topic_partition_list_destroy(go);
    return err;
}

void mt_kafka_consumer_counts(const mt_kafka_consumer_t *c, mt_kafka_consumer_counts_t *out) {
    mt_kafka_consumer_t *m = (mt_kafka_consumer_t *)c;
    out->messages = atomic_load(&m->messages);
    out->errors = atomic_load(&m->errors);
    out->commits = atomic_load(&m->commits);
    out->commit_failures = atomic_load(&m->commit_failures);
    out->assignments = atomic_load(&m->assignments);
    out->revocations = atomic_load(&m->revocations);
}

void mt_kafka_consumer_destroy(mt_kafka_consumer_t *c) {
    if (!c) return;
    mt_kafka_consumer_commit(c);
    release_held(c);
    /* Leaves the group: the rebalance callback runs once more (revocation: everything marked
     * is committed above, nobody marks now) and the group reassigns our partitions. */
    atomic_store(&c->closing, 1);
    rd_kafka_resp_err_t e = rd_kafka_consumer_close(c->rk);
    if (e)
        mt_log(MT_LOG_WARN, MT__KAFKA_WHO, "%s: close: %s", rd_kafka_name(c->rk),
               rd_kafka_err2str(e));
    rd_kafka_destroy(c->rk);
    for (size_t i = 0; i < c->ntopics; i++)
        free(c->topics[i]);
    free(c->topics);
    free(c->parts);
    free(c->held);
    pthread_mutex_destroy(&c->commit_lock);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

/* ---------------- caller-owned positions ---------------- */

mt_err_t mt_kafka_consumer_set_positions(mt_kafka_consumer_t *c, const mt_kafka_position_t *pos,
                                         size_t n, char *errbuf, size_t errlen) {
    mt__kafka_errf(errbuf, errlen, "%s", "");
    if (!c || (n && !pos)) return MT_INVALID;
    for (size_t i = 0; i < n; i++) {
        if (!pos[i].topic || !*pos[i].topic || pos[i].offset < 0 || pos[i].partition < 0) {
            mt__kafka_errf(errbuf, errlen, "position %zu: bad topic, partition or offset", i);
            return MT_INVALID;
        }
    }
    pthread_mutex_lock(&c->commit_lock); /* no commit of marks races the switch */
    atomic_store(&c->owned, 1);
    pthread_mutex_lock(&c->lock);
    mt_err_t err = MT_OK;
    for (size_t i = 0; i < c->nparts; i++) {
        c->parts[i].next = -1;
        c->parts[i].carried = 0;
    }
    for (size_t i = 0; i < n && !err; i++) {
        part_t *pt = find_or_add_locked(c, pos[i].topic, pos[i].partition);
        if (!pt) {
            err = MT_NOMEM;
            break;
        }
        pt->next = pos[i].offset;
    }
    rd_kafka_topic_partition_list_t *l = NULL;
    if (!err) {
        l = rd_kafka_topic_partition_list_new(c->nparts ? (int)c->nparts : 1);
        for (size_t i = 0; i < c->nparts; i++) {
            const part_t *pt = &c->parts[i];
            if (!pt->assigned) continue;
            rd_kafka_topic_partition_list_add(l, pt->topic, pt->partition)->offset =
                pt->next >= 0 ? pt->next : RD_KAFKA_OFFSET_BEGINNING;
        }
    }
    pthread_mutex_unlock(&c->lock);
    pthread_mutex_unlock(&c->commit_lock);
    if (err) {
        mt__kafka_errf(errbuf, errlen, "out of memory");
        return err;
    }
    if (l->cnt) err = seek_list(c, l, errbuf, errlen);
    mt_log(err ? MT_LOG_WARN : MT_LOG_INFO, MT__KAFKA_WHO,
           "%s: caller-owned positions: %zu set, %d assigned partitions moved%s%s",
           rd_kafka_name(c->rk), n, l->cnt, err ? ": " : "", err && errbuf ? errbuf : "");
    rd_kafka_topic_partition_list_destroy(l);
    return err;
}

/* The entries of parts[] that `assignment` picks (1: the assigned partitions, at their
 * caller-owned positions or -1; 0: every partition with a known position), up to cap of
 * them in out; *n counts all. */
static void list_parts(mt_kafka_consumer_t *c, int assignment, mt_kafka_position_t *out, size_t cap,
                       size_t *n) {
    size_t k = 0;
    pthread_mutex_lock(&c->lock);
    int owned = atomic_load(&c->owned);
    for (size_t i = 0; i < c->nparts; i++) {
        const part_t *pt = &c->parts[i];
        if (assignment ? pt->assigned != 1 : pt->next < 0) continue;
        int64_t pos = !assignment || (owned && pt->next >= 0) ? pt->next : -1;
        if (k < cap) out[k] = (mt_kafka_position_t){pt->topic, pt->partition, pos};
        k++;
    }
    pthread_mutex_unlock(&c->lock);
    *n = k;
}

void mt_kafka_consumer_positions(mt_kafka_consumer_t *c, mt_kafka_position_t *out, size_t cap,
                                 size_t *n) {
    list_parts(c, 0, out, cap, n);
}

uint64_t mt_kafka_consumer_generation(const mt_kafka_consumer_t *c) {
    mt_kafka_consumer_t *m = (mt_kafka_consumer_t *)c;
    return atomic_load(&m->assignments) + atomic_load(&m->revocations);
}

void mt_kafka_consumer_assignment(mt_kafka_consumer_t *c, mt_kafka_position_t *out, size_t cap,
                                  size_t *n) {
    list_parts(c, 1, out, cap, n);
}

mt_err_t mt_kafka_consumer_log_start(mt_kafka_consumer_t *c, const char *topic, int32_t partition,
                                     int timeout_ms, int64_t *lo, char *errbuf, size_t errlen) {
    int64_t low = -1, high = -1;
    rd_kafka_resp_err_t e =
        rd_kafka_query_watermark_offsets(c->rk, topic, partition, &low, &high, timeout_ms);
    if (e) {
        mt__kafka_errf(errbuf, errlen, "%s [%d]: the log start: %s", topic, (int)partition,
                       rd_kafka_err2str(e));
        return e == RD_KAFKA_RESP_ERR__TIMED_OUT ? MT_TIMEOUT : MT_IO;
    }
    *lo = low;
    return MT_OK;
}

mt_err_t mt_kafka_consumer_commit_positions(mt_kafka_consumer_t *c, const mt_kafka_position_t *pos,
                                            size_t n) {
    if (!c || (n && !pos)) return MT_INVALID;
    if (!n) return MT_OK;
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new((int)n);
    for (size_t i = 0; i < n; i++)
        rd_kafka_topic_partition_list_add(l, pos[i].topic, pos[i].partition)->offset =
            pos[i].offset;
    pthread_mutex_lock(&c->commit_lock);
    rd_kafka_resp_err_t e = rd_kafka_commit(c->rk, l, 0 /* synchronous */);
    pthread_mutex_unlock(&c->commit_lock);
    uint64_t ok = 0;
    for (int i = 0; i < l->cnt; i++) {
        if (!e && l->elems[i].err) e = l->elems[i].err;
        if (!e) ok++;
    }
    rd_kafka_topic_partition_list_destroy(l);
    atomic_fetch_add(&c->commits, ok);
    if (!e) return MT_OK;
    uint64_t k = atomic_fetch_add(&c->commit_failures, 1) + 1;
    if (k <= 10 || k % 1000 == 0)
        mt_log(MT_LOG_WARN, MT__KAFKA_WHO, "%s: commit of positions failed (%llu so far): %s",
               rd_kafka_name(c->rk), (unsigned long long)k, rd_kafka_err2str(e));
    return e == RD_KAFKA_RESP_ERR_REBALANCE_IN_PROGRESS ||
                   e == RD_KAFKA_RESP_ERR_ILLEGAL_GENERATION ||
                   e == RD_KAFKA_RESP_ERR_UNKNOWN_MEMBER_ID || e == RD_KAFKA_RESP_ERR__STATE ||
                   e == RD_KAFKA_RESP_ERR__WAIT_COORD ||
                   e == RD_KAFKA_RESP_ERR_COORDINATOR_NOT_AVAILABLE ||
                   e == RD_KAFKA_RESP_ERR_NOT_COORDINATOR
               ? MT_UNAVAILABLE
               : MT_IO;
}

uint64_t mt_kafka_consumer_skipped(const mt_kafka_consumer_t *c) {
    return atomic_load(&((mt_kafka_consumer_t *)c)->skipped);
}
