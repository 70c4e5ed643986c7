/*
 * kc_templates.h - access to the CPU kernel templates embedded from
 * kernels/cpu/ (see kc_templates.c). Texts are static, NUL-terminated.
 */
#ifndef KC_TEMPLATES_H
#define KC_TEMPLATES_H

int kc_cpu_template_count(void);
/* File name under kernels/cpu/ of template i ("gemm.c"). */
const char *kc_cpu_template_name(int i);
/* The embedded text of template i. */
const char *kc_cpu_template_embedded(int i);
/* Index of a template by file name, or -1. */
int kc_cpu_template_index(const char *name);

#endif
