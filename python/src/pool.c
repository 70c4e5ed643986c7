/*
 * pool.c - the handles a Store or Remote object lends to the threads that call
 * it. A kc_store or kc_remote serves one thread at a time, and the GIL is
 * released during every call, so two threads using one object each borrow a
 * handle of their own: that is what lets them fetch in parallel.
 */
#include "kcpy.h"

void kcpy_pool_init(kcpy_pool *p)
{
    pthread_mutex_init(&p->mu, NULL);
    p->nidle = 0;
    p->busy = 0;
    p->closed = false;
}

void *kcpy_pool_take(kcpy_pool *p, bool *closed)
{
    void *h = NULL;
    pthread_mutex_lock(&p->mu);
    *closed = p->closed;
    if (!p->closed && p->nidle > 0) {
        h = p->idle[--p->nidle];
        p->busy++;
    }
    pthread_mutex_unlock(&p->mu);
    return h;
}

void kcpy_pool_opened(kcpy_pool *p)
{
    pthread_mutex_lock(&p->mu);
    p->busy++;
    pthread_mutex_unlock(&p->mu);
}

bool kcpy_pool_give(kcpy_pool *p, void *h, bool keep)
{
    pthread_mutex_lock(&p->mu);
    p->busy--;
    keep = keep && !p->closed && p->nidle < KCPY_POOL_MAX;
    if (keep)
        p->idle[p->nidle++] = h;
    pthread_mutex_unlock(&p->mu);
    return keep;
}

int kcpy_pool_close(kcpy_pool *p, void **out)
{
    pthread_mutex_lock(&p->mu);
    p->closed = true;
    int n = p->nidle;
    for (int i = 0; i < n; i++)
        out[i] = p->idle[i];
    p->nidle = 0;
    pthread_mutex_unlock(&p->mu);
    return n;
}
