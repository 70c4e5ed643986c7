/*
 * kc_ops_list.h - every operator of the graph IR, in one X-macro (no
 * include guard): KC_OP_X(ID, "name", min inputs, max inputs, fields,
 * flags, "OnnxType"). Each consumer (the enum, names and arity, attribute
 * schemas, lowering, code generation, the reference, the ONNX importer)
 * expands the columns it needs, so an operator is added in one place.
 *
 *   name      the op's name in JSON graphs and in the canonical text that
 *             graph fingerprints hash: never rename one
 *   fields    the attribute schema (f_<fields> in kc_ops.c); "none" for ops
 *             without kc_xattrs attributes, including the KC_OPF_CORE ops
 *   flags     KC_OPF_* (kc_graph.h)
 *   OnnxType  the ONNX op type that converts to this op one to one through
 *             the importer's generic handlers, or ""
 *
 * The order is the enum's, so append only: a value's number goes into the
 * structural hashes that order nodes, and so into graph fingerprints.
 */
/* the original IR: kc_attrs attributes, kernel kinds of their own, the
 * plain-C reference (kc_ref.c) */
KC_OP_X(MATMUL, "matmul", 2, 2, none, KC_OPF_CORE, "")
KC_OP_X(ADD, "add", 2, 2, none, KC_OPF_CORE | KC_OPF_POINTWISE | KC_OPF_BINARY, "Add")
KC_OP_X(SUB, "sub", 2, 2, none, KC_OPF_CORE | KC_OPF_POINTWISE | KC_OPF_BINARY, "Sub")
KC_OP_X(MUL, "mul", 2, 2, none, KC_OPF_CORE | KC_OPF_POINTWISE | KC_OPF_BINARY, "Mul")
KC_OP_X(DIV, "div", 2, 2, none, KC_OPF_CORE | KC_OPF_POINTWISE | KC_OPF_BINARY, "Div")
KC_OP_X(RELU, "relu", 1, 1, none, KC_OPF_CORE | KC_OPF_POINTWISE, "Relu")
KC_OP_X(GELU, "gelu", 1, 1, none, KC_OPF_CORE | KC_OPF_POINTWISE, "")
KC_OP_X(SILU, "silu", 1, 1, none, KC_OPF_CORE | KC_OPF_POINTWISE, "")
KC_OP_X(TANH, "tanh", 1, 1, none, KC_OPF_CORE | KC_OPF_POINTWISE, "Tanh")
KC_OP_X(EXP, "exp", 1, 1, none, KC_OPF_CORE | KC_OPF_POINTWISE, "Exp")
KC_OP_X(SOFTMAX, "softmax", 1, 1, none, KC_OPF_CORE, "")
KC_OP_X(LAYERNORM, "layernorm", 3, 3, none, KC_OPF_CORE, "")
KC_OP_X(RMSNORM, "rmsnorm", 2, 2, none, KC_OPF_CORE, "")
KC_OP_X(TRANSPOSE, "transpose", 1, 1, none, KC_OPF_CORE, "")
KC_OP_X(SDPA, "sdpa", 3, 3, none, KC_OPF_CORE, "")
KC_OP_X(CONV2D, "conv2d", 2, 2, none, KC_OPF_CORE, "")
/* the extended set (ONNX operators): kc_xattrs attributes, one "op" kernel
 * each (kernels/cpu/ops.c) */
/* unary f32 */
KC_OP_X(SIGMOID, "sigmoid", 1, 1, none, KC_OPF_EW, "Sigmoid")
KC_OP_X(NEG, "neg", 1, 1, none, KC_OPF_EW, "Neg")
KC_OP_X(ABS, "abs", 1, 1, none, KC_OPF_EW, "Abs")
KC_OP_X(SQRT, "sqrt", 1, 1, none, KC_OPF_EW, "Sqrt")
KC_OP_X(LOG, "log", 1, 1, none, KC_OPF_EW, "Log")
KC_OP_X(RECIPROCAL, "reciprocal", 1, 1, none, KC_OPF_EW, "Reciprocal")
KC_OP_X(FLOOR, "floor", 1, 1, none, KC_OPF_EW, "Floor")
KC_OP_X(CEIL, "ceil", 1, 1, none, KC_OPF_EW, "Ceil")
KC_OP_X(ERF, "erf", 1, 1, none, KC_OPF_EW, "Erf")
KC_OP_X(SIN, "sin", 1, 1, none, KC_OPF_EW, "Sin")
KC_OP_X(COS, "cos", 1, 1, none, KC_OPF_EW, "Cos")
KC_OP_X(TAN, "tan", 1, 1, none, KC_OPF_EW, "Tan")
KC_OP_X(ASIN, "asin", 1, 1, none, KC_OPF_EW, "Asin")
KC_OP_X(ACOS, "acos", 1, 1, none, KC_OPF_EW, "Acos")
KC_OP_X(ATAN, "atan", 1, 1, none, KC_OPF_EW, "Atan")
KC_OP_X(SINH, "sinh", 1, 1, none, KC_OPF_EW, "Sinh")
KC_OP_X(COSH, "cosh", 1, 1, none, KC_OPF_EW, "Cosh")
KC_OP_X(ASINH, "asinh", 1, 1, none, KC_OPF_EW, "Asinh")
KC_OP_X(ACOSH, "acosh", 1, 1, none, KC_OPF_EW, "Acosh")
KC_OP_X(ATANH, "atanh", 1, 1, none, KC_OPF_EW, "Atanh")
KC_OP_X(SIGN, "sign", 1, 1, none, KC_OPF_EW, "Sign")
KC_OP_X(SOFTPLUS, "softplus", 1, 1, none, KC_OPF_EW, "Softplus")
KC_OP_X(SOFTSIGN, "softsign", 1, 1, none, KC_OPF_EW, "Softsign")
KC_OP_X(ROUND, "round", 1, 1, none, KC_OPF_EW, "Round")
KC_OP_X(HARDSWISH, "hardswish", 1, 1, none, KC_OPF_EW, "HardSwish")
/* unary f32 with attributes */
KC_OP_X(LEAKY_RELU, "leaky_relu", 1, 1, alpha001, KC_OPF_EW, "LeakyRelu")
KC_OP_X(ELU, "elu", 1, 1, alpha1, KC_OPF_EW, "Elu")
KC_OP_X(SELU, "selu", 1, 1, selu, KC_OPF_EW, "Selu")
KC_OP_X(CELU, "celu", 1, 1, alpha1, KC_OPF_EW, "Celu")
KC_OP_X(THRESHOLDED_RELU, "thresholded_relu", 1, 1, alpha1, KC_OPF_EW, "ThresholdedRelu")
KC_OP_X(HARD_SIGMOID, "hard_sigmoid", 1, 1, hsig, KC_OPF_EW, "HardSigmoid")
KC_OP_X(CLIP, "clip", 1, 1, clip, KC_OPF_EW, "")
KC_OP_X(SHRINK, "shrink", 1, 1, shrink, KC_OPF_EW, "Shrink")
/* binary f32, numpy broadcasting */
KC_OP_X(POW, "pow", 2, 2, none, KC_OPF_EW, "Pow")
KC_OP_X(MAX, "max", 2, 2, none, KC_OPF_EW, "Max")
KC_OP_X(MIN, "min", 2, 2, none, KC_OPF_EW, "Min")
KC_OP_X(PRELU, "prelu", 2, 2, none, KC_OPF_EW, "")
KC_OP_X(MOD, "fmod", 2, 2, none, KC_OPF_EW, "Mod")
/* comparisons and logic (bool results) */
KC_OP_X(EQUAL, "equal", 2, 2, none, 0, "Equal")
KC_OP_X(LESS, "less", 2, 2, none, 0, "Less")
KC_OP_X(GREATER, "greater", 2, 2, none, 0, "Greater")
KC_OP_X(LESS_EQUAL, "less_equal", 2, 2, none, 0, "LessOrEqual")
KC_OP_X(GREATER_EQUAL, "greater_equal", 2, 2, none, 0, "GreaterOrEqual")
KC_OP_X(AND, "and", 2, 2, none, 0, "And")
KC_OP_X(OR, "or", 2, 2, none, 0, "Or")
KC_OP_X(XOR, "xor", 2, 2, none, 0, "Xor")
KC_OP_X(NOT, "not", 1, 1, none, 0, "Not")
KC_OP_X(WHERE, "where", 3, 3, none, 0, "")
KC_OP_X(CAST, "cast", 1, 1, cast, 0, "")
/* data movement */
KC_OP_X(COPY, "copy", 1, 1, none, 0, "")
KC_OP_X(RESHAPE, "reshape", 1, 1, shape, 0, "")
KC_OP_X(PERMUTE, "permute", 1, 1, perm, 0, "")
KC_OP_X(CONCAT, "concat", 1, 8, axis, 0, "")
KC_OP_X(SLICE, "slice", 1, 1, slice, 0, "")
KC_OP_X(PAD, "pad", 1, 1, pad, 0, "")
KC_OP_X(GATHER, "gather", 2, 2, axis, 0, "")
KC_OP_X(EXPAND, "expand", 1, 1, shape, 0, "")
KC_OP_X(TILE, "tile", 1, 1, tile, 0, "")
/* neural-network ops */
KC_OP_X(CONV, "conv", 2, 3, conv, 0, "")
KC_OP_X(CONV_TRANSPOSE, "conv_transpose", 2, 3, convt, 0, "")
KC_OP_X(MAXPOOL, "maxpool", 1, 1, maxpool, 0, "")
KC_OP_X(AVGPOOL, "avgpool", 1, 1, avgpool, 0, "")
KC_OP_X(BATCHNORM, "batchnorm", 5, 5, eps, 0, "")
KC_OP_X(INSTANCENORM, "instancenorm", 3, 3, eps, 0, "")
KC_OP_X(LAYERNORM_ND, "layernorm_nd", 1, 3, lnorm, 0, "")
KC_OP_X(SOFTMAX_ND, "softmax_nd", 1, 1, softmax, 0, "Softmax")
KC_OP_X(LOGSOFTMAX, "logsoftmax", 1, 1, softmax, 0, "LogSoftmax")
KC_OP_X(REDUCE_SUM, "reduce_sum", 1, 1, reduce, KC_OPF_REDUCE, "ReduceSum")
KC_OP_X(REDUCE_MEAN, "reduce_mean", 1, 1, reduce, KC_OPF_REDUCE, "ReduceMean")
KC_OP_X(REDUCE_MAX, "reduce_max", 1, 1, reduce, KC_OPF_REDUCE, "ReduceMax")
KC_OP_X(REDUCE_MIN, "reduce_min", 1, 1, reduce, KC_OPF_REDUCE, "ReduceMin")
KC_OP_X(REDUCE_PROD, "reduce_prod", 1, 1, reduce, KC_OPF_REDUCE, "ReduceProd")
KC_OP_X(REDUCE_L1, "reduce_l1", 1, 1, reduce, KC_OPF_REDUCE, "ReduceL1")
KC_OP_X(REDUCE_L2, "reduce_l2", 1, 1, reduce, KC_OPF_REDUCE, "ReduceL2")
KC_OP_X(REDUCE_SUM_SQUARE, "reduce_sum_square", 1, 1, reduce, KC_OPF_REDUCE, "ReduceSumSquare")
KC_OP_X(REDUCE_LOG_SUM, "reduce_log_sum", 1, 1, reduce, KC_OPF_REDUCE, "ReduceLogSum")
KC_OP_X(REDUCE_LOG_SUM_EXP, "reduce_log_sum_exp", 1, 1, reduce, KC_OPF_REDUCE, "ReduceLogSumExp")
KC_OP_X(ARGMAX, "argmax", 1, 1, arg, 0, "ArgMax")
KC_OP_X(ARGMIN, "argmin", 1, 1, arg, 0, "ArgMin")
KC_OP_X(GEMM, "gemm", 2, 3, gemm, 0, "")
KC_OP_X(MATMUL_ND, "matmul_nd", 2, 2, none, 0, "")
KC_OP_X(LRN, "lrn", 1, 1, lrn, 0, "")
KC_OP_X(HARDMAX, "hardmax", 1, 1, softmax, 0, "Hardmax")
/* typed binary arithmetic (int64, f64): mode 0 add, 1 sub, 2 mul, 3 div, 4 max, 5 min, 6 pow */
KC_OP_X(ARITH, "arith", 2, 2, arith, 0, "")
/* modulus with the divisor's sign (ONNX Mod, fmod=0) */
KC_OP_X(PYMOD, "mod", 2, 2, none, 0, "")
/* isinf(detect_positive, detect_negative) and isnan: bool results */
KC_OP_X(ISINF, "isinf", 1, 1, isinf, 0, "")
KC_OP_X(ISNAN, "isnan", 1, 1, none, 0, "")
/* the upper/lower triangle of the last two dims, diagonal offset k */
KC_OP_X(TRILU, "trilu", 1, 1, trilu, 0, "")
/* out[i] = data[i with its axis coordinate replaced by indices[i]] */
KC_OP_X(GATHER_ELEMENTS, "gather_elements", 2, 2, axis, 0, "")
/* running sum along axis (exclusive, reverse) */
KC_OP_X(CUMSUM, "cumsum", 1, 1, cumsum, 0, "")
/* data with slices replaced (or combined: reduction 0 none, 1 add, 2 mul, 3 max, 4 min) at the
 * index tuples of the last axis of indices (ONNX ScatterND) */
KC_OP_X(SCATTER_ND, "scatter_nd", 3, 3, scatter, 0, "")
/* nearest/linear/cubic resampling to `sizes` (ONNX Resize, Upsample): cfg = mode (0 nearest,
 * 1 linear, 2 cubic), coordinate transformation (0 half_pixel, 1 asymmetric, 2 align_corners,
 * 3 pytorch_half_pixel, 4 tf_half_pixel_for_nn, 5 tf_crop_and_resize), nearest mode (0
 * round_prefer_floor, 1 round_prefer_ceil, 2 floor, 3 ceil), exclude_outside; scales and roi
 * are doubles by their bits, so the key holds them exactly */
KC_OP_X(RESIZE, "resize", 1, 1, resize, 0, "")
/* a recurrent layer (ONNX RNN, GRU, LSTM) over the whole sequence: X, W, R, B, sequence_lens,
 * initial_h (and initial_c, P for LSTM); one flat output holding Y, Y_h and Y_c one after
 * the other (the importer slices them apart). cfg = cell (0 RNN, 1 GRU, 2 LSTM), direction
 * (0 forward, 1 reverse, 2 bidirectional), hidden_size, layout, linear_before_reset,
 * input_forget; acts = activation codes, per direction (kernels/cpu/ops.c kc_act) */
KC_OP_X(RNN, "rnn", 6, 8, rnn, 0, "")
