/*
 * fuzz_predict_request.c - serving's in-place PredictRequest reader (serving/src/request.c)
 * held to protobuf-c's decoder on any input (a differential target).
 *
 * For every input: what protobuf-c refuses, the reader refuses; what protobuf-c reads, the
 * reader reads the same (request id, timestamp, each SlotFids' slot and fids in order, each
 * candidate's item id and SlotFids), or refuses it for one of the reasons request.h names
 * (a slot over 16 bits, a fid not of its SlotFids' slot, a NUL in the request id: each checked
 * here against protobuf-c's reading). Each candidate's impression, as the reader writes it,
 * must decode with protobuf-c to the same parts. Any other disagreement aborts.
 */
#include <stdio.h>
#include <string.h>

#include "fuzz_common.h"
#include "monolith/v1/example.pb-c.h"
#include "monolith/v1/serving.pb-c.h"
#include "request.h"

static void disagree(const char *what) {
    fprintf(stderr, "fuzz_predict_request: the decoders disagree: %s\n", what);
    abort();
}

/* Does protobuf-c's reading hold a reason for the reader's refusal? */
static int sf_bad(Monolith__V1__SlotFids *const *sf, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (sf[i]->slot > 0xFFFF) return 1;
        for (size_t k = 0; k < sf[i]->n_fids; k++)
            if ((sf[i]->fids[k] >> 48) != sf[i]->slot) return 1;
    }
    return 0;
}

static int refusal_explained(const Monolith__V1__PredictRequest *u, const uint8_t *data,
                             size_t size, const char *why) {
    if (strstr(why, "request_id holds a NUL byte"))
        return memchr(data, 0, size) != NULL; /* the id's bytes are not kept by protobuf-c */
    /* a field number protobuf-c reads as another (request.h): the tag starting where the
     * message says must be one */
    if (strstr(why, "a tag over 5 bytes or a field number out of 1..2^29-1")) {
        const char *at = strstr(why, "at byte ");
        size_t start = at ? strtoull(at + 8, NULL, 10) : size, i = start;
        uint64_t t = 0;
        for (; i < size && i - start < 10; i++) {
            t |= (uint64_t)(data[i] & 0x7F) << (7 * (i - start));
            if (!(data[i] & 0x80)) break;
        }
        if (i >= size) return 0; /* no whole tag there */
        return i + 1 - start > 5 || (t >> 3) == 0 || (t >> 3) > 0x1FFFFFFF;
    }
    if (sf_bad(u->user, u->n_user)) return 1;
    for (size_t c = 0; c < u->n_candidates; c++)
        if (sf_bad(u->candidates[c]->item, u->candidates[c]->n_item)) return 1;
    return 0;
}

static void same_sf(const sv_req_t *r, const sv_sf_t *sf, const Monolith__V1__SlotFids *u) {
    if (sf->slot != u->slot || sf->nfids != u->n_fids) disagree("a SlotFids' slot or size");
    sv_fids_t it;
    uint64_t f;
    size_t k = 0;
    sv_fids_begin(&it, r, sf);
    while (sv_fids_next(&it, &f)) {
        if (k >= u->n_fids || f != u->fids[k]) disagree("a fid");
        k++;
    }
    if (k != u->n_fids) disagree("a SlotFids' fid count");
}

static void same_sfs(Monolith__V1__SlotFids *const *a, size_t na, Monolith__V1__SlotFids *const *b,
                     size_t nb) {
    if (na != nb) disagree("an impression's SlotFids count");
    for (size_t i = 0; i < na; i++) {
        if (a[i]->slot != b[i]->slot || a[i]->n_fids != b[i]->n_fids ||
            (a[i]->n_fids && memcmp(a[i]->fids, b[i]->fids, 8 * a[i]->n_fids)))
            disagree("an impression's SlotFids");
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static sv_req_t r; /* reused across inputs, as a worker reuses it */
    char why[256] = "";
    int rc = sv_req_parse(&r, data, size, why, sizeof(why));
    Monolith__V1__PredictRequest *u = monolith__v1__predict_request__unpack(NULL, size, data);
    if (!u) {
        if (rc == SV_REQ_OK) disagree("protobuf-c refused what the reader read");
        return 0;
    }
    if (rc != SV_REQ_OK) {
        if (rc == SV_REQ_MALFORMED && !refusal_explained(u, data, size, why)) disagree(why);
        monolith__v1__predict_request__free_unpacked(u, NULL);
        return 0;
    }
    if (r.request_id_len != strlen(u->request_id) ||
        memcmp(r.request_id, u->request_id, r.request_id_len))
        disagree("request_id");
    if (r.timestamp_ms != u->timestamp_ms) disagree("timestamp_ms");
    if (r.n_user != u->n_user || r.n_cands != u->n_candidates) disagree("counts");
    for (size_t i = 0; i < r.n_user; i++)
        same_sf(&r, &r.user[i], u->user[i]);
    for (size_t c = 0; c < r.n_cands; c++) {
        const Monolith__V1__Candidate *uc = u->candidates[c];
        if (r.cands[c].item_id != uc->item_id) disagree("item_id");
        if (r.cands[c].to - r.cands[c].from != uc->n_item) disagree("a candidate's SlotFids");
        for (size_t k = 0; k < uc->n_item; k++)
            same_sf(&r, &r.items[r.cands[c].from + k], uc->item[k]);
        size_t il = sv_req_impression(&r, c, 99, 0.5f, NULL);
        uint8_t *ib = malloc(il ? il : 1);
        if (!ib) abort();
        if (sv_req_impression(&r, c, 99, 0.5f, ib) != il) disagree("an impression's size");
        Monolith__V1__Impression *im = monolith__v1__impression__unpack(NULL, il, ib);
        if (!im) disagree("an impression protobuf-c cannot read");
        if (strcmp(im->request_id, u->request_id) || im->timestamp_ms != 99 ||
            im->item_id != uc->item_id || im->score != 0.5f)
            disagree("an impression's scalars");
        same_sfs(im->user, im->n_user, u->user, u->n_user);
        same_sfs(im->item, im->n_item, uc->item, uc->n_item);
        monolith__v1__impression__free_unpacked(im, NULL);
        free(ib);
    }
    monolith__v1__predict_request__free_unpacked(u, NULL);
    return 0;
}
