/*
 * example_pb.c - monolith.v1.Example <-> example batch.
 */
#include "mt/example_pb.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "monolith/v1/example.pb-c.h"

static mt_err_t refuse(char *why, size_t whylen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static mt_err_t refuse(char *why, size_t whylen, const char *fmt, ...) {
    if (why && whylen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, whylen, fmt, ap);
        va_end(ap);
    }
    return MT_CORRUPT;
}

mt_err_t mt_example_decode(const void *buf, size_t len, mt_batch_t *b, uint32_t *ignored_slots,
                           char *why, size_t whylen) {
    if (ignored_slots) *ignored_slots = 0;
    Monolith__V1__Example *ex = monolith__v1__example__unpack(NULL, len, buf);
    if (!ex) return refuse(why, whylen, "not a monolith.v1.Example protobuf (%zu bytes)", len);
    mt_err_t err = MT_OK;
    const uint64_t *fids[256] = {0};
    uint32_t counts[256] = {0};
    int seen[256] = {0};
    uint32_t ignored = 0;
    float rate = ex->sample_rate == 0.0f ? 1.0f : ex->sample_rate;
    if (b->nslots > 256) {
        err = refuse(why, whylen, "batch has more than 256 slots");
        goto out;
    }
    if (ex->n_labels < 1) {
        err = refuse(why, whylen, "no label");
        goto out;
    }
    /* one label per task of the batch (its first ones: a model of fewer tasks ignores the
     * others) */
    if (ex->n_labels < b->ntasks) {
        err = refuse(why, whylen, "%zu label%s, the model has %u tasks", ex->n_labels,
                     ex->n_labels == 1 ? "" : "s", b->ntasks);
        goto out;
    }
    for (uint32_t t = 0; t < b->ntasks; t++) {
        if (!(ex->labels[t] >= 0.0f && ex->labels[t] <= 1.0f)) {
            err = refuse(why, whylen, "label %u: %g outside [0, 1]", t, (double)ex->labels[t]);
            goto out;
        }
    }
    if (!(rate > 0.0f && rate <= 1.0f)) {
        err = refuse(why, whylen, "sample_rate %g outside (0, 1]", (double)rate);
        goto out;
    }
    for (size_t k = 0; k < ex->n_slots; k++) {
        const Monolith__V1__SlotFids *sf = ex->slots[k];
        if (sf->slot > 65535) {
            err = refuse(why, whylen, "slot %u above 65535", sf->slot);
            goto out;
        }
        for (size_t j = 0; j < sf->n_fids; j++) {
            if (sf->fids[j] >> 48 != sf->slot) {
                err = refuse(why, whylen, "fid 0x%016llx is not of its slot %u",
                             (unsigned long long)sf->fids[j], sf->slot);
                goto out;
            }
        }
        uint32_t s = 0;
        while (s < b->nslots && b->slot_ids[s] != sf->slot)
            s++;
        if (s == b->nslots) {
            ignored++;
            continue;
        }
        if (seen[s]++) {
            err = refuse(why, whylen, "slot %u given twice", sf->slot);
            goto out;
        }
        fids[s] = sf->fids;
        counts[s] = (uint32_t)sf->n_fids;
    }
    err = mt_batch_add_labels(b, ex->labels, ex->timestamp_ms, rate, fids, counts);
    if (err == MT_INVALID) err = refuse(why, whylen, "fid of another slot");
    if (!err && ignored_slots) *ignored_slots = ignored;
out:
    monolith__v1__example__free_unpacked(ex, NULL);
    return err;
}

mt_err_t mt_example_encode(const mt_batch_t *b, size_t i, const char *request_id, uint8_t **out,
                           size_t *out_len) {
    if (i >= b->n) return MT_INVALID;
    Monolith__V1__Example ex = MONOLITH__V1__EXAMPLE__INIT;
    Monolith__V1__SlotFids *sf = calloc(b->nslots ? b->nslots : 1, sizeof(*sf));
    Monolith__V1__SlotFids **sp = calloc(b->nslots ? b->nslots : 1, sizeof(*sp));
    if (!sf || !sp) {
        free(sf);
        free(sp);
        return MT_NOMEM;
    }
    ex.request_id = (char *)(request_id ? request_id : "");
    ex.timestamp_ms = b->timestamps_ms[i];
    ex.n_labels = b->ntasks;
    ex.labels = b->labels + i * b->ntasks;
    ex.sample_rate = b->sample_rates[i];
    size_t n = 0;
    for (uint32_t s = 0; s < b->nslots; s++) {
        size_t cnt;
        const uint64_t *f = mt_batch_fids(b, i, s, &cnt);
        if (!cnt) continue;
        monolith__v1__slot_fids__init(&sf[n]);
        sf[n].slot = b->slot_ids[s];
        sf[n].n_fids = cnt;
        sf[n].fids = (uint64_t *)f;
        sp[n] = &sf[n];
        n++;
    }
    ex.n_slots = n;
    ex.slots = sp;
    size_t len = monolith__v1__example__get_packed_size(&ex);
    uint8_t *buf = malloc(len ? len : 1);
    if (buf) monolith__v1__example__pack(&ex, buf);
    free(sf);
    free(sp);
    if (!buf) return MT_NOMEM;
    *out = buf;
    *out_len = len;
    return MT_OK;
}
