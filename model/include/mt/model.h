/*
 * model.h - the CTR model's math (DeepFM-style), shared by trainer and serving (DESIGN.md 3b).
 *
 * The model knows no transport and no wire format: the caller looks up and sum-pools the
 * sparse embeddings, the model turns them into scores (forward) or into a loss and gradients
 * (forward and backward). Dense parameters live in the model object and are enumerated by
 * name and shape so that a trainer can push/pull them to the PS as DenseTensors.
 *
 * Inputs for a batch of n examples over S slots, slot s of embedding dim d_s (every slot
 * the same d unless slot_dims says otherwise), D = sum_s d_s (all row-major, contiguous):
 *
 *   E  [n x D]       pooled second-order / deep embeddings: slot s of example i at
 *                    E[i*D + off_s], off_s = d_0 + ... + d_(s-1) (one dim: E[(i*S + s)*d + k])
 *   W1 [n x S]       pooled first-order weights (each id's weight, the last float of its row)
 *
 * Forward, for example i (x_i = E[i] read as one row of D floats, the slot concatenation):
 *
 *   logit_i = b0 + sum_s W1[i,s]
 *           + 0.5 * sum_k ((sum_s E[i,s,k])^2 - sum_s E[i,s,k]^2)        (FM second order)
 *           + MLP(x_i)
 *   p_i     = sigmoid(logit_i)
 *
 *   MLP(x) = relu(...relu(x W_0 + b_0) W_1 + b_1 ...) W_out     (hidden layers h_0, h_1, ...)
 *
 * The output layer has no bias of its own: b0 is the model's one global bias (a second one
 * would be redundant).
 *
 * Model families (mt_model_config_t.type; mt_model_type_name() gives the config's names):
 *
 *   din     target attention over a behaviour sequence (Zhou et al., "Deep Interest Network
 *           for Click-Through Rate Prediction", KDD 2018): one slot (seq_slot) holds, instead
 *           of a pooled cell, the user's recent item ids in order, L = seq_len cells of the
 *           query slot's dim d (E's cell of that slot is L * d floats: position j at
 *           off + j*d, zeros past the sequence's end); the candidate's item embedding q (slot
 *           seq_query) attends each key k_j:
 *             u_j   = sigmoid([q, k_j, q - k_j, q * k_j] Wa + ba)     (width H = attention_width)
 *             a_j   = u_j wa + ba_out                                  (not normalized: DIN's
 *                                                                     weights keep intensity)
 *             v     = sum_j a_j k_j                                    (a zero key adds 0:
 *                                                                     padding needs no mask)
 *             logit = b0 + sum_(s != seq_slot) W1[s] + FM(x') + MLP(x'), x' = E with the
 *                     sequence's cell replaced by v (d floats): S cells of d, the MLP's input
 *                     D - (L - 1) d wide; FM(x') deepfm's second order over those S cells
 *                     (so <q, v> = sum_j a_j <q, k_j> is one of its terms). One dim for every
 *                     slot, as deepfm.
 *           The sequence's ids are looked up in the query slot's rows (mt_model_seq_fid():
 *           a behaviour's item shares its embedding with the candidate item); its W1 cell
 *           is not read (dW1 0) and has no first-order weight of its own.
 *   mmoe    T tasks (Ma et al., "Modeling Task Relationships in Multi-task Learning with
 *           Multi-gate Mixture-of-Experts", KDD 2018): K shared experts, one softmax gate
 *           and one tower per task, the first order shared:
 *             a_k     = relu(x We_k + be_k)                  (expert k, width h_e)
 *             g_t     = softmax(x Wg_t + bg_t)               (gate of task t, over the K)
 *             f_t     = sum_k g_t[k] a_k
 *             logit_t = b0[t] + sum_s W1[s] + MLP_t(f_t)    (tower t: the hidden widths)
 *           The loss is sum_t task_weight[t] * the mean log loss of task t. Scores and labels
 *           are [n x T] (example i's task t at i*T + t); the other families have T = 1.
 *   dcnv2   first order + MLP(x_C), no FM: C cross layers (DCN-v2, Wang et al. 2021) over
 *           x_0 = x, stacked before the MLP (which reads the last one's output):
 *             x_(c+1) = x_0 * (x_c W_c + b_c) + x_c           (element-wise *, full rank)
 *             x_(c+1) = x_0 * ((x_c V_c) U_c + b_c) + x_c     (low rank r = cross_rank)
 *
 * Parameters, their names and shapes (DenseTensor order; D = S*d):
 *
 *   name          shape        role
 *   "b0"          [1]          global bias
 *   "cross.<c>.w" [D, D]       dcnv2, full rank: cross layer c's weights
 *   "cross.<c>.v" [D, r]       dcnv2, low rank: its down-projection
 *   "cross.<c>.u" [r, D]       dcnv2, low rank: its up-projection
 *   "cross.<c>.b" [D]          dcnv2: its bias
 *   "mlp.<l>.w"   [in_l, h_l]  hidden layer l weights, in_0 = D, in_l = h_(l-1)
 *   "mlp.<l>.b"   [h_l]        hidden layer l bias
  *   "mlp.out.w"   [in_out, 1]  output weights, in_out = h_last (D without hidden layers)
 *   din after "b0": "att.w" [4d, H], "att.b" [H], "att.out.w" [H, 1], "att.out.b" [1], then
 *   the MLP over D - (L - 1) d.
 *   mmoe instead of "b0" and the MLP: "b0" [T], "experts.w" [D, K*h_e] (expert k's columns
 *   k*h_e ..), "experts.b" [K*h_e], "gates.w" [D, T*K] (task t's columns t*K ..), "gates.b"
 *   [T*K], then per task t its tower "tower.<t>.<l>.w" / ".b" and "tower.<t>.out.w", shaped
 *   as the MLP's over an input of h_e.

 *
 * Loss: weighted log loss, mean over the batch:  L = (1/n) sum_i w_i * logloss(p_i, y_i)
 * (w_i = 1 without weights; dividing by n rather than by sum w keeps the gradient scale
 * independent of the batch's weights and defined when they sum to 0).
 *
 * Negative sampling correction (serving): if the training examples kept negatives with
 * probability r (positives all kept), the model learned odds P(y=1)/(r P(y=0)): too high by 1/r.
 * The served score is therefore sigmoid(logit + log r) = p*r / (p*r + 1 - p).
 *
 * Dense math runs through cblas_sgemm on whole batches; only the FM term, the pooling sums
 * and the element-wise parts loop over examples.
 *
 * Thread safety: a model's parameters are read by mt_model_forward() and
 * mt_model_forward_serving(), which may run concurrently on one model, each thread with its
 * own workspace (or none). mt_model_forward_backward(), writing the model's gradients and
 * using its internal workspace, and any change to the parameters (through the pointers of
 * mt_model_param()) need exclusive access. mt_model_auc() and the inline helpers are pure.
 */
#ifndef MT_MODEL_H
#define MT_MODEL_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "mt/err.h"

#define MT_MODEL_MAX_HIDDEN 8 /* hidden layers at most */

/*
 * The table row of a feature slot: what the trainer, the PS and serving store and look up for
 * an id. The slot's embedding (d floats, E's part) then its first-order weight (one float,
 * W1's part), which a new row starts at 0 (the table's zero_tail): one lookup and one
 * gradient apply per id give the model both.
 */
#define MT_MODEL_ROW_TAIL 1

/** Floats in the row of a slot of embedding dim @p dim. */
static inline uint32_t mt_model_row_floats(uint32_t dim) {
    return dim + MT_MODEL_ROW_TAIL;
}

/*
 * What the trainer and serving both do to a request's or an example's ids and rows, written
 * once here so that they cannot drift apart (a served score and a trained score read the
 * same rows and pool them the same way):
 *   - feature slots are below MT_MODEL_SLOT_LIMIT (the ids above were an older layout's
 *     first-order slots);
 *   - an id is looked up as mt_model_reduce_fid(fid, buckets): its value modulo the hash
 *     buckets (0: collisionless, the id itself), its slot kept;
  *   - a slot's cell of E and W1 is the sum of its ids' rows (embedding into E, first-order
 *     weight into W1): mt_model_pool_first() for the first id, mt_model_pool_add() for
 *     each further one (a cell of no id is zeros); a mean-pooled slot's cell is then
 *     scaled by mt_model_mean_scale(count) (mt_model_pool_scale()), and each of its ids'
 *     rows receives the cell's gradient times the same factor.
 */
#define MT_MODEL_SLOT_LIMIT 0x8000u

/** The id a fid is stored under: its value (low 48 bits) modulo @p buckets, 0 = no reduction. */
static inline uint64_t mt_model_reduce_fid(uint64_t fid, uint64_t buckets) {
    return buckets ? (fid & 0xFFFF000000000000ull) | ((fid & 0xFFFFFFFFFFFFull) % buckets) : fid;
}

/** Starts a cell from its first id's @p row: e[0..d) = row[0..d), *w1 = row[d]. */
static inline void mt_model_pool_first(float *restrict e, float *restrict w1,
                                       const float *restrict row, uint32_t d) {
    for (uint32_t j = 0; j < d; j++)
        e[j] = row[j];
    *w1 = row[d];
}

/** A mean-pooled cell's factor for @p count ids: 1 / count (1 for 0 or 1 id). */
static inline float mt_model_mean_scale(uint32_t count) {
    return count > 1 ? 1.0f / (float)count : 1.0f;
}

/** Scales a pooled cell by @p f: e[0..d) *= f, *w1 *= f. */
static inline void mt_model_pool_scale(float *restrict e, float *restrict w1, float f, uint32_t d) {
    for (uint32_t j = 0; j < d; j++)
        e[j] *= f;
    *w1 *= f;
}

/** Adds a further id's @p row to its cell. The loop of d = 16 has a known length (vectorized
 *  at -O2; a warm training step's pooling and scatter took 5% scalar); the sums are those
 *  of the general loop. */
static inline void mt_model_pool_add(float *restrict e, float *restrict w1,
                                     const float *restrict row, uint32_t d) {
    if (d == 16) {
        for (uint32_t j = 0; j < 16; j++)
            e[j] += row[j];
    } else {
        for (uint32_t j = 0; j < d; j++)
            e[j] += row[j];
    }
    *w1 += row[d];
}
#define MT_MODEL_MAX_SLOTS      65536      /* a slot id is 16 bits */
#define MT_MODEL_MAX_DIM        4096       /* embedding dim at most */
#define MT_MODEL_MAX_WIDTH      65536      /* hidden layer width at most */
#define MT_MODEL_MAX_INPUT      (1u << 22) /* nslots * dim at most (the MLP's input width) */
#define MT_MODEL_NAME_MAX       32   /* parameter names are shorter than this (NUL included) */
#define MT_MODEL_MAX_CROSS      8    /* dcnv2: cross layers at most */
#define MT_MODEL_MAX_TASKS      4    /* mmoe: tasks at most */
#define MT_MODEL_MAX_EXPERTS    8    /* mmoe: experts at most */
#define MT_MODEL_MAX_FULL_CROSS 4096 /* dcnv2: D at most for full-rank cross layers */
#define MT_MODEL_MAX_SEQ        256  /* din: sequence length at most */

/** The model family (see the top of this file). */
typedef enum mt_model_type {
    MT_MODEL_DEEPFM = 0,
    MT_MODEL_DCNV2 = 1,
    MT_MODEL_MMOE = 2,
    MT_MODEL_DIN = 3,
} mt_model_type_t;

/** @returns the family's name in the configuration ("deepfm", "dcnv2", "mmoe", "din"), NULL if
 *  unknown. */
const char *mt_model_type_name(mt_model_type_t type);

/** Parses a family's name. @returns MT_OK or MT_CONFIG (unknown name, NULL argument). */
mt_err_t mt_model_type_parse(const char *name, mt_model_type_t *out);

typedef struct mt_model mt_model_t;
typedef struct mt_model_ws mt_model_ws_t;

/** Model settings. Initialize with mt_model_config_init(), then set fields. */
typedef struct mt_model_config {
    uint32_t nslots;                      /* S: slots per example, 1..MT_MODEL_MAX_SLOTS */
    uint32_t dim;                         /* d: embedding dim of every slot, 1..MAX_DIM */
    uint32_t nhidden;                     /* hidden layers, 0..MT_MODEL_MAX_HIDDEN (default 2) */
    uint32_t hidden[MT_MODEL_MAX_HIDDEN]; /* widths, each 1..MAX_WIDTH (default 256, 128) */
    uint64_t init_seed;                   /* Xavier-uniform weights are a function of it */
    mt_model_type_t type;                 /* the family (default deepfm) */
    uint32_t ncross;       /* dcnv2: cross layers, 1..MT_MODEL_MAX_CROSS (default 3) */
    uint32_t cross_rank;   /* dcnv2: 0 = full rank (D <= MT_MODEL_MAX_FULL_CROSS), else the
                            rank r of each layer's U V, 1..D (default 0) */
    uint32_t ntasks;       /* mmoe: tasks T, 2..MT_MODEL_MAX_TASKS (default 2); others: 1 */
    uint32_t nexperts;     /* mmoe: experts K, 1..MT_MODEL_MAX_EXPERTS (default 4) */
    uint32_t expert_width; /* mmoe: each expert's width h_e, 1..MT_MODEL_MAX_WIDTH (64) */
    float task_weight[MT_MODEL_MAX_TASKS]; /* mmoe: each task's loss weight, >= 0 (1) */
    uint32_t seq_slot;                     /* din: index (0..S-1) of the sequence slot */
    uint32_t seq_query;        /* din: index of the candidate item's slot (another), whose
                                 dim the sequence slot shares */
    uint32_t seq_len;          /* din: L, 1..MT_MODEL_MAX_SEQ (default 20) */
    uint32_t attention_width;  /* din: H, 1..MT_MODEL_MAX_WIDTH (default 32) */
    const uint32_t *slot_dims; /* [nslots]: each slot's embedding dim d_s, or NULL: dim for
                                  every slot (default). Borrowed by validate and create (the
                                  model keeps a copy: mt_model_config() points to it); deepfm
                                  needs every d_s = dim (its FM term sums slots k by k) */
} mt_model_config_t;

/** A family's own settings: the fields of mt_model_config_t that trainer and serving carry
 *  as one value (their configurations hold one, mt_model_family_get/set copy it). */
typedef struct mt_model_family {
    mt_model_type_t type;
    uint32_t ncross, cross_rank;
    uint32_t ntasks, nexperts, expert_width;
    float task_weight[MT_MODEL_MAX_TASKS];
    uint32_t seq_slot, seq_query, seq_len, attention_width;
} mt_model_family_t;

/** Copies @p c's family settings into @p f. */
static inline void mt_model_family_get(const mt_model_config_t *c, mt_model_family_t *f) {
    f->type = c->type;
    f->ncross = c->ncross;
    f->cross_rank = c->cross_rank;
    f->ntasks = c->ntasks;
    f->nexperts = c->nexperts;
    f->expert_width = c->expert_width;
    for (int t = 0; t < MT_MODEL_MAX_TASKS; t++)
        f->task_weight[t] = c->task_weight[t];
    f->seq_slot = c->seq_slot;
    f->seq_query = c->seq_query;
    f->seq_len = c->seq_len;
    f->attention_width = c->attention_width;
}

/** Copies @p f into @p c's family settings. */
static inline void mt_model_family_set(mt_model_config_t *c, const mt_model_family_t *f) {
    c->type = f->type;
    c->ncross = f->ncross;
    c->cross_rank = f->cross_rank;
    c->ntasks = f->ntasks;
    c->nexperts = f->nexperts;
    c->expert_width = f->expert_width;
    for (int t = 0; t < MT_MODEL_MAX_TASKS; t++)
        c->task_weight[t] = f->task_weight[t];
    c->seq_slot = f->seq_slot;
    c->seq_query = f->seq_query;
    c->seq_len = f->seq_len;
    c->attention_width = f->attention_width;
}

/** The tasks T of a model of family @p f: its scores and labels per example (ntasks for
 *  mmoe, 1 for the others); mt_model_ntasks() of the model it builds. */
static inline uint32_t mt_model_family_ntasks(const mt_model_family_t *f) {
    return f->type == MT_MODEL_MMOE ? f->ntasks : 1;
}

/** Slot @p s's embedding dim: slot_dims[s], or dim (din's sequence slot: its rows', the
 *  query slot's dim). */
static inline uint32_t mt_model_slot_dim(const mt_model_config_t *c, uint32_t s) {
    return c->slot_dims ? c->slot_dims[s] : c->dim;
}

/** 1 if slot @p s is din's sequence slot (its cell holds seq_len rows in order, not pooled). */
static inline int mt_model_is_seq(const mt_model_config_t *c, uint32_t s) {
    return c->type == MT_MODEL_DIN && s == c->seq_slot;
}

/** The floats of slot @p s's cell in a row of E: its dim, seq_len times that for din's
 *  sequence slot. */
static inline uint32_t mt_model_slot_width(const mt_model_config_t *c, uint32_t s) {
    uint32_t d = mt_model_slot_dim(c, s);
    return mt_model_is_seq(c, s) ? c->seq_len * d : d;
}

/** The id a din sequence's fid is looked up as: its value in the query slot @p query_slot_id
 *  (the candidate item's slot id: behaviours and candidates share their items' rows). */
static inline uint64_t mt_model_seq_fid(uint64_t fid, uint32_t query_slot_id) {
    return ((uint64_t)query_slot_id << 48) | (fid & 0xFFFFFFFFFFFFull);
}

/** Puts a sequence's ids' rows into its cell (din): position j < count of @p count ids gets
 *  row(j)'s embedding (d floats); positions up to seq_len are zeros. @p w1 (the slot's W1 cell)
 *  is 0. Use: for each j < min(count, L) mt_model_seq_put(e, j, row, d); then
 *  mt_model_seq_end(e, w1, min(count, L), L, d). */
static inline void mt_model_seq_put(float *restrict e, uint32_t j, const float *restrict row,
                                    uint32_t d) {
    for (uint32_t k = 0; k < d; k++)
        e[(size_t)j * d + k] = row[k];
}

static inline void mt_model_seq_end(float *e, float *w1, uint32_t used, uint32_t L, uint32_t d) {
    for (size_t k = (size_t)used * d; k < (size_t)L * d; k++)
        e[k] = 0.0f;
    *w1 = 0.0f;
}

/*
 * The feature layout: what each model slot's ids become, built once from the model's
 * configuration and the slots' settings (mt_model_layout_init()) and read by the trainer and
 * serving alike, so that neither holds a rule of its own about slots. For model slot s
 * (0..S-1, in the model's order) l->slot[s] says:
 *   - the table id an id at position pos of its cell is looked up as, or none
 *     (mt_model_layout_id(): the reduction by its hash buckets; din's sequence: the query
 *     slot's id, and nothing past its length);
 *   - how a cell of E and W1 is made from its ids' rows (mt_model_layout_add() per id in
 *     order, then mt_model_layout_end() with the count: sum, mean, or the sequence's rows in
 *     order with zeros after), and the gradient each id's row gets from the cell's
 *     (mt_model_layout_grad());
 *   - its rows' dim, its cell's width and offset in a row of E (E's row: l->width floats).
 * The fields are read-only after init; the functions below are pure (any thread).
 */
#define MT_MODEL_LAYOUT_MAX_SLOTS 256 /* model slots at most (the trainer's and serving's) */
#define MT_MODEL_NO_ID            UINT64_MAX

/** How a model slot's ids make its cell. */
typedef enum mt_model_slot_kind {
    MT_MODEL_SLOT_SUM = 0,  /* the rows summed */
    MT_MODEL_SLOT_MEAN = 1, /* their mean (the sum times 1 / count) */
    MT_MODEL_SLOT_SEQ = 2,  /* din's sequence: the first len rows in order, zeros after */
} mt_model_slot_kind_t;

typedef struct mt_model_slot {
    uint16_t id;          /* the feature slot id (Example / PredictRequest slot) */
    uint16_t lookup_slot; /* the slot id its ids are looked up in: its own, or (a sequence)
                             the query slot's */
    uint8_t kind;         /* mt_model_slot_kind_t */
    uint32_t dim;         /* its rows' embedding floats (a row: mt_model_row_floats(dim)) */
    uint32_t width;       /* its cell's floats in a row of E: dim, len * dim for a sequence */
    uint32_t off;         /* its cell's offset in a row of E */
    uint32_t len;         /* ids read per cell: a sequence's length, else UINT32_MAX */
    uint64_t buckets;     /* the lookup slot's hash buckets (0: collisionless) */
} mt_model_slot_t;

typedef struct mt_model_layout {
    uint32_t nslots;  /* S */
    uint32_t width;   /* D: a row of E (the cells' widths summed) */
    uint32_t max_dim; /* the largest row dim */
    int uniform;      /* every slot summed, of one dim, collisionless or of one bucket
                          count: an id's table id and row size need no slot (fast paths) */
    mt_model_slot_t slot[MT_MODEL_LAYOUT_MAX_SLOTS];
} mt_model_layout_t;

/**
 * Builds the layout of a model of configuration @p mc (validated: its slots, dims, family)
 * whose slot s is feature slot @p slot_ids[s], mean-pooled when @p mean[s] (NULL: none),
 * reduced by @p buckets[s] hash buckets when not 0, else @p default_buckets (NULL: all
 * default). A sequence slot (din) is looked up in its query slot's rows with the query's
 * buckets.
 * @returns MT_OK, or MT_CONFIG (more than MT_MODEL_LAYOUT_MAX_SLOTS slots, an invalid @p mc, a
 *          mean-pooled sequence: message in @p errbuf). (In mt_model_core.)
 */
mt_err_t mt_model_layout_init(mt_model_layout_t *l, const mt_model_config_t *mc,
                              const uint16_t *slot_ids, const uint8_t *mean,
                              const uint64_t *buckets, uint64_t default_buckets, char *errbuf,
                              size_t errlen);

/**
 * The table slots whose rows layout @p l reads, in model-slot order: for each model slot that
 * is looked up in its own rows, its id (@p ids[k]) and its rows' floats (@p floats[k],
 * mt_model_row_floats() of its dim: the embedding, then the first-order weight). A din
 * sequence slot reads its query slot's rows: it has no table slot. What the trainer's own
 * table, PS shards (the configuration's derived [slot.N] sections) and serving hold.
 * @param ids, floats  [l->nslots] each
 * @returns the number of table slots written. (In mt_model_core.)
 */
size_t mt_model_layout_tables(const mt_model_layout_t *l, uint16_t *ids, uint32_t *floats);

/**
 * mt_model_layout_tables() of the layout mt_model_layout_init() builds from the same
 * arguments, for callers that need the table slots and not the layout (the trainer's slot
 * configurations, the configuration's derived [slot.N] sections, serving's check).
 * @param ids, floats  [mc->nslots] each
 * @param[out] n       the number of table slots written
 * @returns mt_model_layout_init()'s errors (@p errbuf says why), or MT_NOMEM.
 * (In mt_model_core.)
 */
mt_err_t mt_model_tables(const mt_model_config_t *mc, const uint16_t *slot_ids, const uint8_t *mean,
                         const uint64_t *buckets, uint64_t default_buckets, uint16_t *ids,
                         uint32_t *floats, size_t *n, char *errbuf, size_t errlen);

/** The table id of @p fid, the id at position @p pos of slot @p ls's cell, or MT_MODEL_NO_ID
 *  when the model does not read it (past a sequence's length). */
static inline uint64_t mt_model_layout_id(const mt_model_slot_t *ls, uint32_t pos, uint64_t fid) {
    if (pos >= ls->len) return MT_MODEL_NO_ID;
    if (ls->kind == MT_MODEL_SLOT_SEQ) fid = mt_model_seq_fid(fid, ls->lookup_slot);
    return mt_model_reduce_fid(fid, ls->buckets);
}

/** Adds the row of the id at position @p pos of its cell (e: the cell in E, w1: in W1);
 *  position 0 starts the cell (whatever it held). Positions past a sequence's are ignored. */
static inline void mt_model_layout_add(const mt_model_slot_t *ls, uint32_t pos, float *restrict e,
                                       float *restrict w1, const float *restrict row) {
    if (ls->kind == MT_MODEL_SLOT_SEQ) {
        if (pos < ls->len) mt_model_seq_put(e, pos, row, ls->dim);
    } else if (pos == 0) {
        mt_model_pool_first(e, w1, row, ls->dim);
    } else {
        mt_model_pool_add(e, w1, row, ls->dim);
    }
}

/** Ends a cell of @p count ids: zeros for none (a sequence: after its ids, and W1 0); a
 *  mean slot's sum scaled by 1 / count. */
static inline void mt_model_layout_end(const mt_model_slot_t *ls, uint32_t count, float *e,
                                       float *w1) {
    if (ls->kind == MT_MODEL_SLOT_SEQ) {
        mt_model_seq_end(e, w1, count < ls->len ? count : ls->len, ls->len, ls->dim);
    } else if (count == 0) {
        for (uint32_t j = 0; j < ls->dim; j++)
            e[j] = 0.0f;
        *w1 = 0.0f;
    } else if (ls->kind == MT_MODEL_SLOT_MEAN && count > 1) {
        mt_model_pool_scale(e, w1, mt_model_mean_scale(count), ls->dim);
    }
}

/** The gradient of the row of the id at position @p pos of a cell of @p count ids: g (the
 *  row's, dim + 1 floats) += scale * its share of the cell's gradient (de: the cell's in dE,
 *  dw1 its W1's): all of it summed, 1 / count of it for a mean, the position's rows of a
 *  sequence (no first-order part). */
static inline void mt_model_layout_grad(const mt_model_slot_t *ls, uint32_t pos, uint32_t count,
                                        const float *restrict de, float dw1, float scale,
                                        float *restrict g) {
    const uint32_t d = ls->dim;
    if (ls->kind == MT_MODEL_SLOT_SEQ) {
        if (pos >= ls->len) return;
        de += (size_t)pos * d;
        dw1 = 0.0f;
    } else if (ls->kind == MT_MODEL_SLOT_MEAN) {
        scale *= mt_model_mean_scale(count);
    }
    if (d == 16) { /* a loop of known length (vectorized at -O2); the same sums */
        for (uint32_t j = 0; j < 16; j++)
            g[j] += scale * de[j];
    } else {
        for (uint32_t j = 0; j < d; j++)
            g[j] += scale * de[j];
    }
    g[d] += scale * dw1;
}

/** One dense parameter tensor (see the table at the top of this file). */
typedef struct mt_model_param {
    const char *name; /* static for the model's life, e.g. "mlp.0.w" */
    uint32_t ndim;    /* 1 or 2 */
    uint32_t shape[2];
    size_t size;   /* number of floats: the product of the shape */
    float *values; /* the model's values: read/write, valid until mt_model_destroy() */
    float *grads;  /* the model's gradients of the last mt_model_forward_backward() */
} mt_model_param_t;

/** Defaults: nslots 0 and dim 0 (must be set), hidden 256-128, init_seed 1, deepfm (dcnv2:
 *  3 full-rank cross layers). */
void mt_model_config_init(mt_model_config_t *cfg);

/**
 * Checks every field of @p cfg.
 * @param[out] errbuf  receives a message naming the bad field (may be NULL)
 * @returns MT_OK or MT_CONFIG.
 */
mt_err_t mt_model_config_validate(const mt_model_config_t *cfg, char *errbuf, size_t errlen);

/**
 * Creates a model with deterministically initialized parameters: every weight matrix
 * Xavier-uniform U(-a, a), a = sqrt(6 / (fan_in + fan_out)), from init_seed; biases and b0 0.
 * @param[in]  cfg  validated and copied
 * @param[out] out  on success, a model the caller frees with mt_model_destroy()
 * @returns MT_OK, MT_CONFIG (bad or NULL @p cfg, NULL @p out) or MT_NOMEM.
 */
mt_err_t mt_model_create(const mt_model_config_t *cfg, mt_model_t **out);

/** Frees the model and its buffers. NULL is a no-op. */
void mt_model_destroy(mt_model_t *m);

/** @returns the model's configuration (valid until mt_model_destroy()), NULL for NULL. */
const mt_model_config_t *mt_model_config(const mt_model_t *m);

/** @returns the number of dense parameter tensors (2 * nhidden + 2; din 4 more; dcnv2's cross
 *  layers: 2 or 3 each; mmoe: 5 + T * (2 * nhidden + 1)). */
size_t mt_model_nparams(const mt_model_t *m);

/** @returns the model's tasks T: the scores per example (1 but for mmoe); 0 for NULL. */
uint32_t mt_model_ntasks(const mt_model_t *m);

/**
 * Describes parameter tensor @p i (0-based, in the order of the table above).
 * @param[out] out  pointers into the model, valid until mt_model_destroy()
 * @returns MT_OK or MT_INVALID (@p i out of range, NULL argument).
 */
mt_err_t mt_model_param(const mt_model_t *m, size_t i, mt_model_param_t *out);

/** Like mt_model_param() by name. @returns MT_OK, MT_NOT_FOUND or MT_INVALID (NULL argument). */
mt_err_t mt_model_param_find(const mt_model_t *m, const char *name, mt_model_param_t *out);

/**
 * Creates an empty scratch workspace for mt_model_forward*(); it grows to the largest batch
 * it serves. One per thread. @param[out] out  freed with mt_model_ws_destroy().
 * @returns MT_OK, MT_INVALID (NULL @p out) or MT_NOMEM.
 */
mt_err_t mt_model_ws_create(mt_model_ws_t **out);

/** Frees a workspace. NULL is a no-op. */
void mt_model_ws_destroy(mt_model_ws_t *ws);

/**
 * Scores a batch: probs[i] = p_i.
 * @param[in]  ws     scratch owned by the calling thread; NULL allocates and frees per call
 * @param[in]  E      [n x S x d], borrowed
 * @param[in]  W1     [n x S], borrowed
  * @param[out] probs  [n x T]
 * @returns MT_OK, MT_INVALID (NULL arrays with n > 0, n above INT_MAX) or MT_NOMEM.
 */
mt_err_t mt_model_forward(const mt_model_t *m, mt_model_ws_t *ws, const float *E, const float *W1,
                          size_t n, float *probs);

/**
 * Serving scores: like mt_model_forward() with the negative sampling correction,
 * probs[i] = sigmoid(logit_i + log(sample_rate)).
 *
 * The rows of one request share their user's slots: when @p varies says which slots differ
 * between rows, the first hidden layer reads the shared ones once per call (their product
 * with the layer's weights is added to every row) instead of once per row. The scores are
 * those of mt_model_forward() up to float rounding (the sums run in another order). (deepfm;
 * dcnv2 reads every slot per row: its first layer is a cross layer, whose product with x_0
 * is per row anyway.)
 * @param sample_rate  rate at which training kept negatives, in (0, 1]; 1 = no correction
 * @param varies       [S]: 0 promises that slot s holds row 0's values (of E and W1) in every
 *                     row (asserted in debug builds); NULL: every slot may vary
 * @returns as mt_model_forward(), and MT_INVALID for a rate outside (0, 1].
 */
mt_err_t mt_model_forward_serving(const mt_model_t *m, mt_model_ws_t *ws, const float *E,
                                  const float *W1, size_t n, float sample_rate,
                                  const uint8_t *varies, float *probs);

/**
 * Forward and backward for the weighted mean log loss. Overwrites (does not accumulate) the
 * gradient of every dense parameter (read them with mt_model_param()).
  * @param[in]  labels   [n x T], each in [0, 1]
 * @param[in]  weights  [n], each finite and >= 0, or NULL for all 1
  * @param[out] probs  [n x T] p_i, or NULL
 * @param[out] loss     the mean loss, or NULL
 * @param[out] dE       [n x S x d] dL/dE, or NULL when not wanted
 * @param[out] dW1      [n x S] dL/dW1, or NULL when not wanted
 * @returns MT_OK, MT_INVALID (NULL inputs with n > 0, a label or weight out of range; nothing
 *          written) or MT_NOMEM. n == 0 gives loss 0 and zero gradients.
 */
mt_err_t mt_model_forward_backward(mt_model_t *m, const float *E, const float *W1,
                                   const float *labels, const float *weights, size_t n,
                                   float *probs, float *loss, float *dE, float *dW1);

/** Dense Adam's settings (the trainer's local step and the PS's [dense] section). */
typedef struct mt_model_adam {
    float lr;           /* > 0 */
    float beta1, beta2; /* in [0, 1) */
    float eps;          /* > 0 */
} mt_model_adam_t;

/**
 * One Adam step of @p n parameters: m = b1 m + (1 - b1) g, v = b2 v + (1 - b2) g^2,
 * w -= lr_t m / (sqrt(v) + eps), lr_t = lr sqrt(1 - b2^t) / (1 - b1^t). The result does not
 * depend on the CPU's vector width (the same IEEE operations in the same order).
 * @param t  this step's number, from 1
 * (In the library mt_model_core, without OpenBLAS: the PS links it alone.)
 */
void mt_model_adam_step(const mt_model_adam_t *o, uint64_t t, float *restrict w, float *restrict m,
                        float *restrict v, const float *restrict g, size_t n);

/**
 * CowClip (Zheng et al., "CowClip: Reducing CTR Prediction Model Training Time from 12 hours
 * to 10 minutes on 1 GPU", AAAI 2023): adaptive column-wise clipping of one id's embedding
 * gradient in a batch. The gradient @p g (the sum over the id's @p count occurrences in the
 * batch of each example's gradient) is scaled down to the norm
 *   t = ratio * max(||w||, zeta) * count
 * when its norm is larger: an id's step stays in proportion to its own embedding's size
 * (a rare id's first steps, from a tiny initial row, cannot blow it up), and a frequent id
 * keeps count times the bound. @p w is the id's embedding before the step.
 * @returns the factor applied (1: not clipped).
 * (In mt_model_core.)
 */
float mt_model_cowclip(float *restrict g, const float *restrict w, uint32_t d, uint32_t count,
                       float ratio, float zeta);

/**
 * Exact ROC AUC: the probability that a random positive scores above a random negative,
 * ties counting 1/2 (sort-based, O(n log n), average ranks for tied scores).
 * @param[in]  labels  [n]: > 0.5 is positive
 * @param[out] auc
 * @returns MT_OK, MT_INVALID (no positive or no negative, a NaN score, NULL argument) or
 *          MT_NOMEM.
 */
mt_err_t mt_model_auc(const float *scores, const float *labels, size_t n, double *auc);

/** The serving logit for a model trained on negatives kept at rate @p r: logit + log r. */
static inline float mt_model_correct_logit(float logit, float r) {
    return logit + logf(r);
}

/** The same on a probability: p*r / (p*r + 1 - p). */
static inline float mt_model_correct_prob(float p, float r) {
    return (float)((double)p * r / ((double)p * r + 1.0 - (double)p));
}

#endif /* MT_MODEL_H */
