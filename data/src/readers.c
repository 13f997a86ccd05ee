/*
 * readers.c - see mt/readers.h.
 *
 * One reader type, three line parsers. mt_reader_next() reads a line, splits it into fields
 * (in place: quoted fields are unescaped inside the line buffer), lets the format's parser
 * collect the fids of each slot into per-slot scratch vectors, and appends the example with
 * mt_batch_add(). A parser returns MT_CORRUPT for a bad line with the reason written into
 * r->reason; mt_reader_next() counts it and goes on.
 *
 * MovieLens side tables are dense arrays indexed by id (ids are small integers there);
 * ids above MT__ML_MAX_ID in a side file are counted as bad side lines.
 */
#include "mt/readers.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------- */
/* Types                                                                                    */
/* ---------------------------------------------------------------------------------------- */

#define MT__ML_MAX_ID (1u << 24)
#define MT__FID_MAX   ((int64_t)1 << 48)

typedef struct field {
    char *p;
    size_t len;
} field_t;

typedef enum reader_kind { K_CRITEO, K_MOVIELENS, K_CSV } reader_kind_t;

typedef struct ml_user {
    bool present;
    uint64_t age_fid, gender_fid, occupation_fid;
} ml_user_t;

typedef struct ml_item {
    uint32_t off, cnt; /* into genre_pool */
} ml_item_t;

typedef struct csv_slot_rt {
    size_t col;
    uint32_t slot_idx;
    uint16_t slot_id;
    mt_csv_value_kind_t kind;
    bool multi;
} csv_slot_rt_t;

struct mt_reader {
    reader_kind_t kind;
    FILE *in;
    bool owns_in;

    /* the current line and its fields */
    char *line;
    size_t line_cap, line_len;
    field_t *fields;
    size_t nfields, fields_cap;
    char reason[96];

    /* slots and per-slot scratch fids of the current example */
    uint16_t *slot_ids;
    uint32_t nslots;
    uint64_t **sfids;
    uint32_t *scnt, *scap;

    mt_reader_stats_t stats;
    mt_reader_bad_line_cb cb;
    void *cb_opaque;

    /* Criteo */
    bool has_label;

    /* MovieLens */
    mt_movielens_format_t ml_format;
    float positive_rating;
    int ml_age_idx, ml_genres_idx; /* slot index, -1 when not configured */
    ml_user_t *users;
    size_t nusers;
    ml_item_t *items;
    size_t nitems;
    uint64_t *genre_pool;
    size_t npool, cap_pool;

    /* generic CSV */
    char delim, quote, multi_sep;
    bool strict;
    size_t expect_cols; /* 0 = not known yet */
    mt_csv_label_kind_t label_kind;
    size_t label_cols[MT_BATCH_MAX_TASKS]; /* each task's label column ([0]: cfg->label) */
    uint32_t ntasks;                       /* labels per example (1 but for task_labels) */
    double label_threshold;
    char **pos_labels;
    size_t npos_labels;
    mt_csv_time_unit_t time_unit;
    size_t time_col;
    csv_slot_rt_t *cs;
    size_t ncs;
    size_t text_col[MT_CSV_MAX_TEXT_COLUMNS];
    size_t ntext;
    char *text_buf; /* the text columns of the last parsed line, each NUL-terminated */
    size_t text_cap, text_off[MT_CSV_MAX_TEXT_COLUMNS], text_len[MT_CSV_MAX_TEXT_COLUMNS];
    bool have_text;
};

/* ---------------------------------------------------------------------------------------- */
/* Private helpers                                                                          */
/* ---------------------------------------------------------------------------------------- */

__attribute__((format(printf, 2, 3))) static mt_err_t bad(mt_reader_t *r, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->reason, sizeof(r->reason), fmt, ap);
    va_end(ap);
    return MT_CORRUPT;
}

static void record_bad(mt_reader_t *r) {
    mt_reader_stats_t *st = &r->stats;
    st->bad_lines++;
    st->last_bad_line = st->lines;
    if (st->nbad_kept < MT_READER_BAD_KEPT) {
        mt_reader_bad_line_t *e = &st->bad[st->nbad_kept++];
        e->line = st->lines;
        snprintf(e->reason, sizeof(e->reason), "%s", r->reason);
    }
    if (r->cb) r->cb(r->cb_opaque, st->lines, r->reason);
}

/* Shows at most 24 bytes of a field in a reason. */
#define SHOW(f) (int)((f).len < 24 ? (f).len : 24), (f).p

/* Reads one line into r->line without its '\n' / "\r\n". @returns 1, 0 at EOF, -1 on error. */
static int read_line(mt_reader_t *r, FILE *in) {
    errno = 0;
    ssize_t n = getline(&r->line, &r->line_cap, in);
    if (n < 0) return ferror(in) ? -1 : 0;
    size_t len = (size_t)n;
    if (len && r->line[len - 1] == '\n') len--;
    if (len && r->line[len - 1] == '\r') len--;
    r->line[len] = '\0';
    r->line_len = len;
    return 1;
}

static mt_err_t push_field(mt_reader_t *r, char *p, size_t len) {
    if (r->nfields == r->fields_cap) {
        size_t c = r->fields_cap ? 2 * r->fields_cap : 64;
        field_t *nf = realloc(r->fields, c * sizeof(field_t));
        if (!nf) return MT_NOMEM;
        r->fields = nf;
        r->fields_cap = c;
    }
    r->fields[r->nfields++] = (field_t){p, len};
    return MT_OK;
}

/*
 * Splits s[0..len) on @p delim into r->fields. With @p quote, a field starting with it runs to
 * the closing quote ("" inside = one quote) and is unescaped in place.
 * @returns MT_OK, MT_CORRUPT (bad quoting, reason set), MT_NOMEM.
 */
static mt_err_t split(mt_reader_t *r, char *s, size_t len, char delim, char quote) {
    r->nfields = 0;
    size_t i = 0;
    for (;;) {
        char *start;
        size_t flen;
        if (quote && i < len && s[i] == quote) {
            size_t w = ++i;
            bool closed = false;
            start = s + i;
            while (i < len) {
                if (s[i] == quote) {
                    if (i + 1 < len && s[i + 1] == quote) {
                        s[w++] = quote;
                        i += 2;
                        continue;
                    }
                    i++;
                    closed = true;
                    break;
                }
                s[w++] = s[i++];
            }
            if (!closed) return bad(r, "field %zu: unterminated quote", r->nfields + 1);
            if (i < len && s[i] != delim)
                return bad(r, "field %zu: text after the closing quote", r->nfields + 1);
            flen = (size_t)(s + w - start);
        } else {
            start = s + i;
            while (i < len && s[i] != delim)
                i++;
            flen = (size_t)(s + i - start);
        }
        if (push_field(r, start, flen)) return MT_NOMEM;
        if (i >= len) break;
        i++; /* the delimiter */
    }
    return MT_OK;
}

static bool parse_i64(field_t f, int64_t *out) {
    char buf[32];
    if (f.len == 0 || f.len >= sizeof(buf)) return false;
    memcpy(buf, f.p, f.len);
    buf[f.len] = '\0';
    char *end;
    errno = 0;
    long long v = strtoll(buf, &end, 10);
    if (errno || end != buf + f.len) return false;
    *out = (int64_t)v;
    return true;
}

static bool parse_double(field_t f, double *out) {
    char buf[64];
    if (f.len == 0 || f.len >= sizeof(buf)) return false;
    memcpy(buf, f.p, f.len);
    buf[f.len] = '\0';
    char *end;
    errno = 0;
    double v = strtod(buf, &end);
    if (errno || end != buf + f.len || !isfinite(v)) return false;
    *out = v;
    return true;
}

static mt_err_t push_fid(mt_reader_t *r, uint32_t s, uint64_t fid) {
    if (r->scnt[s] == r->scap[s]) {
        uint32_t c = r->scap[s] ? 2 * r->scap[s] : 8;
        uint64_t *nf = realloc(r->sfids[s], c * sizeof(uint64_t));
        if (!nf) return MT_NOMEM;
        r->sfids[s] = nf;
        r->scap[s] = c;
    }
    r->sfids[s][r->scnt[s]++] = fid;
    return MT_OK;
}

static mt_err_t reader_new(reader_kind_t kind, const char *path, FILE *in, uint32_t nslots,
                           mt_reader_t **out) {
    *out = NULL;
    if (!in && !path) return MT_INVALID;
    mt_reader_t *r = calloc(1, sizeof(*r));
    if (!r) return MT_NOMEM;
    r->kind = kind;
    r->ml_age_idx = r->ml_genres_idx = -1;
    if (nslots) {
        r->nslots = nslots;
        r->slot_ids = calloc(nslots, sizeof(uint16_t));
        r->sfids = calloc(nslots, sizeof(uint64_t *));
        r->scnt = calloc(nslots, sizeof(uint32_t));
        r->scap = calloc(nslots, sizeof(uint32_t));
        if (!r->slot_ids || !r->sfids || !r->scnt || !r->scap) {
            mt_reader_destroy(r);
            return MT_NOMEM;
        }
    }
    if (in) {
        r->in = in;
    } else {
        r->in = fopen(path, "rb");
        if (!r->in) {
            mt_reader_destroy(r);
            return MT_IO;
        }
        r->owns_in = true;
    }
    *out = r;
    return MT_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Criteo                                                                                   */
/* ---------------------------------------------------------------------------------------- */

void mt_criteo_config_init(mt_criteo_config_t *cfg) {
    cfg->has_label = true;
}

uint64_t mt_criteo_bucket(int64_t v) {
    if (v < 0) return MT_CRITEO_BUCKET_NEG + (v < -999 ? 999u : (uint64_t)-v);
    if (v <= 2) return (uint64_t)v;
    double l = log((double)v);
    return (uint64_t)floor(l * l);
}

static mt_err_t criteo_parse(mt_reader_t *r, float *label, int64_t *ts) {
    mt_err_t err = split(r, r->line, r->line_len, '\t', 0);
    if (err) return err;
    size_t want = MT_CRITEO_NSLOTS + (r->has_label ? 1u : 0u);
    if (r->nfields != want) return bad(r, "expected %zu columns, got %zu", want, r->nfields);
    size_t off = 0;
    *label = 0;
    *ts = 0;
    if (r->has_label) {
        field_t f = r->fields[0];
        if (f.len != 1 || (f.p[0] != '0' && f.p[0] != '1'))
            return bad(r, "label '%.*s' is not 0 or 1", SHOW(f));
        *label = f.p[0] == '1' ? 1.0f : 0.0f;
        off = 1;
    }
    for (uint32_t j = 0; j < MT_CRITEO_NINT; j++) {
        field_t f = r->fields[off + j];
        uint64_t bucket = MT_CRITEO_BUCKET_EMPTY;
        int64_t v;
        if (f.len) {
            if (!parse_i64(f, &v)) return bad(r, "I%u '%.*s' is not an integer", j + 1, SHOW(f));
            bucket = mt_criteo_bucket(v);
        }
        if (push_fid(r, j, mt_fid_of_int(r->slot_ids[j], bucket))) return MT_NOMEM;
    }
    for (uint32_t j = 0; j < MT_CRITEO_NCAT; j++) {
        field_t f = r->fields[off + MT_CRITEO_NINT + j];
        uint32_t s = MT_CRITEO_NINT + j;
        if (f.len && push_fid(r, s, mt_fid_of_bytes(r->slot_ids[s], f.p, f.len))) return MT_NOMEM;
    }
    return MT_OK;
}

mt_err_t mt_reader_criteo_open(const mt_criteo_config_t *cfg, const char *path, FILE *in,
                               mt_reader_t **out) {
    mt_criteo_config_t def;
    if (!cfg) {
        mt_criteo_config_init(&def);
        cfg = &def;
    }
    mt_err_t err = reader_new(K_CRITEO, path, in, MT_CRITEO_NSLOTS, out);
    if (err) return err;
    mt_reader_t *r = *out;
    for (uint32_t s = 0; s < MT_CRITEO_NSLOTS; s++)
        r->slot_ids[s] = (uint16_t)(s + 1);
    r->has_label = cfg->has_label;
    return MT_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* MovieLens                                                                                */
/* ---------------------------------------------------------------------------------------- */

void mt_movielens_config_init(mt_movielens_config_t *cfg) {
    memset(cfg, 0, sizeof(*cfg));
    cfg->format = MT_MOVIELENS_100K;
    cfg->positive_rating = 4.0f;
}

static uint64_t age_bucket(int64_t age) {
    static const int64_t lo[] = {18, 25, 35, 45, 50, 56};
    uint64_t b = 1;
    for (size_t i = 0; i < sizeof(lo) / sizeof(lo[0]); i++)
        if (age >= lo[i]) b = (uint64_t)lo[i];
    return b;
}

/* Parses an id of a side file; false when it is not a usable id. */
static bool side_id(field_t f, size_t *id) {
    int64_t v;
    if (!parse_i64(f, &v) || v < 0 || v >= (int64_t)MT__ML_MAX_ID) return false;
    *id = (size_t)v;
    return true;
}

static mt_err_t grow_zeroed(void **p, size_t *n, size_t need, size_t elem) {
    if (need <= *n) return MT_OK;
    size_t c = *n ? *n : 1024;
    while (c < need)
        c *= 2;
    void *np = realloc(*p, c * elem);
    if (!np) return MT_NOMEM;
    memset((char *)np + *n * elem, 0, (c - *n) * elem);
    *p = np;
    *n = c;
    return MT_OK;
}

static mt_err_t pool_push(mt_reader_t *r, uint64_t fid) {
    if (r->npool == r->cap_pool) {
        size_t c = r->cap_pool ? 2 * r->cap_pool : 1024;
        uint64_t *np = realloc(r->genre_pool, c * sizeof(uint64_t));
        if (!np) return MT_NOMEM;
        r->genre_pool = np;
        r->cap_pool = c;
    }
    r->genre_pool[r->npool++] = fid;
    return MT_OK;
}

/* One line of u.user: id|age|gender|occupation|zip. @returns MT_CORRUPT when bad. */
static mt_err_t ml_user_line(mt_reader_t *r) {
    size_t id;
    int64_t age;
    mt_err_t err = split(r, r->line, r->line_len, '|', 0);
    if (err) return err;
    if (r->nfields < 4 || !side_id(r->fields[0], &id) || !parse_i64(r->fields[1], &age))
        return MT_CORRUPT;
    if (grow_zeroed((void **)&r->users, &r->nusers, id + 1, sizeof(ml_user_t))) return MT_NOMEM;
    ml_user_t *u = &r->users[id];
    u->present = true;
    u->age_fid = mt_fid_of_int(MT_ML_SLOT_AGE, age_bucket(age));
    u->gender_fid = mt_fid_of_bytes(MT_ML_SLOT_GENDER, r->fields[2].p, r->fields[2].len);
    u->occupation_fid = mt_fid_of_bytes(MT_ML_SLOT_OCCUPATION, r->fields[3].p, r->fields[3].len);
    return MT_OK;
}

/*
 * One line of u.item (id|title|date|video date|url|19 flags: the last 19 fields are taken,
 * so a '|' in a title does no harm) or movies.csv (movieId,title,genres; header skipped).
 */
static mt_err_t ml_item_line(mt_reader_t *r, bool first) {
    size_t id;
    bool latest = r->ml_format == MT_MOVIELENS_LATEST;
    mt_err_t err = split(r, r->line, r->line_len, latest ? ',' : '|', latest ? '"' : 0);
    if (err) return err;
    if (r->nfields < 1 || !side_id(r->fields[0], &id)) {
        if (first && latest) return MT_OK; /* the header */
        return MT_CORRUPT;
    }
    if (grow_zeroed((void **)&r->items, &r->nitems, id + 1, sizeof(ml_item_t))) return MT_NOMEM;
    size_t off = r->npool;
    if (latest) {
        if (r->nfields != 3) return MT_CORRUPT;
        field_t g = r->fields[2];
        size_t i = 0;
        while (i <= g.len) {
            size_t j = i;
            while (j < g.len && g.p[j] != '|')
                j++;
            static const char none[] = "(no genres listed)";
            bool is_none = j - i == sizeof(none) - 1 && !memcmp(g.p + i, none, j - i);
            if (j > i && !is_none &&
                pool_push(r, mt_fid_of_bytes(MT_ML_SLOT_GENRES, g.p + i, j - i)))
                return MT_NOMEM;
            i = j + 1;
        }
    } else {
        if (r->nfields < 24) return MT_CORRUPT;
        for (size_t k = 0; k < 19; k++) {
            field_t f = r->fields[r->nfields - 19 + k];
            if (f.len != 1 || (f.p[0] != '0' && f.p[0] != '1')) {
                r->npool = off;
                return MT_CORRUPT;
            }
            if (f.p[0] == '1' && pool_push(r, mt_fid_of_int(MT_ML_SLOT_GENRES, k))) return MT_NOMEM;
        }
    }
    if (r->npool - off > UINT32_MAX || r->npool > UINT32_MAX) return MT_NOMEM;
    r->items[id].off = (uint32_t)off;
    r->items[id].cnt = (uint32_t)(r->npool - off);
    return MT_OK;
}

static mt_err_t ml_load_side(mt_reader_t *r, const char *path, bool users) {
    FILE *f = fopen(path, "rb");
    if (!f) return MT_IO;
    mt_err_t err = MT_OK;
    bool first = true;
    int rc;
    while ((rc = read_line(r, f)) == 1) {
        if (r->line_len == 0) continue;
        err = users ? ml_user_line(r) : ml_item_line(r, first);
        first = false;
        if (err == MT_CORRUPT) {
            r->stats.side_bad_lines++;
            err = MT_OK;
        }
        if (err) goto out;
    }
    if (rc < 0) err = MT_IO;
out:
    fclose(f);
    return err;
}

static mt_err_t ml_parse(mt_reader_t *r, float *label, int64_t *ts) {
    bool latest = r->ml_format == MT_MOVIELENS_LATEST;
    mt_err_t err = split(r, r->line, r->line_len, latest ? ',' : '\t', latest ? '"' : 0);
    if (err) return err;
    if (r->nfields != 4) return bad(r, "expected 4 columns, got %zu", r->nfields);
    int64_t user, item, t;
    double rating;
    if (!parse_i64(r->fields[0], &user) || user < 0 || user >= MT__FID_MAX)
        return bad(r, "user id '%.*s' is not an id", SHOW(r->fields[0]));
    if (!parse_i64(r->fields[1], &item) || item < 0 || item >= MT__FID_MAX)
        return bad(r, "item id '%.*s' is not an id", SHOW(r->fields[1]));
    if (!parse_double(r->fields[2], &rating))
        return bad(r, "rating '%.*s' is not a number", SHOW(r->fields[2]));
    if (!parse_i64(r->fields[3], &t) || t < -9000000000000LL || t > 9000000000000LL)
        return bad(r, "timestamp '%.*s' is not unix seconds", SHOW(r->fields[3]));
    *label = rating >= r->positive_rating ? 1.0f : 0.0f;
    *ts = t * 1000;
    if (push_fid(r, 0, mt_fid_of_int(MT_ML_SLOT_USER, (uint64_t)user)) ||
        push_fid(r, 1, mt_fid_of_int(MT_ML_SLOT_ITEM, (uint64_t)item)))
        return MT_NOMEM;
    if (r->ml_age_idx >= 0 && (size_t)user < r->nusers && r->users[user].present) {
        const ml_user_t *u = &r->users[user];
        uint32_t s = (uint32_t)r->ml_age_idx;
        if (push_fid(r, s, u->age_fid) || push_fid(r, s + 1, u->gender_fid) ||
            push_fid(r, s + 2, u->occupation_fid))
            return MT_NOMEM;
    }
    if (r->ml_genres_idx >= 0 && (size_t)item < r->nitems) {
        const ml_item_t *it = &r->items[item];
        for (uint32_t k = 0; k < it->cnt; k++)
            if (push_fid(r, (uint32_t)r->ml_genres_idx, r->genre_pool[it->off + k]))
                return MT_NOMEM;
    }
    return MT_OK;
}

mt_err_t mt_reader_movielens_open(const mt_movielens_config_t *cfg, const char *path, FILE *in,
                                  mt_reader_t **out) {
    mt_movielens_config_t def;
    if (!cfg) {
        mt_movielens_config_init(&def);
        cfg = &def;
    }
    *out = NULL;
    if (cfg->format != MT_MOVIELENS_100K && cfg->format != MT_MOVIELENS_LATEST) return MT_CONFIG;
    if (cfg->users_path && cfg->format == MT_MOVIELENS_LATEST) return MT_CONFIG;
    if (!isfinite(cfg->positive_rating)) return MT_CONFIG;
    uint32_t nslots = 2 + (cfg->users_path ? 3u : 0u) + (cfg->items_path ? 1u : 0u);
    mt_reader_t *r;
    mt_err_t err = reader_new(K_MOVIELENS, path, in, nslots, &r);
    if (err) return err;
    r->ml_format = cfg->format;
    r->positive_rating = cfg->positive_rating;
    uint32_t s = 0;
    r->slot_ids[s++] = MT_ML_SLOT_USER;
    r->slot_ids[s++] = MT_ML_SLOT_ITEM;
    if (cfg->users_path) {
        r->ml_age_idx = (int)s;
        r->slot_ids[s++] = MT_ML_SLOT_AGE;
        r->slot_ids[s++] = MT_ML_SLOT_GENDER;
        r->slot_ids[s++] = MT_ML_SLOT_OCCUPATION;
        if ((err = ml_load_side(r, cfg->users_path, true))) goto out;
    }
    if (cfg->items_path) {
        r->ml_genres_idx = (int)s;
        r->slot_ids[s++] = MT_ML_SLOT_GENRES;
        if ((err = ml_load_side(r, cfg->items_path, false))) goto out;
    }
out:
    if (err) {
        mt_reader_destroy(r);
        return err;
    }
    *out = r;
    return MT_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Generic CSV / TSV                                                                        */
/* ---------------------------------------------------------------------------------------- */

void mt_csv_config_init(mt_csv_config_t *cfg) {
    memset(cfg, 0, sizeof(*cfg));
    cfg->delimiter = ',';
    cfg->quote = '"';
    cfg->header = true;
    cfg->multi_sep = '|';
    cfg->strict_columns = true;
    cfg->label_kind = MT_CSV_LABEL_NONE;
    cfg->label = (mt_csv_column_t){-1, NULL};
    cfg->time_unit = MT_CSV_TIME_NONE;
    cfg->timestamp = (mt_csv_column_t){-1, NULL};
}

#define CFG_ERR(...)                                                 \
    do {                                                             \
        if (errbuf && errlen) snprintf(errbuf, errlen, __VA_ARGS__); \
        return MT_CONFIG;                                            \
    } while (0)

static mt_err_t check_column(const mt_csv_config_t *cfg, mt_csv_column_t c, const char *what,
                             char *errbuf, size_t errlen) {
    if (c.name) {
        if (!cfg->header) CFG_ERR("%s: column '%s' by name needs header = true", what, c.name);
    } else if (c.index < 0 || c.index >= (1 << 20)) {
        CFG_ERR("%s: column index %d out of range [0, 2^20)", what, c.index);
    }
    return MT_OK;
}

/* The name of text column @p i in messages. */
static void text_what(const mt_csv_config_t *cfg, size_t i, char *out, size_t len) {
    if (cfg->text_names && cfg->text_names[i])
        snprintf(out, len, "%s", cfg->text_names[i]);
    else
        snprintf(out, len, "text_columns[%zu]", i);
}

mt_err_t mt_csv_config_validate(const mt_csv_config_t *cfg, char *errbuf, size_t errlen) {
    if (!cfg) CFG_ERR("no config");
    if (!cfg->delimiter || cfg->delimiter == '\n' || cfg->delimiter == '\r')
        CFG_ERR("delimiter must be a character other than NUL, CR or LF");
    if (cfg->quote && (cfg->quote == cfg->delimiter || cfg->quote == '\n' || cfg->quote == '\r'))
        CFG_ERR("quote must differ from the delimiter and line ends");
    if (!cfg->slots || cfg->nslots_cfg == 0) CFG_ERR("no slots configured");
    if (cfg->nslots_cfg > 65536) CFG_ERR("too many slots (%zu)", cfg->nslots_cfg);
    mt_err_t err;
    switch (cfg->label_kind) {
    case MT_CSV_LABEL_NONE: break;
    case MT_CSV_LABEL_THRESHOLD:
        if (!isfinite(cfg->label_threshold)) CFG_ERR("label_threshold is not finite");
        if ((err = check_column(cfg, cfg->label, "label", errbuf, errlen))) return err;
        break;
    case MT_CSV_LABEL_STRINGS:
        if (!cfg->positive_labels || cfg->npositive_labels == 0)
            CFG_ERR("label_kind STRINGS needs positive_labels");
        for (size_t i = 0; i < cfg->npositive_labels; i++)
            if (!cfg->positive_labels[i]) CFG_ERR("positive_labels[%zu] is NULL", i);
        if ((err = check_column(cfg, cfg->label, "label", errbuf, errlen))) return err;
        break;
    default: CFG_ERR("unknown label_kind %d", (int)cfg->label_kind);
    }
    if (cfg->ntask_labels) {
        if (cfg->ntask_labels > MT_BATCH_MAX_TASKS - 1)
            CFG_ERR("task_labels: %zu columns, at most %d", cfg->ntask_labels,
                    MT_BATCH_MAX_TASKS - 1);
        if (cfg->label_kind == MT_CSV_LABEL_NONE || !cfg->task_labels)
            CFG_ERR("task_labels need a label");
        for (size_t t = 0; t < cfg->ntask_labels; t++) {
            mt_err_t e = check_column(cfg, cfg->task_labels[t], "task_labels", errbuf, errlen);
            if (e) return e;
        }
    }
    switch (cfg->time_unit) {
    case MT_CSV_TIME_NONE: break;
    case MT_CSV_TIME_S:
    case MT_CSV_TIME_MS:
        if ((err = check_column(cfg, cfg->timestamp, "timestamp", errbuf, errlen))) return err;
        break;
    default: CFG_ERR("unknown time_unit %d", (int)cfg->time_unit);
    }
    for (size_t i = 0; i < cfg->nslots_cfg; i++) {
        const mt_csv_slot_t *s = &cfg->slots[i];
        char what[32];
        snprintf(what, sizeof(what), "slots[%zu]", i);
        if ((err = check_column(cfg, s->column, what, errbuf, errlen))) return err;
        if (s->kind != MT_CSV_INT && s->kind != MT_CSV_STRING)
            CFG_ERR("slots[%zu]: unknown kind %d", i, (int)s->kind);
        if (s->multi && (!cfg->multi_sep || cfg->multi_sep == cfg->delimiter))
            CFG_ERR("slots[%zu]: multi needs a multi_sep other than the delimiter", i);
    }
    if (cfg->ntext_columns > MT_CSV_MAX_TEXT_COLUMNS)
        CFG_ERR("too many text columns (%zu, at most %d)", cfg->ntext_columns,
                MT_CSV_MAX_TEXT_COLUMNS);
    if (cfg->ntext_columns && !cfg->text_columns) CFG_ERR("text_columns is NULL");
    for (size_t i = 0; i < cfg->ntext_columns; i++) {
        char what[64];
        text_what(cfg, i, what, sizeof(what));
        if ((err = check_column(cfg, cfg->text_columns[i], what, errbuf, errlen))) return err;
    }
    return MT_OK;
}

/* Resolves a column against the header fields in r->fields (when it has a name); the
 * message of an unknown name says @p what it was for and lists (the start of) the header. */
static mt_err_t resolve(mt_reader_t *r, mt_csv_column_t c, const char *what, size_t *col,
                        char *errbuf, size_t errlen) {
    if (!c.name) {
        *col = (size_t)c.index;
        return MT_OK;
    }
    size_t nlen = strlen(c.name);
    for (size_t i = 0; i < r->nfields; i++) {
        if (r->fields[i].len == nlen && !memcmp(r->fields[i].p, c.name, nlen)) {
            *col = i;
            return MT_OK;
        }
    }
    if (r->nfields == 0) CFG_ERR("%s: column '%s': the input has no header line", what, c.name);
    char have[160];
    size_t o = 0;
    have[0] = '\0';
    for (size_t i = 0; i < r->nfields && o + 1 < sizeof(have); i++) {
        int w = snprintf(have + o, sizeof(have) - o, "%s%.*s", i ? ", " : "", SHOW(r->fields[i]));
        if (w < 0) break;
        o += (size_t)w; /* past the end when truncated: the loop stops */
    }
    CFG_ERR("%s: column '%s' is not in the header (%s)", what, c.name, have);
}

static mt_err_t csv_read_header(mt_reader_t *r, char *errbuf, size_t errlen) {
    int rc = read_line(r, r->in);
    if (rc < 0) {
        if (errbuf && errlen) snprintf(errbuf, errlen, "cannot read the header");
        return MT_IO;
    }
    if (rc == 0) {
        r->nfields = 0; /* empty input: names cannot resolve */
    } else {
        r->stats.lines = 1;
        char *s = r->line;
        size_t len = r->line_len;
        if (len >= 3 && !memcmp(s, "\xEF\xBB\xBF", 3)) { /* UTF-8 byte order mark */
            s += 3;
            len -= 3;
        }
        mt_err_t err = split(r, s, len, r->delim, r->quote);
        if (err == MT_CORRUPT) CFG_ERR("header: %s", r->reason);
        if (err) return err;
        r->expect_cols = r->nfields;
    }
    return MT_OK;
}

mt_err_t mt_reader_csv_open(const mt_csv_config_t *cfg, const char *path, FILE *in,
                            mt_reader_t **out, char *errbuf, size_t errlen) {
    *out = NULL;
    mt_err_t err = mt_csv_config_validate(cfg, errbuf, errlen);
    if (err) return err;
    /* unique slot ids, in the order of first appearance */
    uint16_t *ids = malloc(cfg->nslots_cfg * sizeof(uint16_t));
    if (!ids) return MT_NOMEM;
    uint32_t nslots = 0;
    for (size_t i = 0; i < cfg->nslots_cfg; i++) {
        uint32_t k = 0;
        while (k < nslots && ids[k] != cfg->slots[i].slot_id)
            k++;
        if (k == nslots) ids[nslots++] = cfg->slots[i].slot_id;
    }
    mt_reader_t *r = NULL;
    err = reader_new(K_CSV, path, in, nslots, &r);
    if (err) {
        if (err == MT_IO && errbuf && errlen) snprintf(errbuf, errlen, "cannot open %s", path);
        free(ids);
        return err;
    }
    memcpy(r->slot_ids, ids, nslots * sizeof(uint16_t));
    free(ids);
    r->delim = cfg->delimiter;
    r->quote = cfg->quote;
    r->multi_sep = cfg->multi_sep;
    r->strict = cfg->strict_columns;
    r->label_kind = cfg->label_kind;
    r->label_threshold = cfg->label_threshold;
    r->time_unit = cfg->time_unit;
    r->cs = calloc(cfg->nslots_cfg, sizeof(csv_slot_rt_t));
    if (!r->cs) {
        err = MT_NOMEM;
        goto out;
    }
    r->ncs = cfg->nslots_cfg;
    if (cfg->label_kind == MT_CSV_LABEL_STRINGS) {
        r->pos_labels = calloc(cfg->npositive_labels, sizeof(char *));
        if (!r->pos_labels) {
            err = MT_NOMEM;
            goto out;
        }
        r->npos_labels = cfg->npositive_labels;
        for (size_t i = 0; i < cfg->npositive_labels; i++) {
            r->pos_labels[i] = strdup(cfg->positive_labels[i]);
            if (!r->pos_labels[i]) {
                err = MT_NOMEM;
                goto out;
            }
        }
    }
    if (cfg->header && (err = csv_read_header(r, errbuf, errlen))) goto out;
    if (cfg->label_kind != MT_CSV_LABEL_NONE &&
        (err = resolve(r, cfg->label, "label", &r->label_cols[0], errbuf, errlen)))
        goto out;
    r->ntasks = 1 + (uint32_t)cfg->ntask_labels;
    for (size_t t = 0; t < cfg->ntask_labels; t++)
        if ((err = resolve(r, cfg->task_labels[t], "task label", &r->label_cols[t + 1], errbuf,
                           errlen)))
            goto out;
    if (cfg->time_unit != MT_CSV_TIME_NONE &&
        (err = resolve(r, cfg->timestamp, "timestamp", &r->time_col, errbuf, errlen)))
        goto out;
    for (size_t i = 0; i < cfg->ntext_columns; i++) {
        char what[64];
        text_what(cfg, i, what, sizeof(what));
        if ((err = resolve(r, cfg->text_columns[i], what, &r->text_col[i], errbuf, errlen)))
            goto out;
    }
    r->ntext = cfg->ntext_columns;
    for (size_t i = 0; i < cfg->nslots_cfg; i++) {
        csv_slot_rt_t *c = &r->cs[i];
        char what[32];
        snprintf(what, sizeof(what), "slots[%zu]", i);
        if ((err = resolve(r, cfg->slots[i].column, what, &c->col, errbuf, errlen))) goto out;
        c->slot_id = cfg->slots[i].slot_id;
        c->kind = cfg->slots[i].kind;
        c->multi = cfg->slots[i].multi;
        while (r->slot_ids[c->slot_idx] != c->slot_id)
            c->slot_idx++;
    }
out:
    if (err) {
        mt_reader_destroy(r);
        return err;
    }
    *out = r;
    return MT_OK;
}

static mt_err_t csv_value(mt_reader_t *r, const csv_slot_rt_t *c, const char *p, size_t len) {
    uint64_t fid;
    if (c->kind == MT_CSV_INT) {
        int64_t v;
        if (!parse_i64((field_t){(char *)p, len}, &v))
            return bad(r, "column %zu: '%.*s' is not an integer", c->col + 1,
                       (int)(len < 24 ? len : 24), p);
        fid = v >= 0 && v < MT__FID_MAX ? mt_fid_of_int(c->slot_id, (uint64_t)v)
                                        : mt_fid_of_bytes(c->slot_id, p, len);
    } else {
        fid = mt_fid_of_bytes(c->slot_id, p, len);
    }
    return push_fid(r, c->slot_idx, fid);
}

/* Copies the text columns of the current line into r->text_buf. */
static mt_err_t csv_keep_text(mt_reader_t *r) {
    size_t need = 0;
    for (size_t i = 0; i < r->ntext; i++) {
        if (r->text_col[i] >= r->nfields) return bad(r, "no column %zu", r->text_col[i] + 1);
        need += r->fields[r->text_col[i]].len + 1;
    }
    if (!r->ntext) return MT_OK;
    if (need > r->text_cap) {
        size_t cap = need < 256 ? 256 : need;
        char *b = realloc(r->text_buf, cap);
        if (!b) return MT_NOMEM;
        r->text_buf = b;
        r->text_cap = cap;
    }
    size_t o = 0;
    for (size_t i = 0; i < r->ntext; i++) {
        field_t f = r->fields[r->text_col[i]];
        memcpy(r->text_buf + o, f.p, f.len);
        r->text_buf[o + f.len] = '\0';
        r->text_off[i] = o;
        r->text_len[i] = f.len;
        o += f.len + 1;
    }
    return MT_OK;
}

mt_err_t mt_reader_csv_text(const mt_reader_t *r, size_t i, const char **text, size_t *len) {
    if (!r || r->kind != K_CSV || i >= r->ntext || !text || !len) return MT_INVALID;
    if (!r->have_text) return MT_NOT_FOUND;
    *text = r->text_buf + r->text_off[i];
    *len = r->text_len[i];
    return MT_OK;
}

/* Label column @p col of the line into *label, as the config's label kind reads it. */
static mt_err_t csv_label(mt_reader_t *r, size_t col, float *label) {
    *label = 0;
    if (col >= r->nfields) return bad(r, "no label column %zu", col + 1);
    field_t f = r->fields[col];
    if (r->label_kind == MT_CSV_LABEL_THRESHOLD) {
        double v;
        if (!parse_double(f, &v)) return bad(r, "label '%.*s' is not a number", SHOW(f));
        *label = v >= r->label_threshold ? 1.0f : 0.0f;
    } else {
        for (size_t i = 0; i < r->npos_labels; i++)
            if (strlen(r->pos_labels[i]) == f.len && !memcmp(r->pos_labels[i], f.p, f.len))
                *label = 1.0f;
    }
    return MT_OK;
}

/* @p label: [r->ntasks]. */
static mt_err_t csv_parse(mt_reader_t *r, float *label, int64_t *ts) {
    mt_err_t err = split(r, r->line, r->line_len, r->delim, r->quote);
    if (err) return err;
    if (r->strict) {
        if (!r->expect_cols) r->expect_cols = r->nfields;
        if (r->nfields != r->expect_cols)
            return bad(r, "expected %zu columns, got %zu", r->expect_cols, r->nfields);
    }
    *label = 0;
    *ts = 0;
    if (r->label_kind != MT_CSV_LABEL_NONE)
        for (uint32_t t = 0; t < r->ntasks; t++) {
            mt_err_t e = csv_label(r, r->label_cols[t], &label[t]);
            if (e) return e;
        }
    if (r->time_unit != MT_CSV_TIME_NONE) {
        if (r->time_col >= r->nfields) return bad(r, "no timestamp column %zu", r->time_col + 1);
        field_t f = r->fields[r->time_col];
        if (r->time_unit == MT_CSV_TIME_S) {
            double v;
            if (!parse_double(f, &v) || fabs(v) > 9e12)
                return bad(r, "timestamp '%.*s' is not unix seconds", SHOW(f));
            *ts = (int64_t)llround(v * 1000.0);
        } else {
            int64_t v;
            if (!parse_i64(f, &v)) return bad(r, "timestamp '%.*s' is not unix ms", SHOW(f));
            *ts = v;
        }
    }
    for (size_t i = 0; i < r->ncs; i++) {
        const csv_slot_rt_t *c = &r->cs[i];
        if (c->col >= r->nfields) return bad(r, "no column %zu", c->col + 1);
        field_t f = r->fields[c->col];
        if (f.len == 0) continue;
        if (!c->multi) {
            if ((err = csv_value(r, c, f.p, f.len))) return err;
            continue;
        }
        size_t a = 0;
        while (a <= f.len) {
            size_t e = a;
            while (e < f.len && f.p[e] != r->multi_sep)
                e++;
            if (e > a && (err = csv_value(r, c, f.p + a, e - a))) return err;
            a = e + 1;
        }
    }
    return csv_keep_text(r);
}

/* ---------------------------------------------------------------------------------------- */
/* Common API                                                                               */
/* ---------------------------------------------------------------------------------------- */

void mt_reader_destroy(mt_reader_t *r) {
    if (!r) return;
    if (r->owns_in && r->in) fclose(r->in);
    free(r->line);
    free(r->fields);
    if (r->sfids)
        for (uint32_t s = 0; s < r->nslots; s++)
            free(r->sfids[s]);
    free(r->sfids);
    free(r->scnt);
    free(r->scap);
    free(r->slot_ids);
    free(r->users);
    free(r->items);
    free(r->genre_pool);
    if (r->pos_labels)
        for (size_t i = 0; i < r->npos_labels; i++)
            free(r->pos_labels[i]);
    free(r->pos_labels);
    free(r->cs);
    free(r->text_buf);
    free(r);
}

const uint16_t *mt_reader_slots(const mt_reader_t *r, uint32_t *nslots) {
    *nslots = r->nslots;
    return r->slot_ids;
}

mt_err_t mt_reader_batch_init(const mt_reader_t *r, mt_batch_t *b) {
    mt_err_t err = mt_batch_init(b, r->slot_ids, r->nslots);
    if (!err && r->ntasks > 1 && (err = mt_batch_set_tasks(b, r->ntasks)) != MT_OK)
        mt_batch_free(b);
    return err;
}

void mt_reader_set_bad_line_cb(mt_reader_t *r, mt_reader_bad_line_cb cb, void *opaque) {
    r->cb = cb;
    r->cb_opaque = opaque;
}

const mt_reader_stats_t *mt_reader_stats(const mt_reader_t *r) {
    return &r->stats;
}

mt_err_t mt_reader_next(mt_reader_t *r, mt_batch_t *b, size_t max_examples) {
    if (!r || !b || max_examples == 0) return MT_INVALID;
    if (b->nslots != r->nslots || !b->slot_ids || b->ntasks != (r->ntasks ? r->ntasks : 1) ||
        memcmp(b->slot_ids, r->slot_ids, r->nslots * sizeof(uint16_t)))
        return MT_MISMATCH;
    size_t added = 0;
    while (added < max_examples) {
        int rc = read_line(r, r->in);
        if (rc < 0) return MT_IO;
        if (rc == 0) break;
        r->stats.lines++;
        if (r->line_len == 0) continue;
        if (r->line_len > MT_READER_MAX_LINE_BYTES) {
            bad(r, "line longer than %u bytes", MT_READER_MAX_LINE_BYTES);
            record_bad(r);
            continue;
        }
        /* MovieLens latest: a first line that does not start with a number is the header */
        if (r->kind == K_MOVIELENS && r->ml_format == MT_MOVIELENS_LATEST && r->stats.lines == 1 &&
            (r->line[0] < '0' || r->line[0] > '9'))
            continue;
        memset(r->scnt, 0, r->nslots * sizeof(uint32_t));
        float label[MT_BATCH_MAX_TASKS] = {0};
        int64_t ts = 0;
        mt_err_t err;
        switch (r->kind) {
        case K_CRITEO: err = criteo_parse(r, label, &ts); break;
        case K_MOVIELENS: err = ml_parse(r, label, &ts); break;
        default: err = csv_parse(r, label, &ts); break;
        }
        if (err == MT_CORRUPT) {
            record_bad(r);
            continue;
        }
        if (err) return err;
        err = mt_batch_add_labels(b, label, ts, 1.0f, (const uint64_t *const *)r->sfids, r->scnt);
        if (err) return err == MT_INVALID ? MT_INTERNAL : err;
        r->have_text = r->ntext > 0;
        added++;
        r->stats.examples++;
    }
    return added ? MT_OK : MT_NOT_FOUND;
}
