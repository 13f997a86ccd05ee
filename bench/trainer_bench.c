/*
 * trainer_bench.c - training throughput of the DeepFM step (issue #4): 26 slots, dim 16,
 * MLP 256-128, one id per slot and example drawn from a skewed distribution over 1M ids
 * per slot, batches of 512, parameters in a local table and then on one parameter server
 * over loopback (in this process, its own rpc workers). Also the FLOP rate OpenBLAS reaches
 * for the MLP's shapes, so the gap to the compute floor is visible.
 *
 * One JSON object per line; never asserts on time.
 * Usage: trainer_bench [--examples N] [--batch B] [--quick]
 */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mt/jemalloc_conf.h"
#include "mt/ps.h"
#include "mt/psclient.h"
#include "mt/rpc.h"
#include "mt/trainer.h"

#define NSLOTS 26
#define DIM    16

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* A skewed id in [0, n): the product of two uniforms favours small ids. */
static uint64_t skewed(uint64_t *x, uint64_t n) {
    double a = (double)(splitmix64(x) >> 11) / 9007199254740992.0;
    double b = (double)(splitmix64(x) >> 11) / 9007199254740992.0;
    return (uint64_t)(a * b * (double)n);
}

static void fill(mt_batch_t *b, size_t n, uint64_t *x) {
    mt_batch_clear(b);
    uint64_t fids[NSLOTS];
    const uint64_t *fp[NSLOTS];
    uint32_t counts[NSLOTS];
    for (size_t i = 0; i < n; i++) {
        uint64_t h = 0;
        for (int s = 0; s < NSLOTS; s++) {
            uint64_t v = skewed(x, 1000000);
            fids[s] = mt_fid_of_int((uint16_t)(s + 1), v);
            fp[s] = &fids[s];
            counts[s] = 1;
            h ^= v * (uint64_t)(s + 1);
        }
        mt_batch_add(b, (float)((h % 10) == 0), 0, 1.0f, fp, counts);
    }
}

static void emit(const char *metric, double v, const char *unit, const char *extra) {
    printf("{\"bench\":\"trainer\",\"metric\":\"%s\",\"value\":%.6g,\"unit\":\"%s\"%s%s}\n", metric,
           v, unit, *extra ? "," : "", extra);
    fflush(stdout);
}

int main(int argc, char **argv) {
    size_t total = 300000, batch = 512;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick"))
            total = 20000;
        else if (!strcmp(argv[i], "--examples") && i + 1 < argc)
            total = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc)
            batch = strtoull(argv[++i], NULL, 10);
        else {
            fprintf(stderr, "usage: trainer_bench [--examples N] [--batch B] [--quick]\n");
            return 2;
        }
    }
    if (batch < 1 || total < batch) return 2;
    openblas_set_num_threads(1);
    mt_trainer_config_t tc;
    mt_trainer_config_init(&tc);
    tc.nslots = NSLOTS;
    for (int s = 0; s < NSLOTS; s++)
        tc.slot_ids[s] = (uint16_t)(s + 1);
    tc.dim = DIM;
    tc.hidden[0] = 256;
    tc.hidden[1] = 128;
    mt_batch_t b = {0};
    uint16_t ids[NSLOTS];
    for (int s = 0; s < NSLOTS; s++)
        ids[s] = (uint16_t)(s + 1);
    mt_batch_init(&b, ids, NSLOTS);
    float *probs = malloc(batch * sizeof(float));
    char extra[256];

    /* One PS shard on loopback holding the same slots. */
    mt_table_slot_config_t slots[2 * NSLOTS];
    mt_trainer_slot_configs(&tc, slots, 2 * NSLOTS);
    mt_ps_config_t pc;
    mt_ps_config_init(&pc);
    pc.table.slots = slots;
    pc.table.nslots = 2 * NSLOTS;
    pc.table.shards_log2 = 6;
    pc.table.filter_bytes = 0;
    mt_ps_t *ps;
    mt_rpc_server_t *srv;
    mt_rpc_server_config_t sc;
    mt_rpc_server_config_init(&sc);
    sc.threads = 2;
    int port = 0;
    if (mt_ps_create(&pc, NULL, &ps) != MT_OK || mt_rpc_server_create(&sc, &srv) != MT_OK ||
        mt_ps_register(ps, srv) != MT_OK || mt_rpc_server_start(srv, &port) != MT_OK)
        return 1;
    char addr[64];
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
    const char *addrs[1] = {addr};
    mt_psc_config_t cc;
    mt_psc_config_init(&cc);
    cc.addrs = addrs;
    cc.num_shards = 1;
    mt_psc_t *client;
    if (mt_psc_create(&cc, &client) != MT_OK) return 1;
    mt_trainer_backend_t be;
    mt_trainer_backend_psc(client, &be);

    for (int mode = 0; mode < 2; mode++) {
        tc.backend = mode ? &be : NULL;
        mt_trainer_t *tr;
        if (mt_trainer_create(&tc, &tr) != MT_OK) return 1;
        uint64_t x = 1;
        /* Warm up (rows get created), then measure whole steps without the batch making. */
        fill(&b, batch, &x);
        if (mt_trainer_train(tr, &b, 1, probs, NULL) != MT_OK) return 1;
        double gen_s = 0, t0 = now_s();
        size_t done = 0;
        while (done < total) {
            double g0 = now_s();
            fill(&b, batch, &x);
            gen_s += now_s() - g0;
            mt_trainer_step_t st;
            if (mt_trainer_train(tr, &b, 2, probs, &st) != MT_OK) return 1;
            done += batch;
        }
        double sec = now_s() - t0 - gen_s;
        snprintf(extra, sizeof(extra),
                 "\"threads\":1,\"slots\":%d,\"dim\":%d,\"mlp\":\"256-128\",\"batch\":%zu,"
                 "\"backend\":\"%s\",\"examples\":%zu",
                 NSLOTS, DIM, batch, mode ? "1 PS over loopback" : "local table", done);
        emit("train_examples_per_s", (double)done / sec, "examples/s", extra);
        mt_trainer_destroy(tr);
    }
    mt_psc_destroy(client);
    mt_rpc_server_destroy(srv);
    mt_ps_destroy(ps);

    /* The compute floor: the MLP's sgemm shapes, forward and backward (about 3x forward). */
    size_t in = NSLOTS * DIM;
    float *A = calloc(batch * in, sizeof(float)), *W = calloc(in * 256, sizeof(float)),
          *C = calloc(batch * 256, sizeof(float));
    double flops = 0, f0 = now_s();
    for (int r = 0; r < 50; r++) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)batch, 256, (int)in, 1.0f, A,
                    (int)in, W, 256, 0.0f, C, 256);
        flops += 2.0 * (double)batch * 256 * (double)in;
    }
    double gf = flops / (now_s() - f0) / 1e9;
    snprintf(extra, sizeof(extra), "\"threads\":1,\"m\":%zu,\"n\":256,\"k\":%zu", batch, in);
    emit("sgemm_gflops", gf, "GFLOP/s", extra);
    /* FLOPs per example forward: the MLP layers (2*in*256 + 2*256*128 + 2*128). */
    double fwd = 2.0 * (double)in * 256 + 2.0 * 256 * 128 + 2.0 * 128;
    snprintf(extra, sizeof(extra), "\"flops_per_example\":%.0f", 3 * fwd);
    emit("compute_floor_examples_per_s", gf * 1e9 / (3 * fwd), "examples/s", extra);
    free(A);
    free(W);
    free(C);
    free(probs);
    mt_batch_free(&b);
    return 0;
}
