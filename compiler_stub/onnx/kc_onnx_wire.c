/*
 * kc_onnx_wire.c - a ModelProto without its weights: walks the protobuf wire
 * format down to the graph's initializers and copies the model minus the
 * values of every large one, remembering where each lies in the caller's
 * buffer. protobuf-c then unpacks a few hundred KiB instead of copying every
 * weight, and the importer unpacks an initializer whole only when it needs
 * its values (kcache run, or a constant small enough to fold).
 */
#include <stdlib.h>
#include <string.h>

#include "kc_onnx_internal.h"

/* Field numbers of onnx.proto on the path to a weight. */
enum {
    MODEL_GRAPH = 7,       /* ModelProto.graph */
    GRAPH_INITIALIZER = 5, /* GraphProto.initializer */
};

/* Initializers this large (encoded) lose their values in the slim model. */
#define SLIM_MIN_BYTES 4096

/* TensorProto's value fields: float_data, int32_data, string_data,
 * int64_data, raw_data, double_data, uint64_data. Everything else (dims,
 * data_type, name, external data, segment) stays, so shapes and errors come
 * out of the slim tensor as they would out of the whole one. */
static bool tensor_values_field(uint64_t num, int type)
{
    /* each in an encoding protobuf allows for it (packed, or one element a
     * field), so that what the slim model leaves out would have unpacked */
    switch (num) {
    case 4: /* float */
        return type == 2 || type == 5;
    case 5:  /* int32 */
    case 7:  /* int64 */
    case 11: /* uint64 */
        return type == 2 || type == 0;
    case 10: /* double */
        return type == 2 || type == 1;
    case 6: /* bytes */
    case 9:
        return type == 2;
    default:
        return false;
    }
}

typedef struct wbuf {
    uint8_t *p;
    size_t len, cap;
} wbuf;

static bool wbuf_put(wbuf *b, const void *src, size_t n)
{
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n)
            cap *= 2;
        uint8_t *p = realloc(b->p, cap);
        if (!p)
            return false;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, src, n);
    b->len += n;
    return true;
}

static bool wbuf_varint(wbuf *b, uint64_t v)
{
    uint8_t tmp[10];
    size_t n = 0;
    do {
        tmp[n++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
        v >>= 7;
    } while (v);
    return wbuf_put(b, tmp, n);
}

/* Reads a varint at *pos (< end); false when cut short or over 10 bytes. */
static bool get_varint(const uint8_t *buf, size_t end, size_t *pos, uint64_t *v)
{
    uint64_t r = 0;
    for (int shift = 0; shift < 70 && *pos < end; shift += 7) {
        uint8_t c = buf[(*pos)++];
        r |= (uint64_t)(c & 0x7f) << shift;
        if (!(c & 0x80)) {
            *v = r;
            return true;
        }
    }
    return false;
}

/* One field at *pos: its number, wire type, and the span of its bytes
 * (tag included: [start, *pos)) and, for length-delimited fields, of its
 * contents. Groups (wire types 3 and 4, unused by onnx.proto) are refused. */
typedef struct field {
    uint64_t num;
    int type;
    size_t start, body, body_len;
} field;

static bool next_field(const uint8_t *buf, size_t end, size_t *pos, field *f)
{
    uint64_t tag, v;
    f->start = *pos;
    if (!get_varint(buf, end, pos, &tag) || (tag >> 3) == 0)
        return false;
    f->num = tag >> 3;
    f->type = (int)(tag & 7);
    switch (f->type) {
    case 0:
        return get_varint(buf, end, pos, &v);
    case 1:
        if (end - *pos < 8)
            return false;
        *pos += 8;
        return true;
    case 5:
        if (end - *pos < 4)
            return false;
        *pos += 4;
        return true;
    case 2:
        if (!get_varint(buf, end, pos, &v) || v > end - *pos)
            return false;
        f->body = *pos;
        f->body_len = (size_t)v;
        *pos += (size_t)v;
        return true;
    default:
        return false;
    }
}

/* Appends the TensorProto at [start, end) of buf to out, without its values
 * when it is large; *pl says where it lies and whether it was slimmed. */
static bool slim_tensor(const uint8_t *buf, size_t start, size_t end, wbuf *out, ox_payload *pl)
{
    pl->off = start;
    pl->len = end - start;
    pl->slim = pl->len >= SLIM_MIN_BYTES;
    wbuf t = {0};
    size_t pos = start;
    bool ok = true;
    while (pl->slim && ok && pos < end) {
        field f;
        if ((ok = next_field(buf, end, &pos, &f)) && !tensor_values_field(f.num, f.type))
            ok = wbuf_put(&t, buf + f.start, pos - f.start);
    }
    const uint8_t *body = pl->slim ? t.p : buf + start;
    size_t len = pl->slim ? t.len : pl->len;
    ok = ok && wbuf_varint(out, (uint64_t)GRAPH_INITIALIZER << 3 | 2) && wbuf_varint(out, len) &&
         (len == 0 || wbuf_put(out, body, len));
    free(t.p);
    return ok;
}

static bool grow_payloads(ox_slim *s)
{
    if (s->n_payloads < s->cap_payloads)
        return true;
    size_t cap = s->cap_payloads ? s->cap_payloads * 2 : 64;
    ox_payload *p = realloc(s->payloads, cap * sizeof *p);
    if (!p)
        return false;
    s->payloads = p;
    s->cap_payloads = cap;
    return true;
}

/* Appends a GraphProto whose large initializers have no values. */
static bool slim_graph(const uint8_t *buf, size_t start, size_t end, wbuf *out, ox_slim *s)
{
    wbuf g = {0};
    size_t pos = start;
    bool ok = true;
    while (ok && pos < end) {
        field f;
        if (!(ok = next_field(buf, end, &pos, &f)))
            break;
        if (f.num == GRAPH_INITIALIZER && f.type == 2) {
            ok = grow_payloads(s) &&
                 slim_tensor(buf, f.body, f.body + f.body_len, &g, &s->payloads[s->n_payloads]);
            s->n_payloads += ok;
            continue;
        }
        ok = wbuf_put(&g, buf + f.start, pos - f.start);
    }
    ok = ok && wbuf_varint(out, (uint64_t)MODEL_GRAPH << 3 | 2) && wbuf_varint(out, g.len) &&
         (g.len == 0 || wbuf_put(out, g.p, g.len));
    free(g.p);
    return ok;
}

bool ox_slim_model(const uint8_t *buf, size_t len, ox_slim *s)
{
    memset(s, 0, sizeof *s);
    wbuf m = {0};
    size_t pos = 0;
    bool ok = true;
    while (ok && pos < len) {
        field f;
        if (!(ok = next_field(buf, len, &pos, &f)))
            break;
        if (f.num == MODEL_GRAPH && f.type == 2)
            ok = slim_graph(buf, f.body, f.body + f.body_len, &m, s);
        else
            ok = wbuf_put(&m, buf + f.start, pos - f.start);
    }
    if (!ok) {
        free(m.p);
        ox_slim_free(s);
        return false;
    }
    s->buf = m.p;
    s->len = m.len;
    return true;
}

void ox_slim_free(ox_slim *s)
{
    free(s->buf);
    free(s->payloads);
    memset(s, 0, sizeof *s);
}

kc_code ox_slim_restore(const ox_slim *s, const uint8_t *model, Onnx__GraphProto *gp, size_t i,
                        const char *what, kc_err *err)
{
    if (i >= s->n_payloads || !s->payloads[i].slim)
        return KC_OK;
    const ox_payload *pl = &s->payloads[i];
    Onnx__TensorProto *t = onnx__tensor_proto__unpack(NULL, pl->len, model + pl->off);
    if (!t)
        return kc_err_set(err, KC_ERR_INVALID, "%s: damaged TensorProto", what);
    onnx__tensor_proto__free_unpacked(gp->initializer[i], NULL);
    gp->initializer[i] = t;
    return KC_OK;
}
