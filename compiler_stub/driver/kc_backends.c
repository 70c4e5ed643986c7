/*
 * kc_backends.c - the backend registry (kc_backend_open): one table of device names and
 * their open functions, so programs pick a backend by name instead of wiring each one,
 * and "auto" (an XPU when one answers, else the CPU) is decided in one place. Also the
 * rest of kc_backend.h that belongs to no one backend: closing, device fingerprints.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include <kcache/kc_backend.h>
#include <kcache/kc_util.h>
#include "kc_cpu.h"
#include <kcache/kc_xpu.h>

static kc_code open_cpu(const kc_backend_opts *o, kc_backend **out, kc_err *err)
{
    return kc_cpu_backend_open(o, out, err);
}

static kc_code open_xpu(const kc_backend_opts *o, kc_backend **out, kc_err *err)
{
    return kc_xpu_backend_open(o, false, out, err);
}

static kc_code open_spirv(const kc_backend_opts *o, kc_backend **out, kc_err *err)
{
    return kc_xpu_backend_open(o, true, out, err);
}

static const struct {
    const char *device;
    kc_code (*open)(const kc_backend_opts *o, kc_backend **out, kc_err *err);
} registry[] = {{"cpu", open_cpu}, {"xpu", open_xpu}, {"xpu-spirv", open_spirv}};

#define N_REGISTRY (sizeof registry / sizeof registry[0])

kc_code kc_backend_open(const char *device, const kc_backend_opts *opts, kc_backend **out,
                        kc_err *err)
{
    *out = NULL;
    kc_backend_opts none = {0};
    if (!opts)
        opts = &none;
    if (!device)
        device = "cpu";
    if (strcmp(device, "auto") == 0) {
        /* an XPU when a Level Zero device answers (its own target choice), else the CPU */
        kc_backend_opts xo = *opts;
        xo.target = NULL;
        if (open_xpu(&xo, out, err) == KC_OK)
            return KC_OK;
        kc_err_clear(err);
        return open_cpu(opts, out, err);
    }
    for (size_t i = 0; i < N_REGISTRY; i++)
        if (strcmp(device, registry[i].device) == 0)
            return registry[i].open(opts, out, err);
    return kc_err_set(err, KC_ERR_INVALID, "unknown device '%s' (use cpu, xpu, xpu-spirv or auto)",
                      device);
}

void kc_backend_close(kc_backend *b)
{
    if (b && b->ops->destroy)
        b->ops->destroy(b);
}

void kc_device_fp_free(kc_device_fp *fp)
{
    if (fp) {
        free(fp->json);
        fp->json = NULL;
    }
}

static const char *const cpu_targets[] = {"native", "x86-64-v2", "x86-64-v3", "x86-64-v4",
                                          "v2",     "v3",        "v4"};

bool kc_backend_known(const char *name)
{
    if (!name)
        return false;
    if (strcmp(name, "auto") == 0)
        return true;
    for (size_t i = 0; i < N_REGISTRY; i++)
        if (strcmp(name, registry[i].device) == 0)
            return true;
    return false;
}

kc_code kc_backend_check(const char *device, const char *target, kc_err *err)
{
    if (device && !kc_backend_known(device)) {
        const char *names[N_REGISTRY + 1];
        for (size_t i = 0; i < N_REGISTRY; i++)
            names[i] = registry[i].device;
        names[N_REGISTRY] = "auto";
        const char *near = kc_nearest(device, names, N_REGISTRY + 1, sizeof names[0], 0);
        return kc_err_set(err, KC_ERR_INVALID,
                          "unknown device '%s' (cpu, xpu, xpu-spirv or auto)%s%s%s", device,
                          near ? "; did you mean '" : "", near ? near : "", near ? "'?" : "");
    }
    bool known = !target;
    for (size_t i = 0; !known && i < sizeof cpu_targets / sizeof cpu_targets[0]; i++)
        known = strcmp(target, cpu_targets[i]) == 0;
    if (!known) {
        const char *near = kc_nearest(target, cpu_targets, 4, sizeof cpu_targets[0], 0);
        return kc_err_set(
            err, KC_ERR_INVALID,
            "unknown CPU target '%s' (native, x86-64-v2, x86-64-v3 or x86-64-v4)%s%s%s", target,
            near ? "; did you mean '" : "", near ? near : "", near ? "'?" : "");
    }
    return KC_OK;
}

bool kc_backend_target_runs_here(const char *device, const char *target)
{
    if (!target || (device && strcmp(device, "cpu") != 0))
        return true;
    return kc_cpu_target_runs_here(target);
}

void kc_fingerprints_free(kc_fingerprint *fps, int n)
{
    for (int i = 0; fps && i < n; i++)
        kc_device_fp_free(&fps[i].fp);
    free(fps);
}

kc_code kc_fingerprints(const char *device, const kc_backend_opts *opts, kc_fingerprint **out,
                        int *n, kc_err *err)
{
    static const char *const targets[] = {"native", "x86-64-v2", "x86-64-v3", "x86-64-v4"};
    *out = NULL;
    *n = 0;
    kc_fingerprint *fps = calloc(N_REGISTRY + 8, sizeof *fps);
    if (!fps)
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory");
    const char *only = opts ? opts->target : NULL;
    bool want_cpu = strcmp(device, "cpu") == 0 || strcmp(device, "auto") == 0;
    for (size_t i = 0; want_cpu && i < sizeof targets / sizeof targets[0]; i++) {
        if (only && strcmp(only, targets[i]) != 0)
            continue;
        kc_backend_opts bo = opts ? *opts : (kc_backend_opts){0};
        bo.target = targets[i];
        kc_backend *b = NULL;
        kc_fingerprint *f = &fps[*n];
        if (kc_cpu_backend_open(&bo, &b, err) || b->ops->device_fp(b, &f->fp, err) ||
            b->ops->compiler_fp(b, f->compiler_fp, err)) {
            kc_backend_close(b);
            kc_fingerprints_free(fps, *n + 1);
            *n = 0;
            return err ? err->code : KC_ERR_INVALID;
        }
        f->backend = "cpu";
        f->runs_here = kc_cpu_target_runs_here(targets[i]);
        (*n)++;
        kc_backend_close(b);
    }
    if (strcmp(device, "xpu") == 0 || strcmp(device, "auto") == 0) {
        kc_fingerprint *f = &fps[*n];
        kc_xpu *x = NULL;
        kc_err e = {0};
        f->backend = "xpu";
        if (kc_xpu_probe(&x, &e) == KC_OK &&
            kc_xpu_device_fingerprint(x, f->fp.id, &f->fp.json, &e) == KC_OK) {
            kc_sha256_hex(f->fp.json, strlen(f->fp.json), f->fp.hash);
            f->runs_here = true;
        } else {
            snprintf(f->note, sizeof f->note, "%s", e.msg);
        }
        kc_xpu_close(x);
        (*n)++;
    }
    *out = fps;
    return KC_OK;
}

kc_code kc_backend_device_id(const char *device, const kc_backend_opts *opts, char *buf, size_t cap,
                             kc_err *err)
{
    kc_backend *b = NULL;
    kc_device_fp fp = {0};
    kc_code rc = kc_backend_open(device, opts, &b, err);
    if (rc == KC_OK)
        rc = b->ops->device_fp(b, &fp, err);
    if (rc == KC_OK)
        snprintf(buf, cap, "%s", fp.id);
    kc_device_fp_free(&fp);
    kc_backend_close(b);
    return rc;
}

void kc_backend_local_devices(const char *state_dir, kc_device_fn fn, void *ctx)
{
    static const char *const targets[] = {"native", "x86-64-v2", "x86-64-v3", "x86-64-v4"};
    for (size_t i = 0; i < sizeof targets / sizeof targets[0]; i++) {
        if (i > 0 && !kc_cpu_target_runs_here(targets[i]))
            continue;
        kc_backend_opts bo = {.target = targets[i], .state_dir = state_dir};
        kc_err err = {0};
        char what[64], id[sizeof((kc_device_fp *)0)->id];
        snprintf(what, sizeof what, "CPU fingerprint for %s", targets[i]);
        if (kc_backend_device_id("cpu", &bo, id, sizeof id, &err) == KC_OK)
            fn(id, what, NULL, ctx);
        else
            fn(NULL, what, err.msg, ctx);
    }
    /* the Level Zero device's native binaries, then (only on a machine with such a
     * device) its SPIR-V, which any XPU can finalise */
    for (int spirv = 0; spirv < 2; spirv++) {
        kc_backend_opts bo = {.state_dir = state_dir};
        kc_backend *b = NULL;
        kc_device_fp fp = {0};
        kc_err err = {0};
        bool ok = kc_xpu_backend_open(&bo, spirv == 1, &b, &err) == KC_OK &&
                  b->ops->device_fp(b, &fp, &err) == KC_OK;
        fn(ok ? fp.id : NULL, "XPU fingerprint", ok ? NULL : err.msg, ctx);
        kc_device_fp_free(&fp);
        kc_backend_close(b);
        if (!ok)
            break;
    }
}
