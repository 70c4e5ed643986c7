/*
 * kc_xpu_run.c - executes one generated XPU kernel through Level Zero: device buffers,
 * a synchronous immediate command list, kernel arguments (inputs then output) and the
 * ND-range of kc_xpu_launch_geometry. Written against the Level Zero spec; it has NOT run
 * on Intel hardware (none was available). The test driver checks every call up to the
 * launch (buffers, copies, group size, one argument per kernel parameter) and then refuses
 * to execute, so results were never produced by this path.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <level_zero/ze_api.h>

#include <kcache/kc_xpu.h>
#include "kc_xpu_codegen.h"

static kc_code kc_xpu_ze(kc_err *err, ze_result_t r, const char *call)
{
    if (r == ZE_RESULT_SUCCESS)
        return KC_OK;
    return kc_err_set(err, KC_ERR_UNSUPPORTED, "Level Zero %s failed (0x%x) while running a kernel",
                      call, (unsigned)r);
}

kc_code kc_xpu_launch(kc_xpu *x, kc_xpu_module *m, const kc_kernel *k, const float *const *in,
                      float *out, kc_err *err)
{
    ze_context_handle_t ctx = kc_xpu_context_handle(x);
    ze_device_handle_t dev = kc_xpu_device_handle(x);
    ze_module_handle_t mod = kc_xpu_module_handle(m);
    const char *entry = kc_xpu_kernel_entry(k->kind);
    if (!ctx || !dev || !mod || !entry)
        return kc_err_set(err, KC_ERR_INVALID, "kc_xpu_launch: no device, module or entry point");
    void *dbuf[KC_KERNEL_MAX_IN + 1] = {NULL};
    size_t bytes[KC_KERNEL_MAX_IN + 1];
    int nbuf = k->n_in + 1;
    ze_command_list_handle_t cl = NULL;
    ze_kernel_handle_t kern = NULL;
    kc_code c = KC_OK;

    ze_command_queue_desc_t qd;
    memset(&qd, 0, sizeof qd);
    qd.stype = ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC;
    qd.ordinal = 0;
    qd.mode = ZE_COMMAND_QUEUE_MODE_SYNCHRONOUS;
    c = kc_xpu_ze(err, zeCommandListCreateImmediate(ctx, dev, &qd, &cl),
                  "zeCommandListCreateImmediate");
    ze_device_mem_alloc_desc_t md;
    memset(&md, 0, sizeof md);
    md.stype = ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC;
    for (int i = 0; c == KC_OK && i < nbuf; i++) {
        const kc_shape *s = i < k->n_in ? &k->in_shape[i] : &k->out_shape;
        bytes[i] = (size_t)kc_shape_numel(s) * kc_dtype_size(i < k->n_in ? k->in_dt[i] : k->out_dt);
        c = kc_xpu_ze(err, zeMemAllocDevice(ctx, &md, bytes[i] ? bytes[i] : 4, 64, dev, &dbuf[i]),
                      "zeMemAllocDevice");
        if (c == KC_OK && i < k->n_in && bytes[i])
            c = kc_xpu_ze(
                err, zeCommandListAppendMemoryCopy(cl, dbuf[i], in[i], bytes[i], NULL, 0, NULL),
                "zeCommandListAppendMemoryCopy (to device)");
    }
    if (c == KC_OK) {
        ze_kernel_desc_t kd;
        memset(&kd, 0, sizeof kd);
        kd.stype = ZE_STRUCTURE_TYPE_KERNEL_DESC;
        kd.pKernelName = entry;
        c = kc_xpu_ze(err, zeKernelCreate(mod, &kd, &kern), "zeKernelCreate");
    }
    size_t global[3], local[3];
    kc_xpu_launch_geometry(k, global, local);
    if (c == KC_OK)
        c = kc_xpu_ze(
            err,
            zeKernelSetGroupSize(kern, (uint32_t)local[0], (uint32_t)local[1], (uint32_t)local[2]),
            "zeKernelSetGroupSize");
    for (int i = 0; c == KC_OK && i < nbuf; i++)
        c = kc_xpu_ze(err, zeKernelSetArgumentValue(kern, (uint32_t)i, sizeof(void *), &dbuf[i]),
                      "zeKernelSetArgumentValue");
    if (c == KC_OK) {
        ze_group_count_t g = {(uint32_t)(global[0] / local[0]), (uint32_t)(global[1] / local[1]),
                              (uint32_t)(global[2] / local[2])};
        c = kc_xpu_ze(err, zeCommandListAppendLaunchKernel(cl, kern, &g, NULL, 0, NULL),
                      "zeCommandListAppendLaunchKernel");
    }
    if (c == KC_OK && bytes[k->n_in])
        c = kc_xpu_ze(
            err,
            zeCommandListAppendMemoryCopy(cl, out, dbuf[k->n_in], bytes[k->n_in], NULL, 0, NULL),
            "zeCommandListAppendMemoryCopy (to host)");
    if (kern)
        zeKernelDestroy(kern);
    for (int i = 0; i < nbuf; i++)
        if (dbuf[i])
            zeMemFree(ctx, dbuf[i]);
    if (cl)
        zeCommandListDestroy(cl);
    return c;
}
