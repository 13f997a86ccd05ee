/* cli.c - what the daemons share when they start: their command line (mt/config_cli.h)
 * and the Kafka bootstrap servers (mt_config_kafka_bootstrap in mt/config.h). */
#include <errno.h>
#include <string.h>

#include "mt/config_cli.h"
#include "mt/log.h"

static const mt_config_cli_opt_t *find(const mt_config_cli_t *cli, const char *a) {
    for (size_t i = 0; i < cli->nopts; i++)
        if (!strcmp(cli->opts[i].name, a)) return &cli->opts[i];
    return NULL;
}

/* 1 if @p a is an option (shared or the daemon's) that takes a value. */
static int takes_value(const mt_config_cli_t *cli, const char *a) {
    const mt_config_cli_opt_t *o = find(cli, a);
    if (o) return o->flag == NULL;
    return !strcmp(a, "--config") || !strcmp(a, "--set") || !strcmp(a, "--log-level");
}

static int usage_error(const mt_config_cli_t *cli) {
    if (cli->usage) cli->usage(stderr);
    return MT_CONFIG_CLI_ERROR;
}

int mt_config_cli(mt_config_cli_t *cli, mt_config_t *cfg, int argc, char **argv) {
    const char *prog = cli->prog;
    cli->config = NULL;
    cli->check = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            if (cli->usage) cli->usage(stdout);
            return MT_CONFIG_CLI_EXIT;
        }
        if (!strcmp(a, "--config-reference")) {
            return mt_config_write_reference(stdout) == MT_OK ? MT_CONFIG_CLI_EXIT
                                                              : MT_CONFIG_CLI_ERROR;
        }
        if (!strcmp(a, "--check")) {
            cli->check = 1;
            continue;
        }
        const mt_config_cli_opt_t *o = find(cli, a);
        if (o && o->flag) {
            *o->flag = 1;
            continue;
        }
        if (!takes_value(cli, a)) {
            fprintf(stderr, "%s: unknown option %s\n", prog, a);
            return usage_error(cli);
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "%s: %s needs a value\n", prog, a);
            return usage_error(cli);
        }
        const char *v = argv[++i];
        if (!strcmp(a, "--config")) {
            cli->config = v;
        } else if (!strcmp(a, "--log-level")) {
            mt_log_level_t lv;
            if (mt_log_parse_level(v, &lv) != 0) {
                fprintf(stderr, "%s: --log-level: '%s' is not debug, info, warn, error\n", prog, v);
                return MT_CONFIG_CLI_ERROR;
            }
            mt_log_set_level(lv);
        } else if (o && o->value) {
            *o->value = v;
        }
    }
    if (!cli->config) {
        fprintf(stderr, "%s: --config FILE is required\n", prog);
        return usage_error(cli);
    }
    char err[1024] = "";
    if (mt_config_load_file(cfg, cli->config, err, sizeof(err)) != MT_OK) {
        fprintf(stderr, "%s: %s\n", prog, err);
        return MT_CONFIG_CLI_ERROR;
    }
    /* The overrides, after the file, in command-line order (every value was checked above). */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!takes_value(cli, a)) continue;
        const char *v = argv[++i];
        const mt_config_cli_opt_t *o = find(cli, a);
        mt_err_t e = MT_OK;
        if (!strcmp(a, "--set"))
            e = mt_config_set_arg(cfg, v, err, sizeof(err));
        else if (o && o->key)
            e = mt_config_set(cfg, o->key, v, err, sizeof(err));
        if (e != MT_OK) {
            fprintf(stderr, "%s: %s %s: %s\n", prog, a, v, err);
            return MT_CONFIG_CLI_ERROR;
        }
    }
    return MT_CONFIG_CLI_OK;
}

mt_err_t mt_config_kafka_bootstrap(const mt_config_t *c, char *out, size_t len, char *errbuf,
                                   size_t errlen) {
    if (!len) return MT_TOO_SMALL;
    if (*c->kafka.bootstrap) {
        if ((size_t)snprintf(out, len, "%s", c->kafka.bootstrap) < len) return MT_OK;
        mt_msgf(errbuf, errlen, "kafka.bootstrap: %zu bytes, more than the %zu this reads",
                strlen(c->kafka.bootstrap), len - 1);
        return MT_TOO_SMALL;
    }
    FILE *f = fopen(c->kafka.bootstrap_file, "r");
    if (!f || !fgets(out, (int)len, f)) {
        int failed = !f || ferror(f);
        mt_msgf(errbuf, errlen, "kafka.bootstrap is empty and %s cannot be read: %s",
                c->kafka.bootstrap_file, failed ? strerror(errno) : "empty");
        if (f) fclose(f);
        out[0] = '\0';
        return MT_IO;
    }
    int cut = !strpbrk(out, "\r\n") && fgetc(f) != EOF; /* the line goes on past out */
    fclose(f);
    if (cut) {
        mt_msgf(errbuf, errlen, "%s: its first line is longer than %zu bytes",
                c->kafka.bootstrap_file, len - 1);
        out[0] = '\0';
        return MT_TOO_SMALL;
    }
    out[strcspn(out, "\r\n")] = '\0';
    if (!out[0]) {
        if (errbuf && errlen)
            snprintf(errbuf, errlen, "kafka.bootstrap is empty and %s holds no servers",
                     c->kafka.bootstrap_file);
        return MT_IO;
    }
    return MT_OK;
}
