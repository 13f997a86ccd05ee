/*
 * replay.h - a dataset as the stream the loop sees: impressions (the `features` topic) and
 * the actions that follow some of them (the `actions` topic), in event-time order.
 *
 * A replay turns a dataset into a sequence of events:
 *
 *   IMPRESSION  request_id, timestamp_ms, item_id, user-side and item-side SlotFids
 *   ACTION      request_id, timestamp_ms = its impression's + action_delay_ms, item_id, CLICK
 *
 * Sources (docs/replay.md has the slot tables):
 *   - MT_REPLAY_TRIVAGO: the trivago RecSys 2019 session log (CSV, plain or gzip). Each
 *     "clickout item" row is a request ("tv-<session_id>-<step>") showing the hotels of its
 *     `impressions` column, one IMPRESSION per hotel; the clicked hotel (`reference`), when it
 *     is in the list, gets one ACTION. Other rows only feed the session's recent-items slot.
 *   - MT_REPLAY_MOVIELENS_100K / _LATEST: every rating is an IMPRESSION of (user, movie)
 *     ("ml-<user>-<movie>"); a rating >= positive_rating (default 4) gets an ACTION.
 *   - MT_REPLAY_GEN: the synthetic generator (data/gen.h); each example is an IMPRESSION
 *     ("gen-<seed>-<n>", as `monolith gen --kafka` names them), a positive label an ACTION.
 *   - MT_REPLAY_CSV: a user's own log, any CSV / TSV (plain or gzip) read by the generic
 *     reader (data/readers.h) as cfg.csv says: each row an IMPRESSION (its slot columns the
 *     features; its request id and item from their columns, or "csv-<line>" and item 0), a
 *     positive label (the action column) an ACTION. `monolith replay --dataset csv` builds
 *     cfg.csv from the [input] keys the batch trainer reads (mt/config_input.h).
 *
 * Order. Events come out sorted by (timestamp_ms, kind, sequence): an ACTION never precedes
 * its IMPRESSION, and at equal timestamps impressions come before actions. The trivago,
 * MovieLens and csv files are not (or not surely) in time order: they are read whole at open
 * and sorted in memory, ties in file order (trivago keeps only its click-out rows, about
 * 1 KiB each; csv its rows' fids and ids). The generator's stream is in time order already;
 * pending actions wait in a heap whose size is bounded by the actions of one
 * action_delay_ms of event time.
 *
 * Bad input rows are skipped, counted and reported with their line number (header = line 1)
 * through mt_replay_stats() and an optional callback; they never stop a replay.
 *
 * Ownership: mt_replay_open() copies what it needs from the config (strings included);
 * the caller frees the replay with mt_replay_destroy(). An event returned by
 * mt_replay_next() is owned by the replay and valid until the next call on it.
 *
 * Thread safety: a replay is used by one thread at a time; distinct replays are independent.
 */
#ifndef MT_REPLAY_H
#define MT_REPLAY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "mt/err.h"
#include "mt/gen.h"
#include "mt/readers.h"

/** Longest request id (bytes, without the terminating NUL). */
#define MT_REPLAY_MAX_REQUEST_ID          63
/** How many bad rows (the first ones) mt_replay_stats() keeps with their reasons. */
#define MT_REPLAY_BAD_KEPT                8
/** Default delay of an action after its impression. */
#define MT_REPLAY_ACTION_DELAY_MS_DEFAULT 5000

typedef enum mt_replay_dataset {
    MT_REPLAY_TRIVAGO,          /* path: the CSV, plain or gzip */
    MT_REPLAY_MOVIELENS_100K,   /* path: the folder with u.data (u.user, u.item used if there)
                                   or u.data itself */
    MT_REPLAY_MOVIELENS_LATEST, /* path: the folder with ratings.csv (movies.csv used if there)
                                   or ratings.csv itself */
    MT_REPLAY_GEN,              /* no path: the synthetic generator with cfg.gen */
    MT_REPLAY_CSV,              /* path: a CSV / TSV file, plain or gzip, read as cfg.csv says */
} mt_replay_dataset_t;

/* Slots of the trivago events (top 16 bits of each fid; see docs/replay.md). */
enum {
    MT_TRIVAGO_SLOT_USER = 1,          /* user: hash of user_id */
    MT_TRIVAGO_SLOT_ITEM = 2,          /* item: the hotel id (integer) */
    MT_TRIVAGO_SLOT_PLATFORM = 3,      /* user: hash of platform ("FR") */
    MT_TRIVAGO_SLOT_CITY = 4,          /* user: hash of city ("Marseille, France") */
    MT_TRIVAGO_SLOT_DEVICE = 5,        /* user: hash of device */
    MT_TRIVAGO_SLOT_FILTERS = 6,       /* user: multi-hot, hash of each current filter */
    MT_TRIVAGO_SLOT_SESSION_ITEMS = 7, /* user: multi-hot, the hotels the session's earlier
                                          rows referenced (last MT_TRIVAGO_SESSION_ITEMS) */
    MT_TRIVAGO_SLOT_HOUR = 8,          /* user: hour of day, UTC, 0..23 */
    MT_TRIVAGO_SLOT_PRICE = 9,         /* item: price bucket floor(4 log2(1 + price)) */
    MT_TRIVAGO_SLOT_POSITION = 10,     /* item: position in the shown list, 0.. */
    MT_TRIVAGO_SLOT_PRICE_RANK = 11,   /* item: rank of its price in the list, 0 = cheapest */
};
#define MT_TRIVAGO_SESSION_ITEMS 10

typedef enum mt_replay_kind {
    MT_REPLAY_IMPRESSION = 1,
    MT_REPLAY_ACTION = 2,
} mt_replay_kind_t;

/** Action types, with the numbers of monolith.v1.ActionType. */
enum { MT_REPLAY_ACTION_CLICK = 1 };

/** The fids of one slot of an event (all with the slot in their top 16 bits). */
typedef struct mt_replay_slot {
    uint16_t slot;
    uint32_t nfids;
    const uint64_t *fids;
} mt_replay_slot_t;

/** One event; every pointer is owned by the replay, valid until the next call on it. */
typedef struct mt_replay_event {
    mt_replay_kind_t kind;
    int64_t timestamp_ms;
    const char *request_id;       /* NUL-terminated, at most MT_REPLAY_MAX_REQUEST_ID bytes */
    uint64_t item_id;             /* the shown item; for an ACTION the clicked one */
    uint32_t action_type;         /* ACTION: MT_REPLAY_ACTION_CLICK; IMPRESSION: 0 */
    bool clicked;                 /* IMPRESSION: an ACTION for it will follow */
    uint64_t line;                /* the dataset line it came from (0 for the generator) */
    const mt_replay_slot_t *user; /* IMPRESSION: nuser user-side slots (empty ones omitted) */
    uint32_t nuser;
    const mt_replay_slot_t *item; /* IMPRESSION: nitem item-side slots */
    uint32_t nitem;
} mt_replay_event_t;

/** Called for every bad row (from inside mt_replay_open() for the sorted datasets, from
 *  mt_replay_next() otherwise); @p reason is valid for the call only. */
typedef void (*mt_replay_bad_row_cb)(void *opaque, uint64_t line, const char *reason);

/** MT_REPLAY_CSV: the generic reader's configuration and the columns that are no feature. */
typedef struct mt_replay_csv_config {
    const mt_csv_config_t *reader; /* borrowed, read during mt_replay_open() only: columns ->
                                      slots, the label (the action column: 1 = a click, which
                                      is required), the timestamp (required; the event time);
                                      no text columns (the two below are the replay's) */
    mt_csv_column_t request_id;    /* none (index -1, no name): every row is a request of its
                                      own, "csv-<line>"; read during open only */
    mt_csv_column_t item_id;       /* none: item 0 (then request_id must be none too); its
                                      slots in reader->slots are item-side, others user-side */
} mt_replay_csv_config_t;

typedef struct mt_replay_config {
    mt_replay_dataset_t dataset;
    const char *path;                /* see mt_replay_dataset_t; copied */
    int64_t action_delay_ms;         /* >= 0: action time = impression time + this; default 5000 */
    uint64_t limit;                  /* > 0: stop after this many impressions (with their actions,
                                    which still come); 0 = all (the generator: endless) */
    float positive_rating;           /* MovieLens: rating >= this is a click; default 4 */
    mt_gen_config_t gen;             /* MT_REPLAY_GEN; mt_gen_config_init() defaults */
    mt_replay_csv_config_t csv;      /* MT_REPLAY_CSV; no reader, no columns by default */
    mt_replay_bad_row_cb bad_row_cb; /* may be NULL */
    void *bad_row_opaque;
} mt_replay_config_t;

typedef struct mt_replay_bad_row {
    uint64_t line;
    char reason[96];
} mt_replay_bad_row_t;

typedef struct mt_replay_stats {
    uint64_t rows;             /* dataset rows read (header and side files not included) */
    uint64_t requests;         /* trivago: click-out rows used; others: impressions (csv: the
                                  good rows) */
    uint64_t impressions;      /* impressions returned so far by mt_replay_next() */
    uint64_t actions;          /* actions returned so far */
    uint64_t clicks_not_shown; /* trivago: click-outs whose clicked hotel was not in the list
                                  (no action: nothing to join it with) */
    uint64_t bad_rows;         /* rows skipped as bad (csv: also a repeated request and item) */
    uint64_t last_bad_line;    /* line of the last bad row, 0 if none */
    uint64_t side_bad_rows;    /* MovieLens: lines skipped in u.user, u.item or movies.csv */
    uint32_t nbad_kept;
    mt_replay_bad_row_t bad[MT_REPLAY_BAD_KEPT]; /* the first bad rows */
    uint64_t pending_actions;                    /* actions waiting in the heap now */
    uint64_t max_pending_actions;                /* the most that ever waited */
} mt_replay_stats_t;

typedef struct mt_replay mt_replay_t;

/** Defaults: trivago, no path, delay 5000 ms, no limit, positive rating 4, gen defaults, no
 *  csv reader and no csv id columns. */
void mt_replay_config_init(mt_replay_config_t *cfg);

/** Checks @p cfg; on error a one-line reason in @p errbuf (may be NULL).
 *  @returns MT_OK or MT_CONFIG. */
mt_err_t mt_replay_config_validate(const mt_replay_config_t *cfg, char *errbuf, size_t errlen);

/**
 * Opens a replay: validates @p cfg, opens the dataset and, for trivago, MovieLens and csv,
 * reads and sorts it whole (bad rows are reported during this call).
 * @param[out] out     freed with mt_replay_destroy(); untouched on error
 * @param[out] errbuf  on error, why (may be NULL)
 * @returns MT_OK, MT_INVALID (NULL argument), MT_CONFIG (csv: also a column name that is not
 *          in the header, too many slots), MT_IO (cannot open or read a file), MT_CORRUPT
 *          (trivago: a header without the needed columns; trivago, csv: an empty file),
 *          MT_NOMEM.
 */
mt_err_t mt_replay_open(const mt_replay_config_t *cfg, mt_replay_t **out, char *errbuf,
                        size_t errlen);

/**
 * The next event in event-time order.
 * @param[out] ev  valid until the next call on @p r
 * @returns MT_OK; MT_NOT_FOUND at the end (also after the limit, once the pending actions are
 *          out); MT_NOMEM; MT_LIMIT (the generator ran out of ids or time); MT_IO.
 */
mt_err_t mt_replay_next(mt_replay_t *r, mt_replay_event_t *ev);

/** Counters and the first bad rows; valid while @p r lives. */
const mt_replay_stats_t *mt_replay_stats(const mt_replay_t *r);

/** Frees @p r. NULL is a no-op. */
void mt_replay_destroy(mt_replay_t *r);

/**
 * Encodes @p ev as a monolith.v1.Impression or monolith.v1.Action protobuf into @p *buf,
 * growing it (realloc) when *cap is too small; the caller frees *buf.
 * @returns MT_OK, MT_INVALID, MT_NOMEM.
 * Thread safety: pure over its arguments.
 */
mt_err_t mt_replay_encode(const mt_replay_event_t *ev, uint8_t **buf, size_t *cap, size_t *len);

/* ---------------------------------------------------------------------------------------- */
/* Running a replay at a speed                                                              */
/* ---------------------------------------------------------------------------------------- */

/** Totals of a run (also passed to the progress callback). */
typedef struct mt_replay_totals {
    uint64_t impressions, actions;
    uint64_t impression_bytes, action_bytes; /* encoded protobuf bytes (values, not keys) */
    int64_t first_event_ms, last_event_ms;   /* event time of the first and last event */
    double wall_s;                           /* since the run began */
} mt_replay_totals_t;

/** Receives each event and its encoding. A code other than MT_OK stops the run with it. */
typedef mt_err_t (*mt_replay_sink_fn)(void *opaque, const mt_replay_event_t *ev,
                                      const uint8_t *value, size_t len);

/**
 * The clock a paced run reads and waits on. Both NULL (the default): CLOCK_MONOTONIC and
 * nanosleep. A test injects its own to check the pacing exactly, without depending on how
 * busy the machine is; both must then be set (a clock whose sleep does not advance it would
 * wait for ever).
 */
typedef struct mt_replay_clock {
    double (*now_s)(void *opaque);           /* seconds, monotonic, any origin */
    void (*sleep_s)(void *opaque, double s); /* waits about s (> 0) seconds of that clock */
    void *opaque;                            /* borrowed: passed to both */
} mt_replay_clock_t;

typedef struct mt_replay_run_config {
    double speed;                  /* 0: as fast as possible (never waits); > 0: event time
                                      runs this many times faster than wall time (1 = real
                                      time) */
    uint32_t progress_interval_ms; /* 0: no progress callback */
    void (*progress)(void *opaque, const mt_replay_totals_t *t);
    void *progress_opaque;
    volatile const int *stop; /* may be NULL; when it reads non-zero the run ends with
                                 MT_CANCELLED (checked between events and while waiting,
                                 at least every 0.2 s) */
    mt_replay_clock_t clock;  /* default (zeroed): the monotonic clock and nanosleep */
} mt_replay_run_config_t;

/** Defaults: as fast as possible, no progress, no stop flag, the system's clock. */
void mt_replay_run_config_init(mt_replay_run_config_t *rc);

/**
 * Reads every event of @p r, encodes it and hands it to @p sink, waiting before each one
 * until its due time when rc->speed > 0: due = start + (event time - first event time) / speed.
 * Times (due times, progress, totals->wall_s) are read from rc->clock.
 * @param[out] totals  what was handed to the sink (may be NULL)
 * @returns MT_OK at the end of the replay; the sink's code; MT_CANCELLED; MT_INVALID (NULL
 *          @p r or @p sink, or a clock with only one of now_s and sleep_s); an error of
 *          mt_replay_next().
 */
mt_err_t mt_replay_run(mt_replay_t *r, const mt_replay_run_config_t *rc, mt_replay_sink_fn sink,
                       void *sink_opaque, mt_replay_totals_t *totals);

#endif /* MT_REPLAY_H */
