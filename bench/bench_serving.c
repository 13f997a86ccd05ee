/*
 * bench_serving.c - see bench_serving.h.
 */
#include <stdlib.h>

#include "bench_serving.h"
#include "monolith/v1/serving.pb-c.h"

#define LOOKUP "/monolith.v1.Serving/Lookup"

int mt_bench_serving_served(mt_rpc_channel_t *ch, uint64_t fid) {
    Monolith__V1__LookupRequest q = MONOLITH__V1__LOOKUP_REQUEST__INIT;
    q.n_fids = 1;
    q.fids = &fid;
    uint8_t buf[64];
    size_t len = monolith__v1__lookup_request__pack(&q, buf);
    uint8_t *resp = NULL;
    size_t rlen = 0;
    mt_rpc_status_t st;
    int r = -1;
    if (mt_rpc_call(ch, LOOKUP, buf, len, 2000, &resp, &rlen, &st) == MT_OK &&
        st.code == MT_RPC_OK) {
        Monolith__V1__LookupResponse *lr = monolith__v1__lookup_response__unpack(NULL, rlen, resp);
        if (lr) {
            r = lr->found.len == 1 && lr->found.data[0] == 1;
            monolith__v1__lookup_response__free_unpacked(lr, NULL);
        }
    }
    free(resp);
    return r;
}
