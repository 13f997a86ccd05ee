/*
 * config_rpc.h - the [tls] section as the rpc layer's TLS settings.
 *
 * Header-only, so that mt_config does not link gRPC: include it where both mt/config.h and
 * mt/rpc.h are available (the daemons and tools that serve or dial gRPC).
 *
 * Thread safety: reads @p c only.
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

#endif /* MT_CONFIG_RPC_H */
