/*
 * config_cli.h - the command line every daemon shares, and its configuration loading.
 *
 * Every daemon reads one INI file and takes the same options for it:
 *   --config FILE                 required: the configuration file (docs/config.md)
 *   --set section.key=value       repeated: overrides, applied after the file, in order
 *   --log-level debug|info|warn|error
 *   --check                       the daemon checks its configuration and exits
 *   --config-reference            prints the reference of every key and exits 0
 *   --help, -h                    prints the daemon's usage and exits 0
 * and options of its own (mt_config_cli_opt_t): flags, options with a value, and shorthands
 * of --set (e.g. monolith-ps --listen ADDR is --set ps.listen=ADDR, applied in its place
 * among the --set options).
 *
 * Errors are printed on stderr prefixed with the program's name, the usage after a usage
 * error; the caller exits 2 (a usage or configuration error, as every daemon documents).
 *
 * Thread safety: call it from main() before any thread starts (it may set the log level).
 */
#ifndef MT_CONFIG_CLI_H
#define MT_CONFIG_CLI_H

#include <stddef.h>
#include <stdio.h>

#include "mt/config.h"

/** A daemon's own option. Exactly one of @p flag and @p value / @p key is used. */
typedef struct mt_config_cli_opt {
    const char *name;   /* e.g. "--train" */
    int *flag;          /* a flag (no value): set to 1 when given */
    const char **value; /* an option with a value: receives it (the last one given); may be
                           NULL for a pure shorthand */
    const char *key;    /* with a value: a shorthand of --set KEY=VALUE, or NULL */
} mt_config_cli_opt_t;

/** What mt_config_cli() is given and found. */
typedef struct mt_config_cli {
    /* in */
    const char *prog;       /* e.g. "monolith-ps": the messages' prefix */
    void (*usage)(FILE *f); /* prints the daemon's usage */
    const mt_config_cli_opt_t *opts;
    size_t nopts;
    /* out */
    const char *config; /* the --config path (argv's string) */
    int check;          /* --check was given */
} mt_config_cli_t;

/** mt_config_cli()'s outcomes: go on, or the exit status the daemon ends with. */
enum { MT_CONFIG_CLI_OK = -1, MT_CONFIG_CLI_EXIT = 0, MT_CONFIG_CLI_ERROR = 2 };

/**
 * Parses @p argv, loads --config into @p cfg (initialized by the caller with
 * mt_config_init()) and applies the --set options and shorthands in command-line order.
 * Validation (mt_config_validate) is left to the caller: daemons derive slots first.
 * @returns MT_CONFIG_CLI_OK (-1): go on; otherwise the daemon's exit status:
 *          MT_CONFIG_CLI_EXIT (0) once --help or --config-reference was answered,
 *          MT_CONFIG_CLI_ERROR (2) once an error was printed.
 */
int mt_config_cli(mt_config_cli_t *cli, mt_config_t *cfg, int argc, char **argv);

#endif /* MT_CONFIG_CLI_H */
