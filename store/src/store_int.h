/*
 * store_int.h - test hooks of the store (tests/unit/store/ includes this header).
 *
 * They let a test stop a save in the middle, the way a crash or a failing disk would: at
 * each chunk added to the SST file being written (nothing is in the database yet), and once
 * after that file was ingested (the data is in the database, durable, without a commit
 * record). A hook may also kill the process there to test recovery.
 */
#ifndef MT_STORE_INT_H
#define MT_STORE_INT_H

#include <stdint.h>

#include "mt/store.h"

typedef enum mt__store_hook_phase {
    MT__STORE_HOOK_CHUNK = 0,   /* a chunk was added to the SST file */
    MT__STORE_HOOK_INGESTED = 1 /* the SST file is in the database; the commit comes next */
} mt__store_hook_phase_t;

/** Called with the phase and the number of chunks this save has produced so far. A
 *  non-MT_OK return aborts the save with that error (as a failing write would). */
typedef mt_err_t (*mt__store_hook_fn)(void *ud, mt__store_hook_phase_t phase, uint64_t chunks);

/** Sets (or with NULL clears) the hook. Not thread-safe: call between saves. */
void mt__store_set_hook(mt_store_t *s, mt__store_hook_fn fn, void *ud);

#endif /* MT_STORE_INT_H */
