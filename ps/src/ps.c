/*
 * ps.c - the parameter-server service's lifecycle (mt/ps.h): its configuration defaults, and
 * the creation and destruction of a service from its parts, each in a file of its own:
 *
 *   handlers.c  the rpc methods (decode, checks, encode, metrics)      handlers_int.h
 *   ckpt.c      checkpoints on the store (snapshot, restore, list)     ckpt_int.h
 *   shard.c     the shard state (table, limits, counters, incarnation,  shard_int.h
 *               epoch, the quiescing of a restore)
 *   dense.c     the dense store (tensors, optimizer, DenseState)       dense_int.h
 *
 * Calls point down that list only; this file, above them all, is the only one that knows
 * every part (it creates them in the order a failure can undo with mt_ps_destroy()).
 */
#include <stdlib.h>
#include <string.h>

#include "ckpt_int.h"
#include "dense_int.h"
#include "handlers_int.h"
#include "mt/ps.h"
#include "shard_int.h"

/* ============================== config ============================== */

void mt_ps_dense_config_init(mt_ps_dense_config_t *d) {
    memset(d, 0, sizeof(*d));
    d->opt = MT_OPT_ADAM;
    d->lr = 0.001f;
    d->beta1 = 0.9f;
    d->beta2 = 0.999f;
    d->eps = 1e-8f;
    d->init_accum = 0.1f;
}

void mt_ps_config_init(mt_ps_config_t *c) {
    memset(c, 0, sizeof(*c));
    c->shard = 0;
    c->num_shards = 1;
    mt_table_config_init(&c->table);
    mt_ps_dense_config_init(&c->dense);
    c->max_batch_fids = 1u << 20;
    c->sync_chunk_fids = 4096;
    c->sync_follow_max_s = 300;
    c->sync_max_followers = 2;
    c->admin_token = NULL;
    mt_rpc_server_config_t rc; /* the server's default limit: one place holds the number */
    mt_rpc_server_config_init(&rc);
    c->max_message_bytes = rc.max_message_bytes;
    c->snapshot_full_every = 1;
}

/* ============================== lifecycle ============================== */

mt_err_t mt_ps_create(const mt_ps_config_t *cfg, mt_table_t *table, mt_ps_t **out) {
    if (!cfg || cfg->num_shards < 1 || cfg->shard >= cfg->num_shards || cfg->max_batch_fids < 1 ||
        cfg->sync_chunk_fids < 1 || cfg->max_message_bytes < 1024 ||
        (cfg->dense.opt != MT_OPT_SGD && cfg->dense.opt != MT_OPT_ADAGRAD &&
         cfg->dense.opt != MT_OPT_ADAM) ||
        !(cfg->dense.lr > 0.0f))
        return MT_CONFIG;
    mt_ps_t *ps = calloc(1, sizeof(*ps));
    if (!ps) return MT_NOMEM;
    mt__ps_dense_init(&ps->dense, &cfg->dense);
    mt_err_t err;
    if ((err = mt__ps_ckpt_create(&ps->ck)) != MT_OK ||
        (err = mt__ps_rpc_create(&ps->rpc)) != MT_OK ||
        (err = mt__ps_shard_init(ps, cfg, table)) != MT_OK) {
        mt_ps_destroy(ps); /* the table is destroyed only if the shard took it: never here */
        return err;
    }
    *out = ps;
    return MT_OK;
}

void mt_ps_destroy(mt_ps_t *ps) {
    if (!ps) return;
    mt__ps_shard_fini(ps);
    mt__ps_dense_fini(&ps->dense);
    mt__ps_ckpt_destroy(ps->ck);
    mt__ps_rpc_destroy(ps->rpc);
    free(ps);
}
