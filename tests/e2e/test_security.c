/*
 * test_security.c - the daemons with [tls] enabled (mutual TLS), as processes (issue #7).
 *
 *   - monolith-ps serves a psclient with the client certificate (lookup + apply); clients
 *     without TLS, or without a client certificate, get UNAVAILABLE;
 *   - its limits: a request over ps.max_message_bytes is RESOURCE_EXHAUSTED, an admin call
 *     without or with a wrong ps.admin_token PERMISSION_DENIED; /metrics exports the
 *     admission counters (monolith_ps_rejected_total);
 *   - the operators' CLI with --tls-* flags; without them it cannot reach the shard;
 *   - monolith-serving with the same file: Health over TLS, and its Sync streams reach the
 *     PS through mutual TLS (the PS counts them);
 *   - a missing certificate file stops the daemon with a message naming the path, and
 *     tls.enabled without files is a configuration error naming the key (exit 2);
 *   - one rule for bad TLS files (missing, not PEM, a key of another certificate) in every
 *     daemon with TLS (ps, serving, trainer, loadgen): exit 2 with a message naming the
 *     file, under --check and at a real start alike.
 * Certificates are made at test time (tests/unit/rpc/tls_certs.h).
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
#include "mt/psclient.h"
#include "mt/rpc.h"
#include "mt/table.h"
#include "testutil_daemon.h"
#include "tls_certs.h"

#if !defined(MT_PS_BIN) || !defined(MT_CLI_BIN) || !defined(MT_SERVING_BIN) || \
    !defined(MT_TRAINER_BIN) || !defined(MT_LOADGEN_BIN)
#error "MT_PS_BIN, MT_CLI_BIN, MT_SERVING_BIN, MT_TRAINER_BIN, MT_LOADGEN_BIN: the binaries"
#endif

static char dir[64];
static tu_procs_t procs; /* the daemons started and not reaped: killed by cleanup() */

static void cleanup(void) {
    tu_procs_kill_all(&procs);
    tls_certs_remove(dir);
}

static void setup(void) {
    cr_assert_eq(tls_certs_make(dir, sizeof(dir)), 0, "openssl failed: see %s/openssl.log", dir);
}

TestSuite(security_e2e, .init = setup, .fini = cleanup, .timeout = 60);

/* The shared file: PS, serving and clients read the same [tls]. */
static void write_conf(const char *path, const char *extra) {
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fprintf(f,
            "[cluster]\nps = 127.0.0.1:1\n"
            "[ps]\nlisten = 127.0.0.1:0\nthreads = 2\nmax_message_bytes = 65536\n"
            "admin_token = s3cret-token\nmetrics_listen = 127.0.0.1:0\n"
            "snapshot_interval_s = 0\n"
            "[trainer]\nslots = 1,2\ndim = 8\nhidden = 16\n"
            "[table]\nshards_log2 = 2\nfilter_bytes = 65536\nchangelog_entries = 8192\n"
            "[serving]\nlisten = 127.0.0.1:0\nthreads = 2\nsync_interval_ms = 100\n"
            "log_sample_rate = 0\n"
            "[tls]\nenabled = true\ncert_file = %s/server.pem\nkey_file = %s/server.key\n"
            "ca_file = %s/ca.pem\nclient_auth = true\n%s",
            dir, dir, dir, extra ? extra : "");
    fclose(f);
}

/* Starts @p bin --config conf --port-file portf [--set set]; stderr to @p log. */
static pid_t spawn(const char *bin, const char *conf, const char *log, const char *portf,
                   const char *set) {
    char *argv[] = {(char *)bin,   "--config", (char *)conf, "--port-file",
                    (char *)portf, NULL,       NULL,         NULL};
    if (set) {
        argv[5] = "--set";
        argv[6] = (char *)set;
    }
    return tu_procs_spawn(&procs, argv, log, "w");
}

/* SIGTERM, then the exit status (-1: killed by a signal). */
static int stop(pid_t pid) {
    int st = tu_procs_stop(&procs, pid, SIGTERM);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static mt_psc_t *client(const char *addr, int tls, int client_cert) {
    const char *a[1] = {addr};
    mt_psc_config_t cc;
    mt_psc_config_init(&cc);
    cc.addrs = a;
    cc.num_shards = 1;
    cc.deadline_ms = 5000;
    cc.rpc.retries = 0;
    if (tls) {
        cc.rpc.tls.enabled = 1;
        cc.rpc.tls.ca_file = tls_path(dir, "ca.pem");
        if (client_cert) {
            cc.rpc.tls.cert_file = tls_path(dir, "client.pem");
            cc.rpc.tls.key_file = tls_path(dir, "client.key");
        }
    }
    mt_psc_t *c = NULL;
    cr_assert_eq(mt_psc_create(&cc, &c), MT_OK);
    return c;
}

static int snapshot_call(mt_psc_t *c, const char *token) {
    Monolith__V1__SnapshotRequest r = MONOLITH__V1__SNAPSHOT_REQUEST__INIT;
    r.token = (char *)token;
    uint8_t buf[64];
    size_t len = monolith__v1__snapshot_request__pack(&r, buf);
    uint8_t *resp = NULL;
    size_t rl = 0;
    mt_rpc_status_t st;
    mt_rpc_call(mt_psc_channel(c, 0), "/monolith.v1.ParameterServer/Snapshot", buf, len, 10000,
                &resp, &rl, &st);
    free(resp);
    return st.code;
}

Test(security_e2e, ps_and_serving_over_mutual_tls) {
    char conf[128], pslog[128], psport[128], svlog[128], svport[128];
    snprintf(conf, sizeof(conf), "%s/monolith.conf", dir);
    snprintf(pslog, sizeof(pslog), "%s/ps.log", dir);
    snprintf(psport, sizeof(psport), "%s/ps.port", dir);
    snprintf(svlog, sizeof(svlog), "%s/serving.log", dir);
    snprintf(svport, sizeof(svport), "%s/serving.port", dir);
    write_conf(conf, NULL);
    pid_t ps = spawn(MT_PS_BIN, conf, pslog, psport, NULL);
    int port = tu_read_port_file(psport, 30); /* 30 s: slow under ASan */
    cr_assert_gt(port, 0, "monolith-ps did not start: see %s", pslog);
    char addr[64];
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);

    /* Mutual TLS: train a little and read it back. */
    mt_psc_t *c = client(addr, 1, 1);
    enum { B = 300 };
    uint64_t fids[B];
    float emb[B * 9], g[B * 9]; /* rows of dim 8 + the first-order weight */
    for (int i = 0; i < B; i++)
        fids[i] = MT_FID_MAKE(1, (uint64_t)i * 31 + 7);
    mt_rpc_status_t st;
    cr_assert_eq(mt_psc_lookup(c, fids, B, 1, 0, emb, B * 9, NULL, &st), MT_OK, "%s", st.message);
    for (int k = 0; k < B * 9; k++)
        g[k] = 0.25f;
    cr_assert_eq(mt_psc_apply(c, fids, B, g, B * 9, 0, 1, 0, NULL, NULL, &st), MT_OK, "%s",
                 st.message);
    uint8_t found[B];
    cr_assert_eq(mt_psc_lookup(c, fids, B, 0, 0, emb, B * 9, found, &st), MT_OK, "%s", st.message);
    for (int i = 0; i < B; i++)
        cr_assert_eq(found[i], 1);

    /* Request limit: 10,000 ids are ~80 KB, over ps.max_message_bytes = 65536. */
    enum { BIG = 10000 };
    uint64_t *big = malloc(BIG * sizeof(uint64_t));
    float *bigout = malloc(BIG * 9 * sizeof(float));
    for (int i = 0; i < BIG; i++)
        big[i] = MT_FID_MAKE(1, (uint64_t)i);
    mt_err_t e = mt_psc_lookup(c, big, BIG, 0, 0, bigout, BIG * 9, NULL, &st);
    cr_assert_neq(e, MT_OK);
    cr_assert_eq(st.code, MT_RPC_RESOURCE_EXHAUSTED, "%d %s", st.code, st.message);
    free(big);
    free(bigout);

    /* Admin token: missing or wrong -> PERMISSION_DENIED; right -> past the check (no
     * snapshot store configured: FAILED_PRECONDITION). */
    cr_assert_eq(snapshot_call(c, ""), MT_RPC_PERMISSION_DENIED);
    cr_assert_eq(snapshot_call(c, "s3cret-tokem"), MT_RPC_PERMISSION_DENIED);
    cr_assert_eq(snapshot_call(c, "s3cret-token-and-more"), MT_RPC_PERMISSION_DENIED);
    cr_assert_eq(snapshot_call(c, "s3cret-token"), MT_RPC_FAILED_PRECONDITION);
    mt_psc_destroy(c);

    /* Without TLS, or without the client certificate: no connection. */
    c = client(addr, 0, 0);
    cr_assert_eq(mt_psc_lookup(c, fids, 1, 0, 0, emb, 9, NULL, &st), MT_UNAVAILABLE);
    mt_psc_destroy(c);
    c = client(addr, 1, 0);
    cr_assert_eq(mt_psc_lookup(c, fids, 1, 0, 0, emb, 9, NULL, &st), MT_UNAVAILABLE);
    mt_psc_destroy(c);

    /* The CLI. */
    char cmd[1200], out[8192];
    snprintf(cmd, sizeof(cmd),
             "%s health --addr %s --tls-ca %s/ca.pem --tls-cert %s/client.pem "
             "--tls-key %s/client.key 2>&1",
             MT_CLI_BIN, addr, dir, dir, dir);
    cr_assert_eq(tu_run(cmd, out, sizeof(out)), 0, "%s", out);
    cr_assert(strstr(out, "\"status\":\"SERVING\""), "%s", out);
    snprintf(cmd, sizeof(cmd),
             "%s lookup --ps %s --tls-ca %s/ca.pem --tls-cert %s/client.pem "
             "--tls-key %s/client.key 1:7 2>&1",
             MT_CLI_BIN, addr, dir, dir, dir);
    cr_assert_eq(tu_run(cmd, out, sizeof(out)), 0, "%s", out);
    cr_assert(strstr(out, "\"found\":true"), "%s", out);
    snprintf(cmd, sizeof(cmd), "%s health --addr %s 2>&1", MT_CLI_BIN, addr);
    cr_assert_eq(tu_run(cmd, out, sizeof(out)), 1, "%s", out);
    cr_assert(strstr(out, "UNAVAILABLE"), "%s", out);
    snprintf(cmd, sizeof(cmd), "%s health --addr %s --tls-ca %s/nope.pem 2>&1", MT_CLI_BIN, addr,
             dir);
    cr_assert_eq(tu_run(cmd, out, sizeof(out)), 2, "%s", out);
    cr_assert(strstr(out, "tls.ca_file '") && strstr(out, "nope.pem': cannot open"), "%s", out);

    /* Serving with the same file: its PS channels use the [tls] client side. */
    char set[96];
    snprintf(set, sizeof(set), "cluster.ps=%s", addr);
    pid_t sv = spawn(MT_SERVING_BIN, conf, svlog, svport, set);
    int sport = tu_read_port_file(svport, 30);
    cr_assert_gt(sport, 0, "monolith-serving did not start: see %s", svlog);
    snprintf(cmd, sizeof(cmd),
             "%s health --addr 127.0.0.1:%d --tls-ca %s/ca.pem --tls-cert %s/client.pem "
             "--tls-key %s/client.key 2>&1",
             MT_CLI_BIN, sport, dir, dir, dir);
    int rc = tu_run(cmd, out, sizeof(out)); /* answered over TLS: SERVING or NOT_SERVING yet */
    cr_assert(strstr(out, "\"status\":\""), "rc %d: %s", rc, out);
    /* The PS sees serving's Sync streams (over mutual TLS), and exports its counters. */
    int mport = tu_metrics_port(pslog);
    cr_assert_gt(mport, 0);
    int synced = 0;
    char *body = NULL;
    for (int i = 0; i < 100 && !synced; i++) {
        free(body);
        body = tu_http_get(mport, "/metrics");
        cr_assert_not_null(body);
        const char *m = strstr(body, "monolith_ps_requests_total{shard=\"0\",method=\"Sync\"} ");
        synced = m && atoi(m + strlen("monolith_ps_requests_total{shard=\"0\",method=\"Sync\"} "));
        if (!synced) usleep(100000);
    }
    cr_assert(synced, "no Sync reached the PS: see %s", svlog);
    cr_assert(strstr(body, "monolith_ps_rejected_total{shard=\"0\"} 0\n"), "%s", body);
    cr_assert(strstr(body, "monolith_ps_queued_calls{shard=\"0\"} 0\n"), "%s", body);
    free(body);
    cr_assert_eq(stop(sv), 0, "serving exit status: see %s", svlog);
    cr_assert_eq(stop(ps), 0, "ps exit status: see %s", pslog);
}

Test(security_e2e, bad_tls_files_stop_the_daemon_with_the_path) {
    char conf[128], log[128], portf[128], cmd[600], out[4096];
    snprintf(conf, sizeof(conf), "%s/monolith.conf", dir);
    snprintf(log, sizeof(log), "%s/ps.log", dir);
    snprintf(portf, sizeof(portf), "%s/ps.port", dir);
    /* tls.enabled without a CA: a configuration error naming the key, exit 2. */
    write_conf(conf, NULL);
    snprintf(cmd, sizeof(cmd), "%s --config %s --set tls.ca_file= --check 2>&1", MT_PS_BIN, conf);
    cr_assert_eq(tu_run(cmd, out, sizeof(out)), 2, "%s", out);
    cr_assert(strstr(out, "tls.ca_file: required when tls.enabled is true"), "%s", out);
    /* A certificate file that does not exist: the daemon stops, naming it. */
    char set[200];
    snprintf(set, sizeof(set), "tls.cert_file=%s/missing.pem", dir);
    pid_t pid = spawn(MT_PS_BIN, conf, log, portf, set);
    int st = 0;
    waitpid(pid, &st, 0);
    tu_procs_forget(&procs, pid);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) != 0, "monolith-ps started without its cert");
    FILE *f = fopen(log, "r");
    cr_assert_not_null(f);
    size_t n = fread(out, 1, sizeof(out) - 1, f);
    out[n] = 0;
    fclose(f);
    cr_assert(strstr(out, "tls.cert_file '") && strstr(out, "missing.pem': cannot open"), "%s",
              out);
}

/* Regression: bad TLS files exited 1 at start-up but 2 under --check (monolith-ps,
 * monolith-serving), and monolith-trainer --check passed a missing tls.cert_file that then
 * failed the real start. Now each daemon with TLS exits 2 naming the file, both ways. */
Test(security_e2e, bad_tls_files_are_exit_2_in_every_daemon) {
    char conf[128], cmd[2048], out[8192];
    snprintf(conf, sizeof(conf), "%s/monolith.conf", dir);
    write_conf(conf, NULL);
    char missing[128], garbage[128], server_pem[128], server_key[128], client_key[128];
    snprintf(missing, sizeof(missing), "%s/missing.pem", dir);
    snprintf(garbage, sizeof(garbage), "%s/garbage.pem", dir);
    snprintf(server_pem, sizeof(server_pem), "%s/server.pem", dir);
    snprintf(server_key, sizeof(server_key), "%s/server.key", dir);
    snprintf(client_key, sizeof(client_key), "%s/client.key", dir);
    const struct {
        const char *what, *cert, *key, *named; /* named: the file the message must name */
    } bad[] = {
        {"missing cert", missing, server_key, missing},
        {"garbage cert", garbage, server_key, garbage},
        {"key of another cert", server_pem, client_key, client_key},
    };
    /* a real start must stop before it serves: `timeout` ends one that would not (124) */
    const struct {
        const char *bin, *start_args;
    } daemons[] = {
        {MT_PS_BIN, "--port-file /dev/null"},
        {MT_SERVING_BIN, "--port-file /dev/null"},
        {MT_TRAINER_BIN, "--online --duration-s 1"},
    };
    for (size_t d = 0; d < sizeof(daemons) / sizeof(daemons[0]); d++) {
        for (size_t b = 0; b < sizeof(bad) / sizeof(bad[0]); b++) {
            for (int check = 0; check < 2; check++) {
                snprintf(cmd, sizeof(cmd),
                         "timeout 20 %s --config %s --set tls.cert_file=%s --set tls.key_file=%s "
                         "%s 2>&1",
                         daemons[d].bin, conf, bad[b].cert, bad[b].key,
                         check ? "--check" : daemons[d].start_args);
                int rc = tu_run(cmd, out, sizeof(out));
                cr_assert_eq(rc, 2, "%s, %s, %s: exit %d: %s", strrchr(daemons[d].bin, '/') + 1,
                             bad[b].what, check ? "--check" : "start", rc, out);
                cr_assert(strstr(out, bad[b].named), "%s, %s, %s: the message does not name %s: %s",
                          strrchr(daemons[d].bin, '/') + 1, bad[b].what,
                          check ? "--check" : "start", bad[b].named, out);
            }
        }
    }
    /* the load generator's --tls-* flags, checked before it starts */
    for (size_t b = 0; b < sizeof(bad) / sizeof(bad[0]); b++) {
        snprintf(cmd, sizeof(cmd),
                 "timeout 20 %s --serving 127.0.0.1:1 --duration-s 1 --tls-ca %s/ca.pem "
                 "--tls-cert %s --tls-key %s 2>&1",
                 MT_LOADGEN_BIN, dir, bad[b].cert, bad[b].key);
        int rc = tu_run(cmd, out, sizeof(out));
        cr_assert_eq(rc, 2, "monolith-loadgen, %s: exit %d: %s", bad[b].what, rc, out);
        cr_assert(strstr(out, bad[b].named), "monolith-loadgen, %s: %s", bad[b].what, out);
    }
}
