/*
 * test_buf.c - the growing buffer every library builds text in (kc_buf.h):
 * bytes survive every growth, the contents stay NUL-terminated, printf grows
 * for long output, and a failed allocation sticks until the end.
 */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <kcache/kc_buf.h>

Test(buf, keeps_every_byte_across_growth_and_stays_nul_terminated)
{
    kc_buf b = {0};
    size_t want = 0;
    /* pieces of 1..97 bytes, NULs among them, across many doublings */
    for (int i = 0; i < 2000; i++) {
        uint8_t piece[97];
        size_t n = (size_t)(i % 97) + 1;
        for (size_t j = 0; j < n; j++)
            piece[j] = (uint8_t)(i + j);
        cr_assert(kc_buf_add(&b, piece, n));
        want += n;
        cr_assert_eq(b.len, want);
        cr_assert_eq(b.data[b.len], '\0');
        cr_assert_gt(b.cap, b.len);
    }
    size_t off = 0;
    for (int i = 0; i < 2000; i++) {
        size_t n = (size_t)(i % 97) + 1;
        for (size_t j = 0; j < n; j++)
            cr_assert_eq((uint8_t)b.data[off + j], (uint8_t)(i + j), "byte %zu", off + j);
        off += n;
    }
    kc_buf_free(&b);
    cr_assert_null(b.data);
    cr_assert_eq(b.len, 0);
}

Test(buf, printf_grows_for_output_longer_than_the_room_left)
{
    kc_buf b = {0};
    cr_assert(kc_buf_addstr(&b, "head:"));
    char big[5000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    cr_assert(kc_buf_printf(&b, "%s|%d", big, 42));
    cr_assert_eq(b.len, 5 + 4999 + 3);
    cr_assert(strncmp(b.data, "head:xxx", 8) == 0);
    cr_assert_str_eq(b.data + 5 + 4999, "|42");
    char *s = kc_buf_take(&b);
    cr_assert_null(b.data, "take leaves the buffer empty");
    cr_assert_eq(strlen(s), 5 + 4999 + 3);
    free(s);
}

Test(buf, take_of_nothing_is_an_empty_string)
{
    kc_buf b = {0};
    char *s = kc_buf_take(&b);
    cr_assert_not_null(s);
    cr_assert_str_eq(s, "");
    free(s);
    cr_assert(kc_buf_add(&b, "", 0));
    cr_assert_str_eq(b.data, "", "an empty add still gives a string");
    kc_buf_free(&b);
}

Test(buf, a_failed_allocation_sticks_and_take_gives_null)
{
    kc_buf b = {0};
    cr_assert(kc_buf_addstr(&b, "kept"));
    cr_assert_not(kc_buf_reserve(&b, SIZE_MAX - 2), "no room for SIZE_MAX bytes");
    cr_assert(b.failed);
    cr_assert_str_eq(b.data, "kept", "what came before is kept");
    cr_assert_not(kc_buf_addstr(&b, "more"));
    cr_assert_not(kc_buf_printf(&b, "%d", 1));
    cr_assert_str_eq(b.data, "kept");
    cr_assert_null(kc_buf_take(&b));
    cr_assert_null(b.data);
    cr_assert_not(b.failed, "take leaves the buffer empty and usable");
    cr_assert(kc_buf_addstr(&b, "again"));
    cr_assert_str_eq(b.data, "again");
    kc_buf_free(&b);
}
