/*
 * config_rpc.h - the [tls] section as the rpc layer's TLS settings.
 *
 * Header-only, so that mt_config does not link gRPC: include it where both mt/config.h and
 * mt/rpc.h are available (the daemons and tools that serve or dial gRPC).
 *
 * Thread safety: reads @p c only (and, mt_config_rpc_check_tls(), the files it names).
 */
#ifndef MT_CONFIG_RPC_H
#define MT_CONFIG_RPC_H

#include "mt/config.h"
#include "mt/rpc.h"

/**
 * Fills @p out from c->tls. The paths are borrowed from @p c: valid until it is changed or
 * freed (the rpc create functions read the files and keep no path).
 */
static inline void mt_config_rpc_tls(const mt_config_t *c, mt_rpc_tls_config_t *out) {
    out->enabled = c->tls.enabled;
    out->cert_file = c->tls.cert_file;
    out->key_file = c->tls.key_file;
    out->ca_file = c->tls.ca_file;
    out->client_auth = c->tls.client_auth;
    out->server_name = c->tls.server_name;
}

/**
 * Checks the files of c->tls as the daemon's gRPC server (@p server = 1: a certificate and
 * its key are required) or only its clients (@p server = 0) will read them, with the checks
 * the rpc create functions make (mt_rpc_tls_check()). The one rule of every daemon: call it
 * with mt_config_validate(), before --check answers and before anything starts, so that a
 * missing, unreadable or invalid TLS file is a configuration error (exit 2) under --check
 * and at start-up alike. Nothing to check when tls.enabled is false.
 * @param[out] errbuf  the message, naming the key and the file
 * @returns MT_OK, or what mt_rpc_tls_check() returns (MT_CONFIG, MT_IO: a file cannot be
 *          read, MT_NOMEM).
 */
static inline mt_err_t mt_config_rpc_check_tls(const mt_config_t *c, int server, char *errbuf,
                                               size_t errlen) {
    mt_rpc_tls_config_t tls;
    mt_config_rpc_tls(c, &tls);
    return mt_rpc_tls_check(&tls, server, errbuf, errlen);
}

#endif /* MT_CONFIG_RPC_H */
