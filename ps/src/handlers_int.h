/*
 * handlers_int.h - the rpc layer of the ps module (handlers.c), as the service's lifecycle
 * (ps.c) uses it: the part of a service that the methods keep (their registration and
 * latency histograms). mt_ps_register() and mt_ps_render_metrics() (mt/ps.h) are its
 * public entry points.
 *
 * Layer: the top of the module's calls; it uses ckpt_int.h, shard_int.h and dense_int.h.
 */
#ifndef MT_PS_HANDLERS_INT_H
#define MT_PS_HANDLERS_INT_H

#include "shard_int.h"

/** @param[out] out  caller frees with mt__ps_rpc_destroy(). @returns MT_OK or MT_NOMEM. */
mt_err_t mt__ps_rpc_create(mt__ps_rpc_t **out);
/** NULL: no-op. */
void mt__ps_rpc_destroy(mt__ps_rpc_t *rpc);

#endif /* MT_PS_HANDLERS_INT_H */
