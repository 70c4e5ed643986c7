#!/usr/bin/env python3
"""A strict AWS SigV4 checker for the kcd_s3 tests: s3rver accepts any V4
signature, so this tiny in-memory S3 (GET/HEAD/PUT of objects) recomputes
every signature from the AWS specification and answers 403
SignatureDoesNotMatch when it differs, or when x-amz-content-sha256 is not
the digest of the body. Usage: sigv4_verify.py ACCESS_KEY SECRET_KEY REGION"""
import hashlib
import hmac
import http.server
import sys
import urllib.parse

ACCESS, SECRET, REGION = sys.argv[1], sys.argv[2], sys.argv[3]
OBJECTS = {}


def hmac256(key, msg):
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply(self, status, body=b"", extra=None):
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def error(self, status, code, msg):
        xml = f"<?xml version=\"1.0\"?><Error><Code>{code}</Code><Message>{msg}</Message></Error>"
        self.reply(status, xml.encode())

    def check(self, body):
        auth = self.headers.get("Authorization", "")
        if not auth.startswith("AWS4-HMAC-SHA256 "):
            return "no AWS4-HMAC-SHA256 Authorization header"
        parts = dict(p.strip().split("=", 1) for p in auth[len("AWS4-HMAC-SHA256 "):].split(","))
        cred = parts["Credential"].split("/")
        if cred[0] != ACCESS:
            return "unknown access key " + cred[0]
        if cred[2] != REGION or cred[3] != "s3" or cred[4] != "aws4_request":
            return "bad credential scope " + "/".join(cred[1:])
        signed = parts["SignedHeaders"].split(";")
        for required in ("host", "x-amz-date", "x-amz-content-sha256"):
            if required not in signed:
                return required + " not signed"
        for h in signed:
            if self.headers.get(h) is None:
                return "signed header '%s' was not sent" % h
        payload_hash = self.headers["x-amz-content-sha256"]
        if payload_hash != hashlib.sha256(body).hexdigest():
            return "x-amz-content-sha256 is not the body's digest"
        url = urllib.parse.urlsplit(self.path)
        query = "&".join(sorted(url.query.split("&"))) if url.query else ""
        canon_headers = "".join(
            h + ":" + " ".join(self.headers[h].strip().split()) + "\n" for h in signed)
        canonical = "\n".join([self.command, url.path, query, canon_headers,
                               ";".join(signed), payload_hash])
        amz_date = self.headers["x-amz-date"]
        scope = "/".join(cred[1:])
        to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope,
                             hashlib.sha256(canonical.encode()).hexdigest()])
        key = ("AWS4" + SECRET).encode()
        for part in cred[1:]:
            key = hmac256(key, part)
        want = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
        if not hmac.compare_digest(want, parts["Signature"]):
            return "signature mismatch"
        return None

    def handle_any(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        problem = self.check(body)
        if problem:
            return self.error(403, "SignatureDoesNotMatch", problem)
        path = urllib.parse.urlsplit(self.path).path
        if self.command == "PUT":
            OBJECTS[path] = body
            return self.reply(200)
        if path not in OBJECTS:
            return self.error(404, "NoSuchKey", "no such key")
        data = OBJECTS[path]
        if self.command == "HEAD":
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            return None
        return self.reply(200, data)

    do_GET = do_PUT = do_HEAD = handle_any


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print("sigv4_verify listening on 127.0.0.1:%d" % server.server_port, flush=True)
server.serve_forever()
