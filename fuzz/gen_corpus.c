/*
 * gen_corpus.c - writes the binary seeds of fuzz/corpus/ (run by hand from the repository
 * root: build/fuzz/fuzz/fuzz_gen_corpus fuzz/corpus). Text seeds are written by hand.
 */
#include <stdio.h>
#include <sys/stat.h>

#include "fuzz_common.h"
#include "monolith/v1/example.pb-c.h"
#include "monolith/v1/ps.pb-c.h"
#include "monolith/v1/serving.pb-c.h"
#include "mt/batch.h"
#include "mt/example_pb.h"
#include "mt/ps.h"

static const char *root;

static void put(const char *target, const char *name, const void *buf, size_t len) {
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", root, target);
    mkdir(path, 0755);
    snprintf(path, sizeof(path), "%s/%s/%s", root, target, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(buf, 1, len, f) != len) abort();
    fclose(f);
}

static void put_msg(const char *target, const char *name, const ProtobufCMessage *m) {
    uint8_t buf[4096];
    size_t n = protobuf_c_message_get_packed_size(m);
    if (n > sizeof(buf)) abort();
    protobuf_c_message_pack(m, buf);
    put(target, name, buf, n);
}

static uint8_t snap[1 << 20];
static size_t snap_len;

static mt_err_t snap_write(void *ud, const void *buf, size_t len) {
    (void)ud;
    if (snap_len + len > sizeof(snap)) return MT_NOMEM;
    memcpy(snap + snap_len, buf, len);
    snap_len += len;
    return MT_OK;
}

int main(int argc, char **argv) {
    root = argc > 1 ? argv[1] : "fuzz/corpus";
    uint64_t f1[2] = {MT_FID_MAKE(1, 1), MT_FID_MAKE(1, 2)}, f2[1] = {MT_FID_MAKE(2, 7)};
    Monolith__V1__SlotFids s1 = MONOLITH__V1__SLOT_FIDS__INIT, s2 = MONOLITH__V1__SLOT_FIDS__INIT;
    s1.slot = 1, s1.n_fids = 2, s1.fids = f1;
    s2.slot = 2, s2.n_fids = 1, s2.fids = f2;
    Monolith__V1__SlotFids *user[1] = {&s1}, *item[1] = {&s2}, *both[2] = {&s1, &s2};
    /* Example */
    float labels[1] = {1};
    Monolith__V1__Example ex = MONOLITH__V1__EXAMPLE__INIT;
    ex.request_id = "r1", ex.timestamp_ms = 1700000000000, ex.n_labels = 1, ex.labels = labels;
    ex.n_slots = 2, ex.slots = both, ex.sample_rate = 0.5f;
    put_msg("example", "example", &ex.base);
    /* Impression and Action */
    Monolith__V1__Impression im = MONOLITH__V1__IMPRESSION__INIT;
    im.request_id = "r1", im.timestamp_ms = 1700000000000, im.n_user = 1, im.user = user;
    im.n_item = 1, im.item = item, im.item_id = 7, im.score = 0.25f;
    put_msg("joiner_impression", "impression", &im.base);
    Monolith__V1__Action ac = MONOLITH__V1__ACTION__INIT;
    ac.request_id = "r1", ac.timestamp_ms = 1700000001000, ac.type = 1, ac.item_id = 7;
    put_msg("joiner_action", "click", &ac.base);
    ac.item_id = 0;
    put_msg("joiner_action", "click_no_item", &ac.base);
    /* PS requests */
    uint64_t fids[3] = {MT_FID_MAKE(1, 1), MT_FID_MAKE(2, 2), MT_FID_MAKE(3, 3)};
    float grads[14];
    for (int i = 0; i < 14; i++)
        grads[i] = 0.01f * (float)i;
    Monolith__V1__LookupRequest lr = MONOLITH__V1__LOOKUP_REQUEST__INIT;
    lr.n_fids = 3, lr.fids = fids, lr.train = 1, lr.now_s = 1700000000;
    put_msg("ps_lookup", "train", &lr.base);
    put_msg("serving_lookup", "lookup", &lr.base); /* train: refused by serving */
    lr.train = 0;
    put_msg("serving_lookup", "lookup_no_train", &lr.base);
    Monolith__V1__ApplyGradientsRequest ag = MONOLITH__V1__APPLY_GRADIENTS_REQUEST__INIT;
    ag.n_fids = 3, ag.fids = fids, ag.n_grads = 14, ag.grads = grads;
    put_msg("ps_apply_gradients", "apply", &ag.base);
    ag.examples = 500;
    put_msg("ps_apply_gradients", "apply_examples", &ag.base);
    ag.n_fids = 0, ag.n_grads = 0; /* a shard without ids in the step still counts it */
    put_msg("ps_apply_gradients", "examples_only", &ag.base);
    /* covered steps (docs/checkpoint.md): two partitions, the first from its log start */
    Monolith__V1__Range rg[2] = {MONOLITH__V1__RANGE__INIT, MONOLITH__V1__RANGE__INIT};
    rg[0].topic = "examples", rg[0].partition = 0, rg[0].lo = 0, rg[0].hi = 300;
    rg[1].topic = "examples", rg[1].partition = 3, rg[1].lo = 1200, rg[1].hi = 1400;
    rg[1].first = 1;
    Monolith__V1__Range *rgp[2] = {&rg[0], &rg[1]};
    ag.n_fids = 3, ag.n_grads = 14;
    ag.n_cover = 2, ag.cover = rgp;
    put_msg("ps_apply_gradients", "covered", &ag.base);
    ag.n_cover = 0, ag.cover = NULL;
    char *names[1] = {"w"};
    Monolith__V1__PullDenseRequest pd = MONOLITH__V1__PULL_DENSE_REQUEST__INIT;
    put_msg("ps_pull_dense", "all", &pd.base);
    pd.n_names = 1, pd.names = names;
    put_msg("ps_pull_dense", "w", &pd.base);
    uint32_t shape[2] = {2, 1};
    float vals[2] = {0.5f, -1};
    Monolith__V1__DenseTensor t = MONOLITH__V1__DENSE_TENSOR__INIT;
    t.name = "w", t.n_shape = 2, t.shape = shape, t.n_values = 2, t.values = vals;
    Monolith__V1__DenseTensor *tp[1] = {&t};
    Monolith__V1__PushDenseRequest pu = MONOLITH__V1__PUSH_DENSE_REQUEST__INIT;
    pu.n_grads = 1, pu.grads = tp, pu.step = 3;
    put_msg("ps_push_dense", "grads", &pu.base);
    pu.n_cover = 1, pu.cover = rgp;
    put_msg("ps_push_dense", "covered", &pu.base);
    pu.n_cover = 0, pu.cover = NULL;
    pu.n_init = 1, pu.init = tp;
    put_msg("ps_push_dense", "grads_init", &pu.base);
    Monolith__V1__SyncRequest sr = MONOLITH__V1__SYNC_REQUEST__INIT;
    put_msg("ps_sync", "full", &sr.base);
    sr.since_version = 1, sr.incarnation = 1, sr.max_chunk_fids = 1;
    put_msg("ps_sync", "incremental", &sr.base);
    Monolith__V1__SnapshotRequest sn = MONOLITH__V1__SNAPSHOT_REQUEST__INIT;
    sn.token = "secret", sn.checkpoint_id = 5;
    put_msg("ps_snapshot", "token", &sn.base);
    Monolith__V1__KafkaOffset ko = MONOLITH__V1__KAFKA_OFFSET__INIT;
    ko.topic = "examples", ko.partition = 3, ko.offset = 1234;
    Monolith__V1__KafkaOffset *kop[1] = {&ko};
    sn.consistent = 1, sn.n_offsets = 1, sn.offsets = kop, sn.expect_incarnation = 0;
    put_msg("ps_snapshot", "consistent", &sn.base);
    Monolith__V1__RestoreRequest rr = MONOLITH__V1__RESTORE_REQUEST__INIT;
    rr.token = "secret", rr.checkpoint_id = 1; /* the checkpoint fuzz_ps writes at start */
    put_msg("ps_restore", "checkpoint_1", &rr.base);
    rr.checkpoint_id = 0;
    put_msg("ps_restore", "empty_state", &rr.base);
    Monolith__V1__CheckpointsRequest cl = MONOLITH__V1__CHECKPOINTS_REQUEST__INIT;
    put_msg("ps_checkpoints", "empty", &cl.base);
    Monolith__V1__StatsRequest st = MONOLITH__V1__STATS_REQUEST__INIT;
    put_msg("ps_stats", "empty", &st.base);
    /* PredictRequest */
    Monolith__V1__Candidate c1 = MONOLITH__V1__CANDIDATE__INIT;
    c1.item_id = 7, c1.n_item = 1, c1.item = item;
    Monolith__V1__Candidate *cands[1] = {&c1};
    Monolith__V1__PredictRequest pr = MONOLITH__V1__PREDICT_REQUEST__INIT;
    pr.request_id = "r1", pr.n_user = 1, pr.user = user, pr.n_candidates = 1, pr.candidates = cands;
    put_msg("serving_predict", "predict", &pr.base);
    /* fuzz_serving's replica has rows for ids 0..63 of slots 1..3 */
    uint64_t u1[3] = {MT_FID_MAKE(1, 3), MT_FID_MAKE(1, 63), MT_FID_MAKE(1, 64)};
    uint64_t u3[2] = {MT_FID_MAKE(3, 0), MT_FID_MAKE(3, 9)};
    uint64_t i2[4][2] = {{MT_FID_MAKE(2, 1), MT_FID_MAKE(2, 2)},
                         {MT_FID_MAKE(2, 7), 0},
                         {MT_FID_MAKE(2, 40), MT_FID_MAKE(2, 41)},
                         {MT_FID_MAKE(2, 1000), MT_FID_MAKE(2, 5)}};
    uint64_t u9[1] = {MT_FID_MAKE(9, 1)};
    Monolith__V1__SlotFids su1 = MONOLITH__V1__SLOT_FIDS__INIT, su3 = MONOLITH__V1__SLOT_FIDS__INIT;
    Monolith__V1__SlotFids su9 = MONOLITH__V1__SLOT_FIDS__INIT;
    su1.slot = 1, su1.n_fids = 3, su1.fids = u1;
    su3.slot = 3, su3.n_fids = 2, su3.fids = u3;
    su9.slot = 9, su9.n_fids = 1, su9.fids = u9;
    Monolith__V1__SlotFids *users[3] = {&su1, &su3, &su9};
    Monolith__V1__SlotFids si[4];
    Monolith__V1__SlotFids *sip[4];
    Monolith__V1__Candidate cs[4];
    Monolith__V1__Candidate *csp[4];
    for (int i = 0; i < 4; i++) {
        monolith__v1__slot_fids__init(&si[i]);
        si[i].slot = 2, si[i].n_fids = i2[i][1] ? 2 : 1, si[i].fids = i2[i];
        sip[i] = &si[i];
        monolith__v1__candidate__init(&cs[i]);
        cs[i].item_id = (uint64_t)(100 + i), cs[i].n_item = 1, cs[i].item = &sip[i];
        csp[i] = &cs[i];
    }
    pr.n_user = 2, pr.user = users, pr.n_candidates = 4, pr.candidates = csp;
    put_msg("serving_predict", "predict_4_candidates", &pr.base);
    pr.n_user = 3; /* slot 9: not in the model, ignored */
    put_msg("serving_predict", "predict_unknown_slot", &pr.base);
    su3.slot = 2; /* fids of slot 3 under slot 2: INVALID_ARGUMENT */
    put_msg("serving_predict", "predict_slot_mismatch", &pr.base);
    su3.slot = 3;
    pr.n_user = 0, pr.n_candidates = 1;
    put_msg("serving_predict", "predict_no_user", &pr.base);
    uint64_t rows[6] = {MT_FID_MAKE(1, 3),      MT_FID_MAKE(2, 40),     MT_FID_MAKE(3, 63),
                        MT_FID_MAKE(0x8001, 3), MT_FID_MAKE(0x8002, 9), MT_FID_MAKE(1, 500)};
    lr.n_fids = 6, lr.fids = rows;
    put_msg("serving_lookup", "lookup_rows", &lr.base);
    /* Dense state and table snapshot, from a PS with a row of each slot and one tensor. */
    mt_table_slot_config_t slots[3];
    mt_ps_config_t cfg;
    mt_ps_config_init(&cfg);
    mt_fuzz_table_config(&cfg.table, slots);
    cfg.table.filter_bytes = 1024; /* the filter is in the snapshot: keep the seed small */
    mt_ps_t *ps;
    if (mt_ps_create(&cfg, NULL, &ps) != MT_OK) abort();
    Monolith__V1__DenseState ds = MONOLITH__V1__DENSE_STATE__INIT;
    uint64_t steps[1] = {3};
    ds.version = 2, ds.n_weights = 1, ds.weights = tp, ds.n_slot1 = 1, ds.slot1 = tp;
    ds.n_slot2 = 1, ds.slot2 = tp, ds.n_steps = 1, ds.steps = steps;
    put_msg("dense_load", "one_tensor", &ds.base);
    uint8_t *dbuf;
    size_t dlen;
    if (mt_ps_dense_load(ps, snap, 0) == MT_OK && mt_ps_dense_save(ps, &dbuf, &dlen) == MT_OK) {
        put("dense_load", "empty_saved", dbuf, dlen);
        free(dbuf);
    }
    mt_table_t *tab = mt_ps_table(ps);
    float out[14];
    uint8_t found[3];
    uint64_t f13[2] = {MT_FID_MAKE(1, 1), MT_FID_MAKE(2, 2)};
    if (mt_table_lookup(tab, f13, 2, out, 12, found, MT_TABLE_TRAIN, 1700000000, NULL)) abort();
    if (mt_table_save(tab, snap_write, NULL)) abort();
    put("table_load", "two_rows", snap, snap_len);
    /* a change stream: one row updated, one inserted, one removed after the cursor */
    uint64_t since = mt_table_changes_cursor(tab), upto = 0;
    float g[12] = {0.1f, 0.2f, 0.3f, 0.4f};
    uint64_t f3[1] = {MT_FID_MAKE(1, 7)};
    if (mt_table_apply(tab, f13, 1, g, 4, 1700000001, NULL)) abort();
    if (mt_table_assign(tab, f3, 1, g, 4, 1700000001, NULL)) abort();
    if (mt_table_remove(tab, &f13[1], 1, NULL)) abort();
    snap_len = 0;
    if (mt_table_save_changes(tab, since, snap_write, NULL, &upto)) abort();
    put("table_changes", "update_insert_remove", snap, snap_len);
    mt_ps_destroy(ps);
    return 0;
}
