/*
 * replay.c - the replay core: configuration, the merge of a source's impressions with the
 * delayed actions, the protobuf encoding of events, and the paced run loop.
 *
 * Merge invariant: the source yields impressions in non-decreasing timestamp_ms; an action
 * is pushed when its impression is returned, with timestamp impression + delay >= it. The
 * next event is the heap's top when its time is strictly before the staged impression's,
 * else the staged impression: so the output is sorted by time, impressions before actions
 * at equal times, and an action always after its impression. The heap holds the actions of
 * at most one delay's worth of event time.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mt/clock.h"

#include "monolith/v1/example.pb-c.h"
#include "replay_int.h"

/* ---------------------------------------------------------------------------------------- */
/* Configuration                                                                            */
/* ---------------------------------------------------------------------------------------- */

void mt_replay_config_init(mt_replay_config_t *cfg) {
    memset(cfg, 0, sizeof(*cfg));
    cfg->dataset = MT_REPLAY_TRIVAGO;
    cfg->action_delay_ms = MT_REPLAY_ACTION_DELAY_MS_DEFAULT;
    cfg->positive_rating = 4.0f;
    mt_gen_config_init(&cfg->gen);
    cfg->csv.request_id = cfg->csv.item_id = (mt_csv_column_t){-1, NULL};
}

static bool csv_has(mt_csv_column_t c) {
    return c.name || c.index >= 0;
}

static mt_err_t config_error(char *errbuf, size_t errlen, const char *msg) {
    if (errbuf && errlen) snprintf(errbuf, errlen, "%s", msg);
    return MT_CONFIG;
}

mt_err_t mt_replay_config_validate(const mt_replay_config_t *cfg, char *errbuf, size_t errlen) {
    if (!cfg) return config_error(errbuf, errlen, "no configuration");
    switch (cfg->dataset) {
    case MT_REPLAY_TRIVAGO:
    case MT_REPLAY_MOVIELENS_100K:
    case MT_REPLAY_MOVIELENS_LATEST:
        if (!cfg->path || !*cfg->path)
            return config_error(errbuf, errlen, "this dataset needs a path");
        break;
    case MT_REPLAY_GEN: return mt_gen_config_validate(&cfg->gen, errbuf, errlen);
    case MT_REPLAY_CSV: {
        const mt_replay_csv_config_t *c = &cfg->csv;
        if (!cfg->path || !*cfg->path)
            return config_error(errbuf, errlen, "this dataset needs a path");
        if (!c->reader) return config_error(errbuf, errlen, "csv: no reader configuration");
        if (c->reader->time_unit == MT_CSV_TIME_NONE)
            return config_error(errbuf, errlen, "csv: no timestamp column (the event time)");
        if (c->reader->label_kind == MT_CSV_LABEL_NONE)
            return config_error(errbuf, errlen,
                                "csv: no label column (the action: a positive value is a click)");
        if (c->reader->ntext_columns)
            return config_error(errbuf, errlen,
                                "csv: the reader's text columns are the replay's (request_id, "
                                "item_id)");
        if (csv_has(c->request_id) && !csv_has(c->item_id))
            return config_error(errbuf, errlen,
                                "csv: a request id column needs an item id column (the rows of a "
                                "request differ by their item)");
        char msg[200];
        if (mt_csv_config_validate(c->reader, msg, sizeof(msg)) != MT_OK) {
            if (errbuf && errlen) snprintf(errbuf, errlen, "csv: %s", msg);
            return MT_CONFIG;
        }
        break;
    }
    default: return config_error(errbuf, errlen, "unknown dataset");
    }
    if (cfg->action_delay_ms < 0 || cfg->action_delay_ms > 86400000ll * 365)
        return config_error(errbuf, errlen, "action_delay_ms must be in [0, 1 year]");
    if (!(cfg->positive_rating > 0 && cfg->positive_rating <= 10))
        return config_error(errbuf, errlen, "positive_rating must be in (0, 10]");
    return MT_OK;
}

void mt_replay_run_config_init(mt_replay_run_config_t *rc) {
    memset(rc, 0, sizeof(*rc));
}

/* ---------------------------------------------------------------------------------------- */
/* Shared helpers of the sources                                                            */
/* ---------------------------------------------------------------------------------------- */

void mt__replay_bad_row(mt_replay_t *r, uint64_t line, const char *fmt, ...) {
    char reason[96];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, sizeof(reason), fmt, ap);
    va_end(ap);
    r->stats.bad_rows++;
    r->stats.last_bad_line = line;
    if (r->stats.nbad_kept < MT_REPLAY_BAD_KEPT) {
        mt_replay_bad_row_t *b = &r->stats.bad[r->stats.nbad_kept++];
        b->line = line;
        memcpy(b->reason, reason, sizeof(reason));
    }
    if (r->cfg.bad_row_cb) r->cfg.bad_row_cb(r->cfg.bad_row_opaque, line, reason);
}

mt_err_t mt__replay_imp_add(mt__replay_imp_t *imp, bool user_side, uint16_t slot,
                            const uint64_t *fids, uint32_t n) {
    if (n == 0) return MT_OK;
    uint32_t *ns = user_side ? &imp->nuser : &imp->nitem;
    if (*ns >= MT__REPLAY_MAX_SLOTS || n > MT__REPLAY_MAX_FIDS - imp->nfids) return MT_LIMIT;
    uint64_t *dst = imp->fids + imp->nfids;
    memcpy(dst, fids, n * sizeof(uint64_t));
    imp->nfids += n;
    mt_replay_slot_t *s = (user_side ? imp->user : imp->item) + (*ns)++;
    s->slot = slot;
    s->nfids = n;
    s->fids = dst;
    return MT_OK;
}

static void imp_reset(mt__replay_imp_t *imp) {
    imp->timestamp_ms = 0;
    imp->request_id[0] = '\0';
    imp->item_id = 0;
    imp->clicked = false;
    imp->line = 0;
    imp->nuser = imp->nitem = imp->nfids = 0;
}

/* ---------------------------------------------------------------------------------------- */
/* The action heap                                                                          */
/* ---------------------------------------------------------------------------------------- */

static bool act_less(const mt__replay_action_t *a, const mt__replay_action_t *b) {
    return a->timestamp_ms < b->timestamp_ms ||
           (a->timestamp_ms == b->timestamp_ms && a->seq < b->seq);
}

static mt_err_t heap_push(mt_replay_t *r, const mt__replay_action_t *a) {
    if (r->nheap == r->cap_heap) {
        size_t cap = r->cap_heap ? r->cap_heap * 2 : 256;
        mt__replay_action_t *h = realloc(r->heap, cap * sizeof(*h));
        if (!h) return MT_NOMEM;
        r->heap = h;
        r->cap_heap = cap;
    }
    size_t i = r->nheap++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!act_less(a, &r->heap[p])) break;
        r->heap[i] = r->heap[p];
        i = p;
    }
    r->heap[i] = *a;
    return MT_OK;
}

static void heap_pop(mt_replay_t *r, mt__replay_action_t *out) {
    *out = r->heap[0];
    mt__replay_action_t last = r->heap[--r->nheap];
    size_t i = 0, n = r->nheap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && act_less(&r->heap[c + 1], &r->heap[c])) c++;
        if (!act_less(&r->heap[c], &last)) break;
        r->heap[i] = r->heap[c];
        i = c;
    }
    if (n) r->heap[i] = last;
}

/* ---------------------------------------------------------------------------------------- */
/* API                                                                                      */
/* ---------------------------------------------------------------------------------------- */

mt_err_t mt_replay_open(const mt_replay_config_t *cfg, mt_replay_t **out, char *errbuf,
                        size_t errlen) {
    if (!cfg || !out) return MT_INVALID;
    if (errbuf && errlen) errbuf[0] = '\0';
    mt_err_t err = mt_replay_config_validate(cfg, errbuf, errlen);
    if (err) return err;
    mt_replay_t *r = calloc(1, sizeof(*r));
    if (!r) return MT_NOMEM;
    r->cfg = *cfg;
    if (cfg->path) {
        r->path = strdup(cfg->path);
        if (!r->path) {
            free(r);
            return MT_NOMEM;
        }
    }
    r->cfg.path = r->path;
    switch (cfg->dataset) {
    case MT_REPLAY_TRIVAGO:
        err = mt__replay_trivago_open(r, &r->state, &r->src, errbuf, errlen);
        break;
    case MT_REPLAY_MOVIELENS_100K:
    case MT_REPLAY_MOVIELENS_LATEST:
        err = mt__replay_movielens_open(r, &r->state, &r->src, errbuf, errlen);
        break;
    case MT_REPLAY_GEN: err = mt__replay_gen_open(r, &r->state, &r->src, errbuf, errlen); break;
    case MT_REPLAY_CSV: err = mt__replay_csv_open(r, &r->state, &r->src, errbuf, errlen); break;
    default: err = MT_CONFIG;
    }
    /* what the csv source read during the open: the caller's, gone after this call */
    r->cfg.csv.reader = NULL;
    r->cfg.csv.request_id = r->cfg.csv.item_id = (mt_csv_column_t){-1, NULL};
    if (err) {
        free(r->path);
        free(r);
        return err;
    }
    *out = r;
    return MT_OK;
}

void mt_replay_destroy(mt_replay_t *r) {
    if (!r) return;
    if (r->src) r->src->destroy(r->state);
    free(r->heap);
    free(r->path);
    free(r);
}

const mt_replay_stats_t *mt_replay_stats(const mt_replay_t *r) {
    return &r->stats;
}

mt_err_t mt_replay_next(mt_replay_t *r, mt_replay_event_t *ev) {
    if (!r || !ev) return MT_INVALID;
    if (!r->have_staged && !r->source_done) {
        if (r->cfg.limit && r->stats.impressions >= r->cfg.limit) {
            r->source_done = true;
        } else {
            imp_reset(&r->staged);
            mt_err_t err = r->src->next(r, r->state, &r->staged);
            if (err == MT_NOT_FOUND)
                r->source_done = true;
            else if (err)
                return err;
            else
                r->have_staged = true;
        }
    }
    memset(ev, 0, sizeof(*ev));
    ev->user = ev->item = r->no_slots;
    if (r->nheap && (!r->have_staged || r->heap[0].timestamp_ms < r->staged.timestamp_ms)) {
        heap_pop(r, &r->cur_action);
        r->stats.pending_actions = r->nheap;
        const mt__replay_action_t *a = &r->cur_action;
        ev->kind = MT_REPLAY_ACTION;
        ev->timestamp_ms = a->timestamp_ms;
        ev->request_id = a->request_id;
        ev->item_id = a->item_id;
        ev->action_type = MT_REPLAY_ACTION_CLICK;
        ev->line = a->line;
        r->stats.actions++;
        return MT_OK;
    }
    if (!r->have_staged) return MT_NOT_FOUND;
    const mt__replay_imp_t *s = &r->staged;
    if (s->clicked) {
        mt__replay_action_t a;
        a.timestamp_ms = s->timestamp_ms + r->cfg.action_delay_ms;
        a.seq = r->seq;
        a.item_id = s->item_id;
        a.line = s->line;
        memcpy(a.request_id, s->request_id, sizeof(a.request_id));
        mt_err_t err = heap_push(r, &a);
        if (err) return err; /* the impression stays staged: a retry is exact */
        r->stats.pending_actions = r->nheap;
        if (r->nheap > r->stats.max_pending_actions) r->stats.max_pending_actions = r->nheap;
    }
    r->seq++;
    r->have_staged = false;
    ev->kind = MT_REPLAY_IMPRESSION;
    ev->timestamp_ms = s->timestamp_ms;
    ev->request_id = s->request_id;
    ev->item_id = s->item_id;
    ev->clicked = s->clicked;
    ev->line = s->line;
    ev->user = s->user;
    ev->nuser = s->nuser;
    ev->item = s->item;
    ev->nitem = s->nitem;
    r->stats.impressions++;
    return MT_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Encoding                                                                                 */
/* ---------------------------------------------------------------------------------------- */

static mt_err_t ensure(uint8_t **buf, size_t *cap, size_t need) {
    if (*buf && *cap >= need) return MT_OK;
    size_t c = *cap ? *cap : 256;
    while (c < need)
        c *= 2;
    uint8_t *b = realloc(*buf, c);
    if (!b) return MT_NOMEM;
    *buf = b;
    *cap = c;
    return MT_OK;
}

mt_err_t mt_replay_encode(const mt_replay_event_t *ev, uint8_t **buf, size_t *cap, size_t *len) {
    if (!ev || !buf || !cap || !len || !ev->request_id) return MT_INVALID;
    if (ev->kind == MT_REPLAY_ACTION) {
        Monolith__V1__Action a = MONOLITH__V1__ACTION__INIT;
        a.request_id = (char *)ev->request_id;
        a.timestamp_ms = ev->timestamp_ms;
        a.type = (Monolith__V1__ActionType)ev->action_type;
        a.item_id = ev->item_id;
        size_t n = monolith__v1__action__get_packed_size(&a);
        mt_err_t err = ensure(buf, cap, n);
        if (err) return err;
        *len = monolith__v1__action__pack(&a, *buf);
        return MT_OK;
    }
    if (ev->kind != MT_REPLAY_IMPRESSION || ev->nuser > MT__REPLAY_MAX_SLOTS ||
        ev->nitem > MT__REPLAY_MAX_SLOTS)
        return MT_INVALID;
    Monolith__V1__SlotFids sf[2 * MT__REPLAY_MAX_SLOTS];
    Monolith__V1__SlotFids *up[MT__REPLAY_MAX_SLOTS], *ip[MT__REPLAY_MAX_SLOTS];
    for (uint32_t s = 0; s < ev->nuser + ev->nitem; s++) {
        const mt_replay_slot_t *src = s < ev->nuser ? &ev->user[s] : &ev->item[s - ev->nuser];
        monolith__v1__slot_fids__init(&sf[s]);
        sf[s].slot = src->slot;
        sf[s].n_fids = src->nfids;
        sf[s].fids = (uint64_t *)src->fids;
        if (s < ev->nuser)
            up[s] = &sf[s];
        else
            ip[s - ev->nuser] = &sf[s];
    }
    Monolith__V1__Impression m = MONOLITH__V1__IMPRESSION__INIT;
    m.request_id = (char *)ev->request_id;
    m.timestamp_ms = ev->timestamp_ms;
    m.n_user = ev->nuser;
    m.user = up;
    m.n_item = ev->nitem;
    m.item = ip;
    m.item_id = ev->item_id;
    size_t n = monolith__v1__impression__get_packed_size(&m);
    mt_err_t err = ensure(buf, cap, n);
    if (err) return err;
    *len = monolith__v1__impression__pack(&m, *buf);
    return MT_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* The paced run                                                                            */
/* ---------------------------------------------------------------------------------------- */

/* The default clock of mt_replay_run_config_t (a zeroed mt_replay_clock_t). */
static double system_now_s(void *opaque) {
    (void)opaque;
    return mt_mono_s();
}

static void system_sleep_s(void *opaque, double s) {
    (void)opaque;
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

mt_err_t mt_replay_run(mt_replay_t *r, const mt_replay_run_config_t *rc, mt_replay_sink_fn sink,
                       void *sink_opaque, mt_replay_totals_t *totals) {
    if (!r || !sink) return MT_INVALID;
    mt_replay_run_config_t defaults;
    if (!rc) {
        mt_replay_run_config_init(&defaults);
        rc = &defaults;
    }
    if (!rc->clock.now_s != !rc->clock.sleep_s) return MT_INVALID;
    double (*now_s)(void *) = rc->clock.now_s ? rc->clock.now_s : system_now_s;
    void (*sleep_s)(void *, double) = rc->clock.sleep_s ? rc->clock.sleep_s : system_sleep_s;
    void *clk = rc->clock.opaque;
    mt_replay_totals_t t;
    memset(&t, 0, sizeof(t));
    uint8_t *buf = NULL;
    size_t cap = 0, len = 0;
    double t0 = now_s(clk), interval_s = rc->progress_interval_ms / 1000.0;
    double next_progress = t0 + interval_s;
    bool first = true;
    mt_err_t err = MT_OK;
    for (;;) {
        if (rc->stop && *rc->stop) {
            err = MT_CANCELLED;
            break;
        }
        mt_replay_event_t ev;
        err = mt_replay_next(r, &ev);
        if (err == MT_NOT_FOUND) {
            err = MT_OK;
            break;
        }
        if (err) break;
        if (first) {
            t.first_event_ms = ev.timestamp_ms;
            first = false;
        }
        double now = now_s(clk);
        if (rc->speed > 0) {
            double due = t0 + (double)(ev.timestamp_ms - t.first_event_ms) / 1000.0 / rc->speed;
            while (now < due && !(rc->stop && *rc->stop)) {
                double wait = due - now;
                if (interval_s > 0 && next_progress - now < wait) wait = next_progress - now;
                if (wait > 0) sleep_s(clk, wait < 0.2 ? wait : 0.2);
                now = now_s(clk);
                if (rc->progress && interval_s > 0 && now >= next_progress) {
                    t.wall_s = now - t0;
                    rc->progress(rc->progress_opaque, &t);
                    next_progress = now + interval_s;
                }
            }
            if (rc->stop && *rc->stop) {
                err = MT_CANCELLED;
                break;
            }
        }
        err = mt_replay_encode(&ev, &buf, &cap, &len);
        if (err) break;
        err = sink(sink_opaque, &ev, buf, len);
        if (err) break;
        if (ev.kind == MT_REPLAY_IMPRESSION) {
            t.impressions++;
            t.impression_bytes += len;
        } else {
            t.actions++;
            t.action_bytes += len;
        }
        t.last_event_ms = ev.timestamp_ms;
        if (rc->progress && interval_s > 0 && now >= next_progress) {
            t.wall_s = now - t0;
            rc->progress(rc->progress_opaque, &t);
            next_progress = now + interval_s;
        }
    }
    t.wall_s = now_s(clk) - t0;
    if (totals) *totals = t;
    free(buf);
    return err;
}
