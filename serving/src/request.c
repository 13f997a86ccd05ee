/*
 * request.c - a PredictRequest read in place (request.h).
 *
 * The messages (proto/monolith/v1/serving.proto, example.proto):
 *   PredictRequest { string request_id = 1; int64 timestamp_ms = 2;
 *                    repeated SlotFids user = 3; repeated Candidate candidates = 4; }
 *   Candidate      { uint64 item_id = 1; repeated SlotFids item = 2; }
 *   SlotFids       { uint32 slot = 1; repeated fixed64 fids = 2; }
 *   Impression     { string request_id = 1; int64 timestamp_ms = 2; repeated SlotFids user = 3;
 *                    repeated SlotFids item = 4; uint64 item_id = 5; float score = 6; }
 */
#include "request.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mt/err.h"
#include "mt/table.h"

/* Wire types. */
#define WT_VARINT 0
#define WT_I64    1
#define WT_LEN    2
#define WT_I32    5

/* A reader over [p, end); err names what stopped it (for messages). */
typedef struct rd {
    const uint8_t *p, *end;
    const char *err;
} rd_t;

/* The causes of a refusal, as messages say them. Tags and lengths are read as protobuf-c
 * reads them (at most 5 bytes); a field number out of protobuf's range is refused (protobuf-c
 * reads some of those as other numbers). */
#define E_CUT  "a field cut short"
#define E_TAG  "a tag over 5 bytes or a field number out of 1..2^29-1"
#define E_LEN  "a length over 5 bytes"
#define E_WT   "a group or an unknown wire type"
#define E_TYPE "a known field of another wire type"
#define E_PACK "packed fids not a multiple of 8 bytes"

static int rd_fail(rd_t *d, const char *err) {
    d->err = err;
    return -1;
}

/* @returns 0, or -1 (truncated, or longer than 10 bytes). */
static int rd_varint_slow(rd_t *d, uint64_t *v) {
    uint64_t x = 0;
    for (unsigned shift = 0; shift < 70; shift += 7) {
        if (d->p >= d->end) return rd_fail(d, E_CUT);
        uint8_t b = *d->p++;
        x |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80)) {
            *v = x;
            return 0;
        }
    }
    return rd_fail(d, E_CUT);
}

/* One-byte varints (tags, lengths under 128, small slots) take the first branch. */
static inline int rd_varint(rd_t *d, uint64_t *v) {
    if (d->p < d->end && !(*d->p & 0x80)) {
        *v = *d->p++;
        return 0;
    }
    return rd_varint_slow(d, v);
}

/* A length-delimited value: its bytes [*body, *body + *n). @returns 0 or -1. */
static inline int rd_len(rd_t *d, const uint8_t **body, size_t *n) {
    uint64_t l;
    const uint8_t *start = d->p;
    if (rd_varint(d, &l)) return -1;
    if (d->p - start > 5) return rd_fail(d, E_LEN);
    if (l > (uint64_t)(d->end - d->p)) return rd_fail(d, E_CUT);
    *body = d->p;
    *n = (size_t)l;
    d->p += l;
    return 0;
}

/* Skips a value of wire type @p wt. @returns 0, or -1 (truncated, a group, no such type). */
static int rd_skip(rd_t *d, unsigned wt) {
    uint64_t v;
    const uint8_t *b;
    size_t n;
    switch (wt) {
    case WT_VARINT: return rd_varint(d, &v);
    case WT_I64:
        if (d->end - d->p < 8) return rd_fail(d, E_CUT);
        d->p += 8;
        return 0;
    case WT_LEN: return rd_len(d, &b, &n);
    case WT_I32:
        if (d->end - d->p < 4) return rd_fail(d, E_CUT);
        d->p += 4;
        return 0;
    default: return rd_fail(d, E_WT); /* 3 and 4 (groups), 6, 7 */
    }
}

/* A field's tag. @returns 0, or -1 (truncated, over 5 bytes, field number 0 or over
 * 2^29 - 1). */
static inline int rd_tag(rd_t *d, uint32_t *field, unsigned *wt) {
    uint64_t t;
    const uint8_t *start = d->p;
    if (rd_varint(d, &t)) return -1;
    if (d->p - start > 5 || (t >> 3) == 0 || (t >> 3) > 0x1FFFFFFF) {
        d->p = start; /* messages say where the tag starts */
        return rd_fail(d, E_TAG);
    }
    *field = (uint32_t)(t >> 3);
    *wt = (unsigned)(t & 7);
    return 0;
}

/* A known field's wire type: @returns 0 if it is @p want, else -1. */
static inline int rd_want(rd_t *d, unsigned wt, unsigned want) {
    return wt == want ? 0 : rd_fail(d, E_TYPE);
}

static inline uint64_t le64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

static int grow(void **a, size_t *cap, size_t need, size_t size) {
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 16;
    while (c < need)
        c *= 2;
    void *n = realloc(*a, c * size);
    if (!n) return -1;
    *a = n;
    *cap = c;
    return 0;
}

/* The part of the request a message names: "user" (@p cand NO_CAND) or "candidate <i>". */
#define NO_CAND SIZE_MAX

static const char *where(size_t cand, char *buf, size_t len) {
    if (cand == NO_CAND) return "user";
    snprintf(buf, len, "candidate %zu", cand);
    return buf;
}

/* Reads a SlotFids message [p, p + n) into *sf: its slot, its fid count, each fid checked
 * against the slot (as they come when the slot comes first, as encoders write it; in a
 * second pass otherwise). @p cand: whose (NO_CAND: the user's), for messages. @returns SV_REQ_OK or
 * SV_REQ_MALFORMED. */
static int parse_sf(const sv_req_t *r, const uint8_t *p, size_t n, sv_sf_t *sf, size_t cand,
                    char *why, size_t whylen) {
    rd_t d = {p, p + n, NULL};
    char buf[48];
    uint32_t slot = 0;
    uint64_t nfids = 0, bad_fid = 0;
    int checked = 1;              /* every fid so far was checked against the current slot */
    int mismatch = 0, fields = 0; /* fids fields */
    const uint8_t *run = NULL;
    while (d.p < d.end) {
        uint32_t field;
        unsigned wt;
        uint64_t v;
        const uint8_t *b;
        size_t l;
        if (rd_tag(&d, &field, &wt)) goto bad;
        if (field == 2 && wt == WT_LEN) {
            if (rd_len(&d, &b, &l)) goto bad;
            if (l % 8) {
                rd_fail(&d, E_PACK);
                goto bad;
            }
            run = b;
            fields++;
            for (size_t k = 0; k < l && !mismatch; k += 8) {
                uint64_t f = le64(b + k);
                if (MT_FID_SLOT(f) != slot) {
                    mismatch = 1;
                    bad_fid = f;
                }
            }
            nfids += l / 8;
        } else if (field == 1) {
            if (rd_want(&d, wt, WT_VARINT) || rd_varint(&d, &v)) goto bad;
            if (nfids && (uint32_t)v != slot) checked = 0;
            slot = (uint32_t)v;
        } else if (field == 2 && wt == WT_I64) {
            if (d.end - d.p < 8) {
                rd_fail(&d, E_CUT);
                goto bad;
            }
            uint64_t f = le64(d.p);
            d.p += 8;
            fields++;
            if (!mismatch && MT_FID_SLOT(f) != slot) {
                mismatch = 1;
                bad_fid = f;
            }
            nfids++;
        } else if (field == 2) {
            rd_fail(&d, E_TYPE);
            goto bad;
        } else if (rd_skip(&d, wt)) {
            goto bad;
        }
    }
    if (slot > 0xFFFF) {
        mt_msgf(why, whylen, "%s: slot %u is not a 16-bit slot id", where(cand, buf, sizeof(buf)),
                slot);
        return SV_REQ_MALFORMED;
    }
    sf->off = (uint32_t)(p - r->buf);
    sf->len = (uint32_t)n;
    sf->slot = slot;
    sf->nfids = (uint32_t)nfids; /* at most n / 8 */
    sf->run = fields == 1 && run ? (uint32_t)(run - r->buf) : 0;
    if (!checked) { /* the slot changed after fids: check them all against the last one */
        sv_fids_t it;
        uint64_t f;
        mismatch = 0;
        sv_fids_begin(&it, r, sf);
        while (!mismatch && sv_fids_next(&it, &f))
            if (MT_FID_SLOT(f) != slot) {
                mismatch = 1;
                bad_fid = f;
            }
    }
    if (mismatch) {
        mt_msgf(why, whylen, "%s: fid 0x%016llx is not of its SlotFids' slot %u",
                where(cand, buf, sizeof(buf)), (unsigned long long)bad_fid, slot);
        return SV_REQ_MALFORMED;
    }
    return SV_REQ_OK;
bad:
    mt_msgf(why, whylen, "malformed PredictRequest: %s: a SlotFids: %s at byte %zu",
            where(cand, buf, sizeof(buf)), d.err, (size_t)(d.p - r->buf));
    return SV_REQ_MALFORMED;
}

/* Reads a Candidate message [p, p + n) as candidate number r->n_cands. */
static int parse_cand(sv_req_t *r, const uint8_t *p, size_t n, char *why, size_t whylen) {
    rd_t d = {p, p + n, NULL};
    char buf[48];
    if (grow((void **)&r->cands, &r->cap_cands, r->n_cands + 1, sizeof(sv_cand_t)))
        return SV_REQ_NOMEM;
    sv_cand_t *c = &r->cands[r->n_cands];
    c->item_id = 0;
    c->from = (uint32_t)r->n_items;
    while (d.p < d.end) {
        uint32_t field;
        unsigned wt;
        const uint8_t *b;
        size_t l;
        if (rd_tag(&d, &field, &wt)) goto bad;
        if (field == 1) {
            if (rd_want(&d, wt, WT_VARINT) || rd_varint(&d, &c->item_id)) goto bad;
        } else if (field == 2) {
            if (rd_want(&d, wt, WT_LEN) || rd_len(&d, &b, &l)) goto bad;
            if (grow((void **)&r->items, &r->cap_items, r->n_items + 1, sizeof(sv_sf_t)))
                return SV_REQ_NOMEM;
            int rc = parse_sf(r, b, l, &r->items[r->n_items], r->n_cands, why, whylen);
            if (rc) return rc;
            r->n_items++;
        } else if (rd_skip(&d, wt)) {
            goto bad;
        }
    }
    c->to = (uint32_t)r->n_items;
    r->n_cands++;
    return SV_REQ_OK;
bad:
    mt_msgf(why, whylen, "malformed PredictRequest: %s: %s at byte %zu",
            where(r->n_cands, buf, sizeof(buf)), d.err, (size_t)(d.p - r->buf));
    return SV_REQ_MALFORMED;
}

int sv_req_parse(sv_req_t *r, const uint8_t *buf, size_t len, char *why, size_t whylen) {
    r->buf = buf;
    r->request_id = "";
    r->request_id_len = 0;
    r->timestamp_ms = 0;
    r->n_user = r->n_items = r->n_cands = 0;
    if (len > UINT32_MAX) {
        mt_msgf(why, whylen, "malformed PredictRequest: %zu bytes", len);
        return SV_REQ_MALFORMED;
    }
    rd_t d = {buf, buf + len, NULL};
    while (d.p < d.end) {
        uint32_t field;
        unsigned wt;
        uint64_t v;
        const uint8_t *b;
        size_t l;
        int rc;
        if (rd_tag(&d, &field, &wt)) goto bad;
        switch (field) {
        case 1:
            if (rd_want(&d, wt, WT_LEN) || rd_len(&d, &b, &l)) goto bad;
            if (memchr(b, 0, l)) {
                mt_msgf(why, whylen, "request_id holds a NUL byte");
                return SV_REQ_MALFORMED;
            }
            r->request_id = (const char *)b;
            r->request_id_len = l;
            break;
        case 2:
            if (rd_want(&d, wt, WT_VARINT) || rd_varint(&d, &v)) goto bad;
            r->timestamp_ms = (int64_t)v;
            break;
        case 3:
            if (rd_want(&d, wt, WT_LEN) || rd_len(&d, &b, &l)) goto bad;
            if (grow((void **)&r->user, &r->cap_user, r->n_user + 1, sizeof(sv_sf_t)))
                return SV_REQ_NOMEM;
            rc = parse_sf(r, b, l, &r->user[r->n_user], NO_CAND, why, whylen);
            if (rc) return rc;
            r->n_user++;
            break;
        case 4:
            if (rd_want(&d, wt, WT_LEN) || rd_len(&d, &b, &l)) goto bad;
            rc = parse_cand(r, b, l, why, whylen);
            if (rc) return rc;
            break;
        default:
            if (rd_skip(&d, wt)) goto bad;
        }
    }
    return SV_REQ_OK;
bad:
    mt_msgf(why, whylen, "malformed PredictRequest: %s at byte %zu", d.err, (size_t)(d.p - buf));
    return SV_REQ_MALFORMED;
}

void sv_req_free(sv_req_t *r) {
    free(r->user);
    free(r->items);
    free(r->cands);
    r->user = r->items = NULL;
    r->cands = NULL;
    r->cap_user = r->cap_items = r->cap_cands = 0;
}

void sv_req_trim(sv_req_t *r, size_t keep) {
    if (r->cap_user > keep) {
        free(r->user);
        r->user = NULL;
        r->cap_user = r->n_user = 0;
    }
    if (r->cap_items > keep) {
        free(r->items);
        r->items = NULL;
        r->cap_items = r->n_items = 0;
    }
    if (r->cap_cands > keep) {
        free(r->cands);
        r->cands = NULL;
        r->cap_cands = r->n_cands = 0;
    }
}

void sv_fids_begin(sv_fids_t *it, const sv_req_t *r, const sv_sf_t *sf) {
    it->end = r->buf + sf->off + sf->len;
    if (sf->run) { /* one packed field: its fids, and nothing else to read */
        it->p = it->end;
        it->run = r->buf + sf->run;
        it->run_left = sf->nfids;
    } else {
        it->p = r->buf + sf->off;
        it->run = NULL;
        it->run_left = 0;
    }
}

/* The message was checked by sv_req_parse(): no field here can be truncated. */
int sv_fids_next(sv_fids_t *it, uint64_t *fid) {
    for (;;) {
        if (it->run_left) {
            *fid = le64(it->run);
            it->run += 8;
            it->run_left--;
            return 1;
        }
        if (it->p >= it->end) return 0;
        rd_t d = {it->p, it->end, NULL};
        uint32_t field = 0;
        unsigned wt = 0;
        const uint8_t *b = NULL;
        size_t l = 0;
        (void)rd_tag(&d, &field, &wt);
        if (field == 2 && wt == WT_I64) {
            *fid = le64(d.p);
            it->p = d.p + 8;
            return 1;
        }
        if (field == 2 && wt == WT_LEN) {
            (void)rd_len(&d, &b, &l);
            it->run = b;
            it->run_left = l / 8;
        } else {
            (void)rd_skip(&d, wt);
        }
        it->p = d.p;
    }
}

/* ============================== the impression ============================== */

static size_t put_varint(uint8_t *out, size_t at, uint64_t v) {
    do {
        uint8_t b = (uint8_t)(v & 0x7F);
        v >>= 7;
        if (out) out[at] = (uint8_t)(b | (v ? 0x80 : 0));
        at++;
    } while (v);
    return at;
}

static size_t put_bytes(uint8_t *out, size_t at, uint8_t tag, const uint8_t *b, size_t n) {
    if (out) out[at] = tag;
    at = put_varint(out, at + 1, n);
    if (out && n) memcpy(out + at, b, n);
    return at + n;
}

size_t sv_req_impression(const sv_req_t *r, size_t i, int64_t ts_ms, float score, uint8_t *out) {
    size_t at = 0;
    const sv_cand_t *c = &r->cands[i];
    if (r->request_id_len)
        at = put_bytes(out, at, 0x0A, (const uint8_t *)r->request_id, r->request_id_len);
    if (ts_ms) {
        if (out) out[at] = 0x10;
        at = put_varint(out, at + 1, (uint64_t)ts_ms);
    }
    for (size_t k = 0; k < r->n_user; k++)
        at = put_bytes(out, at, 0x1A, r->buf + r->user[k].off, r->user[k].len);
    for (uint32_t k = c->from; k < c->to; k++)
        at = put_bytes(out, at, 0x22, r->buf + r->items[k].off, r->items[k].len);
    if (c->item_id) {
        if (out) out[at] = 0x28;
        at = put_varint(out, at + 1, c->item_id);
    }
    if (score != 0.0f) {
        uint32_t u;
        memcpy(&u, &score, 4);
        if (out) {
            out[at] = 0x35;
            for (int k = 0; k < 4; k++)
                out[at + 1 + k] = (uint8_t)(u >> (8 * k));
        }
        at += 5;
    }
    return at;
}
