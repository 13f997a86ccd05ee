/* fuzz_example.c - Kafka `examples` values: mt_example_decode() into a 3-slot batch, and
 * mt_example_encode() of what was decoded (round trip must succeed). */
#include <stdio.h>

#include "fuzz_common.h"
#include "mt/example_pb.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const uint16_t slots[] = {1, 2, 7};
    mt_batch_t b;
    if (mt_batch_init(&b, slots, 3) != MT_OK) return 0;
    uint32_t ignored = 0;
    char why[128];
    /* A batch without any fid once made mt_batch_fids() compute NULL + 0 here (found by this
     * target; reproducer: fuzz/regressions/example/null-fids-encode). */
    if (mt_example_decode(data, size, &b, &ignored, why, sizeof(why)) == MT_OK) {
        uint8_t *out = NULL;
        size_t len = 0;
        mt_err_t err = mt_example_encode(&b, 0, "r", &out, &len);
        if (err != MT_OK && err != MT_NOMEM) {
            fprintf(stderr, "encode of a decoded example failed: %d\n", (int)err);
            abort();
        }
        free(out);
    }
    mt_batch_free(&b);
    return 0;
}
