/*
 * kc_incbin.h - embeds a file of kernels/ into the library at build time, so
 * the installed tool needs no source tree and the compiler fingerprint hashes
 * exactly the text it uses. Shared by the CPU templates (kc_templates.c) and
 * the XPU code generator (kc_xpu_codegen.c). Private to kccompiler.
 */
#ifndef KC_INCBIN_H
#define KC_INCBIN_H

/* Defines `extern const char sym[]`: the bytes of KC_KERNELS_DIR/file, then
 * a NUL, 16-byte aligned in .rodata, hidden outside the library. */
#define KC_INCBIN(sym, file)                                                                       \
    __asm__(".section .rodata\n"                                                                   \
            ".global " #sym "\n"                                                                   \
            ".hidden " #sym "\n"                                                                   \
            ".balign 16\n" #sym ":\n"                                                              \
            ".incbin \"" KC_KERNELS_DIR "/" file "\"\n"                                            \
            ".byte 0\n"                                                                            \
            ".previous\n");                                                                        \
    extern const char sym[]

#endif
