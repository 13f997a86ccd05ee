/*
 * monolith - the operators' command-line tool: a thin main over mt/cli.h (the commands are
 * in cli/src/cli.c). `monolith` alone prints the usage.
 *
 * Exit status: 0 success, 1 the call failed (the gRPC status and message on stderr), 2 bad
 * usage.
 */
#include <signal.h>
#include <string.h>

#include "mt/cli.h"

static volatile int stop_flag; /* replay: SIGINT / SIGTERM stop it, flush, exit 1 */

static void on_signal(int sig) {
    (void)sig;
    stop_flag = 1;
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "replay")) { /* the other commands die of a signal */
        struct sigaction sa;
        memset(&sa, 0, sizeof(sa));
        sa.sa_handler = on_signal;
        sigaction(SIGINT, &sa, NULL);
        sigaction(SIGTERM, &sa, NULL);
    }
    return mt_cli_run(argc, argv, &stop_flag);
}
