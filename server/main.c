/* PLACEHOLDER: replaced by the server (issue 5). */
int main(void) { return 1; }
