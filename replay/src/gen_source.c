/*
 * gen_source.c - the synthetic generator (data/gen.h) as impressions: example n is the
 * impression "gen-<seed>-<n>" (the request ids of `monolith gen --kafka`), a positive label
 * is a click. The stream is in time order already: nothing is sorted, memory stays one
 * chunk of examples (plus the core's heap of actions within one delay).
 * User side: user (1), segment (3), hour (5); item side: item (2), category (4), tags (6).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "replay_int.h"

#define GEN_CHUNK 1024

typedef struct gen_state {
    mt_gen_t *g;
    mt_batch_t b;
    size_t pos;     /* next example of b */
    uint64_t index; /* stream index of b's first example */
    uint64_t seed;
} gen_state_t;

static bool is_user_slot(uint16_t s) {
    return s == MT_GEN_SLOT_USER || s == MT_GEN_SLOT_USER_SEGMENT || s == MT_GEN_SLOT_HOUR;
}

static mt_err_t gen_next(mt_replay_t *r, void *state, mt__replay_imp_t *imp) {
    gen_state_t *st = state;
    if (st->pos >= st->b.n) {
        st->index += st->b.n;
        mt_err_t err = mt_gen_next(st->g, &st->b, GEN_CHUNK, NULL);
        if (err) return err;
        st->pos = 0;
        if (st->b.n == 0) return MT_NOT_FOUND;
    }
    size_t i = st->pos++;
    const mt_batch_t *b = &st->b;
    imp->timestamp_ms = b->timestamps_ms[i];
    snprintf(imp->request_id, sizeof(imp->request_id), "gen-%llu-%llu",
             (unsigned long long)st->seed, (unsigned long long)(st->index + i));
    imp->clicked = b->labels[i] > 0.5f;
    mt_err_t err = MT_OK;
    for (uint32_t s = 0; s < b->nslots && !err; s++) {
        size_t cnt;
        const uint64_t *f = mt_batch_fids(b, i, s, &cnt);
        if (b->slot_ids[s] == MT_GEN_SLOT_ITEM && cnt) imp->item_id = f[0] & 0xFFFFFFFFFFFFull;
        err =
            mt__replay_imp_add(imp, is_user_slot(b->slot_ids[s]), b->slot_ids[s], f, (uint32_t)cnt);
    }
    r->stats.rows++;
    r->stats.requests++;
    return err;
}

static void gen_destroy(void *state) {
    gen_state_t *st = state;
    if (!st) return;
    mt_batch_free(&st->b);
    mt_gen_destroy(st->g);
    free(st);
}

static const mt__replay_source_t gen_source = {gen_next, gen_destroy};

mt_err_t mt__replay_gen_open(mt_replay_t *r, void **state, const mt__replay_source_t **src,
                             char *errbuf, size_t errlen) {
    gen_state_t *st = calloc(1, sizeof(*st));
    if (!st) return MT_NOMEM;
    mt_err_t err = mt_gen_create(&r->cfg.gen, &st->g);
    if (err) {
        if (errbuf && errlen) snprintf(errbuf, errlen, "generator: %s", mt_strerror(err));
        free(st);
        return err;
    }
    st->seed = r->cfg.gen.seed;
    *state = st;
    *src = &gen_source;
    return MT_OK;
}
