/*
 * test_ps_daemon.c - monolith-ps as a process: three shards on 127.0.0.1 with snapshot
 * directories, trained through the client library, then
 *   - SIGTERM: each shard finishes, writes a last snapshot and exits 0; restarted, every
 *     row comes back (embeddings equal to what the client read before the stop);
 *   - kill -9 after an explicit Snapshot call and more training: restarted, each shard is
 *     back at the snapshot (the later updates are gone, nothing is half-loaded);
 *   - /metrics answers Prometheus text with the shard's counters;
 *   - a bad configuration key exits 2 with a message naming it;
 * and one shard on its own:
 *   - an operator's Restore (no coordinator epoch) keeps the shutdown snapshot; a
 *     coordinator's Restore turns the coordinated mode on, logged with its reason, and the
 *     SIGTERM that then writes no snapshot logs it;
 *   - a damaged newest checkpoint (its table file truncated): the shard refuses to start,
 *     naming the checkpoint, both sizes and the way out; --drop-checkpoint deletes it and
 *     the shard starts from the previous one with its rows.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "monolith/v1/ps.pb-c.h"
#include "mt/ps.h"
#include "mt/route.h"
#include "mt/psclient.h"
#include "mt/rpc.h"
#include "mt/table.h"
#include "testutil_daemon.h"

#if !defined(MT_PS_BIN) || !defined(MT_CLI_BIN)
#error "MT_PS_BIN and MT_CLI_BIN must name the monolith-ps and monolith binaries"
#endif

#define N 3

typedef struct shard {
    pid_t pid;
    int port, mport;
    char dir[320];
} shard_t;

static char root[128];

/* Every daemon this test process started and has not reaped: killed by the fini hook even
 * when an assertion aborts the test (and by PDEATHSIG if the test process dies). */
static tu_procs_t procs;

static void write_conf(const char *path) {
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fprintf(f,
            "[cluster]\nnum_shards = %d\n"
            "[ps]\nlisten = 127.0.0.1:0\nthreads = 2\nsnapshot_interval_s = 0\n"
            "snapshot_keep = 2\nmetrics_listen = 127.0.0.1:0\nexpire_interval_ms = 200\n"
            "[table]\nshards_log2 = 3\nfilter_bytes = 65536\nchangelog_entries = 8192\n"
            "[slot.1]\ndim = 8\noptimizer = adagrad\n"
            "[slot.2]\ndim = 4\noptimizer = sgd\nlr = 0.1\n",
            N);
    fclose(f);
}

/* monolith-ps on root's ps.conf with --set @p setting exits 2 before serving, and its
 * output says @p why. */
static void refused(const char *setting, const char *why) {
    char cmd[400], out[2048];
    snprintf(cmd, sizeof(cmd), "%s --config %s/ps.conf --set %s 2>&1", MT_PS_BIN, root, setting);
    cr_assert_eq(tu_run(cmd, out, sizeof(out)), 2, "%s", out);
    cr_assert(strstr(out, why), "%s", out);
}

/* Starts shard i with up to two more --set settings (NULL: none). */
static void start_with(shard_t *s, int i, const char *set1, const char *set2) {
    char conf[300], portf[300], logf[300], shard[16];
    snprintf(conf, sizeof(conf), "%s/ps.conf", root);
    snprintf(portf, sizeof(portf), "%s/port.%d", root, i);
    snprintf(logf, sizeof(logf), "%s/log.%d", root, i);
    snprintf(shard, sizeof(shard), "%d", i);
    snprintf(s->dir, sizeof(s->dir), "ps.snapshot_dir=%s/snap.%d", root, i);
    unlink(portf);
    char *argv[14] = {MT_PS_BIN, "--config", conf,          "--shard", shard,
                      "--set",   s->dir,     "--port-file", portf};
    int n = 9;
    const char *sets[2] = {set1, set2};
    for (int k = 0; k < 2; k++) {
        if (!sets[k]) continue;
        argv[n++] = "--set";
        argv[n++] = (char *)sets[k];
    }
    argv[n] = NULL;
    s->pid = tu_procs_spawn(&procs, argv, logf, "a"); /* a restart appends to the shard's log */
    s->port = tu_read_port_file(portf, 20);
    cr_assert_gt(s->port, 0, "shard %d did not start (see %s)", i, logf);
}

static void start(shard_t *s, int i) {
    start_with(s, i, NULL, NULL);
}

/* @returns the shard's wait status. */
static int stop(shard_t *s, int sig) {
    return tu_procs_stop(&procs, s->pid, sig);
}

static mt_psc_t *client(shard_t *sh) {
    char addr[N][64];
    const char *a[N];
    for (int i = 0; i < N; i++) {
        snprintf(addr[i], sizeof(addr[i]), "127.0.0.1:%d", sh[i].port);
        a[i] = addr[i];
    }
    mt_psc_config_t cc;
    mt_psc_config_init(&cc);
    cc.addrs = a;
    cc.num_shards = N;
    mt_psc_t *c;
    cr_assert_eq(mt_psc_create(&cc, &c), MT_OK);
    return c;
}

enum { B = 500 };

static void train(mt_psc_t *c, uint64_t *fids, int rounds, uint64_t seed) {
    float out[B * 8], g[B * 8];
    mt_rpc_status_t st;
    for (int r = 0; r < rounds; r++) {
        cr_assert_eq(mt_psc_lookup(c, fids, B, 1, 0, out, B * 8, NULL, &st), MT_OK, "%s",
                     st.message);
        for (int k = 0; k < B * 8; k++)
            g[k] = (float)((seed + (uint64_t)k * 7 + (uint64_t)r) % 11) / 10.0f - 0.5f;
        cr_assert_eq(mt_psc_apply(c, fids, B, g, B * 8, 0, (uint64_t)r, 0, NULL, NULL, &st), MT_OK,
                     "%s", st.message);
    }
}

static void snapshot_all(mt_psc_t *c) {
    Monolith__V1__SnapshotRequest r = MONOLITH__V1__SNAPSHOT_REQUEST__INIT;
    uint8_t buf[16];
    size_t len = monolith__v1__snapshot_request__pack(&r, buf);
    for (uint32_t i = 0; i < N; i++) {
        uint8_t *resp;
        size_t rl;
        mt_rpc_status_t st;
        mt_rpc_call(mt_psc_channel(c, i), "/monolith.v1.ParameterServer/Snapshot", buf, len, 30000,
                    &resp, &rl, &st);
        cr_assert_eq(st.code, MT_RPC_OK, "snapshot of shard %u: %s", i, st.message);
        free(resp);
    }
}

static void setup_root(void) {
    snprintf(root, sizeof(root), "/tmp/mt-ps-daemon-XXXXXX");
    cr_assert_not_null(mkdtemp(root));
    char conf[300];
    snprintf(conf, sizeof(conf), "%s/ps.conf", root);
    write_conf(conf);
}

static void cleanup_root(void) {
    tu_procs_kill_all(&procs);
    char cmd[400];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
    int rc = system(cmd);
    (void)rc;
}

Test(ps_daemon, sigterm_and_restart_restore_every_row, .timeout = 120, .fini = cleanup_root) {
    setup_root();
    shard_t sh[N];
    for (int i = 0; i < N; i++)
        start(&sh[i], i);
    mt_psc_t *c = client(sh);
    uint64_t fids[B];
    for (int i = 0; i < B; i++)
        fids[i] = MT_FID_MAKE(1, (uint64_t)i * 7919 + 3);
    train(c, fids, 5, 1);
    float before[B * 8], after[B * 8];
    uint8_t found[B];
    mt_rpc_status_t st;
    cr_assert_eq(mt_psc_lookup(c, fids, B, 0, 0, before, B * 8, found, &st), MT_OK);
    for (int i = 0; i < B; i++)
        cr_assert_eq(found[i], 1);
    mt_psc_destroy(c);
    for (int i = 0; i < N; i++) {
        int ws = stop(&sh[i], SIGTERM);
        cr_assert(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "shard %d exit status %d", i, ws);
    }
    for (int i = 0; i < N; i++)
        start(&sh[i], i);
    c = client(sh);
    cr_assert_eq(mt_psc_lookup(c, fids, B, 0, 0, after, B * 8, found, &st), MT_OK, "%s",
                 st.message);
    for (int i = 0; i < B; i++)
        cr_assert_eq(found[i], 1, "row %d lost", i);
    cr_assert_eq(memcmp(before, after, sizeof(before)), 0, "restored rows differ");
    mt_psc_destroy(c);
    for (int i = 0; i < N; i++)
        stop(&sh[i], SIGTERM);
}

Test(ps_daemon, kill9_restores_the_last_snapshot, .timeout = 120, .fini = cleanup_root) {
    setup_root();
    shard_t sh[N];
    for (int i = 0; i < N; i++)
        start(&sh[i], i);
    mt_psc_t *c = client(sh);
    uint64_t fids[B];
    for (int i = 0; i < B; i++)
        fids[i] = MT_FID_MAKE(1, (uint64_t)i * 104729 + 11);
    train(c, fids, 3, 2);
    float snap[B * 8], later[B * 8], after[B * 8];
    uint8_t found[B];
    mt_rpc_status_t st;
    cr_assert_eq(mt_psc_lookup(c, fids, B, 0, 0, snap, B * 8, found, &st), MT_OK);
    snapshot_all(c);
    train(c, fids, 3, 3); /* updates after the snapshot: lost by kill -9 */
    cr_assert_eq(mt_psc_lookup(c, fids, B, 0, 0, later, B * 8, found, &st), MT_OK);
    cr_assert_neq(memcmp(snap, later, sizeof(snap)), 0);
    mt_psc_destroy(c);
    for (int i = 0; i < N; i++) {
        int ws = stop(&sh[i], SIGKILL);
        cr_assert(WIFSIGNALED(ws));
    }
    for (int i = 0; i < N; i++)
        start(&sh[i], i);
    c = client(sh);
    cr_assert_eq(mt_psc_lookup(c, fids, B, 0, 0, after, B * 8, found, &st), MT_OK, "%s",
                 st.message);
    for (int i = 0; i < B; i++)
        cr_assert_eq(found[i], 1);
    cr_assert_eq(memcmp(snap, after, sizeof(snap)), 0, "not the snapshot's state");
    mt_psc_destroy(c);
    for (int i = 0; i < N; i++)
        stop(&sh[i], SIGTERM);
}

Test(ps_daemon, metrics_and_bad_config, .timeout = 60, .fini = cleanup_root) {
    setup_root();
    shard_t sh[N];
    for (int i = 0; i < N; i++)
        start(&sh[i], i);
    mt_psc_t *c = client(sh);
    uint64_t fids[B];
    for (int i = 0; i < B; i++)
        fids[i] = MT_FID_MAKE(1, (uint64_t)i);
    train(c, fids, 1, 4);
    mt_psc_destroy(c);
    /* The metrics port is in the log line "metrics on port N". */
    char logf[300];
    snprintf(logf, sizeof(logf), "%s/log.0", root);
    int mport = tu_metrics_port(logf);
    cr_assert_gt(mport, 0);
    char *body = tu_http_get(mport, "/metrics");
    cr_assert_not_null(body);
    cr_assert(strstr(body, "HTTP/1.0 200"), "%s", body);
    cr_assert(strstr(body, "monolith_ps_requests_total{shard=\"0\",method=\"Lookup\"} 1"), "%s",
              body);
    cr_assert(strstr(body, "monolith_ps_rows{shard=\"0\"}"));
    cr_assert(strstr(
        body,
        "monolith_ps_request_seconds_bucket{shard=\"0\",method=\"ApplyGradients\",le=\"+Inf\"} 1"));
    free(body);
    body = tu_http_get(mport, "/nope");
    cr_assert(body && strstr(body, "404"));
    free(body);
    /* The operators' CLI against the running shards. */
    char cmd[1200], out[8192];
    snprintf(cmd, sizeof(cmd), "%s health --addr 127.0.0.1:%d", MT_CLI_BIN, sh[0].port);
    cr_assert_eq(tu_run(cmd, out, sizeof(out)), 0);
    cr_assert(strstr(out, "\"status\":\"SERVING\""), "%s", out);
    snprintf(cmd, sizeof(cmd), "%s stats --addr 127.0.0.1:%d", MT_CLI_BIN, sh[1].port);
    cr_assert_eq(tu_run(cmd, out, sizeof(out)), 0);
    cr_assert(strstr(out, "\"shard\":1,\"num_shards\":3"), "%s", out);
    cr_assert(strstr(out, "\"optimizer\":\"adagrad\""), "%s", out);
    snprintf(cmd, sizeof(cmd), "%s lookup --ps 127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d 1:0 1:1 2:77",
             MT_CLI_BIN, sh[0].port, sh[1].port, sh[2].port);
    cr_assert_eq(tu_run(cmd, out, sizeof(out)), 0);
    cr_assert(strstr(out, "\"fid\":\"0x0001000000000000\",\"slot\":1,\"value\":0,\"found\":true"),
              "%s", out);
    cr_assert(strstr(out, "\"fid\":\"0x000200000000004d\",\"slot\":2,\"value\":77,\"found\":false"),
              "%s", out);
    snprintf(cmd, sizeof(cmd), "%s lookup --ps 127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d 9:1 2>&1",
             MT_CLI_BIN, sh[0].port, sh[1].port, sh[2].port);
    cr_assert_eq(tu_run(cmd, out, sizeof(out)), 1);
    cr_assert(strstr(out, "slot 9 is not configured"), "%s", out);
    snprintf(cmd, sizeof(cmd), "%s snapshot --addr 127.0.0.1:%d", MT_CLI_BIN, sh[2].port);
    cr_assert_eq(tu_run(cmd, out, sizeof(out)), 0);
    cr_assert(strstr(out, "\"checkpoint_id\":1,\"shard\":2"), "%s", out);
    snprintf(cmd, sizeof(cmd), "%s frobnicate 2>/dev/null", MT_CLI_BIN);
    cr_assert_eq(tu_run(cmd, out, sizeof(out)), 2);
    for (int i = 0; i < N; i++)
        stop(&sh[i], SIGTERM);
    /* A wrong key: exit status 2 and the key named on stderr. */
    refused("ps.thread=3", "ps.thread");
}

/* The table's bytes on a shard's metrics page, or -1. */
static double table_bytes(const char *logf) {
    int mport = tu_metrics_port(logf);
    cr_assert_gt(mport, 0);
    char *body = tu_http_get(mport, "/metrics");
    cr_assert_not_null(body);
    static const char name[] = "monolith_ps_table_bytes{shard=\"0\"} ";
    const char *at = strstr(body, name);
    double v = at ? strtod(at + strlen(name), NULL) : -1;
    free(body);
    return v;
}

/* [table] reserve_rows: a shard takes its rows' memory at start, before any write; without
 * initial_rows the setting is refused (exit 2, named). */
Test(ps_daemon, reserve_rows_takes_the_rows_memory_at_start, .timeout = 60, .fini = cleanup_root) {
    setup_root();
    enum { ROWS = 200000 };
    char logf[300];
    snprintf(logf, sizeof(logf), "%s/log.0", root);
    shard_t s;
    start_with(&s, 0, "table.initial_rows=200000", NULL);
    double plain = table_bytes(logf);
    stop(&s, SIGTERM);
    unlink(logf);
    start_with(&s, 0, "table.initial_rows=200000", "table.reserve_rows=true");
    double reserved = table_bytes(logf);
    stop(&s, SIGTERM);
    /* slot 1's rows: a 16-byte header, 8 floats and 8 of Adagrad state */
    cr_assert_geq(reserved - plain, (double)ROWS * (16 + 64), "%.0f bytes against %.0f", reserved,
                  plain);
    refused("table.reserve_rows=true", "table.reserve_rows: true needs table.initial_rows > 0");
}

/* ---------------- one shard on its own: coordination, damaged checkpoints ---------------- */

/* A client of shard @p s alone: ids are sent to it whatever their owner (the tests pick ids
 * that shard 0 owns among the N of the configuration). */
static mt_psc_t *client_of(const shard_t *s) {
    char addr[64];
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", s->port);
    const char *a[1] = {addr};
    mt_psc_config_t cc;
    mt_psc_config_init(&cc);
    cc.addrs = a;
    cc.num_shards = 1;
    mt_psc_t *c;
    cr_assert_eq(mt_psc_create(&cc, &c), MT_OK);
    return c;
}

/* @p n ids of slot 1 that shard 0 of N owns, the first of them at value >= @p v0. */
static void shard0_ids(uint64_t *fids, size_t n, uint64_t v0) {
    size_t k = 0;
    for (uint64_t v = v0; k < n; v++)
        if (mt_route_shard_of(MT_FID_MAKE(1, v), N) == 0) fids[k++] = MT_FID_MAKE(1, v);
}

/* A training lookup (creates the rows) and one gradient step on @p n ids of slot 1. */
static void train_ids(mt_psc_t *c, const uint64_t *fids, size_t n, float g) {
    float out[64 * 8], grads[64 * 8];
    mt_rpc_status_t st;
    cr_assert_leq(n, 64);
    cr_assert_eq(mt_psc_lookup(c, fids, n, 1, 0, out, n * 8, NULL, &st), MT_OK, "%s", st.message);
    for (size_t k = 0; k < n * 8; k++)
        grads[k] = g * (float)(k % 5 + 1);
    cr_assert_eq(mt_psc_apply(c, fids, n, grads, n * 8, 0, 1, 0, NULL, NULL, &st), MT_OK, "%s",
                 st.message);
}

/* A plain lookup of @p n ids of slot 1 (values in @p out); @returns how many have a row. */
static size_t rows_found(mt_psc_t *c, const uint64_t *fids, size_t n, float *out) {
    uint8_t found[64];
    mt_rpc_status_t st;
    cr_assert_leq(n, 64);
    cr_assert_eq(mt_psc_lookup(c, fids, n, 0, 0, out, n * 8, found, &st), MT_OK, "%s", st.message);
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += found[i];
    return k;
}

/* A raw admin call on shard 0 of @p c; asserts it succeeds. @returns the answer (caller frees). */
static uint8_t *admin(mt_psc_t *c, const char *method, const ProtobufCMessage *req, size_t *len) {
    uint8_t buf[256], *resp = NULL;
    size_t n = protobuf_c_message_pack(req, buf);
    char path[96];
    snprintf(path, sizeof(path), "/monolith.v1.ParameterServer/%s", method);
    mt_rpc_status_t st;
    cr_assert_eq(mt_rpc_call(mt_psc_channel(c, 0), path, buf, n, 30000, &resp, len, &st), MT_OK);
    cr_assert_eq(st.code, MT_RPC_OK, "%s: %s", method, st.message);
    return resp;
}

static uint64_t snapshot_one(mt_psc_t *c, uint64_t id, int consistent, uint64_t epoch) {
    Monolith__V1__SnapshotRequest r = MONOLITH__V1__SNAPSHOT_REQUEST__INIT;
    r.checkpoint_id = id;
    r.consistent = consistent;
    r.epoch = epoch;
    size_t len = 0;
    uint8_t *resp = admin(c, "Snapshot", &r.base, &len);
    Monolith__V1__SnapshotResponse *s = monolith__v1__snapshot_response__unpack(NULL, len, resp);
    free(resp);
    cr_assert(s && s->meta);
    uint64_t got = s->meta->checkpoint_id;
    monolith__v1__snapshot_response__free_unpacked(s, NULL);
    return got;
}

static void restore_one(mt_psc_t *c, uint64_t id, uint64_t epoch) {
    Monolith__V1__RestoreRequest r = MONOLITH__V1__RESTORE_REQUEST__INIT;
    r.checkpoint_id = id;
    r.epoch = epoch;
    size_t len = 0;
    free(admin(c, "Restore", &r.base, &len));
}

/* The value of the gauge @p name{shard="0"} on the shard's /metrics (its log names the port). */
static double gauge0(const char *name) {
    char logf[300], key[160];
    snprintf(logf, sizeof(logf), "%s/log.0", root);
    int mport = tu_metrics_port(logf);
    cr_assert_gt(mport, 0);
    char *body = tu_http_get(mport, "/metrics");
    cr_assert_not_null(body);
    snprintf(key, sizeof(key), "\n%s{shard=\"0\"} ", name);
    const char *p = strstr(body, key);
    cr_assert_not_null(p, "no %s in\n%s", name, body);
    double v = strtod(p + strlen(key), NULL);
    free(body);
    return v;
}

/* The whole log of shard 0 (caller frees). */
static char *log0(void) {
    char logf[300];
    snprintf(logf, sizeof(logf), "%s/log.0", root);
    FILE *f = fopen(logf, "r");
    cr_assert_not_null(f);
    char *buf = calloc(1, 1 << 20);
    size_t n = fread(buf, 1, (1 << 20) - 1, f);
    buf[n] = 0;
    fclose(f);
    return buf;
}

/* Regression (an outside probe): an operator's Restore, of the newest checkpoint and with no
 * trainer anywhere, turned the coordinated mode on, and from then on the shard wrote no
 * shutdown snapshot: the rows trained after it were lost by a plain SIGTERM. Only a
 * coordinator (a Restore carrying its epoch, a consistent Snapshot) turns it on. */
Test(ps_daemon, an_operators_restore_keeps_the_shutdown_snapshot, .timeout = 120,
     .fini = cleanup_root) {
    setup_root();
    shard_t s;
    start(&s, 0);
    mt_psc_t *c = client_of(&s);
    uint64_t a[16], b[3];
    shard0_ids(a, 16, 1);
    shard0_ids(b, 3, 100000);
    train_ids(c, a, 16, 0.1f);
    uint64_t id = snapshot_one(c, 0, 0, 0);
    cr_assert_eq(id, 1);
    restore_one(c, id, 0); /* the operator's: no epoch */
    train_ids(c, b, 3, 0.2f);
    float vb[3 * 8], now[3 * 8];
    cr_assert_eq(rows_found(c, b, 3, vb), 3);
    mt_psc_destroy(c);
    int ws = stop(&s, SIGTERM);
    cr_assert(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "exit status %d", ws);
    start(&s, 0);
    c = client_of(&s);
    cr_assert_eq(rows_found(c, b, 3, now), 3, "the rows trained after the Restore were lost");
    cr_assert_eq(memcmp(vb, now, sizeof(vb)), 0);
    cr_assert_eq(gauge0("monolith_ps_coordinated"), 0);
    /* the same Restore on the running shard: still not coordinated */
    restore_one(c, 2, 0);
    cr_assert_eq(gauge0("monolith_ps_coordinated"), 0, "an operator's Restore coordinates");
    mt_psc_destroy(c);
    stop(&s, SIGTERM);
}

/* A coordinator's Restore (with its epoch) turns the mode on, the log says why, and the
 * SIGTERM that then writes no snapshot says so, naming what is not saved. */
Test(ps_daemon, a_coordinators_restore_coordinates_and_the_shutdown_says_why, .timeout = 120,
     .fini = cleanup_root) {
    setup_root();
    shard_t s;
    start(&s, 0);
    mt_psc_t *c = client_of(&s);
    uint64_t a[8], b[3];
    shard0_ids(a, 8, 1);
    shard0_ids(b, 3, 100000);
    const uint64_t epoch = (1ull << 32) | 77;
    restore_one(c, 0, epoch); /* a coordinator's first recovery: the empty state */
    cr_assert_eq(gauge0("monolith_ps_coordinated"), 1);
    train_ids(c, a, 8, 0.1f);
    cr_assert_eq(snapshot_one(c, 1, 1, epoch), 1);
    train_ids(c, b, 3, 0.2f); /* after the cluster checkpoint: the coordinator's to replay */
    mt_psc_destroy(c);
    int ws = stop(&s, SIGTERM);
    cr_assert(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "exit status %d", ws);
    char *log = log0();
    cr_assert(strstr(log, "coordinated") && strstr(log, "epoch 4294967373"),
              "no log line says why the shard is coordinated:\n%s", log);
    const char *skip = strstr(log, "no last snapshot");
    cr_assert_not_null(skip, "the skipped shutdown snapshot is not logged:\n%s", log);
    cr_assert(strstr(skip, "checkpoint 1"), "%s", skip);
    free(log);
    start(&s, 0); /* from cluster checkpoint 1: coordinated again, b is not in it */
    c = client_of(&s);
    float v[8 * 8];
    cr_assert_eq(rows_found(c, a, 8, v), 8);
    cr_assert_eq(rows_found(c, b, 3, v), 0);
    cr_assert_eq(gauge0("monolith_ps_coordinated"), 1);
    mt_psc_destroy(c);
    stop(&s, SIGTERM);
}

/* The table file (.sst) of the store in @p dir that holds checkpoint @p id's data (each
 * checkpoint is one file, written without compression: its keys are in it as they are).
 * @returns 1 with its path in @p path. */
static int sst_of(const char *dir, uint64_t id, char *path, size_t cap) {
    char needle[64];
    snprintf(needle, sizeof(needle), "ckpt/%020llu/sparse/", (unsigned long long)id);
    DIR *d = opendir(dir);
    cr_assert_not_null(d, "%s", dir);
    struct dirent *de;
    int hit = 0;
    while (!hit && (de = readdir(d)) != NULL) {
        size_t nl = strlen(de->d_name);
        if (nl < 4 || strcmp(de->d_name + nl - 4, ".sst") != 0) continue;
        snprintf(path, cap, "%s/%s", dir, de->d_name);
        FILE *f = fopen(path, "rb");
        if (!f) continue;
        static char buf[8 << 20];
        size_t n = fread(buf, 1, sizeof(buf), f);
        fclose(f);
        hit = memmem(buf, n, needle, strlen(needle)) != NULL;
    }
    closedir(d);
    return hit;
}

/* Runs the shard with @p extra (one more argument pair, or NULLs) and waits for it to exit
 * on its own. @returns its wait status. */
static int run_to_exit(int i, const char *extra1, const char *extra2) {
    char conf[300], logf[300], shard[16], dir[320];
    snprintf(conf, sizeof(conf), "%s/ps.conf", root);
    snprintf(logf, sizeof(logf), "%s/log.%d", root, i);
    snprintf(shard, sizeof(shard), "%d", i);
    snprintf(dir, sizeof(dir), "ps.snapshot_dir=%s/snap.%d", root, i);
    char *const argv[] = {MT_PS_BIN, "--config", conf,           "--shard",      shard,
                          "--set",   dir,        (char *)extra1, (char *)extra2, NULL};
    pid_t pid = tu_procs_spawn(&procs, argv, logf, "a");
    int ws = 0;
    for (int k = 0; k < 600; k++) { /* the exit, polled: at most 60 s */
        if (waitpid(pid, &ws, WNOHANG) == pid) {
            tu_procs_forget(&procs, pid);
            return ws;
        }
        usleep(100000);
    }
    cr_assert_fail("shard %d did not exit (see %s)", i, logf);
    return -1;
}

/* Regression (an outside probe): a shard whose newest checkpoint is damaged (here: its table
 * file truncated, as a full disk or a bad copy leaves it) refused to start with "file is too
 * short (N bytes)", N the expected size, naming no checkpoint and no way out. Now it refuses
 * naming the checkpoint, both sizes and the way out; `--drop-checkpoint ID` deletes it, and
 * the shard starts from the previous one and serves its rows. */
Test(ps_daemon, a_damaged_newest_checkpoint_is_named_and_can_be_dropped, .timeout = 180,
     .fini = cleanup_root) {
    setup_root();
    shard_t s;
    start(&s, 0);
    mt_psc_t *c = client_of(&s);
    uint64_t a[16], b[8];
    shard0_ids(a, 16, 1);
    shard0_ids(b, 8, 100000);
    train_ids(c, a, 16, 0.1f);
    cr_assert_eq(snapshot_one(c, 0, 0, 0), 1);
    float va[16 * 8], v[16 * 8];
    cr_assert_eq(rows_found(c, a, 16, va), 16);
    train_ids(c, b, 8, 0.2f); /* only in checkpoint 2, the shutdown snapshot */
    mt_psc_destroy(c);
    int ws = stop(&s, SIGTERM);
    cr_assert(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "exit status %d", ws);

    char snap[320], sst[600];
    snprintf(snap, sizeof(snap), "%s/snap.0", root);
    cr_assert(sst_of(snap, 2, sst, sizeof(sst)), "no table file holds checkpoint 2");
    struct stat sb;
    cr_assert_eq(stat(sst, &sb), 0);
    cr_assert_eq(truncate(sst, 1000), 0);
    ws = run_to_exit(0, NULL, NULL);
    cr_assert(WIFEXITED(ws) && WEXITSTATUS(ws) == 1, "a damaged checkpoint: exit status %d", ws);
    char *log = log0();
    const char *e = log;
    for (const char *p = log; (p = strstr(p, " ERROR ")) != NULL; p++)
        e = p; /* the refusal: the last error */
    cr_assert(strstr(e, "checkpoint 2"), "the refusal does not name checkpoint 2:\n%s", log);
    char want[64];
    snprintf(want, sizeof(want), "%lld", (long long)sb.st_size);
    cr_assert(strstr(e, "1000 bytes") && strstr(e, want), "not both sizes (1000, %s):\n%s", want,
              e);
    cr_assert(strstr(e, "--drop-checkpoint 2"), "no way out named:\n%s", e);
    cr_assert(strstr(e, "checkpoint 1"), "the previous checkpoint is not named:\n%s", e);
    free(log);

    ws = run_to_exit(0, "--drop-checkpoint", "2");
    cr_assert(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "--drop-checkpoint 2: exit status %d", ws);
    start(&s, 0);
    c = client_of(&s);
    cr_assert_eq(rows_found(c, a, 16, v), 16, "checkpoint 1's rows");
    cr_assert_eq(memcmp(va, v, sizeof(va)), 0);
    cr_assert_eq(rows_found(c, b, 8, v), 0, "rows of the dropped checkpoint");
    mt_psc_destroy(c);
    stop(&s, SIGTERM);
}
