/*
 * test_ps_daemon.c - monolith-ps as a process: three shards on 127.0.0.1 with snapshot
 * directories, trained through the client library, then
 *   - SIGTERM: each shard finishes, writes a last snapshot and exits 0; restarted, every
 *     row comes back (embeddings equal to what the client read before the stop);
 *   - kill -9 after an explicit Snapshot call and more training: restarted, each shard is
 *     back at the snapshot (the later updates are gone, nothing is half-loaded);
 *   - /metrics answers Prometheus text with the shard's counters;
 *   - a bad configuration key exits 2 with a message naming it.
 */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "monolith/v1/ps.pb-c.h"
#include "mt/ps.h"
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

static void start(shard_t *s, int i) {
    char conf[300], portf[300], logf[300], shard[16];
    snprintf(conf, sizeof(conf), "%s/ps.conf", root);
    snprintf(portf, sizeof(portf), "%s/port.%d", root, i);
    snprintf(logf, sizeof(logf), "%s/log.%d", root, i);
    snprintf(shard, sizeof(shard), "%d", i);
    snprintf(s->dir, sizeof(s->dir), "ps.snapshot_dir=%s/snap.%d", root, i);
    unlink(portf);
    char *const argv[] = {MT_PS_BIN, "--config", conf,          "--shard", shard,
                          "--set",   s->dir,     "--port-file", portf,     NULL};
    s->pid = tu_procs_spawn(&procs, argv, logf, "a"); /* a restart appends to the shard's log */
    s->port = tu_read_port_file(portf, 20);
    cr_assert_gt(s->port, 0, "shard %d did not start (see %s)", i, logf);
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
    char logf[300], line[512];
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
    snprintf(cmd, sizeof(cmd), "%s --config %s/ps.conf --set ps.thread=3 2>%s/err.txt", MT_PS_BIN,
             root, root);
    int ws = system(cmd);
    cr_assert(WIFEXITED(ws) && WEXITSTATUS(ws) == 2, "status %d", ws);
    char errf[300];
    snprintf(errf, sizeof(errf), "%s/err.txt", root);
    FILE *f = fopen(errf, "r");
    cr_assert_not_null(f);
    cr_assert_not_null(fgets(line, sizeof(line), f));
    fclose(f);
    cr_assert(strstr(line, "ps.thread"), "%s", line);
}
