/*
 * example_pb.h - monolith.v1.Example protobufs (the Kafka `examples` topic, DESIGN.md 5)
 * to and from example batches.
 *
 * Decoding appends one example to a batch whose slots are fixed (the trainer's): the
 * Example's SlotFids of a slot the batch has are copied, slots the batch does not have are
 * ignored (counted in *ignored_slots), slots the Example lacks are empty. A message is
 * refused whole (nothing appended) when it is not a valid Example, has no label, fewer labels
 * than the batch's tasks (labels past them are ignored), one of them outside [0, 1], a sample rate outside (0, 1] (0 reads as 1: proto3's unset), a fid whose
 * top 16 bits are not its SlotFids' slot, or the same slot twice.
 *
 * Thread safety: pure functions over their arguments.
 */
#ifndef MT_EXAMPLE_PB_H
#define MT_EXAMPLE_PB_H

#include <stddef.h>
#include <stdint.h>

#include "mt/batch.h"
#include "mt/err.h"

/**
 * Appends the Example in @p buf to @p b.
 * @param[out] ignored_slots  optional: SlotFids of slots @p b does not have
 * @param[out] why            optional: the reason of a refusal
 * @returns MT_OK, MT_CORRUPT (not an Example, or breaking a rule above; @p b unchanged),
 *          MT_NOMEM.
 */
mt_err_t mt_example_decode(const void *buf, size_t len, mt_batch_t *b, uint32_t *ignored_slots,
                           char *why, size_t whylen);

/**
 * Encodes example @p i of @p b as an Example with @p request_id (may be NULL).
 * @param[out] out  malloc'd bytes (caller frees), @p out_len their number
 * @returns MT_OK, MT_INVALID (i out of range), MT_NOMEM.
 */
mt_err_t mt_example_encode(const mt_batch_t *b, size_t i, const char *request_id, uint8_t **out,
                           size_t *out_len);

#endif /* MT_EXAMPLE_PB_H */
