/*
 * test_example_pb.c - monolith.v1.Example <-> batch: round trip, slots the batch lacks,
 * and every kind of refused message (the batch unchanged).
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "mt/example_pb.h"

static const uint16_t slots[3] = {1, 2, 7};

static void one(mt_batch_t *b, float label, uint32_t n1, uint32_t n2, uint32_t n7) {
    uint64_t f1[4], f2[4], f7[4];
    for (uint32_t k = 0; k < 4; k++) {
        f1[k] = mt_fid_of_int(1, 100 + k);
        f2[k] = mt_fid_of_int(2, 200 + k);
        f7[k] = mt_fid_of_int(7, 700 + k);
    }
    const uint64_t *fids[3] = {f1, f2, f7};
    uint32_t counts[3] = {n1, n2, n7};
    cr_assert_eq(mt_batch_add(b, label, 1234, 0.25f, fids, counts), MT_OK);
}

Test(example_pb, round_trip) {
    mt_batch_t a = {0}, b = {0};
    cr_assert_eq(mt_batch_init(&a, slots, 3), MT_OK);
    cr_assert_eq(mt_batch_init(&b, slots, 3), MT_OK);
    one(&a, 1, 1, 3, 0);
    one(&a, 0, 0, 0, 2);
    for (size_t i = 0; i < a.n; i++) {
        uint8_t *buf;
        size_t len;
        cr_assert_eq(mt_example_encode(&a, i, "req-1", &buf, &len), MT_OK);
        uint32_t ignored = 9;
        cr_assert_eq(mt_example_decode(buf, len, &b, &ignored, NULL, 0), MT_OK);
        cr_assert_eq(ignored, 0);
        free(buf);
    }
    cr_assert_eq(b.n, 2);
    cr_assert_eq(b.nfids, a.nfids);
    cr_assert_eq(memcmp(b.fids, a.fids, a.nfids * sizeof(uint64_t)), 0);
    cr_assert_eq(memcmp(b.offsets, a.offsets, (2 * 3 + 1) * sizeof(size_t)), 0);
    cr_assert_eq(b.labels[0], 1.0f);
    cr_assert_eq(b.labels[1], 0.0f);
    cr_assert_eq(b.timestamps_ms[1], 1234);
    cr_assert_eq(b.sample_rates[0], 0.25f);
    cr_assert_eq(mt_example_encode(&a, 2, NULL, NULL, NULL), MT_INVALID);
    mt_batch_free(&a);
    mt_batch_free(&b);
}

Test(example_pb, slots_the_batch_lacks_are_ignored_and_counted) {
    mt_batch_t a = {0}, b = {0};
    cr_assert_eq(mt_batch_init(&a, slots, 3), MT_OK);
    uint16_t two[2] = {2, 5};
    cr_assert_eq(mt_batch_init(&b, two, 2), MT_OK);
    one(&a, 1, 2, 1, 1);
    uint8_t *buf;
    size_t len;
    cr_assert_eq(mt_example_encode(&a, 0, "r", &buf, &len), MT_OK);
    uint32_t ignored = 0;
    cr_assert_eq(mt_example_decode(buf, len, &b, &ignored, NULL, 0), MT_OK);
    cr_assert_eq(ignored, 2); /* slots 1 and 7 */
    size_t cnt;
    const uint64_t *f = mt_batch_fids(&b, 0, 0, &cnt);
    cr_assert_eq(cnt, 1);
    cr_assert_eq(f[0], mt_fid_of_int(2, 200));
    mt_batch_fids(&b, 0, 1, &cnt);
    cr_assert_eq(cnt, 0);
    free(buf);
    mt_batch_free(&a);
    mt_batch_free(&b);
}

/* Hand-made protobufs: tag bytes are (field << 3) | wire type. */
Test(example_pb, bad_messages_are_refused_whole) {
    mt_batch_t b = {0};
    cr_assert_eq(mt_batch_init(&b, slots, 3), MT_OK);
    char why[256];
    /* not a protobuf */
    const char *garbage = "garbage \xff\xfe";
    cr_assert_eq(mt_example_decode(garbage, strlen(garbage), &b, NULL, why, sizeof(why)),
                 MT_CORRUPT);
    cr_assert(strstr(why, "not a monolith.v1.Example"), "%s", why);
    /* valid but empty: no label */
    cr_assert_eq(mt_example_decode("", 0, &b, NULL, why, sizeof(why)), MT_CORRUPT);
    cr_assert(strstr(why, "no label"), "%s", why);
    /* label 2: field 3 packed floats: 0x1a len 4, 2.0f = 00 00 00 40 */
    const uint8_t label2[] = {0x1a, 0x04, 0x00, 0x00, 0x00, 0x40};
    cr_assert_eq(mt_example_decode(label2, sizeof(label2), &b, NULL, why, sizeof(why)), MT_CORRUPT);
    cr_assert(strstr(why, "label"), "%s", why);
    /* label 1 and a SlotFids of slot 1 holding a fid of slot 2:
     * field 4 (0x22) len 12: slot (0x08 0x01), fids packed fixed64 (0x12 0x08 + 8 bytes) */
    uint8_t wrong[6 + 2 + 12] = {0x1a, 0x04, 0x00, 0x00, 0x80, 0x3f,
                                 0x22, 12,   0x08, 0x01, 0x12, 0x08};
    uint64_t fid = mt_fid_of_int(2, 5);
    memcpy(wrong + 12, &fid, 8); /* little-endian host */
    cr_assert_eq(mt_example_decode(wrong, sizeof(wrong), &b, NULL, why, sizeof(why)), MT_CORRUPT);
    cr_assert(strstr(why, "not of its slot"), "%s", why);
    /* sample_rate 2 (field 5, 0x2d, fixed32) */
    const uint8_t rate2[] = {0x1a, 0x04, 0x00, 0x00, 0x80, 0x3f, 0x2d, 0x00, 0x00, 0x00, 0x40};
    cr_assert_eq(mt_example_decode(rate2, sizeof(rate2), &b, NULL, why, sizeof(why)), MT_CORRUPT);
    cr_assert(strstr(why, "sample_rate"), "%s", why);
    cr_assert_eq(b.n, 0);
    cr_assert_eq(b.nfids, 0);
    /* and a good one still goes in afterwards */
    const uint8_t good[] = {0x1a, 0x04, 0x00, 0x00, 0x80, 0x3f};
    cr_assert_eq(mt_example_decode(good, sizeof(good), &b, NULL, why, sizeof(why)), MT_OK);
    cr_assert_eq(b.n, 1);
    cr_assert_eq(b.sample_rates[0], 1.0f);
    mt_batch_free(&b);
}

/* A multi-task batch: every task's label goes out and comes back in order; an Example with
 * fewer labels than the batch's tasks, or one of them outside [0, 1], is refused (the batch
 * unchanged); a one-task batch takes the first of several. */
Test(example_pb, task_labels) {
    mt_batch_t a = {0}, b = {0}, one_task = {0};
    cr_assert_eq(mt_batch_init(&a, slots, 3), MT_OK);
    cr_assert_eq(mt_batch_set_tasks(&a, 2), MT_OK);
    cr_assert_eq(mt_batch_init(&b, slots, 3), MT_OK);
    cr_assert_eq(mt_batch_set_tasks(&b, 2), MT_OK);
    cr_assert_eq(mt_batch_init(&one_task, slots, 3), MT_OK);
    uint64_t f1 = mt_fid_of_int(1, 1);
    const uint64_t *fids[3] = {&f1, NULL, NULL};
    uint32_t counts[3] = {1, 0, 0};
    const float l[2] = {1.0f, 0.0f}, l2[2] = {0.0f, 1.0f};
    cr_assert_eq(mt_batch_add_labels(&a, l, 5, 1, fids, counts), MT_OK);
    cr_assert_eq(mt_batch_add_labels(&a, l2, 6, 1, fids, counts), MT_OK);
    for (size_t i = 0; i < a.n; i++) {
        uint8_t *buf;
        size_t len;
        cr_assert_eq(mt_example_encode(&a, i, "r", &buf, &len), MT_OK);
        cr_assert_eq(mt_example_decode(buf, len, &b, NULL, NULL, 0), MT_OK);
        cr_assert_eq(mt_example_decode(buf, len, &one_task, NULL, NULL, 0), MT_OK);
        free(buf);
    }
    cr_assert_eq(memcmp(b.labels, a.labels, 4 * sizeof(float)), 0);
    cr_assert(one_task.labels[0] == 1.0f && one_task.labels[1] == 0.0f);
    /* one label for two tasks, then a second label out of range */
    uint8_t *buf;
    size_t len;
    char why[128];
    cr_assert_eq(mt_example_encode(&one_task, 0, "r", &buf, &len), MT_OK);
    cr_assert_eq(mt_example_decode(buf, len, &b, NULL, why, sizeof(why)), MT_CORRUPT);
    cr_expect_str_eq(why, "1 label, the model has 2 tasks");
    free(buf);
    a.labels[1] = 2.0f;
    cr_assert_eq(mt_example_encode(&a, 0, "r", &buf, &len), MT_OK);
    cr_assert_eq(mt_example_decode(buf, len, &b, NULL, why, sizeof(why)), MT_CORRUPT);
    cr_expect_str_eq(why, "label 1: 2 outside [0, 1]");
    free(buf);
    cr_assert_eq(b.n, 2);
    mt_batch_free(&a);
    mt_batch_free(&b);
    mt_batch_free(&one_task);
}
