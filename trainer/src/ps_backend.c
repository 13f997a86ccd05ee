/* ps_backend.c - the trainer's parameters on sharded parameter servers (mt/psclient.h). */
#include "mt/psclient.h"
#include "mt/trainer.h"

static mt_err_t psc_lookup(void *ud, const uint64_t *fids, size_t n, int train, uint32_t now_s,
                           float *out, size_t out_len) {
    return mt_psc_lookup(ud, fids, n, train, now_s, out, out_len, NULL, NULL);
}

static mt_err_t psc_apply(void *ud, const uint64_t *fids, size_t n, const float *grads, size_t len,
                          uint32_t now_s, uint64_t examples) {
    return mt_psc_apply(ud, fids, n, grads, len, now_s, 0, examples, NULL, NULL, NULL);
}

void mt_trainer_backend_psc(mt_psc_t *c, mt_trainer_backend_t *out) {
    out->ud = c;
    out->lookup = psc_lookup;
    out->apply = psc_apply;
}
