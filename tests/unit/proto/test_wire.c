/*
 * test_wire.c - the generated wire code of proto/ (protoc-c): messages round-trip exactly,
 * fids travel as packed fixed64 (8 bytes each, whatever their value), and malformed bytes
 * are refused (NULL from unpack), never a crash. Decoders of the daemons rely on that.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "grpc/health/v1/health.pb-c.h"
#include "monolith/v1/example.pb-c.h"
#include "monolith/v1/ps.pb-c.h"
#include "monolith/v1/serving.pb-c.h"

static uint8_t *pack_lookup(const uint64_t *fids, size_t n, int train, size_t *len) {
    Monolith__V1__LookupRequest req = MONOLITH__V1__LOOKUP_REQUEST__INIT;
    req.n_fids = n;
    req.fids = (uint64_t *)fids;
    req.train = train;
    req.now_s = 1700000000;
    *len = monolith__v1__lookup_request__get_packed_size(&req);
    uint8_t *buf = malloc(*len);
    cr_assert_eq(monolith__v1__lookup_request__pack(&req, buf), *len);
    return buf;
}

Test(wire, lookup_request_round_trip_and_fixed64_size) {
    uint64_t fids[5] = {0, 1, 0xFFFFFFFFFFFFFFFFull, ((uint64_t)7 << 48) | 12345, 1ull << 63};
    size_t len;
    uint8_t *buf = pack_lookup(fids, 5, 1, &len);
    /* tag+len of the packed field (2 bytes) + 5 * 8, train (2), now_s (1 + varint 5) */
    cr_assert_eq(len, 2 + 40 + 2 + 6);
    Monolith__V1__LookupRequest *r = monolith__v1__lookup_request__unpack(NULL, len, buf);
    cr_assert_not_null(r);
    cr_assert_eq(r->n_fids, 5);
    for (int i = 0; i < 5; i++)
        cr_assert_eq(r->fids[i], fids[i]);
    cr_assert_eq(r->train, 1);
    cr_assert_eq(r->now_s, 1700000000);
    monolith__v1__lookup_request__free_unpacked(r, NULL);
    free(buf);
}

Test(wire, truncated_and_garbage_input_is_refused) {
    uint64_t fids[3] = {11, 22, 33};
    size_t len;
    uint8_t *buf = pack_lookup(fids, 3, 0, &len);
    /* Every strict prefix that cuts the packed fids field must be refused. */
    for (size_t cut = 1; cut < 2 + 24; cut++) {
        Monolith__V1__LookupRequest *r = monolith__v1__lookup_request__unpack(NULL, cut, buf);
        cr_assert_null(r, "prefix of %zu bytes accepted", cut);
    }
    /* Random garbage: never a crash; whatever decodes must free cleanly. */
    uint64_t x = 42;
    uint8_t junk[256];
    int refused = 0;
    for (int iter = 0; iter < 2000; iter++) {
        for (size_t i = 0; i < sizeof(junk); i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            junk[i] = (uint8_t)(x >> 56);
        }
        size_t n = (size_t)(x % sizeof(junk));
        Monolith__V1__ApplyGradientsRequest *r =
            monolith__v1__apply_gradients_request__unpack(NULL, n, junk);
        if (r)
            monolith__v1__apply_gradients_request__free_unpacked(r, NULL);
        else
            refused++;
    }
    cr_assert_gt(refused, 1000, "garbage should mostly be refused, %d were", refused);
    free(buf);
}

Test(wire, sync_chunk_and_predict_round_trip) {
    uint64_t fids[3] = {1, 2, 3};
    float values[4] = {0.5f, -1.0f, 2.0f, 3.5f};
    uint8_t deleted[3] = {0, 1, 0};
    Monolith__V1__SyncChunk c = MONOLITH__V1__SYNC_CHUNK__INIT;
    c.full = 1;
    c.incarnation = 99;
    c.upto_version = 1ull << 41;
    c.n_fids = 3;
    c.fids = fids;
    c.n_values = 4;
    c.values = values;
    c.deleted.len = 3;
    c.deleted.data = deleted;
    c.last = 1;
    size_t len = monolith__v1__sync_chunk__get_packed_size(&c);
    uint8_t *buf = malloc(len);
    monolith__v1__sync_chunk__pack(&c, buf);
    Monolith__V1__SyncChunk *r = monolith__v1__sync_chunk__unpack(NULL, len, buf);
    cr_assert_not_null(r);
    cr_assert(r->full && r->last);
    cr_assert_eq(r->incarnation, 99);
    cr_assert_eq(r->upto_version, 1ull << 41);
    cr_assert_eq(r->n_fids, 3);
    cr_assert_eq(r->n_values, 4);
    cr_assert_eq(memcmp(r->values, values, sizeof(values)), 0);
    cr_assert_eq(r->deleted.len, 3);
    cr_assert_eq(r->deleted.data[1], 1);
    monolith__v1__sync_chunk__free_unpacked(r, NULL);
    free(buf);

    Monolith__V1__SlotFids user = MONOLITH__V1__SLOT_FIDS__INIT;
    uint64_t ufids[2] = {(1ull << 48) | 5, (1ull << 48) | 6};
    user.slot = 1;
    user.n_fids = 2;
    user.fids = ufids;
    Monolith__V1__SlotFids *users[1] = {&user};
    Monolith__V1__Candidate cand = MONOLITH__V1__CANDIDATE__INIT;
    cand.item_id = 77;
    Monolith__V1__Candidate *cands[1] = {&cand};
    Monolith__V1__PredictRequest p = MONOLITH__V1__PREDICT_REQUEST__INIT;
    p.request_id = "req-1";
    p.n_user = 1;
    p.user = users;
    p.n_candidates = 1;
    p.candidates = cands;
    len = monolith__v1__predict_request__get_packed_size(&p);
    buf = malloc(len);
    monolith__v1__predict_request__pack(&p, buf);
    Monolith__V1__PredictRequest *pr = monolith__v1__predict_request__unpack(NULL, len, buf);
    cr_assert_not_null(pr);
    cr_assert_str_eq(pr->request_id, "req-1");
    cr_assert_eq(pr->n_user, 1);
    cr_assert_eq(pr->user[0]->fids[1], ufids[1]);
    cr_assert_eq(pr->candidates[0]->item_id, 77);
    monolith__v1__predict_request__free_unpacked(pr, NULL);
    free(buf);
}

Test(wire, health_check_response) {
    Grpc__Health__V1__HealthCheckResponse h = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    h.status = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
    uint8_t buf[16];
    size_t len = grpc__health__v1__health_check_response__pack(&h, buf);
    cr_assert_eq(len, 2); /* field 1 varint 1 */
    cr_assert_eq(buf[0], 0x08);
    cr_assert_eq(buf[1], 0x01);
}
