/*
 * coord.c - cluster checkpoints and recovery for one trainer (see mt/coord.h and
 * docs/checkpoint.md for the protocol and why it loses and repeats nothing).
 */
#include "mt/coord.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mt/clock.h"
#include "mt/log.h"

#define WHO "trainer"

struct mt_coord {
    mt_psc_t *psc;
    mt_coord_config_t cfg;
    uint32_t n;               /* shards */
    uint64_t *incarnation;    /* [n]: each shard's at the last recovery; 0 unknown */
    uint64_t next_id;         /* the id of the next checkpoint attempt */
    uint64_t last;            /* the last complete checkpoint */
    mt_psc_shard_ckpt_t *tmp; /* [n] answers of the last admin call */
    uint64_t epoch;           /* this coordinator's fencing epoch; 0 until the first recovery */
};

void mt_coord_config_init(mt_coord_config_t *cfg) {
    memset(cfg, 0, sizeof(*cfg));
    cfg->recovery_timeout_s = 300;
    cfg->call_deadline_ms = 600000;
}

mt_err_t mt_coord_create(mt_psc_t *psc, const mt_coord_config_t *cfg, mt_coord_t **out) {
    if (!psc || !cfg || !(cfg->recovery_timeout_s > 0) || cfg->call_deadline_ms <= 0)
        return MT_CONFIG;
    mt_coord_t *co = calloc(1, sizeof(*co));
    if (!co) return MT_NOMEM;
    co->psc = psc;
    co->cfg = *cfg;
    co->n = mt_psc_num_shards(psc);
    co->next_id = 1;
    co->incarnation = calloc(co->n, sizeof(uint64_t));
    co->tmp = calloc(co->n, sizeof(*co->tmp));
    if (!co->incarnation || !co->tmp) {
        mt_coord_destroy(co);
        return MT_NOMEM;
    }
    *out = co;
    return MT_OK;
}

void mt_coord_destroy(mt_coord_t *co) {
    if (!co) return;
    if (co->tmp) mt_psc_shard_ckpt_free(co->tmp, co->n);
    free(co->tmp);
    free(co->incarnation);
    free(co);
}

uint64_t mt_coord_last(const mt_coord_t *co) {
    return co->last;
}

void mt_coord_point_free(mt_coord_point_t *pt) {
    if (!pt) return;
    for (size_t i = 0; i < pt->noffsets; i++)
        free(pt->offsets[i].topic);
    free(pt->offsets);
    memset(pt, 0, sizeof(*pt));
}

/* The first shard that failed, as "shard i: status message". */
static void first_failure(const mt_coord_t *co, const char *what, mt_err_t err, char *errbuf,
                          size_t errlen) {
    for (uint32_t s = 0; s < co->n; s++) {
        if (co->tmp[s].err == MT_OK) continue;
        mt_msgf(errbuf, errlen, "%s: shard %u: %s (status %d: %s)", what, s,
                mt_strerror(co->tmp[s].err), co->tmp[s].st.code, co->tmp[s].st.message);
        return;
    }
    mt_msgf(errbuf, errlen, "%s: %s", what, mt_strerror(err));
}

/* The highest coordinator epoch the shards listed in co->tmp have seen. */
static uint64_t seen_epoch(const mt_coord_t *co) {
    uint64_t top = 0;
    for (uint32_t s = 0; s < co->n; s++)
        if (co->tmp[s].epoch > top) top = co->tmp[s].epoch;
    return top;
}

/* MT_FENCED (message in errbuf) if a shard has seen an epoch above this coordinator's. */
static mt_err_t check_fence(const mt_coord_t *co, char *errbuf, size_t errlen) {
    uint64_t top = seen_epoch(co);
    if (!co->epoch || top <= co->epoch) return MT_OK;
    mt_msgf(errbuf, errlen,
            "fenced: a shard has seen coordinator epoch %" PRIu64 ", above this trainer's %" PRIu64
            ": another trainer took over the cluster's checkpoints",
            top, co->epoch);
    return MT_FENCED;
}

/* A new epoch above @p top: its high 32 bits count takeovers, its low 32 are random, so two
 * trainers that list the shards before either claims still get different epochs (but for a
 * chance of 2^-32): the higher draw wins, the other is fenced at its next write. 0 when the
 * takeover count is exhausted (2^32 takeovers). */
static uint64_t new_epoch(uint64_t top) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t z = ((uint64_t)ts.tv_nsec << 20) ^ (uint64_t)ts.tv_sec ^ ((uint64_t)getpid() << 40);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    if ((top >> 32) == 0xFFFFFFFFull) return 0;
    return (((top >> 32) + 1) << 32) | (z & 0xFFFFFFFFull) | 1; /* never 0 */
}

uint64_t mt_coord_epoch(const mt_coord_t *co) {
    return co->epoch;
}

static const mt_psc_checkpoint_t *find(const mt_psc_shard_ckpt_t *sh, uint64_t id) {
    for (size_t k = 0; k < sh->n; k++)
        if (sh->list[k].checkpoint_id == id) return &sh->list[k];
    return NULL;
}

static int same_offsets(const mt_psc_checkpoint_t *a, const mt_psc_checkpoint_t *b) {
    if (a->noffsets != b->noffsets) return 0;
    for (size_t i = 0; i < a->noffsets; i++) {
        const mt_psc_offset_t *x = &a->offsets[i], *y = &b->offsets[i];
        if (x->partition != y->partition || x->offset != y->offset || strcmp(x->topic, y->topic))
            return 0;
    }
    return 1;
}

/* From the listings in co->tmp: the last complete checkpoint (0: none) into *pt, and the
 * highest id any shard holds into *max_id. */
static mt_err_t choose(mt_coord_t *co, mt_coord_point_t *pt, uint64_t *max_id, char *errbuf,
                       size_t errlen) {
    uint64_t best = 0, top = 0;
    for (uint32_t s = 0; s < co->n; s++)
        for (size_t k = 0; k < co->tmp[s].n; k++)
            if (co->tmp[s].list[k].checkpoint_id > top) top = co->tmp[s].list[k].checkpoint_id;
    /* candidates: shard 0's consistent ids, newest first */
    for (size_t k = co->tmp[0].n; k-- > 0 && !best;) {
        const mt_psc_checkpoint_t *c0 = &co->tmp[0].list[k];
        if (!c0->consistent) continue;
        int everywhere = 1;
        for (uint32_t s = 1; s < co->n && everywhere; s++) {
            const mt_psc_checkpoint_t *cs = find(&co->tmp[s], c0->checkpoint_id);
            everywhere = cs && cs->consistent;
        }
        if (everywhere) best = c0->checkpoint_id;
    }
    *max_id = top;
    memset(pt, 0, sizeof(*pt));
    if (!best) return MT_OK;
    const mt_psc_checkpoint_t *c0 = find(&co->tmp[0], best);
    for (uint32_t s = 1; s < co->n; s++) {
        const mt_psc_checkpoint_t *cs = find(&co->tmp[s], best);
        if (!same_offsets(c0, cs) || cs->examples_applied != c0->examples_applied) {
            mt_msgf(errbuf, errlen,
                    "checkpoint %" PRIu64 ": shards 0 and %u disagree (offsets or examples %" PRIu64
                    " vs %" PRIu64
                    "): written by two coordinators, or a step applied twice (a retried call)?",
                    best, s, c0->examples_applied, cs->examples_applied);
            return MT_CORRUPT;
        }
    }
    pt->checkpoint_id = best;
    pt->examples_applied = c0->examples_applied;
    if (c0->noffsets) {
        pt->offsets = calloc(c0->noffsets, sizeof(*pt->offsets));
        if (!pt->offsets) return MT_NOMEM;
        for (size_t i = 0; i < c0->noffsets; i++) {
            pt->noffsets = i + 1;
            pt->offsets[i] = c0->offsets[i];
            if (!(pt->offsets[i].topic = strdup(c0->offsets[i].topic))) {
                mt_coord_point_free(pt);
                return MT_NOMEM;
            }
        }
    }
    return MT_OK;
}

static void pause_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

mt_err_t mt_coord_recover(mt_coord_t *co, mt_coord_point_t *pt, char *errbuf, size_t errlen) {
    double t0 = mt_mono_s(), deadline = t0 + co->cfg.recovery_timeout_s, wait = 0.2;
    char why[512] = "";
    memset(pt, 0, sizeof(*pt));
    for (int attempt = 0;; attempt++) {
        if (attempt) {
            if (mt_mono_s() + wait > deadline) {
                mt_msgf(errbuf, errlen, "no recovery within %.0f s: %s", co->cfg.recovery_timeout_s,
                        why);
                return MT_TIMEOUT;
            }
            if (attempt == 1 || attempt % 10 == 0)
                mt_log(MT_LOG_WARN, WHO, "recovery: %s (retrying)", why);
            pause_s(wait);
            wait = wait < 2 ? wait * 2 : 2;
        }
        if (co->cfg.stop && co->cfg.stop(co->cfg.stop_ud)) {
            mt_msgf(errbuf, errlen, "recovery stopped: %s", *why ? why : "by request");
            return MT_CANCELLED;
        }
        mt_psc_shard_ckpt_free(co->tmp, co->n);
        mt_err_t err = mt_psc_checkpoints(co->psc, co->cfg.call_deadline_ms, co->tmp);
        if (err) {
            first_failure(co, "Checkpoints", err, why, sizeof(why));
            continue;
        }
        if ((err = check_fence(co, errbuf, errlen)) != MT_OK) return err;
        if (!co->epoch) { /* the first recovery claims the cluster (docs/checkpoint.md) */
            co->epoch = new_epoch(seen_epoch(co));
            if (!co->epoch) {
                mt_msgf(errbuf, errlen, "no coordinator epoch above %" PRIu64 " is left",
                        seen_epoch(co));
                return MT_LIMIT;
            }
            mt_psc_set_epoch(co->psc, co->epoch);
            mt_log(MT_LOG_INFO, WHO,
                   "coordinator epoch %" PRIu64 " (the shards had seen %" PRIu64 ")", co->epoch,
                   seen_epoch(co));
        }
        uint64_t top = 0;
        err = choose(co, pt, &top, why, sizeof(why));
        if (err == MT_CORRUPT || err == MT_NOMEM) {
            mt_msgf(errbuf, errlen, "%s", why);
            return err;
        }
        if (top + 1 > co->next_id) co->next_id = top + 1;
        mt_psc_shard_ckpt_free(co->tmp, co->n);
        err = mt_psc_restore_all(co->psc, co->cfg.token, pt->checkpoint_id,
                                 co->cfg.call_deadline_ms, co->tmp);
        if (err) {
            first_failure(co, "Restore", err, why, sizeof(why));
            mt_coord_point_free(pt);
            if (err == MT_FENCED) {
                mt_msgf(errbuf, errlen, "%s", why);
                return err;
            }
            continue;
        }
        for (uint32_t s = 0; s < co->n; s++) {
            co->incarnation[s] = co->tmp[s].incarnation;
            if (co->tmp[s].examples_applied != pt->examples_applied)
                mt_log(MT_LOG_WARN, WHO,
                       "recovery: shard %u restored %" PRIu64
                       " examples, the checkpoint said %" PRIu64,
                       s, co->tmp[s].examples_applied, pt->examples_applied);
        }
        co->last = pt->checkpoint_id;
        char what[48] = "the empty state";
        if (pt->checkpoint_id)
            snprintf(what, sizeof(what), "checkpoint %" PRIu64, pt->checkpoint_id);
        mt_log(MT_LOG_INFO, WHO,
               "recovered %u shards to %s (%" PRIu64 " examples, %zu offsets) in %.2f s", co->n,
               what, pt->examples_applied, pt->noffsets, mt_mono_s() - t0);
        return MT_OK;
    }
}

mt_err_t mt_coord_checkpoint(mt_coord_t *co, const mt_psc_offset_t *offsets, size_t noffsets,
                             uint64_t *id, uint64_t *examples, char *errbuf, size_t errlen) {
    uint64_t want = co->next_id++;
    double t0 = mt_mono_s();
    mt_psc_shard_ckpt_free(co->tmp, co->n);
    mt_err_t err = mt_psc_snapshot_all(co->psc, co->cfg.token, want, co->incarnation, offsets,
                                       noffsets, co->cfg.call_deadline_ms, co->tmp);
    if (err) {
        first_failure(co, "Snapshot", err, errbuf, errlen);
        return err;
    }
    for (uint32_t s = 1; s < co->n; s++) {
        if (co->tmp[s].examples_applied != co->tmp[0].examples_applied) {
            /* every step reaches every shard: a difference is a bug or a second writer */
            mt_msgf(errbuf, errlen,
                    "checkpoint %" PRIu64 ": shard 0 holds %" PRIu64 " examples, shard %u %" PRIu64,
                    want, co->tmp[0].examples_applied, s, co->tmp[s].examples_applied);
            return MT_CORRUPT;
        }
    }
    co->last = want;
    if (id) *id = want;
    if (examples) *examples = co->tmp[0].examples_applied;
    mt_log(MT_LOG_INFO, WHO,
           "checkpoint %" PRIu64 ": %u shards, %" PRIu64 " examples, %zu offsets in %.2f s", want,
           co->n, co->tmp[0].examples_applied, noffsets, mt_mono_s() - t0);
    return MT_OK;
}

mt_err_t mt_coord_check(mt_coord_t *co, char *errbuf, size_t errlen) {
    mt_psc_shard_ckpt_free(co->tmp, co->n);
    mt_err_t err = mt_psc_checkpoints(co->psc, co->cfg.call_deadline_ms, co->tmp);
    if (err) {
        first_failure(co, "Checkpoints", err, errbuf, errlen);
        return err;
    }
    if ((err = check_fence(co, errbuf, errlen)) != MT_OK) return err;
    for (uint32_t s = 0; s < co->n; s++) {
        if (co->tmp[s].incarnation != co->incarnation[s]) {
            mt_msgf(errbuf, errlen, "shard %u is in another incarnation (it restarted)", s);
            return MT_MISMATCH;
        }
    }
    return MT_OK;
}
