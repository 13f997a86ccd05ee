/*
 * model_dump.c - one model computation written out as JSON for an independent check
 * (tests/reference/torch_reference.py rebuilds the model in PyTorch from it).
 *
 * Usage: model_dump [-t deepfm|dcnv2|mmoe|din] [-c CROSS_LAYERS] [-r CROSS_RANK]
 *                   [-T TASKS] [-K EXPERTS] [-H EXPERT_WIDTH]
 *                   [-q SEQ_SLOT] [-Q QUERY_SLOT] [-L SEQ_LEN] [-A ATT_WIDTH]
 *                   [-D D0,D1,...] SLOTS DIM N SEED [HIDDEN...]
 * (-c, -r: dcnv2; -T, -K, -H: mmoe; -q, -Q, -L, -A: din's sequence slot, the candidate item's
 * slot that attends it, the sequence's length and the attention width; -D: per-slot dims,
 * SLOTS of them; E is then [N x the cells' widths summed], din's sequence cell SEQ_LEN times
 * the query slot's dim: mt_model_slot_width())
 *
 * Creates the model (mt_model_create), overwrites every dense parameter with new draws (a
 * weight matrix U(-a, a) in its Xavier range, a bias or b0 U(-0.1, 0.1): so that they are
 * not the zeros of initialization), draws the inputs
 * (E, W1 in U(-0.5, 0.5), labels in {0, 1} with every fourth one fractional, weights in
 * [0, 2); din: example i's sequence holds i % (SEQ_LEN + 1) ids, its positions from there on
 * are zeros as the trainer's padding, so that the check covers sequences empty, short and
 * full; the sequence slot's W1 cell, which din does not read, keeps its draw), and writes:
 *   - the configuration ("model", "slots", "dim", "dims", ...; din: "seq");
 *   - "params": name, shape, values and the gradients of mt_model_forward_backward();
 *   - "E", "W1", "labels", "weights" and its "probs", "loss", "dE", "dW1";
 *   - "forward": mt_model_forward()'s probabilities of the same inputs;
 *   - "serving": inputs where only the slots flagged in "varies" differ between rows (the
 *     others copy row 0, as a request's user slots), the rate, and the probabilities of
 *     mt_model_forward_serving().
 * Every float is printed with 9 significant digits (it reads back exactly). Exit status 0,
 * 1 on a model error, 2 on bad arguments.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mt/model.h"

static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static float uniform(uint64_t *s, float lo, float hi) {
    return lo + (hi - lo) * (float)((double)(rng_next(s) >> 11) * 0x1.0p-53);
}

static void floats(const char *key, const float *v, size_t n, int comma) {
    printf("\"%s\":[", key);
    for (size_t i = 0; i < n; i++)
        printf("%s%.9g", i ? "," : "", (double)v[i]);
    printf("]%s\n", comma ? "," : "");
}

int main(int argc, char **argv) {
    mt_model_config_t c;
    mt_model_config_init(&c);
    int opt;
    uint32_t dims[64];
    size_t ndims = 0;
    while ((opt = getopt(argc, argv, "t:c:r:D:T:K:H:q:Q:L:A:")) != -1) {
        if (opt == 't' && mt_model_type_parse(optarg, &c.type) == MT_OK) continue;
        if (opt == 'c')
            c.ncross = (uint32_t)strtoul(optarg, NULL, 10);
        else if (opt == 'r')
            c.cross_rank = (uint32_t)strtoul(optarg, NULL, 10);
        else if (opt == 'T')
            c.ntasks = (uint32_t)strtoul(optarg, NULL, 10);
        else if (opt == 'K')
            c.nexperts = (uint32_t)strtoul(optarg, NULL, 10);
        else if (opt == 'H')
            c.expert_width = (uint32_t)strtoul(optarg, NULL, 10);
        else if (opt == 'q')
            c.seq_slot = (uint32_t)strtoul(optarg, NULL, 10);
        else if (opt == 'Q')
            c.seq_query = (uint32_t)strtoul(optarg, NULL, 10);
        else if (opt == 'L')
            c.seq_len = (uint32_t)strtoul(optarg, NULL, 10);
        else if (opt == 'A')
            c.attention_width = (uint32_t)strtoul(optarg, NULL, 10);
        else if (opt == 'D')
            for (char *p = optarg; *p && ndims < 64; p += *p == ',')
                dims[ndims++] = (uint32_t)strtoul(p, &p, 10);
        else
            optind = argc + 1; /* a bad option or family: usage */
    }
    if (argc - optind < 4) {
        fprintf(stderr, "usage: model_dump [-t deepfm|dcnv2|mmoe|din] [-c CROSS_LAYERS] "
                        "[-r CROSS_RANK] [-T TASKS] [-K EXPERTS] [-H EXPERT_WIDTH] "
                        "[-q SEQ_SLOT] [-Q QUERY_SLOT] [-L SEQ_LEN] [-A ATT_WIDTH] "
                        "[-D D0,D1,...] SLOTS DIM N SEED [HIDDEN...]\n");
        return 2;
    }
    argv += optind - 1;
    argc -= optind - 1;
    c.nslots = (uint32_t)strtoul(argv[1], NULL, 10);
    c.dim = (uint32_t)strtoul(argv[2], NULL, 10);
    size_t n = strtoul(argv[3], NULL, 10);
    uint64_t seed = strtoull(argv[4], NULL, 10);
    c.nhidden = (uint32_t)(argc - 5);
    c.task_weight[1] = 0.5f; /* mmoe: a task weight other than 1 */
    if (ndims) {
        if (ndims != c.nslots) {
            fprintf(stderr, "model_dump: -D gives %zu dims for %u slots\n", ndims, c.nslots);
            return 2;
        }
        c.slot_dims = dims;
    }
    if (c.nhidden > MT_MODEL_MAX_HIDDEN || n < 1 || n > 4096) {
        fprintf(stderr, "model_dump: at most %d hidden layers, N in 1..4096\n",
                MT_MODEL_MAX_HIDDEN);
        return 2;
    }
    for (uint32_t l = 0; l < c.nhidden; l++)
        c.hidden[l] = (uint32_t)strtoul(argv[5 + l], NULL, 10);
    c.init_seed = seed;
    char why[256];
    if (mt_model_config_validate(&c, why, sizeof(why)) != MT_OK) {
        fprintf(stderr, "model_dump: %s\n", why);
        return 2;
    }
    mt_model_t *m = NULL;
    if (mt_model_create(&c, &m) != MT_OK) return 1;
    uint64_t rs = seed * 7919 + 1;
    size_t np = mt_model_nparams(m);
    for (size_t i = 0; i < np; i++) {
        mt_model_param_t p;
        mt_model_param(m, i, &p);
        /* a weight matrix in its Xavier range (the model's initialization: activations of
         * the scale training sees), a bias or b0 in (-0.1, 0.1) */
        float a = p.ndim == 2 ? sqrtf(6.0f / (float)(p.shape[0] + p.shape[1])) : 0.1f;
        for (size_t j = 0; j < p.size; j++)
            p.values[j] = uniform(&rs, -a, a);
    }
    const mt_model_config_t *mc = mt_model_config(m);
    size_t S = c.nslots, D = 0, T = mt_model_ntasks(m);
    size_t *off = malloc(S * sizeof(size_t)); /* slot s's cell at E[i*D + off[s]] */
    if (!off) return 1;
    for (size_t s = 0; s < S; s++) {
        off[s] = D;
        D += mt_model_slot_width(mc, (uint32_t)s);
    }
    float *E = malloc(n * D * sizeof(float)), *W1 = malloc(n * S * sizeof(float)),
          *y = malloc(n * T * sizeof(float)), *w = malloc(n * sizeof(float)),
          *probs = malloc(n * T * sizeof(float)), *fwd = malloc(n * T * sizeof(float)),
          *dE = malloc(n * D * sizeof(float)), *dW1 = malloc(n * S * sizeof(float)),
          *Es = malloc(n * D * sizeof(float)), *W1s = malloc(n * S * sizeof(float)),
          *ps = malloc(n * T * sizeof(float));
    uint8_t *varies = malloc(S);
    if (!E || !W1 || !y || !w || !probs || !fwd || !dE || !dW1 || !Es || !W1s || !ps || !varies)
        return 1;
    for (size_t j = 0; j < n * D; j++)
        E[j] = uniform(&rs, -0.5f, 0.5f);
    for (size_t j = 0; j < n * S; j++)
        W1[j] = uniform(&rs, -0.5f, 0.5f);
    if (mc->type == MT_MODEL_DIN) { /* example i's sequence: i % (L + 1) ids, then zeros */
        const size_t L = mc->seq_len, dq = mt_model_slot_dim(mc, mc->seq_query);
        for (size_t i = 0; i < n; i++)
            for (size_t j = i % (L + 1); j < L; j++)
                memset(E + i * D + off[mc->seq_slot] + j * dq, 0, dq * sizeof(float));
    }
    for (size_t i = 0; i < n; i++) {
        for (size_t t = 0; t < T; t++)
            y[i * T + t] = i % 4 == 3 ? uniform(&rs, 0, 1) : (float)(rng_next(&rs) & 1);
        w[i] = uniform(&rs, 0, 2);
    }
    float loss = 0, rate = 0.25f;
    mt_err_t err = mt_model_forward_backward(m, E, W1, y, w, n, probs, &loss, dE, dW1);
    if (!err) err = mt_model_forward(m, NULL, E, W1, n, fwd);
    /* serving: the even slots vary, the odd ones hold row 0's values (slot 0 always varies) */
    for (size_t s = 0; s < S; s++)
        varies[s] = s % 2 == 0;
    for (size_t i = 0; i < n; i++)
        for (size_t s = 0; s < S; s++) {
            size_t src = varies[s] ? i : 0;
            size_t o = off[s], ds = mt_model_slot_width(mc, (uint32_t)s);
            memcpy(Es + i * D + o, E + src * D + o, ds * sizeof(float));
            W1s[i * S + s] = W1[src * S + s];
        }
    if (!err) err = mt_model_forward_serving(m, NULL, Es, W1s, n, rate, varies, ps);
    if (err) {
        fprintf(stderr, "model_dump: %s\n", mt_strerror(err));
        return 1;
    }
    printf("{\"model\":\"%s\",\"cross\":%u,\"rank\":%u,\"slots\":%zu,\"dim\":%zu,\"n\":%zu,"
           "\"hidden\":[",
           mt_model_type_name(c.type), mt_model_config(m)->ncross, mt_model_config(m)->cross_rank,
           S, (size_t)c.dim, n);
    for (uint32_t l = 0; l < c.nhidden; l++)
        printf("%s%u", l ? "," : "", c.hidden[l]);
    printf("],\"tasks\":%zu,\"task_weights\":[", T);
    for (size_t t = 0; t < T; t++)
        printf("%s%.9g", t ? "," : "", (double)mt_model_config(m)->task_weight[t]);
    printf("],\"dims\":[");
    for (size_t s = 0; s < ndims; s++)
        printf("%s%u", s ? "," : "", dims[s]);
    printf("]");
    if (mc->type == MT_MODEL_DIN)
        printf(",\"seq\":{\"slot\":%u,\"query\":%u,\"len\":%u,\"width\":%u}", mc->seq_slot,
               mc->seq_query, mc->seq_len, mc->attention_width);
    printf(",\n\"params\":[\n");
    for (size_t i = 0; i < np; i++) {
        mt_model_param_t p;
        mt_model_param(m, i, &p);
        printf("{\"name\":\"%s\",\"shape\":[%u", p.name, p.shape[0]);
        if (p.ndim == 2) printf(",%u", p.shape[1]);
        printf("],\n");
        floats("values", p.values, p.size, 1);
        floats("grads", p.grads, p.size, 0);
        printf("}%s\n", i + 1 < np ? "," : "");
    }
    printf("],\n");
    floats("E", E, n * D, 1);
    floats("W1", W1, n * S, 1);
    floats("labels", y, n * T, 1);
    floats("weights", w, n, 1);
    floats("probs", probs, n * T, 1);
    printf("\"loss\":%.9g,\n", (double)loss);
    floats("dE", dE, n * D, 1);
    floats("dW1", dW1, n * S, 1);
    floats("forward", fwd, n * T, 1);
    printf("\"serving\":{\"rate\":%.9g,\"varies\":[", (double)rate);
    for (size_t s = 0; s < S; s++)
        printf("%s%d", s ? "," : "", varies[s]);
    printf("],\n");
    floats("E", Es, n * D, 1);
    floats("W1", W1s, n * S, 1);
    floats("probs", ps, n * T, 0);
    printf("}}\n");
    free(E), free(W1), free(y), free(w), free(probs), free(fwd), free(dE), free(dW1);
    free(Es), free(W1s), free(ps), free(varies), free(off);
    mt_model_destroy(m);
    return 0;
}
