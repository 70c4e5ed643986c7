/*
 * kc_onednn_id.h - what the CPU device fingerprint takes from oneDNN (its
 * version and the ISA it would use here), remembered in the state directory
 * so that a warm start need not load the library (tens of MiB of code and
 * C++ constructors) only to ask it.
 */
#ifndef KC_ONEDNN_ID_H
#define KC_ONEDNN_ID_H

#include <stdbool.h>

typedef struct kc_onednn_id {
    char version[32]; /* "2.7.3" */
    int isa;          /* dnnl_get_effective_cpu_isa() */
    bool remembered;  /* answered by a memo (oneDNN not asked) */
} kc_onednn_id;

/* Fills *out. The answer is remembered (kc_memo.h; state_dir NULL: ask
 * oneDNN every time) under a key made of the stamp of the library file the
 * dynamic loader would map (the one this build linked against; no memo when
 * LD_LIBRARY_PATH or LD_PRELOAD could choose another, or when that file or
 * /etc/ld.so.cache is too new), the CPU's identification and feature words
 * with the state the OS enabled (cpuid, xgetbv), the kernel release, and
 * every oneDNN ISA variable in the environment. Never fails: without a memo
 * it asks oneDNN. */
void kc_onednn_id_get(const char *state_dir, kc_onednn_id *out);

#endif
