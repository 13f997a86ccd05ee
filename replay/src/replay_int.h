/*
 * replay_int.h - what the replay core (replay.c) and its sources (trivago.c, movielens.c,
 * gen_source.c, csv.c) share.
 *
 * A source yields impressions in non-decreasing event time into the core's staged
 * impression (mt__replay_imp_t); the core merges them with the delayed actions of a
 * min-heap keyed by (timestamp_ms, sequence). A source never sees actions.
 */
#ifndef MT_REPLAY_INT_H
#define MT_REPLAY_INT_H

#include "mt/replay.h"

#define MT__REPLAY_MAX_SLOTS 64   /* per side (Criteo-like logs have 39 feature columns) */
#define MT__REPLAY_MAX_FIDS  1024 /* per impression, both sides */

/* The impression a source fills (the core clears it with mt__replay_imp_reset first). */
typedef struct mt__replay_imp {
    int64_t timestamp_ms;
    char request_id[MT_REPLAY_MAX_REQUEST_ID + 1];
    uint64_t item_id;
    bool clicked;
    uint64_t line;
    uint32_t nuser, nitem, nfids;
    mt_replay_slot_t user[MT__REPLAY_MAX_SLOTS];
    mt_replay_slot_t item[MT__REPLAY_MAX_SLOTS];
    uint64_t fids[MT__REPLAY_MAX_FIDS];
} mt__replay_imp_t;

typedef struct mt__replay_source {
    /* Fills @p imp with the next impression. MT_OK, MT_NOT_FOUND at the end, or an error. */
    mt_err_t (*next)(mt_replay_t *r, void *state, mt__replay_imp_t *imp);
    void (*destroy)(void *state);
} mt__replay_source_t;

/* A delayed action waiting in the heap. */
typedef struct mt__replay_action {
    int64_t timestamp_ms;
    uint64_t seq; /* order of the impressions: ties in time keep it */
    uint64_t item_id;
    uint64_t line;
    char request_id[MT_REPLAY_MAX_REQUEST_ID + 1];
} mt__replay_action_t;

struct mt_replay {
    mt_replay_config_t cfg; /* cfg.path points to path */
    char *path;
    const mt__replay_source_t *src;
    void *state;
    mt_replay_stats_t stats;

    mt__replay_imp_t staged; /* the next impression, when have_staged */
    bool have_staged;
    bool source_done;
    uint64_t seq;

    mt__replay_action_t *heap; /* min-heap on (timestamp_ms, seq) */
    size_t nheap, cap_heap;
    mt__replay_action_t cur_action; /* the action event last returned */
    mt_replay_slot_t no_slots[1];
};

/* Records a bad row: counted, kept if among the first, passed to the callback. */
void mt__replay_bad_row(mt_replay_t *r, uint64_t line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Adds a slot with @p n fids to one side of @p imp (user when @p user_side).
 * Empty slots are omitted. @returns MT_OK or MT_LIMIT (too many slots or fids). */
mt_err_t mt__replay_imp_add(mt__replay_imp_t *imp, bool user_side, uint16_t slot,
                            const uint64_t *fids, uint32_t n);

/* Source constructors: on success *state and *src are set. */
mt_err_t mt__replay_trivago_open(mt_replay_t *r, void **state, const mt__replay_source_t **src,
                                 char *errbuf, size_t errlen);
mt_err_t mt__replay_movielens_open(mt_replay_t *r, void **state, const mt__replay_source_t **src,
                                   char *errbuf, size_t errlen);
mt_err_t mt__replay_gen_open(mt_replay_t *r, void **state, const mt__replay_source_t **src,
                             char *errbuf, size_t errlen);
/* r->cfg.csv's pointers are valid during this call only (mt_replay_open() clears them). */
mt_err_t mt__replay_csv_open(mt_replay_t *r, void **state, const mt__replay_source_t **src,
                             char *errbuf, size_t errlen);

#endif /* MT_REPLAY_INT_H */
