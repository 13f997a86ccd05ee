/*
 * model.c - the model families' forward, backward and AUC (see mt/model.h for the math).
 *
 * Memory: every dense parameter lives in one float array `values`, every gradient at the same
 * offset of one array `grads`; a table of mt__model_tensor_t gives each tensor's name, shape
 * and offset. Order: b0, then dcnv2's cross layers (each its weights, or V and U, then its
 * bias), then per hidden layer its weights and bias, then the output weights.
 *
 * Workspace (floats, for a batch of n; carved from one buffer that only grows):
 *
 *   acts    n * sum_l h_l    hidden activations after ReLU, layer by layer, [n x h_l] each
 *   logits  n
 *   ga, gb  n * maxw each    backward ping-pong for dL/dA (maxw = widest hidden layer)
 *   g       n                dL/dlogit
 *   fm      n * d            per example, the sum over slots of E (FM term; the backward
 *                            pass reads it back instead of summing again)
 *   sq      d                per example, per k, the sum over slots of E^2 (FM term)
 *   dcnv2 (D = S*d, C cross layers of rank r; r = 0 for full rank):
 *   xs      C * n * D        training: X_1 .. X_C (each layer's output; X_0 is E);
 *                            scoring: 2 * n * D, ping-pong (Z is turned into X in place)
 *   zs      C * n * D        training: Z_c = X_c W_c + b_c of every layer (none scoring)
 *   ts      C * n * r        training: T_c = X_c V_c (low rank); scoring: n * r
 *   gx, dz  n * D each       training: dL/dX_c, dL/dZ_c
 *   dt      n * r            training: dL/dT_c
 *   din (L positions, d the query's dim, H the attention width, Dx the MLP's input):
 *   az      n * L * 4d       the attention units' inputs [q, k, q - k, q * k], row (i, j)
 *   au      n * L * H        their sigmoid activations
 *   aw      n * L            the weights a_ij
 *   ax      n * Dx           the MLP's input (E with the sequence's cell replaced by v)
 *   training: adx n * Dx (dL/dx'), adu n * L * H, adz n * L * 4d, ada n * L
 *
 * A ReLU output is > 0 exactly where its input was, so the backward pass reads the mask from
 * the stored activations and no pre-activations are kept.
 *
 * Speed (a 26 x 16 input, MLP 256-128, batches of 512: bench/trainer_bench): the sgemm calls
 * are most of the time; everything else is element-wise and makes one pass over its array:
 * a layer's bias and ReLU after its sgemm (beta 0), the ReLU mask, the bias gradient (column
 * sums) and dA_L = g w_out^T together in the backward pass, the FM sums over slots vectorized
 * over k (d == 16 is specialized), and every gradient is written, never cleared first.
 * This file is built with -O3 (model/CMakeLists.txt) so that GCC vectorizes those loops;
 * the math stays IEEE (no fast-math), so results are deterministic.
 */
#include "mt/model.h"

#include <assert.h>
#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ============================== types ============================== */

typedef struct mt__model_tensor {
    char name[MT_MODEL_NAME_MAX];
    uint32_t ndim;
    uint32_t shape[2];
    size_t size;
    size_t off; /* into values / grads */
} mt__model_tensor_t;

struct mt_model_ws {
    float *buf;
    size_t cap; /* floats */
};

struct mt_model {
    mt_model_config_t cfg;
    uint32_t in_width;  /* D: the slots' cells' widths summed (E's row) */
    uint32_t x_width;   /* the MLP's input: D (din: D - (L - 1) d) */
    uint32_t seq_off;   /* din: the sequence's cell's offset in a row of E (and of x') */
    uint32_t q_off;     /* din: the query slot's */
    uint32_t seq_d;     /* din: d, the query's (and each key's) dim */
    uint32_t *dims;     /* [S] with slot_dims (cfg.slot_dims points here), else NULL */
    uint32_t max_width; /* widest hidden layer (0 without hidden layers) */
    size_t sum_width;   /* sum of hidden widths */
    size_t ntensors;
    size_t mlp0;        /* index of the first MLP tensor ("mlp.0.w", or "mlp.out.w"); mmoe:
                           of task 0's tower, task t's at mlp0 + t * (2 * nhidden + 1) */
    uint32_t T;         /* tasks (1 but for mmoe) */
    uint32_t per_cross; /* dcnv2: tensors per cross layer (2 full rank, 3 low rank) */
    mt__model_tensor_t
        tensors[5 + MT_MODEL_MAX_TASKS * (2 * MT_MODEL_MAX_HIDDEN + 1) + 3 * MT_MODEL_MAX_CROSS];
    size_t nvalues;
    float *values;
    float *grads;
    mt_model_ws_t ws; /* used by mt_model_forward_backward() only */
};

/* Workspace carved for one call. */
typedef struct mt__model_scratch {
    float *acts, *logits, *ga, *gb, *g, *fm, *sq;
    float *zc; /* [max_width]: the first layer's part shared by every row (serving) */
    float *xs, *zs, *ts, *gx, *dz, *dt;               /* dcnv2 (see the top of this file) */
    float *ea, *gate, *mix, *dmix, *dea, *dgate;      /* mmoe (see the top of this file) */
    float *az, *au, *aw, *ax, *adx, *adu, *adz, *ada; /* din */
} mt__model_scratch_t;

/* ============================== private helpers ============================== */

static uint64_t splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static float sigmoidf_stable(float z) {
    /* e = exp(-|z|) <= 1, then 1 / (1 + e) for z >= 0, e / (1 + e) below: the values of a
     * branch on the sign (bit for bit), with a select for it (din calls this for each of its
     * attention units, whose signs are mixed) */
    const float e = expf(-fabsf(z));
    return (z >= 0 ? 1.0f : e) / (1.0f + e);
}

static int is_dcn(const mt_model_t *m) {
    return m->cfg.type == MT_MODEL_DCNV2;
}

static int is_mmoe(const mt_model_t *m) {
    return m->cfg.type == MT_MODEL_MMOE;
}

static int is_din(const mt_model_t *m) {
    return m->cfg.type == MT_MODEL_DIN;
}

/* din's arrays for a batch of @p n (0 for the others; see the top of this file). */
static size_t ws_din(const mt_model_t *m, size_t n, int train) {
    if (!is_din(m)) return 0;
    const size_t nl = n * m->cfg.seq_len, d4 = 4 * (size_t)m->seq_d, H = m->cfg.attention_width;
    size_t fwd = nl * d4 + nl * H + nl + n * m->x_width;
    return fwd + (train ? n * m->x_width + nl * H + nl * d4 + nl : 0);
}

/* mmoe's arrays for a batch of @p n (0 for the others): experts' activations, gates,
 * mixtures [T x n x h_e], and for training their gradients. */
static size_t ws_mmoe(const mt_model_t *m, size_t n, int train) {
    if (!is_mmoe(m)) return 0;
    const size_t T = m->T, K = m->cfg.nexperts, h = m->cfg.expert_width;
    size_t fwd = n * K * h + n * T * K + n * T * h;
    return fwd + (train ? n * h + n * K * h + n * T * K : 0);
}

/* dcnv2's arrays for a batch of @p n (0 for deepfm); @p train: kept for the backward pass. */
static size_t ws_cross(const mt_model_t *m, size_t n, int train, size_t *xs, size_t *zs,
                       size_t *ts) {
    *xs = *zs = *ts = 0;
    if (!is_dcn(m)) return 0;
    const size_t D = m->in_width, C = m->cfg.ncross, r = m->cfg.cross_rank;
    *xs = (train ? C : 2) * n * D;
    *zs = train ? C * n * D : 0;
    *ts = (train ? C : 1) * n * r;
    return *xs + *zs + *ts + (train ? 2 * n * D + n * r : 0);
}

static size_t ws_need(const mt_model_t *m, size_t n, int train) {
    size_t xs, zs, ts;
    return n * (m->sum_width * m->T + 2 * (size_t)m->max_width + 2 * m->T + m->cfg.dim) +
           m->cfg.dim + m->max_width + ws_cross(m, n, train, &xs, &zs, &ts) + ws_mmoe(m, n, train) +
           ws_din(m, n, train);
}

static mt_err_t ws_reserve(mt_model_ws_t *ws, const mt_model_t *m, size_t n, int train,
                           mt__model_scratch_t *sc) {
    size_t need = ws_need(m, n, train);
    if (need > ws->cap) {
        float *nb = realloc(ws->buf, need * sizeof(float));
        if (!nb) return MT_NOMEM;
        ws->buf = nb;
        ws->cap = need;
    }
    float *p = ws->buf;
    sc->acts = p;
    p += n * m->sum_width * m->T;
    sc->logits = p; /* [T x n]: task t's at logits + t * n */
    p += n * m->T;
    sc->ga = p;
    p += n * m->max_width;
    sc->gb = p;
    p += n * m->max_width;
    sc->g = p; /* [T x n] as logits */
    p += n * m->T;
    sc->fm = p;
    p += n * m->cfg.dim;
    sc->sq = p;
    p += m->cfg.dim;
    sc->zc = p;
    p += m->max_width;
    size_t xs, zs, ts;
    ws_cross(m, n, train, &xs, &zs, &ts);
    sc->xs = p;
    p += xs;
    sc->zs = p;
    p += zs;
    sc->ts = p;
    p += ts;
    sc->gx = p;
    sc->dz = p + (train && xs ? n * m->in_width : 0);
    sc->dt = p + (train && xs ? 2 * n * m->in_width : 0);
    p += train && xs ? 2 * n * m->in_width + n * m->cfg.cross_rank : 0;
    if (is_mmoe(m)) {
        const size_t T = m->T, K = m->cfg.nexperts, h = m->cfg.expert_width;
        sc->ea = p;
        p += n * K * h;
        sc->gate = p;
        p += n * T * K;
        sc->mix = p;
        p += n * T * h;
        sc->dmix = p;
        sc->dea = p + (train ? n * h : 0);
        sc->dgate = p + (train ? n * h + n * K * h : 0);
    }
    if (is_din(m)) { /* (mmoe's arrays are not carved: a model is one or the other) */
        const size_t nl = n * m->cfg.seq_len, d4 = 4 * (size_t)m->seq_d;
        const size_t H = m->cfg.attention_width;
        sc->az = p;
        sc->au = sc->az + nl * d4;
        sc->aw = sc->au + nl * H;
        sc->ax = sc->aw + nl;
        sc->adx = sc->ax + n * m->x_width; /* the rest only when training */
        sc->adu = sc->adx + n * m->x_width;
        sc->adz = sc->adu + nl * H;
        sc->ada = sc->adz + nl * d4;
    }
    return MT_OK;
}

static const float *tensor_values(const mt_model_t *m, size_t t) {
    return m->values + m->tensors[t].off;
}

/*
 * The FM sums of one example: fm[k] = sum_s e[s,k] and sq[k] = sum_s e[s,k]^2, both in slot
 * order; @returns 0.5 * sum_k (fm[k]^2 - sq[k]) (in double). Inlined with d = 16 the lanes
 * stay in registers.
 */
static inline double fm_example(const float *restrict e, uint32_t S, uint32_t d, float *restrict fm,
                                float *restrict sq) {
    for (uint32_t k = 0; k < d; k++) {
        fm[k] = e[k];
        sq[k] = e[k] * e[k];
    }
    for (uint32_t s = 1; s < S; s++) {
        const float *es = e + (size_t)s * d;
        for (uint32_t k = 0; k < d; k++) {
            fm[k] += es[k];
            sq[k] += es[k] * es[k];
        }
    }
    double r = 0;
    for (uint32_t k = 0; k < d; k++)
        r += (double)fm[k] * fm[k] - (double)sq[k];
    return 0.5 * r;
}

/* a[i,j] = relu(a[i,j] + b[j]) over an [n x h] block. */
static void bias_relu(float *restrict a, const float *restrict b, size_t n, uint32_t h) {
    for (size_t i = 0; i < n; i++) {
        float *ai = a + i * h;
        for (uint32_t j = 0; j < h; j++) {
            float v = ai[j] + b[j];
            ai[j] = v > 0 ? v : 0;
        }
    }
}

/* a[i,j] = relu(a[i,j]) over an [n x h] block. */
static void relu(float *a, size_t n, uint32_t h) {
    for (size_t j = 0; j < n * h; j++)
        a[j] = a[j] > 0 ? a[j] : 0;
}

/* Runs of slots [lo, hi) the first layer reads per row; the slots between them are read
 * once. At most this many runs (one sgemm each): closer runs are merged, and since every
 * row holds the full values, reading a shared slot per row is only slower, never wrong. */
#define MT__MAX_RUNS 4

typedef struct mt__run {
    uint32_t lo, hi;
} mt__run_t;

/* Merges the two neighbouring runs of r[0..*nr) with the smallest gap between them. */
static void merge_closest(mt__run_t *r, size_t *nr) {
    size_t best = 0;
    for (size_t j = 1; j + 1 < *nr; j++)
        if (r[j + 1].lo - r[j].hi < r[best + 1].lo - r[best].hi) best = j;
    r[best].hi = r[best + 1].hi;
    memmove(&r[best + 1], &r[best + 2], (*nr - best - 2) * sizeof(r[0]));
    (*nr)--;
}

/* The runs of varying slots, at most MT__MAX_RUNS; @returns their count (0: none varies). */
static size_t varying_runs(const uint8_t *varies, uint32_t S, mt__run_t *runs) {
    mt__run_t r[MT__MAX_RUNS + 1];
    size_t nr = 0;
    for (uint32_t s = 0; s < S; s++) {
        if (!varies[s]) continue;
        if (nr && r[nr - 1].hi == s) {
            r[nr - 1].hi = s + 1;
            continue;
        }
        if (nr == MT__MAX_RUNS + 1) merge_closest(r, &nr);
        r[nr].lo = s;
        r[nr].hi = s + 1;
        nr++;
    }
    if (nr == MT__MAX_RUNS + 1) merge_closest(r, &nr);
    memcpy(runs, r, nr * sizeof(r[0]));
    return nr;
}

#ifndef NDEBUG
/* The caller's promise: a slot not flagged as varying holds row 0's values in every row. */
static int shared_slots_hold(const uint8_t *varies, const float *E, const float *W1, size_t n,
                             uint32_t S, uint32_t d) {
    for (size_t i = 1; i < n; i++)
        for (uint32_t s = 0; s < S; s++) {
            if (varies[s]) continue;
            if (W1[i * S + s] != W1[s]) return 0;
            if (memcmp(E + (i * S + s) * d, E + (size_t)s * d, d * sizeof(float))) return 0;
        }
    return 1;
}
#endif

/*
 * The first hidden layer, x W_0 + b_0, into a [n x h] when some slots are shared by every
 * row: their part (with the bias) once, zc = E[0][shared] W_0[shared] + b_0, then per row
 * zc + E[i][varying] W_0[varying], one sgemm per run of varying slots (the sub-matrices are
 * read in place: a run is contiguous in a row of E and in the rows of W_0). @returns 0, or -1
 * when sharing would save too little (most slots vary): the caller does the plain sgemm.
 */
static int first_layer_shared(const mt_model_t *m, const mt__model_scratch_t *sc, const float *E,
                              size_t n, const uint8_t *varies, float *a) {
    const uint32_t S = m->cfg.nslots, d = m->cfg.dim, in0 = m->in_width, h = m->cfg.hidden[0];
    mt__run_t runs[MT__MAX_RUNS];
    size_t nr = varying_runs(varies, S, runs);
    uint32_t per_row = 0;
    for (size_t r = 0; r < nr; r++)
        per_row += runs[r].hi - runs[r].lo;
    /* the shared part costs one row's worth of its slots: worth it from a few rows on */
    if (n < 4 || 8 * (uint64_t)per_row > 7 * (uint64_t)S) return -1;
    const float *W = tensor_values(m, m->mlp0), *b = tensor_values(m, m->mlp0 + 1);
    float *zc = sc->zc;
    memcpy(zc, b, h * sizeof(float));
    uint32_t lo = 0;
    for (size_t r = 0; r <= nr; r++) {
        uint32_t hi = r < nr ? runs[r].lo : S; /* shared slots [lo, hi) */
        if (hi > lo)
            cblas_sgemv(CblasRowMajor, CblasTrans, (int)((hi - lo) * d), (int)h, 1.0f,
                        W + (size_t)lo * d * h, (int)h, E + (size_t)lo * d, 1, 1.0f, zc, 1);
        if (r < nr) lo = runs[r].hi;
    }
    for (size_t i = 0; i < n; i++)
        memcpy(a + i * h, zc, h * sizeof(float));
    for (size_t r = 0; r < nr; r++) {
        uint32_t k = (runs[r].hi - runs[r].lo) * d;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)h, (int)k, 1.0f,
                    E + (size_t)runs[r].lo * d, (int)in0, W + (size_t)runs[r].lo * d * h, (int)h,
                    1.0f, a, (int)h);
    }
    relu(a, n, h);
    return 0;
}

/*
 * An MLP whose tensors start at index @p t0 (layer l's weights t0 + 2l, its bias t0 + 2l + 1,
 * the output weights t0 + 2L) over @p x [n x w_in]: its activations into @p acts (layer by
 * layer, [n x h_l] each), logits[i] += A_L[i] w_out. @p first_done: the first layer's
 * activations are in acts already (serving's shared slots).
 */
static void mlp_forward(const mt_model_t *m, size_t t0, const float *x, uint32_t w_in, size_t n,
                        int first_done, float *acts, float *logits) {
    const float *a_prev = x;
    uint32_t w_prev = w_in;
    float *a = acts;
    for (uint32_t l = 0; l < m->cfg.nhidden; l++) {
        const uint32_t h = m->cfg.hidden[l];
        if (l > 0 || !first_done) {
            const float *W = tensor_values(m, t0 + 2 * l);
            const float *b = tensor_values(m, t0 + 2 * l + 1);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)h, (int)w_prev,
                        1.0f, a_prev, (int)w_prev, W, (int)h, 0.0f, a, (int)h);
            bias_relu(a, b, n, h);
        }
        a_prev = a;
        w_prev = h;
        a += n * h;
    }
    const float *wout = tensor_values(m, t0 + 2 * m->cfg.nhidden);
    cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)n, (int)w_prev, 1.0f, a_prev, (int)w_prev, wout,
                1, 1.0f, logits, 1);
}

static void relu_backward(const float *restrict a, const float *da, const float *restrict g,
                          const float *restrict w, size_t n, uint32_t h, float *dz,
                          float *restrict db);
static void mlp_backward(mt_model_t *m, size_t t0, const float *x, uint32_t w_in0, size_t n,
                         const float *acts, const float *g, float *ga, float *gb, float *dx,
                         float beta);

/* mmoe's tensors: b0 0, experts.w 1, experts.b 2, gates.w 3, gates.b 4, task t's tower
 * from mlp0 + t * (2 * nhidden + 1). */
static size_t tower_t0(const mt_model_t *m, uint32_t t) {
    return m->mlp0 + (size_t)t * (2 * m->cfg.nhidden + 1);
}

/*
 * mmoe's forward pass over x = E [n x D]: the experts' activations (sc->ea [n x K*h_e]),
 * the gates (sc->gate [n x T*K], softmax over each task's K), each task's mixture
 * (sc->mix, task t's [n x h_e] at t * n * h_e) and its tower, added to task t's logits
 * (sc->logits + t * n, which hold b0[t] + the first order).
 */
static void mmoe_forward(const mt_model_t *m, const mt__model_scratch_t *sc, const float *E,
                         size_t n) {
    const uint32_t D = m->in_width, T = m->T, K = m->cfg.nexperts, h = m->cfg.expert_width;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)(K * h), (int)D, 1.0f, E,
                (int)D, tensor_values(m, 1), (int)(K * h), 0.0f, sc->ea, (int)(K * h));
    bias_relu(sc->ea, tensor_values(m, 2), n, K * h);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)(T * K), (int)D, 1.0f, E,
                (int)D, tensor_values(m, 3), (int)(T * K), 0.0f, sc->gate, (int)(T * K));
    const float *bg = tensor_values(m, 4);
    for (size_t i = 0; i < n; i++)
        for (uint32_t t = 0; t < T; t++) { /* softmax over task t's K gate logits */
            float *z = sc->gate + i * T * K + (size_t)t * K;
            float mx = -INFINITY;
            for (uint32_t k = 0; k < K; k++) {
                z[k] += bg[t * K + k];
                if (z[k] > mx) mx = z[k];
            }
            double sum = 0;
            for (uint32_t k = 0; k < K; k++)
                sum += z[k] = expf(z[k] - mx);
            for (uint32_t k = 0; k < K; k++)
                z[k] = (float)(z[k] / sum);
        }
    for (uint32_t t = 0; t < T; t++) {
        float *f = sc->mix + (size_t)t * n * h;
        for (size_t i = 0; i < n; i++) {
            const float *g = sc->gate + i * T * K + (size_t)t * K, *a = sc->ea + i * K * h;
            float *fi = f + i * h;
            for (uint32_t j = 0; j < h; j++)
                fi[j] = g[0] * a[j];
            for (uint32_t k = 1; k < K; k++)
                for (uint32_t j = 0; j < h; j++)
                    fi[j] += g[k] * a[(size_t)k * h + j];
        }
        mlp_forward(m, tower_t0(m, t), f, h, n, 0, sc->acts + (size_t)t * n * m->sum_width,
                    sc->logits + (size_t)t * n);
    }
}

/*
 * mmoe's backward pass for dL/dlogit_t = sc->g + t * n: every tensor's gradient but b0's,
 * and dE when not NULL.
 */
static void mmoe_backward(mt_model_t *m, const mt__model_scratch_t *sc, const float *E, size_t n,
                          float *dE) {
    const uint32_t D = m->in_width, T = m->T, K = m->cfg.nexperts, h = m->cfg.expert_width;
    memset(sc->dea, 0, n * K * h * sizeof(float));
    for (uint32_t t = 0; t < T; t++) {
        const float *f = sc->mix + (size_t)t * n * h;
        /* the tower: its gradients and dL/df_t */
        mlp_backward(m, tower_t0(m, t), f, h, n, sc->acts + (size_t)t * n * m->sum_width,
                     sc->g + (size_t)t * n, sc->ga, sc->gb, sc->dmix, 0.0f);
        /* f_t = sum_k g_t[k] a_k: dL/dg_t[k] = <df_t, a_k>, dL/da_k += g_t[k] df_t; then the
         * softmax: dz[k] = g[k] (dg[k] - sum_k' g[k'] dg[k']) */
        for (size_t i = 0; i < n; i++) {
            const float *df = sc->dmix + i * h, *a = sc->ea + i * K * h;
            const float *g = sc->gate + i * T * K + (size_t)t * K;
            float *dz = sc->dgate + i * T * K + (size_t)t * K, *da = sc->dea + i * K * h;
            double dot = 0;
            for (uint32_t k = 0; k < K; k++) {
                double s = 0;
                for (uint32_t j = 0; j < h; j++) {
                    s += (double)df[j] * a[(size_t)k * h + j];
                    da[(size_t)k * h + j] += g[k] * df[j];
                }
                dz[k] = (float)s;
                dot += g[k] * s;
            }
            for (uint32_t k = 0; k < K; k++)
                dz[k] = (float)(g[k] * (dz[k] - dot));
        }
    }
    /* the gates: dWg = E^T dZ, dbg = column sums */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)D, (int)(T * K), (int)n, 1.0f, E,
                (int)D, sc->dgate, (int)(T * K), 0.0f, m->grads + m->tensors[3].off, (int)(T * K));
    float *dbg = m->grads + m->tensors[4].off;
    memset(dbg, 0, T * K * sizeof(float));
    for (size_t i = 0; i < n; i++)
        for (uint32_t j = 0; j < T * K; j++)
            dbg[j] += sc->dgate[i * T * K + j];
    /* the experts: dPre = dA * relu'(A) and its column sums, dWe = E^T dPre */
    relu_backward(sc->ea, sc->dea, NULL, NULL, n, K * h, sc->dea, m->grads + m->tensors[2].off);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)D, (int)(K * h), (int)n, 1.0f, E,
                (int)D, sc->dea, (int)(K * h), 0.0f, m->grads + m->tensors[1].off, (int)(K * h));
    if (!dE) return;
    /* dE = dZ Wg^T + dPre We^T */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)D, (int)(T * K), 1.0f,
                sc->dgate, (int)(T * K), tensor_values(m, 3), (int)(T * K), 0.0f, dE, (int)D);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)D, (int)(K * h), 1.0f,
                sc->dea, (int)(K * h), tensor_values(m, 1), (int)(K * h), 1.0f, dE, (int)D);
}

/* dcnv2's cross layer c: its tensors' indexes (v, u: low rank; w: full rank). */
static size_t cross_t(const mt_model_t *m, uint32_t c) {
    return 1 + (size_t)c * m->per_cross;
}

/*
 * dcnv2's cross layers over X_0 = E: X_(c+1) = X_0 * Z_c + X_c, Z_c = X_c W_c + b_c (or
 * (X_c V_c) U_c + b_c). @p train keeps every X, Z and T for the backward pass (see the top of
 * this file); else Z is turned into X in place, two buffers in turn. @returns X_C.
 */
static const float *cross_forward(const mt_model_t *m, const mt__model_scratch_t *sc,
                                  const float *E, size_t n, int train) {
    const uint32_t D = m->in_width, C = m->cfg.ncross, r = m->cfg.cross_rank;
    const size_t nd = n * D;
    const float *x = E;
    for (uint32_t c = 0; c < C; c++) {
        const size_t t0 = cross_t(m, c);
        float *z = train ? sc->zs + c * nd : sc->xs + (c % 2) * nd;
        float *xn = train ? sc->xs + c * nd : z;
        if (r == 0) {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)D, (int)D, 1.0f, x,
                        (int)D, tensor_values(m, t0), (int)D, 0.0f, z, (int)D);
        } else {
            float *t = sc->ts + (train ? c * n * r : 0);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)r, (int)D, 1.0f, x,
                        (int)D, tensor_values(m, t0), (int)r, 0.0f, t, (int)r);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)D, (int)r, 1.0f, t,
                        (int)r, tensor_values(m, t0 + 1), (int)D, 0.0f, z, (int)D);
        }
        const float *restrict b = tensor_values(m, t0 + m->per_cross - 1);
        for (size_t i = 0; i < n; i++) {
            const float *restrict e = E + i * D, *restrict xi = x + i * D;
            float *zi = z + i * D, *xo = xn + i * D;
            for (uint32_t j = 0; j < D; j++) {
                float v = zi[j] + b[j];
                zi[j] = v; /* xo may be zi (scoring): v is read first */
                xo[j] = e[j] * v + xi[j];
            }
        }
        x = xn;
    }
    return x;
}

/*
 * The cross layers' backward pass: sc->gx holds dL/dX_C on entry. Writes every cross
 * tensor's gradient and, when @p dE is not NULL, dE = dL/dX_0: the residual path's gx after
 * layer 0 plus sum_c gx_(c+1) * Z_c (X_0 multiplies every layer's Z).
 */
static void cross_backward(mt_model_t *m, const mt__model_scratch_t *sc, const float *E, size_t n,
                           float *dE) {
    const uint32_t D = m->in_width, C = m->cfg.ncross, r = m->cfg.cross_rank;
    const size_t nd = n * D;
    float *restrict gx = sc->gx, *restrict dz = sc->dz;
    if (dE) memset(dE, 0, nd * sizeof(float));
    for (uint32_t c = C; c-- > 0;) {
        const size_t t0 = cross_t(m, c);
        const float *x = c ? sc->xs + (c - 1) * nd : E;
        const float *restrict z = sc->zs + c * nd;
        float *restrict db = m->grads + m->tensors[t0 + m->per_cross - 1].off;
        memset(db, 0, D * sizeof(float));
        for (size_t i = 0; i < n; i++) {
            const float *restrict e = E + i * D, *restrict zi = z + i * D;
            const float *restrict gi = gx + i * D;
            float *restrict dzi = dz + i * D;
            for (uint32_t j = 0; j < D; j++) {
                dzi[j] = gi[j] * e[j];
                db[j] += dzi[j];
            }
            if (dE) {
                float *restrict de = dE + i * D;
                for (uint32_t j = 0; j < D; j++)
                    de[j] += gi[j] * zi[j];
            }
        }
        const int last = c == 0 && !dE; /* dL/dX_0 not wanted: gx is not needed further */
        if (r == 0) {
            /* dW = X_c^T dZ; gx += dZ W^T (the residual's gx stays in it) */
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)D, (int)D, (int)n, 1.0f, x,
                        (int)D, dz, (int)D, 0.0f, m->grads + m->tensors[t0].off, (int)D);
            if (!last)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)D, (int)D, 1.0f,
                            dz, (int)D, tensor_values(m, t0), (int)D, 1.0f, gx, (int)D);
        } else {
            const float *t = sc->ts + c * n * r;
            float *dt = sc->dt;
            /* dU = T^T dZ; dT = dZ U^T; dV = X_c^T dT; gx += dT V^T */
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)r, (int)D, (int)n, 1.0f, t,
                        (int)r, dz, (int)D, 0.0f, m->grads + m->tensors[t0 + 1].off, (int)D);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)r, (int)D, 1.0f, dz,
                        (int)D, tensor_values(m, t0 + 1), (int)D, 0.0f, dt, (int)r);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)D, (int)r, (int)n, 1.0f, x,
                        (int)D, dt, (int)r, 0.0f, m->grads + m->tensors[t0].off, (int)r);
            if (!last)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)D, (int)r, 1.0f,
                            dt, (int)r, tensor_values(m, t0), (int)r, 1.0f, gx, (int)D);
        }
    }
    if (dE)
        for (size_t j = 0; j < nd; j++)
            dE[j] += gx[j];
}

/* din's tensors: b0 0, att.w 1, att.b 2, att.out.w 3, att.out.b 4, the MLP from mlp0. */
#define DIN_AW  1
#define DIN_AB  2
#define DIN_AOW 3
#define DIN_AOB 4

/*
 * din's attention over E [n x D]: the units' inputs (sc->az), activations (sc->au) and
 * weights (sc->aw) of every (example, position), and the MLP's input x' (sc->ax: E's row with
 * the sequence's L cells replaced by v = sum_j a_j k_j). @returns x'.
 */
static const float *din_forward(const mt_model_t *m, const mt__model_scratch_t *sc, const float *E,
                                size_t n) {
    const uint32_t D = m->in_width, L = m->cfg.seq_len, H = m->cfg.attention_width;
    const uint32_t d = m->seq_d, d4 = 4 * d, Dx = m->x_width, so = m->seq_off;
    const size_t nl = n * L;
    for (size_t i = 0; i < n; i++) {
        const float *restrict q = E + i * D + m->q_off;
        for (uint32_t j = 0; j < L; j++) {
            const float *restrict k = E + i * D + so + (size_t)j * d;
            float *restrict z = sc->az + (i * L + j) * d4;
            for (uint32_t c = 0; c < d; c++) {
                z[c] = q[c];
                z[d + c] = k[c];
                z[2 * d + c] = q[c] - k[c];
                z[3 * d + c] = q[c] * k[c];
            }
        }
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)nl, (int)H, (int)d4, 1.0f, sc->az,
                (int)d4, tensor_values(m, DIN_AW), (int)H, 0.0f, sc->au, (int)H);
    const float *restrict ab = tensor_values(m, DIN_AB);
    for (size_t r = 0; r < nl; r++) {
        float *u = sc->au + r * H;
        for (uint32_t h = 0; h < H; h++)
            u[h] = sigmoidf_stable(u[h] + ab[h]);
    }
    const float bo = tensor_values(m, DIN_AOB)[0];
    for (size_t r = 0; r < nl; r++)
        sc->aw[r] = bo;
    cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)nl, (int)H, 1.0f, sc->au, (int)H,
                tensor_values(m, DIN_AOW), 1, 1.0f, sc->aw, 1);
    const size_t tail = D - so - (size_t)L * d; /* the cells after the sequence's */
    for (size_t i = 0; i < n; i++) {
        const float *e = E + i * D;
        float *x = sc->ax + i * Dx;
        memcpy(x, e, so * sizeof(float));
        float *restrict v = x + so;
        for (uint32_t c = 0; c < d; c++)
            v[c] = 0.0f;
        for (uint32_t j = 0; j < L; j++) {
            const float a = sc->aw[i * L + j], *restrict k = e + so + (size_t)j * d;
            for (uint32_t c = 0; c < d; c++)
                v[c] += a * k[c];
        }
        memcpy(x + so + d, e + so + (size_t)L * d, tail * sizeof(float));
    }
    return sc->ax;
}

/*
 * din's backward pass: sc->adx holds dL/dx' on entry. Writes the attention tensors'
 * gradients and, when @p dE is not NULL, dE: x''s gradient for the cells it copied, plus the
 * attention's part for the query's cell and the sequence's keys.
 */
static void din_backward(mt_model_t *m, const mt__model_scratch_t *sc, const float *E, size_t n,
                         float *dE) {
    const uint32_t D = m->in_width, L = m->cfg.seq_len, H = m->cfg.attention_width;
    const uint32_t d = m->seq_d, d4 = 4 * d, Dx = m->x_width, so = m->seq_off;
    const size_t nl = n * L;
    /* a_ij's gradient: <dv_i, k_ij> */
    for (size_t i = 0; i < n; i++) {
        const float *restrict dv = sc->adx + i * Dx + so;
        for (uint32_t j = 0; j < L; j++) {
            const float *restrict k = E + i * D + so + (size_t)j * d;
            double s = 0;
            for (uint32_t c = 0; c < d; c++)
                s += (double)dv[c] * k[c];
            sc->ada[i * L + j] = (float)s;
        }
    }
    /* a = u wa + bo: d bo = sum da, d wa = U^T da; dU = da wa^T * u (1 - u), d ba its sums */
    double sb = 0;
    for (size_t r = 0; r < nl; r++)
        sb += sc->ada[r];
    m->grads[m->tensors[DIN_AOB].off] = (float)sb;
    cblas_sgemv(CblasRowMajor, CblasTrans, (int)nl, (int)H, 1.0f, sc->au, (int)H, sc->ada, 1, 0.0f,
                m->grads + m->tensors[DIN_AOW].off, 1);
    const float *restrict wa = tensor_values(m, DIN_AOW);
    float *restrict db = m->grads + m->tensors[DIN_AB].off;
    memset(db, 0, H * sizeof(float));
    for (size_t r = 0; r < nl; r++) {
        const float *restrict u = sc->au + r * H;
        float *restrict du = sc->adu + r * H;
        const float g = sc->ada[r];
        for (uint32_t h = 0; h < H; h++) {
            du[h] = g * wa[h] * u[h] * (1.0f - u[h]);
            db[h] += du[h];
        }
    }
    /* d Wa = Z^T dU */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)d4, (int)H, (int)nl, 1.0f, sc->az,
                (int)d4, sc->adu, (int)H, 0.0f, m->grads + m->tensors[DIN_AW].off, (int)H);
    if (!dE) return;
    /* dZ = dU Wa^T; z = [q, k, q - k, q * k] */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nl, (int)d4, (int)H, 1.0f, sc->adu,
                (int)H, tensor_values(m, DIN_AW), (int)H, 0.0f, sc->adz, (int)d4);
    const size_t tail = D - so - (size_t)L * d;
    for (size_t i = 0; i < n; i++) {
        const float *e = E + i * D, *dx = sc->adx + i * Dx;
        float *de = dE + i * D;
        memcpy(de, dx, so * sizeof(float));
        memcpy(de + so + (size_t)L * d, dx + so + d, tail * sizeof(float));
        const float *restrict q = e + m->q_off, *restrict dv = dx + so;
        float *restrict dq = de + m->q_off;
        for (uint32_t j = 0; j < L; j++) {
            const float *restrict k = e + so + (size_t)j * d;
            const float *restrict dz = sc->adz + (i * L + j) * d4;
            const float a = sc->aw[i * L + j];
            float *restrict dk = de + so + (size_t)j * d;
            for (uint32_t c = 0; c < d; c++) {
                dq[c] += dz[c] + dz[2 * d + c] + dz[3 * d + c] * k[c];
                dk[c] = a * dv[c] + dz[d + c] - dz[2 * d + c] + dz[3 * d + c] * q[c];
            }
        }
    }
}

/*
 * logits[i] = b0 + sum_s W1 + FM (deepfm) + MLP(x_i), x_i = E[i] (deepfm) or the cross
 * layers' output (dcnv2, kept for the backward pass when @p train); leaves the hidden
 * activations in sc->acts and the per-example slot sums of E in sc->fm. @p varies (NULL:
 * all) as in mt_model_forward_serving(). @returns the MLP's input.
 */
static const float *forward_logits(const mt_model_t *m, const mt__model_scratch_t *sc,
                                   const float *E, const float *W1, size_t n, const uint8_t *varies,
                                   int train) {
    const uint32_t S = m->cfg.nslots, d = m->cfg.dim, in0 = m->in_width;
    const float b0 = m->values[m->tensors[0].off];
    const int dcn = is_dcn(m);
    assert(!varies || shared_slots_hold(varies, E, W1, n, S, d));
    if (is_mmoe(m)) { /* each task's logits: b0[t] + the shared first order + its tower */
        const float *b = m->values + m->tensors[0].off;
        for (size_t i = 0; i < n; i++) {
            double lin = 0;
            for (uint32_t s = 0; s < S; s++)
                lin += W1[i * S + s];
            for (uint32_t t = 0; t < m->T; t++)
                sc->logits[(size_t)t * n + i] = (float)(b[t] + lin);
        }
        mmoe_forward(m, sc, E, n);
        return E;
    }
    if (is_din(m)) { /* b0 + the first order but the sequence's + FM(x') + MLP(x') */
        const uint32_t sq = m->cfg.seq_slot;
        const float *x = din_forward(m, sc, E, n);
        for (size_t i = 0; i < n; i++) {
            double lin = b0;
            for (uint32_t s = 0; s < S; s++)
                lin += s == sq ? 0.0 : W1[i * S + s];
            double fm2 = d == 16 ? fm_example(x + i * m->x_width, S, 16, sc->fm + i * 16, sc->sq)
                                 : fm_example(x + i * m->x_width, S, d, sc->fm + i * d, sc->sq);
            sc->logits[i] = (float)(lin + fm2);
        }
        mlp_forward(m, m->mlp0, x, m->x_width, n, 0, sc->acts, sc->logits);
        return x;
    }

    /* First order, FM second order (deepfm). */
    for (size_t i = 0; i < n; i++) {
        const float *w = W1 + i * S;
        double lin = b0;
        for (uint32_t s = 0; s < S; s++)
            lin += w[s];
        double fm2 = dcn       ? 0.0
                     : d == 16 ? fm_example(E + i * in0, S, 16, sc->fm + i * 16, sc->sq)
                               : fm_example(E + i * in0, S, d, sc->fm + i * d, sc->sq);
        sc->logits[i] = (float)(lin + fm2);
    }

    /* MLP: A_l = relu(A_(l-1) W_l + b_l), logits += A_L w_out. */
    const float *x = dcn ? cross_forward(m, sc, E, n, train) : E;
    int first_done =
        varies && !dcn && m->cfg.nhidden > 0 && !first_layer_shared(m, sc, E, n, varies, sc->acts);
    mlp_forward(m, m->mlp0, x, in0, n, first_done, sc->acts, sc->logits);
    return x;
}

/* de[s,k] = g * (fm[k] - e[s,k]): the FM term's dL/dE of one example. */
static inline void fm_backward(const float *restrict e, const float *restrict fm, float g,
                               uint32_t S, uint32_t d, float *restrict de) {
    for (uint32_t s = 0; s < S; s++)
        for (uint32_t k = 0; k < d; k++)
            de[(size_t)s * d + k] = g * (fm[k] - e[(size_t)s * d + k]);
}

/*
 * The backward pass through a ReLU layer's activation a [n x h]: dz = da * [a > 0] and the
 * bias gradient db[j] = sum_i dz[i,j] (summed in example order). da is the array @p da, or,
 * when NULL, the outer product g w^T (the output layer's dA, never stored). @p dz may be @p da.
 */
static void relu_backward(const float *restrict a, const float *da, const float *restrict g,
                          const float *restrict w, size_t n, uint32_t h, float *dz,
                          float *restrict db) {
    memset(db, 0, h * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        const float *ai = a + i * h;
        float *dzi = dz + i * h;
        if (da) {
            const float *dai = da + i * h;
            for (uint32_t j = 0; j < h; j++) {
                /* the load first, then the select: a load under the condition kept GCC from
                 * vectorizing (a branch per element, mispredicted half the time) */
                const float d = dai[j];
                float v = ai[j] > 0 ? d : 0.0f;
                dzi[j] = v;
                db[j] += v;
            }
        } else {
            const float gi = g[i];
            for (uint32_t j = 0; j < h; j++) {
                /* g_i [a > 0] w_j: selecting g_i (not the product) keeps the loop free of
                 * branches, so that it vectorizes */
                float v = (ai[j] > 0 ? gi : 0.0f) * w[j];
                dzi[j] = v;
                db[j] += v;
            }
        }
    }
}

/*
 * The backward pass of mlp_forward()'s MLP (tensors from @p t0, input @p x [n x w_in],
 * activations @p acts) for dL/dlogit = @p g [n]: writes its tensors' gradients and, when @p dx
 * is not NULL, dx = beta * dx + dL/dx. @p ga, @p gb: scratch of n * the widest layer each.
 */
static void mlp_backward(mt_model_t *m, size_t t0, const float *x, uint32_t w_in0, size_t n,
                         const float *acts, const float *g, float *ga, float *gb, float *dx,
                         float beta) {
    const uint32_t L = m->cfg.nhidden;
    /* Activation of layer l starts at acts + n * (h_0 + ... + h_(l-1)). */
    size_t act_off[MT_MODEL_MAX_HIDDEN + 1];
    act_off[0] = 0;
    for (uint32_t l = 0; l < L; l++)
        act_off[l + 1] = act_off[l] + n * m->cfg.hidden[l];
    const float *a_last = L ? acts + act_off[L - 1] : x;
    const uint32_t w_last = L ? m->cfg.hidden[L - 1] : w_in0;
    const mt__model_tensor_t *tout = &m->tensors[t0 + 2 * L];
    const float *wout = m->values + tout->off;
    /* d w_out = A_L^T g */
    cblas_sgemv(CblasRowMajor, CblasTrans, (int)n, (int)w_last, 1.0f, a_last, (int)w_last, g, 1,
                0.0f, m->grads + tout->off, 1);
    if (L == 0) {
        /* dx = beta dx + g w_out^T */
        if (!dx) return;
        if (beta == 0.0f) memset(dx, 0, n * w_in0 * sizeof(float));
        cblas_sger(CblasRowMajor, (int)n, (int)w_in0, 1.0f, g, 1, wout, 1, dx, (int)w_in0);
        return;
    }
    /* dZ_L = (g w_out^T) * relu'(Z_L), and its column sums (the bias gradient), in one pass */
    float *da = ga, *da_other = gb;
    relu_backward(acts + act_off[L - 1], NULL, g, wout, n, w_last, da,
                  m->grads + m->tensors[t0 + 2 * L - 1].off);
    for (uint32_t l = L; l-- > 0;) {
        const uint32_t h = m->cfg.hidden[l];
        const uint32_t w_in = l ? m->cfg.hidden[l - 1] : w_in0;
        const float *a_in = l ? acts + act_off[l - 1] : x;
        const mt__model_tensor_t *tw = &m->tensors[t0 + 2 * l];
        /* dW = A_in^T dZ */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)w_in, (int)h, (int)n, 1.0f, a_in,
                    (int)w_in, da, (int)h, 0.0f, m->grads + tw->off, (int)h);
        /* dA_in = dZ W^T; for the first layer into dx. */
        const float *W = m->values + tw->off;
        if (l > 0) {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)w_in, (int)h, 1.0f,
                        da, (int)h, W, (int)h, 0.0f, da_other, (int)w_in);
            /* dZ_(l-1) = dA_in * relu'(Z_(l-1)) and the column sums, in one pass */
            relu_backward(a_in, da_other, NULL, NULL, n, w_in, da_other,
                          m->grads + m->tensors[t0 + 2 * l - 1].off);
            float *t = da;
            da = da_other;
            da_other = t;
        } else if (dx) {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)w_in, (int)h, 1.0f,
                        da, (int)h, W, (int)h, beta, dx, (int)w_in);
        }
    }
}

static mt_err_t check_forward_args(const mt_model_t *m, const float *E, const float *W1, size_t n,
                                   const float *probs) {
    if (!m) return MT_INVALID;
    if (n > (size_t)INT_MAX) return MT_INVALID;
    if (n > 0 && (!E || !W1 || !probs)) return MT_INVALID;
    return MT_OK;
}

static mt_err_t forward_impl(const mt_model_t *m, mt_model_ws_t *ws, const float *E,
                             const float *W1, size_t n, float log_rate, const uint8_t *varies,
                             float *probs) {
    mt_err_t err = check_forward_args(m, E, W1, n, probs);
    if (err != MT_OK || n == 0) return err;
    if (is_dcn(m) || is_mmoe(m) || is_din(m)) varies = NULL; /* read per row anyway */
    mt_model_ws_t tmp = {0};
    mt_model_ws_t *use = ws ? ws : &tmp;
    mt__model_scratch_t sc;
    err = ws_reserve(use, m, n, 0, &sc);
    if (err != MT_OK) goto out;
    forward_logits(m, &sc, E, W1, n, varies, 0);
    for (size_t i = 0; i < n; i++)
        for (uint32_t t = 0; t < m->T; t++)
            probs[i * m->T + t] = sigmoidf_stable(sc.logits[(size_t)t * n + i] + log_rate);
out:
    free(tmp.buf);
    return err;
}

static void set_tensor(mt_model_t *m, const char *name, uint32_t ndim, uint32_t d0, uint32_t d1) {
    mt__model_tensor_t *t = &m->tensors[m->ntensors++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = ndim == 2 ? d1 : 0;
    t->size = ndim == 2 ? (size_t)d0 * d1 : d0;
    t->off = m->nvalues;
    m->nvalues += t->size;
}

/* ============================== API ============================== */

mt_err_t mt_model_create(const mt_model_config_t *cfg, mt_model_t **out) {
    if (!out) return MT_CONFIG;
    *out = NULL;
    mt_err_t err = mt_model_config_validate(cfg, NULL, 0);
    if (err != MT_OK) return err;
    mt_model_t *m = calloc(1, sizeof *m);
    if (!m) return MT_NOMEM;
    m->cfg = *cfg;
    for (uint32_t l = cfg->nhidden; l < MT_MODEL_MAX_HIDDEN; l++)
        m->cfg.hidden[l] = 0;
    if (cfg->slot_dims) {
        if (!(m->dims = malloc(cfg->nslots * sizeof(uint32_t)))) {
            free(m);
            return MT_NOMEM;
        }
        memcpy(m->dims, cfg->slot_dims, cfg->nslots * sizeof(uint32_t));
        m->cfg.slot_dims = m->dims;
    }
    for (uint32_t s = 0; s < cfg->nslots; s++) {
        if (is_din(m) && s == cfg->seq_slot) m->seq_off = m->in_width;
        if (is_din(m) && s == cfg->seq_query) m->q_off = m->in_width;
        m->in_width += mt_model_slot_width(&m->cfg, s);
    }
    m->x_width = m->in_width;
    if (is_din(m)) {
        m->seq_d = mt_model_slot_dim(&m->cfg, cfg->seq_query);
        m->x_width = m->in_width - (cfg->seq_len - 1) * m->seq_d;
    } else {
        m->cfg.seq_slot = m->cfg.seq_query = 0;
    }

    set_tensor(m, "b0", 1, 1, 0);
    if (is_dcn(m)) {
        const uint32_t D = m->in_width, r = cfg->cross_rank;
        m->per_cross = r ? 3 : 2;
        for (uint32_t c = 0; c < cfg->ncross; c++) {
            char name[MT_MODEL_NAME_MAX];
            if (r) {
                snprintf(name, sizeof name, "cross.%u.v", c);
                set_tensor(m, name, 2, D, r);
                snprintf(name, sizeof name, "cross.%u.u", c);
                set_tensor(m, name, 2, r, D);
            } else {
                snprintf(name, sizeof name, "cross.%u.w", c);
                set_tensor(m, name, 2, D, D);
            }
            snprintf(name, sizeof name, "cross.%u.b", c);
            set_tensor(m, name, 1, D, 0);
        }
    } else {
        m->cfg.ncross = 0;
        m->cfg.cross_rank = 0;
    }
    mt_model_family_t fam;
    mt_model_family_get(cfg, &fam);
    m->T = mt_model_family_ntasks(&fam);
    if (is_mmoe(m)) {
        const uint32_t D = m->in_width, T = m->T, K = cfg->nexperts, h = cfg->expert_width;
        m->tensors[0].shape[0] = T; /* b0: one per task */
        m->tensors[0].size = T;
        m->nvalues = T;
        set_tensor(m, "experts.w", 2, D, K * h);
        set_tensor(m, "experts.b", 1, K * h, 0);
        set_tensor(m, "gates.w", 2, D, T * K);
        set_tensor(m, "gates.b", 1, T * K, 0);
    } else {
        m->cfg.ntasks = 1;
    }
    if (is_din(m)) {
        const uint32_t d = m->seq_d, H = cfg->attention_width;
        set_tensor(m, "att.w", 2, 4 * d, H);
        set_tensor(m, "att.b", 1, H, 0);
        set_tensor(m, "att.out.w", 2, H, 1);
        set_tensor(m, "att.out.b", 1, 1, 0);
    }
    m->mlp0 = m->ntensors;
    for (uint32_t t = 0; t < m->T; t++) {
        uint32_t w_prev = is_mmoe(m) ? cfg->expert_width : m->x_width;
        for (uint32_t l = 0; l < cfg->nhidden; l++) {
            char name[MT_MODEL_NAME_MAX];
            uint32_t h = cfg->hidden[l];
            if (is_mmoe(m)) {
                snprintf(name, sizeof name, "tower.%u.%u.w", t, l);
                set_tensor(m, name, 2, w_prev, h);
                snprintf(name, sizeof name, "tower.%u.%u.b", t, l);
            } else {
                snprintf(name, sizeof name, "mlp.%u.w", l);
                set_tensor(m, name, 2, w_prev, h);
                snprintf(name, sizeof name, "mlp.%u.b", l);
            }
            set_tensor(m, name, 1, h, 0);
            if (t == 0) {
                if (h > m->max_width) m->max_width = h;
                m->sum_width += h;
            }
            w_prev = h;
        }
        char name[MT_MODEL_NAME_MAX] = "mlp.out.w";
        if (is_mmoe(m)) snprintf(name, sizeof name, "tower.%u.out.w", t);
        set_tensor(m, name, 2, w_prev, 1);
    }

    m->values = calloc(m->nvalues, sizeof(float));
    m->grads = calloc(m->nvalues, sizeof(float));
    if (!m->values || !m->grads) {
        err = MT_NOMEM;
        goto out;
    }
    /* Xavier uniform for weight matrices; each tensor its own stream so that changing one
     * layer's width does not reshuffle the others. */
    for (size_t t = 0; t < m->ntensors; t++) {
        mt__model_tensor_t *tt = &m->tensors[t];
        if (tt->ndim != 2) continue;
        double a = sqrt(6.0 / ((double)tt->shape[0] + tt->shape[1]));
        uint64_t st = cfg->init_seed ^ (0xD1B54A32D192ED03ull * (uint64_t)(t + 1));
        float *v = m->values + tt->off;
        for (size_t j = 0; j < tt->size; j++) {
            double u = (double)(splitmix64(&st) >> 11) * 0x1.0p-53; /* [0, 1) */
            v[j] = (float)((2.0 * u - 1.0) * a);
        }
    }
    *out = m;
    return MT_OK;
out:
    mt_model_destroy(m);
    return err;
}

void mt_model_destroy(mt_model_t *m) {
    if (!m) return;
    free(m->values);
    free(m->grads);
    free(m->ws.buf);
    free(m->dims);
    free(m);
}

const mt_model_config_t *mt_model_config(const mt_model_t *m) {
    return &m->cfg;
}

uint32_t mt_model_ntasks(const mt_model_t *m) {
    return m ? m->T : 0;
}

size_t mt_model_nparams(const mt_model_t *m) {
    return m ? m->ntensors : 0;
}

mt_err_t mt_model_param(const mt_model_t *m, size_t i, mt_model_param_t *out) {
    if (!m || !out || i >= m->ntensors) return MT_INVALID;
    const mt__model_tensor_t *t = &m->tensors[i];
    out->name = t->name;
    out->ndim = t->ndim;
    out->shape[0] = t->shape[0];
    out->shape[1] = t->shape[1];
    out->size = t->size;
    out->values = m->values + t->off;
    out->grads = m->grads + t->off;
    return MT_OK;
}

mt_err_t mt_model_param_find(const mt_model_t *m, const char *name, mt_model_param_t *out) {
    if (!m || !name || !out) return MT_INVALID;
    for (size_t i = 0; i < m->ntensors; i++)
        if (strcmp(m->tensors[i].name, name) == 0) return mt_model_param(m, i, out);
    return MT_NOT_FOUND;
}

mt_err_t mt_model_ws_create(mt_model_ws_t **out) {
    if (!out) return MT_INVALID;
    *out = calloc(1, sizeof **out);
    return *out ? MT_OK : MT_NOMEM;
}

void mt_model_ws_destroy(mt_model_ws_t *ws) {
    if (!ws) return;
    free(ws->buf);
    free(ws);
}

mt_err_t mt_model_forward(const mt_model_t *m, mt_model_ws_t *ws, const float *E, const float *W1,
                          size_t n, float *probs) {
    return forward_impl(m, ws, E, W1, n, 0.0f, NULL, probs);
}

mt_err_t mt_model_forward_serving(const mt_model_t *m, mt_model_ws_t *ws, const float *E,
                                  const float *W1, size_t n, float sample_rate,
                                  const uint8_t *varies, float *probs) {
    if (!(sample_rate > 0.0f && sample_rate <= 1.0f)) return MT_INVALID;
    return forward_impl(m, ws, E, W1, n, logf(sample_rate), varies, probs);
}

mt_err_t mt_model_forward_backward(mt_model_t *m, const float *E, const float *W1,
                                   const float *labels, const float *weights, size_t n,
                                   float *probs, float *loss, float *dE, float *dW1) {
    if (!m || n > (size_t)INT_MAX) return MT_INVALID;
    if (n > 0 && (!E || !W1 || !labels)) return MT_INVALID;
    for (size_t i = 0; i < n * m->T; i++)
        if (!(labels[i] >= 0.0f && labels[i] <= 1.0f)) return MT_INVALID;
    for (size_t i = 0; weights && i < n; i++)
        if (!(weights[i] >= 0.0f && isfinite(weights[i]))) return MT_INVALID;
    if (n == 0) {
        memset(m->grads, 0, m->nvalues * sizeof(float));
        if (loss) *loss = 0.0f;
        return MT_OK;
    }
    /* Every gradient below is written whole (sgemm/sgemv with beta 0, the bias gradients
     * from zero), so m->grads is not cleared first. */
    mt__model_scratch_t sc;
    mt_err_t err = ws_reserve(&m->ws, m, n, 1, &sc);
    if (err != MT_OK) return err;
    const float *x = forward_logits(m, &sc, E, W1, n, NULL, 1);
    const int dcn = is_dcn(m);

    const uint32_t S = m->cfg.nslots, d = m->cfg.dim, in0 = m->in_width, T = m->T;
    const double inv_n = 1.0 / (double)n;
    double loss_sum = 0;
    for (uint32_t t = 0; t < T; t++) { /* task t's logits and gradients at t * n */
        /* mmoe weighs each task's loss; the one task of the others has weight 1 */
        const double tw = is_mmoe(m) ? m->cfg.task_weight[t] : 1.0;
        double gsum = 0;
        for (size_t i = 0; i < n; i++) {
            float z = sc.logits[(size_t)t * n + i], y = labels[i * T + t];
            float w = weights ? weights[i] : 1.0f;
            float p = sigmoidf_stable(z);
            if (probs) probs[i * T + t] = p;
            /* log loss from the logit: max(z,0) - z*y + log(1 + exp(-|z|)) */
            double l = (z > 0 ? (double)z : 0.0) - (double)z * y + log1p(exp(-fabs((double)z)));
            loss_sum += tw * w * l;
            float g = (float)(tw * w * ((double)p - y) * inv_n);
            sc.g[(size_t)t * n + i] = g;
            gsum += g;
        }
        m->grads[m->tensors[0].off + t] = (float)gsum;
    }
    if (loss) *loss = (float)(loss_sum * inv_n);

    if (dW1) /* the first order is every task's: the sum of their gradients */
        for (size_t i = 0; i < n; i++) {
            float g = sc.g[i];
            for (uint32_t t = 1; t < T; t++)
                g += sc.g[(size_t)t * n + i];
            for (uint32_t s = 0; s < S; s++)
                dW1[i * S + s] = g;
            if (is_din(m)) dW1[i * S + m->cfg.seq_slot] = 0.0f; /* not read */
        }
    if (is_mmoe(m)) {
        mmoe_backward(m, &sc, E, n, dE);
        return MT_OK;
    }
    if (is_din(m)) { /* dL/dx' (FM, then the MLP's) always: the attention's gradients need dv */
        for (size_t i = 0; i < n; i++)
            fm_backward(x + i * m->x_width, sc.fm + i * d, sc.g[i], S, d, sc.adx + i * m->x_width);
        mlp_backward(m, m->mlp0, x, m->x_width, n, sc.acts, sc.g, sc.ga, sc.gb, sc.adx, 1.0f);
        din_backward(m, &sc, E, n, dE);
        return MT_OK;
    }

    /* FM: d/dE[i,s,k] = g_i * (sum_s' E[i,s',k] - E[i,s,k]), the sums kept by the forward
     * pass. The MLP part is added below. (dcnv2: the MLP's dL/dx goes to gx, through the
     * cross layers into dE.) */
    float *dx = dcn ? sc.gx : dE;
    if (dE && !dcn) {
        if (d == 16)
            for (size_t i = 0; i < n; i++)
                fm_backward(E + i * in0, sc.fm + i * 16, sc.g[i], S, 16, dE + i * in0);
        else
            for (size_t i = 0; i < n; i++)
                fm_backward(E + i * in0, sc.fm + i * d, sc.g[i], S, d, dE + i * in0);
    }

    /* MLP backward: deepfm adds its dL/dx to the FM's dE; dcnv2 writes dL/dX_C to gx, into
     * the cross layers. */
    mlp_backward(m, m->mlp0, x, in0, n, sc.acts, sc.g, sc.ga, sc.gb, dx, dcn ? 0.0f : 1.0f);
    if (dcn) cross_backward(m, &sc, E, n, dE);
    return MT_OK;
}

/* ============================== AUC ============================== */

typedef struct {
    float score;
    int pos;
} auc_item_t;

static int auc_cmp(const void *a, const void *b) {
    float x = ((const auc_item_t *)a)->score, y = ((const auc_item_t *)b)->score;
    return (x > y) - (x < y);
}

mt_err_t mt_model_auc(const float *scores, const float *labels, size_t n, double *auc) {
    if (!scores || !labels || !auc) return MT_INVALID;
    size_t npos = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(scores[i])) return MT_INVALID;
        npos += labels[i] > 0.5f;
    }
    size_t nneg = n - npos;
    if (npos == 0 || nneg == 0) return MT_INVALID;
    auc_item_t *it = malloc(n * sizeof *it);
    if (!it) return MT_NOMEM;
    for (size_t i = 0; i < n; i++) {
        it[i].score = scores[i];
        it[i].pos = labels[i] > 0.5f;
    }
    qsort(it, n, sizeof *it, auc_cmp);
    /* Sum of the (1-based, tie-averaged) ranks of the positives: Mann-Whitney U. */
    double rank_sum = 0;
    for (size_t i = 0; i < n;) {
        size_t j = i, pos_in_group = 0;
        while (j < n && it[j].score == it[i].score)
            pos_in_group += (size_t)it[j++].pos;
        double avg_rank = ((double)(i + 1) + (double)j) / 2.0;
        rank_sum += avg_rank * (double)pos_in_group;
        i = j;
    }
    free(it);
    double np = (double)npos, nn = (double)nneg;
    *auc = (rank_sum - np * (np + 1) / 2.0) / (np * nn);
    return MT_OK;
}
