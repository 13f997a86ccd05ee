/*
 * monolith-loadgen - the users of the closed loop: pages of candidates drawn from the
 * synthetic ground truth to serving, the users' clicks from the true probabilities to Kafka
 * `actions`, serving AUC over time (mt/loadgen.h has the run, loadgen/src/loadgen.c the
 * protocol). A thin main: signals and flags.
 *
 *   monolith-loadgen --serving [NAME=]ADDR|@PORTFILE [--serving ...]... [--kafka BOOTSTRAP]
 *                    [--rate REQ_PER_S] [--duration-s S] [--candidates K] [--inflight N] ...
 *                    (--help lists every flag)
 *
 * Exit status: 0 done, 1 the run failed (mt_loadgen_run()), 2 bad command line.
 */
#include <signal.h>

#include "mt/loadgen.h"

static volatile sig_atomic_t stop_flag; /* SIGINT / SIGTERM: end the run early, report */

static void on_signal(int sig) {
    (void)sig;
    stop_flag = 1;
}

int main(int argc, char **argv) {
    static mt_loadgen_opts_t o; /* large (the targets' names): not on the stack */
    if (mt_loadgen_parse_args(&o, argc, argv)) return 2;
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGPIPE, SIG_IGN);
    return mt_loadgen_run(&o, &stop_flag);
}
