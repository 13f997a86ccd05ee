/*
 * cover.c - the Kafka ranges of a trainer's steps (see mt/cover.h).
 *
 * Partitions are few (the ones a trainer owns): arrays searched linearly. Each partition's
 * cuts are kept sorted ascending; cuts[0] is the nearest one above next.
 */
#include "mt/cover.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mt/grow.h"

typedef struct part {
    const char *topic;
    int32_t partition;
    int64_t next, log_start;
    int64_t *cuts; /* ascending, all > next */
    size_t ncuts, cap_cuts;
    int in_step; /* index + 1 of its range in the step, 0: none */
} part_t;

struct mt_cover {
    part_t *parts;
    size_t nparts, cap_parts;
    mt_psc_range_t *step; /* the step's ranges */
    size_t nstep, cap_step;
    size_t cuts_left; /* over all partitions: a catch-up while not 0 */
};

mt_err_t mt_cover_create(mt_cover_t **out) {
    *out = calloc(1, sizeof(**out));
    return *out ? MT_OK : MT_NOMEM;
}

static void parts_clear(mt_cover_t *c) {
    for (size_t i = 0; i < c->nparts; i++)
        free(c->parts[i].cuts);
    c->nparts = 0;
    c->nstep = 0;
    c->cuts_left = 0;
}

void mt_cover_destroy(mt_cover_t *c) {
    if (!c) return;
    parts_clear(c);
    free(c->parts);
    free(c->step);
    free(c);
}

static part_t *find(mt_cover_t *c, const char *topic, int32_t partition) {
    for (size_t i = 0; i < c->nparts; i++)
        if (c->parts[i].partition == partition && !strcmp(c->parts[i].topic, topic))
            return &c->parts[i];
    return NULL;
}

/* The mark of (topic, partition) in @p l, or -1. */
static int64_t mark_in(const mt_cover_marks_t *l, const char *topic, int32_t partition) {
    for (size_t k = 0; k < l->n; k++)
        if (l->v[k].partition == partition && !strcmp(l->v[k].topic, topic)) return l->v[k].offset;
    return -1;
}

/* Inserts @p v into p's sorted cuts (once). */
static mt_err_t add_cut(part_t *p, int64_t v) {
    size_t i = 0;
    while (i < p->ncuts && p->cuts[i] < v)
        i++;
    if (i < p->ncuts && p->cuts[i] == v) return MT_OK;
    if (mt_grow((void **)&p->cuts, &p->cap_cuts, p->ncuts + 1, sizeof(int64_t), 4)) return MT_NOMEM;
    memmove(&p->cuts[i + 1], &p->cuts[i], (p->ncuts - i) * sizeof(int64_t));
    p->cuts[i] = v;
    p->ncuts++;
    return MT_OK;
}

mt_err_t mt_cover_reset(mt_cover_t *c, const mt_cover_pos_t *owned, size_t nowned,
                        const mt_cover_marks_t *lists, size_t nlists, mt_cover_pos_t *starts,
                        char *errbuf, size_t errlen) {
    parts_clear(c);
    if (mt_grow((void **)&c->parts, &c->cap_parts, nowned, sizeof(part_t), 8)) return MT_NOMEM;
    for (size_t i = 0; i < nowned; i++) {
        part_t *p = &c->parts[c->nparts++];
        *p = (part_t){
            .topic = owned[i].topic, .partition = owned[i].partition, .log_start = owned[i].offset};
        int64_t lo = -1;
        int missing = 0;
        for (size_t l = 0; l < nlists; l++) {
            int64_t m = mark_in(&lists[l], p->topic, p->partition);
            if (m < 0) {
                missing = 1;
                continue;
            }
            if (m < p->log_start) {
                mt_msgf(errbuf, errlen,
                        "%s [%d]: a shard's mark is %" PRId64 " but Kafka holds the partition "
                        "from %" PRId64 " on: retention dropped examples that shard never applied",
                        p->topic, (int)p->partition, m, p->log_start);
                parts_clear(c);
                return MT_LIMIT;
            }
            if (lo < 0 || m < lo) lo = m;
        }
        p->next = missing || lo < 0 ? p->log_start : lo;
        for (size_t l = 0; l < nlists; l++) {
            int64_t m = mark_in(&lists[l], p->topic, p->partition);
            if (m > p->next && add_cut(p, m) != MT_OK) {
                parts_clear(c);
                return MT_NOMEM;
            }
        }
        c->cuts_left += p->ncuts;
        starts[i] = (mt_cover_pos_t){p->topic, p->partition, p->next};
    }
    return MT_OK;
}

/* The step's range of @p p, added if it has none. NULL: out of memory. */
static mt_psc_range_t *range_of(mt_cover_t *c, part_t *p) {
    if (p->in_step) return &c->step[p->in_step - 1];
    if (mt_grow((void **)&c->step, &c->cap_step, c->nstep + 1, sizeof(mt_psc_range_t), 8))
        return NULL;
    mt_psc_range_t *r = &c->step[c->nstep++];
    *r = (mt_psc_range_t){p->topic, p->partition, p->next, p->next, p->next == p->log_start};
    p->in_step = (int)c->nstep;
    return r;
}

int mt_cover_add(mt_cover_t *c, const char *topic, int32_t partition, int64_t offset) {
    part_t *p = find(c, topic, partition);
    if (!p || offset < p->next) return MT_COVER_NOT_OWNED;
    const mt_psc_range_t *cur = p->in_step ? &c->step[p->in_step - 1] : NULL;
    if (cur && offset < cur->hi) return MT_COVER_NOT_OWNED; /* delivered twice */
    /* the next offset or nothing: a message past it means the consumer skipped some (a
     * seek that librdkafka reverted, an offset reset), and a range over them would mark
     * examples applied that were never trained */
    if (offset != (cur ? cur->hi : p->next)) return MT_COVER_GAP;
    /* a catch-up step holds one partition */
    if (c->cuts_left && c->nstep && !p->in_step) return MT_COVER_CLOSE;
    if (p->ncuts && offset >= p->cuts[0]) return MT_COVER_CLOSE; /* ranges end at a cut */
    mt_psc_range_t *r = range_of(c, p);
    if (!r) return MT_COVER_CLOSE;
    r->hi = offset + 1;
    return MT_COVER_ADDED;
}

size_t mt_cover_ranges(const mt_cover_t *c, const mt_psc_range_t **ranges) {
    *ranges = c->step;
    return c->nstep;
}

void mt_cover_commit(mt_cover_t *c) {
    for (size_t i = 0; i < c->nstep; i++) {
        part_t *p = find(c, c->step[i].topic, c->step[i].partition);
        if (!p) continue;
        p->next = c->step[i].hi;
        size_t drop = 0;
        while (drop < p->ncuts && p->cuts[drop] <= p->next)
            drop++;
        if (drop) memmove(p->cuts, p->cuts + drop, (p->ncuts - drop) * sizeof(int64_t));
        p->ncuts -= drop;
        c->cuts_left -= drop;
        p->in_step = 0;
    }
    c->nstep = 0;
}

void mt_cover_abort(mt_cover_t *c) {
    for (size_t i = 0; i < c->nparts; i++)
        c->parts[i].in_step = 0;
    c->nstep = 0;
}

int mt_cover_behind(const mt_cover_t *c, const mt_cover_marks_t *lists, size_t nlists) {
    for (size_t i = 0; i < c->nparts; i++) {
        const part_t *p = &c->parts[i];
        for (size_t l = 0; l < nlists; l++) {
            int64_t m = mark_in(&lists[l], p->topic, p->partition);
            if (m < 0 ? p->next > p->log_start : m < p->next) return 1;
        }
    }
    return 0;
}

int mt_cover_catching_up(const mt_cover_t *c) {
    return c->cuts_left != 0;
}
