/* PLACEHOLDER: replaced by the compiler (issue 3). */
int kc_compiler_placeholder_;
