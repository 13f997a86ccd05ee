/*
 * changes.c - enumerating what changed since a version, for replicas (serving sync).
 *
 * The iterator visits the parts in order. For each part it copies, under the part's lock,
 * either every row (full stream) or the live change-log entries with a version above
 * `since` (incremental stream), into its own buffer, and hands them out from there. So the
 * memory it holds is bounded by one part's rows, and each part's entries are consistent
 * and in version order.
 *
 * Why `upto` is safe to resume from: begin() raises the global clock to upto, above every
 * version handed out before; a writer that
 * changes part P after the iterator copied P does so under P's lock, after the copy, so it
 * reads a clock >= upto and its version is > upto (mt__part_version takes max(part, global)
 * + 1). Changes made before the copy of P are in the copy.
 */
#include <stdlib.h>
#include <string.h>

#include "table_int.h"

struct mt_table_changes {
    mt_table_t *t;
    uint64_t since;
    int full;
    uint32_t next_part;
    mt_table_change_t *ents; /* entries of the current part */
    float *vals;             /* their values, packed */
    size_t n, pos, ecap;
    size_t vlen, vpos, vcap;
};

static mt_err_t grow_buf(mt_table_changes_t *it, size_t ents, size_t vals) {
    if (ents > it->ecap) {
        size_t c = it->ecap ? it->ecap : 256;
        while (c < ents)
            c *= 2;
        mt_table_change_t *e = realloc(it->ents, c * sizeof(*e));
        if (!e) return MT_NOMEM;
        it->ents = e;
        it->ecap = c;
    }
    if (vals > it->vcap) {
        size_t c = it->vcap ? it->vcap : 4096;
        while (c < vals)
            c *= 2;
        float *v = realloc(it->vals, c * sizeof(*v));
        if (!v) return MT_NOMEM;
        it->vals = v;
        it->vcap = c;
    }
    return MT_OK;
}

static mt_err_t push(mt_table_changes_t *it, uint64_t fid, uint64_t version, const void *row) {
    const mt__slot_t *s = mt__slot_of(it->t, fid);
    uint32_t dim = row ? s->cfg.dim : 0;
    mt_err_t err = grow_buf(it, it->n + 1, it->vlen + dim);
    if (err) return err;
    mt_table_change_t *c = &it->ents[it->n++];
    c->fid = fid;
    c->version = version;
    c->dim = dim;
    c->deleted = row == NULL;
    if (row) {
        mt__row_read_emb(s, row, it->vals + it->vlen);
        it->vlen += dim;
    }
    return MT_OK;
}

/* First log position in p whose version is > since (entries are in version order). */
static uint64_t log_search(const mt_table_t *t, const mt__part_t *p, uint64_t since) {
    uint64_t lo = p->log_start, hi = p->log_end;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (p->log[mid & (t->log_cap - 1)].version <= since)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static mt_err_t load_part(mt_table_changes_t *it, mt__part_t *p) {
    mt_table_t *t = it->t;
    mt_err_t err = MT_OK;
    it->n = it->pos = it->vlen = it->vpos = 0;
    mt__part_lock(p);
    if (it->full) {
        const mt__barray_t *a = atomic_load_explicit(&p->arr, memory_order_relaxed);
        for (uint64_t b = 0; b <= a->mask && !err; b++)
            for (int i = 0; i < MT__BUCKET_SLOTS && !err; i++)
                if (a->b[b].row[i])
                    err = push(it, a->b[b].key[i],
                               mt__row_hdr(mt__slot_of(t, a->b[b].key[i]), a->b[b].row[i])->version,
                               a->b[b].row[i]);
    } else if (it->since < p->log_floor) {
        err = MT_FULL_SYNC;
    } else {
        for (uint64_t i = log_search(t, p, it->since); i < p->log_end && !err; i++) {
            const mt__logent_t *e = &p->log[i & (t->log_cap - 1)];
            /* A row entry whose row changed since is superseded by a later entry. */
            if (!e->row)
                err = push(it, e->fid, e->version, NULL);
            else if (mt__row_hdr(mt__slot_of(t, e->fid), e->row)->version == e->version)
                err = push(it, e->fid, e->version, e->row);
        }
    }
    mt__part_unlock(p);
    return err;
}

mt_err_t mt_table_changes_begin(mt_table_t *t, uint64_t since, mt_table_changes_t **out,
                                uint64_t *upto, int *full) {
    mt_table_changes_t *it = calloc(1, sizeof(*it));
    if (!it) return MT_NOMEM;
    it->t = t;
    it->since = since;
    it->full = since == 0 || t->log_cap == 0; /* tracking off: always a full stream */
    /* upto = 1 + the highest version handed out so far, published as the global clock, so
     * that every later change in any part gets a higher one (see the top of this file). */
    uint64_t m = 0;
    for (uint32_t i = 0; i < t->nparts; i++) {
        mt__part_t *p = &t->parts[i];
        mt__part_lock(p);
        if (since < p->log_floor) it->full = 1;
        if (p->clock > m) m = p->clock;
        mt__part_unlock(p);
    }
    uint64_t g = atomic_load(&t->clock), up;
    do {
        up = (g > m ? g : m) + 1;
    } while (!atomic_compare_exchange_weak(&t->clock, &g, up));
    *upto = up;
    *full = it->full;
    *out = it;
    return MT_OK;
}

mt_err_t mt_table_changes_next(mt_table_changes_t *it, mt_table_change_t *out, size_t cap,
                               float *values, size_t values_cap, size_t *n_out) {
    size_t k = 0, voff = 0;
    *n_out = 0;
    while (k < cap) {
        while (it->pos == it->n) {
            if (it->next_part == it->t->nparts) goto done;
            mt_err_t err = load_part(it, &it->t->parts[it->next_part++]);
            if (err) return err;
        }
        const mt_table_change_t *c = &it->ents[it->pos];
        if (voff + c->dim > values_cap) {
            if (k == 0) return MT_TOO_SMALL;
            break;
        }
        if (c->dim) memcpy(values + voff, it->vals + it->vpos, c->dim * sizeof(float));
        voff += c->dim;
        it->vpos += c->dim;
        out[k++] = *c;
        it->pos++;
    }
done:
    *n_out = k;
    return MT_OK;
}

uint64_t mt_table_changes_cursor(mt_table_t *t) {
    uint64_t m = 0;
    for (uint32_t i = 0; i < t->nparts; i++) {
        mt__part_t *p = &t->parts[i];
        mt__part_lock(p);
        if (p->clock > m) m = p->clock;
        mt__part_unlock(p);
    }
    uint64_t g = atomic_load(&t->clock), up;
    do { /* as mt_table_changes_begin(): published, so later changes go above it */
        up = (g > m ? g : m) + 1;
    } while (!atomic_compare_exchange_weak(&t->clock, &g, up));
    return up;
}

void mt_table_changes_end(mt_table_changes_t *it) {
    if (!it) return;
    free(it->ents);
    free(it->vals);
    free(it);
}
