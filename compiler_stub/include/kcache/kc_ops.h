/*
 * kc_ops.h - the operator table's schemas (kc_ops_list.h): attribute fields,
 * their canonical text, and shape/dtype inference of the extended ops (those
 * without KC_OPF_CORE). kc_graph.c calls these, so JSON graphs and imported
 * ONNX models share one set of rules and one fingerprint.
 */
#ifndef KC_OPS_H
#define KC_OPS_H

#include <stdbool.h>
#include <stddef.h>

#include <kcache/kc_graph.h>

typedef enum kc_xa_kind {
    KC_XA_LIST = 0, /* a list of integers (n[f] of them) */
    KC_XA_INT,      /* one integer (n[f] == 1) */
    KC_XA_FLOAT     /* one number (f[f]) */
} kc_xa_kind;

typedef struct kc_xa_field {
    const char *name;
    kc_xa_kind kind;
    double dflt; /* KC_XA_INT / KC_XA_FLOAT default when a JSON graph omits it */
    bool required;
} kc_xa_field;

/* The attribute fields of op (NULL-named entries end the list); n_fields
 * gets their number. Ops without attributes have none. */
const kc_xa_field *kc_op_fields(kc_op op, int *n_fields);
/* Field index of name for op, or -1. */
int kc_op_field(kc_op op, const char *name);
/* Fills xa with the op's defaults (lists empty). */
void kc_xattrs_defaults(kc_op op, kc_xattrs *xa);
/* Canonical text "name=v,v name2=0x1p-2" (fields in schema order; numbers
 * as %a so equal values always print alike). Writes "" for none. */
void kc_xattrs_text(kc_op op, const kc_xattrs *xa, char *buf, size_t cap);

/* Infers dtype and shape of node ni's output (an extended op) from its
 * inputs and attributes. On a mismatch returns false with a reason in msg
 * (without the node label, which the caller adds). */
bool kc_ops_infer(kc_graph *g, int ni, char *msg, size_t cap);

/* KC_OPF_EW: extended ops whose output is a function of one element of
 * each (broadcast) input; only f32 unary/binary ones. */
bool kc_op_is_elementwise(kc_op op);

#endif
