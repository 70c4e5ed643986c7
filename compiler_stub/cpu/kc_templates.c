/*
 * kc_templates.c - the kernel templates of kernels/cpu/, embedded into the
 * library at build time (.incbin), so the installed tool needs no source
 * tree and the compiler fingerprint covers exactly the text that is used.
 * CMake re-assembles this file whenever a template changes (OBJECT_DEPENDS).
 */
#include "kc_templates.h"

#include "kc_incbin.h"

#include <string.h>

#ifndef KC_KERNELS_DIR
#error "KC_KERNELS_DIR must name the kernels/ directory"
#endif

KC_INCBIN(kc_tpl_common, "cpu/common.h");
KC_INCBIN(kc_tpl_pointwise, "cpu/pointwise.c");
KC_INCBIN(kc_tpl_gemm, "cpu/gemm.c");
KC_INCBIN(kc_tpl_softmax, "cpu/softmax.c");
KC_INCBIN(kc_tpl_layernorm, "cpu/layernorm.c");
KC_INCBIN(kc_tpl_sdpa, "cpu/sdpa.c");
KC_INCBIN(kc_tpl_conv2d, "cpu/conv2d.c");
KC_INCBIN(kc_tpl_transpose, "cpu/transpose.c");
KC_INCBIN(kc_tpl_rownorm, "cpu/rownorm.c");

static const struct {
    const char *name;
    const char *text;
} templates[] = {
    {"common.h", kc_tpl_common},   {"pointwise.c", kc_tpl_pointwise}, {"gemm.c", kc_tpl_gemm},
    {"softmax.c", kc_tpl_softmax}, {"layernorm.c", kc_tpl_layernorm}, {"sdpa.c", kc_tpl_sdpa},
    {"conv2d.c", kc_tpl_conv2d},   {"transpose.c", kc_tpl_transpose}, {"rownorm.c", kc_tpl_rownorm},
};

int kc_cpu_template_count(void)
{
    return (int)(sizeof templates / sizeof templates[0]);
}

const char *kc_cpu_template_name(int i)
{
    return templates[i].name;
}

const char *kc_cpu_template_embedded(int i)
{
    return templates[i].text;
}

int kc_cpu_template_index(const char *name)
{
    for (int i = 0; i < kc_cpu_template_count(); i++)
        if (strcmp(templates[i].name, name) == 0)
            return i;
    return -1;
}
