/*
 * test_kafka_dev.c - monolith-kafka-dev as a process, with kcat as an independent client:
 *   - it prints the bootstrap on stdout and writes the same line to --bootstrap-file;
 *   - lines produced by `kcat -P` are read by our consumer group, and messages from our
 *     producer are read back by `kcat -C -e`;
 *   - SIGTERM ends it with status 0 (and removes the bootstrap file); --help exits 0;
 *   - bad flags exit 2 with a message.
 * kcat missing fails the test with a message: the point is an independent client.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "mt/kafka.h"

#if !defined(MT_KAFKA_DEV_BIN) || !defined(MT_KCAT_BIN)
#error "MT_KAFKA_DEV_BIN and MT_KCAT_BIN must be defined"
#endif

static char root[128];
static pid_t daemon_pid = -1; /* killed by the fini hook if a test aborts */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void setup_root(void) {
    snprintf(root, sizeof(root), "/tmp/mt-kafka-dev-XXXXXX");
    cr_assert_not_null(mkdtemp(root));
}

static void cleanup(void) {
    if (daemon_pid > 0) {
        kill(daemon_pid, SIGKILL);
        waitpid(daemon_pid, NULL, 0);
        daemon_pid = -1;
    }
    if (*root) {
        char cmd[300];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
        int rc = system(cmd);
        (void)rc;
    }
}

static void require_kcat(void) {
    cr_assert(MT_KCAT_BIN[0] && access(MT_KCAT_BIN, X_OK) == 0,
              "kcat not found (it was '%s' at configure time): install the Debian package "
              "kcat (scripts/setup.sh does) and re-run cmake; this test needs an independent "
              "Kafka client",
              MT_KCAT_BIN);
}

/* Runs argv (stdout to out_path if not NULL, stdin from in_path if not NULL, stderr
 * inherited); returns the wait status. */
static int run(char *const argv[], const char *in_path, const char *out_path) {
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (in_path && !freopen(in_path, "r", stdin)) _exit(126);
        if (out_path && !freopen(out_path, "w", stdout)) _exit(126);
        execv(argv[0], argv);
        _exit(127);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    return st;
}

/* Reads the first line of path into buf (without the newline); 0 if present. */
static int read_line(const char *path, char *buf, size_t cap) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    int ok = fgets(buf, (int)cap, f) != NULL;
    fclose(f);
    if (!ok) return -1;
    buf[strcspn(buf, "\n")] = '\0';
    return 0;
}

/* Starts the daemon; fills bootstrap from --bootstrap-file and checks stdout says the same. */
static void start_daemon(char *bootstrap, size_t cap) {
    char bsf[256], outf[256];
    snprintf(bsf, sizeof(bsf), "%s/bootstrap", root);
    snprintf(outf, sizeof(outf), "%s/stdout", root);
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (!freopen(outf, "w", stdout)) _exit(126);
        execl(MT_KAFKA_DEV_BIN, MT_KAFKA_DEV_BIN, "--brokers", "2", "--topics",
              "features:4,actions:3", "--bootstrap-file", bsf, (char *)NULL);
        _exit(127);
    }
    daemon_pid = pid;
    double deadline = now_s() + 20;
    while (read_line(bsf, bootstrap, cap) != 0) {
        cr_assert_eq(waitpid(pid, NULL, WNOHANG), 0, "monolith-kafka-dev exited early");
        cr_assert_lt(now_s(), deadline, "no bootstrap file after 20 s");
        usleep(20000);
    }
    char printed[512] = "";
    for (int i = 0; i < 100 && read_line(outf, printed, sizeof(printed)) != 0; i++)
        usleep(20000);
    cr_assert_str_eq(printed, bootstrap, "stdout and the bootstrap file differ");
    cr_assert_eq(strncmp(bootstrap, "127.0.0.1:", 10), 0, "%s", bootstrap);
    cr_assert_not_null(strchr(bootstrap, ','), "two brokers expected: %s", bootstrap);
}

enum { NK = 200, NP = 150 };

Test(kafka_dev, kcat_and_our_clients_interoperate, .timeout = 120, .fini = cleanup) {
    require_kcat();
    setup_root();
    char bs[512], err[512];
    start_daemon(bs, sizeof(bs));

    /* kcat -P: one message per line into "features". */
    char inf[256];
    snprintf(inf, sizeof(inf), "%s/lines", root);
    FILE *f = fopen(inf, "w");
    cr_assert_not_null(f);
    for (int i = 0; i < NK; i++)
        fprintf(f, "kcat-line-%d\n", i);
    fclose(f);
    char *pargv[] = {MT_KCAT_BIN, "-b", bs, "-P", "-t", "features", NULL};
    int st = run(pargv, inf, NULL);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "kcat -P failed (status %d)", st);

    /* Our consumer group reads them all. */
    const char *topics[] = {"features"}, *conf[] = {"session.timeout.ms=6000", NULL};
    mt_kafka_consumer_t *c;
    cr_assert_eq(mt_kafka_consumer_create(bs, "e2e", topics, 1, conf, &c, err, sizeof(err)), MT_OK,
                 "%s", err);
    static uint8_t seen[NK];
    memset(seen, 0, sizeof(seen));
    int distinct = 0;
    mt_kafka_msg_t msgs[64];
    double deadline = now_s() + 30;
    while (distinct < NK && now_s() < deadline) {
        size_t n = mt_kafka_consumer_poll(c, msgs, 64, 200);
        for (size_t k = 0; k < n; k++) {
            char line[64];
            cr_assert_lt(msgs[k].len, sizeof(line));
            memcpy(line, msgs[k].value, msgs[k].len);
            line[msgs[k].len] = '\0';
            int i = -1;
            cr_assert_eq(sscanf(line, "kcat-line-%d", &i), 1, "unexpected message '%s'", line);
            cr_assert(i >= 0 && i < NK);
            if (!seen[i]) {
                seen[i] = 1;
                distinct++;
            }
            mt_kafka_consumer_mark(c, &msgs[k]);
        }
    }
    cr_assert_eq(distinct, NK, "our consumer read %d of kcat's %d lines", distinct, NK);
    cr_assert_eq(mt_kafka_consumer_commit(c), MT_OK);
    mt_kafka_consumer_destroy(c);

    /* Our producer into "actions", read back by kcat -C -e (every partition, then exit). */
    mt_kafka_producer_t *p;
    cr_assert_eq(mt_kafka_producer_create(bs, NULL, &p, err, sizeof(err)), MT_OK, "%s", err);
    for (int i = 0; i < NP; i++) {
        char key[16], val[32];
        int kl = snprintf(key, sizeof(key), "u%d", i % 17);
        int vl = snprintf(val, sizeof(val), "ours-%d", i);
        cr_assert_eq(mt_kafka_produce(p, "actions", -1, key, (size_t)kl, val, (size_t)vl, 5000),
                     MT_OK);
    }
    cr_assert_eq(mt_kafka_producer_flush(p, 20000), MT_OK);
    mt_kafka_producer_destroy(p);
    char outf[256];
    snprintf(outf, sizeof(outf), "%s/kcat.out", root);
    char *cargv[] = {MT_KCAT_BIN, "-b", bs,   "-C",       "-t", "actions",
                     "-e",        "-q", "-f", "%k %s\\n", NULL};
    st = run(cargv, "/dev/null", outf);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "kcat -C failed (status %d)", st);
    f = fopen(outf, "r");
    cr_assert_not_null(f);
    static uint8_t back[NP];
    memset(back, 0, sizeof(back));
    int lines = 0;
    char line[128];
    while (fgets(line, sizeof(line), f)) {
        int u = -1, i = -1;
        cr_assert_eq(sscanf(line, "u%d ours-%d", &u, &i), 2, "unexpected kcat line '%s'", line);
        cr_assert(i >= 0 && i < NP && u == i % 17, "%s", line);
        cr_assert_eq(back[i], 0, "message %d twice", i);
        back[i] = 1;
        lines++;
    }
    fclose(f);
    cr_assert_eq(lines, NP, "kcat read %d of our %d messages", lines, NP);

    /* SIGTERM: exit 0, bootstrap file gone. */
    kill(daemon_pid, SIGTERM);
    st = 0;
    waitpid(daemon_pid, &st, 0);
    daemon_pid = -1;
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %d after SIGTERM", st);
    char bsf[256];
    snprintf(bsf, sizeof(bsf), "%s/bootstrap", root);
    cr_assert_neq(access(bsf, F_OK), 0, "the bootstrap file is still there");
}

static int status_of(char *const argv[]) {
    char outf[256];
    snprintf(outf, sizeof(outf), "%s/out", root);
    int st = run(argv, "/dev/null", outf);
    cr_assert(WIFEXITED(st), "killed by a signal (status %d)", st);
    return WEXITSTATUS(st);
}

Test(kafka_dev, bad_flags_exit_2_and_help_exits_0, .timeout = 60, .fini = cleanup) {
    setup_root();
    char *b = MT_KAFKA_DEV_BIN;
    char *bogus[] = {b, "--bogus", NULL}, *nov[] = {b, "--brokers", NULL},
         *zero[] = {b, "--brokers", "0", NULL}, *nan[] = {b, "--brokers", "x", NULL},
         *nparts[] = {b, "--topics", "a:0", NULL}, *noparts[] = {b, "--topics", "a", NULL},
         *badname[] = {b, "--topics", "a b:2", NULL}, *dup[] = {b, "--topics", "a:1,a:2", NULL},
         *lvl[] = {b, "--log-level", "loud", NULL}, *help[] = {b, "--help", NULL};
    cr_assert_eq(status_of(bogus), 2);
    cr_assert_eq(status_of(nov), 2);
    cr_assert_eq(status_of(zero), 2);
    cr_assert_eq(status_of(nan), 2);
    cr_assert_eq(status_of(nparts), 2);
    cr_assert_eq(status_of(noparts), 2);
    cr_assert_eq(status_of(badname), 2);
    cr_assert_eq(status_of(dup), 2);
    cr_assert_eq(status_of(lvl), 2);
    cr_assert_eq(status_of(help), 0);
    char outf[256], usage[256] = "";
    snprintf(outf, sizeof(outf), "%s/out", root);
    cr_assert_eq(read_line(outf, usage, sizeof(usage)), 0);
    cr_assert(strstr(usage, "usage: monolith-kafka-dev"), "%s", usage);
}
