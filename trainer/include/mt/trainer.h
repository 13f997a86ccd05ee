/*
 * trainer.h - one training step over an example batch: look the batch's ids up, sum-pool
 * them per slot, run the model forward and backward, push the sparse gradients back with
 * each slot's optimizer, and update the dense parameters.
 *
  * Parameters live in an embedding table (mt/table.h) the trainer owns: every feature slot s
 * of the batches is table slot s, whose row is the model's (mt_model_row_floats()): the
 * dim-d embedding used by the FM term and the MLP, then the first-order weight. One lookup
 * and one apply per id. Feature slots are below 0x8000 (the ids above were the first-order
 * slots of an older layout). With a backend (mt_trainer_backend_t) the same step
 * runs against parameters held elsewhere, e.g. sharded parameter servers through
 * mt_trainer_backend_psc(); those must configure the same table slots.
 *
 * Collisions on purpose: with hash_buckets > 0 every id's value is reduced modulo
 * hash_buckets before anything else (fid = slot | value % hash_buckets), which is what a
 * fixed-size hashed embedding table does. Runs with and without it differ only in that.
 * slot_hash_buckets[s] > 0 overrides hash_buckets for feature slot slot_ids[s] alone, so
 * that e.g. only the user and item slots collide while the side features stay exact. The
 * value reduced is the fid's low 48 bits: the integer itself for integer ids
 * (mt_fid_of_int), the XXH3 of the bytes for strings (mt_fid_of_bytes).
 *
 * Gradients: the model's loss is the batch mean; the sparse gradient of an id is the sum,
 * over its occurrences in the batch, of the per-example gradients (the mean's gradient
 * times n), so that an id's step does not shrink with the batch size. Repeated ids get one
 * update with the summed gradient.
 *
 * Pipelined steps (mt_trainer_set_pipelined): a step's apply goes to a thread of the trainer
 * and the step returns; the next step's lookup and computation run while it is in flight,
 * and that step waits for it before sending its own apply. So at most one apply is in
 * flight (per shard too: the examples of a partition reach each shard in order), and a
 * step's lookup may miss the previous step's update (staleness of one step, as Monolith's
 * asynchronous workers). With mt_trainer_prefetch() the caller also hands over the batch it
 * will train next before training this one: its lookup runs on that thread after the previous
 * step's apply and before this one's, while this step computes, and the step of that batch
 * then uses the values it read (it misses exactly one step's update, the one before it).
 * docs/trainer.md, "The pipelined step against the PS".
 *
 * Thread safety: a trainer is used by one thread at a time (its apply thread, when
 * pipelined, is its own).
 */
#ifndef MT_TRAINER_H
#define MT_TRAINER_H

#include <stddef.h>
#include <stdint.h>

#include "mt/batch.h"
#include "mt/err.h"
#include "mt/model.h"
#include "mt/table.h"

typedef struct mt_trainer mt_trainer_t;
typedef struct mt_psc_range mt_psc_range_t; /* mt/psclient.h */

/** Where the sparse parameters live when not in the trainer's own table. Both calls work on
 *  packed values like mt_table_lookup() / mt_table_apply() and must be exact (no dedup
 *  needed: the trainer sends unique ids). A step makes one lookup and one apply, each of
 *  its embeddings and first-order weights together (the ids of both table slots of every
 *  feature slot); the apply carries the batch's example count in @p examples, which the PS
 *  backend sends to every shard (ApplyGradientsRequest.examples). */
typedef struct mt_trainer_backend {
    void *ud;
    mt_err_t (*lookup)(void *ud, const uint64_t *fids, size_t n, int train, uint32_t now_s,
                       float *out, size_t out_len);
    mt_err_t (*apply)(void *ud, const uint64_t *fids, size_t n, const float *grads, size_t len,
                      uint32_t now_s, uint64_t examples);
    /* Optional: apply() carrying the step's cover (mt_trainer_set_cover), applied exactly
     * once by each shard; *skipped: the shards that had applied it before. NULL: a cover is
     * refused (MT_INVALID). */
    mt_err_t (*apply_cover)(void *ud, const uint64_t *fids, size_t n, const float *grads,
                            size_t len, uint32_t now_s, uint64_t examples,
                            const mt_psc_range_t *cover, size_t ncover, uint32_t *skipped);
} mt_trainer_backend_t;

typedef struct mt_trainer_config {
    uint32_t nslots;                 /* feature slots of the batches, 1..256 */
    uint16_t slot_ids[256];          /* each < 0x8000 */
    uint32_t dim;                    /* embedding dim of every slot (default 8) */
    uint32_t nhidden;                /* MLP hidden layers (default 2) */
    uint32_t hidden[8];              /* widths (default 256, 128) */
    mt_model_family_t family;        /* the model family and its settings (mt_model_config_t's
                                        defaults: deepfm) */
    uint64_t seed;                   /* model and embedding initialization (default 1) */
    mt_table_opt_t sparse_opt;       /* optimizer of embeddings and first-order weights (FTRL) */
    float sparse_lr;                 /* default 0.05 (FTRL: alpha) */
    float init_scale;                /* uniform embedding init half-width (default 0.01) */
    uint32_t min_count;              /* frequency filter of every slot (default 0) */
    float dense_lr;                  /* Adam on the dense parameters (default 0.001) */
    float dense_beta1, dense_beta2;  /* its betas, in [0, 1) (default 0.9, 0.999) */
    float dense_eps;                 /* its eps, in (0, 1) (default 1e-8) */
    uint64_t hash_buckets;           /* 0: collisionless; else ids are reduced modulo this */
    float cowclip_ratio;             /* CowClip (mt_model_cowclip()) of each id's embedding
                                        gradient in a step: r; 0 = off (default) */
    float cowclip_zeta;              /* its lower bound on an embedding's norm (default 1e-5) */
    uint32_t slot_dim[256];          /* per feature slot, parallel to slot_ids: its embedding
                                        dim; 0 = dim (default all 0). Unequal dims need a
                                        family that takes them (dcnv2) */
    uint8_t slot_mean[256];          /* per feature slot, parallel to slot_ids: 1 = mean
                                        pooling (model.h), 0 = sum (default all 0) */
    uint64_t slot_hash_buckets[256]; /* per feature slot, parallel to slot_ids; 0:
                                        hash_buckets applies (default all 0) */
    uint32_t table_shards_log2;      /* parts of the table (default 6) */
    uint64_t table_initial_rows;     /* local table: pre-size its bucket arrays for this many
                                        rows (one per id) and take their memory at create
                                        (mt_table_config_t reserve_rows); 0 grows from empty
                                        (default 0). Ignored with a backend. */
    const mt_trainer_backend_t *backend; /* NULL: a local table; else copied at create */
} mt_trainer_config_t;

/** The phases of a step, whose wall-clock time in the calling thread mt_trainer_step_t gives. */
typedef enum mt_trainer_phase {
    MT_TRAINER_PHASE_IDS,    /* the batch's ids made unique (and put in the own table's part
                                order) */
    MT_TRAINER_PHASE_LOOKUP, /* their lookup, the own table's or the PS's (prefetched: the wait
                                for it) */
    MT_TRAINER_PHASE_MODEL,  /* pooling, forward, backward and the gradients' scatter */
    MT_TRAINER_PHASE_APPLY,  /* the sparse apply (pipelined: handing it over, and the wait for
                                the previous step's) */
    MT_TRAINER_PHASE_DENSE,  /* the local dense update (Adam; none with a remote dense store) */
    MT_TRAINER_NPHASES
} mt_trainer_phase_t;

/** A phase's name, as the metrics label it ("ids", "lookup", "model", "apply", "dense"). */
const char *mt_trainer_phase_name(mt_trainer_phase_t p);

/** What one step did. */
typedef struct mt_trainer_step {
    float loss; /* mean log loss of the batch, before the update */
    size_t examples, ids, unique_ids;
    uint32_t skipped_shards; /* with a cover: the shards that had applied the step before
                                (pipelined: of the previous step, whose apply this one waited
                                for; mt_trainer_wait() gives the last one's) */
    int previous;            /* pipelined: 1 if a previous step's apply was in flight and
                                this step confirmed it (it is applied: mark its messages) */
    /* where the step's time went, by phase (mt_trainer_phase_t) */
    double seconds[MT_TRAINER_NPHASES];
} mt_trainer_step_t;

void mt_trainer_config_init(mt_trainer_config_t *cfg);

/** @param[out] out  caller frees with mt_trainer_destroy(). @returns MT_OK, MT_CONFIG, MT_NOMEM. */
mt_err_t mt_trainer_create(const mt_trainer_config_t *cfg, mt_trainer_t **out);
void mt_trainer_destroy(mt_trainer_t *tr);

/** @returns the model's tasks T: labels each batch carries (mt_batch_t.ntasks) and scores
 *  per example (1 but for mmoe); 0 for NULL. */
uint32_t mt_trainer_ntasks(const mt_trainer_t *tr);

/**
 * Scores a batch with the current parameters (no update, no filter counting).
 * @param[out] probs  [batch->n * T]: example i's task t at i * T + t (T = mt_trainer_ntasks())
 * @returns MT_OK, MT_MISMATCH (the batch's slots or tasks are not the trainer's), MT_NOMEM.
 */
mt_err_t mt_trainer_predict(mt_trainer_t *tr, const mt_batch_t *batch, float *probs);

/**
 * One training step on @p batch at time @p now_s (touch time of the rows).
 * @param[out] probs  optional [batch->n * T]: the scores before the update (progressive
 *                    validation: predict each example before training on it)
 * @param[out] st     optional
 * @returns MT_OK, MT_MISMATCH, MT_INVALID (a label outside [0, 1]), MT_NOMEM.
 */
mt_err_t mt_trainer_train(mt_trainer_t *tr, const mt_batch_t *batch, uint32_t now_s, float *probs,
                          mt_trainer_step_t *st);

/**
 * The Kafka ranges the next mt_trainer_train() holds (docs/checkpoint.md, "Many trainers"):
 * its apply carries them as its cover (the backend's apply_cover), so that every shard
 * applies the step exactly once. @p cover is borrowed until that step returns; it is used by
 * that step only. @returns of that step, besides its own: MT_OUT_OF_ORDER (a shard's marks
 * are elsewhere: read them again), MT_INVALID (a backend without apply_cover).
 */
void mt_trainer_set_cover(mt_trainer_t *tr, const mt_psc_range_t *cover, size_t n);

/**
 * Turns pipelined steps on or off (see the top of this file). Turning them off waits for the
 * apply in flight first (its result: mt_trainer_wait()). With them on, mt_trainer_train()
 * returns MT_OK once its step's apply is handed to the apply thread: the step is applied
 * only when the next mt_trainer_train() or mt_trainer_wait() returns MT_OK. An error of
 * mt_trainer_train() is then its own or the previous step's apply's, and neither step's
 * apply is known to have landed (the previous one may have reached some shards: as after a
 * failed apply of an unpipelined step); nothing is in flight after it.
 * @returns MT_OK or MT_NOMEM (the thread could not start: steps stay unpipelined).
 */
mt_err_t mt_trainer_set_pipelined(mt_trainer_t *tr, int on);

/**
 * Pipelined steps: starts the training lookup of @p next, the batch of a later
 * mt_trainer_train(), on the trainer's thread at time @p now_s (the rows' touch time; the
 * step's own now_s is the apply's). A step uses the values of its batch's prefetch (the same
 * batch, unchanged: @p next is borrowed until that step) if at most one step ran since it
 * was made (its lookup then missed at most that step's apply: the bound of one step); else
 * it looks up itself. Each step drops the prefetches older than the one it used, those made
 * two or more steps before and those of its batch before it changed; a step of a batch not
 * prefetched leaves the others alone.
 * An error of mt_trainer_train() drops every prefetch, as does turning the pipeline off. A
 * dropped prefetch's lookup has happened (rows made, filter counts and touch times), as a
 * failed step's lookup has. The usual loop:
 *   b = first; while (b) { nb = next(); if (nb) mt_trainer_prefetch(tr, nb, t);
 *                          mt_trainer_train(tr, b, t, ...); b = nb; }
 * The lookup's own error comes back from the step of @p next.
 * @returns MT_OK (also for an empty batch, which needs no lookup), MT_INVALID (the pipeline
 * is off), MT_MISMATCH (the batch's slots are not the trainer's), MT_LIMIT (two prefetches
 * wait already), MT_NOMEM.
 */
mt_err_t mt_trainer_prefetch(mt_trainer_t *tr, const mt_batch_t *next, uint32_t now_s);

/**
 * Pipelined steps: waits until the apply in flight (if any) is answered (prefetched lookups
 * go on).
 * @param[out] st  optional: its skipped_shards (and previous = 1 if one was in flight)
 * @returns MT_OK (nothing in flight, or it was applied) or the apply's error.
 */
mt_err_t mt_trainer_wait(mt_trainer_t *tr, mt_trainer_step_t *st);

typedef struct mt_psc mt_psc_t;

/** Fills @p out with a backend over sharded parameter servers (@p c borrowed: it must
 *  outlive the trainer). Errors of the client come back as its mt_err_t. */
void mt_trainer_backend_psc(mt_psc_t *c, mt_trainer_backend_t *out);

/** The table slots a backend must serve for this configuration, as a local trainer makes
 *  them, so that a remote run computes exactly what a local one does: the model's layout's
 *  (mt_model_layout_tables(): one per feature slot looked up in its own rows, of the model's
 *  row, embedding then first-order weight; none for a din sequence slot), with the
 *  configuration's init, optimizer, rate and min_count.
 *  @param[out] n  the number written (at most cfg->nslots)
 *  @returns MT_OK, MT_CONFIG (a model the configuration cannot make) or MT_TOO_SMALL (@p cap
 *           below their number). */
mt_err_t mt_trainer_slot_configs(const mt_trainer_config_t *cfg, mt_table_slot_config_t *out,
                                 size_t cap, size_t *n);

/** With @p remote set, a training step leaves the dense parameters alone (their gradients
 *  are still computed, in the model): someone else updates them, e.g. mt_trainer_dense_sync. */
void mt_trainer_set_dense_remote(mt_trainer_t *tr, int remote);

/*
 * Dense parameters on the parameter servers (shard 0), the trainer keeping a copy:
 * create pushes the model's initial values (the first trainer's win) and pulls the PS's;
 * after every step, mt_trainer_dense_sync_step() adds the step's dense gradients to a sum
 * and every `every` steps pushes their mean (the PS applies its dense optimizer, [dense])
 * and pulls the parameters back. With every = 1 and one trainer this is exactly a local
 * optimizer on the PS; with larger values the copy is up to every - 1 steps stale and the
 * PS takes one step per push. The trainer is switched to mt_trainer_set_dense_remote().
 * Used by the thread that trains.
 */
typedef struct mt_trainer_dense_sync mt_trainer_dense_sync_t;

/** @returns MT_OK, MT_NOMEM, or a client error (message in @p errbuf). */
mt_err_t mt_trainer_dense_sync_create(mt_trainer_t *tr, mt_psc_t *c, uint32_t every,
                                      mt_trainer_dense_sync_t **out, char *errbuf, size_t errlen);
/** After each mt_trainer_train(). @param[out] synced  optional: 1 if it pushed and pulled.
 *  With mt_trainer_dense_sync_set_cover() the push carries that cover. */
mt_err_t mt_trainer_dense_sync_step(mt_trainer_dense_sync_t *d, int *synced, char *errbuf,
                                    size_t errlen);
/** The cover of the next push (borrowed until it; n 0: none): with every = 1 the step's
 *  (docs/checkpoint.md, "Many trainers"); a cover with every > 1 is refused by the push
 *  (MT_INVALID). A shard that had pushed it skips it (the pull still runs); MT_OUT_OF_ORDER
 *  as for mt_trainer_set_cover(). */
void mt_trainer_dense_sync_set_cover(mt_trainer_dense_sync_t *d, const mt_psc_range_t *cover,
                                     size_t n);
/** Pushes the gradients summed since the last push, if any, and pulls. */
mt_err_t mt_trainer_dense_sync_flush(mt_trainer_dense_sync_t *d, char *errbuf, size_t errlen);
/**
 * After the PS shards were restored (mt_coord_recover()): drops the gradients summed since
 * the last push and takes the PS's dense parameters. With @p fresh (restored to the empty
 * state) the model's dense parameters first go back to their initial values (the seed's),
 * which create the PS's tensors as at the very start.
 * @returns MT_OK, MT_NOMEM, or a client error (message in @p errbuf).
 */
mt_err_t mt_trainer_dense_sync_reset(mt_trainer_dense_sync_t *d, int fresh, char *errbuf,
                                     size_t errlen);
/** The PS's dense version after the last pull. */
uint64_t mt_trainer_dense_sync_version(const mt_trainer_dense_sync_t *d);
void mt_trainer_dense_sync_destroy(mt_trainer_dense_sync_t *d);

/** The trainer's table (NULL with a backend) and model (owned by it). */
mt_table_t *mt_trainer_table(mt_trainer_t *tr);
mt_model_t *mt_trainer_model(mt_trainer_t *tr);

#endif /* MT_TRAINER_H */
