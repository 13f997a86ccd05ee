/*
 * movielens.c - MovieLens ratings as impressions: every rating is an impression of (user,
 * movie) at the rating's time; a rating >= positive_rating is also a click.
 *
 * The ratings are read whole with the data module's MovieLens reader (data/readers.h: its
 * slots, its side files, its bad-line handling) into one batch and replayed in the order of
 * an index sorted by (timestamp, file order): u.data is not in time order. Slots keep the
 * reader's numbers; user side: user (1), age (3), gender (4), occupation (5); item side:
 * movie (2), genres (6).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mt/readers.h"
#include "replay_int.h"

typedef struct ml_key {
    int64_t timestamp_ms;
    size_t i;
} ml_key_t;

typedef struct ml_state {
    mt_batch_t b;
    uint64_t *lines; /* [b.n]: the line of each example */
    ml_key_t *order; /* [b.n]: indexes sorted by (timestamp, file order) */
    size_t pos;
    int user_s, item_s; /* the batch's slot index of user and movie ids */
} ml_state_t;

typedef struct ml_read_ctx {
    mt_replay_t *r;
    uint64_t last_bad;
} ml_read_ctx_t;

static void ml_bad_line(void *opaque, uint64_t line, const char *reason) {
    ml_read_ctx_t *c = opaque;
    c->last_bad = line;
    mt__replay_bad_row(c->r, line, "%s", reason);
}

static int ml_cmp(const void *a, const void *b) {
    const ml_key_t *x = a, *y = b;
    if (x->timestamp_ms != y->timestamp_ms) return x->timestamp_ms < y->timestamp_ms ? -1 : 1;
    return x->i < y->i ? -1 : x->i > y->i;
}

static void ml_destroy(void *state) {
    ml_state_t *st = state;
    if (!st) return;
    mt_batch_free(&st->b);
    free(st->lines);
    free(st->order);
    free(st);
}

static bool is_user_slot(uint16_t s) {
    return s == MT_ML_SLOT_USER || s == MT_ML_SLOT_AGE || s == MT_ML_SLOT_GENDER ||
           s == MT_ML_SLOT_OCCUPATION;
}

static mt_err_t ml_next(mt_replay_t *r, void *state, mt__replay_imp_t *imp) {
    ml_state_t *st = state;
    if (st->pos >= st->b.n) return MT_NOT_FOUND;
    size_t i = st->order[st->pos++].i;
    const mt_batch_t *b = &st->b;
    size_t cnt;
    uint64_t user = mt_batch_fids(b, i, (uint32_t)st->user_s, &cnt)[0] & 0xFFFFFFFFFFFFull;
    uint64_t movie = mt_batch_fids(b, i, (uint32_t)st->item_s, &cnt)[0] & 0xFFFFFFFFFFFFull;
    imp->timestamp_ms = b->timestamps_ms[i];
    snprintf(imp->request_id, sizeof(imp->request_id), "ml-%llu-%llu", (unsigned long long)user,
             (unsigned long long)movie);
    imp->item_id = movie;
    imp->clicked = b->labels[i] > 0.5f;
    imp->line = st->lines[i];
    mt_err_t err = MT_OK;
    for (uint32_t s = 0; s < b->nslots && !err; s++) {
        const uint64_t *f = mt_batch_fids(b, i, s, &cnt);
        err =
            mt__replay_imp_add(imp, is_user_slot(b->slot_ids[s]), b->slot_ids[s], f, (uint32_t)cnt);
    }
    (void)r;
    return err;
}

static const mt__replay_source_t ml_source = {ml_next, ml_destroy};

static bool readable_file(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode) && access(p, R_OK) == 0;
}

mt_err_t mt__replay_movielens_open(mt_replay_t *r, void **state, const mt__replay_source_t **src,
                                   char *errbuf, size_t errlen) {
    bool latest = r->cfg.dataset == MT_REPLAY_MOVIELENS_LATEST;
    char ratings[4096], dir[4096], users[4200], items[4200];
    struct stat sb;
    if (stat(r->path, &sb) != 0) {
        if (errbuf && errlen) snprintf(errbuf, errlen, "cannot open %s", r->path);
        return MT_IO;
    }
    if (S_ISDIR(sb.st_mode)) {
        snprintf(dir, sizeof(dir), "%s", r->path);
        snprintf(ratings, sizeof(ratings), "%s/%s", r->path, latest ? "ratings.csv" : "u.data");
    } else {
        snprintf(ratings, sizeof(ratings), "%s", r->path);
        snprintf(dir, sizeof(dir), "%s", r->path);
        char *slash = strrchr(dir, '/');
        if (slash)
            *slash = '\0';
        else
            snprintf(dir, sizeof(dir), ".");
    }
    snprintf(users, sizeof(users), "%s/u.user", dir);
    snprintf(items, sizeof(items), "%s/%s", dir, latest ? "movies.csv" : "u.item");
    mt_movielens_config_t mc;
    mt_movielens_config_init(&mc);
    mc.format = latest ? MT_MOVIELENS_LATEST : MT_MOVIELENS_100K;
    mc.users_path = !latest && readable_file(users) ? users : NULL;
    mc.items_path = readable_file(items) ? items : NULL;
    mc.positive_rating = r->cfg.positive_rating;

    mt_err_t err;
    mt_reader_t *rd = NULL;
    ml_state_t *st = calloc(1, sizeof(*st));
    ml_read_ctx_t ctx = {r, 0};
    size_t cap_lines = 0;
    if (!st) return MT_NOMEM;
    if ((err = mt_reader_movielens_open(&mc, ratings, NULL, &rd))) {
        if (errbuf && errlen)
            snprintf(errbuf, errlen, "cannot read %s: %s", ratings, mt_strerror(err));
        goto out;
    }
    r->stats.side_bad_rows = mt_reader_stats(rd)->side_bad_lines;
    mt_reader_set_bad_line_cb(rd, ml_bad_line, &ctx);
    if ((err = mt_reader_batch_init(rd, &st->b))) goto out;
    /* one example per call, so that each gets its line number */
    for (;;) {
        err = mt_reader_next(rd, &st->b, 1);
        if (err == MT_NOT_FOUND) break;
        if (err) {
            if (errbuf && errlen)
                snprintf(errbuf, errlen, "reading %s: %s", ratings, mt_strerror(err));
            goto out;
        }
        if (st->b.n > cap_lines) {
            size_t c = cap_lines ? cap_lines * 2 : 4096;
            uint64_t *l = realloc(st->lines, c * sizeof(uint64_t));
            if (!l) {
                err = MT_NOMEM;
                goto out;
            }
            st->lines = l;
            cap_lines = c;
        }
        st->lines[st->b.n - 1] = mt_reader_stats(rd)->lines;
    }
    err = MT_OK;
    r->stats.rows = mt_reader_stats(rd)->examples + mt_reader_stats(rd)->bad_lines;
    r->stats.requests = st->b.n;
    st->user_s = st->item_s = -1;
    for (uint32_t s = 0; s < st->b.nslots; s++) {
        if (st->b.slot_ids[s] == MT_ML_SLOT_USER) st->user_s = (int)s;
        if (st->b.slot_ids[s] == MT_ML_SLOT_ITEM) st->item_s = (int)s;
    }
    if (st->user_s < 0 || st->item_s < 0) {
        err = MT_INTERNAL;
        goto out;
    }
    st->order = malloc((st->b.n ? st->b.n : 1) * sizeof(ml_key_t));
    if (!st->order) {
        err = MT_NOMEM;
        goto out;
    }
    for (size_t i = 0; i < st->b.n; i++) {
        st->order[i].timestamp_ms = st->b.timestamps_ms[i];
        st->order[i].i = i;
    }
    if (st->b.n) qsort(st->order, st->b.n, sizeof(ml_key_t), ml_cmp);
    *state = st;
    *src = &ml_source;
    st = NULL;
out:
    mt_reader_destroy(rd);
    ml_destroy(st);
    return err;
}
