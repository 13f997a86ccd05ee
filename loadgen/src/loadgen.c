/*
 * loadgen.c - the users of the closed loop (mt/loadgen.h): asks serving replicas to rank
 * pages of candidates drawn from the synthetic ground truth (data/gen.h), draws the users'
 * clicks from the hidden model's true probabilities, sends them to Kafka `actions`, and
 * measures serving AUC over time.
 *
 * The protocol, per request i (sent at start + i / rate, at most --inflight at once):
 *  1. time: the wall clock w (Unix ms) and the generator's clock
 *     t = start_time + time_scale * (w - w_start): births, fading and drift of the hidden
 *     model run time_scale times faster than the wall clock, so that a few minutes of loop
 *     see the ageing of hours;
 *  2. the page: a user and K distinct candidate items alive at t, by popularity
 *     (mt_gen_draw_request), with their fids (user side: user, segment, hour of t; item side:
 *     item, category, tags);
 *  3. Predict "lg-<nonce>-<i>" (timestamp w) to the first serving target, the primary: it
 *     scores the page and logs every candidate as an Impression to `features` (key request
 *     id), as serving does for whatever it serves;
 *  4. the user sees the whole page (K items; serving logs all K, so the joiner's negatives
 *     are exactly the items seen and not clicked) and clicks each item independently with its
 *     TRUE probability at t; each click becomes an Action (request id, item id, CLICK,
 *     timestamp w + click delay) produced to `actions` once the delay has passed on the wall
 *     clock. A request the primary failed shows nothing and draws no click;
 *     with --conversions R, each click also converts with the probability of a second
 *     hidden model (the generator's form under another seed, calibrated to a mean of R):
 *     an Action of type CONVERSION, --conversion-delay-ms after the click (for a joiner
 *     with joiner.task_actions = click, conversion);
 *     with --sequence L the user also sends its L recent clicks (slot 7, the generator's
 *     mt_gen_user_sequence()), and the truth counts them (for a din model);
 *  5. the same request goes, in parallel, to the other targets (shadow replicas of other
 *     sync intervals, started with logging off): they score the same pages against the same
 *     clicks, so their AUCs are paired (the noise of the traffic cancels in differences).
 *
 * Measures: per target and window of --window-s seconds (by send time), the AUC of the
 * served scores against the clicks (exact, Mann-Whitney), log loss and mean score; the same
 * for the true probabilities ("truth": the best any model can do on these clicks). Targets
 * given as @PORTFILE join when the file appears and Health says SERVING; a window counts for
 * a target only if the target answered all of it. Latency (p50/p99) and errors of the
 * primary, QPS, clicks delivered (clicks_delivered: every action, conversions too).
 * Outputs: a progress line on stderr, --series TSV (one row
 * per window and target, for gnuplot), --latency-series TSV (the primary's latency
 * percentiles of each --latency-interval-s alone, for drift over a long run: bench/soak.sh),
 * and a final JSON report on stdout (and --report).
 *
 * Threads: --inflight workers (each sends one request at a time, synchronously), one click
 * producer (a FIFO of clicks and one of conversions, each by due time: every action of a
 * FIFO has the same delay), and main (targets, windows, progress). `mu` guards the windows
 * and the statistics; `click_mu` the FIFOs. Lock order: mu, then click_mu (never held
 * together in practice). All of a run's state is its mt_loadgen_t, one per run.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "monolith/v1/example.pb-c.h"
#include "monolith/v1/serving.pb-c.h"
#include "mt/clock.h"
#include "mt/kafka.h"
#include "mt/loadgen.h"
#include "mt/log.h"

/* ---------------- types ---------------- */

#define MAX_TARGETS MT_LOADGEN_MAX_TARGETS
#define PREDICT     "/monolith.v1.Serving/Predict"
#define LAT_RING    (1u << 20)
#define TRUTH       MAX_TARGETS /* series index of the true probabilities */

typedef mt_loadgen_scored_t scored_t;

/* The pairs of one window and series (a target or the truth). */
typedef struct series {
    scored_t *v;
    size_t n, cap;
    uint64_t errors;
} series_t;

typedef struct window {
    int64_t index; /* -1: unused */
    series_t s[MAX_TARGETS + 1];
} window_t;

typedef struct target {
    char name[32];
    char addr[256];      /* host:port, empty until known */
    char port_file[256]; /* @FILE: where the port (or host:port) appears */
    mt_rpc_channel_t *ch;
    _Atomic int active;       /* answering: requests go to it */
    _Atomic int64_t since_ms; /* wall ms when it became active */
    _Atomic uint64_t ok, errors;
    /* windows after it joined (mu): its AUCs summed for the paired mean */
    double auc_sum_paired;
    uint32_t windows;
    double auc_sum;
} target_t;

typedef struct click {
    struct click *next;
    int64_t due_ms;
    int64_t ts_ms;
    uint64_t item;
    int type; /* MONOLITH__V1__ACTION_TYPE__ACTION_CLICK or _CONVERSION */
    char request_id[48];
} click_t;

typedef struct fifo {
    click_t *head, *tail;
} fifo_t;

/* ---------------- a run's state ---------------- */

struct mt_loadgen {
    mt_loadgen_opts_t o;
    volatile sig_atomic_t *ext_stop; /* the caller's: a signal handler's flag */
    _Atomic int stop_flag;           /* ours: a worker's failure */
    mt_gen_t *gen;
    mt_gen_t *conv_gen; /* --conversions: the conversions' hidden model; NULL: none */
    target_t targets[MAX_TARGETS];
    uint32_t ntargets;
    mt_kafka_producer_t *producer;
    char nonce[16];
    int64_t wall_start_ms;
    _Atomic uint64_t next_req, sent, late_sends, clicks_made, conversions_made, impressions;

    pthread_mutex_t mu;
    window_t windows[8]; /* open windows, by index % 8 (mu) */
    float *lat_ms;       /* primary latencies, a ring of LAT_RING (mu) */
    uint64_t nlat;       /* (mu) */
    FILE *series_f;
    FILE *latency_f; /* --latency-series: main thread only */
    double truth_auc_sum;
    uint32_t truth_windows, paired_windows;
    int64_t next_close;  /* next window index to close (main only) */
    char last_line[512]; /* last window's AUCs for the progress line (mu) */

    pthread_mutex_t click_mu;
    pthread_cond_t click_cv;
    fifo_t fifos[2]; /* clicks, conversions (click_mu) */
    int clicks_done; /* no more clicks will come (click_mu) */
    _Atomic uint64_t clicks_produced, click_errors;
};

static int stopped(mt_loadgen_t *L) {
    return atomic_load(&L->stop_flag) || (L->ext_stop && *L->ext_stop);
}

/* ---------------- helpers ---------------- */

static int64_t wall_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_s(mt_loadgen_t *L, double s) {
    if (s <= 0) return;
    struct timespec ts = {(time_t)s, (long)((s - floor(s)) * 1e9)};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR && !stopped(L)) {
    }
}

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double unit(uint64_t x) {
    return (double)(mix64(x) >> 11) * (1.0 / 9007199254740992.0);
}

static int cmp_scored(const void *a, const void *b) {
    float x = ((const scored_t *)a)->score, y = ((const scored_t *)b)->score;
    return x < y ? -1 : x > y;
}

/* Exact AUC (ties get their average rank); NAN without both classes. Sorts v. */
double mt_loadgen_auc(mt_loadgen_scored_t *v, size_t n, double *logloss, double *mean,
                      double *ctr) {
    double pos = 0, rank_sum = 0, ll = 0, sum = 0;
    for (size_t i = 0; i < n; i++) {
        double p = v[i].score < 1e-7f ? 1e-7 : v[i].score > 1 - 1e-7f ? 1 - 1e-7 : v[i].score;
        ll -= v[i].label > 0.5f ? log(p) : log(1 - p);
        sum += v[i].score;
    }
    if (n) qsort(v, n, sizeof(*v), cmp_scored); /* v may be NULL when n is 0 */
    for (size_t i = 0; i < n;) {
        size_t j = i;
        double npos = 0;
        while (j < n && v[j].score == v[i].score)
            npos += v[j++].label;
        rank_sum += npos * (0.5 * (double)(i + 1 + j));
        pos += npos;
        i = j;
    }
    double neg = (double)n - pos;
    *logloss = n ? ll / (double)n : NAN;
    *mean = n ? sum / (double)n : NAN;
    *ctr = n ? pos / (double)n : NAN;
    if (pos == 0 || neg == 0) return NAN;
    return (rank_sum - pos * (pos + 1) / 2) / (pos * neg);
}

/* A JSON number with 4 decimals, or null for NaN (JSON has no NaN). buf: 16 bytes. */
static const char *jnum(char *buf, double v) {
    if (isnan(v))
        snprintf(buf, 16, "null");
    else
        snprintf(buf, 16, "%.4f", v);
    return buf;
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* ---------------- targets ---------------- */

/* Activates targets that became reachable (main thread). */
static void poll_targets(mt_loadgen_t *L) {
    for (uint32_t i = 0; i < L->ntargets; i++) {
        target_t *t = &L->targets[i];
        if (atomic_load(&t->active)) continue;
        if (!t->addr[0] && t->port_file[0]) {
            FILE *f = fopen(t->port_file, "r");
            char buf[128] = "";
            if (f) {
                if (!fgets(buf, sizeof(buf), f)) buf[0] = 0;
                fclose(f);
            }
            buf[strcspn(buf, "\r\n")] = 0;
            if (!buf[0]) continue;
            if (strchr(buf, ':'))
                snprintf(t->addr, sizeof(t->addr), "%s", buf);
            else
                snprintf(t->addr, sizeof(t->addr), "127.0.0.1:%s", buf);
        }
        if (!t->ch) {
            mt_rpc_client_config_t cc;
            mt_rpc_client_config_init(&cc);
            cc.retries = 0;
            cc.tls = L->o.tls;
            if (mt_rpc_channel_create(t->addr, &cc, &t->ch) != MT_OK) continue;
        }
        if (mt_rpc_serving(t->ch, 1000)) {
            atomic_store(&t->since_ms, wall_ms());
            atomic_store(&t->active, 1);
            mt_log(MT_LOG_INFO, "loadgen", "target %s (%s) is serving", t->name, t->addr);
        }
    }
}

/* ---------------- windows ---------------- */

static window_t *window_for(mt_loadgen_t *L, int64_t w) {
    window_t *win = &L->windows[w % 8];
    if (win->index != w) {
        if (win->index >= 0) return NULL; /* an old window still open: too far behind */
        win->index = w;
    }
    return win;
}

static void series_add(series_t *s, float score, float label) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 4096;
        scored_t *v = realloc(s->v, cap * sizeof(*v));
        if (!v) return;
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = (scored_t){score, label};
}

/* Closes window w (main thread): AUC per series, a TSV row each, the paired sums. */
static void close_window(mt_loadgen_t *L, int64_t w) {
    pthread_mutex_lock(&L->mu);
    window_t *win = &L->windows[w % 8];
    double t_s = (double)(w + 1) * L->o.window_s;
    int64_t w_begin_ms = L->wall_start_ms + (int64_t)((double)w * L->o.window_s * 1000);
    int all_active = 1;
    char line[512];
    int off = snprintf(line, sizeof(line), "t=%.0fs", t_s);
    double auc[MAX_TARGETS + 1];
    for (uint32_t i = 0; i <= MAX_TARGETS; i++) {
        if (i < MAX_TARGETS && i >= L->ntargets) continue;
        series_t *s = &win->s[i];
        int full = 1;
        if (i < L->ntargets) {
            target_t *t = &L->targets[i];
            full = atomic_load(&t->active) && atomic_load(&t->since_ms) <= w_begin_ms &&
                   s->errors == 0;
            if (!full) all_active = 0;
        }
        double ll, mean, ctr;
        auc[i] = win->index == w ? mt_loadgen_auc(s->v, s->n, &ll, &mean, &ctr) : NAN;
        if (win->index != w) ll = mean = ctr = NAN;
        const char *name = i == TRUTH ? "truth" : L->targets[i].name;
        if (L->series_f && s->n > 0 && full)
            fprintf(L->series_f, "%.1f\t%s\t%.5f\t%.5f\t%zu\t%.5f\t%.5f\n", t_s, name, auc[i], ll,
                    s->n, mean, ctr);
        if (full && !isnan(auc[i]) && off < (int)sizeof(line))
            off += snprintf(line + off, sizeof(line) - (size_t)off, "  %s %.3f", name, auc[i]);
        if (full && !isnan(auc[i])) {
            if (i == TRUTH) {
                L->truth_auc_sum += auc[i];
                L->truth_windows++;
            } else {
                L->targets[i].auc_sum += auc[i];
                L->targets[i].windows++;
            }
        }
        s->n = 0;
        s->errors = 0;
    }
    if (all_active && L->ntargets > 0) {
        int ok = 1;
        for (uint32_t i = 0; i < L->ntargets; i++)
            ok = ok && !isnan(auc[i]);
        if (ok) {
            for (uint32_t i = 0; i < L->ntargets; i++)
                L->targets[i].auc_sum_paired += auc[i];
            L->paired_windows++;
        }
    }
    win->index = -1;
    snprintf(L->last_line, sizeof(L->last_line), "%s", line);
    if (L->series_f) fflush(L->series_f);
    pthread_mutex_unlock(&L->mu);
}

/* ---------------- clicks ---------------- */

static void click_push(mt_loadgen_t *L, click_t *c) {
    fifo_t *q = &L->fifos[c->type == MONOLITH__V1__ACTION_TYPE__ACTION_CONVERSION];
    pthread_mutex_lock(&L->click_mu);
    c->next = NULL;
    if (q->tail)
        q->tail->next = c;
    else
        q->head = c;
    q->tail = c;
    pthread_cond_signal(&L->click_cv);
    pthread_mutex_unlock(&L->click_mu);
}

/* Produces each action once its delay has passed (each FIFO is in about due order: the
 * earlier of the two heads goes first). */
static void *click_thread(void *arg) {
    mt_loadgen_t *L = arg;
    for (;;) {
        pthread_mutex_lock(&L->click_mu);
        while (!L->fifos[0].head && !L->fifos[1].head && !L->clicks_done)
            pthread_cond_wait(&L->click_cv, &L->click_mu);
        fifo_t *q = !L->fifos[1].head || (L->fifos[0].head &&
                                          L->fifos[0].head->due_ms <= L->fifos[1].head->due_ms)
                        ? &L->fifos[0]
                        : &L->fifos[1];
        click_t *c = q->head;
        if (!c) { /* done and empty */
            pthread_mutex_unlock(&L->click_mu);
            break;
        }
        int64_t wait_ms = c->due_ms - wall_ms();
        if (wait_ms > 0) {
            pthread_mutex_unlock(&L->click_mu);
            sleep_s(L, (double)(wait_ms < 50 ? wait_ms : 50) / 1000.0);
            continue;
        }
        q->head = c->next;
        if (!q->head) q->tail = NULL;
        pthread_mutex_unlock(&L->click_mu);
        if (L->producer) {
            Monolith__V1__Action a = MONOLITH__V1__ACTION__INIT;
            a.request_id = c->request_id;
            a.timestamp_ms = c->ts_ms;
            a.type = (Monolith__V1__ActionType)c->type;
            a.item_id = c->item;
            uint8_t buf[128];
            size_t len = monolith__v1__action__pack(&a, buf);
            if (mt_kafka_produce(L->producer, L->o.actions_topic, -1, c->request_id,
                                 strlen(c->request_id), buf, len, 1000) == MT_OK)
                atomic_fetch_add(&L->clicks_produced, 1);
            else
                atomic_fetch_add(&L->click_errors, 1);
        }
        free(c);
    }
    return NULL;
}

/* ---------------- workers ---------------- */

typedef struct worker {
    mt_loadgen_t *L;
    pthread_t th;
    uint64_t *items;
    float *true_p;
    uint64_t *item_fids; /* K * MT_GEN_MAX_ITEM_FIDS */
    size_t *item_nfids;  /* K */
    uint8_t *buf;        /* encoded request */
    size_t buf_cap;
} worker_t;

/* Encodes request i into w->buf. Returns its length, 0 on failure. */
static size_t encode(mt_loadgen_t *L, worker_t *w, const char *rid, int64_t ts_ms, uint64_t user,
                     int64_t gen_ts) {
    uint64_t ufids[MT_GEN_USER_FIDS], seq[MT_GEN_MAX_SEQUENCE];
    mt_gen_user_fids(L->gen, user, gen_ts, ufids);
    Monolith__V1__SlotFids us[MT_GEN_USER_FIDS + 1];
    Monolith__V1__SlotFids *up[MT_GEN_USER_FIDS + 1];
    size_t nu = 0;
    for (int s = 0; s < MT_GEN_USER_FIDS; s++, nu++) {
        monolith__v1__slot_fids__init(&us[s]);
        us[s].slot = (uint32_t)(ufids[s] >> 48);
        us[s].n_fids = 1;
        us[s].fids = &ufids[s];
        up[s] = &us[s];
    }
    size_t nseq = mt_gen_user_sequence(L->gen, user, gen_ts, seq); /* --sequence: recent clicks */
    if (nseq) {
        monolith__v1__slot_fids__init(&us[nu]);
        us[nu].slot = MT_GEN_SLOT_SEQUENCE;
        us[nu].n_fids = nseq;
        us[nu].fids = seq;
        up[nu] = &us[nu];
        nu++;
    }
    size_t k = L->o.k;
    Monolith__V1__Candidate *cands = calloc(k, sizeof(*cands));
    Monolith__V1__Candidate **cp = calloc(k, sizeof(*cp));
    Monolith__V1__SlotFids *is = calloc(3 * k, sizeof(*is));
    Monolith__V1__SlotFids **ip = calloc(3 * k, sizeof(*ip));
    size_t len = 0;
    if (!cands || !cp || !is || !ip) goto out;
    for (size_t j = 0; j < k; j++) {
        uint64_t *f = w->item_fids + j * MT_GEN_MAX_ITEM_FIDS;
        size_t nf = w->item_nfids[j];
        monolith__v1__candidate__init(&cands[j]);
        cands[j].item_id = w->items[j];
        /* slots 2, 4 one fid each, then the tags (slot 6) */
        size_t ns = 0;
        for (size_t a = 0; a < nf;) {
            size_t b = a;
            while (b < nf && (f[b] >> 48) == (f[a] >> 48))
                b++;
            Monolith__V1__SlotFids *sf = &is[3 * j + ns];
            monolith__v1__slot_fids__init(sf);
            sf->slot = (uint32_t)(f[a] >> 48);
            sf->n_fids = b - a;
            sf->fids = f + a;
            ip[3 * j + ns] = sf;
            ns++;
            a = b;
        }
        cands[j].n_item = ns;
        cands[j].item = ip + 3 * j;
        cp[j] = &cands[j];
    }
    Monolith__V1__PredictRequest r = MONOLITH__V1__PREDICT_REQUEST__INIT;
    r.request_id = (char *)rid;
    r.timestamp_ms = ts_ms;
    r.n_user = nu;
    r.user = up;
    r.n_candidates = k;
    r.candidates = cp;
    len = monolith__v1__predict_request__get_packed_size(&r);
    if (len > w->buf_cap) {
        uint8_t *nb = realloc(w->buf, len);
        if (!nb) {
            len = 0;
            goto out;
        }
        w->buf = nb;
        w->buf_cap = len;
    }
    monolith__v1__predict_request__pack(&r, w->buf);
out:
    free(cands);
    free(cp);
    free(is);
    free(ip);
    return len;
}

/* Scores of a reply, or NULL (malformed or wrong count). Caller frees with free_unpacked. */
static Monolith__V1__PredictResponse *decode(const mt_loadgen_t *L, const uint8_t *resp,
                                             size_t rlen) {
    Monolith__V1__PredictResponse *r = monolith__v1__predict_response__unpack(NULL, rlen, resp);
    if (r && r->n_scores != L->o.k) {
        monolith__v1__predict_response__free_unpacked(r, NULL);
        return NULL;
    }
    return r;
}

static void *worker_main(void *arg) {
    worker_t *w = arg;
    mt_loadgen_t *L = w->L;
    double t0 = mt_mono_s();
    for (;;) {
        uint64_t i = atomic_fetch_add(&L->next_req, 1);
        double due = L->o.rate > 0 ? (double)i / L->o.rate : 0;
        if (stopped(L) || due >= L->o.duration_s || mt_mono_s() - t0 >= L->o.duration_s) break;
        double now = mt_mono_s() - t0;
        if (due > now)
            sleep_s(L, due - now);
        else if (L->o.rate > 0 && now - due > 0.1)
            atomic_fetch_add(&L->late_sends, 1);
        if (stopped(L)) break;

        int64_t w_ms = wall_ms();
        int64_t gen_ts =
            L->o.gen.start_time_ms + (int64_t)((double)(w_ms - L->wall_start_ms) * L->o.time_scale);
        uint64_t user;
        if (mt_gen_draw_request(L->gen, i, gen_ts, L->o.k, &user, w->items) != MT_OK) {
            mt_log(MT_LOG_ERROR, "loadgen", "generator: cannot draw request %" PRIu64, i);
            atomic_store(&L->stop_flag, 1);
            break;
        }
        for (size_t j = 0; j < L->o.k; j++) {
            double p = 0;
            mt_gen_true_p(L->gen, user, w->items[j], gen_ts, &p);
            w->true_p[j] = (float)p;
            w->item_nfids[j] =
                mt_gen_item_fids(L->gen, w->items[j], w->item_fids + j * MT_GEN_MAX_ITEM_FIDS);
        }
        char rid[48];
        snprintf(rid, sizeof(rid), "lg-%s-%" PRIu64, L->nonce, i);
        size_t len = encode(L, w, rid, w_ms, user, gen_ts);
        if (!len) continue;
        int64_t win_index = (int64_t)((double)(w_ms - L->wall_start_ms) / 1000.0 / L->o.window_s);

        /* primary, timed */
        target_t *prim = &L->targets[0];
        uint8_t *resp = NULL;
        size_t rlen = 0;
        mt_rpc_status_t st;
        double c0 = mt_mono_s();
        Monolith__V1__PredictResponse *pr = NULL;
        if (atomic_load(&prim->active) &&
            mt_rpc_call(prim->ch, PREDICT, w->buf, len, L->o.deadline_ms, &resp, &rlen, &st) ==
                MT_OK &&
            st.code == MT_RPC_OK)
            pr = decode(L, resp, rlen);
        double lat = (mt_mono_s() - c0) * 1000;
        free(resp);
        if (!atomic_load(&prim->active)) {
            sleep_s(L, 0.05); /* not serving yet: this request is not sent */
            continue;
        }
        atomic_fetch_add(&L->sent, 1);

        /* shadows, in parallel */
        mt_rpc_batch_call_t calls[MAX_TARGETS];
        uint32_t idx[MAX_TARGETS], nc = 0;
        for (uint32_t t = 1; t < L->ntargets; t++) {
            if (!atomic_load(&L->targets[t].active)) continue;
            memset(&calls[nc], 0, sizeof(calls[nc]));
            calls[nc].ch = L->targets[t].ch;
            calls[nc].path = PREDICT;
            calls[nc].req = w->buf;
            calls[nc].len = len;
            idx[nc++] = t;
        }
        if (nc) mt_rpc_call_many(calls, nc, L->o.deadline_ms);

        /* the user's clicks: only on a page that was shown */
        float labels[MT_GEN_MAX_CANDIDATES > 4096 ? 4096 : MT_GEN_MAX_CANDIDATES];
        for (size_t j = 0; j < L->o.k; j++)
            labels[j] = unit(mix64(L->o.gen.seed ^ 0x636C69636Bull) ^
                             (i * 0x9E3779B97F4A7C15ull + j)) < w->true_p[j]
                            ? 1.0f
                            : 0.0f;
        if (pr) {
            atomic_fetch_add(&prim->ok, 1);
            atomic_fetch_add(&L->impressions, L->o.k);
            for (size_t j = 0; j < L->o.k; j++) {
                if (labels[j] < 0.5f) continue;
                click_t *c = calloc(1, sizeof(*c));
                if (!c) continue;
                c->ts_ms = w_ms + L->o.click_delay_ms;
                c->due_ms = c->ts_ms;
                c->item = w->items[j];
                c->type = MONOLITH__V1__ACTION_TYPE__ACTION_CLICK;
                snprintf(c->request_id, sizeof(c->request_id), "%s", rid);
                /* the conversion of a click: the second hidden model's probability */
                double q = 0;
                click_t *v = NULL;
                if (L->conv_gen &&
                    mt_gen_true_p(L->conv_gen, user, w->items[j], gen_ts, &q) == MT_OK &&
                    unit(mix64(L->o.gen.seed ^ 0x636F6E76ull) ^ (i * 0x9E3779B97F4A7C15ull + j)) <
                        q &&
                    (v = malloc(sizeof(*v)))) {
                    *v = *c;
                    v->type = MONOLITH__V1__ACTION_TYPE__ACTION_CONVERSION;
                    v->ts_ms = c->ts_ms + L->o.conversion_delay_ms;
                    v->due_ms = v->ts_ms;
                }
                atomic_fetch_add(&L->clicks_made, 1);
                click_push(L, c);
                if (v) {
                    atomic_fetch_add(&L->conversions_made, 1);
                    click_push(L, v);
                }
            }
        } else {
            atomic_fetch_add(&prim->errors, 1);
        }

        pthread_mutex_lock(&L->mu);
        if (pr) L->lat_ms[L->nlat++ % LAT_RING] = (float)lat;
        window_t *win = window_for(L, win_index);
        if (win) {
            if (pr) {
                for (size_t j = 0; j < L->o.k; j++) {
                    series_add(&win->s[0], pr->scores[j], labels[j]);
                    series_add(&win->s[TRUTH], w->true_p[j], labels[j]);
                }
            } else {
                win->s[0].errors++;
            }
        }
        for (uint32_t c = 0; c < nc; c++) {
            target_t *t = &L->targets[idx[c]];
            Monolith__V1__PredictResponse *sr =
                calls[c].st.code == MT_RPC_OK ? decode(L, calls[c].resp, calls[c].resp_len) : NULL;
            if (sr) {
                atomic_fetch_add(&t->ok, 1);
                if (win && pr)
                    for (size_t j = 0; j < L->o.k; j++)
                        series_add(&win->s[idx[c]], sr->scores[j], labels[j]);
                monolith__v1__predict_response__free_unpacked(sr, NULL);
            } else {
                atomic_fetch_add(&t->errors, 1);
                if (win) win->s[idx[c]].errors++;
            }
            free(calls[c].resp);
        }
        pthread_mutex_unlock(&L->mu);
        if (pr) monolith__v1__predict_response__free_unpacked(pr, NULL);
    }
    return NULL;
}

/* ---------------- the command line ---------------- */

static int usage(void) {
    fprintf(stderr,
            "usage: monolith-loadgen --serving [NAME=]ADDR|@PORTFILE [--serving ...]...\n"
            "  [--kafka BOOTSTRAP] [--actions-topic actions] [--rate REQ_PER_S (200)]\n"
            "  [--duration-s S (60)] [--candidates K (10)] [--inflight N (4)]\n"
            "  [--window-s W (10)] [--click-delay-ms D (1000)] [--deadline-ms D (2000)]\n"
            "  [--conversions R (0: none)]: each click converts (an Action of type\n"
            "   CONVERSION) with the probability of a second hidden model of mean about R\n"
            "  [--conversion-delay-ms D (1000)]: a conversion's time after its click's\n"
            "  [--time-scale X (10): generator seconds per wall second]\n"
            "  [--seed S (1)] [--users U (5000)] [--items I (2000)] [--items-born-per-s B (5)]\n"
            "  [--item-half-life-s H (300)] [--users-born-per-s B (0.5)]\n"
            "  [--drift-period-s P (3600)] [--ctr P (0.05)]\n"
            "  [--user-zipf E (0.95)] [--item-zipf E (1.05)]: popularity exponents\n"
            "  [--tags N (1000)]: the tag vocabulary (each item has 1-3 tags)\n"
            "  [--sequence L (0)]: each request's user sends its L recent clicks (slot 7)\n"
            "  [--series FILE.tsv] [--report FILE.json] [--progress-s S (5; 0: none)]\n"
            "  [--tls-ca FILE [--tls-cert FILE --tls-key FILE] [--tls-server-name NAME]]:\n"
            "   TLS to the serving targets, as their [tls] section (docs/security.md)\n"
            "  [--latency-series FILE.tsv] [--latency-interval-s S (60)]: the primary's\n"
            "   latency percentiles of each interval alone (the progress line's are since\n"
            "   the start), one row per full interval\n"
            "The first --serving target is the primary (its pages are shown and logged); the\n"
            "others are scored on the same pages and clicks. @PORTFILE: the target joins when\n"
            "the file holds its port (or host:port) and it answers Health SERVING.\n");
    return 2;
}

static int parse_double(const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || end == s || !(v >= lo && v <= hi)) return -1;
    *out = v;
    return 0;
}

static int add_target(mt_loadgen_opts_t *o, const char *spec) {
    if (o->ntargets == MT_LOADGEN_MAX_TARGETS) return -1;
    mt_loadgen_target_spec_t *t = &o->targets[o->ntargets];
    const char *eq = strchr(spec, '=');
    const char *where = spec;
    if (eq) {
        snprintf(t->name, sizeof(t->name), "%.*s", (int)(eq - spec), spec);
        where = eq + 1;
    } else {
        snprintf(t->name, sizeof(t->name), o->ntargets ? "serving%u" : "serving", o->ntargets);
    }
    if (!*where || !t->name[0]) return -1;
    if (where[0] == '@')
        snprintf(t->port_file, sizeof(t->port_file), "%s", where + 1);
    else
        snprintf(t->addr, sizeof(t->addr), "%s", where);
    o->ntargets++;
    return 0;
}

int mt_loadgen_parse_args(mt_loadgen_opts_t *o, int argc, char **argv) {
    memset(o, 0, sizeof(*o));
    o->actions_topic = "actions";
    o->rate = 200;
    o->duration_s = 60;
    o->window_s = 10;
    o->time_scale = 10;
    o->progress_s = 5;
    o->latency_interval_s = 60;
    o->k = 10;
    o->inflight = 4;
    o->deadline_ms = 2000;
    o->click_delay_ms = 1000;
    o->conversion_delay_ms = 1000;
    mt_gen_config_init(&o->gen);
    o->gen.seed = 1;
    o->gen.num_users = 5000;
    o->gen.num_items = 2000;
    o->gen.users_born_per_s = 0.5;
    o->gen.items_born_per_s = 5;
    o->gen.item_half_life_s = 300;
    o->gen.drift_period_s = 3600;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return usage(), -1;
        if (i + 1 >= argc) return usage(), -1;
        const char *v = argv[++i];
        double d;
#define NUM(flag, lo, hi, dst)                                                    \
    else if (!strcmp(a, flag)) {                                                  \
        if (parse_double(v, lo, hi, &d)) {                                        \
            fprintf(stderr, "monolith-loadgen: bad value for %s: %s\n", flag, v); \
            return -1;                                                            \
        }                                                                         \
        dst;                                                                      \
    }
        if (!strcmp(a, "--serving")) {
            if (add_target(o, v)) return usage(), -1;
        } else if (!strcmp(a, "--kafka"))
            o->kafka = v;
        else if (!strcmp(a, "--actions-topic"))
            o->actions_topic = v;
        else if (!strcmp(a, "--series"))
            o->series_path = v;
        else if (!strcmp(a, "--report"))
            o->report_path = v;
        else if (!strcmp(a, "--tls-ca"))
            o->tls.ca_file = v;
        else if (!strcmp(a, "--tls-cert"))
            o->tls.cert_file = v;
        else if (!strcmp(a, "--tls-key"))
            o->tls.key_file = v;
        else if (!strcmp(a, "--tls-server-name"))
            o->tls.server_name = v;
        else if (!strcmp(a, "--latency-series"))
            o->latency_path = v;
        NUM("--rate", 0, 1e7, o->rate = d)
        NUM("--duration-s", 0.1, 1e7, o->duration_s = d)
        NUM("--candidates", 1, 4096, o->k = (uint32_t)d)
        NUM("--inflight", 1, 256, o->inflight = (uint32_t)d)
        NUM("--window-s", 0.5, 86400, o->window_s = d)
        NUM("--click-delay-ms", 0, 3600000, o->click_delay_ms = (int64_t)d)
        NUM("--conversions", 0, 0.999999, o->conversion_rate = d)
        NUM("--conversion-delay-ms", 0, 3600000, o->conversion_delay_ms = (int64_t)d)
        NUM("--deadline-ms", 1, 3600000, o->deadline_ms = (int64_t)d)
        NUM("--time-scale", 0, 1e6, o->time_scale = d)
        NUM("--progress-s", 0, 86400, o->progress_s = d)
        NUM("--latency-interval-s", 0.1, 86400, o->latency_interval_s = d)
        NUM("--seed", 0, 1e18, o->gen.seed = (uint64_t)d)
        NUM("--users", 1, 1e12, o->gen.num_users = (uint64_t)d)
        NUM("--items", 1, 1e12, o->gen.num_items = (uint64_t)d)
        NUM("--users-born-per-s", 0, 1e9, o->gen.users_born_per_s = d)
        NUM("--items-born-per-s", 0, 1e9, o->gen.items_born_per_s = d)
        NUM("--item-half-life-s", 0, 1e12, o->gen.item_half_life_s = d)
        NUM("--drift-period-s", 0, 1e12, o->gen.drift_period_s = d)
        NUM("--ctr", 1e-6, 0.999999, o->gen.target_ctr = d)
        NUM("--user-zipf", 1e-6, 10, o->gen.user_zipf_exponent = d)
        NUM("--item-zipf", 1e-6, 10, o->gen.item_zipf_exponent = d)
        NUM("--tags", 1, 4294967295.0, o->gen.num_tags = (uint32_t)d)
        NUM("--sequence", 0, MT_GEN_MAX_SEQUENCE, o->gen.sequence_length = (uint32_t)d)
        else {
            fprintf(stderr, "monolith-loadgen: unknown flag %s\n", a);
            return usage(), -1;
        }
#undef NUM
    }
    if (o->ntargets == 0) return usage(), -1;
    o->tls.enabled = o->tls.ca_file || o->tls.cert_file || o->tls.key_file || o->tls.server_name;
    if (o->tls.enabled) {
        char terr[512];
        if (!o->tls.ca_file) {
            fprintf(stderr, "monolith-loadgen: the --tls-* flags need --tls-ca\n");
            return -1;
        }
        if (mt_rpc_tls_check(&o->tls, 0, terr, sizeof(terr)) != MT_OK) {
            fprintf(stderr, "monolith-loadgen: %s\n", terr);
            return -1;
        }
    }
    if (o->gen.item_half_life_s > 0 && o->gen.items_born_per_s == 0) o->gen.item_half_life_s = 0;
    char err[256];
    if (mt_gen_config_validate(&o->gen, err, sizeof(err)) != MT_OK) {
        fprintf(stderr, "monolith-loadgen: generator: %s\n", err);
        return -1;
    }
    if (o->k > o->gen.num_items) {
        fprintf(stderr, "monolith-loadgen: --candidates above --items\n");
        return -1;
    }
    return 0;
}

/* ---------------- the run ---------------- */

static void percentiles(mt_loadgen_t *L, double *p50, double *p99) {
    pthread_mutex_lock(&L->mu);
    size_t n = L->nlat < LAT_RING ? L->nlat : LAT_RING;
    float *c = n ? malloc(n * sizeof(float)) : NULL;
    if (c) memcpy(c, L->lat_ms, n * sizeof(float));
    pthread_mutex_unlock(&L->mu);
    *p50 = *p99 = NAN;
    if (!c) return;
    qsort(c, n, sizeof(float), cmp_float);
    *p50 = c[(size_t)(0.5 * (double)(n - 1))];
    *p99 = c[(size_t)(0.99 * (double)(n - 1))];
    free(c);
}

/* One --latency-series row: percentiles of the primary's latencies recorded since the last
 * row (ring entries [*from, nlat); an interval of more than LAT_RING requests keeps its last
 * LAT_RING). t_s: the interval's end. Main thread. */
static void latency_row(mt_loadgen_t *L, double t_s, uint64_t *from) {
    pthread_mutex_lock(&L->mu);
    uint64_t to = L->nlat, lo = to - *from > LAT_RING ? to - LAT_RING : *from;
    size_t n = (size_t)(to - lo);
    float *c = n ? malloc(n * sizeof(float)) : NULL;
    if (c)
        for (size_t i = 0; i < n; i++)
            c[i] = L->lat_ms[(lo + i) % LAT_RING];
    pthread_mutex_unlock(&L->mu);
    *from = to;
    if (n && !c) return;
    double p50 = NAN, p90 = NAN, p99 = NAN, mx = NAN, sum = 0;
    if (n) {
        qsort(c, n, sizeof(float), cmp_float);
        p50 = c[(size_t)(0.5 * (double)(n - 1))];
        p90 = c[(size_t)(0.9 * (double)(n - 1))];
        p99 = c[(size_t)(0.99 * (double)(n - 1))];
        mx = c[n - 1];
        for (size_t i = 0; i < n; i++)
            sum += c[i];
    }
    free(c);
    fprintf(L->latency_f, "%.1f\t%zu\t%.4f\t%.4f\t%.4f\t%.4f\t%.4f\n", t_s, n,
            n ? sum / (double)n : NAN, p50, p90, p99, mx);
    fflush(L->latency_f);
}

int mt_loadgen_run(const mt_loadgen_opts_t *opts, volatile sig_atomic_t *stop) {
    int rc = 1;
    mt_loadgen_t *L = calloc(1, sizeof(*L));
    if (!L) return 1;
    L->o = *opts;
    L->ext_stop = stop;
    pthread_mutex_init(&L->mu, NULL);
    pthread_mutex_init(&L->click_mu, NULL);
    pthread_cond_init(&L->click_cv, NULL);
    L->ntargets = opts->ntargets;
    for (uint32_t i = 0; i < opts->ntargets; i++) {
        target_t *t = &L->targets[i];
        memcpy(t->name, opts->targets[i].name, sizeof(t->name));
        memcpy(t->addr, opts->targets[i].addr, sizeof(t->addr));
        memcpy(t->port_file, opts->targets[i].port_file, sizeof(t->port_file));
    }
    for (int i = 0; i < 8; i++)
        L->windows[i].index = -1;
    L->lat_ms = calloc(LAT_RING, sizeof(float));
    worker_t *ws = calloc(L->o.inflight, sizeof(*ws));
    pthread_t clicker;
    int clicker_started = 0;
    uint32_t nstarted = 0;
    if (!L->lat_ms || !ws) goto out;
    if (mt_gen_create(&L->o.gen, &L->gen) != MT_OK) goto out;
    if (L->o.conversion_rate > 0) { /* the same form, another seed: another hidden truth */
        mt_gen_config_t cc = L->o.gen;
        cc.seed = mix64(L->o.gen.seed ^ 0x636F6E7665727400ull); /* "convert" */
        cc.target_ctr = L->o.conversion_rate;
        if (mt_gen_create(&cc, &L->conv_gen) != MT_OK) goto out;
    }
    snprintf(L->nonce, sizeof(L->nonce), "%x%x", (unsigned)getpid() & 0xFFFF,
             (unsigned)(wall_ms() & 0xFFFFFF));
    if (L->o.series_path) {
        L->series_f = fopen(L->o.series_path, "w");
        if (!L->series_f) {
            mt_log(MT_LOG_ERROR, "loadgen", "cannot write %s: %s", L->o.series_path,
                   strerror(errno));
            goto out;
        }
        fprintf(L->series_f, "t_s\ttarget\tauc\tlogloss\tn\tmean_score\tctr\n");
    }
    if (L->o.latency_path) {
        L->latency_f = fopen(L->o.latency_path, "w");
        if (!L->latency_f) {
            mt_log(MT_LOG_ERROR, "loadgen", "cannot write %s: %s", L->o.latency_path,
                   strerror(errno));
            goto out;
        }
        fprintf(L->latency_f, "t_s\tn\tmean_ms\tp50_ms\tp90_ms\tp99_ms\tmax_ms\n");
    }
    if (L->o.kafka) {
        char err[256];
        const char *conf[] = {"linger.ms=5", NULL};
        if (mt_kafka_producer_create(L->o.kafka, conf, &L->producer, err, sizeof(err)) != MT_OK) {
            mt_log(MT_LOG_ERROR, "loadgen", "kafka: %s", err);
            goto out;
        }
    }
    /* the primary must answer before the clock starts */
    double t_wait = mt_mono_s();
    while (!atomic_load(&L->targets[0].active) && !stopped(L)) {
        poll_targets(L);
        if (atomic_load(&L->targets[0].active)) break;
        if (mt_mono_s() - t_wait > 120) {
            mt_log(MT_LOG_ERROR, "loadgen", "primary %s not serving after 120 s",
                   L->targets[0].name);
            goto out;
        }
        sleep_s(L, 0.2);
    }
    if (pthread_create(&clicker, NULL, click_thread, L) == 0) clicker_started = 1;
    L->wall_start_ms = wall_ms();
    double t0 = mt_mono_s(), next_progress = L->o.progress_s;
    for (uint32_t i = 0; i < L->o.inflight; i++) {
        ws[i].L = L;
        ws[i].items = calloc(L->o.k, sizeof(uint64_t));
        ws[i].true_p = calloc(L->o.k, sizeof(float));
        ws[i].item_fids = calloc((size_t)L->o.k * MT_GEN_MAX_ITEM_FIDS, sizeof(uint64_t));
        ws[i].item_nfids = calloc(L->o.k, sizeof(size_t));
        if (!ws[i].items || !ws[i].true_p || !ws[i].item_fids || !ws[i].item_nfids) break;
        if (pthread_create(&ws[i].th, NULL, worker_main, &ws[i]) != 0) break;
        nstarted++;
    }
    uint64_t last_sent = 0, lat_from = 0;
    double last_t = 0, next_latency = L->o.latency_interval_s;
    for (;;) {
        sleep_s(L, 0.1);
        double el = mt_mono_s() - t0;
        poll_targets(L);
        /* a window closes once every request sent in it has answered or timed out */
        while ((double)(L->next_close + 1) * L->o.window_s * 1000 + (double)L->o.deadline_ms +
                   300 <=
               (double)(wall_ms() - L->wall_start_ms)) {
            close_window(L, L->next_close);
            L->next_close++;
        }
        if (L->o.progress_s > 0 && el >= next_progress) {
            double p50, p99;
            percentiles(L, &p50, &p99);
            uint64_t s = atomic_load(&L->sent);
            pthread_mutex_lock(&L->mu);
            fprintf(stderr,
                    "loadgen %6.1fs  req %" PRIu64 "  %.0f req/s  p50 %.2f ms  p99 %.2f ms  "
                    "err %" PRIu64 "  clicks %" PRIu64 "  |  %s\n",
                    el, s, (double)(s - last_sent) / (el - last_t), p50, p99,
                    atomic_load(&L->targets[0].errors), atomic_load(&L->clicks_made), L->last_line);
            pthread_mutex_unlock(&L->mu);
            last_sent = s;
            last_t = el;
            next_progress += L->o.progress_s;
        }
        if (L->latency_f && el >= next_latency && next_latency <= L->o.duration_s + 1e-9) {
            latency_row(L, next_latency, &lat_from);
            next_latency += L->o.latency_interval_s;
        }
        if (el >= L->o.duration_s + 0.2 || stopped(L)) break;
    }
    for (uint32_t i = 0; i < nstarted; i++)
        pthread_join(ws[i].th, NULL);
    double seconds = mt_mono_s() - t0;
    /* the last windows: full ones only */
    while ((double)(L->next_close + 1) * L->o.window_s <= L->o.duration_s + 1e-9) {
        int64_t end_ms =
            L->wall_start_ms + (int64_t)((double)(L->next_close + 1) * L->o.window_s * 1000);
        if (wall_ms() < end_ms) break;
        close_window(L, L->next_close++);
    }
    pthread_mutex_lock(&L->click_mu);
    L->clicks_done = 1;
    pthread_cond_signal(&L->click_cv);
    pthread_mutex_unlock(&L->click_mu);
    if (clicker_started) pthread_join(clicker, NULL);
    clicker_started = 0;
    uint64_t delivered = 0, failed = 0;
    if (L->producer) {
        mt_kafka_producer_flush(L->producer, 30000);
        mt_kafka_producer_counts(L->producer, &delivered, &failed);
    }

    /* the report */
    double p50, p99;
    percentiles(L, &p50, &p99);
    char *rep = NULL;
    size_t replen = 0;
    FILE *m = open_memstream(&rep, &replen);
    if (!m) goto out;
    uint64_t s = atomic_load(&L->sent);
    char b1[32], b2[32], b3[32];
    uint64_t imp = atomic_load(&L->impressions), clk = atomic_load(&L->clicks_made),
             conv = atomic_load(&L->conversions_made);
    fprintf(m,
            "{\"seconds\": %.1f, \"requests\": %" PRIu64 ", \"qps\": %.1f, \"candidates\": %u, "
            "\"impressions\": %" PRIu64 ", \"clicks\": %" PRIu64 ", \"ctr\": %s, "
            "\"conversions\": %" PRIu64 ", "
            "\"clicks_delivered\": %" PRIu64 ", \"clicks_failed\": %" PRIu64
            ", \"late_sends\": %" PRIu64 ", \"latency_p50_ms\": %s, \"latency_p99_ms\": %s, "
            "\"window_s\": %.1f, \"paired_windows\": %u, \"truth_auc\": %s, \"targets\": {",
            seconds, s, (double)s / seconds, L->o.k, imp, clk,
            jnum(b1, imp ? (double)clk / (double)imp : NAN), conv, delivered, failed,
            atomic_load(&L->late_sends), jnum(b2, p50), jnum(b3, p99), L->o.window_s,
            L->paired_windows,
            jnum(b1 + 16, L->truth_windows ? L->truth_auc_sum / L->truth_windows : NAN));
    for (uint32_t i = 0; i < L->ntargets; i++) {
        target_t *t = &L->targets[i];
        fprintf(m,
                "%s\"%s\": {\"ok\": %" PRIu64 ", \"errors\": %" PRIu64
                ", \"windows\": %u, \"mean_auc\": %s, \"paired_auc\": %s}",
                i ? ", " : "", t->name, atomic_load(&t->ok), atomic_load(&t->errors), t->windows,
                jnum(b2, t->windows ? t->auc_sum / t->windows : NAN),
                jnum(b3, L->paired_windows ? t->auc_sum_paired / L->paired_windows : NAN));
    }
    fprintf(m, "}}\n");
    fclose(m);
    fputs(rep, stdout);
    if (L->o.report_path) {
        FILE *f = fopen(L->o.report_path, "w");
        if (f) {
            fputs(rep, f);
            fclose(f);
        }
    }
    free(rep);
    rc = s > 0 && atomic_load(&L->targets[0].ok) > 0 ? 0 : 1;
    if (failed > 0 || atomic_load(&L->click_errors) > 0) rc = 1;
out:
    atomic_store(&L->stop_flag, 1);
    if (clicker_started) {
        pthread_mutex_lock(&L->click_mu);
        L->clicks_done = 1;
        pthread_cond_signal(&L->click_cv);
        pthread_mutex_unlock(&L->click_mu);
        pthread_join(clicker, NULL);
    }
    for (int f = 0; f < 2; f++) {
        for (click_t *c = L->fifos[f].head; c;) {
            click_t *n = c->next;
            free(c);
            c = n;
        }
    }
    if (ws)
        for (uint32_t i = 0; i < L->o.inflight; i++) {
            free(ws[i].items);
            free(ws[i].true_p);
            free(ws[i].item_fids);
            free(ws[i].item_nfids);
            free(ws[i].buf);
        }
    free(ws);
    for (int i = 0; i < 8; i++)
        for (int j = 0; j <= MAX_TARGETS; j++)
            free(L->windows[i].s[j].v);
    for (uint32_t i = 0; i < L->ntargets; i++)
        mt_rpc_channel_destroy(L->targets[i].ch);
    mt_kafka_producer_destroy(L->producer);
    if (L->series_f) fclose(L->series_f);
    if (L->latency_f) fclose(L->latency_f);
    mt_gen_destroy(L->gen);
    mt_gen_destroy(L->conv_gen);
    free(L->lat_ms);
    pthread_cond_destroy(&L->click_cv);
    pthread_mutex_destroy(&L->click_mu);
    pthread_mutex_destroy(&L->mu);
    free(L);
    return rc;
}
