/*
 * test_trainer_ps.c - the training step against two parameter-server shards over gRPC
 * (127.0.0.1, in this process) computes exactly what it computes against a local table:
 * the same progressive scores, bit for bit, batch after batch, on the synthetic stream.
 * Routing, deduplication, the wire format and the shards' optimizers all have to be exact
 * for that. With covers (the Kafka ranges of each step: docs/checkpoint.md, "Many trainers")
 * every step replayed right after it (a retry, a trainer that took the partition over) is
 * skipped by every shard, dense push included, and the scores stay bit-identical.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mt/gen.h"
#include "mt/ps.h"
#include "mt/psclient.h"
#include "mt/rpc.h"
#include "mt/trainer.h"
#include "testutil_ps.h"

#define NSHARDS 2
#define B       500
#ifdef MT_SANITIZED
#define BATCHES 20
#else
#define BATCHES 60
#endif

/* dense_every 0: the remote trainer keeps its dense parameters; else they live on shard 0,
 * synced every dense_every steps (1: still bit-identical, the PS runs the same Adam).
 * covered: each remote step carries its range of "examples"/0 and is then sent again. */
static void run_mode(uint32_t dense_every, int covered) {
    mt_trainer_config_t tc;
    mt_trainer_config_init(&tc);
    tc.nslots = MT_GEN_NSLOTS;
    for (uint32_t s = 0; s < MT_GEN_NSLOTS; s++)
        tc.slot_ids[s] = (uint16_t)(s + 1);
    tc.dim = 8;
    tc.hidden[0] = 32;
    tc.hidden[1] = 16;
    mt_table_slot_config_t slots[MT_GEN_NSLOTS];
    size_t nslots = 0;
    cr_assert_eq(mt_trainer_slot_configs(&tc, slots, MT_GEN_NSLOTS, &nslots), MT_OK);

    mt_ps_t *ps[NSHARDS];
    mt_rpc_server_t *srv[NSHARDS];
    char addr[NSHARDS][TU_PS_ADDR_LEN];
    for (uint32_t i = 0; i < NSHARDS; i++) {
        mt_ps_config_t pc;
        mt_ps_config_init(&pc);
        pc.shard = i;
        pc.num_shards = NSHARDS;
        pc.table.slots = slots;
        pc.table.nslots = nslots;
        pc.table.shards_log2 = 4;
        pc.table.filter_bytes = 0;
        cr_assert_eq(mt_ps_create(&pc, NULL, &ps[i]), MT_OK);
        srv[i] = tu_ps_serve(ps[i], 2, 0, NULL, addr[i]);
    }
    mt_psc_t *client = tu_psc_connect(addr, NSHARDS);
    mt_trainer_backend_t be;
    mt_trainer_backend_psc(client, &be);

    mt_trainer_t *local, *remote;
    cr_assert_eq(mt_trainer_create(&tc, &local), MT_OK);
    tc.backend = &be;
    cr_assert_eq(mt_trainer_create(&tc, &remote), MT_OK);
    cr_assert_null(mt_trainer_table(remote));
    mt_trainer_dense_sync_t *ds = NULL;
    char err[256] = "";
    if (dense_every)
        cr_assert_eq(
            mt_trainer_dense_sync_create(remote, client, dense_every, &ds, err, sizeof(err)), MT_OK,
            "%s", err);

    mt_gen_config_t gc;
    mt_gen_config_init(&gc);
    gc.seed = 9;
    gc.num_users = 5000;
    gc.num_items = 2000;
    mt_gen_t *g;
    cr_assert_eq(mt_gen_create(&gc, &g), MT_OK);
    mt_batch_t b = {0};
    float pl[B], pr[B];
    for (int i = 0; i < BATCHES; i++) {
        cr_assert_eq(mt_gen_next(g, &b, B, NULL), MT_OK);
        mt_trainer_step_t sl, sr;
        cr_assert_eq(mt_trainer_train(local, &b, 100, pl, &sl), MT_OK);
        mt_psc_range_t cover = {"examples", 0, (int64_t)i * B, (int64_t)(i + 1) * B, 0};
        for (int again = 0; again <= covered; again++) {
            float replay[B]; /* a replay's scores are not compared */
            if (covered) mt_trainer_set_cover(remote, &cover, 1);
            mt_trainer_step_t sx, *sp = again ? &sx : &sr;
            cr_assert_eq(mt_trainer_train(remote, &b, 100, again ? replay : pr, sp), MT_OK);
            cr_assert_eq(sp->skipped_shards, again ? NSHARDS : 0, "batch %d, again %d", i, again);
            if (ds) {
                int synced = 0;
                if (covered) mt_trainer_dense_sync_set_cover(ds, &cover, 1);
                cr_assert_eq(mt_trainer_dense_sync_step(ds, &synced, err, sizeof(err)), MT_OK, "%s",
                             err);
                cr_assert_eq(synced, (i + 1) % (int)dense_every == 0);
            }
        }
        if (dense_every > 1) continue; /* stale dense parameters: other scores */
        cr_assert_eq(memcmp(pl, pr, sizeof(pl)), 0, "batch %d: scores differ", i);
        cr_assert_eq(sl.loss, sr.loss);
    }
    if (ds) {
        /* one version per push: the creating push, then one per sync */
        cr_assert_eq(mt_trainer_dense_sync_flush(ds, err, sizeof(err)), MT_OK, "%s", err);
        uint64_t pushes = (BATCHES + dense_every - 1) / dense_every;
        cr_assert_eq(mt_trainer_dense_sync_version(ds), 1 + pushes, "replays do not push");
        /* a second trainer starts from the PS's values, not its own initialization */
        mt_trainer_t *other;
        tc.seed = 99;
        cr_assert_eq(mt_trainer_create(&tc, &other), MT_OK);
        mt_trainer_dense_sync_t *ds2;
        cr_assert_eq(mt_trainer_dense_sync_create(other, client, 1, &ds2, err, sizeof(err)), MT_OK,
                     "%s", err);
        mt_model_param_t p1, p2;
        cr_assert_eq(mt_model_param_find(mt_trainer_model(remote), "mlp.0.w", &p1), MT_OK);
        cr_assert_eq(mt_model_param_find(mt_trainer_model(other), "mlp.0.w", &p2), MT_OK);
        cr_assert_eq(memcmp(p1.values, p2.values, p1.size * sizeof(float)), 0);
        mt_trainer_dense_sync_destroy(ds2);
        mt_trainer_destroy(other);
        mt_trainer_dense_sync_destroy(ds);
    }
    /* The shards hold exactly the local table's rows. */
    mt_table_stats_t ls;
    mt_table_stats(mt_trainer_table(local), &ls);
    uint64_t rows = 0;
    for (int i = 0; i < NSHARDS; i++) {
        mt_table_stats_t s;
        mt_table_stats(mt_ps_table(ps[i]), &s);
        rows += s.rows;
    }
    cr_assert_eq(rows, ls.rows);

    mt_batch_free(&b);
    mt_gen_destroy(g);
    mt_trainer_destroy(local);
    mt_trainer_destroy(remote);
    mt_psc_destroy(client);
    for (int i = 0; i < NSHARDS; i++) {
        mt_rpc_server_destroy(srv[i]);
        mt_ps_destroy(ps[i]);
    }
}

static void run(uint32_t dense_every) {
    run_mode(dense_every, 0);
}

Test(trainer_ps, same_scores_as_a_local_table, .timeout = 300) {
    run(0);
}

Test(trainer_ps, covered_steps_sent_twice_are_applied_once, .timeout = 300) {
    run_mode(1, 1);
}

Test(trainer_ps, dense_on_the_ps_every_step_is_exact, .timeout = 300) {
    run(1);
}

Test(trainer_ps, dense_on_the_ps_every_5_steps, .timeout = 300) {
    run(5);
}
