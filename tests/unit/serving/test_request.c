/*
 * test_request.c - serving's in-place PredictRequest reader (serving/src/request.c) against
 * protobuf-c, the decoder it replaces on Predict's path.
 *
 * Why: a reader of the wire format by hand can disagree with protobuf in ways no well-formed
 * client shows (unpacked repeated fields, fields out of order or repeated, unknown fields, a
 * slot after its fids, truncation anywhere). Each case here is bytes both decoders read, and
 * the two answers must be the same request; the impressions it writes must decode (with
 * protobuf-c) to the request's parts. fuzz_predict_request does the same on any input.
 */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "monolith/v1/example.pb-c.h"
#include "monolith/v1/serving.pb-c.h"
#include "request.h"

#define FID(slot, v) (((uint64_t)(slot) << 48) | (uint64_t)(v))

/* ============================== a byte writer ============================== */

typedef struct wb {
    uint8_t b[4096];
    size_t n;
} wb_t;

static void put(wb_t *w, uint8_t x) {
    cr_assert_lt(w->n, sizeof(w->b));
    w->b[w->n++] = x;
}

static void varint(wb_t *w, uint64_t v) {
    do {
        uint8_t x = v & 0x7F;
        v >>= 7;
        put(w, (uint8_t)(x | (v ? 0x80 : 0)));
    } while (v);
}

static void tag(wb_t *w, uint32_t field, unsigned wt) {
    varint(w, ((uint64_t)field << 3) | wt);
}

static void fixed64(wb_t *w, uint64_t v) {
    for (int i = 0; i < 8; i++)
        put(w, (uint8_t)(v >> (8 * i)));
}

static void bytes(wb_t *w, uint32_t field, const wb_t *body) {
    tag(w, field, 2);
    varint(w, body->n);
    for (size_t i = 0; i < body->n; i++)
        put(w, body->b[i]);
}

/* ============================== the comparison ============================== */

/* The fids of a parsed SlotFids, into out (at most cap). @returns how many. */
static size_t fids_of(const sv_req_t *r, const sv_sf_t *sf, uint64_t *out, size_t cap) {
    sv_fids_t it;
    uint64_t f;
    size_t n = 0;
    sv_fids_begin(&it, r, sf);
    while (sv_fids_next(&it, &f)) {
        cr_assert_lt(n, cap);
        out[n++] = f;
    }
    cr_assert_eq(n, sf->nfids);
    return n;
}

static void same_sf(const sv_req_t *r, const sv_sf_t *sf, const Monolith__V1__SlotFids *u) {
    uint64_t f[512];
    cr_assert_eq(sf->slot, u->slot);
    size_t n = fids_of(r, sf, f, 512);
    cr_assert_eq(n, u->n_fids);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(f[i], u->fids[i], "fid %zu", i);
}

/* Parses @p buf with both decoders: both must accept it and agree, part by part; then each
 * candidate's impression must decode to the request's parts. */
static void both_read(const uint8_t *buf, size_t len) {
    Monolith__V1__PredictRequest *u = monolith__v1__predict_request__unpack(NULL, len, buf);
    cr_assert_not_null(u, "protobuf-c refused the case");
    sv_req_t r = {0};
    char why[256] = "";
    cr_assert_eq(sv_req_parse(&r, buf, len, why, sizeof(why)), SV_REQ_OK, "%s", why);
    cr_assert_eq(r.request_id_len, strlen(u->request_id));
    cr_assert_eq(memcmp(r.request_id, u->request_id, r.request_id_len), 0);
    cr_assert_eq(r.timestamp_ms, u->timestamp_ms);
    cr_assert_eq(r.n_user, u->n_user);
    for (size_t i = 0; i < r.n_user; i++)
        same_sf(&r, &r.user[i], u->user[i]);
    cr_assert_eq(r.n_cands, u->n_candidates);
    for (size_t c = 0; c < r.n_cands; c++) {
        const Monolith__V1__Candidate *uc = u->candidates[c];
        cr_assert_eq(r.cands[c].item_id, uc->item_id);
        cr_assert_eq(r.cands[c].to - r.cands[c].from, uc->n_item);
        for (size_t k = 0; k < uc->n_item; k++)
            same_sf(&r, &r.items[r.cands[c].from + k], uc->item[k]);
        /* its impression */
        float score = 0.25f * (float)c;
        size_t il = sv_req_impression(&r, c, 1234567 + (int64_t)c, score, NULL);
        uint8_t *ib = malloc(il ? il : 1);
        cr_assert_eq(sv_req_impression(&r, c, 1234567 + (int64_t)c, score, ib), il);
        Monolith__V1__Impression *im = monolith__v1__impression__unpack(NULL, il, ib);
        cr_assert_not_null(im);
        cr_assert_str_eq(im->request_id, u->request_id);
        cr_assert_eq(im->timestamp_ms, 1234567 + (int64_t)c);
        cr_assert_eq(im->item_id, uc->item_id);
        cr_assert_eq(im->score, score);
        cr_assert_eq(im->n_user, u->n_user);
        for (size_t i = 0; i < im->n_user; i++) {
            cr_assert_eq(im->user[i]->slot, u->user[i]->slot);
            cr_assert_eq(im->user[i]->n_fids, u->user[i]->n_fids);
            if (im->user[i]->n_fids)
                cr_assert_eq(memcmp(im->user[i]->fids, u->user[i]->fids, 8 * im->user[i]->n_fids),
                             0);
        }
        cr_assert_eq(im->n_item, uc->n_item);
        for (size_t k = 0; k < im->n_item; k++) {
            cr_assert_eq(im->item[k]->slot, uc->item[k]->slot);
            cr_assert_eq(im->item[k]->n_fids, uc->item[k]->n_fids);
            if (im->item[k]->n_fids)
                cr_assert_eq(memcmp(im->item[k]->fids, uc->item[k]->fids, 8 * im->item[k]->n_fids),
                             0);
        }
        monolith__v1__impression__free_unpacked(im, NULL);
        free(ib);
    }
    monolith__v1__predict_request__free_unpacked(u, NULL);
    sv_req_free(&r);
}

static int parse(const wb_t *w, char *why, size_t len) {
    sv_req_t r = {0};
    int rc = sv_req_parse(&r, w->b, w->n, why, len);
    sv_req_free(&r);
    return rc;
}

/* ============================== cases ============================== */

/* What protobuf-c writes: packed fids, fields in order. */
Test(request, reads_what_protobuf_c_writes) {
    uint64_t uf[3] = {FID(1, 7), FID(1, 8), FID(1, 1ull << 40)}, f2[1] = {FID(2, 5)};
    uint64_t itf[4][2];
    Monolith__V1__SlotFids us[2], is[4], *up[2], *ip[4][1];
    Monolith__V1__Candidate cs[4], *cp[4];
    monolith__v1__slot_fids__init(&us[0]);
    us[0].slot = 1;
    us[0].n_fids = 3;
    us[0].fids = uf;
    monolith__v1__slot_fids__init(&us[1]);
    us[1].slot = 2;
    us[1].n_fids = 1;
    us[1].fids = f2;
    up[0] = &us[0];
    up[1] = &us[1];
    for (int c = 0; c < 4; c++) {
        itf[c][0] = FID(9, 100 + c);
        itf[c][1] = FID(9, 200 + c);
        monolith__v1__slot_fids__init(&is[c]);
        is[c].slot = 9;
        is[c].n_fids = c == 2 ? 0 : 2; /* an empty SlotFids too */
        is[c].fids = itf[c];
        ip[c][0] = &is[c];
        monolith__v1__candidate__init(&cs[c]);
        cs[c].item_id = c == 1 ? 0 : 5000 + (uint64_t)c; /* a 0 item_id is left out */
        cs[c].n_item = 1;
        cs[c].item = ip[c];
        cp[c] = &cs[c];
    }
    Monolith__V1__PredictRequest q = MONOLITH__V1__PREDICT_REQUEST__INIT;
    q.request_id = "req-42";
    q.timestamp_ms = -5; /* negative: ten bytes of varint */
    q.n_user = 2;
    q.user = up;
    q.n_candidates = 4;
    q.candidates = cp;
    uint8_t buf[1024];
    size_t len = monolith__v1__predict_request__pack(&q, buf);
    both_read(buf, len);
    /* no candidates, no user, no id: the empty message */
    both_read(buf, 0);
}

/* Fids unpacked, packed in two runs, mixed; fields out of order and repeated (the last
 * scalar wins); unknown fields of each wire type at every level; the slot after its fids. */
Test(request, reads_every_encoding_protobuf_allows) {
    wb_t q = {0}, sf = {0}, cand = {0}, sf2 = {0};
    /* a SlotFids: unknown varint, two unpacked fids, the slot, a packed run of two */
    tag(&sf, 7, 0);
    varint(&sf, 99);
    tag(&sf, 2, 1);
    fixed64(&sf, FID(3, 1));
    tag(&sf, 2, 1);
    fixed64(&sf, FID(3, 2));
    tag(&sf, 1, 0);
    varint(&sf, 3);
    wb_t run = {0};
    fixed64(&run, FID(3, 3));
    fixed64(&run, FID(3, 4));
    bytes(&sf, 2, &run);
    tag(&sf, 9, 5); /* unknown fixed32 */
    put(&sf, 1);
    put(&sf, 2);
    put(&sf, 3);
    put(&sf, 4);
    /* the slot written twice: 5 first (fids follow of slot 4), then 4 */
    tag(&sf2, 1, 0);
    varint(&sf2, 5);
    tag(&sf2, 2, 1);
    fixed64(&sf2, FID(4, 9));
    tag(&sf2, 1, 0);
    varint(&sf2, 4);
    /* a candidate: item, unknown bytes, item_id twice (the second wins), item again */
    bytes(&cand, 2, &sf2);
    wb_t junk = {0};
    put(&junk, 0xFF);
    put(&junk, 0xFF);
    bytes(&cand, 12, &junk);
    tag(&cand, 1, 0);
    varint(&cand, 1);
    tag(&cand, 1, 0);
    varint(&cand, 1ull << 60);
    bytes(&cand, 2, &sf);
    /* the request: a candidate before the user, the timestamp twice, an unknown fixed64,
     * the id last */
    bytes(&q, 4, &cand);
    tag(&q, 2, 0);
    varint(&q, 17);
    bytes(&q, 3, &sf);
    tag(&q, 2, 0);
    varint(&q, 18);
    tag(&q, 100000, 1);
    fixed64(&q, 0x0123456789ABCDEFull);
    bytes(&q, 4, &cand);
    wb_t id = {0};
    memcpy(id.b, "the-id", 6);
    id.n = 6;
    bytes(&q, 1, &id);
    both_read(q.b, q.n);
    /* the same request cut at every byte: whatever protobuf-c refuses is refused too, and a
     * cut protobuf-c reads (at a field's end) reads the same */
    for (size_t n = 0; n < q.n; n++) {
        Monolith__V1__PredictRequest *u = monolith__v1__predict_request__unpack(NULL, n, q.b);
        sv_req_t r = {0};
        char why[256];
        int rc = sv_req_parse(&r, q.b, n, why, sizeof(why));
        if (u) {
            monolith__v1__predict_request__free_unpacked(u, NULL);
            both_read(q.b, n);
        } else {
            cr_assert_eq(rc, SV_REQ_MALFORMED, "cut at %zu", n);
            cr_assert(strstr(why, "malformed PredictRequest"), "%s", why);
        }
        sv_req_free(&r);
    }
}

/* What protobuf-c refuses is refused, with where it went wrong. */
Test(request, refuses_what_protobuf_refuses) {
    char why[256];
    struct {
        const char *what;
        uint8_t b[16];
        size_t n;
    } cases[] = {
        {"a group", {0x0B, 0x0C}, 2},
        {"wire type 7", {0x0F, 0x00}, 2},
        {"field number 0", {0x02, 0x00}, 2},
        {"a length past the end", {0x0A, 0x05, 'a'}, 3},
        {"an endless varint",
         {0x10, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01},
         12},
        {"timestamp as bytes", {0x12, 0x00}, 2},
        {"user as a varint", {0x18, 0x01}, 2},
        {"a packed run of 7 bytes", {0x1A, 0x09, 0x12, 0x07, 1, 2, 3, 4, 5, 6, 7}, 11},
        {"fids as fixed32", {0x1A, 0x05, 0x15, 1, 2, 3, 4}, 7},
        {"a candidate's item as a varint", {0x22, 0x02, 0x10, 0x01}, 4},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        wb_t w = {0};
        memcpy(w.b, cases[i].b, cases[i].n);
        w.n = cases[i].n;
        Monolith__V1__PredictRequest *u = monolith__v1__predict_request__unpack(NULL, w.n, w.b);
        cr_expect_null(u, "%s: protobuf-c read it", cases[i].what);
        if (u) monolith__v1__predict_request__free_unpacked(u, NULL);
        cr_expect_eq(parse(&w, why, sizeof(why)), SV_REQ_MALFORMED, "%s", cases[i].what);
        cr_expect(strstr(why, "malformed PredictRequest"), "%s: %s", cases[i].what, why);
    }
}

/* Predict's own checks, made while reading: the slot fits 16 bits, each fid is of its
 * SlotFids' slot (whatever the fields' order), no NUL in the request id. */
Test(request, checks_slots_fids_and_the_id) {
    char why[256];
    wb_t sf = {0}, q = {0};
    tag(&sf, 1, 0);
    varint(&sf, 70000);
    bytes(&q, 3, &sf);
    cr_assert_eq(parse(&q, why, sizeof(why)), SV_REQ_MALFORMED);
    cr_assert(strstr(why, "user: slot 70000 is not a 16-bit slot id"), "%s", why);

    /* candidate 1's fid of slot 8 under slot 7 */
    wb_t good = {0}, bad = {0}, c0 = {0}, c1 = {0};
    tag(&good, 1, 0);
    varint(&good, 7);
    tag(&good, 2, 1);
    fixed64(&good, FID(7, 1));
    tag(&bad, 1, 0);
    varint(&bad, 7);
    tag(&bad, 2, 1);
    fixed64(&bad, FID(8, 1));
    bytes(&c0, 2, &good);
    bytes(&c1, 2, &bad);
    q.n = 0;
    bytes(&q, 4, &c0);
    bytes(&q, 4, &c1);
    cr_assert_eq(parse(&q, why, sizeof(why)), SV_REQ_MALFORMED);
    cr_assert(strstr(why, "candidate 1: fid 0x0008000000000001 is not of its SlotFids' slot 7"),
              "%s", why);

    /* a fid before its slot: checked against the slot that came last */
    wb_t late = {0};
    tag(&late, 2, 1);
    fixed64(&late, FID(7, 3));
    tag(&late, 1, 0);
    varint(&late, 7);
    q.n = 0;
    bytes(&q, 3, &late);
    both_read(q.b, q.n);
    tag(&late, 1, 0);
    varint(&late, 6); /* and now the last slot is 6 */
    q.n = 0;
    bytes(&q, 3, &late);
    cr_assert_eq(parse(&q, why, sizeof(why)), SV_REQ_MALFORMED);
    cr_assert(strstr(why, "is not of its SlotFids' slot 6"), "%s", why);

    wb_t id = {0};
    put(&id, 'a');
    put(&id, 0);
    put(&id, 'b');
    q.n = 0;
    bytes(&q, 1, &id);
    cr_assert_eq(parse(&q, why, sizeof(why)), SV_REQ_MALFORMED);
    cr_assert(strstr(why, "request_id holds a NUL byte"), "%s", why);
}

/* A reader is reused: a long request then a short one leaves nothing of the first. */
Test(request, a_reader_is_reused) {
    wb_t big = {0}, small = {0}, sf = {0}, c = {0};
    tag(&sf, 1, 0);
    varint(&sf, 2);
    tag(&sf, 2, 1);
    fixed64(&sf, FID(2, 1));
    bytes(&c, 2, &sf);
    for (int i = 0; i < 100; i++)
        bytes(&big, 4, &c);
    bytes(&small, 3, &sf);
    sv_req_t r = {0};
    char why[128];
    cr_assert_eq(sv_req_parse(&r, big.b, big.n, why, sizeof(why)), SV_REQ_OK);
    cr_assert_eq(r.n_cands, 100);
    cr_assert_eq(r.n_items, 100);
    cr_assert_eq(sv_req_parse(&r, small.b, small.n, why, sizeof(why)), SV_REQ_OK);
    cr_assert_eq(r.n_cands, 0);
    cr_assert_eq(r.n_items, 0);
    cr_assert_eq(r.n_user, 1);
    /* trimmed: only arrays grown past the bound go */
    cr_assert_eq(sv_req_parse(&r, big.b, big.n, why, sizeof(why)), SV_REQ_OK);
    sv_req_trim(&r, 1000);
    cr_assert_not_null(r.items, "arrays under the bound are kept");
    sv_req_trim(&r, 50);
    cr_assert_null(r.items);
    cr_assert_null(r.cands);
    cr_assert_not_null(r.user, "the user's array was not over 50");
    cr_assert_eq(sv_req_parse(&r, big.b, big.n, why, sizeof(why)), SV_REQ_OK, "reads again");
    cr_assert_eq(r.n_cands, 100);
    sv_req_free(&r);
    sv_req_free(&r); /* twice is harmless */
}
