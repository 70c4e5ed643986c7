/*
 * kc_lazy.c - the run-time half of cmake/kc_lazy.cmake: the first call of a
 * trampoline loads its library (by soname, as the dynamic loader would have
 * at start-up) and returns the real function, which the trampoline's slot
 * then keeps. The generated files declare this function; no header.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <unistd.h>

void *kc_lazy_resolve(const char *soname, const char *name, void **slot);

void *kc_lazy_resolve(const char *soname, const char *name, void **slot)
{
    /* dlopen of a loaded library only counts a reference: cheap enough for
     * the one resolution each function gets */
    void *lib = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
    void *fn = lib ? dlsym(lib, name) : NULL;
    if (!fn) {
        /* what the dynamic loader would have said at start-up, and its exit
         * status: the program cannot go on without a library it was built
         * against, and this call has no error to return */
        const char *why = dlerror();
        fprintf(stderr, "error while loading shared libraries: %s (for %s): %s\n", soname, name,
                why ? why : "not found");
        _exit(127);
    }
    __atomic_store_n(slot, fn, __ATOMIC_RELEASE);
    return fn;
}
