/*
 * test_cli.c - the operators' tool as a library (mt/cli.h), in process, its stdout read back:
 * bad usage (exit 2, nothing sent); health against a server that is and is not SERVING;
 * predict against a fake Serving that answers what it received (the fids grouped by slot,
 * one and several tasks); stats against a fake PS (every field of the JSON line) and a
 * malformed answer (exit 1); gen's TSV. The daemons end to end: tests/e2e (test_ps_daemon
 * runs lookup and snapshot, checkpoint_e2e offsets, the replay tests replay).
 */
#include <criterion/criterion.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "monolith/v1/ps.pb-c.h"
#include "monolith/v1/serving.pb-c.h"
#include "mt/cli.h"
#include "mt/rpc.h"

static char out[65536];

/* Runs `monolith ARGS...` (NULL-terminated; copied: the tool writes into its argv, as a
 * program may); its stdout in `out`. @returns the exit status. */
static int cli(const char *first, ...) {
    char *argv[64];
    int argc = 0;
    argv[argc++] = (char *)"monolith";
    va_list ap;
    va_start(ap, first);
    for (const char *a = first; a && argc < 63; a = va_arg(ap, const char *))
        argv[argc++] = strdup(a);
    va_end(ap);
    argv[argc] = NULL;
    fflush(stdout);
    int saved = dup(1);
    FILE *tmp = tmpfile();
    cr_assert(saved >= 0 && tmp);
    dup2(fileno(tmp), 1);
    int rc = mt_cli_run(argc, argv, NULL);
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    rewind(tmp);
    out[fread(out, 1, sizeof(out) - 1, tmp)] = '\0';
    fclose(tmp);
    for (int i = 1; i < argc; i++)
        free(argv[i]);
    return rc;
}

Test(cli, bad_usage) {
    cr_assert_eq(cli(NULL), 2);
    cr_assert_eq(cli("frobnicate", NULL), 2);
    cr_assert_eq(cli("health", NULL), 2, "health needs --addr");
    cr_assert_eq(cli("stats", "--addr", "127.0.0.1:1", "--colour", "red", NULL), 2);
    cr_assert_eq(cli("lookup", "--ps", "127.0.0.1:1", "zz", NULL), 2, "not a fid");
    cr_assert_eq(cli("lookup", "--ps", "127.0.0.1:1", "70000:1", NULL), 2, "slot > 65535");
    cr_assert_eq(cli("lookup", "--ps", "127.0.0.1:1", "1:281474976710656", NULL), 2,
                 "value >= 2^48");
    cr_assert_eq(
        cli("predict", "--addr", "127.0.0.1:1", "--user", "1:1", "--candidate", "abc", NULL), 2,
        "a candidate without ITEM=");
    cr_assert_eq(
        cli("predict", "--addr", "127.0.0.1:1", "--user", "1:x", "--candidate", "5=2:1", NULL), 2,
        "a bad user fid");
    cr_assert_eq(cli("gen", "--examples", "ten", NULL), 2);
    cr_assert_eq(cli("stats", "--addr", "127.0.0.1:1", "--tls-cert", "/x.pem", NULL), 2,
                 "TLS without a CA");
    cr_assert_eq(cli("snapshot", "--addr", "127.0.0.1:1", "--id", "x", NULL), 2);
    cr_assert_str_eq(out, "", "nothing on stdout for a refusal");
}

/* ---- fakes ---- */

/* Serving/Predict: candidate j's score is its item id + 0.25 x its slots; sparse_version the
 * number of user slots, dense_version the number of user fids; request id "mt": two tasks,
 * task 1 half of task 0. */
static void fake_predict(void *ud, mt_rpc_call_t *c, const uint8_t *req, size_t len) {
    (void)ud;
    Monolith__V1__PredictRequest *r = monolith__v1__predict_request__unpack(NULL, len, req);
    if (!r) {
        mt_rpc_fail(c, MT_RPC_INVALID_ARGUMENT, "bad request");
        return;
    }
    Monolith__V1__PredictResponse p = MONOLITH__V1__PREDICT_RESPONSE__INIT;
    float s[16], ts[32];
    size_t nf = 0;
    for (size_t i = 0; i < r->n_user; i++)
        nf += r->user[i]->n_fids;
    for (size_t j = 0; j < r->n_candidates && j < 16; j++) {
        s[j] = (float)r->candidates[j]->item_id + 0.25f * (float)r->candidates[j]->n_item;
        ts[2 * j] = s[j];
        ts[2 * j + 1] = s[j] / 2;
    }
    p.n_scores = r->n_candidates;
    p.scores = s;
    p.sparse_version = r->n_user;
    p.dense_version = nf;
    if (!strcmp(r->request_id, "mt")) {
        p.tasks = 2;
        p.n_task_scores = 2 * r->n_candidates;
        p.task_scores = ts;
    }
    uint8_t buf[512];
    size_t n = monolith__v1__predict_response__pack(&p, buf);
    mt_rpc_reply(c, buf, n);
    monolith__v1__predict_request__free_unpacked(r, NULL);
}

static void fake_stats(void *ud, mt_rpc_call_t *c, const uint8_t *req, size_t len) {
    (void)req;
    (void)len;
    if (ud) { /* a malformed answer */
        mt_rpc_reply(c, (const uint8_t *)"\xff\xff\xff", 3);
        return;
    }
    Monolith__V1__StatsResponse s = MONOLITH__V1__STATS_RESPONSE__INIT;
    Monolith__V1__SlotInfo si = MONOLITH__V1__SLOT_INFO__INIT, *sp = &si;
    si.slot = 3;
    si.dim = 8;
    si.optimizer = (char *)"adagrad";
    si.min_count = 2;
    si.ttl_s = 60;
    s.shard = 1;
    s.num_shards = 2;
    s.incarnation = 7;
    s.rows = 1000;
    s.capacity = 4096;
    s.load_factor = 0.25;
    s.bytes_total = 123456;
    s.version = 99;
    s.evictions = 4;
    s.filtered = 5;
    s.dense_version = 6;
    s.examples_applied = 512;
    s.last_checkpoint_id = 3;
    s.n_slots = 1;
    s.slots = &sp;
    uint8_t buf[512];
    size_t n = monolith__v1__stats_response__pack(&s, buf);
    mt_rpc_reply(c, buf, n);
}

static mt_rpc_server_t *fake(const char *path, mt_rpc_handler_fn fn, void *ud, char *addr) {
    mt_rpc_server_config_t sc;
    mt_rpc_server_config_init(&sc);
    mt_rpc_server_t *s = NULL;
    int port = 0;
    cr_assert_eq(mt_rpc_server_create(&sc, &s), MT_OK);
    if (path) cr_assert_eq(mt_rpc_server_add(s, path, 0, fn, ud), MT_OK);
    cr_assert_eq(mt_rpc_server_start(s, &port), MT_OK);
    sprintf(addr, "127.0.0.1:%d", port);
    return s;
}

Test(cli, health) {
    char addr[64];
    mt_rpc_server_t *s = fake(NULL, NULL, NULL, addr);
    cr_assert_eq(cli("health", "--addr", addr, NULL), 0);
    cr_assert_str_eq(out, "{\"status\":\"SERVING\"}\n");
    mt_rpc_server_set_serving(s, 0);
    cr_assert_eq(cli("health", "--addr", addr, NULL), 1);
    cr_assert_str_eq(out, "{\"status\":\"NOT_SERVING\"}\n");
    cr_assert_eq(cli("health", "--addr", addr, "--service", "no.Such", NULL), 1, "NOT_FOUND");
    cr_assert_str_eq(out, "");
    mt_rpc_server_destroy(s);
}

Test(cli, predict) {
    char addr[64];
    mt_rpc_server_t *s = fake("/monolith.v1.Serving/Predict", fake_predict, NULL, addr);
    /* user: slots 1 (two fids) and 2; candidate 42: slots 3 and 4; 7: slot 3 */
    cr_assert_eq(cli("predict", "--addr", addr, "--user", "1:5,2:7,1:6", "--candidate",
                     "42=3:1,4:9,3:2", "--candidate", "7=3:1", NULL),
                 0);
    cr_assert_str_eq(out, "{\"scores\":[42.5,7.25],\"sparse_version\":2,\"dense_version\":3}\n");
    cr_assert_eq(cli("predict", "--addr", addr, "--request-id", "mt", "--user", "1:5",
                     "--candidate", "8=3:1", NULL),
                 0);
    cr_assert_str_eq(out, "{\"scores\":[8.25],\"task_scores\":[[8.25,4.125]],\"tasks\":2,"
                          "\"sparse_version\":1,\"dense_version\":1}\n");
    mt_rpc_server_destroy(s);
    /* nobody there any more: the call fails, exit 1 */
    cr_assert_eq(cli("predict", "--addr", addr, "--user", "1:5", "--candidate", "8=3:1", NULL), 1);
}

Test(cli, stats) {
    char addr[64], bad[64];
    mt_rpc_server_t *s = fake("/monolith.v1.ParameterServer/Stats", fake_stats, NULL, addr);
    cr_assert_eq(cli("stats", "--addr", addr, NULL), 0);
    cr_assert_str_eq(out,
                     "{\"shard\":1,\"num_shards\":2,\"incarnation\":7,\"rows\":1000,"
                     "\"capacity\":4096,\"load_factor\":0.2500,\"bytes_total\":123456,"
                     "\"version\":99,\"evictions\":4,\"filtered\":5,\"dense_version\":6,"
                     "\"examples_applied\":512,\"last_checkpoint_id\":3,\"slots\":[{\"slot\":3,"
                     "\"dim\":8,\"optimizer\":\"adagrad\",\"min_count\":2,\"ttl_s\":60,"
                     "\"fp16\":false}]}\n");
    mt_rpc_server_t *g = fake("/monolith.v1.ParameterServer/Stats", fake_stats, (void *)1, bad);
    cr_assert_eq(cli("stats", "--addr", bad, NULL), 1, "a malformed answer");
    cr_assert_str_eq(out, "");
    mt_rpc_server_destroy(g);
    mt_rpc_server_destroy(s);
}

Test(cli, gen_tsv) {
    cr_assert_eq(cli("gen", "--examples", "3", "--seed", "5", "--tasks", "2", NULL), 0);
    int lines = 0;
    for (const char *p = out; *p; p++)
        lines += *p == '\n';
    cr_assert_eq(lines, 4, "a header and 3 rows: %s", out);
    const char *head =
        "label\tconversion\ttimestamp_ms\tuser\titem\tsegment\tcategory\thour\ttags\n";
    cr_assert(!strncmp(out, head, strlen(head)), "%s", out);
    const char *row = strchr(out, '\n') + 1;
    int tabs = 0;
    for (const char *p = row; *p != '\n'; p++)
        tabs += *p == '\t';
    cr_assert_eq(tabs, 8, "9 columns: %s", row);
}
