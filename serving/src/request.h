/*
 * request.h - a PredictRequest read in place, internal to mt_serving (docs/serving.md,
 * "Where a Predict's time goes").
 *
 * protobuf-c's unpack builds the request as a tree of allocations (one per SlotFids and per
 * Candidate, 1,414 for 100 candidates of 13 slots) and walks its descriptors field by field:
 * measured on a 100-candidate request of 18,889 bytes, unpack + free took 108 us of a
 * Predict's 660, a plain walk of the same bytes 7 us. sv_req_parse() walks the wire format
 * once, checks everything Predict needs checked, and records where each part is; the fids are
 * then read straight from the request's bytes (sv_fids_*), and the impression log copies the
 * SlotFids messages as they came (sv_req_impression()).
 *
 * The decoding is protobuf's (the differential fuzz target fuzz_predict_request holds it to
 * protobuf-c's on any input): fields in any order and repeated, unknown fields of every wire
 * type but groups skipped, repeated fixed64 fids packed or not (or both), the last value of a
 * scalar field winning, a uint32 field taking the low 32 bits of its varint. Stricter than
 * protobuf-c in three places, each an error: a request_id holding a NUL byte, a known field
 * with another wire type than its own (protobuf-c ignores some of those), and a request over
 * 4 GiB.
 *
 * Thread safety: an sv_req_t belongs to one thread; the functions keep no other state.
 */
#ifndef MT_SERVING_REQUEST_H
#define MT_SERVING_REQUEST_H

#include <stddef.h>
#include <stdint.h>

/* One SlotFids message: its body's place in the request and what it holds. */
typedef struct sv_sf {
    uint32_t off, len; /* the message's body (after its tag and length) */
    uint32_t slot;
    uint32_t nfids;
    uint32_t run; /* the fids' offset when they are one packed field (as encoders write them),
                     else 0 */
} sv_sf_t;

/* One Candidate: item_id and its item SlotFids, items[from, to). */
typedef struct sv_cand {
    uint64_t item_id;
    uint32_t from, to;
} sv_cand_t;

typedef struct sv_req {
    const uint8_t *buf; /* the request (borrowed until the next parse) */
    const char *request_id;
    size_t request_id_len;
    int64_t timestamp_ms;
    sv_sf_t *user, *items; /* the user's SlotFids; every candidate's, in order */
    sv_cand_t *cands;
    size_t n_user, n_items, n_cands;
    size_t cap_user, cap_items, cap_cands; /* grown by parse, kept for the next */
} sv_req_t;

/* sv_req_parse() results. */
#define SV_REQ_OK        0
#define SV_REQ_MALFORMED -1 /* not a PredictRequest (why says where) */
#define SV_REQ_NOMEM     -2

/**
 * Parses @p buf as a PredictRequest into @p r (its arrays grown as needed), checking the wire
 * format of every nested message and that each fid's top 16 bits are its SlotFids' slot
 * (which must fit 16 bits).
 * @returns SV_REQ_OK, SV_REQ_MALFORMED (a message in @p why) or SV_REQ_NOMEM; on an error @p r
 *          holds nothing usable.
 */
int sv_req_parse(sv_req_t *r, const uint8_t *buf, size_t len, char *why, size_t whylen);

/** Frees the arrays of @p r (not @p r itself). */
void sv_req_free(sv_req_t *r);

/** Frees the arrays of @p r grown past @p keep entries (a request of many tiny messages:
 *  a 16 MiB one of empty SlotFids grows them to 128 MiB), so that a reused reader keeps
 *  what ordinary requests need. */
void sv_req_trim(sv_req_t *r, size_t keep);

/* The fids of a parsed SlotFids, in order. */
typedef struct sv_fids {
    const uint8_t *p, *end; /* the fields left */
    const uint8_t *run;     /* a packed field's fids left */
    size_t run_left;
} sv_fids_t;

void sv_fids_begin(sv_fids_t *it, const sv_req_t *r, const sv_sf_t *sf);

/** The next fid into *fid. @returns 1, or 0 at the end. */
int sv_fids_next(sv_fids_t *it, uint64_t *fid);

/**
 * The bytes of an Impression of candidate @p i: request_id, @p ts_ms, the user's and the
 * candidate's SlotFids as they came in the request, item_id and @p score. @p out NULL: only
 * the size.
 * @returns the size.
 */
size_t sv_req_impression(const sv_req_t *r, size_t i, int64_t ts_ms, float score, uint8_t *out);

#endif /* MT_SERVING_REQUEST_H */
