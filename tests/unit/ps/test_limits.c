/*
 * test_limits.c - a PS shard's answers stay within the rpc message limit (ps/src/handlers.c), in
 * process through tests/unit/ps/testutil_ps.h: one shard served with a 1 MiB limit
 * (mt_ps_config_t.max_message_bytes and the server's, as monolith-ps sets both from
 * ps.max_message_bytes).
 *   - Lookup: a request whose answer would not fit gets RESOURCE_EXHAUSTED before anything
 *     is computed (no row created by a training lookup, no id counted), with a message saying
 *     how many ids of its dim fit, counted in the Lookup errors; one id less is answered.
 *     The bound is exact: the answer's protobuf size (values and found), as gRPC measures it.
 *   - PullDense: an answer over the limit is RESOURCE_EXHAUSTED and counted (it was sent
 *     and failed inside gRPC, uncounted); fewer tensors by name are answered.
 *   - Sync: a client asking for 65536 entries per chunk gets chunks that fit the limit (a
 *     chunk over it failed the stream).
 * Regression tests of an outside probe (1,048,576 ids at dim 16 were computed for 848 ms,
 * then failed with gRPC's "Sent message larger than max", uncounted).
 */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "monolith/v1/ps.pb-c.h"
#include "mt/ps.h"
#include "mt/rpc.h"
#include "mt/table.h"
#include "testutil_ps.h"

#define PATH(m)  "/monolith.v1.ParameterServer/" m
#define LIMIT    (1u << 20)
#define DIM      16
#define DEADLINE 60000

typedef struct shard {
    mt_table_slot_config_t slots[1];
    mt_ps_t *ps;
    mt_rpc_server_t *srv;
    mt_rpc_channel_t *ch;
} shard_t;

static void shard_start(shard_t *s) {
    memset(s, 0, sizeof(*s));
    mt_table_slot_config_init(&s->slots[0], 1, DIM);
    mt_ps_config_t pc;
    tu_ps_config(&pc, 0, 1, s->slots, 1);
    pc.max_message_bytes = LIMIT;
    cr_assert_eq(mt_ps_create(&pc, NULL, &s->ps), MT_OK);
    char addr[TU_PS_ADDR_LEN];
    s->srv = tu_ps_serve(s->ps, 2, LIMIT, NULL, addr);
    mt_rpc_client_config_t cc;
    mt_rpc_client_config_init(&cc); /* receives up to 64 MiB: the server's limit is the bound */
    cr_assert_eq(mt_rpc_channel_create(addr, &cc, &s->ch), MT_OK);
}

static void shard_stop(shard_t *s) {
    mt_rpc_channel_destroy(s->ch);
    mt_rpc_server_destroy(s->srv);
    mt_ps_destroy(s->ps);
}

/* A unary call; @returns its status (the answer in *resp when OK, caller frees). */
static mt_rpc_status_t call(shard_t *s, const char *path, const ProtobufCMessage *req,
                            uint8_t **resp, size_t *len) {
    size_t n = protobuf_c_message_get_packed_size(req);
    uint8_t *buf = malloc(n ? n : 1);
    protobuf_c_message_pack(req, buf);
    mt_rpc_status_t st;
    uint8_t *r = NULL;
    size_t rl = 0;
    cr_assert_eq(mt_rpc_call(s->ch, path, buf, n, DEADLINE, &r, &rl, &st), MT_OK);
    free(buf);
    if (resp) {
        *resp = r;
        *len = rl;
    } else {
        free(r);
    }
    return st;
}

static size_t varint_len(uint64_t v) {
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

/* The protobuf size of a LookupResponse for n ids of dim DIM: values (packed floats, field
 * 1) and found (bytes, field 2). */
static size_t answer_bytes(size_t n) {
    size_t vb = 4 * n * DIM;
    return (n ? 1 + varint_len(vb) + vb : 0) + (n ? 1 + varint_len(n) + n : 0);
}

static mt_rpc_status_t lookup(shard_t *s, size_t n, int train, size_t *nvalues) {
    uint64_t *fids = malloc(n * sizeof(*fids));
    for (size_t i = 0; i < n; i++)
        fids[i] = MT_FID_MAKE(1, i + 1);
    Monolith__V1__LookupRequest r = MONOLITH__V1__LOOKUP_REQUEST__INIT;
    r.n_fids = n;
    r.fids = fids;
    r.train = train;
    uint8_t *resp = NULL;
    size_t len = 0;
    mt_rpc_status_t st = call(s, PATH("Lookup"), &r.base, &resp, &len);
    free(fids);
    if (st.code == MT_RPC_OK) {
        cr_assert_eq(len, answer_bytes(n), "the answer's size is not the one computed");
        Monolith__V1__LookupResponse *a = monolith__v1__lookup_response__unpack(NULL, len, resp);
        cr_assert_not_null(a);
        *nvalues = a->n_values;
        monolith__v1__lookup_response__free_unpacked(a, NULL);
    }
    free(resp);
    return st;
}

static uint64_t rows(shard_t *s) {
    mt_table_stats_t ts;
    mt_table_stats(mt_ps_table(s->ps), &ts);
    return ts.rows;
}

TestSuite(ps_limits, .timeout = 120);

Test(ps_limits, a_lookup_whose_answer_cannot_be_sent_is_refused_before_it_is_computed) {
    shard_t s;
    shard_start(&s);
    size_t fit = 0;
    while (answer_bytes(fit + 1) <= LIMIT)
        fit++;
    cr_log_info("%zu ids of dim %d fit in %u bytes", fit, DIM, LIMIT);

    /* just over: refused, nothing computed, counted */
    size_t nv = 0;
    mt_ps_counters_t c0, c1;
    mt_ps_counters(s.ps, &c0);
    mt_rpc_status_t st = lookup(&s, fit + 1, 1, &nv);
    cr_assert_eq(st.code, MT_RPC_RESOURCE_EXHAUSTED, "%d: %s", st.code, st.message);
    char want[64];
    snprintf(want, sizeof(want), "at most %zu ids of dim %d", fit, DIM);
    cr_assert(strstr(st.message, want), "the message does not say what fits: %s", st.message);
    mt_ps_counters(s.ps, &c1);
    cr_assert_eq(c1.errors[MT_PS_LOOKUP], c0.errors[MT_PS_LOOKUP] + 1, "not counted");
    cr_assert_eq(c1.lookup_fids, c0.lookup_fids, "the refused lookup was computed");
    cr_assert_eq(rows(&s), 0, "the refused training lookup created rows");
    char *body = NULL;
    size_t blen = 0;
    cr_assert_eq(mt_ps_render_metrics(s.ps, NULL, &body, &blen), MT_OK);
    cr_assert(strstr(body, "monolith_ps_errors_total{shard=\"0\",method=\"Lookup\"} 1\n"), "%s",
              body);
    free(body);

    /* just under: answered, every value there */
    st = lookup(&s, fit, 1, &nv);
    cr_assert_eq(st.code, MT_RPC_OK, "%d: %s", st.code, st.message);
    cr_assert_eq(nv, fit * DIM);
    cr_assert_eq(rows(&s), fit);
    st = lookup(&s, fit, 0, &nv);
    cr_assert_eq(st.code, MT_RPC_OK, "%d: %s", st.code, st.message);
    mt_ps_counters(s.ps, &c1);
    cr_assert_eq(c1.errors[MT_PS_LOOKUP], c0.errors[MT_PS_LOOKUP] + 1);
    shard_stop(&s);
}

/* A tensor of n values of @p v, sent as init (with a zero gradient). */
static mt_rpc_status_t push_init(shard_t *s, const char *name, size_t n) {
    float *vals = calloc(n, sizeof(float)), *zero = calloc(n, sizeof(float));
    uint32_t shape[1] = {(uint32_t)n};
    Monolith__V1__DenseTensor t = MONOLITH__V1__DENSE_TENSOR__INIT, g = t;
    t.name = g.name = (char *)name;
    t.n_shape = g.n_shape = 1;
    t.shape = g.shape = shape;
    t.n_values = g.n_values = n;
    t.values = vals;
    g.values = zero;
    Monolith__V1__DenseTensor *tp[1] = {&t}, *gp[1] = {&g};
    Monolith__V1__PushDenseRequest r = MONOLITH__V1__PUSH_DENSE_REQUEST__INIT;
    r.n_grads = 1;
    r.grads = gp;
    r.n_init = 1;
    r.init = tp;
    mt_rpc_status_t st = call(s, PATH("PushDense"), &r.base, NULL, NULL);
    free(vals);
    free(zero);
    return st;
}

Test(ps_limits, a_pull_dense_answer_over_the_limit_is_refused_and_counted) {
    shard_t s;
    shard_start(&s);
    enum { NV = 100000 }; /* 400 KB a tensor: each push fits, the three together do not */
    const char *names[3] = {"a", "b", "c"};
    for (int i = 0; i < 3; i++) {
        mt_rpc_status_t st = push_init(&s, names[i], NV);
        cr_assert_eq(st.code, MT_RPC_OK, "%s", st.message);
    }
    mt_ps_counters_t c0, c1;
    mt_ps_counters(s.ps, &c0);
    Monolith__V1__PullDenseRequest r = MONOLITH__V1__PULL_DENSE_REQUEST__INIT;
    mt_rpc_status_t st = call(&s, PATH("PullDense"), &r.base, NULL, NULL);
    cr_assert_eq(st.code, MT_RPC_RESOURCE_EXHAUSTED, "%d: %s", st.code, st.message);
    cr_assert(strstr(st.message, "message limit") && strstr(st.message, "names"), "%s", st.message);
    mt_ps_counters(s.ps, &c1);
    cr_assert_eq(c1.errors[MT_PS_PULL_DENSE], c0.errors[MT_PS_PULL_DENSE] + 1, "not counted");
    /* two of them by name fit */
    char *two[2] = {"a", "c"};
    r.n_names = 2;
    r.names = two;
    uint8_t *resp = NULL;
    size_t len = 0;
    st = call(&s, PATH("PullDense"), &r.base, &resp, &len);
    cr_assert_eq(st.code, MT_RPC_OK, "%d: %s", st.code, st.message);
    Monolith__V1__PullDenseResponse *a = monolith__v1__pull_dense_response__unpack(NULL, len, resp);
    cr_assert(a && a->n_tensors == 2);
    monolith__v1__pull_dense_response__free_unpacked(a, NULL);
    free(resp);
    shard_stop(&s);
}

Test(ps_limits, sync_chunks_fit_the_limit_whatever_the_client_asks) {
    shard_t s;
    shard_start(&s);
    enum { NROWS = 20000 }; /* 20000 x (16 floats + id + flag) = 1.46 MB: not one chunk */
    uint64_t *fids = malloc(NROWS * sizeof(*fids));
    float *vals = calloc((size_t)NROWS * DIM, sizeof(float));
    for (size_t i = 0; i < NROWS; i++)
        fids[i] = MT_FID_MAKE(1, i + 1);
    cr_assert_eq(
        mt_table_assign(mt_ps_table(s.ps), fids, NROWS, vals, (size_t)NROWS * DIM, 1, NULL), MT_OK);
    free(fids);
    free(vals);
    Monolith__V1__SyncRequest r = MONOLITH__V1__SYNC_REQUEST__INIT;
    r.max_chunk_fids = 65536;
    uint8_t buf[64];
    size_t n = monolith__v1__sync_request__pack(&r, buf);
    mt_rpc_stream_t *st = NULL;
    cr_assert_eq(mt_rpc_stream_open(s.ch, PATH("Sync"), buf, n, DEADLINE, &st), MT_OK);
    size_t entries = 0, chunks = 0, biggest = 0;
    int last = 0;
    for (;;) {
        uint8_t *m = NULL;
        size_t ml = 0;
        if (mt_rpc_stream_next(st, &m, &ml) != MT_OK) break;
        Monolith__V1__SyncChunk *ch = monolith__v1__sync_chunk__unpack(NULL, ml, m);
        free(m);
        cr_assert_not_null(ch);
        entries += ch->n_fids;
        chunks++;
        biggest = ml > biggest ? ml : biggest;
        last = ch->last;
        monolith__v1__sync_chunk__free_unpacked(ch, NULL);
    }
    mt_rpc_status_t sst;
    mt_rpc_stream_close(st, &sst);
    cr_assert_eq(sst.code, MT_RPC_OK, "%d: %s", sst.code, sst.message);
    cr_assert(last, "the stream ended without its last chunk");
    cr_assert_eq(entries, NROWS);
    cr_assert_gt(chunks, 2);
    cr_assert_leq(biggest, LIMIT);
    cr_log_info("sync: %zu entries in %zu chunks, the biggest %zu bytes", entries, chunks, biggest);
    shard_stop(&s);
}
