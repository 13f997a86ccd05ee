/*
 * cli.h - the operators' command-line tool as a library: `monolith` is a thin main over
 * mt_cli_run() (its signals). The commands (health, stats, lookup, predict, snapshot, gen,
 * offsets, replay) and their output are described in cli/src/cli.c and the README.
 *
 * Thread safety: mt_cli_run() keeps no state between calls; one call per thread at a time
 * (it writes to stdout and stderr).
 */
#ifndef MT_CLI_H
#define MT_CLI_H

/** Runs one command line (argv[0] the program, argv[1] the command): its output on stdout
 *  (JSON lines; gen's TSV), errors on stderr. @p stop (may be NULL) ends a replay early
 *  when it reads non-zero (a signal handler's flag: what was produced is flushed, exit 1).
 *  @returns the exit status: 0 success, 1 the call or the run failed, 2 bad usage. */
int mt_cli_run(int argc, char **argv, const volatile int *stop);

#endif /* MT_CLI_H */
