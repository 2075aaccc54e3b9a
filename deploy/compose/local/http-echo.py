"""A stand-in for hashicorp/http-echo: answers every request with 200 and `-text` plus a newline.

Flags as http-echo spells them: -listen=ADDR:PORT (default :5678) and -text=TEXT (required)."""

import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def flags(argv):
    listen, text = ":5678", None
    for arg in argv:
        name, _, value = arg.lstrip("-").partition("=")
        if name == "listen":
            listen = value
        elif name == "text":
            text = value
        else:
            sys.exit(f"http-echo: unknown flag {arg}")
    if text is None:
        sys.exit("http-echo: -text is required")
    host, _, port = listen.rpartition(":")
    return host, int(port), (text + "\n").encode()


def main():
    host, port, body = flags(sys.argv[1:])

    class Echo(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def answer(self, with_body):
            self.send_response(200)
            self.send_header("content-type", "text/plain; charset=utf-8")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            if with_body:
                self.wfile.write(body)

        def do_HEAD(self):
            self.answer(False)

        def __getattr__(self, name):
            if name.startswith("do_"):
                return lambda: self.answer(True)
            raise AttributeError(name)

        def log_message(self, *_):
            pass

    print(f"http-echo: listening on {host or '*'}:{port}", flush=True)
    ThreadingHTTPServer((host, port), Echo).serve_forever()


if __name__ == "__main__":
    main()
