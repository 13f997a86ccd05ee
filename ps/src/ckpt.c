/*
 * ckpt.c - a shard's checkpoints on its store (mt/store.h): write one (Snapshot), list them
 * (Checkpoints), load one into the running shard (Restore, and the daemon's start).
 *
 * A checkpoint is the table "sparse" (mt_table_save stream) and one metadata blob:
 *
 *   offset  size  field
 *   0       4     n, little-endian
 *   4       n     CheckpointMeta (protobuf): id, shard, num_shards, created_ms, table and
 *                 dense versions, step, Kafka offsets, consistent, examples_applied
 *   4 + n   ...   DenseState (protobuf): the dense tensors with their optimizer state
 *
 * Cluster checkpoints (docs/checkpoint.md): a coordinator (the trainer) pauses its writes,
 * asks every shard for a Snapshot with one id, consistent = 1 and its Kafka offsets, and
 * later rolls every shard back to the newest id they all have with Restore. Restore loads
 * the checkpoint into a new table first (the shard keeps serving meanwhile), installs it
 * while the shard is quiesced (mt__ps_install, shard.c), then deletes the checkpoints above it from
 * the store (mt_store_rollback), so that a restart of the shard comes back to the same
 * state and ids above it can be written again.
 *
 * Layer (ckpt_int.h): uses the shard state and the dense store (shard.c, dense.c) only;
 * the rpc handlers (handlers.c) and the daemon use it, never the other way round.
 *
 * Every entry point takes the shard's snap_lock (held here, in mt__ps_ckpt_t) for its whole
 * run: snapshots, restores and listings are serialized, and a snapshot never sees a table
 * being swapped. The counters read by the metrics are atomics (a long snapshot must not
 * block /metrics).
 *
 * Coordinated mode (mt_ps_coordinated(), docs/checkpoint.md "Local snapshots of the PS"):
 * once a coordinator owns the shard's checkpoints, local snapshots are skipped. Only a
 * coordinator's acts turn it on (coordinate_locked, which logs the reason): a consistent
 * Snapshot, a Restore carrying a coordinator epoch, a start from a consistent checkpoint.
 * An operator's Restore (epoch 0) does not: it turned the mode on once, and the daemon then
 * silently lost everything applied after it at SIGTERM. A skipped local snapshot says why
 * and whether the state changed since the last checkpoint (the saved_* marks), so that the
 * daemon's shutdown can log what it does not save.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "monolith/v1/ps.pb-c.h"
#include "mt/clock.h"
#include "mt/log.h"
#include "mt/store.h"
#include "ckpt_int.h"

#define WHO    "ps"
#define SPARSE "sparse" /* the table's name in a checkpoint */

struct mt__ps_ckpt {
    pthread_mutex_t snap_lock; /* one snapshot, restore or listing at a time */
    mt_store_t *store;         /* borrowed; set and used under snap_lock */
    _Atomic int coordinated;
    char coord_why[192]; /* why coordinated turned on; written once, under snap_lock */
    /* The state at the last checkpoint written or restored (under snap_lock): a skipped
     * local snapshot compares them with the state now (state_changed_locked). */
    uint64_t saved_table_version, saved_dense_version, saved_examples;
    /* Incremental snapshots (under snap_lock): the table version captured by the last
     * snapshot this process wrote (0: none since the start or the last restore, so the next
     * one is whole) and how many incremental ones followed the last whole one. */
    uint64_t delta_since;
    uint32_t deltas;
    /* The marks of the last checkpoint written or restored (sparse, dense): what a crash
     * keeps. Under durable_lock (Stats reads them while a snapshot holds snap_lock). */
    pthread_mutex_t durable_lock;
    mt__ps_mark_list_t durable[2];
    _Atomic uint64_t last_id;
    _Atomic uint64_t snapshots, snapshot_failures, restores, restore_failures, incrementals;
    _Atomic uint64_t last_snap_us, last_restore_us;
    /* Unix time the shard's state was last known durable: a checkpoint written or
     * restored, or a skipped local snapshot with nothing changed since; the shard's
     * creation before any (monolith_ps_last_snapshot_timestamp_seconds: its age is what a
     * crash would lose or replay). */
    _Atomic int64_t durable_unix_s;
};

/* ============================== lifecycle ============================== */

mt_err_t mt__ps_ckpt_create(mt__ps_ckpt_t **out) {
    mt__ps_ckpt_t *ck = calloc(1, sizeof(*ck));
    if (!ck) return MT_NOMEM;
    pthread_mutex_init(&ck->snap_lock, NULL);
    pthread_mutex_init(&ck->durable_lock, NULL);
    atomic_init(&ck->durable_unix_s, (int64_t)time(NULL));
    *out = ck;
    return MT_OK;
}

void mt__ps_ckpt_destroy(mt__ps_ckpt_t *ck) {
    if (!ck) return;
    pthread_mutex_destroy(&ck->snap_lock);
    pthread_mutex_destroy(&ck->durable_lock);
    mt__ps_mark_list_free(&ck->durable[0]);
    mt__ps_mark_list_free(&ck->durable[1]);
    free(ck);
}

void mt_ps_set_store(mt_ps_t *ps, mt_store_t *store) {
    pthread_mutex_lock(&ps->ck->snap_lock);
    ps->ck->store = store;
    pthread_mutex_unlock(&ps->ck->snap_lock);
}

int mt__ps_ckpt_has_store(mt_ps_t *ps) {
    pthread_mutex_lock(&ps->ck->snap_lock);
    int has = ps->ck->store != NULL;
    pthread_mutex_unlock(&ps->ck->snap_lock);
    return has;
}

uint64_t mt__ps_ckpt_last_id(mt_ps_t *ps) {
    return atomic_load(&ps->ck->last_id);
}

int mt_ps_coordinated(mt_ps_t *ps) {
    return atomic_load(&ps->ck->coordinated);
}

/* Turns the coordinated mode on (once), keeping and logging why. Caller holds snap_lock. */
static void coordinate_locked(mt_ps_t *ps, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void coordinate_locked(mt_ps_t *ps, const char *fmt, ...) {
    mt__ps_ckpt_t *ck = ps->ck;
    if (atomic_load(&ck->coordinated)) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ck->coord_why, sizeof(ck->coord_why), fmt, ap);
    va_end(ap);
    atomic_store(&ck->coordinated, 1);
    mt_log(MT_LOG_INFO, WHO,
           "shard %u: checkpoints are coordinated from now on (%s): no periodic or shutdown "
           "snapshot of its own (docs/checkpoint.md)",
           mt__ps_config(ps)->shard, ck->coord_why);
}

/* Copies a list of marks (for the durable ones). @returns MT_OK or MT_NOMEM. */
static mt_err_t list_dup(const mt__ps_mark_list_t *l, mt__ps_mark_list_t *out) {
    const char **t = malloc((l->n ? l->n : 1) * sizeof(*t));
    int32_t *p = malloc((l->n ? l->n : 1) * sizeof(*p));
    int64_t *nx = malloc((l->n ? l->n : 1) * sizeof(*nx));
    mt_err_t err = t && p && nx ? MT_OK : MT_NOMEM;
    for (size_t i = 0; i < l->n && !err; i++)
        t[i] = l->v[i].topic, p[i] = l->v[i].partition, nx[i] = l->v[i].next;
    if (!err) err = mt__ps_mark_list_build(t, p, nx, l->n, out);
    free(t);
    free(p);
    free(nx);
    return err;
}

/* Records @p marks (sparse, dense; copied) as the durable ones. Out of memory: the old ones
 * are dropped (Stats then under-reports what is durable, never over-reports). */
static void set_durable(mt__ps_ckpt_t *ck, const mt__ps_mark_list_t marks[2]) {
    mt__ps_mark_list_t c[2] = {{0}};
    for (int k = 0; k < 2; k++)
        if (list_dup(&marks[k], &c[k]) != MT_OK) mt__ps_mark_list_free(&c[k]);
    pthread_mutex_lock(&ck->durable_lock);
    for (int k = 0; k < 2; k++) {
        mt__ps_mark_list_t old = ck->durable[k];
        ck->durable[k] = c[k];
        c[k] = old;
    }
    pthread_mutex_unlock(&ck->durable_lock);
    mt__ps_mark_list_free(&c[0]);
    mt__ps_mark_list_free(&c[1]);
}

mt_err_t mt__ps_ckpt_durable_marks(mt_ps_t *ps, mt__ps_mark_list_t *sparse,
                                   mt__ps_mark_list_t *dense) {
    mt__ps_ckpt_t *ck = ps->ck;
    pthread_mutex_lock(&ck->durable_lock);
    mt_err_t err = list_dup(&ck->durable[0], sparse);
    if (!err) err = list_dup(&ck->durable[1], dense);
    pthread_mutex_unlock(&ck->durable_lock);
    if (err) {
        mt__ps_mark_list_free(sparse);
        mt__ps_mark_list_free(dense);
    }
    return err;
}

/* KafkaOffset messages of a list of marks (strings borrowed). @returns MT_OK or MT_NOMEM. */
static mt_err_t marks_pb(const mt__ps_mark_list_t *l, Monolith__V1__KafkaOffset **ko,
                         Monolith__V1__KafkaOffset ***kop) {
    *ko = calloc(l->n ? l->n : 1, sizeof(**ko));
    *kop = calloc(l->n ? l->n : 1, sizeof(**kop));
    if (!*ko || !*kop) return MT_NOMEM;
    for (size_t i = 0; i < l->n; i++) {
        monolith__v1__kafka_offset__init(&(*ko)[i]);
        (*ko)[i].topic = l->v[i].topic;
        (*ko)[i].partition = l->v[i].partition;
        (*ko)[i].offset = l->v[i].next;
        (*kop)[i] = &(*ko)[i];
    }
    return MT_OK;
}

/* The marks a checkpoint's meta holds, as lists. @returns MT_OK, MT_NOMEM or MT_CORRUPT
 * (the reason in @p why). */
static mt_err_t marks_of_meta(const Monolith__V1__CheckpointMeta *cm, mt__ps_mark_list_t out[2],
                              char *why, size_t wlen) {
    Monolith__V1__KafkaOffset *const *src[2] = {cm->marks, cm->dense_marks};
    size_t n[2] = {cm->n_marks, cm->n_dense_marks};
    mt_err_t err = MT_OK;
    for (int k = 0; k < 2 && !err; k++) {
        const char **t = malloc((n[k] ? n[k] : 1) * sizeof(*t));
        int32_t *p = malloc((n[k] ? n[k] : 1) * sizeof(*p));
        int64_t *nx = malloc((n[k] ? n[k] : 1) * sizeof(*nx));
        err = t && p && nx ? MT_OK : MT_NOMEM;
        for (size_t i = 0; i < n[k] && !err; i++)
            t[i] = src[k][i]->topic, p[i] = src[k][i]->partition, nx[i] = src[k][i]->offset;
        if (!err) err = mt__ps_mark_list_build(t, p, nx, n[k], &out[k]);
        if (err == MT_CORRUPT)
            mt_msgf(why, wlen,
                    "checkpoint %" PRIu64 ": its %s marks are bad (a topic that is not a Kafka "
                    "name, a negative partition or offset, or a partition twice)",
                    cm->checkpoint_id, k ? "dense" : "sparse");
        free(t);
        free(p);
        free(nx);
    }
    if (err) {
        mt__ps_mark_list_free(&out[0]);
        mt__ps_mark_list_free(&out[1]);
    }
    return err;
}

/* The dense parameters' version (the DenseState's first field). */
static uint64_t dense_version_of(const uint8_t *dense, size_t dense_len) {
    uint64_t v = 0;
    if (!dense || !dense_len) return 0;
    Monolith__V1__DenseState *st = monolith__v1__dense_state__unpack(NULL, dense_len, dense);
    if (st) {
        v = st->version;
        monolith__v1__dense_state__free_unpacked(st, NULL);
    }
    return v;
}

/* Records the state a checkpoint holds (written or restored). Caller holds snap_lock. */
static void mark_saved_locked(mt__ps_ckpt_t *ck, uint64_t table_version, uint64_t dense_version,
                              uint64_t examples) {
    ck->saved_table_version = table_version;
    ck->saved_dense_version = dense_version;
    ck->saved_examples = examples;
    atomic_store(&ck->durable_unix_s, (int64_t)time(NULL));
}

/* 1 if the table, the dense parameters or the counter changed since the last checkpoint
 * written or restored (expiry counts: it deletes rows). Caller holds snap_lock. */
static int state_changed_locked(mt_ps_t *ps) {
    mt__ps_ckpt_t *ck = ps->ck;
    mt_table_stats_t ts;
    mt_table_stats(mt_ps_table(ps), &ts); /* stable: a restore needs snap_lock */
    return ts.version != ck->saved_table_version ||
           mt__ps_dense_version(&ps->dense) != ck->saved_dense_version ||
           mt_ps_examples_applied(ps) != ck->saved_examples;
}

/* ============================== metadata ============================== */

/* The blob: u32 n, n bytes of @p cm, then @p dense. @param[out] out  malloc'd. */
static mt_err_t meta_pack(const Monolith__V1__CheckpointMeta *cm, const uint8_t *dense,
                          size_t dense_len, uint8_t **out, size_t *len) {
    size_t cml = monolith__v1__checkpoint_meta__get_packed_size(cm);
    if (cml > UINT32_MAX) return MT_LIMIT;
    uint8_t *m = malloc(4 + cml + dense_len);
    if (!m) return MT_NOMEM;
    for (int i = 0; i < 4; i++)
        m[i] = (uint8_t)(cml >> (8 * i));
    monolith__v1__checkpoint_meta__pack(cm, m + 4);
    if (dense_len) memcpy(m + 4 + cml, dense, dense_len);
    *out = m;
    *len = 4 + cml + dense_len;
    return MT_OK;
}

/* Splits a blob. @param[out] cm  caller frees with free_unpacked; dense points into @p m.
 * @param[out] why  what is wrong, on MT_CORRUPT. */
static mt_err_t meta_unpack(const uint8_t *m, size_t mlen, Monolith__V1__CheckpointMeta **cm,
                            const uint8_t **dense, size_t *dense_len, char *why, size_t wlen) {
    if (mlen < 4) {
        mt_msgf(why, wlen, "the metadata is %zu bytes, shorter than its 4-byte length field", mlen);
        return MT_CORRUPT;
    }
    size_t cml = (size_t)m[0] | (size_t)m[1] << 8 | (size_t)m[2] << 16 | (size_t)m[3] << 24;
    if (cml > mlen - 4) {
        mt_msgf(why, wlen,
                "the metadata's CheckpointMeta length (%zu bytes) runs past the blob (%zu bytes)",
                cml, mlen);
        return MT_CORRUPT;
    }
    *cm = monolith__v1__checkpoint_meta__unpack(NULL, cml, m + 4);
    if (!*cm) {
        mt_msgf(why, wlen, "the metadata's CheckpointMeta (%zu bytes) does not parse (protobuf)",
                cml);
        return MT_CORRUPT;
    }
    if (dense) *dense = m + 4 + cml;
    if (dense_len) *dense_len = mlen - 4 - cml;
    return MT_OK;
}

/* Reads and splits the metadata of checkpoint *id (0: the current one). */
static mt_err_t meta_load(mt_store_t *store, uint64_t *id, void **blob,
                          Monolith__V1__CheckpointMeta **cm, const uint8_t **dense,
                          size_t *dense_len, char *errbuf, size_t errlen) {
    size_t mlen = 0;
    *blob = NULL;
    mt_err_t err = mt_store_load_meta(store, id, blob, &mlen, errbuf, errlen);
    if (err) return err;
    char what[160] = "";
    err = meta_unpack(*blob, mlen, cm, dense, dense_len, what, sizeof(what));
    if (err) {
        mt_msgf(errbuf, errlen, "checkpoint %" PRIu64 ": %s", *id, what);
        free(*blob);
        *blob = NULL;
    }
    return err;
}

/* ============================== snapshot ============================== */

mt_err_t mt_ps_snapshot(mt_ps_t *ps, const mt_ps_snapshot_req_t *req, mt_ps_ckpt_result_t *res,
                        char *errbuf, size_t errlen) {
    mt_ps_ckpt_result_t r0;
    mt_ps_ckpt_result_t *r = res ? res : &r0;
    memset(r, 0, sizeof(*r));
    if (!ps || !req || (req->noffsets && !req->offsets)) {
        mt_msgf(errbuf, errlen, "bad arguments");
        return MT_INVALID;
    }
    mt__ps_ckpt_t *ck = ps->ck;
    const mt_ps_config_t *cfg = mt__ps_config(ps);
    mt_err_t err = MT_OK;
    uint8_t *dense = NULL, *meta = NULL;
    size_t dense_len = 0, mlen = 0;
    Monolith__V1__KafkaOffset *ko = NULL;
    Monolith__V1__KafkaOffset **kop = NULL;
    mt__ps_mark_list_t marks[2] = {{0}};
    Monolith__V1__KafkaOffset *mko[2] = {NULL, NULL};
    Monolith__V1__KafkaOffset **mkop[2] = {NULL, NULL};
    int gated = 0;
    char why[512] = "";
    double t0 = mt_mono_s();
    pthread_mutex_lock(&ps->ck->snap_lock);
    if (!ck->store) {
        err = MT_INVALID;
        snprintf(why, sizeof(why), "no checkpoint store (ps.snapshot_dir)");
        goto out;
    }
    if (req->local && atomic_load(&ck->coordinated)) { /* the coordinator's checkpoints only */
        r->skipped = 1;
        r->unsaved = state_changed_locked(ps);
        if (!r->unsaved) atomic_store(&ck->durable_unix_s, (int64_t)time(NULL));
        r->last_id = atomic_load(&ck->last_id);
        mt_msgf(errbuf, errlen, "the shard's checkpoints are coordinated (%s)", ck->coord_why);
        pthread_mutex_unlock(&ps->ck->snap_lock);
        r->seconds = mt_mono_s() - t0;
        return MT_OK;
    }
    uint64_t inc = mt_ps_incarnation(ps);
    if (req->expect_incarnation && req->expect_incarnation != inc) {
        err = MT_MISMATCH;
        snprintf(why, sizeof(why),
                 "incarnation %" PRIu64 " expected, the shard's is %" PRIu64
                 " (it restarted or was restored since)",
                 req->expect_incarnation, inc);
        goto out;
    }
    uint64_t cur = 0;
    err = mt_store_current(ck->store, &cur, why, sizeof(why));
    if (err == MT_NOT_FOUND) cur = 0, err = MT_OK;
    if (err) goto out;
    /* Ids stay below MT_PS_CHECKPOINT_ID_MAX: one of UINT64_MAX (a fuzzed request found it)
     * made every later snapshot's next id wrap to 0, so the shard never saved again. */
    if (req->checkpoint_id >= MT_PS_CHECKPOINT_ID_MAX || cur >= MT_PS_CHECKPOINT_ID_MAX - 1) {
        err = MT_INVALID;
        snprintf(why, sizeof(why),
                 "checkpoint id %" PRIu64 " (the store's newest: %" PRIu64
                 "): ids must stay below %" PRIu64,
                 req->checkpoint_id ? req->checkpoint_id : cur + 1, cur,
                 (uint64_t)MT_PS_CHECKPOINT_ID_MAX);
        goto out;
    }
    uint64_t id = req->checkpoint_id > cur ? req->checkpoint_id : cur + 1;
    if (req->consistent && (req->checkpoint_id == 0 || req->checkpoint_id <= cur)) {
        err = req->checkpoint_id ? MT_MISMATCH : MT_INVALID;
        snprintf(why, sizeof(why),
                 "consistent checkpoint %" PRIu64 ": not above the shard's newest (%" PRIu64 ")",
                 req->checkpoint_id, cur);
        goto out;
    }
    /* Everything below is captured with covered applies held at the gate (marks_int.h):
     * the marks saved are exactly those of the rows, dense tensors and counter saved. */
    mt__ps_marks_gate_exclusive(ps->marks);
    gated = 1;
    if ((err = mt__ps_marks_copy(ps->marks, MT__PS_SPARSE, &marks[0])) != MT_OK ||
        (err = mt__ps_marks_copy(ps->marks, MT__PS_DENSE, &marks[1])) != MT_OK ||
        (err = marks_pb(&marks[0], &mko[0], &mkop[0])) != MT_OK ||
        (err = marks_pb(&marks[1], &mko[1], &mkop[1])) != MT_OK) {
        snprintf(why, sizeof(why), "marks: %s", mt_strerror(err));
        goto out;
    }
    if ((err = mt_ps_dense_save(ps, &dense, &dense_len)) != MT_OK) {
        snprintf(why, sizeof(why), "dense parameters: %s", mt_strerror(err));
        goto out;
    }
    ko = calloc(req->noffsets ? req->noffsets : 1, sizeof(*ko));
    kop = calloc(req->noffsets ? req->noffsets : 1, sizeof(*kop));
    if (!ko || !kop) {
        err = MT_NOMEM;
        goto out;
    }
    for (size_t i = 0; i < req->noffsets; i++) {
        monolith__v1__kafka_offset__init(&ko[i]);
        ko[i].topic = (char *)(req->offsets[i].topic ? req->offsets[i].topic : "");
        ko[i].partition = req->offsets[i].partition;
        ko[i].offset = req->offsets[i].offset;
        kop[i] = &ko[i];
    }
    mt_table_t *table = mt_ps_table(ps); /* stable: a restore needs snap_lock */
    mt_table_stats_t ts;
    mt_table_stats(table, &ts);
    uint64_t examples = mt_ps_examples_applied(ps);
    Monolith__V1__CheckpointMeta cm = MONOLITH__V1__CHECKPOINT_META__INIT;
    cm.checkpoint_id = id;
    cm.shard = cfg->shard;
    cm.num_shards = cfg->num_shards;
    cm.created_ms = (int64_t)time(NULL) * 1000;
    cm.table_version = ts.version;
    cm.step = mt__ps_step(ps);
    cm.n_offsets = req->noffsets;
    cm.offsets = kop;
    cm.consistent = req->consistent != 0;
    cm.examples_applied = examples;
    cm.epoch = mt__ps_epoch(ps);
    cm.dense_version = dense_version_of(dense, dense_len);
    cm.n_marks = marks[0].n;
    cm.marks = mkop[0];
    cm.n_dense_marks = marks[1].n;
    cm.dense_marks = mkop[1];
    if ((err = meta_pack(&cm, dense, dense_len, &meta, &mlen)) != MT_OK) goto out;
    /* Whole, or the rows changed since the last snapshot written (on top of it: it is the
     * store's current one, since a restore resets delta_since). */
    mt_store_table_t t = {SPARSE, table, 0};
    uint64_t cursor = mt_table_changes_cursor(table); /* the next incremental's since */
    if (ck->delta_since && cfg->snapshot_full_every > 1 &&
        ck->deltas + 1 < cfg->snapshot_full_every && cur)
        t.since = ck->delta_since;
    mt_store_result_t sres;
    err = mt_store_save(ck->store, id, &t, 1, meta, mlen, &sres, why, sizeof(why));
    if (err == MT_FULL_SYNC) { /* the change log lost track (it is bounded): whole, then */
        mt_log(MT_LOG_INFO, WHO, "shard %u: checkpoint %" PRIu64 " is written whole: %s",
               cfg->shard, id, why);
        t.since = 0;
        why[0] = 0;
        err = mt_store_save(ck->store, id, &t, 1, meta, mlen, &sres, why, sizeof(why));
    }
    mt__ps_marks_gate_release(ps->marks);
    gated = 0;
    if (err) goto out;
    r->incremental = t.since != 0;
    ck->deltas = t.since ? ck->deltas + 1 : 0;
    ck->delta_since = cursor;
    if (t.since) atomic_fetch_add(&ck->incrementals, 1);
    set_durable(ck, marks);
    r->checkpoint_id = id;
    r->rows = sres.rows;
    r->bytes = sres.bytes;
    r->examples_applied = examples;
    r->incarnation = inc;
    r->consistent = cm.consistent;
    atomic_store(&ck->last_id, id);
    atomic_fetch_add(&ck->snapshots, 1);
    mark_saved_locked(ck, ts.version, cm.dense_version, examples);
    if (req->consistent)
        coordinate_locked(ps, "consistent snapshot %" PRIu64 ": a cluster checkpoint", id);
out:
    if (gated) mt__ps_marks_gate_release(ps->marks);
    r->seconds = mt_mono_s() - t0;
    if (err) {
        if (err == MT_NOMEM && !*why) snprintf(why, sizeof(why), "out of memory");
        atomic_fetch_add(&ck->snapshot_failures, 1);
        mt_log(MT_LOG_ERROR, WHO, "shard %u: snapshot failed: %s: %s", cfg->shard, mt_strerror(err),
               why);
        mt_msgf(errbuf, errlen, "%s", why);
    } else {
        atomic_store(&ck->last_snap_us, (uint64_t)(r->seconds * 1e6));
        mt_log(MT_LOG_INFO, WHO,
               "shard %u: %s%s checkpoint %" PRIu64 ": %" PRIu64 " rows, %" PRIu64
               " bytes, %" PRIu64 " examples, %zu offsets in %.3f s",
               cfg->shard, r->consistent ? "consistent" : "local",
               r->incremental ? " incremental" : "", r->checkpoint_id, r->rows, r->bytes,
               r->examples_applied, req->noffsets, r->seconds);
    }
    pthread_mutex_unlock(&ps->ck->snap_lock);
    free(dense);
    free(meta);
    free(ko);
    free(kop);
    for (int k = 0; k < 2; k++) {
        free(mko[k]);
        free(mkop[k]);
        mt__ps_mark_list_free(&marks[k]);
    }
    return err;
}

/* ============================== restore ============================== */

mt_err_t mt_ps_restore(mt_ps_t *ps, uint64_t checkpoint_id, mt_ps_ckpt_result_t *res, char *errbuf,
                       size_t errlen) {
    return mt_ps_restore_claim(ps, checkpoint_id, 0, res, errbuf, errlen);
}

mt_err_t mt_ps_restore_claim(mt_ps_t *ps, uint64_t checkpoint_id, uint64_t epoch,
                             mt_ps_ckpt_result_t *res, char *errbuf, size_t errlen) {
    mt_ps_ckpt_result_t r0;
    mt_ps_ckpt_result_t *r = res ? res : &r0;
    memset(r, 0, sizeof(*r));
    if (!ps) return MT_INVALID;
    mt__ps_ckpt_t *ck = ps->ck;
    const mt_ps_config_t *cfg = mt__ps_config(ps);
    mt_err_t err = MT_OK;
    void *blob = NULL;
    Monolith__V1__CheckpointMeta *cm = NULL;
    const uint8_t *dense = NULL;
    size_t dense_len = 0;
    mt_table_t *table = NULL;
    mt__ps_dense_t *dd = NULL;
    mt__ps_mark_list_t marks[2] = {{0}}; /* the checkpoint's, until the install takes them */
    uint64_t id = checkpoint_id == MT_PS_NEWEST ? 0 : checkpoint_id, table_version = 0;
    int newest = checkpoint_id == MT_PS_NEWEST, installed = 0;
    char why[512] = "";
    double t0 = mt_mono_s();
    pthread_mutex_lock(&ps->ck->snap_lock);
    if (!ck->store) {
        err = MT_INVALID;
        snprintf(why, sizeof(why), "no checkpoint store (ps.snapshot_dir)");
        goto out;
    }
    if (mt__ps_fenced(ps, epoch, why, sizeof(why))) {
        err = MT_FENCED;
        goto out;
    }
    mt__ps_epoch_raise(ps, epoch); /* the claim: later writes of lower epochs are refused */
    if (newest) {                  /* name the checkpoint in every message: resolve it first */
        err = mt_store_current(ck->store, &id, why, sizeof(why));
        if (err == MT_NOT_FOUND) { /* nothing to restore: keep the empty state */
            err = MT_OK;
            r->incarnation = mt_ps_incarnation(ps);
            mt_log(MT_LOG_INFO, WHO, "shard %u: no checkpoint: starting empty", cfg->shard);
            goto out;
        }
        if (err) goto out;
    }
    if (id) {
        err = meta_load(ck->store, &id, &blob, &cm, &dense, &dense_len, why, sizeof(why));
        if (err == MT_NOT_FOUND && newest) { /* current names it: damage, never "empty" */
            err = MT_CORRUPT;
            size_t n = strlen(why);
            snprintf(why + n, sizeof(why) - n, " (the store's current checkpoint)");
        }
        if (err) goto out;
        if (cm->shard != cfg->shard) {
            err = MT_MISMATCH;
            snprintf(why, sizeof(why), "checkpoint %" PRIu64 " belongs to shard %u, this is %u", id,
                     cm->shard, cfg->shard);
            goto out;
        }
        err = mt_store_load_table(ck->store, id, SPARSE, &cfg->table, &table, why, sizeof(why));
        if (err) goto out;
    } else {
        err = mt_table_create(&cfg->table, &table);
        if (err) {
            snprintf(why, sizeof(why), "empty table: %s", mt_strerror(err));
            goto out;
        }
    }
    if ((err = mt__ps_dense_parse(dense, dense_len, &dd)) != MT_OK) {
        snprintf(why, sizeof(why), "checkpoint %" PRIu64 ": dense parameters: %s", id,
                 mt_strerror(err));
        goto out;
    }
    if (cm && (err = marks_of_meta(cm, marks, why, sizeof(why))) != MT_OK) {
        if (err == MT_NOMEM) snprintf(why, sizeof(why), "out of memory");
        goto out;
    }
    uint64_t examples = cm ? cm->examples_applied : 0, step = cm ? cm->step : 0;
    if (cm) mt__ps_epoch_raise(ps, cm->epoch); /* a restarted shard keeps fencing */
    mt_table_stats_t ts;
    mt_table_stats(table, &ts); /* before the shard's calls may change it */
    table_version = ts.version;
    mt__ps_mark_list_t keep[2] = {{0}}; /* the durable marks: the install takes marks */
    if (list_dup(&marks[0], &keep[0]) != MT_OK || list_dup(&marks[1], &keep[1]) != MT_OK) {
        mt__ps_mark_list_free(&keep[0]);
        err = MT_NOMEM;
        snprintf(why, sizeof(why), "out of memory");
        goto out;
    }
    err = mt__ps_install(ps, table, dd, examples, step, marks, MT_PS_QUIESCE_S);
    if (!err) set_durable(ck, keep);
    mt__ps_mark_list_free(&keep[0]);
    mt__ps_mark_list_free(&keep[1]);
    if (err) {
        snprintf(why, sizeof(why), "calls still in flight after %d s", MT_PS_QUIESCE_S);
        goto out;
    }
    installed = 1;
    table = NULL; /* the shard's now */
    r->checkpoint_id = id;
    r->rows = ts.rows;
    r->examples_applied = examples;
    r->incarnation = mt_ps_incarnation(ps);
    r->consistent = cm && cm->consistent;
    atomic_store(&ck->last_id, id);
    mark_saved_locked(ck, table_version, dense_version_of(dense, dense_len), examples);
    ck->delta_since = 0; /* a loaded table's changes start over: the next snapshot is whole */
    ck->deltas = 0;
    if (epoch && id) /* the coordinator's claim; an operator's Restore (no epoch) is none */
        coordinate_locked(ps, "Restore of checkpoint %" PRIu64 " by coordinator epoch %" PRIu64, id,
                          epoch);
    else if (epoch)
        coordinate_locked(ps, "Restore of the empty state by coordinator epoch %" PRIu64, epoch);
    else if (newest && r->consistent)
        coordinate_locked(ps, "restarted from cluster checkpoint %" PRIu64, id);
    if (!newest) { /* the checkpoints above it belong to a history given up */
        char rb[400] = "";
        err = mt_store_rollback(ck->store, id, &r->dropped, rb, sizeof(rb));
        if (err)
            snprintf(why, sizeof(why), "installed, but the store kept newer checkpoints: %s", rb);
    }
out:
    r->seconds = mt_mono_s() - t0;
    if (err) {
        atomic_fetch_add(&ck->restore_failures, 1);
        if (!*why) snprintf(why, sizeof(why), "%s", mt_strerror(err));
        char what[64] = "the newest checkpoint";
        if (id)
            snprintf(what, sizeof(what), "checkpoint %" PRIu64, id);
        else if (!newest)
            snprintf(what, sizeof(what), "the empty state");
        mt_log(MT_LOG_ERROR, WHO, "shard %u: restore of %s failed: %s: %s", cfg->shard, what,
               mt_strerror(err), why);
        mt_msgf(errbuf, errlen, "%s", why);
    } else if (installed) {
        atomic_fetch_add(&ck->restores, 1);
        atomic_store(&ck->last_restore_us, (uint64_t)(r->seconds * 1e6));
        char what[48] = "the empty state";
        if (id) snprintf(what, sizeof(what), "checkpoint %" PRIu64, id);
        mt_log(MT_LOG_INFO, WHO,
               "shard %u: restored %s: %" PRIu64 " rows, %" PRIu64
               " examples, incarnation %016" PRIx64 ", %" PRIu64 " newer dropped, %.3f s",
               cfg->shard, what, r->rows, r->examples_applied, r->incarnation, r->dropped,
               r->seconds);
    }
    pthread_mutex_unlock(&ps->ck->snap_lock);
    mt_table_destroy(table);
    mt__ps_dense_free(dd);
    mt__ps_mark_list_free(&marks[0]);
    mt__ps_mark_list_free(&marks[1]);
    if (cm) monolith__v1__checkpoint_meta__free_unpacked(cm, NULL);
    free(blob);
    return err;
}

/* ============================== list ============================== */

void mt__ps_ckpt_list_free(Monolith__V1__CheckpointMeta **metas, size_t n) {
    for (size_t i = 0; metas && i < n; i++)
        if (metas[i]) monolith__v1__checkpoint_meta__free_unpacked(metas[i], NULL);
    free(metas);
}

mt_err_t mt__ps_ckpt_list(mt_ps_t *ps, Monolith__V1__CheckpointMeta ***metas, size_t *n,
                          uint64_t *incarnation, uint64_t *examples, char *errbuf, size_t errlen) {
    mt__ps_ckpt_t *ck = ps->ck;
    mt_err_t err = MT_OK;
    mt_store_info_t *infos = NULL;
    Monolith__V1__CheckpointMeta **out = NULL;
    size_t cnt = 0, got = 0;
    *metas = NULL;
    *n = 0;
    pthread_mutex_lock(&ps->ck->snap_lock);
    if (!ck->store) {
        err = MT_INVALID;
        mt_msgf(errbuf, errlen, "no checkpoint store (ps.snapshot_dir)");
        goto out;
    }
    *incarnation = mt_ps_incarnation(ps);
    *examples = mt_ps_examples_applied(ps);
    if ((err = mt_store_list(ck->store, NULL, 0, &cnt, errbuf, errlen)) != MT_OK) goto out;
    infos = calloc(cnt ? cnt : 1, sizeof(*infos));
    out = calloc(cnt ? cnt : 1, sizeof(*out));
    if (!infos || !out) {
        err = MT_NOMEM;
        mt_msgf(errbuf, errlen, "out of memory");
        goto out;
    }
    /* saves and rollbacks go through snap_lock: the list cannot change meanwhile */
    if ((err = mt_store_list(ck->store, infos, cnt, &cnt, errbuf, errlen)) != MT_OK) goto out;
    for (got = 0; got < cnt; got++) {
        uint64_t id = infos[got].checkpoint_id;
        void *blob = NULL;
        err = meta_load(ck->store, &id, &blob, &out[got], NULL, NULL, errbuf, errlen);
        free(blob);
        if (err) goto out;
    }
    *metas = out;
    *n = cnt;
    out = NULL;
out:
    pthread_mutex_unlock(&ps->ck->snap_lock);
    mt__ps_ckpt_list_free(out, got);
    free(infos);
    return err;
}

/* ============================== metrics ============================== */

void mt__ps_ckpt_render(mt_ps_t *ps, mt_strbuf_t *b) {
    mt__ps_ckpt_t *ck = ps->ck;
    unsigned sh = mt__ps_config(ps)->shard;
    struct {
        const char *name, *type, *help;
        double v;
    } g[] = {
        {"monolith_ps_snapshots_total", "counter", "Checkpoints written.",
         (double)atomic_load(&ck->snapshots)},
        {"monolith_ps_snapshot_failures_total", "counter", "Checkpoints that failed.",
         (double)atomic_load(&ck->snapshot_failures)},
        {"monolith_ps_snapshots_incremental_total", "counter",
         "Checkpoints written as the rows changed since the previous one.",
         (double)atomic_load(&ck->incrementals)},
        {"monolith_ps_snapshot_seconds", "gauge", "Duration of the last checkpoint.",
         (double)atomic_load(&ck->last_snap_us) * 1e-6},
        {"monolith_ps_restores_total", "counter",
         "Checkpoints (or the empty state) loaded into the running shard.",
         (double)atomic_load(&ck->restores)},
        {"monolith_ps_restore_failures_total", "counter", "Restores that failed.",
         (double)atomic_load(&ck->restore_failures)},
        {"monolith_ps_restore_seconds", "gauge", "Duration of the last restore.",
         (double)atomic_load(&ck->last_restore_us) * 1e-6},
        {"monolith_ps_last_snapshot_timestamp_seconds", "gauge",
         "Unix time the shard's state was last durable (a checkpoint written or restored, or "
         "nothing changed since); its start before that.",
         (double)atomic_load(&ck->durable_unix_s)},
        {"monolith_ps_last_checkpoint_id", "gauge",
         "Id of the last checkpoint written or restored.", (double)atomic_load(&ck->last_id)},
        {"monolith_ps_coordinated", "gauge",
         "1: the shard takes part in cluster checkpoints (no local snapshots).",
         (double)atomic_load(&ck->coordinated)},
    };
    for (size_t i = 0; i < sizeof(g) / sizeof(g[0]); i++)
        mt_strbuf_printf(b, "# HELP %s %s\n# TYPE %s %s\n%s{shard=\"%u\"} %.17g\n", g[i].name,
                         g[i].help, g[i].name, g[i].type, g[i].name, sh, g[i].v);
}
