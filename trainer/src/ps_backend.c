/* ps_backend.c - the trainer's parameters on sharded parameter servers (mt/psclient.h). A
 * failed call is logged here with the shard's status (the trainer's step sees only the
 * error code). */
#include "mt/log.h"
#include "mt/psclient.h"
#include "mt/trainer.h"

#define WHO "trainer"

static mt_err_t failed(const char *what, mt_err_t err, const mt_rpc_status_t *st) {
    mt_log(MT_LOG_WARN, WHO, "PS %s failed: %s (status %d: %s)", what, mt_strerror(err), st->code,
           st->message[0] ? st->message : "no message");
    return err;
}

static mt_err_t psc_lookup(void *ud, const uint64_t *fids, size_t n, int train, uint32_t now_s,
                           float *out, size_t out_len) {
    mt_rpc_status_t st = {0};
    mt_err_t err = mt_psc_lookup(ud, fids, n, train, now_s, out, out_len, NULL, &st);
    return err ? failed("lookup", err, &st) : MT_OK;
}

static mt_err_t psc_apply(void *ud, const uint64_t *fids, size_t n, const float *grads, size_t len,
                          uint32_t now_s, uint64_t examples) {
    mt_rpc_status_t st = {0};
    mt_err_t err = mt_psc_apply(ud, fids, n, grads, len, now_s, 0, examples, NULL, NULL, &st);
    return err ? failed("apply", err, &st) : MT_OK;
}

static mt_err_t psc_apply_cover(void *ud, const uint64_t *fids, size_t n, const float *grads,
                                size_t len, uint32_t now_s, uint64_t examples,
                                const mt_psc_range_t *cover, size_t ncover, uint32_t *skipped) {
    mt_rpc_status_t st = {0};
    mt_err_t err = mt_psc_apply_cover(ud, fids, n, grads, len, now_s, 0, examples, cover, ncover,
                                      skipped, NULL, NULL, &st);
    if (err == MT_OUT_OF_ORDER) { /* expected after a restart or a rebalance: the caller says */
        mt_log(MT_LOG_INFO, WHO, "PS apply: %s", st.message);
        return err;
    }
    return err ? failed("apply", err, &st) : MT_OK;
}

void mt_trainer_backend_psc(mt_psc_t *c, mt_trainer_backend_t *out) {
    out->ud = c;
    out->lookup = psc_lookup;
    out->apply = psc_apply;
    out->apply_cover = psc_apply_cover;
}
