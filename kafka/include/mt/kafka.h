/*
 * kafka.h - Kafka for Monolith-C: an embedded mock cluster, a producer and an at-least-once
 * consumer-group member, over librdkafka. No librdkafka type appears here: errors are
 * translated to mt_err_t at this edge (see DESIGN.md section 5 for the topics).
 *
 * The mock cluster (mt_kafka_mock_*) is librdkafka's in-process broker: real Kafka protocol on
 * 127.0.0.1, good for tests, demos and the monolith-kafka-dev daemon. Its limits: each
 * partition keeps only about 5 MiB or 100,000 messages (older ones are dropped silently); the
 * first group assignment arrives about 3 s after subscribe, and a reassignment waits
 * session.timeout.ms - 1000 ms after a member joins or leaves. A real cluster is just another
 * bootstrap string: nothing else here knows the difference.
 *
 * At-least-once consumption: a message counts as processed only once the caller marks it
 * (mt_kafka_consumer_mark). Commits carry marked positions only, so a message polled but not
 * marked is delivered again after a restart or a rebalance. A mark never moves a partition's
 * position backwards, and marks of partitions this member no longer owns are ignored (but
 * see mt_kafka_consumer_commit for positions carried across a rebalance).
 *
 *   mt_kafka_producer_t *p;
 *   mt_kafka_producer_create("127.0.0.1:9092", NULL, &p, err, sizeof(err));
 *   mt_kafka_produce(p, "examples", -1, key, klen, val, vlen, 1000);
 *   mt_kafka_producer_flush(p, 10000);
 *   mt_kafka_producer_destroy(p);
 *
 *   const char *topics[] = {"examples"};
 *   mt_kafka_consumer_t *c;
 *   mt_kafka_consumer_create("127.0.0.1:9092", "trainer", topics, 1, NULL, &c, err, sizeof(err));
 *   mt_kafka_msg_t m[256];
 *   for (;;) {
 *       size_t n = mt_kafka_consumer_poll(c, m, 256, 100);
 *       ... process m[0..n), make the effect durable ...
 *       for (size_t i = 0; i < n; i++) mt_kafka_consumer_mark(c, &m[i]);  (per partition)
 *       mt_kafka_consumer_commit(c);
 *   }
 *
 * Thread safety: each function says. In short: the mock, the producer and the counters may be
 * used from any number of threads; a consumer is polled by one thread at a time, and its mark,
 * commit, assigned and counts functions may be called from any thread.
 */
#ifndef MT_KAFKA_H
#define MT_KAFKA_H

#include <stddef.h>
#include <stdint.h>

#include "mt/err.h"

/* mt_kafka_produce()'s answer when the local queue stays full: the brokers do not keep up. */
#define MT_KAFKA_BUSY MT_UNAVAILABLE

typedef struct mt_kafka_mock mt_kafka_mock_t;         /* an embedded mock cluster */
typedef struct mt_kafka_producer mt_kafka_producer_t; /* a producer (librdkafka handle) */
typedef struct mt_kafka_consumer mt_kafka_consumer_t; /* a consumer-group member */

/* A topic of the mock cluster. */
typedef struct mt_kafka_topic_spec {
    const char *name;   /* borrowed during mt_kafka_mock_create() */
    int32_t partitions; /* >= 1 */
} mt_kafka_topic_spec_t;

/* ---------------- the mock cluster ---------------- */

/**
 * Starts @p nbrokers mock brokers listening on 127.0.0.1 (ports chosen by the OS: librdkafka
 * 2.0.2 has no way to choose them) and creates @p topics. Other topics are created on first
 * use by the mock with 4 partitions (librdkafka's mock default).
 *
 * @param[in]  nbrokers  1..64
 * @param[in]  topics    @p ntopics specs, borrowed; may be NULL when ntopics is 0
 * @param[out] out       caller frees with mt_kafka_mock_destroy()
 * @param[out] errbuf    on error, a message (may be NULL)
 * @returns MT_OK, MT_INVALID (bad argument), MT_NOMEM, MT_INTERNAL (librdkafka refused).
 * Thread safety: thread-safe.
 */
mt_err_t mt_kafka_mock_create(int nbrokers, const mt_kafka_topic_spec_t *topics, size_t ntopics,
                              mt_kafka_mock_t **out, char *errbuf, size_t errlen);

/**
 * @returns the bootstrap string "127.0.0.1:p1,127.0.0.1:p2,...", owned by @p m, valid until
 * mt_kafka_mock_destroy(). Thread safety: thread-safe.
 */
const char *mt_kafka_mock_bootstrap(const mt_kafka_mock_t *m);

/**
 * Creates one more topic on a running mock. @returns MT_OK, MT_INVALID, MT_EXISTS (a topic of
 * that name exists), MT_INTERNAL. Thread safety: thread-safe.
 */
mt_err_t mt_kafka_mock_topic_create(mt_kafka_mock_t *m, const char *name, int32_t partitions);

/**
 * Takes mock broker @p broker (1..nbrokers) down (@p up 0: its connections are closed and
 * new ones refused, as a broker that died) or back up (1). Tests use it for "Kafka is
 * unreachable". @returns MT_OK, MT_INVALID, MT_INTERNAL. Thread safety: thread-safe.
 */
mt_err_t mt_kafka_mock_broker_set_up(mt_kafka_mock_t *m, int broker, int up);

/**
 * Stops the brokers (clients still connected see their connections fail) and frees @p m.
 * NULL is a no-op. Thread safety: no other call on @p m may run or follow.
 */
void mt_kafka_mock_destroy(mt_kafka_mock_t *m);

/* ---------------- the producer ---------------- */

/**
 * Creates a producer. Our defaults: partitioner=murmur2_random (the Java clients' choice, so a
 * key lands on the same partition whoever produces it), acks=all, client.id=monolith; @p conf
 * entries are applied after them and win.
 *
 * @param[in]  bootstrap  "host:port[,host:port...]", borrowed
 * @param[in]  conf       NULL or a NULL-terminated array of "key=value" librdkafka
 *                        properties, borrowed during the call
 * @param[out] out        caller frees with mt_kafka_producer_destroy()
 * @param[out] errbuf     on error, a message (may be NULL)
 * @returns MT_OK, MT_INVALID (NULL or empty bootstrap, an entry without '='), MT_CONFIG
 * (librdkafka refused a property: errbuf names it), MT_NOMEM, MT_INTERNAL.
 * Thread safety: thread-safe.
 */
mt_err_t mt_kafka_producer_create(const char *bootstrap, const char *const *conf,
                                  mt_kafka_producer_t **out, char *errbuf, size_t errlen);

/**
 * Queues one message; key and value are copied, so the caller's buffers are free at return.
 * Delivery is asynchronous: its outcome shows in mt_kafka_producer_counts() and in the next
 * mt_kafka_producer_flush(). Serves pending delivery reports before returning.
 *
 * @param[in] partition   a partition, or -1: by key hash (murmur2, as the Java clients; a
 *                        NULL key goes to a random partition)
 * @param[in] key         may be NULL (key_len 0)
 * @param[in] timeout_ms  when the local queue is full (queue.buffering.max.messages /
 *                        .kbytes), how long to serve delivery reports and retry; 0: do not
 *                        wait, < 0: wait as long as it takes
 * @returns MT_OK (queued); MT_KAFKA_BUSY (= MT_UNAVAILABLE: err.h has no MT_BUSY) when the
 * queue is still full after @p timeout_ms; MT_NOT_FOUND (unknown topic or partition, once
 * the cluster said so); MT_LIMIT (larger than message.max.bytes); MT_INVALID; MT_IO (other
 * errors, logged).
 * Thread safety: thread-safe.
 */
mt_err_t mt_kafka_produce(mt_kafka_producer_t *p, const char *topic, int32_t partition,
                          const void *key, size_t key_len, const void *value, size_t len,
                          int timeout_ms);

/**
 * Waits until every message produced so far is delivered or has failed, serving delivery
 * reports. @param[in] timeout_ms  < 0: no limit.
 * @returns MT_OK; MT_TIMEOUT if messages are still in flight at the deadline (failures seen
 * so far are then reported by the next flush); MT_IO if any delivery failed since the last
 * flush that returned MT_OK or MT_IO.
 * Thread safety: thread-safe (concurrent produces count as "produced so far" if queued
 * before the flush looks at the queue).
 */
mt_err_t mt_kafka_producer_flush(mt_kafka_producer_t *p, int timeout_ms);

/**
 * Counters since creation: messages acknowledged by the cluster and messages that failed
 * for good (after librdkafka's retries). Either out-pointer may be NULL.
 * Thread safety: thread-safe (each counter is read atomically, the pair not as one).
 */
void mt_kafka_producer_counts(const mt_kafka_producer_t *p, uint64_t *delivered, uint64_t *failed);

/**
 * @returns the number of messages queued or in flight (not yet delivered or failed).
 * Thread safety: thread-safe.
 */
size_t mt_kafka_producer_queued(const mt_kafka_producer_t *p);

/**
 * Flushes for up to 5 s (messages still undelivered then are logged as lost), stops the
 * producer and frees @p p. NULL is a no-op.
 * Thread safety: no other call on @p p may run or follow.
 */
void mt_kafka_producer_destroy(mt_kafka_producer_t *p);

/* ---------------- the consumer ---------------- */

/* One consumed message. topic is valid until mt_kafka_consumer_destroy(); key and value (and
 * the message as a whole) until the next mt_kafka_consumer_poll() or destroy. */
typedef struct mt_kafka_msg {
    const char *topic;
    int32_t partition;
    int64_t offset;
    int64_t timestamp_ms; /* producer's create time or broker's log-append time; -1 if none */
    const void *key;      /* NULL if the message has no key */
    size_t key_len;
    const void *value; /* NULL if the message has no value (a tombstone) */
    size_t len;
} mt_kafka_msg_t;

/* Consumer counters since creation (for metrics). */
typedef struct mt_kafka_consumer_counts {
    uint64_t messages;        /* messages returned by mt_kafka_consumer_poll() */
    uint64_t errors;          /* consumer errors logged (partition EOF is not an error) */
    uint64_t commits;         /* partition positions committed successfully */
    uint64_t commit_failures; /* commit requests that failed (positions stay marked) */
    uint64_t assignments;     /* rebalance callbacks that assigned partitions */
    uint64_t revocations;     /* rebalance callbacks that revoked partitions */
} mt_kafka_consumer_counts_t;

/**
 * Creates a consumer-group member of @p group subscribed to @p topics. Our settings:
 * enable.auto.commit=false, enable.auto.offset.store=false, auto.offset.reset=earliest,
 * client.id=monolith; @p conf entries are applied after them and win (tests set
 * session.timeout.ms=6000 to make the mock rebalance quickly). The eager protocol is the
 * default; partition.assignment.strategy=cooperative-sticky works too.
 *
 * Partitions arrive through rebalances served inside mt_kafka_consumer_poll(): with the mock
 * cluster the first assignment comes about 3 s after creation.
 *
 * @param[in]  bootstrap, group  borrowed
 * @param[in]  topics     @p ntopics >= 1 names, borrowed during the call
 * @param[in]  conf       NULL or a NULL-terminated "key=value" array, borrowed
 * @param[out] out        caller frees with mt_kafka_consumer_destroy()
 * @param[out] errbuf     on error, a message (may be NULL)
 * @returns MT_OK, MT_INVALID, MT_CONFIG (errbuf names the property), MT_NOMEM, MT_INTERNAL.
 * Thread safety: thread-safe.
 */
mt_err_t mt_kafka_consumer_create(const char *bootstrap, const char *group,
                                  const char *const *topics, size_t ntopics,
                                  const char *const *conf, mt_kafka_consumer_t **out, char *errbuf,
                                  size_t errlen);

/**
 * Returns up to @p cap messages, waiting at most @p timeout_ms (< 0: no limit) for the first,
 * then taking only what is already fetched. Serves rebalances (which commit the marked
 * positions of revoked partitions). Consumer errors are logged and counted, never returned
 * as messages; partition EOF events are skipped.
 *
 * The messages of the previous call are released first: their key and value pointers die here.
 * @returns how many messages were written to @p msgs (0 on timeout).
 * Thread safety: one thread at a time per consumer (not concurrently with destroy).
 */
size_t mt_kafka_consumer_poll(mt_kafka_consumer_t *c, mt_kafka_msg_t *msgs, size_t cap,
                              int timeout_ms);

/**
 * Marks @p msg (and, by Kafka's offset semantics, everything before it in its partition) as
 * processed: msg->offset + 1 becomes the position to commit for msg's partition, unless the
 * marked position is already further. Ignored if the partition is no longer assigned to this
 * member (a rebalance took it: the new owner will deliver the message again), except while a
 * revoked partition's position is carried (see mt_kafka_consumer_commit).
 * Only msg->topic, partition and offset are read, so a copy of a message may be marked after
 * the next poll. Thread safety: thread-safe.
 */
void mt_kafka_consumer_mark(mt_kafka_consumer_t *c, const mt_kafka_msg_t *msg);

/**
 * Commits every marked position not yet committed, synchronously (one round trip to the group
 * coordinator). Also done for revoked partitions in the rebalance callback, and on destroy.
 *
 * If the commit in the rebalance callback fails (the mock cluster refuses all commits during a
 * rebalance; a real broker takes them), the revoked partitions' positions are carried to the
 * next assignment: a partition that comes back to this member resumes at its carried position
 * (which is then committed at once); one that goes to another member restarts there from the
 * last committed position, so its messages since that commit are delivered again. Commit
 * often (after each durable step) to keep that window small.
 * @returns MT_OK (also when nothing is marked); MT_UNAVAILABLE when the group is rebalancing
 * (positions stay marked and go with the next commit or the revocation), MT_IO for other
 * failures (logged, counted, positions stay marked).
 * Thread safety: thread-safe; commits are serialized, so positions never go backwards.
 */
mt_err_t mt_kafka_consumer_commit(mt_kafka_consumer_t *c);

/**
 * Moves the fetch of every assigned partition back to this member's next message: its
 * marked (or caller-owned) position, else where it started (the caller's position, else the
 * group's committed offset, else the beginning; a committed offset the broker did not give
 * leaves the partition alone). For a partition that stopped delivering: librdkafka 2.0.2 can
 * lose a seek made right after an assignment (its issue #2256). Call between polls with the
 * last poll's messages marked or given up: what was polled and not marked comes again.
 * @returns MT_OK (also with nothing assigned); MT_IO if a seek failed (errbuf says which).
 * Thread safety: the polling thread.
 */
mt_err_t mt_kafka_consumer_reseek(mt_kafka_consumer_t *c, char *errbuf, size_t errlen);

/** @returns the number of partitions currently assigned to this member. Thread-safe. */
size_t mt_kafka_consumer_assigned(const mt_kafka_consumer_t *c);

/**
 * Consumer lag: messages between this member's positions and the high watermarks of its
 * assigned partitions, from the watermarks the fetcher cached (a partition it has none for
 * yet: one query of its leader, at most 1 s each). A partition that returned no message
 * since it was assigned counts from where it starts: the caller's position (caller-owned
 * mode), else the group's committed offset (one broker round trip, at most 2 s, for all such
 * partitions), else its beginning.
 * @returns the sum, or -1 while unknown (nothing assigned, or a leader did not answer).
 * Thread safety: any thread.
 */
int64_t mt_kafka_consumer_lag(const mt_kafka_consumer_t *c);

/** Reads the counters into @p out. Thread safety: thread-safe (each counter atomically). */
void mt_kafka_consumer_counts(const mt_kafka_consumer_t *c, mt_kafka_consumer_counts_t *out);

/**
 * Commits the marked positions, leaves the group (rd_kafka_consumer_close: its partitions go
 * to the other members at the next rebalance) and frees @p c with its last messages. Blocks
 * for a few round trips. NULL is a no-op.
 * Thread safety: no other call on @p c may run or follow.
 */
void mt_kafka_consumer_destroy(mt_kafka_consumer_t *c);

/* ---------------- positions owned by the caller (exactly-once with checkpoints) ----------------
 *
 * A caller that stores its Kafka positions with its own state (the trainer, in the PS
 * checkpoints: docs/checkpoint.md) switches the consumer to caller-owned positions with
 * mt_kafka_consumer_set_positions(). From then on:
 *  - a partition's position is the last one set or marked, whether it is assigned or not,
 *    and survives revocations; committed offsets are never read;
 *  - an assigned partition starts at its position, or at the beginning of the partition
 *    when it has none (its messages are not in the caller's state);
 *  - poll drops messages below their partition's position (already processed: redelivered
 *    by a rebalance or fetched before a seek), counted in `skipped`;
 *  - mt_kafka_consumer_commit(), revocations and destroy commit nothing: the caller commits
 *    the positions of its durable state with mt_kafka_consumer_commit_positions().
 */

/* One partition's position: the offset of the next message to process. */
typedef struct mt_kafka_position {
    const char *topic; /* set: borrowed; read: interned, valid until destroy */
    int32_t partition;
    int64_t offset;
} mt_kafka_position_t;

/**
 * Switches to caller-owned positions (see above) and makes @p pos the positions of every
 * partition: those listed move there, every other one back to the beginning. Assigned
 * partitions are moved at once (rd_kafka_seek_partitions, which waits until no message
 * fetched for the old position can be returned); others start there when assigned.
 * @returns MT_OK; MT_INVALID (a negative offset, an empty topic); MT_NOMEM; MT_IO (the seek
 * failed or timed out: the positions are set, call again to move the assigned partitions).
 * Thread safety: the polling thread (between polls).
 */
mt_err_t mt_kafka_consumer_set_positions(mt_kafka_consumer_t *c, const mt_kafka_position_t *pos,
                                         size_t n, char *errbuf, size_t errlen);

/**
 * The positions of caller-owned mode: every partition that has one (set or marked).
 * @param[out] out  the first min(cap, *n) (may be NULL with cap 0), in no particular order
 * @param[out] n    how many there are
 * Thread safety: any thread.
 */
void mt_kafka_consumer_positions(mt_kafka_consumer_t *c, mt_kafka_position_t *out, size_t cap,
                                 size_t *n);

/** A number that changes with every assignment and revocation of this member: two equal
 *  readings mean the partitions did not change in between. Thread safety: thread-safe. */
uint64_t mt_kafka_consumer_generation(const mt_kafka_consumer_t *c);

/**
 * The partitions assigned to this member now, with their position in caller-owned mode
 * (-1: none yet, or not caller-owned).
 * @param[out] out  the first min(cap, *n) (topics interned: valid until destroy)
 * @param[out] n    how many there are
 * Thread safety: any thread.
 */
void mt_kafka_consumer_assignment(mt_kafka_consumer_t *c, mt_kafka_position_t *out, size_t cap,
                                  size_t *n);

/**
 * The first offset the broker still holds of a partition (its log start, after retention),
 * asked of the broker. @returns MT_OK, MT_TIMEOUT, MT_IO (the reason in @p errbuf).
 * Thread safety: any thread.
 */
mt_err_t mt_kafka_consumer_log_start(mt_kafka_consumer_t *c, const char *topic, int32_t partition,
                                     int timeout_ms, int64_t *lo, char *errbuf, size_t errlen);

/**
 * Commits exactly @p pos (synchronously), whatever is marked: the positions of a durable
 * checkpoint. @returns as mt_kafka_consumer_commit() (MT_UNAVAILABLE during a rebalance).
 * Thread safety: thread-safe.
 */
mt_err_t mt_kafka_consumer_commit_positions(mt_kafka_consumer_t *c, const mt_kafka_position_t *pos,
                                            size_t n);

/** Messages dropped by poll because they were below their partition's position. */
uint64_t mt_kafka_consumer_skipped(const mt_kafka_consumer_t *c);

/* ---------------- a group's offsets ---------------- */

typedef struct mt_kafka_group_offset {
    int32_t partition;
    int64_t committed; /* the group's committed offset, -1: none */
    int64_t start;     /* the log start (what retention kept) */
    int64_t end;       /* the high watermark: the next offset to be written */
} mt_kafka_group_offset_t;

/**
 * The committed offsets of consumer group @p group on every partition of @p topic, with each
 * partition's log start and end, asked of the brokers without joining the group (nothing of
 * the group changes). Waits at most @p timeout_ms per request.
 * @param[in]  conf  NULL or a NULL-terminated "key=value" array (TLS, SASL), borrowed
 * @param[out] out   @p cap entries, in partition order; *n of them are written
 * @returns MT_OK, MT_INVALID, MT_CONFIG, MT_NOT_FOUND (no such topic), MT_TOO_SMALL (more
 * partitions than @p cap), MT_UNAVAILABLE (a broker did not answer), MT_INTERNAL; errbuf
 * says which.
 * Thread safety: thread-safe (a client of its own per call).
 */
mt_err_t mt_kafka_group_offsets(const char *bootstrap, const char *const *conf, const char *group,
                                const char *topic, int timeout_ms, mt_kafka_group_offset_t *out,
                                size_t cap, size_t *n, char *errbuf, size_t errlen);

/* ---------------- a reader of chosen partitions (no group) ----------------
 *
 * Reads the partitions the caller starts, from the offsets it gives, outside any consumer
 * group: every reader sees every message (serving replicas following the parameters topic,
 * docs/serving.md). Nothing is committed. An offset out of range (below the log start after
 * retention, above the end) stops that partition and is reported by the next poll.
 *
 *   mt_kafka_reader_t *r;
 *   mt_kafka_reader_create(bootstrap, NULL, &r, err, sizeof(err));
 *   int64_t end;
 *   mt_kafka_reader_end(r, "params", 0, 2000, NULL, &end, err, sizeof(err));
 *   mt_kafka_reader_start(r, "params", 0, end, err, sizeof(err));
 *   n = mt_kafka_reader_poll(r, m, 64, 100, &ev);
 */
typedef struct mt_kafka_reader mt_kafka_reader_t;

/* What a reader's poll saw besides messages. */
typedef struct mt_kafka_reader_event {
    int out_of_range;  /* a started partition's offset is not in the log: start it again */
    int32_t partition; /* which (the first, if several) */
} mt_kafka_reader_event_t;

/**
 * Creates a reader. Our settings: auto.offset.reset=error, fetch.wait.max.ms=100 (a fetch
 * returns as soon as a message arrives: this bounds idle fetches), client.id=monolith;
 * @p conf entries win. @returns MT_OK, MT_INVALID, MT_CONFIG, MT_NOMEM, MT_INTERNAL.
 * Thread safety: thread-safe.
 */
mt_err_t mt_kafka_reader_create(const char *bootstrap, const char *const *conf,
                                mt_kafka_reader_t **out, char *errbuf, size_t errlen);

/**
 * A partition's log start and end (the offset the next message will take), asked of its
 * leader within @p timeout_ms. Either out-pointer may be NULL.
 * @returns MT_OK, MT_TIMEOUT, MT_NOT_FOUND (no such topic or partition), MT_IO.
 * Thread safety: thread-safe.
 */
mt_err_t mt_kafka_reader_end(mt_kafka_reader_t *r, const char *topic, int32_t partition,
                             int timeout_ms, int64_t *start, int64_t *end, char *errbuf,
                             size_t errlen);

/**
 * Reads @p partition of @p topic from @p offset on (again, if it was started: messages
 * fetched for the old offset and not yet polled may still come first; compare offsets).
 * @returns MT_OK, MT_INVALID, MT_IO. Thread safety: thread-safe.
 */
mt_err_t mt_kafka_reader_start(mt_kafka_reader_t *r, const char *topic, int32_t partition,
                               int64_t offset, char *errbuf, size_t errlen);

/** Stops reading a partition (nothing if it was not started). @returns MT_OK, MT_IO.
 *  Thread safety: thread-safe. */
mt_err_t mt_kafka_reader_stop(mt_kafka_reader_t *r, const char *topic, int32_t partition,
                              char *errbuf, size_t errlen);

/**
 * Up to @p cap messages, waiting at most @p timeout_ms for the first. The previous poll's
 * messages die here. @p ev (may be NULL) reports an offset out of range; the poll returns
 * at once when it sees one.
 * Thread safety: one thread at a time per reader.
 */
size_t mt_kafka_reader_poll(mt_kafka_reader_t *r, mt_kafka_msg_t *msgs, size_t cap, int timeout_ms,
                            mt_kafka_reader_event_t *ev);

/** Counters since creation (any may be NULL). Thread safety: thread-safe. */
void mt_kafka_reader_counts(const mt_kafka_reader_t *r, uint64_t *messages, uint64_t *errors,
                            uint64_t *out_of_range);

/** Closes and frees @p r (NULL: no-op). Thread safety: no other call on @p r may run. */
void mt_kafka_reader_destroy(mt_kafka_reader_t *r);

#endif /* MT_KAFKA_H */
