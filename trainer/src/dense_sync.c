/*
 * dense_sync.c - the trainer's dense parameters kept on the parameter servers (shard 0):
 * gradients summed over `every` steps are pushed as their mean, then the values pulled.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mt/psclient.h"
#include "mt/trainer.h"

struct mt_trainer_dense_sync {
    mt_trainer_t *tr;
    mt_psc_t *c;
    uint32_t every, pending; /* steps summed in acc since the last push */
    size_t n;
    mt_psc_tensor_t *vals, *grads; /* vals point into the model; grads into acc */
    float *acc;
    uint64_t version, pushes;
    const mt_psc_range_t *cover; /* of the next push (borrowed) */
    size_t ncover;
};

static mt_err_t fail(mt_err_t err, const mt_rpc_status_t *st, const char *what, char *errbuf,
                     size_t errlen) {
    if (errbuf && errlen)
        snprintf(errbuf, errlen, "%s: %s (status %d: %s)", what, mt_strerror(err), st->code,
                 st->message);
    return err;
}

static mt_err_t pull(mt_trainer_dense_sync_t *d, char *errbuf, size_t errlen) {
    mt_rpc_status_t st = {0};
    int updated = 0;
    mt_err_t err = mt_psc_pull_dense(d->c, d->vals, d->n, 0, &d->version, &updated, &st);
    if (err) return fail(err, &st, "PullDense", errbuf, errlen);
    return MT_OK;
}

mt_err_t mt_trainer_dense_sync_create(mt_trainer_t *tr, mt_psc_t *c, uint32_t every,
                                      mt_trainer_dense_sync_t **out, char *errbuf, size_t errlen) {
    mt_model_t *m = mt_trainer_model(tr);
    mt_trainer_dense_sync_t *d = calloc(1, sizeof(*d));
    if (!d) return MT_NOMEM;
    d->tr = tr;
    d->c = c;
    d->every = every ? every : 1;
    d->n = mt_model_nparams(m);
    size_t total = 0;
    d->vals = calloc(d->n, sizeof(*d->vals));
    d->grads = calloc(d->n, sizeof(*d->grads));
    if (!d->vals || !d->grads) goto nomem;
    for (size_t i = 0; i < d->n; i++) {
        mt_model_param_t p;
        mt_model_param(m, i, &p);
        d->vals[i] = (mt_psc_tensor_t){p.name, p.ndim, {p.shape[0], p.shape[1]}, p.size, p.values};
        total += p.size;
    }
    if (!(d->acc = calloc(total ? total : 1, sizeof(float)))) goto nomem;
    for (size_t i = 0, off = 0; i < d->n; off += d->vals[i].size, i++) {
        d->grads[i] = d->vals[i];
        d->grads[i].values = d->acc + off;
    }
    /* The PS's values when it has them; else ours, pushed with zero gradients (which create
     * the tensors without a step; when another trainer won the race they are a no-op step). */
    mt_rpc_status_t st = {0};
    int updated = 0;
    mt_err_t err = mt_psc_pull_dense(c, d->vals, d->n, 0, &d->version, &updated, &st);
    if (err == MT_OK && updated) {
        mt_trainer_set_dense_remote(tr, 1);
        *out = d;
        return MT_OK;
    }
    if (err != MT_OK && err != MT_NOT_FOUND) {
        fail(err, &st, "PullDense", errbuf, errlen);
        mt_trainer_dense_sync_destroy(d);
        return err;
    }
    err = mt_psc_push_dense(c, d->grads, d->vals, d->n, 0, NULL, &st);
    if (err) {
        fail(err, &st, "PushDense (init)", errbuf, errlen);
        mt_trainer_dense_sync_destroy(d);
        return err;
    }
    if ((err = pull(d, errbuf, errlen))) {
        mt_trainer_dense_sync_destroy(d);
        return err;
    }
    mt_trainer_set_dense_remote(tr, 1);
    *out = d;
    return MT_OK;
nomem:
    mt_trainer_dense_sync_destroy(d);
    return MT_NOMEM;
}

void mt_trainer_dense_sync_set_cover(mt_trainer_dense_sync_t *d, const mt_psc_range_t *cover,
                                     size_t n) {
    d->cover = n ? cover : NULL;
    d->ncover = n;
}

mt_err_t mt_trainer_dense_sync_flush(mt_trainer_dense_sync_t *d, char *errbuf, size_t errlen) {
    const mt_psc_range_t *cover = d->cover;
    size_t ncover = d->ncover;
    d->cover = NULL;
    d->ncover = 0;
    if (!d->pending) return MT_OK;
    if (ncover && d->every > 1) {
        if (errbuf && errlen)
            snprintf(errbuf, errlen, "PushDense: a cover needs dense pushes every step (every 1)");
        return MT_INVALID;
    }
    if (d->pending > 1) {
        float inv = 1.0f / (float)d->pending;
        for (size_t i = 0; i < d->n; i++)
            for (size_t k = 0; k < d->grads[i].size; k++)
                d->grads[i].values[k] *= inv;
    }
    mt_rpc_status_t st = {0};
    mt_err_t err = ncover ? mt_psc_push_dense_cover(d->c, d->grads, NULL, d->n, ++d->pushes, cover,
                                                    ncover, NULL, NULL, &st)
                          : mt_psc_push_dense(d->c, d->grads, NULL, d->n, ++d->pushes, NULL, &st);
    if (err) {
        /* the sum is kept (rescaled back) so that a retry loses nothing */
        if (d->pending > 1)
            for (size_t i = 0; i < d->n; i++)
                for (size_t k = 0; k < d->grads[i].size; k++)
                    d->grads[i].values[k] *= (float)d->pending;
        d->pushes--;
        return fail(err, &st, "PushDense", errbuf, errlen);
    }
    d->pending = 0;
    for (size_t i = 0; i < d->n; i++)
        memset(d->grads[i].values, 0, d->grads[i].size * sizeof(float));
    return pull(d, errbuf, errlen);
}

mt_err_t mt_trainer_dense_sync_step(mt_trainer_dense_sync_t *d, int *synced, char *errbuf,
                                    size_t errlen) {
    mt_model_t *m = mt_trainer_model(d->tr);
    if (synced) *synced = 0;
    for (size_t i = 0; i < d->n; i++) {
        mt_model_param_t p;
        mt_model_param(m, i, &p);
        float *a = d->grads[i].values;
        for (size_t k = 0; k < p.size; k++)
            a[k] += p.grads[k];
    }
    if (++d->pending < d->every) return MT_OK;
    mt_err_t err = mt_trainer_dense_sync_flush(d, errbuf, errlen);
    if (!err && synced) *synced = 1;
    return err;
}

mt_err_t mt_trainer_dense_sync_reset(mt_trainer_dense_sync_t *d, int fresh, char *errbuf,
                                     size_t errlen) {
    d->pending = 0;
    for (size_t i = 0; i < d->n; i++)
        memset(d->grads[i].values, 0, d->grads[i].size * sizeof(float));
    mt_model_t *m = mt_trainer_model(d->tr);
    if (fresh) { /* the initial values: a new model of the same configuration */
        mt_model_t *init = NULL;
        mt_err_t err = mt_model_create(mt_model_config(m), &init);
        if (err) return fail(err, &(mt_rpc_status_t){0}, "model", errbuf, errlen);
        for (size_t i = 0; i < d->n; i++) {
            mt_model_param_t a, b;
            mt_model_param(init, i, &a);
            mt_model_param(m, i, &b);
            memcpy(b.values, a.values, b.size * sizeof(float));
        }
        mt_model_destroy(init);
    }
    mt_rpc_status_t st = {0};
    int updated = 0;
    mt_err_t err = mt_psc_pull_dense(d->c, d->vals, d->n, 0, &d->version, &updated, &st);
    if (err == MT_OK && updated) return MT_OK;
    if (err != MT_OK && err != MT_NOT_FOUND) return fail(err, &st, "PullDense", errbuf, errlen);
    /* the PS has no dense tensors (the empty state): ours create them, as at the start */
    err = mt_psc_push_dense(d->c, d->grads, d->vals, d->n, 0, NULL, &st);
    if (err) return fail(err, &st, "PushDense (init)", errbuf, errlen);
    return pull(d, errbuf, errlen);
}

uint64_t mt_trainer_dense_sync_version(const mt_trainer_dense_sync_t *d) {
    return d->version;
}

void mt_trainer_dense_sync_destroy(mt_trainer_dense_sync_t *d) {
    if (!d) return;
    free(d->vals);
    free(d->grads);
    free(d->acc);
    free(d);
}
