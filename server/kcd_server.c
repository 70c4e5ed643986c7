/* PLACEHOLDER: replaced by the server (issue 5). */
int kcd_placeholder_;
