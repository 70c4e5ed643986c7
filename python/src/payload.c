/*
 * payload.c - payloads between Python and the libraries without copies: a
 * buffer object that owns a payload the library malloc'd (so a large Remote.get
 * is a memoryview over the bytes libcurl delivered, not a second copy), and an
 * artifact that borrows the caller's buffer for a put (so storing a 256 MiB
 * bytearray does not copy it first).
 */
#include "kcpy.h"

#include <string.h>

#include <kcache/kc_hash.h>

typedef struct payload {
    PyObject_HEAD uint8_t *buf;
    Py_ssize_t len;
} payload;

static void payload_dealloc(payload *p)
{
    free(p->buf);
    Py_TYPE(p)->tp_free((PyObject *)p);
}

static int payload_getbuffer(payload *p, Py_buffer *view, int flags)
{
    return PyBuffer_FillInfo(view, (PyObject *)p, p->buf, p->len, 1, flags);
}

static PyBufferProcs payload_as_buffer = {(getbufferproc)payload_getbuffer, NULL};

PyTypeObject kcpy_PayloadType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kcache._Payload",
    .tp_basicsize = sizeof(payload),
    .tp_dealloc = (destructor)payload_dealloc,
    .tp_as_buffer = &payload_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The owner of a payload's bytes behind a memoryview kcache returned.",
};

PyObject *kcpy_payload_take(uint8_t *buf, size_t len)
{
    if (len < KCPY_LARGE_PAYLOAD) {
        PyObject *b = PyBytes_FromStringAndSize((const char *)buf, (Py_ssize_t)len);
        free(buf);
        return b;
    }
    payload *p = PyObject_New(payload, &kcpy_PayloadType);
    if (!p) {
        free(buf);
        return NULL;
    }
    p->buf = buf;
    p->len = (Py_ssize_t)len;
    PyObject *view = PyMemoryView_FromObject((PyObject *)p);
    Py_DECREF(p);
    return view;
}

PyObject *kcpy_payload_of(kc_artifact *a)
{
    uint8_t *buf = a->payload;
    size_t len = a->payload_len;
    a->payload = NULL;
    kc_artifact_free(a);
    return kcpy_payload_take(buf, len);
}

int kcpy_put_args_parse(kcpy_put_args *p, PyObject *args, PyObject *kwargs)
{
    static char *kw[] = {"data", "kind", "meta", "key", NULL};
    PyObject *meta = Py_None;
    p->kind = "blob";
    p->key = p->meta = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "y*|$sOz:put", kw, &p->data, &p->kind, &meta,
                                     &p->key))
        return -1;
    if (!(p->meta_obj = kcpy_meta_json(meta)) ||
        (p->meta_obj != Py_None && !(p->meta = PyUnicode_AsUTF8(p->meta_obj)))) {
        Py_XDECREF(p->meta_obj);
        PyBuffer_Release(&p->data);
        return -1;
    }
    return 0;
}

void kcpy_put_args_release(kcpy_put_args *p)
{
    Py_DECREF(p->meta_obj);
    PyBuffer_Release(&p->data);
}

kc_code kcpy_artifact_borrow(kc_artifact *a, const char *key, const char *kind, const char *meta,
                             const void *data, size_t len, kc_err *err)
{
    char keybuf[KC_KEY_HEX_LEN + 1];
    if (!key) {
        kc_sha256_hex(data, len, keybuf);
        key = keybuf;
    }
    if ((uint64_t)len > KC_PAYLOAD_MAX)
        return kc_err_set(err, KC_ERR_TOO_LARGE, "payload of key %s is too large (%zu bytes)", key,
                          len);
    /* The library's own constructor checks key, kind and metadata on an empty
     * payload; then the artifact points at the caller's bytes instead of a copy. */
    kc_code rc = kc_artifact_init(a, key, kind, meta, "", 0, err);
    if (rc != KC_OK)
        return rc;
    free(a->payload);
    a->payload = (uint8_t *)data;
    a->payload_len = len;
    kc_sha256(data, len, a->payload_sha);
    return KC_OK;
}

void kcpy_artifact_release(kc_artifact *a)
{
    a->payload = NULL; /* borrowed */
    a->payload_len = 0;
    kc_artifact_free(a);
}

PyObject *kcpy_meta_json(PyObject *meta)
{
    if (!meta || meta == Py_None)
        Py_RETURN_NONE;
    if (PyUnicode_Check(meta)) {
        Py_INCREF(meta);
        return meta;
    }
    if (!PyDict_Check(meta)) {
        PyErr_SetString(PyExc_TypeError, "meta must be a dict, a str of JSON or None");
        return NULL;
    }
    PyObject *json = PyImport_ImportModule("json");
    if (!json)
        return NULL;
    PyObject *text = PyObject_CallMethod(json, "dumps", "O", meta);
    Py_DECREF(json);
    return text;
}
