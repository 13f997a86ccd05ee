/*
 * marks.c - a shard's marks and the exactly-once rule (see marks_int.h).
 *
 * Each table is an array sorted by (topic, partition), searched by bisection; a partition
 * is inserted once, at its first range (a shard sees as many partitions as the topics have:
 * tens to thousands), with next -1 until a range of it is applied. An entry's busy flag is
 * the reservation of a call in flight. A table and a list are the same array type, so a
 * restore swaps a list in without allocating.
 */
#include "marks_int.h" /* _GNU_SOURCE comes from the build: pthread_rwlockattr_setkind_np */

#include <assert.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mt/grow.h"

typedef mt__ps_mark_t entry_t; /* next -1: inserted by a begin, no range applied yet */
typedef mt__ps_mark_list_t table_t;

struct mt__ps_marks {
    pthread_mutex_t lock;
    pthread_cond_t idle; /* broadcast when a reservation ends */
    pthread_rwlock_t gate;
    table_t t[2];
};

static int cmp_key(const char *topic, int32_t partition, const entry_t *e) {
    int c = strcmp(topic, e->topic);
    if (c) return c;
    return partition < e->partition ? -1 : partition > e->partition;
}

/* The index of (topic, partition) in @p t, or -1 with *at the place to insert it. */
static ptrdiff_t find(const table_t *t, const char *topic, int32_t partition, size_t *at) {
    size_t lo = 0, hi = t->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = cmp_key(topic, partition, &t->v[mid]);
        if (c == 0) return (ptrdiff_t)mid;
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    if (at) *at = lo;
    return -1;
}

/* The entry of (topic, partition), inserted (next -1) if absent. NULL: out of memory or
 * MT__PS_MAX_MARKS entries already. */
static entry_t *get(table_t *t, const char *topic, int32_t partition) {
    size_t at = 0;
    ptrdiff_t i = find(t, topic, partition, &at);
    if (i >= 0) return &t->v[i];
    if (t->n >= MT__PS_MAX_MARKS) return NULL;
    char *name = strdup(topic);
    if (!name || mt_grow((void **)&t->v, &t->cap, t->n + 1, sizeof(entry_t), 16)) {
        free(name);
        return NULL;
    }
    memmove(&t->v[at + 1], &t->v[at], (t->n - at) * sizeof(entry_t));
    t->v[at] = (entry_t){.topic = name, .partition = partition, .next = -1};
    t->n++;
    return &t->v[at];
}

static void table_free(table_t *t) {
    for (size_t i = 0; i < t->n; i++)
        free(t->v[i].topic);
    free(t->v);
    memset(t, 0, sizeof(*t));
}

mt_err_t mt__ps_marks_create(mt__ps_marks_t **out) {
    mt__ps_marks_t *m = calloc(1, sizeof(*m));
    if (!m) return MT_NOMEM;
    pthread_rwlockattr_t a;
    pthread_rwlockattr_init(&a);
    /* a snapshot waiting for the gate stops new applies from taking it */
    pthread_rwlockattr_setkind_np(&a, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    int bad = pthread_rwlock_init(&m->gate, &a);
    pthread_rwlockattr_destroy(&a);
    if (bad) {
        free(m);
        return MT_NOMEM;
    }
    pthread_mutex_init(&m->lock, NULL);
    pthread_cond_init(&m->idle, NULL);
    *out = m;
    return MT_OK;
}

void mt__ps_marks_destroy(mt__ps_marks_t *m) {
    if (!m) return;
    table_free(&m->t[0]);
    table_free(&m->t[1]);
    pthread_cond_destroy(&m->idle);
    pthread_mutex_destroy(&m->lock);
    pthread_rwlock_destroy(&m->gate);
    free(m);
}

/* A Kafka topic name: 1 to MT__PS_MAX_TOPIC of [a-zA-Z0-9._-] (safe in metrics labels). */
static int topic_ok(const char *t) {
    size_t n = t ? strlen(t) : 0;
    if (n == 0 || n > MT__PS_MAX_TOPIC) return 0;
    for (size_t i = 0; i < n; i++) {
        char ch = t[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '.' || ch == '_' || ch == '-'))
            return 0;
    }
    return 1;
}

mt_err_t mt__ps_marks_check(const mt__ps_range_t *r, size_t n, char *why, size_t len) {
    if (n == 0 || n > MT__PS_MAX_RANGES) {
        mt_msgf(why, len, "a cover holds 1 to %d ranges, not %zu", MT__PS_MAX_RANGES, n);
        return MT_INVALID;
    }
    for (size_t i = 0; i < n; i++) {
        if (!topic_ok(r[i].topic)) {
            mt_msgf(why, len,
                    "cover[%zu]: not a Kafka topic name (1 to %d of a-z A-Z 0-9 . _ -), %zu bytes",
                    i, MT__PS_MAX_TOPIC, r[i].topic ? strlen(r[i].topic) : 0);
            return MT_INVALID;
        }
        if (r[i].partition < 0 || r[i].lo < 0 || r[i].lo >= r[i].hi) {
            mt_msgf(why, len,
                    "cover[%zu]: %s/%" PRId32 " [%" PRId64 ", %" PRId64
                    "): a partition >= 0 and 0 <= lo < hi are needed",
                    i, r[i].topic, r[i].partition, r[i].lo, r[i].hi);
            return MT_INVALID;
        }
        for (size_t k = 0; k < i; k++) { /* covers are short: quadratic is fine */
            if (r[k].partition == r[i].partition && !strcmp(r[k].topic, r[i].topic)) {
                mt_msgf(why, len, "cover: partition %s/%" PRId32 " twice", r[i].topic,
                        r[i].partition);
                return MT_INVALID;
            }
        }
    }
    return MT_OK;
}

mt_err_t mt__ps_marks_begin(mt__ps_marks_t *m, mt__ps_marks_kind_t kind, const mt__ps_range_t *r,
                            size_t n, int *skip, char *why, size_t len) {
    table_t *t = &m->t[kind];
    *skip = 0;
    pthread_mutex_lock(&m->lock);
    for (;;) { /* every partition in the table (inserted as unknown), none reserved */
        int busy = 0;
        for (size_t i = 0; i < n && !busy; i++) {
            entry_t *e = get(t, r[i].topic, r[i].partition);
            if (!e) {
                int full = t->n >= MT__PS_MAX_MARKS;
                pthread_mutex_unlock(&m->lock);
                if (full)
                    mt_msgf(why, len, "the shard keeps marks of %d partitions at most",
                            MT__PS_MAX_MARKS);
                else
                    mt_msgf(why, len, "out of memory");
                return full ? MT_LIMIT : MT_NOMEM;
            }
            busy = e->busy;
        }
        if (!busy) break;
        pthread_cond_wait(&m->idle, &m->lock);
    }
    size_t applied = 0, next = 0;
    ptrdiff_t bad = -1;
    int64_t bad_mark = 0;
    for (size_t i = 0; i < n; i++) {
        const entry_t *e = &t->v[find(t, r[i].topic, r[i].partition, NULL)];
        if (e->next < 0 ? r[i].lo == 0 || r[i].first : r[i].lo == e->next) {
            next++;
        } else if (e->next >= 0 && r[i].hi <= e->next) {
            applied++;
        } else if (bad < 0) {
            bad = (ptrdiff_t)i;
            bad_mark = e->next;
        }
    }
    mt_err_t err = MT_OK;
    if (next == n) {
        for (size_t i = 0; i < n; i++)
            t->v[find(t, r[i].topic, r[i].partition, NULL)].busy = 1;
    } else if (applied == n) {
        *skip = 1;
    } else {
        err = MT_OUT_OF_ORDER;
        if (bad >= 0) {
            const mt__ps_range_t *b = &r[bad];
            if (bad_mark < 0)
                mt_msgf(why, len,
                        "out of order: the shard has no mark of partition %s/%" PRId32
                        " (it lost its state?), the step holds %" PRId64 "-%" PRId64
                        " and is not marked first",
                        b->topic, b->partition, b->lo, b->hi);
            else
                mt_msgf(why, len,
                        "out of order: partition %s/%" PRId32 " is at %" PRId64
                        ", the step holds %" PRId64 "-%" PRId64 " (%s)",
                        b->topic, b->partition, bad_mark, b->lo, b->hi,
                        b->lo > bad_mark ? "a gap" : "an overlap");
        } else {
            mt_msgf(why, len,
                    "out of order: the step is applied on %zu of its %zu partitions, next on %zu",
                    applied, n, next);
        }
    }
    pthread_mutex_unlock(&m->lock);
    return err;
}

void mt__ps_marks_end(mt__ps_marks_t *m, mt__ps_marks_kind_t kind, const mt__ps_range_t *r,
                      size_t n, int done) {
    table_t *t = &m->t[kind];
    pthread_mutex_lock(&m->lock);
    for (size_t i = 0; i < n; i++) {
        ptrdiff_t k = find(t, r[i].topic, r[i].partition, NULL);
        assert(k >= 0 && t->v[k].busy); /* reserved by begin: never removed meanwhile */
        entry_t *e = &t->v[k];
        e->busy = 0;
        if (done) e->next = r[i].hi;
    }
    pthread_cond_broadcast(&m->idle);
    pthread_mutex_unlock(&m->lock);
}

void mt__ps_marks_of(mt__ps_marks_t *m, mt__ps_marks_kind_t kind, const mt__ps_range_t *r, size_t n,
                     int64_t *out) {
    table_t *t = &m->t[kind];
    pthread_mutex_lock(&m->lock);
    for (size_t i = 0; i < n; i++) {
        ptrdiff_t k = find(t, r[i].topic, r[i].partition, NULL);
        out[i] = k >= 0 ? t->v[k].next : -1;
    }
    pthread_mutex_unlock(&m->lock);
}

mt_err_t mt__ps_marks_copy(mt__ps_marks_t *m, mt__ps_marks_kind_t kind, mt__ps_mark_list_t *out) {
    table_t *t = &m->t[kind];
    memset(out, 0, sizeof(*out));
    pthread_mutex_lock(&m->lock);
    size_t known = 0;
    for (size_t i = 0; i < t->n; i++)
        known += t->v[i].next >= 0;
    mt_err_t err = MT_OK;
    if (known) {
        out->v = calloc(known, sizeof(*out->v));
        if (!out->v) err = MT_NOMEM;
        out->cap = out->v ? known : 0;
    }
    for (size_t i = 0; i < t->n && !err; i++) {
        if (t->v[i].next < 0) continue;
        mt__ps_mark_t *o = &out->v[out->n];
        if (!(o->topic = strdup(t->v[i].topic))) {
            err = MT_NOMEM;
            break;
        }
        o->partition = t->v[i].partition;
        o->next = t->v[i].next;
        out->n++;
    }
    pthread_mutex_unlock(&m->lock);
    if (err) mt__ps_mark_list_free(out);
    return err;
}

void mt__ps_marks_replace(mt__ps_marks_t *m, mt__ps_marks_kind_t kind, mt__ps_mark_list_t *list) {
    for (size_t i = 0; i < list->n; i++)
        list->v[i].busy = 0;
    pthread_mutex_lock(&m->lock);
    table_t old = m->t[kind];
    for (size_t i = 0; i < old.n; i++)
        assert(!old.v[i].busy); /* the gate is exclusive or the shard quiesced */
    m->t[kind] = *list;
    pthread_mutex_unlock(&m->lock);
    memset(list, 0, sizeof(*list));
    table_free(&old);
}

mt_err_t mt__ps_mark_list_build(const char *const *topics, const int32_t *partitions,
                                const int64_t *next, size_t n, mt__ps_mark_list_t *out) {
    memset(out, 0, sizeof(*out));
    for (size_t i = 0; i < n; i++) {
        if (!topic_ok(topics[i]) || partitions[i] < 0 || next[i] < 0 ||
            find(out, topics[i], partitions[i], NULL) >= 0) {
            table_free(out);
            return MT_CORRUPT;
        }
        entry_t *e = get(out, topics[i], partitions[i]);
        if (!e) {
            table_free(out);
            return MT_NOMEM;
        }
        e->next = next[i];
    }
    return MT_OK;
}

void mt__ps_mark_list_free(mt__ps_mark_list_t *l) {
    if (l) table_free(l);
}

void mt__ps_marks_gate_shared(mt__ps_marks_t *m) {
    pthread_rwlock_rdlock(&m->gate);
}

void mt__ps_marks_gate_exclusive(mt__ps_marks_t *m) {
    pthread_rwlock_wrlock(&m->gate);
}

void mt__ps_marks_gate_release(mt__ps_marks_t *m) {
    pthread_rwlock_unlock(&m->gate);
}
