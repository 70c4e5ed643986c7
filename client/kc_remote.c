/* PLACEHOLDER: replaced by the remote client library (issue 6). */
int kc_remote_placeholder_;
