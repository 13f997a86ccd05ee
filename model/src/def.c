/*
 * def.c - the model's definition without its math: the families' names and the validation
 * of a configuration (mt/model.h). In the library mt_model_core with the dense Adam step,
 * without OpenBLAS, so that the configuration (which every daemon reads) and the PS can
 * link it: OpenBLAS starts its threads at load, before a daemon blocks its signals.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mt/model.h"

static const char *const type_names[] = {[MT_MODEL_DEEPFM] = "deepfm",
                                         [MT_MODEL_DCNV2] = "dcnv2",
                                         [MT_MODEL_MMOE] = "mmoe",
                                         [MT_MODEL_DIN] = "din"};
#define NTYPES (sizeof(type_names) / sizeof(type_names[0]))

const char *mt_model_type_name(mt_model_type_t type) {
    return (unsigned)type < NTYPES ? type_names[type] : NULL;
}

mt_err_t mt_model_type_parse(const char *name, mt_model_type_t *out) {
    if (!name || !out) return MT_CONFIG;
    for (size_t t = 0; t < NTYPES; t++)
        if (strcmp(name, type_names[t]) == 0) {
            *out = (mt_model_type_t)t;
            return MT_OK;
        }
    return MT_CONFIG;
}

void mt_model_config_init(mt_model_config_t *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->nhidden = 2;
    cfg->hidden[0] = 256;
    cfg->hidden[1] = 128;
    cfg->init_seed = 1;
    cfg->type = MT_MODEL_DEEPFM;
    cfg->ncross = 3;
    cfg->ntasks = 2;
    cfg->nexperts = 4;
    cfg->expert_width = 64;
    for (int t = 0; t < MT_MODEL_MAX_TASKS; t++)
        cfg->task_weight[t] = 1.0f;
    cfg->seq_len = 20;
    cfg->attention_width = 32;
}

mt_err_t mt_model_config_validate(const mt_model_config_t *cfg, char *errbuf, size_t errlen) {
    char dummy[1];
    if (!errbuf) {
        errbuf = dummy;
        errlen = sizeof dummy;
    }
    if (!cfg) {
        snprintf(errbuf, errlen, "model config is NULL");
        return MT_CONFIG;
    }
    if (cfg->nslots < 1 || cfg->nslots > MT_MODEL_MAX_SLOTS) {
        snprintf(errbuf, errlen, "model.nslots = %u: must be in 1..%u", cfg->nslots,
                 (unsigned)MT_MODEL_MAX_SLOTS);
        return MT_CONFIG;
    }
    if (cfg->dim < 1 || cfg->dim > MT_MODEL_MAX_DIM) {
        snprintf(errbuf, errlen, "model.dim = %u: must be in 1..%u", cfg->dim,
                 (unsigned)MT_MODEL_MAX_DIM);
        return MT_CONFIG;
    }
    if (!mt_model_type_name(cfg->type)) {
        snprintf(errbuf, errlen, "model.type = %d: not a model family", (int)cfg->type);
        return MT_CONFIG;
    }
    if (cfg->type == MT_MODEL_DIN) {
        if (cfg->seq_slot >= cfg->nslots || cfg->seq_query >= cfg->nslots ||
            cfg->seq_slot == cfg->seq_query) {
            snprintf(errbuf, errlen,
                     "model.seq_slot = %u, model.seq_query = %u: din needs two different slots "
                     "of the %u (a sequence and the candidate item it is attended by)",
                     cfg->seq_slot, cfg->seq_query, cfg->nslots);
            return MT_CONFIG;
        }
        if (cfg->seq_len < 1 || cfg->seq_len > MT_MODEL_MAX_SEQ) {
            snprintf(errbuf, errlen, "model.seq_len = %u: must be in 1..%u", cfg->seq_len,
                     (unsigned)MT_MODEL_MAX_SEQ);
            return MT_CONFIG;
        }
        if (cfg->attention_width < 1 || cfg->attention_width > MT_MODEL_MAX_WIDTH) {
            snprintf(errbuf, errlen, "model.attention_width = %u: must be in 1..%u",
                     cfg->attention_width, (unsigned)MT_MODEL_MAX_WIDTH);
            return MT_CONFIG;
        }
        if (mt_model_slot_dim(cfg, cfg->seq_slot) != mt_model_slot_dim(cfg, cfg->seq_query)) {
            snprintf(errbuf, errlen,
                     "model.slot_dims[%u] = %u: din's sequence slot holds the query slot's rows "
                     "and needs its dim (%u)",
                     cfg->seq_slot, mt_model_slot_dim(cfg, cfg->seq_slot),
                     mt_model_slot_dim(cfg, cfg->seq_query));
            return MT_CONFIG;
        }
    }
    uint64_t width = 0; /* D: the sum of the slots' cells' widths */
    for (uint32_t s = 0; s < cfg->nslots; s++) {
        uint32_t d = mt_model_slot_dim(cfg, s);
        if (d < 1 || d > MT_MODEL_MAX_DIM) {
            snprintf(errbuf, errlen, "model.slot_dims[%u] = %u: must be in 1..%u", s, d,
                     (unsigned)MT_MODEL_MAX_DIM);
            return MT_CONFIG;
        }
        if ((cfg->type == MT_MODEL_DEEPFM || cfg->type == MT_MODEL_DIN) && d != cfg->dim) {
            snprintf(errbuf, errlen,
                     "model.slot_dims[%u] = %u: %s's FM term needs one dim for every slot "
                     "(%u); per-slot dims need another family (dcnv2)",
                     s, d, mt_model_type_name(cfg->type), cfg->dim);
            return MT_CONFIG;
        }
        width += mt_model_slot_width(cfg, s);
    }
    if (width > MT_MODEL_MAX_INPUT) {
        snprintf(errbuf, errlen,
                 "the input width (the slots' dims summed) = %llu: must be at most %u",
                 (unsigned long long)width, (unsigned)MT_MODEL_MAX_INPUT);
        return MT_CONFIG;
    }
    if (cfg->nhidden > MT_MODEL_MAX_HIDDEN) {
        snprintf(errbuf, errlen, "model.nhidden = %u: must be at most %u", cfg->nhidden,
                 (unsigned)MT_MODEL_MAX_HIDDEN);
        return MT_CONFIG;
    }
    for (uint32_t l = 0; l < cfg->nhidden; l++) {
        if (cfg->hidden[l] < 1 || cfg->hidden[l] > MT_MODEL_MAX_WIDTH) {
            snprintf(errbuf, errlen, "model.hidden[%u] = %u: must be in 1..%u", l, cfg->hidden[l],
                     (unsigned)MT_MODEL_MAX_WIDTH);
            return MT_CONFIG;
        }
    }
    if (cfg->type == MT_MODEL_MMOE) {
        if (cfg->ntasks < 2 || cfg->ntasks > MT_MODEL_MAX_TASKS) {
            snprintf(errbuf, errlen, "model.ntasks = %u: mmoe needs 2..%u tasks", cfg->ntasks,
                     (unsigned)MT_MODEL_MAX_TASKS);
            return MT_CONFIG;
        }
        if (cfg->nexperts < 1 || cfg->nexperts > MT_MODEL_MAX_EXPERTS) {
            snprintf(errbuf, errlen, "model.nexperts = %u: mmoe needs 1..%u experts", cfg->nexperts,
                     (unsigned)MT_MODEL_MAX_EXPERTS);
            return MT_CONFIG;
        }
        if (cfg->expert_width < 1 || cfg->expert_width > MT_MODEL_MAX_WIDTH) {
            snprintf(errbuf, errlen, "model.expert_width = %u: must be in 1..%u", cfg->expert_width,
                     (unsigned)MT_MODEL_MAX_WIDTH);
            return MT_CONFIG;
        }
        for (uint32_t t = 0; t < cfg->ntasks; t++)
            if (!(cfg->task_weight[t] >= 0.0f && cfg->task_weight[t] < 1e30f)) {
                snprintf(errbuf, errlen, "model.task_weight[%u] = %g: must be finite and >= 0", t,
                         (double)cfg->task_weight[t]);
                return MT_CONFIG;
            }
    }
    if (cfg->type == MT_MODEL_DCNV2) {
        const uint32_t D = (uint32_t)width;
        if (cfg->ncross < 1 || cfg->ncross > MT_MODEL_MAX_CROSS) {
            snprintf(errbuf, errlen, "model.ncross = %u: dcnv2 needs 1..%u cross layers",
                     cfg->ncross, (unsigned)MT_MODEL_MAX_CROSS);
            return MT_CONFIG;
        }
        if (cfg->cross_rank > D) {
            snprintf(errbuf, errlen,
                     "model.cross_rank = %u: must be at most the input width (the slots' dims "
                     "summed) = %u (0: full rank)",
                     cfg->cross_rank, D);
            return MT_CONFIG;
        }
        if (cfg->cross_rank == 0 && D > MT_MODEL_MAX_FULL_CROSS) {
            snprintf(errbuf, errlen,
                     "model.cross_rank = 0 (full rank) with an input width of %u: full-rank "
                     "cross layers take D x D weights, D at most %u; set a rank",
                     D, (unsigned)MT_MODEL_MAX_FULL_CROSS);
            return MT_CONFIG;
        }
    }
    if (errlen) errbuf[0] = '\0';
    return MT_OK;
}

mt_err_t mt_model_layout_init(mt_model_layout_t *l, const mt_model_config_t *mc,
                              const uint16_t *slot_ids, const uint8_t *mean,
                              const uint64_t *buckets, uint64_t default_buckets, char *errbuf,
                              size_t errlen) {
    char dummy[1];
    if (!errbuf) {
        errbuf = dummy;
        errlen = sizeof dummy;
    }
    if (!l || !slot_ids || mt_model_config_validate(mc, errbuf, errlen) != MT_OK) {
        if (!l || !slot_ids) snprintf(errbuf, errlen, "layout: NULL argument");
        return MT_CONFIG;
    }
    if (mc->nslots > MT_MODEL_LAYOUT_MAX_SLOTS) {
        snprintf(errbuf, errlen, "%u model slots: at most %u", mc->nslots,
                 (unsigned)MT_MODEL_LAYOUT_MAX_SLOTS);
        return MT_CONFIG;
    }
    memset(l, 0, sizeof *l);
    l->nslots = mc->nslots;
    l->uniform = 1;
    for (uint32_t s = 0; s < mc->nslots; s++) {
        mt_model_slot_t *ls = &l->slot[s];
        const int seq = mt_model_is_seq(mc, s);
        const uint32_t src = seq ? mc->seq_query : s; /* the slot whose rows it reads */
        ls->id = slot_ids[s];
        ls->lookup_slot = slot_ids[src];
        ls->kind = seq               ? MT_MODEL_SLOT_SEQ
                   : mean && mean[s] ? MT_MODEL_SLOT_MEAN
                                     : MT_MODEL_SLOT_SUM;
        if (seq && mean && mean[s]) {
            snprintf(errbuf, errlen, "slot %u is din's sequence slot, which is not pooled",
                     (unsigned)slot_ids[s]);
            return MT_CONFIG;
        }
        ls->dim = mt_model_slot_dim(mc, s);
        ls->width = mt_model_slot_width(mc, s);
        ls->off = l->width;
        ls->len = seq ? mc->seq_len : UINT32_MAX;
        ls->buckets = buckets && buckets[src] ? buckets[src] : default_buckets;
        l->width += ls->width;
        if (ls->dim > l->max_dim) l->max_dim = ls->dim;
        l->uniform &=
            ls->kind == MT_MODEL_SLOT_SUM && ls->dim == mc->dim && ls->buckets == default_buckets;
    }
    if (errlen) errbuf[0] = '\0';
    return MT_OK;
}

size_t mt_model_layout_tables(const mt_model_layout_t *l, uint16_t *ids, uint32_t *floats) {
    size_t n = 0;
    for (uint32_t s = 0; s < l->nslots; s++) {
        const mt_model_slot_t *ls = &l->slot[s];
        if (ls->lookup_slot != ls->id) continue; /* another slot's rows */
        ids[n] = ls->id;
        floats[n] = mt_model_row_floats(ls->dim);
        n++;
    }
    return n;
}

mt_err_t mt_model_tables(const mt_model_config_t *mc, const uint16_t *slot_ids, const uint8_t *mean,
                         const uint64_t *buckets, uint64_t default_buckets, uint16_t *ids,
                         uint32_t *floats, size_t *n, char *errbuf, size_t errlen) {
    *n = 0;
    mt_model_layout_t *l = malloc(sizeof(*l)); /* (8 KiB: not on the stack) */
    if (!l) return MT_NOMEM;
    mt_err_t err =
        mt_model_layout_init(l, mc, slot_ids, mean, buckets, default_buckets, errbuf, errlen);
    if (!err) *n = mt_model_layout_tables(l, ids, floats);
    free(l);
    return err;
}
