/*
 * dense.c - the dense store of a shard (dense_int.h): the dense tensors (weights and the
 * optimizer's state: the Adagrad accumulator or Adam's m and v, and Adam's step count),
 * created by the first PushDense that sends their init values, updated by later ones, read
 * by PullDense, and saved and restored as one DenseState (protobuf) in checkpoints.
 *
 * Invariants: every tensor's w, s1 and s2 hold n floats, n = the product of its shape (1 to
 * 8 dims, at most 256 Mi floats); names are unique; version changes only under the lock.
 * A PushDense checks everything before it changes anything.
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dense_int.h"
#include "mt/model.h"

/* One tensor. */
typedef struct mt__ps_tensor {
    char *name;
    uint32_t *shape;
    size_t nshape;
    size_t n;
    float *w, *s1, *s2; /* weights, Adagrad accumulator or Adam m, Adam v */
    uint64_t steps;
} dense_tensor_t;

/* Parsed dense parameters, not yet installed (mt__ps_dense_parse). */
struct mt__ps_dense {
    dense_tensor_t *d;
    size_t n;
    uint64_t version;
};

static void dense_free(dense_tensor_t *d, size_t n) {
    for (size_t i = 0; i < n; i++) {
        free(d[i].name);
        free(d[i].shape);
        free(d[i].w);
        free(d[i].s1);
        free(d[i].s2);
    }
    free(d);
}

/* ============================== lifecycle ============================== */

void mt__ps_dense_init(mt__ps_dense_store_t *ds, const mt_ps_dense_config_t *cfg) {
    memset(ds, 0, sizeof(*ds));
    ds->cfg = *cfg;
    pthread_mutex_init(&ds->lock, NULL);
}

void mt__ps_dense_fini(mt__ps_dense_store_t *ds) {
    dense_free(ds->t, ds->n);
    ds->t = NULL;
    ds->n = 0;
    pthread_mutex_destroy(&ds->lock);
}

uint64_t mt__ps_dense_version(mt__ps_dense_store_t *ds) {
    pthread_mutex_lock(&ds->lock);
    uint64_t v = ds->version;
    pthread_mutex_unlock(&ds->lock);
    return v;
}

/* ============================== tensors ============================== */

static dense_tensor_t *dense_find(mt__ps_dense_store_t *ds, const char *name) {
    for (size_t i = 0; i < ds->n; i++)
        if (!strcmp(ds->t[i].name, name)) return &ds->t[i];
    return NULL;
}

static size_t shape_size(const uint32_t *shape, size_t n, int *ok) {
    size_t sz = 1;
    *ok = n > 0 && n <= 8;
    for (size_t i = 0; i < n && *ok; i++) {
        if (shape[i] == 0 || sz > (SIZE_MAX / 8) / shape[i])
            *ok = 0;
        else
            sz *= shape[i];
    }
    if (sz > (256u << 20)) *ok = 0; /* 1 GiB of floats per tensor at most */
    return sz;
}

/* Adds a tensor from an init message (lock held). */
static int dense_add(mt__ps_dense_store_t *ds, const Monolith__V1__DenseTensor *t, char *why,
                     size_t wlen) {
    int ok;
    size_t n = shape_size(t->shape, t->n_shape, &ok);
    if (!ok || n != t->n_values) {
        snprintf(why, wlen, "init tensor '%s': shape does not match its %zu values", t->name,
                 t->n_values);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(t->values[i])) {
            snprintf(why, wlen, "init tensor '%s': value %zu is not finite", t->name, i);
            return -1;
        }
    }
    dense_tensor_t *nd = realloc(ds->t, (ds->n + 1) * sizeof(*nd));
    if (!nd) return -2;
    ds->t = nd;
    dense_tensor_t *d = &nd[ds->n];
    memset(d, 0, sizeof(*d));
    d->name = strdup(t->name);
    d->shape = malloc(t->n_shape * sizeof(uint32_t));
    d->w = malloc(n * sizeof(float));
    d->s1 = calloc(n, sizeof(float));
    d->s2 = calloc(n, sizeof(float));
    if (!d->name || !d->shape || !d->w || !d->s1 || !d->s2) {
        free(d->name);
        free(d->shape);
        free(d->w);
        free(d->s1);
        free(d->s2);
        return -2;
    }
    memcpy(d->shape, t->shape, t->n_shape * sizeof(uint32_t));
    d->nshape = t->n_shape;
    d->n = n;
    memcpy(d->w, t->values, n * sizeof(float));
    if (ds->cfg.opt == MT_OPT_ADAGRAD)
        for (size_t i = 0; i < n; i++)
            d->s1[i] = ds->cfg.init_accum;
    ds->n++;
    return 0;
}

static void dense_apply(const mt_ps_dense_config_t *o, dense_tensor_t *d, const float *g) {
    switch (o->opt) {
    case MT_OPT_SGD:
        for (size_t i = 0; i < d->n; i++)
            d->w[i] -= o->lr * g[i];
        break;
    case MT_OPT_ADAGRAD:
        for (size_t i = 0; i < d->n; i++) {
            d->s1[i] += g[i] * g[i];
            d->w[i] -= o->lr * g[i] / (sqrtf(d->s1[i]) + o->eps);
        }
        break;
    default: { /* Adam: the model's (the trainer's local step is the same code) */
        mt_model_adam_t a = {o->lr, o->beta1, o->beta2, o->eps};
        mt_model_adam_step(&a, ++d->steps, d->w, d->s1, d->s2, g, d->n);
        break;
    }
    }
}

/* ============================== PushDense, PullDense ============================== */

mt_err_t mt__ps_dense_push(mt__ps_dense_store_t *ds, const Monolith__V1__PushDenseRequest *r,
                           uint64_t *version, char *why, size_t wlen) {
    mt_err_t code = MT_OK;
    pthread_mutex_lock(&ds->lock);
    /* Check everything first: a bad request changes nothing. */
    for (size_t i = 0; i < r->n_grads && code == MT_OK; i++) {
        const Monolith__V1__DenseTensor *g = r->grads[i];
        dense_tensor_t *d = dense_find(ds, g->name);
        /* the first init of that name: the one the tensor is created from below (checking a
         * later one let a gradient of another size through: found by fuzz_ps_push_dense) */
        const Monolith__V1__DenseTensor *init = NULL;
        for (size_t k = 0; k < r->n_init && !d && !init; k++)
            if (!strcmp(r->init[k]->name, g->name)) init = r->init[k];
        size_t n = d ? d->n : init ? init->n_values : 0;
        if (!d && !init) {
            code = MT_INVALID;
            snprintf(why, wlen, "tensor '%s' is unknown and no init was sent", g->name);
        } else if (g->n_values != n) {
            code = MT_INVALID;
            snprintf(why, wlen, "gradient of '%s' has %zu values, the tensor %zu", g->name,
                     g->n_values, n);
        } else {
            for (size_t k = 0; k < g->n_values; k++) {
                if (!isfinite(g->values[k])) {
                    code = MT_INVALID;
                    snprintf(why, wlen, "gradient of '%s': value %zu is not finite", g->name, k);
                    break;
                }
            }
        }
    }
    /* Create the missing tensors, then apply the gradients of the others: a tensor this
     * request creates starts at its init values (its gradient here is not a step). */
    uint8_t *created = calloc(r->n_grads ? r->n_grads : 1, 1);
    if (!created && code == MT_OK) {
        code = MT_NOMEM;
        snprintf(why, wlen, "out of memory");
    }
    for (size_t i = 0; i < r->n_grads && code == MT_OK; i++) {
        if (dense_find(ds, r->grads[i]->name)) continue;
        created[i] = 1;
        for (size_t k = 0; k < r->n_init; k++) {
            if (strcmp(r->init[k]->name, r->grads[i]->name)) continue;
            int rc = dense_add(ds, r->init[k], why, wlen);
            if (rc == -1) code = MT_INVALID;
            if (rc == -2) {
                code = MT_NOMEM;
                snprintf(why, wlen, "out of memory");
            }
            break;
        }
    }
    for (size_t i = 0; i < r->n_grads && code == MT_OK; i++)
        if (!created[i])
            dense_apply(&ds->cfg, dense_find(ds, r->grads[i]->name), r->grads[i]->values);
    free(created);
    if (code == MT_OK && r->n_grads) ds->version++;
    *version = ds->version;
    pthread_mutex_unlock(&ds->lock);
    return code;
}

mt_err_t mt__ps_dense_pull(mt__ps_dense_store_t *ds, const Monolith__V1__PullDenseRequest *r,
                           mt__ps_dense_reply_fn reply, void *ud, const char **missing_out) {
    mt_err_t err = MT_OK;
    pthread_mutex_lock(&ds->lock);
    Monolith__V1__PullDenseResponse resp = MONOLITH__V1__PULL_DENSE_RESPONSE__INIT;
    resp.version = ds->version;
    size_t cap = ds->n;
    Monolith__V1__DenseTensor *ts = calloc(cap ? cap : 1, sizeof(*ts));
    Monolith__V1__DenseTensor **tp = calloc(cap ? cap : 1, sizeof(*tp));
    const char *missing = NULL;
    if (ts && tp && ds->version > r->if_newer_than) {
        size_t n = 0;
        for (size_t i = 0; i < ds->n; i++) {
            int want = r->n_names == 0;
            for (size_t k = 0; k < r->n_names && !want; k++)
                want = !strcmp(r->names[k], ds->t[i].name);
            if (!want) continue;
            monolith__v1__dense_tensor__init(&ts[n]);
            ts[n].name = ds->t[i].name;
            ts[n].n_shape = ds->t[i].nshape;
            ts[n].shape = ds->t[i].shape;
            ts[n].n_values = ds->t[i].n;
            ts[n].values = ds->t[i].w;
            tp[n] = &ts[n];
            n++;
        }
        for (size_t k = 0; k < r->n_names && !missing; k++)
            if (!dense_find(ds, r->names[k])) missing = r->names[k];
        resp.n_tensors = n;
        resp.tensors = tp;
    }
    if (!ts || !tp) {
        err = MT_NOMEM;
    } else if (missing) {
        err = MT_NOT_FOUND;
        *missing_out = missing;
    } else {
        reply(ud, &resp.base); /* packed under the lock: consistent */
    }
    pthread_mutex_unlock(&ds->lock);
    free(ts);
    free(tp);
    return err;
}

/* ============================== DenseState ============================== */

mt_err_t mt__ps_dense_save(mt__ps_dense_store_t *ds, uint8_t **buf, size_t *len) {
    pthread_mutex_lock(&ds->lock);
    size_t n = ds->n;
    Monolith__V1__DenseTensor *ts = calloc(3 * (n ? n : 1), sizeof(*ts));
    Monolith__V1__DenseTensor **tp = calloc(3 * (n ? n : 1), sizeof(*tp));
    uint64_t *steps = calloc(n ? n : 1, sizeof(uint64_t));
    mt_err_t err = MT_OK;
    if (!ts || !tp || !steps) {
        err = MT_NOMEM;
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        const dense_tensor_t *d = &ds->t[i];
        float *arrs[3] = {d->w, d->s1, d->s2};
        for (int k = 0; k < 3; k++) {
            Monolith__V1__DenseTensor *t = &ts[k * n + i];
            monolith__v1__dense_tensor__init(t);
            t->name = d->name;
            t->n_shape = d->nshape;
            t->shape = d->shape;
            t->n_values = d->n;
            t->values = arrs[k];
            tp[k * n + i] = t;
        }
        steps[i] = d->steps;
    }
    Monolith__V1__DenseState st = MONOLITH__V1__DENSE_STATE__INIT;
    st.version = ds->version;
    st.n_weights = st.n_slot1 = st.n_slot2 = n;
    st.weights = tp;
    st.slot1 = tp + n;
    st.slot2 = tp + 2 * n;
    st.n_steps = n;
    st.steps = steps;
    *len = monolith__v1__dense_state__get_packed_size(&st);
    *buf = malloc(*len ? *len : 1);
    if (!*buf) {
        err = MT_NOMEM;
        goto out;
    }
    monolith__v1__dense_state__pack(&st, *buf);
out:
    pthread_mutex_unlock(&ds->lock);
    free(ts);
    free(tp);
    free(steps);
    return err;
}

void mt__ps_dense_free(mt__ps_dense_t *dd) {
    if (!dd) return;
    dense_free(dd->d, dd->n);
    free(dd);
}

/* Exchanges the store's dense parameters with @p dd's (caller holds dense_lock). */
static void dense_swap_locked(mt__ps_dense_store_t *ds, mt__ps_dense_t *dd) {
    dense_tensor_t *d = ds->t;
    size_t n = ds->n;
    uint64_t v = ds->version;
    ds->t = dd->d;
    ds->n = dd->n;
    ds->version = dd->version;
    dd->d = d;
    dd->n = n;
    dd->version = v;
}

void mt__ps_dense_swap(mt__ps_dense_store_t *ds, mt__ps_dense_t *dd) {
    pthread_mutex_lock(&ds->lock);
    dense_swap_locked(ds, dd);
    pthread_mutex_unlock(&ds->lock);
}

mt_err_t mt__ps_dense_parse(const uint8_t *buf, size_t len, mt__ps_dense_t **out) {
    mt__ps_dense_t *dd = calloc(1, sizeof(*dd));
    if (!dd) return MT_NOMEM;
    if (!buf || !len) { /* no DenseState at all: no tensors, version 0 */
        *out = dd;
        return MT_OK;
    }
    Monolith__V1__DenseState *st = monolith__v1__dense_state__unpack(NULL, len, buf);
    if (!st) {
        free(dd);
        return MT_CORRUPT;
    }
    size_t n = st->n_weights;
    mt_err_t err = MT_OK;
    if (st->n_slot1 != n || st->n_slot2 != n || st->n_steps != n) err = MT_CORRUPT;
    dense_tensor_t *nd = calloc(n ? n : 1, sizeof(*nd));
    if (!nd) err = MT_NOMEM;
    size_t built = 0;
    for (size_t i = 0; i < n && !err; i++, built++) {
        const Monolith__V1__DenseTensor *w = st->weights[i], *a = st->slot1[i], *b = st->slot2[i];
        int ok;
        size_t sz = shape_size(w->shape, w->n_shape, &ok);
        if (!ok || w->n_values != sz || a->n_values != sz || b->n_values != sz) {
            err = MT_CORRUPT;
            break;
        }
        dense_tensor_t *d = &nd[i];
        d->name = strdup(w->name);
        d->shape = malloc(w->n_shape * sizeof(uint32_t));
        d->w = malloc(sz * sizeof(float));
        d->s1 = malloc(sz * sizeof(float));
        d->s2 = malloc(sz * sizeof(float));
        if (!d->name || !d->shape || !d->w || !d->s1 || !d->s2) {
            err = MT_NOMEM;
            built++;
            break;
        }
        memcpy(d->shape, w->shape, w->n_shape * sizeof(uint32_t));
        d->nshape = w->n_shape;
        d->n = sz;
        memcpy(d->w, w->values, sz * sizeof(float));
        memcpy(d->s1, a->values, sz * sizeof(float));
        memcpy(d->s2, b->values, sz * sizeof(float));
        d->steps = st->steps[i];
    }
    if (!err) {
        dd->d = nd;
        dd->n = n;
        dd->version = st->version;
        *out = dd;
    } else {
        dense_free(nd, built);
        free(dd);
    }
    monolith__v1__dense_state__free_unpacked(st, NULL);
    return err;
}
