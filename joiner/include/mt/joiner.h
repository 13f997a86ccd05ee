/*
 * joiner.h - the online joiner's core: impressions (monolith.v1.Impression) and actions
 * (monolith.v1.Action) in, labelled examples (monolith.v1.Example) out, with every bit of
 * state in RocksDB so that a restart loses and repeats nothing (docs/joiner.md).
 *
 * The core knows no Kafka: the caller feeds it messages with where they came from (topic,
 * partition, offset), calls mt_joiner_tick() to move event time on, and takes the examples
 * it made from the outbox. Time comes from the messages (event time) and, for the idle
 * advance of the watermark only, from an injectable clock.
 *
 *   joins     an Action joins the pending Impression of the same (request_id, item_id) whose
 *             window (impression time .. + window_ms) holds the action's time: a positive,
 *             emitted at once. An Action with item_id 0 joins the request's only pending
 *             impression; if the request has several, it is counted as ambiguous and labels
 *             none. An Impression whose window closes (watermark > time + window_ms) without
 *             an action is a negative, kept with probability negative_rate (deterministic:
 *             a hash of request id, item id and seed) and carrying that rate.
 *   watermark the event time of the input minus allowed_lateness_ms, never going back. The
 *             event time of the input is the smallest, over its partitions (topic and
 *             partition given to mt_joiner_add()), of the largest event time seen in each,
 *             leaving out partitions idle for idle_advance_ms (so a consumer reading one
 *             partition ahead of another closes no window early). While no message at all
 *             arrives for idle_advance_ms the watermark also moves with the clock.
 *   early     an Action without its Impression waits (in RocksDB only, at most
 *             max_early_actions) until its impression comes or the watermark passes the
 *             action's time + window_ms.
 *   tasks     the example carries one label per task (Example.labels[t], in task order):
 *             task t's label is 1 when an action of type task_actions[t] joined the
 *             impression. With one task (the default: the click) an impression closes at its
 *             first action, as above. With several it stays pending, accumulating its labels
 *             (a bitmask in RocksDB, written with the action that set it), until every task's
 *             action has come (closed early) or its window closes (the labels seen so far).
 *             Negative sampling applies only to examples whose labels are all 0. An action
 *             of a type in no task is ignored and counted; ACTION_UNSPECIFIED (0) counts as
 *             the click. A state_dir keeps the task list it was written with: opening it
 *             with another list fails (MT_MISMATCH), since its stored labels would change
 *             meaning.
 *   replays   every applied message is written to RocksDB in one atomic batch together with
 *             its state changes, the examples it produced (the outbox) and the next offset
 *             of its partition; a message at an offset below that position is known and
 *             skipped (counted as replayed). Tombstones of closed keys, kept window_ms +
 *             allowed_lateness_ms after the window, recognize duplicates and late actions.
 *   memory    at most max_pending_memory pending impressions are also held in memory (the
 *             newest); every pending impression is in RocksDB.
 *
 * Errors: an MT_IO from RocksDB leaves the in-memory part of the joiner unreliable: close
 * it and open it again (the database is consistent: every write is one atomic batch).
 *
 * Ownership: the config is copied; strings returned are valid as each function says.
 *
 * Thread safety: a joiner is used by one thread at a time (no internal locks). Distinct
 * joiners are independent, but one state_dir belongs to one joiner (RocksDB's LOCK file).
 */
#ifndef MT_JOINER_H
#define MT_JOINER_H

#include <stddef.h>
#include <stdint.h>

#include "mt/err.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MT_JOINER_MAX_REQUEST_ID 255u /* longest request id (bytes); longer: a bad message */
#define MT_JOINER_MAX_TASKS      4u   /* labels per example at most (joiner.task_actions) */

typedef struct mt_joiner mt_joiner_t;

/** Settings. Initialize with mt_joiner_config_init(), then set fields. */
typedef struct mt_joiner_config {
    int64_t window_ms;           /* join window after an impression, >= 1 (default 30 min) */
    int64_t allowed_lateness_ms; /* watermark = max event time - this, >= 0 (default 10 s) */
    int64_t idle_advance_ms;     /* no message for this long: the watermark follows the
                                     clock; 0 = never (default 5 s) */
    double negative_rate;        /* negatives kept, (0, 1] (default 1) */
    uint64_t seed;               /* of the negative sampling hash (default 1) */
    uint64_t max_pending_memory; /* pending impressions also held in memory (default 1M) */
    uint64_t max_early_actions;  /* early actions waiting; beyond, the oldest is dropped
                                     and counted, >= 1 (default 1M) */
    int sync;                    /* 1: mt_joiner_sync() fsyncs the WAL (default 1) */
    uint32_t write_buffer_mb;    /* RocksDB memtable size, MiB, >= 1 (default 64) */
    uint32_t block_cache_mb;     /* RocksDB block cache, MiB; 0 = none (default 8) */
    /* task t's label: an action of type task_actions[t] (monolith.v1.ActionType: 1 click,
     * 2 conversion; distinct) joined the impression. Default: one task, the click. */
    uint32_t task_actions[MT_JOINER_MAX_TASKS];
    uint32_t ntasks; /* 1..MT_JOINER_MAX_TASKS */
} mt_joiner_config_t;

/** The clock of the idle advance: milliseconds, monotonic (any origin). */
typedef int64_t (*mt_joiner_clock_fn)(void *opaque);

/** What a message did (mt_joiner_add()). */
typedef enum mt_joiner_outcome {
    MT_JOINER_BAD = 0,         /* not a valid message: skipped (counted) */
    MT_JOINER_REPLAYED,        /* offset below the stored position: applied before */
    MT_JOINER_PENDING,         /* impression: waits for actions */
    MT_JOINER_JOINED,          /* positive emitted (action, or impression with early
                                      actions): with several tasks, once every task's
                                      action has come */
    MT_JOINER_LATE_IMPRESSION, /* impression whose window had closed: closed at once */
    MT_JOINER_EARLY,           /* action stored until its impression comes */
    MT_JOINER_LATE_ACTION,     /* action after its impression's window (or too old to
                                      wait): no label */
    MT_JOINER_DUPLICATE,       /* impression or action seen before */
    MT_JOINER_AMBIGUOUS,       /* item_id 0 action of a request with several impressions */
    MT_JOINER_LABELLED,        /* several tasks: the action's label is recorded on its
                                      pending impression, which waits for the other tasks */
    MT_JOINER_IGNORED,         /* action of a type in no task: no label */
} mt_joiner_outcome_t;

/** Which stream a message comes from. */
typedef enum mt_joiner_stream {
    MT_JOINER_IMPRESSIONS = 0, /* the features topic */
    MT_JOINER_ACTIONS = 1,     /* the actions topic */
} mt_joiner_stream_t;

/** Counters since open (run), and gauges of the whole state (persisted). */
typedef struct mt_joiner_stats {
    uint64_t impressions, actions; /* valid messages applied (not replayed) */
    uint64_t positives, negatives; /* examples emitted: some label 1 / every label 0 */
    uint64_t sampled_out;          /* negatives not emitted by sampling */
    uint64_t late_actions;         /* actions after their window / too old */
    uint64_t late_impressions;     /* impressions whose window had closed */
    uint64_t duplicate_impressions, duplicate_actions;
    uint64_t early_actions; /* actions stored before their impression */
    uint64_t early_joined, early_expired, early_dropped;
    uint64_t ambiguous_actions;
    uint64_t task_positives[MT_JOINER_MAX_TASKS]; /* examples emitted with task t's label 1 */
    uint64_t closed_early;    /* examples emitted before their window closed: every task's
                                 action had come (one task: every positive) */
    uint64_t no_task_actions; /* actions of a type in no task: ignored */
    uint64_t bad_messages;
    uint64_t replayed;                        /* skipped: offset below the stored position */
    uint64_t outbox_recovered;                /* examples found undelivered at open */
    uint64_t memory_evictions, memory_misses; /* pending impressions read from RocksDB */
    uint64_t pending, pending_memory;         /* gauges: pending impressions (all, in memory) */
    uint64_t early_pending, tombstones;       /* gauges */
    uint64_t outbox;                          /* gauge: examples not yet delivered */
    int64_t watermark_ms, max_event_ms;       /* INT64_MIN before the first event */
} mt_joiner_stats_t;

/** One example of the outbox (valid until mt_joiner_outbox_done() or close). */
typedef struct mt_joiner_example {
    uint64_t seq;           /* increasing over the joiner's life */
    const char *request_id; /* NUL-terminated; the Kafka key */
    size_t request_id_len;
    const uint8_t *value; /* the monolith.v1.Example protobuf */
    size_t len;
    int label;       /* 1 positive (some task's label is 1), 0 negative */
    uint32_t labels; /* bit t: task t's label (one task: == label) */
} mt_joiner_example_t;

void mt_joiner_config_init(mt_joiner_config_t *cfg);

/** @returns MT_OK or MT_CONFIG (errbuf names the field). */
mt_err_t mt_joiner_config_validate(const mt_joiner_config_t *cfg, char *errbuf, size_t errlen);

/**
 * Opens (creating if missing) the state in directory @p state_dir and recovers it: pending
 * impressions, early actions, tombstones, watermark, input positions, and the outbox
 * (examples made but not confirmed delivered: counted in outbox_recovered, to be delivered
 * again).
 * @param[in]  clock   NULL: CLOCK_MONOTONIC; @p opaque is passed to it
 * @param[out] out     close with mt_joiner_close()
 * @returns MT_OK, MT_INVALID, MT_CONFIG, MT_NOMEM, MT_VERSION (another layout), MT_MISMATCH
 *          (the state was written with other task_actions), MT_CORRUPT, MT_IO (RocksDB:
 *          cannot open, locked by another process).
 */
mt_err_t mt_joiner_open(const char *state_dir, const mt_joiner_config_t *cfg,
                        mt_joiner_clock_fn clock, void *opaque, mt_joiner_t **out, char *errbuf,
                        size_t errlen);

/** Closes the database (unsynced writes are kept by RocksDB's WAL). NULL is a no-op. */
void mt_joiner_close(mt_joiner_t *j);

/**
 * Applies one message atomically (state, outbox and position in one RocksDB write).
 * @param[in] topic      where it came from (the position key), or NULL: no position (tests)
 * @param[in] offset     its offset; ignored when topic is NULL
 * @param[in] value      the protobuf (NULL with len 0 is a bad message)
 * @param[out] outcome   optional
 * @param[out] why       optional: why a message is bad
 * @returns MT_OK (bad messages too: see outcome), MT_NOMEM, MT_IO.
 */
mt_err_t mt_joiner_add(mt_joiner_t *j, mt_joiner_stream_t stream, const char *topic,
                       int32_t partition, int64_t offset, const void *value, size_t len,
                       mt_joiner_outcome_t *outcome, char *why, size_t whylen);

/**
 * Moves the watermark (event time, and the clock when idle) and closes what it passed:
 * windows (negatives), early actions, tombstones. Each batch of closures is one atomic write.
 * @param[out] closed  optional: windows closed by this call
 * @returns MT_OK, MT_NOMEM, MT_IO, MT_CORRUPT (a damaged record).
 */
mt_err_t mt_joiner_tick(mt_joiner_t *j, uint64_t *closed);

/**
 * End of stream: moves the watermark past every event seen (max event time + window + 1)
 * and closes everything. Later events older than that are late. Same returns as tick.
 */
mt_err_t mt_joiner_drain(mt_joiner_t *j, uint64_t *closed);

/**
 * The input is held up for a reason other than idleness (no partitions assigned yet, a
 * rebalance): restart the idle clocks, so that the watermark does not move with the clock.
 */
void mt_joiner_hold(mt_joiner_t *j);

/**
 * The input has @p n partitions (those assigned to this consumer). Until as many have
 * delivered a message, or for idle_advance_ms after a change of @p n, event time does not
 * move the watermark: a partition not yet read may hold the oldest events. 0 (default):
 * only the partitions seen count.
 */
void mt_joiner_set_partitions(mt_joiner_t *j, size_t n);

/** Makes every write so far durable (WAL fsync; a no-op without cfg.sync). MT_OK or MT_IO. */
mt_err_t mt_joiner_sync(mt_joiner_t *j);

/** @returns the number of examples waiting for delivery, oldest first. */
size_t mt_joiner_outbox_size(const mt_joiner_t *j);

/** @returns outbox entry @p i (< size), valid until mt_joiner_outbox_done() or close. */
const mt_joiner_example_t *mt_joiner_outbox_get(const mt_joiner_t *j, size_t i);

/**
 * The first @p n outbox examples are delivered: removes them (one write; synced with
 * cfg.sync). @returns MT_OK, MT_INVALID (n > size), MT_IO.
 */
mt_err_t mt_joiner_outbox_done(mt_joiner_t *j, size_t n);

/** Copies the counters into @p out. */
void mt_joiner_stats(const mt_joiner_t *j, mt_joiner_stats_t *out);

/** @returns a name for an outcome ("joined", "late_action", ...). */
const char *mt_joiner_outcome_name(mt_joiner_outcome_t o);

/**
 * @returns the name of action type @p type as joiner.task_actions spells it ("click",
 * "conversion"), or NULL for a type that cannot be a task (0, unknown). Static storage.
 */
const char *mt_joiner_action_name(uint32_t type);

#ifdef __cplusplus
}
#endif

#endif /* MT_JOINER_H */
