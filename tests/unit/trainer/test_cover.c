/*
 * test_cover.c - the Kafka ranges of a trainer's steps (mt/cover.h): starts at the lowest
 * mark, at the log start when a shard has none (marked first), cuts at every shard's mark,
 * one partition per step during a catch-up, mixed partitions after it, duplicates and
 * foreign partitions dropped, retention past a mark refused.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "mt/cover.h"

static const char *T = "examples";

/* Adds offsets [lo, hi) of partition p; @returns the first outcome that is not ADDED (or
 * ADDED), with *at the offset it happened at. */
static int add_run(mt_cover_t *c, int32_t p, int64_t lo, int64_t hi, int64_t *at) {
    for (int64_t o = lo; o < hi; o++) {
        int r = mt_cover_add(c, T, p, o);
        if (r != MT_COVER_ADDED) {
            *at = o;
            return r;
        }
    }
    *at = hi;
    return MT_COVER_ADDED;
}

static void expect_ranges(mt_cover_t *c, size_t n, const mt_psc_range_t *want) {
    const mt_psc_range_t *r;
    cr_assert_eq(mt_cover_ranges(c, &r), n);
    for (size_t i = 0; i < n; i++) {
        cr_assert_eq(r[i].partition, want[i].partition, "range %zu", i);
        cr_assert_eq(r[i].lo, want[i].lo, "range %zu: lo %lld", i, (long long)r[i].lo);
        cr_assert_eq(r[i].hi, want[i].hi, "range %zu: hi %lld", i, (long long)r[i].hi);
        cr_assert_eq(r[i].first, want[i].first, "range %zu: first", i);
        cr_assert_str_eq(r[i].topic, T);
    }
}

Test(cover, catch_up_cuts_at_each_mark_then_steps_mix_partitions) {
    mt_cover_t *c;
    cr_assert_eq(mt_cover_create(&c), MT_OK);
    /* shard 0 at 100 (p0) and 40 (p1); shard 1 at 60 (p0), none of p1; dense at 100, 40 */
    mt_psc_offset_t s0[2] = {{"examples", 0, 100}, {"examples", 1, 40}};
    mt_psc_offset_t s1[1] = {{"examples", 0, 60}};
    mt_psc_offset_t d0[2] = {{"examples", 0, 100}, {"examples", 1, 40}};
    mt_cover_marks_t lists[3] = {{s0, 2}, {s1, 1}, {d0, 2}};
    mt_cover_pos_t owned[2] = {{T, 0, 0}, {T, 1, 10}}, starts[2];
    char eb[256] = "";
    cr_assert_eq(mt_cover_reset(c, owned, 2, lists, 3, starts, eb, sizeof(eb)), MT_OK, "%s", eb);
    cr_assert_eq(starts[0].offset, 60, "the lowest mark");
    cr_assert_eq(starts[1].offset, 10, "a shard without a mark: from the log start");
    cr_assert(mt_cover_catching_up(c));
    int64_t at;
    /* p0: [60, 100) is one step (cut at 100); another partition closes it (catch-up) */
    cr_assert_eq(add_run(c, 0, 60, 80, &at), MT_COVER_ADDED);
    cr_assert_eq(mt_cover_add(c, T, 1, 10), MT_COVER_CLOSE, "one partition per catch-up step");
    cr_assert_eq(add_run(c, 0, 80, 120, &at), MT_COVER_CLOSE);
    cr_assert_eq(at, 100, "closed at the cut");
    expect_ranges(c, 1, (mt_psc_range_t[]){{T, 0, 60, 100, 0}});
    mt_cover_commit(c);
    /* p1 from its log start, marked first, up to the cut at 40 */
    cr_assert_eq(add_run(c, 1, 10, 50, &at), MT_COVER_CLOSE);
    cr_assert_eq(at, 40);
    expect_ranges(c, 1, (mt_psc_range_t[]){{T, 1, 10, 40, 1}});
    mt_cover_commit(c);
    cr_assert_not(mt_cover_catching_up(c), "every cut passed");
    /* no cuts left: partitions mix; duplicates and foreign partitions are dropped */
    cr_assert_eq(add_run(c, 0, 100, 110, &at), MT_COVER_ADDED);
    cr_assert_eq(mt_cover_add(c, T, 0, 105), MT_COVER_NOT_OWNED, "delivered twice");
    cr_assert_eq(mt_cover_add(c, T, 0, 99), MT_COVER_NOT_OWNED, "below next");
    cr_assert_eq(mt_cover_add(c, T, 7, 0), MT_COVER_NOT_OWNED, "not owned");
    cr_assert_eq(mt_cover_add(c, "other", 0, 100), MT_COVER_NOT_OWNED);
    cr_assert_eq(add_run(c, 1, 40, 45, &at), MT_COVER_ADDED);
    expect_ranges(c, 2, (mt_psc_range_t[]){{T, 0, 100, 110, 0}, {T, 1, 40, 45, 0}});
    /* an abort drops the step: the same messages build it again */
    mt_cover_abort(c);
    const mt_psc_range_t *r;
    cr_assert_eq(mt_cover_ranges(c, &r), 0);
    cr_assert_eq(add_run(c, 1, 40, 45, &at), MT_COVER_ADDED);
    expect_ranges(c, 1, (mt_psc_range_t[]){{T, 1, 40, 45, 0}});
    mt_cover_commit(c);
    cr_assert_eq(mt_cover_add(c, T, 1, 45), MT_COVER_ADDED);
    /* an idle trainer's check: p0 is at 100 (its step was aborted), p1 at 46 */
    mt_cover_commit(c);
    mt_psc_offset_t now0[2] = {{"examples", 0, 100}, {"examples", 1, 46}};
    mt_psc_offset_t back[2] = {{"examples", 0, 90}, {"examples", 1, 46}};
    mt_psc_offset_t lost[1] = {{"examples", 1, 46}};
    mt_cover_marks_t ok[1] = {{now0, 2}}, behind[2] = {{now0, 2}, {back, 2}}, gone[1] = {{lost, 1}};
    cr_assert_not(mt_cover_behind(c, ok, 1));
    cr_assert(mt_cover_behind(c, behind, 2), "a shard back at 90");
    cr_assert(mt_cover_behind(c, gone, 1), "a shard with no mark of p0");
    mt_cover_destroy(c);
}

Test(cover, a_message_past_the_next_offset_is_a_gap_never_a_range) {
    mt_cover_t *c;
    cr_assert_eq(mt_cover_create(&c), MT_OK);
    mt_psc_offset_t s0[1] = {{"examples", 0, 50}}, s1[1] = {{"examples", 0, 20}};
    mt_cover_marks_t lists[2] = {{s0, 1}, {s1, 1}};
    mt_cover_pos_t owned[1] = {{T, 0, 0}}, starts[1];
    cr_assert_eq(mt_cover_reset(c, owned, 1, lists, 2, starts, NULL, 0), MT_OK);
    cr_assert_eq(starts[0].offset, 20);
    /* the consumer jumped (offsets 20..54 never delivered): not covered */
    cr_assert_eq(mt_cover_add(c, T, 0, 55), MT_COVER_GAP);
    const mt_psc_range_t *r;
    cr_assert_eq(mt_cover_ranges(c, &r), 0);
    int64_t at;
    cr_assert_eq(add_run(c, 0, 20, 30, &at), MT_COVER_ADDED);
    cr_assert_eq(mt_cover_add(c, T, 0, 31), MT_COVER_GAP, "a hole inside the step too");
    expect_ranges(c, 1, (mt_psc_range_t[]){{T, 0, 20, 30, 0}});
    mt_cover_destroy(c);
}

Test(cover, retention_past_a_mark_is_refused_with_both_offsets) {
    mt_cover_t *c;
    cr_assert_eq(mt_cover_create(&c), MT_OK);
    mt_psc_offset_t s0[1] = {{"examples", 3, 500}};
    mt_cover_marks_t lists[1] = {{s0, 1}};
    mt_cover_pos_t owned[1] = {{T, 3, 800}}, starts[1];
    char eb[256] = "";
    cr_assert_eq(mt_cover_reset(c, owned, 1, lists, 1, starts, eb, sizeof(eb)), MT_LIMIT);
    cr_assert(strstr(eb, "examples [3]: a shard's mark is 500") && strstr(eb, "from 800"), "%s",
              eb);
    /* nothing is owned after a refused reset */
    cr_assert_eq(mt_cover_add(c, T, 3, 800), MT_COVER_NOT_OWNED);
    mt_cover_destroy(c);
}
